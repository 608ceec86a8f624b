#!/usr/bin/env bash
# Two builds of libccq (or one build, two settings) side by side on the DDP step of
# bench/ddp-step.sh (docs/performance.md, "Fusion: a data-parallel step"): NP (2) plain processes x G
# devices of bench/ddp_step on the UCX engine over tcp:// (loopback), fusion at its default,
# A, B and MPI alone (MPI_Allreduce per parameter and one of the packed gradients, NP x G
# processes under mpirun), REPS times interleaved, the order rotating. Prints the medians of
# the runs' median step times, A/B (> 1: B faster), the fastest steps, and MPI against each
# (> 1: ccq faster).
# Usage: bench/ab-ddp.sh DIR_A DIR_B [REPS [G]]   e.g. bench/ab-ddp.sh /tmp/a /tmp/b 9 1
# Env: ENV_A and ENV_B (VAR=VALUE words for A's or B's processes only, e.g.
#   ENV_A=CCQ_UCX_FUSED_IN_PLACE=0 bench/ab-ddp.sh build-bench build-bench), STEPS (20),
#   PARAMS (500x1K,90x64K,10x1M), OUTDIR (a new temporary directory: the runs' JSON), NP (2:
#   processes, e.g. NP=4 for 4 x 1 on 2 cores).
# libccq.so is taken from each directory through LD_LIBRARY_PATH, the modules from beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || {
    sed -n '2,12p' "$0"
    exit 2
}
A=$1 B=$2 REPS=${3:-9} G=${4:-1} NP=${NP:-2}
d=$PWD/build-bench
[ -x "$d/bench/ddp_step" ] && [ -x "$d/mpi_ddp_step" ] || {
    echo "build build-bench and build-bench/mpi_ddp_step first (bench/ddp-step.sh does)" >&2
    exit 2
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=${OUTDIR:-$(mktemp -d)}
mkdir -p "$out"
com=(-n "${STEPS:-20}" -w 3 -r 1 --params "${PARAMS:-500x1K,90x64K,10x1M}" --order interleaved)
# The order rotates every repetition (A B M, B M A, M A B): on these VMs whichever of two
# back-to-back runs comes second was often up to 15-20% faster (2026-12-05: a setting A/B'd in
# both orders gave 1.18x and 0.88x), so a fixed order biases every ratio below. Each takes
# every place once in 3 repetitions: give REPS as a multiple of 3.
run_ccq() { # run_ccq A|B REP
    local lib=$A extra=${ENV_A:-} port=$((20000 + RANDOM % 20000)) pids=() p
    [ "$1" = B ] && lib=$B extra=${ENV_B:-}
    for p in $(seq 0 $((NP - 1))); do
        # shellcheck disable=SC2086 # extra holds VAR=VALUE words
        env $extra LD_LIBRARY_PATH="$lib" CCQ_WORLD_RANK=$p CCQ_WORLD_SIZE=$NP \
            CCQ_BOOTSTRAP=tcp://127.0.0.1:$port CCQ_HOST_ENGINE=ucx "$d/bench/ddp_step" \
            -g "$G" "${com[@]}" --fusion default --json "$out/$1.$2.json" > /dev/null &
        pids+=($!)
    done
    wait "${pids[@]}"
}
order=(A B M)
for r in $(seq 1 "$REPS"); do
    k=$(((r - 1) % 3))
    for X in "${order[@]:k}" "${order[@]:0:k}"; do
        if [ "$X" = M ]; then
            mpirun --oversubscribe --bind-to none -np $((NP * G)) "$d/mpi_ddp_step" "${com[@]}" \
                > "$out/M.$r.json" 2> /dev/null
        else
            run_ccq "$X" "$r"
        fi
    done
done
echo "# DDP step, $NP processes x $G devices, UCX engine, fusion default; $REPS interleaved runs; $out"
echo "# A: $A ${ENV_A:-}; B: $B ${ENV_B:-}; MPI alone: $((NP * G)) processes"
python3 - "$out" "$REPS" << 'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
def runs(x):
    v = []
    for r in range(1, reps + 1):
        if x == 'M':
            recs = [json.loads(l) for l in open(f"{out}/M.{r}.json") if l.strip()]
        else:
            recs = json.load(open(f"{out}/{x}.{r}.json"))["records"]
        v += [(rec.get("mode", ""), rec["median_ms"], rec["min_ms"]) for rec in recs]
    return v
a, b, m = runs('A'), runs('B'), runs('M')
ma = statistics.median(x[1] for x in a)
mb = statistics.median(x[1] for x in b)
fa, fb = min(x[2] for x in a), min(x[2] for x in b)
print(f"A {ma:.3f} ms  B {mb:.3f} ms  A/B {ma / mb:.3f}  | fastest A {fa:.3f} B {fb:.3f} A/B {fa / fb:.3f}")
for mode in sorted(set(x[0] for x in m)):
    mm = statistics.median(x[1] for x in m if x[0] == mode)
    print(f"MPI {mode} {mm:.3f} ms  MPI/A {mm / ma:.3f}  MPI/B {mm / mb:.3f}")
PY
