#!/usr/bin/env bash
# Record a trace of the demo and draw docs/img/trace-demo.png from it (docs/tracing.md).
# Usage: bench/trace-demo.sh [iterations [floats]]   (default 30 4096)
# Env: BUILD_DIR (default build), OUT (default docs/img/trace-demo.png), PLOT_ARGS (extra
# plot_trace.py arguments, e.g. "--start 2000 --span 1000").
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
ccq_install_deps python3-matplotlib
dir=${BUILD_DIR:-$CCQ_ROOT/build}
out=${OUT:-docs/img/trace-demo.png}
cmake -S "$CCQ_ROOT" -B "$dir" >/dev/null
cmake --build "$dir" --target ccq_demo -j"$(nproc)" >/dev/null
trace=$dir/trace-demo.json
rm -f "$trace"
CCQ_TRACE_FILE=$trace "$dir/examples/ccq_demo" "${1:-30}" "${2:-4096}"
/usr/bin/python3 bench/plot_trace.py "$trace" "$out" ${PLOT_ARGS:-}
echo "trace: $trace (open it in https://ui.perfetto.dev); picture: $out"
