#!/usr/bin/env bash
# Run every host benchmark side by side in one session, keep their JSON, and draw the plots
# used by docs/performance.md. Usage: bench/run-all.sh [outdir]   (default build-bench/results)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
ccq_install_deps openmpi-bin libopenmpi-dev python3-matplotlib
dir=$CCQ_ROOT/build-bench
out=${1:-$dir/results}
mkdir -p "$out"
ccq_build "$dir" -DCMAKE_BUILD_TYPE=Release -DCCQ_BUILD_TESTS=OFF >/dev/null
b=$dir/bench
{
    echo "# ccq benchmarks, $(date -u +%Y-%m-%d), $(nproc) cores: $(lscpu | sed -n 's/^Model name: *//p')"
    "$b/bench_submit" --json "$out/submit.json"
    "$b/bench_latency" --json "$out/latency.json"
    "$b/bench_throughput" --json "$out/throughput.json"
    "$b/bench_bandwidth" --json "$out/bandwidth.json"
    OUTDIR=$out bench/compare-mpi.sh 2 64M
    OUTDIR=$out bench/compare-mpi.sh 4 64M
    OUTDIR=$out bench/collectives.sh 4
    OUTDIR=$out bench/collectives.sh 2
} 2>&1 | tee "$out/summary.txt"
/usr/bin/python3 bench/plot.py "$out" docs/img
