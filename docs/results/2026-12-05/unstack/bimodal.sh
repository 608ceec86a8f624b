#!/bin/bash
# usage (from the repository root, after bench/compare-world.sh built build-bench): LIB=build-bench
#   bimodal.sh SIZE N ITERS  -> per-run times for CCQ_UCX_UNSTACK=0 and 1, interleaved
S=$1; N=$2; IT=$3; port=${PORT:-30000}
for i in $(seq 1 $N); do
  for m in 0 1; do
    port=$((port+1))
    for r in 0 1; do CCQ_UCX_UNSTACK=$m LD_LIBRARY_PATH=${LIB:-build-bench} CCQ_WORLD_RANK=$r CCQ_WORLD_SIZE=2 CCQ_BOOTSTRAP=tcp://127.0.0.1:$port CCQ_HOST_ENGINE=ucx build-bench/tools/ccq-perf -g 1 -b $S -e $S -n $IT -w 5 --json > /tmp/bm.$r 2>&1 & done; wait
    python3 -c "import json,sys,re; t=open('/tmp/bm.0').read(); r=json.loads(re.findall(r'\[.*?\n\]',t,re.S)[0]); print($m, r[0]['out_of_place']['time_us'])"
  done
done
