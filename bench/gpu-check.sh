#!/usr/bin/env bash
# One-shot GPU check of ccq, for a machine with an NVIDIA GPU: configure and build (Release,
# CCQ_WITH_NCCL=ON, into build-gpu/), list the GPUs, run the GPU tests (ctest -R gpu_) and
# bench/gpu_overhead, then print one summary table. Installs nothing. Every step has a
# timeout and the whole run stays within CCQ_GPU_CHECK_BUDGET seconds (default 570).
# Without a GPU the tests and the benchmark report "skipped" and the script exits 0.
#
# Also what only a GPU settles (issue 26): gpu_stream_wait (GPU-side waits, alternating
# buffers so consecutive all_reduces could share a batch) again with
# CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware queue per GPU, as Megatron-LM sets), and
# bench/gpu_launch_latency (small-op latency when launches wait for each other). For a
# before/after of the latter, CCQ_GPU_CHECK_BASE=<git rev> (needs git and the repository)
# or CCQ_GPU_CHECK_BASE_SRC=<dir> (a source tree of the older version, e.g. carried) builds
# that version's libccq into build-gpu-base/ and runs the same program against it.
#
# Usage, in the repo root:   bash bench/gpu-check.sh
# With $OUT set, the summary is also written to $OUT/gpu-check.txt and the whole log to
# $OUT/gpu-check-log.txt.
# A machine without Concurrency Kit, cmocka or pkg-config can use a build-gpudeps/ folder
# made elsewhere by bench/gpu-deps.sh (used only for what is missing). NCCL is looked for in
# NCCL_ROOT, the CUDA toolkit, the system, then Python's nvidia-nccl wheels.
# Exit status: 0 passed (or no GPU), 1 a failure, 2 a prerequisite is missing.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${CCQ_GPU_BUILD_DIR:-$ROOT/build-gpu}
DEPS=${CCQ_GPU_DEPS:-$ROOT/build-gpudeps}
BUDGET=${CCQ_GPU_CHECK_BUDGET:-570}
TESTS=(gpu_allreduce gpu_sendrecv gpu_fence gpu_error gpu_collectives gpu_stream_wait)
T0=$(date +%s)

SUMMARY=()
FAILED=0
NGPU_SMI=0

say() { printf '\n==== %s [%ss]\n' "$*" "$(($(date +%s) - T0))"; }
row() { SUMMARY+=("$(printf '%-16s %s' "$1" "$2")"); }
fail_row() {
    row "$1" "FAIL: $2"
    FAILED=$((FAILED + 1))
}

# Seconds a step may take: its cap, less what must stay for later steps, within the budget.
step_time() {
    local left=$((BUDGET - ($(date +%s) - T0) - $2))
    ((left > $1)) && left=$1
    ((left < 0)) && left=0
    echo "$left"
}

print_summary() {
    local text
    text=$(
        echo
        echo "==================== ccq gpu-check summary ===================="
        for l in "${SUMMARY[@]}"; do
            echo "$l"
        done
        echo "RESULT: $1  (total $(($(date +%s) - T0)) s)"
        echo "==============================================================="
    )
    echo "$text"
    if [ -n "${OUT:-}" ]; then
        mkdir -p "$OUT" && echo "$text" >"$OUT/gpu-check.txt"
    fi
}

# A prerequisite is missing: say which, summarise, stop.
missing() {
    echo "gpu-check: $*" >&2
    fail_row prerequisites "$*"
    print_summary "FAIL (prerequisite missing)"
    exit 2
}

# The header and the library of NCCL: NCCL_ROOT/NCCL_HOME, the CUDA toolkit, the system, then
# Python's nvidia-nccl-cu* wheels (which ship libnccl.so.2 only). Prints "include lib".
find_nccl() {
    local d lib inc sp
    for d in "${NCCL_ROOT:-}" "${NCCL_HOME:-}" "$CUDA_ROOT" "$CUDA_ROOT/targets/x86_64-linux" \
        /usr /usr/local; do
        if [ -z "$d" ] || [ ! -f "$d/include/nccl.h" ]; then
            continue
        fi
        for lib in "$d"/lib64/libnccl.so "$d"/lib/libnccl.so "$d"/lib/x86_64-linux-gnu/libnccl.so \
            /usr/lib/x86_64-linux-gnu/libnccl.so "$d"/lib64/libnccl.so.2 "$d"/lib/libnccl.so.2 \
            "$d"/lib/x86_64-linux-gnu/libnccl.so.2 /usr/lib/x86_64-linux-gnu/libnccl.so.2; do
            if [ -e "$lib" ]; then
                echo "$d/include $lib"
                return 0
            fi
        done
    done
    for py in python3 python; do
        command -v "$py" >/dev/null || continue
        for sp in $(timeout 30 "$py" -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null); do
            [ -d "$sp/nvidia" ] || continue
            inc=$(timeout 30 find "$sp/nvidia" -maxdepth 4 -name nccl.h -path '*include*' 2>/dev/null | head -1)
            [ -n "$inc" ] || continue
            inc=$(dirname "$inc")
            for lib in "$inc/../lib/libnccl.so" "$inc/../lib/libnccl.so.2"; do
                if [ -e "$lib" ]; then
                    echo "$inc $(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")"
                    return 0
                fi
            done
        done
    done
    return 1
}

# bench/gpu_launch_latency against this tree's libccq, or (LD_LIBRARY_PATH=$2) another one's.
run_latency() {
    local label=${1:+, $1} libdir=$2 log rc to
    log="$BUILD/gpu_launch_latency${libdir:+-base}.log"
    to=$(step_time 90 60)
    if ((to < 20)); then
        fail_row "latency$label" "not run: the time budget is spent"
        return
    fi
    LD_LIBRARY_PATH="${libdir}${libdir:+:}${LD_LIBRARY_PATH:-}" timeout -k 10 "$to" \
        "$BUILD/bench/gpu_launch_latency" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    if ((rc == 0)); then
        row "latency$label" "$(sed -nE 's/^launch latency \(us, median \/ p90\): //p' "$log" | head -1)"
    elif ((rc == 77)); then
        row "latency$label" "skip: $(sed -nE 's/.*SKIP [^:]*: //p' "$log" | head -1 | cut -c1-110)"
    else
        fail_row "latency$label" "status $rc; $(grep -m1 -E '^FAIL |self-timeout' "$log" | cut -c1-110)"
    fi
}

main() {
    local rc to t line status secs log
    say "ccq gpu-check in $ROOT (budget ${BUDGET}s)"
    echo "host: $(uname -srm), $(nproc) CPUs, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "tree: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout')$(git -C "$ROOT" status --porcelain 2>/dev/null | head -1 | grep -q . && echo ' (with local changes)')"
    row host "$(uname -m), $(nproc) CPUs"

    # ---- Prerequisites ------------------------------------------------------------------
    say "prerequisites"
    command -v cmake >/dev/null || missing "cmake not found in PATH"
    command -v ctest >/dev/null || missing "ctest not found in PATH"
    command -v "${CC:-cc}" >/dev/null || command -v gcc >/dev/null ||
        missing "no C compiler (cc or gcc) in PATH"
    echo "cmake: $(cmake --version | head -1)"
    CUDA_ROOT=${CUDAToolkit_ROOT:-${CUDA_PATH:-${CUDA_HOME:-}}}
    if [ -z "$CUDA_ROOT" ]; then
        if command -v nvcc >/dev/null; then
            CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
        elif [ -x /usr/local/cuda/bin/nvcc ]; then
            CUDA_ROOT=/usr/local/cuda
        fi
    fi
    if [ -z "$CUDA_ROOT" ] || { [ ! -f "$CUDA_ROOT/include/cuda_runtime_api.h" ] &&
        [ ! -f "$CUDA_ROOT/targets/x86_64-linux/include/cuda_runtime_api.h" ]; }; then
        missing "CUDA toolkit not found (no nvcc in PATH, no /usr/local/cuda, or no" \
            "cuda_runtime_api.h under '${CUDA_ROOT:-}'); set CUDAToolkit_ROOT"
    fi
    [ -x "$CUDA_ROOT/bin/nvcc" ] && export PATH="$CUDA_ROOT/bin:$PATH"
    echo "CUDA toolkit: $CUDA_ROOT ($("$CUDA_ROOT/bin/nvcc" --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'no nvcc'))"
    row "CUDA toolkit" "$CUDA_ROOT"

    # ck and cmocka through pkg-config; the carried tree fills in what is missing.
    if ! { command -v pkg-config >/dev/null && pkg-config --exists ck cmocka 2>/dev/null; }; then
        if [ -d "$DEPS/pkgconfig" ]; then
            echo "using carried dependencies from $DEPS"
            export PKG_CONFIG_PATH="$DEPS/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
            command -v pkg-config >/dev/null || export PATH="$DEPS/bin:$PATH"
            row dependencies "ck/cmocka carried in $(basename "$DEPS")"
        fi
    fi
    command -v pkg-config >/dev/null ||
        missing "pkg-config not found (make build-gpudeps with bench/gpu-deps.sh and carry it)"
    pkg-config --exists ck || missing "Concurrency Kit (pkg-config ck) not found (libck-dev," \
        "or carry build-gpudeps made by bench/gpu-deps.sh)"
    pkg-config --exists cmocka || missing "cmocka (pkg-config cmocka) not found" \
        "(libcmocka-dev, or carry build-gpudeps made by bench/gpu-deps.sh)"
    echo "ck $(pkg-config --modversion ck), cmocka $(pkg-config --modversion cmocka)"

    NCCL_ARGS=()
    if line=$(find_nccl); then
        NCCL_ARGS=(-DNCCL_INCLUDE_DIR="${line%% *}" -DNCCL_LIBRARY="${line#* }")
        echo "NCCL: header in ${line%% *}, library ${line#* }"
        row NCCL "$(grep -hE '^#define NCCL_(MAJOR|MINOR|PATCH) ' "${line%% *}/nccl.h" | awk '{printf "%s%s", sep, $3; sep="."}') (${line#* })"
    else
        missing "NCCL not found (nccl.h + libnccl in NCCL_ROOT, the CUDA toolkit, the system or" \
            "a Python nvidia-nccl wheel)"
    fi
    export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

    # ---- GPUs -----------------------------------------------------------------------------
    say "nvidia-smi -L"
    if command -v nvidia-smi >/dev/null; then
        timeout -k 5 30 nvidia-smi -L
        rc=$?
        NGPU_SMI=$(timeout -k 5 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
        if ((rc == 0 && NGPU_SMI > 0)); then
            row GPUs "$(timeout -k 5 30 nvidia-smi -L 2>/dev/null | sed 's/ (UUID.*//' | paste -sd';' -)"
            timeout -k 5 30 nvidia-smi --query-gpu=driver_version,memory.total,compute_cap \
                --format=csv,noheader 2>/dev/null | sed 's/^/driver, memory, cc: /'
        else
            row GPUs "nvidia-smi -L failed (status $rc) or listed none"
        fi
    else
        echo "nvidia-smi: not found"
        row GPUs "nvidia-smi not found"
    fi

    # ---- Configure and build ------------------------------------------------------------------
    say "configure (Release, CCQ_WITH_NCCL=ON) into $BUILD"
    rm -rf "$BUILD"
    to=$(step_time 180 300)
    timeout -k 10 "$to" cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
        -DCCQ_WITH_NCCL=ON -DCCQ_BUILD_TESTS=ON -DCCQ_BUILD_EXAMPLES=OFF -DCCQ_WERROR=OFF \
        -DCUDAToolkit_ROOT="$CUDA_ROOT" "${NCCL_ARGS[@]}"
    rc=$?
    if ((rc != 0)); then
        fail_row configure "cmake failed (status $rc$( ((rc == 124)) && echo ', timed out'))"
        print_summary "FAIL (configure)"
        return 1
    fi
    row configure ok

    say "build (-j$(nproc))"
    to=$(step_time 300 200)
    # Only what this check runs: other targets cannot fail it.
    timeout -k 10 "$to" cmake --build "$BUILD" -j"$(nproc)" --target ccq "${TESTS[@]}" gpu_overhead \
        gpu_launch_latency
    rc=$?
    if ((rc != 0)); then
        fail_row build "build failed (status $rc$( ((rc == 124)) && echo ', timed out'))"
        print_summary "FAIL (build)"
        return 1
    fi
    row build ok

    # ---- Tests ----------------------------------------------------------------------------
    local npass=0 nskip=0 nfail=0
    for t in "${TESTS[@]}"; do
        say "ctest -R ^$t\$ -V"
        log="$BUILD/$t.ctest.log"
        to=$(step_time 250 45)
        if ((to < 20)); then
            fail_row "$t" "not run: the time budget is spent"
            nfail=$((nfail + 1))
            continue
        fi
        (cd "$BUILD" && timeout -k 10 "$to" ctest -R "^$t\$" -V --output-on-failure) 2>&1 | tee "$log"
        rc=${PIPESTATUS[0]}
        line=$(grep -E "Test +#[0-9]+: $t " "$log" | tail -1)
        secs=$(echo "$line" | grep -oE '[0-9.]+ sec' | head -1)
        if echo "$line" | grep -q 'Passed'; then
            row "$t" "pass ($secs)"
            npass=$((npass + 1))
            # gpu_stream_wait: the loop with GPU-side waits against the blocking fence.
            while IFS= read -r l; do
                SUMMARY+=("  $l")
            done < <(sed -nE 's/^([0-9]+: )?ok   ((GPU-side wait|blocking fence):.*)/\2/p' "$log")
        elif echo "$line" | grep -q 'Skipped'; then
            row "$t" "skip: $(sed -nE 's/.*SKIP [^:]*: //p' "$log" | head -1 | cut -c1-110)"
            nskip=$((nskip + 1))
        else
            status=$(echo "$line" | grep -oE '\*\*\*[A-Za-z]+[^0-9]*' | head -1 | sed 's/ *$//')
            [ -z "$status" ] && ((rc == 124 || rc == 137)) && status="killed by the step timeout (${to}s)"
            [ -z "$status" ] && ! grep -qE "Test +#" "$log" && status="no such test (not built or not registered?)"
            fail_row "$t" "${status:-failed (ctest status $rc)}; $(grep -cE '^([0-9]+: )?FAIL ' "$log") failed check(s); first: $(grep -m1 -E '^([0-9]+: )?FAIL |self-timeout' "$log" | sed -E 's/^[0-9]+: //' | cut -c1-110)"
            nfail=$((nfail + 1))
        fi
    done

    # ---- GPU-side waits with one hardware queue ------------------------------------------------
    say "gpu_stream_wait with CUDA_DEVICE_MAX_CONNECTIONS=1"
    log="$BUILD/gpu_stream_wait_conn1.log"
    to=$(step_time 200 120)
    if ((to < 20)); then
        fail_row "wait, 1 queue" "not run: the time budget is spent"
    else
        CUDA_DEVICE_MAX_CONNECTIONS=1 timeout -k 10 "$to" "$BUILD/tests/gpu/gpu_stream_wait" 2>&1 |
            tee "$log"
        rc=${PIPESTATUS[0]}
        if ((rc == 0)); then
            row "wait, 1 queue" "pass"
            while IFS= read -r l; do
                SUMMARY+=("  $l")
            done < <(sed -nE 's/^ok   ((GPU-side wait|blocking fence):.*)/\1/p' "$log")
        elif ((rc == 77)); then
            row "wait, 1 queue" "skip: $(sed -nE 's/.*SKIP [^:]*: //p' "$log" | head -1 | cut -c1-110)"
        else
            fail_row "wait, 1 queue" "status $rc$( ((rc == 124 || rc == 137)) && echo ' (timed out: a hang?)'); $(grep -m1 -E '^FAIL |self-timeout' "$log" | cut -c1-110)"
        fi
    fi

    # ---- Launch latency, this tree and (optionally) an older one ---------------------------
    say "bench/gpu_launch_latency"
    run_latency "" ""
    local base_src="${CCQ_GPU_CHECK_BASE_SRC:-}" base_build="$BUILD-base"
    if [ -z "$base_src" ] && [ -n "${CCQ_GPU_CHECK_BASE:-}" ]; then
        base_src="$base_build/src"
        rm -rf "$base_build" && mkdir -p "$base_src"
        if ! git -C "$ROOT" archive "$CCQ_GPU_CHECK_BASE" 2>/dev/null | tar -x -C "$base_src"; then
            row "latency, base" "not run: git archive $CCQ_GPU_CHECK_BASE failed (no git or repository here? use CCQ_GPU_CHECK_BASE_SRC)"
            base_src=""
        fi
    fi
    if [ -n "$base_src" ]; then
        say "libccq of $base_src (the base for the latency comparison)"
        to=$(step_time 240 60)
        mkdir -p "$base_build"
        if timeout -k 10 "$to" cmake -S "$base_src" -B "$base_build/b" -DCMAKE_BUILD_TYPE=Release \
            -DCCQ_WITH_NCCL=ON -DCCQ_BUILD_TESTS=OFF -DCCQ_BUILD_EXAMPLES=OFF -DCCQ_WERROR=OFF \
            -DCUDAToolkit_ROOT="$CUDA_ROOT" "${NCCL_ARGS[@]}" >"$base_build/build.log" 2>&1 &&
            timeout -k 10 "$to" cmake --build "$base_build/b" -j"$(nproc)" --target ccq \
                >>"$base_build/build.log" 2>&1; then
            run_latency base "$base_build/b"
        else
            row "latency, base" "not run: building the base failed (see $base_build/build.log)"
        fi
    fi

    # ---- Benchmark --------------------------------------------------------------------------
    say "bench/gpu_overhead"
    log="$BUILD/gpu_overhead.log"
    to=$(step_time 240 5)
    local bench_skip=0
    if ((to < 20)); then
        fail_row gpu_overhead "not run: the time budget is spent"
    else
        timeout -k 10 "$to" "$BUILD/bench/gpu_overhead" 2>&1 | tee "$log"
        rc=${PIPESTATUS[0]}
        if ((rc == 0)); then
            row gpu_overhead "ok"
            while IFS= read -r line; do
                SUMMARY+=("  $line")
            done < <(grep -E '^\((a|b)\)|^    ' "$log")
        elif ((rc == 77)); then
            row gpu_overhead "skip: $(sed -nE 's/.*SKIP [^:]*: //p' "$log" | head -1 | cut -c1-110)"
            bench_skip=1
        else
            fail_row gpu_overhead "status $rc$( ((rc == 124)) && echo ' (timed out)'); $(grep -m1 -E '^FAIL |self-timeout' "$log" | cut -c1-110)"
        fi
    fi

    # ---- Verdict ----------------------------------------------------------------------------
    if ((FAILED == 0 && npass == 0 && nskip > 0 && bench_skip == 1)); then
        if ((NGPU_SMI > 0)); then
            fail_row verdict "nvidia-smi lists $NGPU_SMI GPU(s) but the CUDA runtime found none (see SKIP lines)"
            print_summary "FAIL (GPU visible to nvidia-smi, not to CUDA)"
            return 1
        fi
        row verdict "no GPU found: the GPU tests and the benchmark were skipped"
        print_summary "SKIPPED (no GPU found)"
        return 0
    fi
    if ((FAILED == 0)); then
        print_summary "PASS ($npass passed, $nskip skipped)"
        return 0
    fi
    print_summary "FAIL ($FAILED failure(s); $npass passed, $nskip skipped)"
    return 1
}

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    main "$@" 2>&1 | tee "$OUT/gpu-check-log.txt"
    exit "${PIPESTATUS[0]}"
fi
main "$@" 2>&1
