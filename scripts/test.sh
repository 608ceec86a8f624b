#!/usr/bin/env bash
# Run the whole test suite (ctest); exits non-zero on any failure.
# Usage: ./scripts/test.sh [build-dir]      (CCQ_SANITIZE=address|thread|... for a sanitizer build)
set -euo pipefail
. "$(dirname "$0")/common.sh"
ccq_install_deps
dir=${1:-$CCQ_ROOT/build}
args=(-DCCQ_WERROR=ON)
[ -n "${CCQ_SANITIZE:-}" ] && args+=(-DCCQ_SANITIZE="$CCQ_SANITIZE" -DCMAKE_BUILD_TYPE=Debug)
ccq_build "$dir" "${args[@]}"
cd "$dir"
ctest --output-on-failure -j"$(nproc)"
