#!/usr/bin/env bash
# shm_allreduce.c's two schedules and ccq (UCX engine, plain processes over tcp://), P x 1,
# float32 sum out of place, taking turns REPS times; each line one run's mean time per op
# (the slowest process's). Run from the repository root after bench/compare-world.sh built
# build-bench: docs/results/2026-12-07/copy-floor/side.sh [P] [REPS]
set -euo pipefail
P=${1:-4}
REPS=${2:-7}
here=$(dirname "$0")
bin=$(mktemp -d)
cc -O3 -march=native -o "$bin/shm_allreduce" "$here/shm_allreduce.c"
slowest() { awk '{print $7}' | sort -n | tail -1; }
for rep in $(seq 1 "$REPS"); do
    line="run $rep:"
    for mode in direct ideal; do
        for size in 8388608 33554432; do
            line+=" $mode $size $("$bin/shm_allreduce" "$mode" "$P" "$size" 20 | slowest)"
        done
    done
    for r in $(seq 0 $((P - 1))); do
        CCQ_WORLD_RANK=$r CCQ_WORLD_SIZE=$P CCQ_BOOTSTRAP=tcp://127.0.0.1:29611 \
            CCQ_HOST_ENGINE=ucx build-bench/tools/ccq-perf -g 1 -b 8M -e 32M -f 4 -n 20 -w 20 \
            --json >"$bin/ccq.$r" &
    done
    wait
    line+=$(python3 -c '
import json, sys
print("".join(" ccq %d %.1f" % (r["size"], r["out_of_place"]["time_us"]) for r in json.load(open(sys.argv[1]))))' "$bin/ccq.0")
    echo "$line"
done
rm -rf "$bin"
