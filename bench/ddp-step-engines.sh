#!/usr/bin/env bash
# The DDP step of bench/ddp-step.sh on both engines of the host backend, side by side in one
# run (issue 27, docs/performance.md#fusion-a-data-parallel-step):
#   ccq on the UCX engine, plain processes over tcp:// (no launcher), fusion on and off
#   ccq on the MPI engine under mpirun, fusion on and off
#   MPI alone: MPI_Allreduce per parameter, and one of the packed gradients
# for 2 processes x 1 device (MPI alone: 2 processes) and 2 x 2 (MPI alone: 4). Every
# configuration runs ROUNDS times, interleaved, the order rotating; the table
# (bench/ddp_engines_summary.py) takes the median of the per-run medians.
# Usage: bench/ddp-step-engines.sh   Env: ROUNDS (6), STEPS (15), WARMUP (3), PARAMS
#   (500x1K,90x64K,10x1M), ORDER (interleaved), OUTDIR (build-bench/results-engines),
#   SWEEP (0,64K,256K,1M,4M,16M: fusion_bytes values on the UCX engine; empty: none), PLOT
#   (docs/img/ddp-fusion-ucx.png)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
ROUNDS=${ROUNDS:-6}
STEPS=${STEPS:-15}
WARMUP=${WARMUP:-3}
PARAMS=${PARAMS:-500x1K,90x64K,10x1M}
ORDER=${ORDER:-interleaved}
SWEEP=${SWEEP-0,64K,256K,1M,4M,16M}
dir=$CCQ_ROOT/build-bench
out=${OUTDIR:-$dir/results-engines}
mkdir -p "$out"
ccq_build "$dir" -DCMAKE_BUILD_TYPE=Release -DCCQ_BUILD_TESTS=OFF >/dev/null
mpicc -O2 -o "$dir/mpi_ddp_step" bench/mpi_ddp_step.c

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run="mpirun --oversubscribe --bind-to none"
common=(-n "$STEPS" -w "$WARMUP" -r 1 --params "$PARAMS" --order "$ORDER")

# ddp_step as a world of $1 plain processes over tcp:// on the UCX engine; the rest: its args.
tcp_world() {
    local np=$1 port=$((20000 + RANDOM % 20000)) pids=() rc=0
    shift
    for ((p = 0; p < np; p++)); do
        CCQ_WORLD_RANK=$p CCQ_WORLD_SIZE=$np CCQ_BOOTSTRAP=tcp://127.0.0.1:$port \
            CCQ_HOST_ENGINE=ucx "$dir/bench/ddp_step" "$@" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
    return $rc
}

# The order rotates from round to round (the three runs, and fusion on and off within each):
# on these VMs the second of two back-to-back runs was often 15-20% faster (bench/ab-ddp.sh), so
# a fixed order biased every ratio of the table. Give ROUNDS as a multiple of 6 to balance it.
one_run() { # one_run ucx|mpieng|mpi G ROUND FUSIONS
    case $1 in
    ucx) tcp_world 2 -g "$2" "${common[@]}" --fusion "$4" --json "$out/ddp-ucx-p2g$2-r$3.json" ;;
    mpieng)
        $run -np 2 -x CCQ_HOST_ENGINE=mpi "$dir/bench/ddp_step" -g "$2" "${common[@]}" \
            --fusion "$4" --json "$out/ddp-mpieng-p2g$2-r$3.json"
        ;;
    mpi)
        $run -np $((2 * $2)) "$dir/mpi_ddp_step" "${common[@]}" \
            >"$out/ddp-mpi-np$((2 * $2))-r$3.json"
        ;;
    esac
}
rm -f "$out"/ddp-*.json
runs=(ucx mpieng mpi)
for r in $(seq 1 "$ROUNDS"); do
    echo "== round $r of $ROUNDS"
    k=$(((r - 1) % 3))
    fusions=default,0
    [ $((r % 2)) = 0 ] && fusions=0,default
    for g in 1 2; do
        for x in "${runs[@]:k}" "${runs[@]:0:k}"; do
            one_run "$x" "$g" "$r" "$fusions"
        done
    done
done
python3 bench/ddp_engines_summary.py "$out" | tee "$out/ddp-engines-summary.txt"
if [ -n "$SWEEP" ]; then
    # fusion_bytes against the step time on the UCX engine, with MPI alone's lines (the rounds'
    # ddp-mpi-np*.json), drawn by bench/plot_ddp.py as for the MPI engine.
    echo "== fusion_bytes sweep on the UCX engine: $SWEEP"
    for g in 1 2; do
        tcp_world 2 -g "$g" "${common[@]}" -r "$ROUNDS" --fusion "$SWEEP" \
            --json "$out/ddp-sweep-p2g$g.json"
    done
    ccq_plot_ddp "$out" "${PLOT:-docs/img/ddp-fusion-ucx.png}"
fi
echo "(JSON in $out)"
