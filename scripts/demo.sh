#!/usr/bin/env bash
# The main job on the embedded default (host backend, 4 devices): several threads per device
# submit all_reduce and send/recv on several streams, fence, verify every result, and print
# a summary.
set -euo pipefail
. "$(dirname "$0")/common.sh"
ccq_install_deps
dir=$CCQ_ROOT/build
ccq_build "$dir" -DCCQ_WERROR=ON
"$dir/examples/ccq_demo" "$@"
