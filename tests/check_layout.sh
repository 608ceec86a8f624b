#!/bin/sh
# The source tree's rules (docs/layout.md), checked on the library's sources (include/,
# common/, queue/, runtime/, backends/, modules/; tests, tools and benchmarks may include
# what they test or compare against):
# - backends/, queue/ and common/ include nothing from runtime/; queue/ and common/ nothing
#   from backends/; nothing includes modules/ (the modules' entries sit on top);
# - a vendor's headers only in its module: CUDA and NCCL in backends/nccl/, mpi.h in
#   runtime/boot/mpi.c and backends/host/mpi/, UCX's in backends/host/ucx/.
# usage: check_layout.sh <source dir>
set -eu
cd "$1"
bad=0
# includes <dir...> <pattern> <allowed path regex or -> <why>
rule() {
    dirs=$1 pat=$2 allow=$3 why=$4
    # shellcheck disable=SC2086 # dirs is a list of words
    hits=$(grep -rnE "^[[:space:]]*#[[:space:]]*include[[:space:]]*$pat" $dirs --include='*.c' \
        --include='*.h' 2>/dev/null | { if [ "$allow" = - ]; then cat; else grep -Ev "^($allow)"; fi; } || true)
    if [ -n "$hits" ]; then
        printf 'FAIL: %s:\n%s\n' "$why" "$hits" >&2
        bad=1
    fi
}
lib="include common queue runtime backends modules"
rule "backends queue common" '"runtime/' - "backends, queue and common include nothing from runtime/"
rule "queue common" '"backends/' - "queue and common include nothing from backends/"
rule "$lib" '"modules/' - "nothing includes modules/"
rule "$lib" '<(cuda|nccl|cudaTypedefs|cuda_runtime)' 'backends/nccl/' \
    "CUDA and NCCL headers only in backends/nccl/ (libccq-nccl.so)"
rule "$lib" '<mpi\.h>' 'runtime/boot/mpi\.c|backends/host/mpi/' \
    "mpi.h only in runtime/boot/mpi.c and backends/host/mpi/ (libccq-mpi.so)"
rule "$lib" '<(ucp|ucs|uct)/' 'backends/host/ucx/' "UCX headers only in backends/host/ucx/ (libccq-ucx.so)"
[ "$bad" = 0 ] && echo "OK: the layout rules hold"
exit "$bad"
