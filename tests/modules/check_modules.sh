#!/bin/sh
# What the library files must be (docs/layout.md, Modules): libccq.so needs only libc (ldd
# shows no CUDA, NCCL or MPI); each module exports exactly its entry symbol ccq_module_<name>
# and needs nothing of libccq.so, and keeps no thread-local storage (a module is dlopen'ed, so
# its thread-locals are dynamic TLS: a __tls_get_addr per access, and GCC 12's TSan now and
# then kills the process resetting a bogus shadow range for such a block); and in the NCCL
# tests (a program given), every CUDA and NCCL symbol of libccq-nccl.so binds to the program's
# fake, never to libcudart or libnccl.
# usage: check_modules.sh <libccq.so> <a fake NCCL test program, or ""> <module files...>
set -eu
lib=$1 fake=$2
shift 2
fail() { echo "FAIL: $*" >&2; exit 1; }
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p'; }

for n in $(needed "$lib"); do
    case $n in
    libc.so.* | libpthread.so.* | libm.so.* | ld-linux*.so.*) ;;
    # A sanitizer build's runtimes (scripts/sanitize.sh).
    libasan.so.* | libubsan.so.* | libtsan.so.* | liblsan.so.* | libstdc++.so.* | libgcc_s.so.*) ;;
    *) fail "$lib needs $n (it may need only libc, libpthread, libm)" ;;
    esac
done
if ldd "$lib" | grep -Ei 'cuda|nccl|mpi|open-pal|open-rte|hwloc|libevent|ucp|ucs'; then
    fail "ldd $lib shows the libraries above"
fi
echo "OK: $(basename "$lib") needs $(needed "$lib" | tr '\n' ' ')"

for m in "$@"; do
    base=$(basename "$m")
    name=${base#libccq-}
    name=${name%%.so*}
    exports=$(nm -D --defined-only "$m" | awk '{ print $3 }')
    [ "$exports" = "ccq_module_$name" ] || fail "$base exports: $exports (want ccq_module_$name only)"
    needed "$m" | grep -q '^libccq\.so' && fail "$base needs libccq.so"
    readelf -lW "$m" | grep -q ' TLS ' &&
        fail "$base has thread-local storage: $(readelf -sW "$m" | awk '$4 == "TLS" { print $8 }' | tr '\n' ' ')"
    echo "OK: $base exports ccq_module_$name; needs $(needed "$m" | tr '\n' ' ')"
done

if [ -n "$fake" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    LD_DEBUG=bindings LD_DEBUG_OUTPUT="$tmp/b" "$fake" >/dev/null 2>&1 || fail "$fake failed"
    cat "$tmp"/b.* | grep 'binding file [^ ]*libccq-nccl\.so' |
        grep -E "symbol \`(cuda|cu|nccl)[A-Za-z0-9_]*'" >"$tmp/module" || true
    [ -s "$tmp/module" ] || fail "no CUDA or NCCL binding of libccq-nccl.so seen"
    if grep -Ev "to [^ ]*$(basename "$fake") \[" "$tmp/module"; then
        fail "libccq-nccl.so binds the symbols above elsewhere than to $(basename "$fake")'s fake"
    fi
    echo "OK: $(wc -l <"$tmp/module") CUDA/NCCL bindings of libccq-nccl.so, all to $(basename "$fake")"
fi
