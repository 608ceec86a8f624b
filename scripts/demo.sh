#!/usr/bin/env bash
# The main job on the embedded default (host backend, 4 devices): several threads per device
# submit all_reduce and send/recv on several streams, fence, verify every result, and print
# a summary; then ccq-perf shows the speed (nccl-tests' table, 8 B to 64 MiB, results
# checked). Arguments are passed to the example (iterations, elements).
# Builds only the two programs (targets ccq_demo and ccq-perf) in build/ (CCQ_BUILD_DIR to
# choose another), quietly: the compiler's output goes to build/demo-build.log.
set -euo pipefail
. "$(dirname "$0")/common.sh"
ccq_install_deps
dir=${CCQ_BUILD_DIR:-$CCQ_ROOT/build}
ccq_build_targets "$dir" demo-build.log "ccq_demo ccq-perf" -DCCQ_WERROR=ON
"$dir/examples/ccq_demo" "$@"
echo
"$dir/tools/ccq-perf" -g 4 -b 8 -e 64M -f 2 -n 10 -w 2
