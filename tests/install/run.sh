#!/bin/sh
# Install a build tree into a temporary prefix and link tests/install/app.c against it three
# ways: pkg-config (libccq.so), pkg-config --static (libccq.a), and find_package(ccq) (ccq::ccq
# and ccq::ccq_static). Each program runs a host-backend all_reduce and prints OK.
# usage: run.sh <build dir> <C compiler> <cmake> <scratch dir> [<extra C and link flags>]
# (the extra flags: -fsanitize=... when the library was built with a sanitizer)
set -eu
build=$1 cc=$2 cmake=$3 work=$4 flags=${5:-}
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix

step() { printf '== %s\n' "$*"; }
# The programs must not find a libccq.so other than the one they are meant to use.
unset LD_LIBRARY_PATH
needs_libccq() { readelf -d "$1" | grep -q 'NEEDED.*libccq\.so'; }

step "cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log"
pc=$(find "$prefix" -name ccq.pc)
[ -n "$pc" ] || { echo "no ccq.pc installed" >&2; exit 1; }
pcdir=$(dirname "$pc")
libdir=$(dirname "$pcdir")
export PKG_CONFIG_PATH="$pcdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
[ "$(pkg-config --modversion ccq)" = "$(sed -n 's/^Version: //p' "$pc")" ]
step "ccq-trace --help (installed, executable)"
"$prefix/bin/ccq-trace" --help >/dev/null

[ "$(cd "$(pkg-config --variable=libdir ccq)" && pwd)" = "$(cd "$libdir" && pwd)" ]

step "pkg-config --cflags --libs ccq (shared): needs LD_LIBRARY_PATH or an rpath (README)"
# shellcheck disable=SC2046 # pkg-config's output is a list of words
"$cc" $flags -o "$work/app_pc_shared" "$here/app.c" $(pkg-config --cflags ccq) $(pkg-config --libs ccq)
needs_libccq "$work/app_pc_shared"
LD_LIBRARY_PATH=$libdir "$work/app_pc_shared" pkg-config-shared
if ! ldconfig -p 2>/dev/null | grep -q 'libccq\.so\.0'; then # no libccq the loader finds
    if "$work/app_pc_shared" pkg-config-shared 2>"$work/no-rpath.err"; then
        echo "a program of a prefix install ran without rpath or LD_LIBRARY_PATH" >&2
        exit 1
    fi
    grep -q 'libccq.so.0: cannot open shared object file' "$work/no-rpath.err"
fi
# The README's line, as written: the rpath from pkg-config's libdir.
# shellcheck disable=SC2046
"$cc" $flags -o "$work/app_pc_rpath" "$here/app.c" $(pkg-config --cflags --libs ccq) -Wl,-rpath,$(pkg-config --variable=libdir ccq)
"$work/app_pc_rpath" pkg-config-rpath

step "libccq.a + pkg-config --static --libs ccq"
# --as-needed: -lccq (in Libs) would also record libccq.so, which the program does not use.
# The archive's path from pkg-config's libdir, as the README writes it.
# shellcheck disable=SC2046
"$cc" $flags -o "$work/app_pc_static" "$here/app.c" $(pkg-config --cflags ccq) "$(pkg-config --variable=libdir ccq)/libccq.a" \
    -Wl,--as-needed $(pkg-config --static --libs ccq)
# The README says --static brings -lmpi exactly when the archive calls MPI.
if nm -u "$libdir/libccq.a" 2>/dev/null | grep -q ' U MPI_'; then
    pkg-config --static --libs ccq | grep -q -- '-lmpi' || { echo "libccq.a calls MPI but pkg-config --static has no -lmpi" >&2; exit 1; }
else
    if pkg-config --static --libs ccq | grep -q -- '-lmpi'; then echo "-lmpi without MPI in libccq.a" >&2; exit 1; fi
fi
if needs_libccq "$work/app_pc_static"; then
    echo "the static program needs libccq.so" >&2
    exit 1
fi
"$work/app_pc_static" pkg-config-static

step "find_package(ccq COMPONENTS shared static)"
"$cmake" -S "$here" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >"$work/cmake-configure.log" || { cat "$work/cmake-configure.log"; exit 1; }
"$cmake" --build "$work/cmake" >"$work/cmake-build.log" || { cat "$work/cmake-build.log"; exit 1; }
needs_libccq "$work/cmake/app_cmake_shared"
"$work/cmake/app_cmake_shared" find_package-ccq::ccq
if needs_libccq "$work/cmake/app_cmake_static"; then
    echo "the ccq::ccq_static program needs libccq.so" >&2
    exit 1
fi
"$work/cmake/app_cmake_static" find_package-ccq::ccq_static
step "find_package(ccq) without the static library's dependencies (no pkg-config): ccq::ccq"
"$cmake" -S "$here" -B "$work/cmake-shared" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
    -DCCQ_TEST_ONLY_SHARED=ON -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON \
    >"$work/cmake-shared-configure.log" || { cat "$work/cmake-shared-configure.log"; exit 1; }
grep -q "no ccq::ccq_static" "$work/cmake-shared-configure.log"
"$cmake" --build "$work/cmake-shared" >"$work/cmake-shared-build.log" ||
    { cat "$work/cmake-shared-build.log"; exit 1; }
"$work/cmake-shared/app_cmake_shared" find_package-ccq::ccq-only
step "all three ways linked and ran"
