#!/bin/sh
# Build the Debian packages of a build tree (cpack -G DEB) and check them: their names and
# Depends (libccq0: libc6 only; each module package: the libccq0 of its version, and what its
# library needs), their file lists (dpkg-deb -c: what each must hold, nothing outside /usr,
# nothing under /usr/local, no build or source paths in the text files), and that the
# unpacked packages work: with libccq0 and libccq-dev alone (ldd libccq.so.0 shows no CUDA,
# NCCL or MPI) a program links with pkg-config and runs, and asking for a module names the
# missing file; with the module packages too, libccq loads them.
# usage: check_deb.sh <build dir> <source dir> <cpack> <C compiler> <scratch dir> <version>
#        [<extra C and link flags> [<modules built, e.g. "nccl mpi">]]
#        (the flags: -fsanitize=... when the library has a sanitizer)
set -eu
build=$1 src=$2 cpack=$3 cc=$4 work=$5 version=$6 flags=${7:-} modules=${8:-}
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
for m in $modules; do
    [ -f "$work/libccq-$m${major}_${version}_$arch.deb" ] || fail "no libccq-$m${major}_${version}_$arch.deb"
done
[ "$(ls "$work"/*.deb | wc -l)" = $((2 + $(echo $modules | wc -w))) ] ||
    fail "packages: $(ls "$work"/*.deb) (want libccq$major, libccq-dev and one per module: $modules)"

# File lists: paths only (directories end in /), links as "path -> target".
list() { dpkg-deb -c "$1" | awk '{ p = $6; sub(/^\.\//, "/", p); if ($7 == "->") p = p " -> " $8; print p }'; }
list "$rt" >"$work/runtime.files"
list "$dev" >"$work/dev.files"
for m in $modules; do
    list "$work/libccq-$m${major}_${version}_$arch.deb" >"$work/$m.files"
done
for f in runtime dev $modules; do
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
has dev '^/usr/bin/ccq-trace$'
grep -E '^[^ ]*libccq\.so\.' "$work/dev.files" && fail "dev package: holds the runtime library"
grep -E 'libccq-' "$work/runtime.files" "$work/dev.files" && fail "a module outside its package"
for m in $modules; do
    has "$m" "$lib/libccq-$m\.so\.$major -> libccq-$m\.so\.$version\$"
    has "$m" "$lib/libccq-$m\.so\.$version\$"
    [ "$(grep -vc '/$' "$work/$m.files")" = 2 ] || fail "$m package: more than the module:
$(grep -v '/$' "$work/$m.files")"
done

# Control fields.
field() { dpkg-deb -f "$1" "$2"; }
[ "$(field "$rt" Package)" = "libccq$major" ] || fail "runtime package name $(field "$rt" Package)"
[ "$(field "$dev" Package)" = libccq-dev ] || fail "dev package name $(field "$dev" Package)"
# libccq0 needs libc6 and nothing else: no CUDA, NCCL or MPI package (a sanitizer build's
# library also needs the sanitizers' runtimes).
rt_deps=$(field "$rt" Depends | sed 's/ *([^)]*)//g' | tr ',' '\n' | sed 's/^ *//')
if [ -n "$flags" ]; then
    rt_deps=$(echo "$rt_deps" | grep -Ev '^(libasan|libubsan|libtsan|liblsan|libgcc-s|libstdc\+\+)[0-9]*$')
fi
[ "$rt_deps" = libc6 ] || fail "libccq$major Depends: $(field "$rt" Depends) (want libc6 only)"
for m in $modules; do
    deb=$work/libccq-$m${major}_${version}_$arch.deb
    [ "$(field "$deb" Package)" = "libccq-$m$major" ] || fail "$m package name $(field "$deb" Package)"
    field "$deb" Depends | grep -qF "libccq$major (= $version)" ||
        fail "libccq-$m$major Depends: $(field "$deb" Depends) (want libccq$major (= $version))"
    # The MPI module: the package of the MPI library it links (dpkg-shlibdeps).
    if [ "$m" = mpi ]; then
        field "$deb" Depends | grep -Eq 'libopenmpi|libmpich|mpi' ||
            fail "libccq-mpi$major Depends: $(field "$deb" Depends) (no MPI library package)"
    fi
    if [ "$m" = ucx ]; then
        field "$deb" Depends | grep -q 'libucx0' ||
            fail "libccq-ucx$major Depends: $(field "$deb" Depends) (no libucx0)"
    fi
    echo "libccq-$m$major Depends: $(field "$deb" Depends)"
done
echo "libccq$major Depends: $(field "$rt" Depends)"
field "$dev" Depends | grep -qF "libccq$major (= $version)" || fail "libccq-dev Depends: $(field "$dev" Depends)"
field "$dev" Depends | grep -q 'libck-dev' || fail "libccq-dev Depends: $(field "$dev" Depends)"
field "$dev" Depends | grep -q 'python3' || fail "libccq-dev Depends (ccq-trace): $(field "$dev" Depends)"

# The unpacked packages: no build or source paths in their text files, and they work.
# First libccq0 and libccq-dev alone, as a host-only user has them.
root=$work/root
dpkg-deb -x "$rt" "$root"
dpkg-deb -x "$dev" "$root"
grep -rlF -e "$build" -e "$src" "$root/usr/include" "$root/usr/lib" --include='*.cmake' \
    --include='*.pc' --include='*.h' && fail "build or source paths in the packages' files"
pc=$(find "$root" -name ccq.pc)
libdir=$(dirname "$(dirname "$pc")")
if ldd "$libdir/libccq.so.$major" | grep -Ei 'cuda|nccl|mpi|open-pal|open-rte|hwloc|ucp|ucs'; then
    fail "ldd libccq.so.$major shows the libraries above"
fi
PKG_CONFIG_PATH=$(dirname "$pc") && export PKG_CONFIG_PATH
[ "$(pkg-config --variable=includedir ccq)" -ef "$root/usr/include" ] || fail "ccq.pc: includedir $(pkg-config --variable=includedir ccq)"
# shellcheck disable=SC2046 # pkg-config's output is a list of words
"$cc" $flags -o "$work/app" "$src/tests/install/app.c" $(pkg-config --cflags --libs ccq)
LD_LIBRARY_PATH=$libdir "$work/app" deb-shared
"$root/usr/bin/ccq-trace" --help >/dev/null || fail "the packaged ccq-trace does not run"
# shellcheck disable=SC2046
"$cc" $flags -o "$work/probe" "$src/tests/install/probe.c" $(pkg-config --cflags --libs ccq)
for m in nccl mpi ucx; do
    out=$(LD_LIBRARY_PATH=$libdir "$work/probe" "$m")
    echo "$out" | grep -q "needs libccq-$m.so.$major, .*tried $libdir/libccq-$m.so.$major (cannot open shared object file" ||
        fail "without libccq-$m$major, asking for it says: $out"
done
# Then each module package: libccq loads it from beside itself.
for m in $modules; do
    dpkg-deb -x "$work/libccq-$m${major}_${version}_$arch.deb" "$root"
    out=$(LD_LIBRARY_PATH=$libdir "$work/probe" "$m")
    case $m in
    mpi) echo "$out" | grep -q "is not an MPI_Fint" || fail "libccq-mpi$major not loaded: $out" ;;
    ucx) [ "$out" = "CCQ_OK: " ] || fail "libccq-ucx$major not loaded or failed: $out" ;;
    *) if echo "$out" | grep -q "tried $libdir/libccq-$m.so.$major (cannot open shared object file"; then
           fail "libccq-$m$major not found: $out"
       fi ;;
    esac
    echo "with libccq-$m$major: $out"
done
echo "OK: $(cd "$work" && ls -- *.deb | tr '\n' ' ')"
