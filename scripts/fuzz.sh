#!/usr/bin/env bash
# Fuzz with libFuzzer (clang + ASan + UBSan + LSan) for a bounded time: the public API
# (tests/fuzz/fuzz_api.c, corpus tests/fuzz/corpus) and the tcp:// rendezvous server's message
# handling (tests/fuzz/fuzz_tcp.c, corpus tests/fuzz/corpus_tcp), each starting from a copy of
# its corpus so the repository is never modified. Exits non-zero on any crash, leak, hang or
# invariant violation, leaving the input in the build directory and printing how to keep it
# as a regression test.
# Usage: ./scripts/fuzz.sh [seconds] [build-dir] [target]   (default 60 s, build-fuzz, both
#        targets: the API for the seconds given, the tcp server for a third of them)
# Env: FUZZ_JOBS=N runs N fuzzers in parallel (default 1); FUZZ_ARGS adds libFuzzer flags.
set -euo pipefail
. "$(dirname "$0")/common.sh"

secs=${1:-60}
dir=$(realpath -m "${2:-$CCQ_ROOT/build-fuzz}") # the run cds away: absolute
target=${3:-all}
if [ "$target" = all ]; then
    tcp_secs=$((secs / 3 > 10 ? secs / 3 : 10))
    "$0" "$secs" "$dir" api && "$0" "$tcp_secs" "$dir" tcp
    exit $?
fi
case $target in
api) bin_name=fuzz_api corpus_src=$CCQ_ROOT/tests/fuzz/corpus max_len=512 ;;
tcp) bin_name=fuzz_tcp corpus_src=$CCQ_ROOT/tests/fuzz/corpus_tcp max_len=4096 ;;
*) echo "fuzz: target is api, tcp or all (got $target)" >&2; exit 2 ;;
esac
jobs=${FUZZ_JOBS:-1}
cc=${FUZZ_CC:-clang}

# clang with libFuzzer's runtime (Debian: clang, libclang-rt-14-dev).
have_libfuzzer() {
    local t
    t=$(mktemp -d)
    echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return d && n; }' \
        >"$t/t.c"
    "$cc" -fsanitize=fuzzer,address,undefined "$t/t.c" -o "$t/t" >/dev/null 2>&1
    local rc=$?
    rm -rf "$t"
    return $rc
}
ccq_install_deps
if ! command -v "$cc" >/dev/null || ! have_libfuzzer; then
    ccq_install_deps clang libclang-rt-14-dev
    have_libfuzzer || { echo "fuzz: $cc cannot link -fsanitize=fuzzer" >&2; exit 1; }
fi

CC=$cc cmake -S "$CCQ_ROOT" -B "$dir" -DCCQ_BUILD_FUZZ=ON -DCCQ_SANITIZE=address,undefined \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
if ! grep -q '^CMAKE_C_COMPILER:.*clang' "$dir/CMakeCache.txt"; then
    echo "fuzz: $dir was configured with another compiler; use a fresh build directory" >&2
    exit 1
fi
cmake --build "$dir" --target "$bin_name" -j"$(nproc)"

work=$dir/fuzz-run-$target
rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
cp "$corpus_src"/* "$work/corpus/"

# The harness sets every configuration field itself; CCQ_* variables must not leak in.
for v in $(compgen -e | grep '^CCQ_' || true); do unset "$v"; done
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

echo "== fuzzing $bin_name for ${secs}s ($jobs job(s)); corpus copy and artifacts in $work"
args=(-max_len="$max_len" -timeout=5 -rss_limit_mb=2048 -max_total_time="$secs" -print_final_stats=1
    -artifact_prefix="$work/artifacts/")
[ "$jobs" -gt 1 ] && args+=(-jobs="$jobs" -workers="$jobs")
# shellcheck disable=SC2086
(cd "$work" && "$dir/tests/fuzz/$bin_name" "${args[@]}" ${FUZZ_ARGS:-} corpus >fuzz.log 2>&1) &&
    rc=0 || rc=$?

# With -jobs each fuzzer writes fuzz-<n>.log; otherwise everything is in fuzz.log.
logs=("$work"/fuzz.log)
[ "$jobs" -gt 1 ] && logs=("$work"/fuzz-*.log)
execs=$(cat "${logs[@]}" | awk -F': *' '/stat::number_of_executed_units/ {s += $NF} END {print s + 0}')
rate=$(cat "${logs[@]}" | awk -F': *' '/stat::average_exec_per_sec/ {s += $NF} END {print s + 0}')
last=$(cat "${logs[@]}" | grep -E '^#[0-9]+' | tail -1 || true)
echo "== executions: $execs  exec/s: $rate (all jobs)"
echo "== last status: ${last:-none}"

found=$(find "$work/artifacts" -type f | sort)
if [ "$rc" -ne 0 ] || [ -n "$found" ]; then
    tail -n 80 "${logs[@]}" >&2 || true
    echo "== FUZZ FAILURE (libFuzzer exit $rc); inputs:" >&2
    for f in $found; do
        known=""
        for c in "$corpus_src"/*; do
            cmp -s "$f" "$c" && known=" (= $(basename "$c"), a known reproducer in $corpus_src)"
        done
        echo "  $f$known" >&2
    done
    bin=$dir/tests/fuzz/$bin_name
    cat >&2 <<EOF
== to reproduce, minimize and keep one as a regression test:
  $bin <input>                                  # replays it (CCQ_FUZZ_TRACE=1 prints the calls)
  $bin -minimize_crash=1 -runs=20000 -max_len=$max_len -timeout=5 -exact_artifact_path=$work/min.bin <input>
  cp $work/min.bin $corpus_src/crash-<what>.bin   # replayed by ctest fuzz_regression / fuzz_tcp_regression
EOF
    exit 1
fi
echo "== no crash, leak, hang or invariant violation"
