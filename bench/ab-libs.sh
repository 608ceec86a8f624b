#!/usr/bin/env bash
# Two builds of libccq (each a directory holding libccq.so and its modules, e.g. copies of
# build-bench before and after a change) side by side in one run, with MPI_Allreduce beside
# them: P plain processes x G devices of ccq-perf on the UCX engine over tcp:// (loopback),
# all_reduce float32 out of place, one size at a time, A, B and MPI (the order rotating), REPS
# times; each cell is the median of its REPS runs (rank 0's mean time per op, as nccl-tests
# reports), and the fastest of them beside it: the 2-vCPU VMs of docs/performance.md switch
# for seconds at a time between a fast and a 3-4x slower memory (MPI_Allreduce alone too),
# which moves a median of few runs more than most changes do; the fastest run of each is the
# cost without that.
# Usage: bench/ab-libs.sh DIR_A DIR_B P G SIZE...   e.g. bench/ab-libs.sh /tmp/a /tmp/b 2 1 64K 1M
# Env: REPS (6), ITERS (20), WARMUP (100: warm-up operations before the timed ones, ccq and MPI
#   alike; the first ~64 operations on a shared-memory path pay UCX's first touch of its receive
#   descriptors, docs/performance.md), OP (sum; MPI_Allreduce always sums), PORT (29800), ENV_A and ENV_B
#   (VAR=VALUE words set for A's or B's processes only: one build, two settings, e.g.
#   ENV_B=CCQ_UCX_RING_BYTES=131072 bench/ab-libs.sh build-bench build-bench 2 1 64K).
# libccq.so is taken from each directory through LD_LIBRARY_PATH (ccq-perf's RUNPATH gives
# way to it) and the modules from beside it (docs/layout.md, Loading).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 5 ] || {
    sed -n '2,10p' "$0"
    exit 2
}
A=$1 B=$2 P=$3 G=$4
shift 4
REPS=${REPS:-6}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-100}
OP=${OP:-sum}
PORT=${PORT:-29800}
perf=$PWD/build-bench/tools/ccq-perf
mpi=$PWD/build-bench/mpi_allreduce
[ -x "$perf" ] || { echo "build build-bench first (bench/compare-world.sh does)" >&2; exit 2; }
out=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

run_ccq() { # run_ccq A|B SIZE REP
    local dir=$A extra=${ENV_A:-} pids=() r
    [ "$1" = B ] && dir=$B extra=${ENV_B:-}
    for r in $(seq 0 $((P - 1))); do
        # shellcheck disable=SC2086
        env $extra LD_LIBRARY_PATH=$dir CCQ_WORLD_RANK=$r CCQ_WORLD_SIZE=$P \
            CCQ_BOOTSTRAP=tcp://127.0.0.1:$PORT CCQ_HOST_ENGINE=ucx \
            "$perf" -g "$G" -b "$2" -e "$2" -n "$ITERS" -w "$WARMUP" -o "$OP" --json \
            >"$out/$1.$2.$3.r$r" &
        pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r"; done
    PORT=$((PORT + 1))
}
# The order rotates every repetition (A B M, B M A, M A B; M = MPI): whichever of two
# back-to-back runs came second was often faster on these VMs (ab-ddp.sh), so a fixed order
# biases the ratios. Each takes every place once in 3 repetitions: give REPS as a multiple of 3.
order=(A B M)
for rep in $(seq 1 "$REPS"); do
    k=$(((rep - 1) % 3))
    for S in "$@"; do
        for X in "${order[@]:k}" "${order[@]:0:k}"; do
            if [ "$X" != M ]; then
                run_ccq "$X" "$S" "$rep"
            elif [ -x "$mpi" ]; then
                mpirun --oversubscribe --bind-to none -np $((P * G)) "$mpi" -b "$S" -e "$S" \
                    -n "$ITERS" -w "$WARMUP" >"$out/M.$S.$rep" 2>/dev/null
            fi
        done
    done
done

python3 - "$out" "$REPS" "$P" "$G" "$OP" "$@" <<'PY'
import glob, json, statistics, sys
out, reps, p, g, op, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
def first(path):
    text = open(path).read()
    try:
        r = json.loads(text)[0]["out_of_place"]      # ccq-perf --json: a list
    except (ValueError, KeyError, TypeError):
        r = json.loads(text.splitlines()[0])       # mpi_allreduce: one object per line
    return r["time_us"], r.get("wrong", 0)
print(f"# all_reduce float32 {op}, {p} processes x {g} devices, UCX engine over tcp://; "
      f"MPI_Allreduce (sum) with {int(p) * int(g)} processes")
print(f"# time per op (us), median of {reps} runs; A/B > 1: B faster; MPI/X > 1: X faster than MPI")
print(f"{'size':>8} {'A':>9} {'B':>9} {'A/B':>6} {'MPI':>9} {'MPI/A':>6} {'MPI/B':>6} | fastest:"
      f" {'A':>9} {'B':>9} {'A/B':>6} {'MPI':>9} {'MPI/B':>6} wrong")
for s in sizes:
    a = [first(f"{out}/A.{s}.{r}.r0") for r in range(1, reps + 1)]
    b = [first(f"{out}/B.{s}.{r}.r0") for r in range(1, reps + 1)]
    m = [first(f) for f in glob.glob(f"{out}/M.{s}.*")]
    ma, mb = statistics.median(x[0] for x in a), statistics.median(x[0] for x in b)
    mm = statistics.median(x[0] for x in m) if m else float("nan")
    fa, fb = min(x[0] for x in a), min(x[0] for x in b)
    fm = min(x[0] for x in m) if m else float("nan")
    print(f"{s:>8} {ma:>9.1f} {mb:>9.1f} {ma / mb:>6.2f} {mm:>9.1f} {mm / ma:>6.2f} {mm / mb:>6.2f} |"
          f"          {fa:>9.1f} {fb:>9.1f} {fa / fb:>6.2f} {fm:>9.1f} {fm / fb:>6.2f}"
          f" {sum(x[1] for x in a + b)}")
PY
rm -rf "$out"
