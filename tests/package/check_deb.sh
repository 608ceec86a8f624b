#!/bin/sh
# Build the Debian packages of a build tree (cpack -G DEB) and check them: their names and
# Depends, their file lists (dpkg-deb -c: what each must hold, nothing outside /usr, nothing
# under /usr/local, no build or source paths in the text files), and that the unpacked
# packages work: a program links against them with pkg-config and runs.
# usage: check_deb.sh <build dir> <source dir> <cpack> <C compiler> <scratch dir> <version>
#        [<extra C and link flags>]   (-fsanitize=... when the library has a sanitizer)
set -eu
build=$1 src=$2 cpack=$3 cc=$4 work=$5 version=$6 flags=${7:-}
major=${version%%.*}
for tool in dpkg-deb pkg-config readelf; do
    command -v "$tool" >/dev/null || { echo "SKIP: no $tool"; exit 77; }
done
rm -rf "$work"
mkdir -p "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

"$cpack" -G DEB --config "$build/CPackConfig.cmake" -B "$work" >"$work/cpack.log" 2>&1 ||
    { cat "$work/cpack.log"; fail "cpack -G DEB"; }
arch=$(dpkg --print-architecture)
rt=$work/libccq${major}_${version}_$arch.deb
dev=$work/libccq-dev_${version}_$arch.deb
[ -f "$rt" ] || fail "no $(basename "$rt") (got: $(ls "$work"/*.deb 2>/dev/null))"
[ -f "$dev" ] || fail "no $(basename "$dev")"

# File lists: paths only (directories end in /), links as "path -> target".
list() { dpkg-deb -c "$1" | awk '{ p = $6; sub(/^\.\//, "/", p); if ($7 == "->") p = p " -> " $8; print p }'; }
list "$rt" >"$work/runtime.files"
list "$dev" >"$work/dev.files"
for f in runtime dev; do
    grep -v '^/usr/' "$work/$f.files" | grep -v '^/$' && fail "$f package: files outside /usr"
    grep '^/usr/local' "$work/$f.files" && fail "$f package: files under /usr/local"
    grep -F -e "$build" -e "$src" "$work/$f.files" && fail "$f package: build or source paths"
done
# has <package> <regex>: the package holds exactly one such path.
has() {
    n=$(grep -Ec "$2" "$work/$1.files" || true)
    [ "$n" = 1 ] || fail "$1 package: $n paths match $2 (want 1); it holds:
$(grep -v '/$' "$work/$1.files")"
}
lib='^/usr/lib(/[a-z0-9_-]+)?'
has runtime "$lib/libccq\.so\.$major -> libccq\.so\.$version\$"
has runtime "$lib/libccq\.so\.$version\$"
[ "$(grep -vc '/$' "$work/runtime.files")" = 2 ] || fail "runtime package: more than the library:
$(grep -v '/$' "$work/runtime.files")"
has dev '^/usr/include/ccq\.h$'
has dev '^/usr/include/ccq/version\.h$'
has dev "$lib/libccq\.so -> libccq\.so\.$major\$"
has dev "$lib/libccq\.a\$"
has dev "$lib/pkgconfig/ccq\.pc\$"
for f in ccqConfig ccqConfigVersion ccqTargets ccqStaticTargets; do
    has dev "$lib/cmake/ccq/$f\.cmake\$"
done
has dev '^/usr/bin/ccq-perf$'
grep -E '^[^ ]*libccq\.so\.' "$work/dev.files" && fail "dev package: holds the runtime library"

# Control fields.
field() { dpkg-deb -f "$1" "$2"; }
[ "$(field "$rt" Package)" = "libccq$major" ] || fail "runtime package name $(field "$rt" Package)"
[ "$(field "$dev" Package)" = libccq-dev ] || fail "dev package name $(field "$dev" Package)"
field "$rt" Depends | grep -q 'libc6' || fail "libccq$major Depends: $(field "$rt" Depends)"
field "$dev" Depends | grep -qF "libccq$major (= $version)" || fail "libccq-dev Depends: $(field "$dev" Depends)"
field "$dev" Depends | grep -q 'libck-dev' || fail "libccq-dev Depends: $(field "$dev" Depends)"

# The unpacked packages: no build or source paths in their text files, and they work.
root=$work/root
dpkg-deb -x "$rt" "$root"
dpkg-deb -x "$dev" "$root"
grep -rlF -e "$build" -e "$src" "$root/usr/include" "$root/usr/lib" --include='*.cmake' \
    --include='*.pc' --include='*.h' && fail "build or source paths in the packages' files"
pc=$(find "$root" -name ccq.pc)
libdir=$(dirname "$(dirname "$pc")")
PKG_CONFIG_PATH=$(dirname "$pc") && export PKG_CONFIG_PATH
[ "$(pkg-config --variable=includedir ccq)" -ef "$root/usr/include" ] || fail "ccq.pc: includedir $(pkg-config --variable=includedir ccq)"
# shellcheck disable=SC2046 # pkg-config's output is a list of words
"$cc" $flags -o "$work/app" "$src/tests/install/app.c" $(pkg-config --cflags --libs ccq)
LD_LIBRARY_PATH=$libdir "$work/app" deb-shared
echo "OK: $(basename "$rt"), $(basename "$dev")"
