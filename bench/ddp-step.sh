#!/usr/bin/env bash
# A data-parallel step (issue 27, docs/performance.md#fusion): ccq against MPI, side by side
# in one run, the fusion on/off ratio, and step time against fusion_bytes (the plot).
#   ccq 2 processes x 1 device   vs MPI_Allreduce per parameter and one fused MPI_Allreduce
#                                   with 2 processes
#   ccq 2 processes x 2 devices  vs the same with 4 processes
#   ccq 1 process x 4 devices    (for reference)
# then ccq 2 x 1 and 2 x 2 with fusion_bytes swept (SWEEP). Every configuration runs ROUNDS
# times, interleaved (a noisy machine moves all of them alike); the table takes the median of
# the per-run medians. Writes OUTDIR/ddp-*.json, ddp-summary.txt and docs' plot
# (bench/plot_ddp.py, when matplotlib is there).
# Usage: bench/ddp-step.sh   Env: ROUNDS (3), STEPS (15), WARMUP (3), PARAMS (500x1K,90x64K,10x1M),
#   ORDER (interleaved), SWEEP (0,4K,16K,64K,256K,1M,2M,4M,16M), OUTDIR (build-bench/results),
#   PLOT (docs/img/ddp-fusion.png)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-15}
WARMUP=${WARMUP:-3}
PARAMS=${PARAMS:-500x1K,90x64K,10x1M}
ORDER=${ORDER:-interleaved}
SWEEP=${SWEEP:-0,4K,16K,64K,256K,1M,2M,4M,16M}
ccq_install_deps openmpi-bin libopenmpi-dev
dir=$CCQ_ROOT/build-bench
out=${OUTDIR:-$dir/results}
mkdir -p "$out"
ccq_build "$dir" -DCMAKE_BUILD_TYPE=Release -DCCQ_BUILD_TESTS=OFF >/dev/null
mpicc -O2 -o "$dir/mpi_ddp_step" bench/mpi_ddp_step.c

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run="mpirun --oversubscribe --bind-to none"
common=(-n "$STEPS" -w "$WARMUP" -r 1 --params "$PARAMS" --order "$ORDER")
rm -f "$out"/ddp-*.json
for r in $(seq 1 "$ROUNDS"); do
    echo "== round $r of $ROUNDS"
    $run -np 2 "$dir/bench/ddp_step" -g 1 "${common[@]}" --fusion default,0 \
        --json "$out/ddp-ccq-p2g1-r$r.json"
    $run -np 2 "$dir/mpi_ddp_step" "${common[@]}" >"$out/ddp-mpi-np2-r$r.json"
    $run -np 2 "$dir/bench/ddp_step" -g 2 "${common[@]}" --fusion default,0 \
        --json "$out/ddp-ccq-p2g2-r$r.json"
    $run -np 4 "$dir/mpi_ddp_step" "${common[@]}" >"$out/ddp-mpi-np4-r$r.json"
    "$dir/bench/ddp_step" -g 4 "${common[@]}" --fusion default,0 --json "$out/ddp-ccq-p1g4-r$r.json"
done
echo "== fusion_bytes sweep: $SWEEP"
$run -np 2 "$dir/bench/ddp_step" -g 1 "${common[@]}" -r "$ROUNDS" --fusion "$SWEEP" \
    --json "$out/ddp-sweep-p2g1.json"
$run -np 2 "$dir/bench/ddp_step" -g 2 "${common[@]}" -r "$ROUNDS" --fusion "$SWEEP" \
    --json "$out/ddp-sweep-p2g2.json"

python3 bench/ddp_summary.py "$out" | tee "$out/ddp-summary.txt"
ccq_plot_ddp "$out" "${PLOT:-docs/img/ddp-fusion.png}"
echo "(JSON in $out)"
