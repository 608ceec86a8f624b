#!/bin/sh
# Install a build tree into a temporary prefix and link tests/install/app.c against it three
# ways: pkg-config (libccq.so), pkg-config --static (libccq.a), and find_package(ccq) (ccq::ccq
# and ccq::ccq_static). Each program runs a host-backend all_reduce and prints OK. The modules
# lie beside libccq.so, where it loads them from (tests/install/probe.c). Then the core alone
# (the runtime and dev components, as a host-only user installs libccq0 and libccq-dev): no
# module file, ldd libccq.so.0 shows no CUDA, NCCL or MPI, a host program links and runs, and
# asking for a module says which file is missing where.
# usage: run.sh <build dir> <C compiler> <cmake> <scratch dir> [<extra C and link flags>
#        [<modules built, e.g. "nccl mpi">]]
# (the extra flags: -fsanitize=... when the library was built with a sanitizer)
set -eu
build=$1 cc=$2 cmake=$3 work=$4 flags=${5:-} modules=${6:-}
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

step "the modules beside libccq.so, loaded from there: $modules"
"$cc" $flags -o "$work/probe" "$here/probe.c" $(pkg-config --cflags ccq) $(pkg-config --libs ccq)
for m in $modules; do
    [ -f "$libdir/libccq-$m.so.0" ] || { echo "no $libdir/libccq-$m.so.0" >&2; exit 1; }
    [ ! -e "$libdir/libccq-$m.so" ] || { echo "a link libccq-$m.so: nothing links a module" >&2; exit 1; }
    out=$(LD_LIBRARY_PATH=$libdir "$work/probe" "$m")
    echo "probe $m: $out"
    case $m in
    # The module's own check of mpi_comm: it was loaded.
    mpi) echo "$out" | grep -q "is not an MPI_Fint" ;;
    # Two processes on the ucx engine: it loaded and ran.
    ucx) [ "$out" = "CCQ_OK: " ] ;;
    # No GPU here: the module loaded (or its CUDA libraries are not installed); never missing.
    *) if echo "$out" | grep -q "needs libccq-$m.so.0.*$libdir/libccq-$m.so.0 (cannot open shared object file"; then
           echo "the installed module was not found" >&2
           exit 1
       fi ;;
    esac
done

step "the core alone (components runtime and dev): a host-only program"
core=$work/core
for c in runtime dev; do
    "$cmake" --install "$build" --prefix "$core" --component "$c" >>"$work/install-core.log"
done
corelib=$(dirname "$(dirname "$(find "$core" -name ccq.pc)")")
if find "$core" -name 'libccq-*' | grep .; then
    echo "module files in the core install" >&2
    exit 1
fi
if ldd "$corelib/libccq.so.0" | grep -Ei 'cuda|nccl|mpi|open-pal|open-rte|hwloc|ucp|ucs'; then
    echo "ldd libccq.so.0 shows the libraries above" >&2
    exit 1
fi
# shellcheck disable=SC2046
"$cc" $flags -o "$work/app_core" "$here/app.c" $(PKG_CONFIG_PATH=$corelib/pkgconfig pkg-config --cflags --libs ccq)
"$cc" $flags -o "$work/probe_core" "$here/probe.c" $(PKG_CONFIG_PATH=$corelib/pkgconfig pkg-config --cflags --libs ccq)
LD_LIBRARY_PATH=$corelib "$work/app_core" core-only
for m in nccl mpi ucx; do
    out=$(LD_LIBRARY_PATH=$corelib "$work/probe_core" "$m")
    echo "probe $m: $out"
    echo "$out" | grep -q "^CCQ_ERR_UNSUPPORTED: .*needs libccq-$m.so.0, .*tried $corelib/libccq-$m.so.0 (cannot open shared object file" ||
        { echo "no module, but not the detail that says so" >&2; exit 1; }
done
step "all three ways linked and ran; the modules load from beside libccq.so; the core runs alone"
