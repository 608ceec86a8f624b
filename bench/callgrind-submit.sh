#!/bin/sh
# Instructions per submit call (callgrind, inclusive cost of ccq_all_reduce and everything it
# calls, the backend's check and submit hooks included), through each build's libccq.so: the
# host backend, and the nccl backend on tests/fake's CUDA/NCCL (compiled into the program and
# exported, so the backend binds to it as the tests do) when the build has it. Counts, not
# timings: comparable across builds on a busy machine. The total still moves a little with
# the process's memory layout (glibc's AVX2 memcmp takes a longer path when a buffer sits
# near a page boundary: +8 per call in some environments, for any build) and with whether a
# submit finds the scheduler asleep, so each is run R times (minimum and median), and the
# last column counts only the instructions executed in ccq's own libraries (libccq*.so: the
# core and its modules), which no layout moves.
# usage: callgrind-submit.sh <build dir>... (e.g. a build of main and one of a branch)
# env: N (submissions, default 20000), R (runs, default 5)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
n=${N:-20000}
runs=${R:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cache() { sed -n "s|^$1:[A-Z]*=||p" "$2/CMakeCache.txt"; }

count() { # program backend -> "min median ccq" instructions per call over R runs
    for r in $(seq "$runs"); do
        LD_BIND_NOW=1 valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
            --toggle-collect=ccq_all_reduce "$@" "$n" >/dev/null 2>"$work/vg.log" ||
            { cat "$work/vg.log" >&2; exit 1; }
        ir=$(sed -n 's/^summary: *//p' "$work/cg.out")
        own=$(callgrind_annotate --inclusive=no --threshold=100 "$work/cg.out" 2>/dev/null |
            grep -E '\[[^]]*/libccq[^]/]*\.so[^]/]*\]' | awk '{ gsub(",", "", $1); s += $1 } END { print s + 0 }')
        echo "$ir $own $n" | awk '{ printf "%.1f %.1f\n", $1 / $3, $2 / $3 }'
    done | sort -n | awk '{ v[NR] = $1; o[NR] = $2 } END {
        printf "%-8s %-8s %s", v[1], v[int((NR + 1) / 2)], o[int((NR + 1) / 2)] }'
}

printf '%-40s %-8s %-8s %-8s %s\n' build backend min median "in libccq*.so"
for b in "$@"; do
    b=$(cd "$b" && pwd)
    src=$(cache CMAKE_HOME_DIRECTORY "$b")
    cc -O2 -I"$src/include" -o "$work/host" "$here/submit_loop.c" -L"$b" -lccq -Wl,-rpath,"$b"
    printf '%-40s %-8s %s\n' "$b" host "$(count "$work/host" host)"
    # The nccl backend: a module of its own, or (before modules) inside libccq.so.
    if [ -e "$b/libccq-nccl.so.0" ] || readelf -d "$b/libccq.so" | grep -q 'NEEDED.*libnccl'; then
        cuda=$(cache CUDAToolkit_INCLUDE_DIR "$b")
        nccl=$(cache NCCL_INCLUDE_DIR "$b")
        # The fake runs collectives with the host backend's kernels: its own copy of them.
        cc -O2 -D_GNU_SOURCE -I"$src" -I"$src/include" -I"$src/tests" -isystem "$cuda" \
            -isystem "$nccl" -rdynamic -o "$work/nccl" "$here/submit_loop.c" \
            "$src/tests/fake/fake_cuda_nccl.c" "$src/tests/fake/fake_xproc.c" \
            "$src/backends/host/reduce.c" "$src/common/kinds.c" \
            -L"$b" -lccq -Wl,-rpath,"$b" -lpthread -lm
        printf '%-40s %-8s %s\n' "$b" nccl "$(count "$work/nccl" nccl)"
    fi
done
