#!/usr/bin/env bash
# Soak: run the seeded stress test (tests/test_stress.c) for a long time, with more threads
# and larger schedules than CI, and report "ops done: N, errors: E, seconds: S".
#
# Usage: bench/soak.sh [--tsan] [seconds]
#   seconds   how long to keep generating schedules (default: $CCQ_STRESS_SECONDS, else 600)
#   --tsan    build with ThreadSanitizer (into build-soak-tsan/) instead of Release
#             (build-soak/); any ThreadSanitizer report counts as an error
# Environment (passed on to test_stress): CCQ_STRESS_SEED (first seed; default: the time, so
# successive soaks cover new schedules; it is printed), CCQ_STRESS_THREADS (threads per
# device, default 4), CCQ_STRESS_OPS (ops per schedule, default 20000; 5000 with --tsan),
# CCQ_STRESS_DEVICES (default 6).
# A failing schedule stops the run; its seed and the knobs to reproduce it are in the log
# (build-soak*/soak.log): rerun with those variables, and a smaller CCQ_STRESS_OPS runs a
# prefix of the same schedule.
# Exit status: 0 when every op was verified, 1 on any error (or a crash or hang), 2 bad usage.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

tsan=0
secs=${CCQ_STRESS_SECONDS:-600}
for a in "$@"; do
    case $a in
    --tsan) tsan=1 ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    *[!0-9.]* | '')
        echo "soak.sh: unknown argument '$a' (usage: bench/soak.sh [--tsan] [seconds])" >&2
        exit 2
        ;;
    *) secs=$a ;;
    esac
done

ccq_install_deps
if [ $tsan = 1 ]; then
    dir=$CCQ_ROOT/build-soak-tsan
    cmake -S "$CCQ_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCCQ_SANITIZE=thread \
        -DCCQ_BUILD_BENCH=OFF -DCCQ_BUILD_EXAMPLES=OFF >/dev/null
    ops_default=5000
    # Stop at the first report so that it is counted (and not buried in a long log).
    export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
else
    dir=$CCQ_ROOT/build-soak
    cmake -S "$CCQ_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCCQ_BUILD_BENCH=OFF \
        -DCCQ_BUILD_EXAMPLES=OFF >/dev/null
    ops_default=20000
fi
cmake --build "$dir" -j"$(nproc)" --target test_stress >/dev/null

export CCQ_STRESS_SECONDS=$secs
export CCQ_STRESS_SEED=${CCQ_STRESS_SEED:-$(date +%s)}
export CCQ_STRESS_THREADS=${CCQ_STRESS_THREADS:-4}
export CCQ_STRESS_OPS=${CCQ_STRESS_OPS:-$ops_default}
export CCQ_STRESS_DEVICES=${CCQ_STRESS_DEVICES:-6}
export CCQ_STRESS_FILTER=test_stress_random_schedule
log=$dir/soak.log
echo "== soak: $secs s, seed $CCQ_STRESS_SEED, $CCQ_STRESS_DEVICES devices x" \
    "$CCQ_STRESS_THREADS threads, $CCQ_STRESS_OPS ops per schedule$([ $tsan = 1 ] && echo ', ThreadSanitizer'); log: $log"

# A schedule that hangs is reported by the test's own timeouts; this one only catches a
# runtime that stops answering altogether (a schedule may run on past the deadline).
limit=$(awk -v s="$secs" 'BEGIN { printf "%d", s + 900 }')
rc=0
timeout -k 30 "$limit" "$dir/tests/test_stress" >"$log" 2>&1 || rc=$?

line=$(grep '^STRESS ' "$log" | tail -n 1 || true)
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $line"; }
ops=$(field ops)
errors=$(field errors)
seconds=$(field seconds)
seeds=$(field seeds)
sanitizer=$(grep -c 'WARNING: ThreadSanitizer\|ERROR: AddressSanitizer\|runtime error:' "$log" || true)
if [ -z "$line" ]; then
    # No summary: it crashed, hung or a sanitizer stopped it. Count that as one error.
    ops=${ops:-0}
    errors=1
    seconds=${seconds:-$secs}
fi
errors=$((errors + sanitizer))
[ "$rc" != 0 ] && [ "$errors" = 0 ] && errors=1
echo "ops done: $ops, errors: $errors, seconds: $seconds"
if [ "$errors" != 0 ]; then
    echo "soak FAILED (exit status $rc, ${seeds:-?} schedules, $sanitizer sanitizer reports); from $log:" >&2
    grep -E 'stress|FAILED|ThreadSanitizer|AddressSanitizer|runtime error|^    #' "$log" | head -n 40 >&2 || true
    exit 1
fi
echo "soak passed: ${seeds:-?} schedules from seed $CCQ_STRESS_SEED, every part verified"
