#!/usr/bin/env bash
# Build and run the test suite under AddressSanitizer + UndefinedBehaviorSanitizer (with
# LeakSanitizer) and under ThreadSanitizer. Usage: scripts/sanitize.sh [asan|tsan|all]
#
# Iteration counts are lowered (CCQ_TEST_*), since sanitizers slow memory-heavy loops 5-20x;
# the stress is in the number of threads and interleavings, not in repetitions. Under TSan,
# test_reduce (single-threaded kernels, exhaustive conversions), test_allreduce and
# test_collectives (the dtype x op x size grids, already covered under ASan) are left out: they exercise no
# concurrency that test_threads, test_stress and test_matching do not, and take minutes
# there. GPU programs are left out too (they exit 77 without a GPU, and the CUDA runtime's
# own allocations at exit are not ours to report).
set -euo pipefail
. "$(dirname "$0")/common.sh"
ccq_install_deps
which=${1:-all}
common=(-DCMAKE_BUILD_TYPE=Debug -DCCQ_WERROR=ON -DCCQ_BUILD_BENCH=OFF -DCCQ_BUILD_EXAMPLES=OFF)
export CCQ_TEST_ITEMS=200000 CCQ_TEST_WAKE_ROUNDS=20000 CCQ_TEST_EVENT_ROUNDS=5000 CCQ_STRESS_OPS=2000

if [ "$which" = all ] || [ "$which" = asan ]; then
    echo "== AddressSanitizer + UBSan + LeakSanitizer"
    ccq_build "$CCQ_ROOT/build-asan" "${common[@]}" -DCCQ_SANITIZE=address,undefined >/dev/null
    (cd "$CCQ_ROOT/build-asan" &&
        ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        ctest -j"$(nproc)" --output-on-failure -E '^gpu_')
fi
if [ "$which" = all ] || [ "$which" = tsan ]; then
    echo "== ThreadSanitizer"
    ccq_build "$CCQ_ROOT/build-tsan" "${common[@]}" -DCCQ_SANITIZE=thread >/dev/null
    (cd "$CCQ_ROOT/build-tsan" &&
        TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 CCQ_TEST_ITERS=2 \
        ctest -j"$(nproc)" --output-on-failure \
            -E '^gpu_|^test_reduce$|^test_allreduce$|^test_collectives$')
fi
