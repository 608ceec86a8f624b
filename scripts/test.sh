#!/usr/bin/env bash
# Run the whole test suite (ctest, then the Rust and Python bindings against the library just
# built); exits non-zero on any failure.
# Usage: ./scripts/test.sh [build-dir]      (CCQ_SANITIZE=address|thread|... for a sanitizer build)
set -euo pipefail
. "$(dirname "$0")/common.sh"
ccq_install_deps $CCQ_TEST_DEBS
dir=${1:-$CCQ_ROOT/build}
args=(-DCCQ_WERROR=ON)
[ -n "${CCQ_SANITIZE:-}" ] && args+=(-DCCQ_SANITIZE="$CCQ_SANITIZE" -DCMAKE_BUILD_TYPE=Debug)
ccq_build "$dir" "${args[@]}"
dir=$(cd "$dir" && pwd)
cd "$dir"
ctest --output-on-failure -j"$(nproc)"

# The Rust bindings (bindings/rust) against the library just built: their unit, layout, doc
# and example tests ran in ctest (rust_readme_cargo_test: the README's own command, as
# written); here fmt and clippy where the toolchain has them. Skipped without cargo, and in
# sanitizer builds (a Rust test binary cannot load a sanitized libccq first).
cargo=$(command -v cargo || { [ -x "$HOME/.cargo/bin/cargo" ] && echo "$HOME/.cargo/bin/cargo"; } || true)
if [ -n "$cargo" ] && [ -z "${CCQ_SANITIZE:-}" ]; then
    dir=$(pwd)
    cd "$CCQ_ROOT/bindings/rust"
    export CARGO_NET_OFFLINE=true CCQ_LIB_DIR="$dir" CCQ_INCLUDE_DIR="$CCQ_ROOT/include"
    export CARGO_TARGET_DIR="$dir/cargo" PATH="$(dirname "$cargo"):$PATH"
    echo "== cargo fmt, clippy (bindings/rust)"
    if cargo fmt --version >/dev/null 2>&1; then cargo fmt --all --check; fi
    if cargo clippy --version >/dev/null 2>&1; then cargo clippy -q --all-targets -- -D warnings; fi
elif [ -z "$cargo" ]; then
    echo "== cargo not found: Rust bindings not tested"
fi

# The Python bindings (bindings/python) against the library just built: pip builds the package
# in a virtual environment in the build directory, then pytest (scripts/python.sh). Skipped in
# sanitizer builds, as the Rust part (the interpreter cannot load a sanitized libccq first).
if [ -z "${CCQ_SANITIZE:-}" ]; then
    "$CCQ_ROOT/scripts/python.sh" "$dir"
fi
