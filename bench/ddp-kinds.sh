#!/usr/bin/env bash
# A sharded step's collectives (FSDP / ZeRO: reduce_scatter of the gradients, Mean, and
# all_gather of the parameters), one per parameter as bench/ddp_step --kind runs them, on the
# UCX engine as plain processes over tcp:// and on the MPI engine under mpirun: fusion on
# (fusion_bytes default) against off (0), side by side in one run of ddp_step (its runtimes'
# steps interleaved round by round). Layouts: 2 x 1, 2 x 2, 4 x 1 (UCX), 2 x 2 (MPI).
# Writes OUTDIR/kinds-*.json and prints one line per run (docs/performance.md, "Fusion of
# all_gather and reduce_scatter").
# Usage: bench/ddp-kinds.sh   Env: STEPS (30), ROUNDS (5), PARAMS (500x1K,90x64K,10x1M),
#   KINDS (reduce_scatter all_gather), OUTDIR (build-bench/results), PORT (29600)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-30}
ROUNDS=${ROUNDS:-5}
PARAMS=${PARAMS:-500x1K,90x64K,10x1M}
KINDS=${KINDS:-reduce_scatter all_gather}
PORT=${PORT:-29600}
bin=$PWD/build-bench/bench/ddp_step
out=${OUTDIR:-$PWD/build-bench/results}
[ -x "$bin" ] || { echo "build build-bench first (bench/ddp-step.sh does)" >&2; exit 2; }
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
common=(-n "$STEPS" -w 3 -r "$ROUNDS" --params "$PARAMS" --fusion default,0)

ucx() { # P G KIND
    local pids=() r
    for r in $(seq 0 $(($1 - 1))); do
        CCQ_WORLD_RANK=$r CCQ_WORLD_SIZE=$1 CCQ_BOOTSTRAP=tcp://127.0.0.1:$PORT \
            CCQ_HOST_ENGINE=ucx "$bin" -g "$2" --kind "$3" "${common[@]}" \
            --json "$out/kinds-ucx-p$1g$2-$3.json" | grep '^ddp_step' || true &
        pids+=($!)
    done
    wait "${pids[@]}"
    PORT=$((PORT + 2)) # ddp_step's second runtime met on PORT + 1
}

for k in $KINDS; do
    ucx 2 1 "$k"
    ucx 2 2 "$k"
    ucx 4 1 "$k"
    CCQ_HOST_ENGINE=mpi mpirun --oversubscribe --bind-to none -np 2 -x CCQ_HOST_ENGINE "$bin" \
        -g 2 --kind "$k" "${common[@]}" --json "$out/kinds-mpi-p2g2-$k.json" | grep '^ddp_step'
done
