#!/usr/bin/env bash
# The Python bindings (bindings/python): build the package with pip in a virtual environment,
# then run its pytest suite (bounded in time).
#
#   scripts/python.sh <build-dir>            against the libccq built in <build-dir> (CCQ_LIB_DIR),
#                                            as ./scripts/test.sh does after ctest
#   scripts/python.sh --self-build [<dir>]   as a user installs it: `pip install ./bindings/python`
#                                            with nothing set, so pip builds libccq from this
#                                            checkout and bundles it; in a fresh venv under <dir>
#                                            (default build-python)
set -euo pipefail
. "$(dirname "$0")/common.sh"

if [ "${1:-}" = --self-build ]; then
    dir=$(mkdir -p "${2:-$CCQ_ROOT/build-python}" && cd "${2:-$CCQ_ROOT/build-python}" && pwd)
    venv=$dir/python-selfbuild-venv
    rm -rf "$venv"
    ccq_python_env "$venv"
    echo "== pip install ./bindings/python (libccq built by the package)"
    (cd "$CCQ_ROOT" && unset CCQ_LIB_DIR CCQ_INCLUDE_DIR &&
        "$venv/bin/python" -m pip install -q --disable-pip-version-check ./bindings/python)
    "$venv/bin/python" -m ccq --version
    # The package must use the libccq it bundles, not one from the build tree or the system.
    "$venv/bin/python" -c 'import ccq, os, sys
lib = os.path.realpath(ccq.library_path())
pkg = os.path.realpath(os.path.dirname(ccq.__file__))
sys.exit(0 if lib.startswith(pkg + os.sep) else "libccq loaded from %s, not from %s" % (lib, pkg))'
    ccq_pytest "$venv" 900
    exit 0
fi

dir=$(cd "${1:?usage: scripts/python.sh <build-dir> | --self-build [<dir>]}" && pwd)
venv=$dir/python-venv
ccq_python_env "$venv"
echo "== pip install ./bindings/python (CCQ_LIB_DIR=$dir)"
(cd "$CCQ_ROOT" && CCQ_LIB_DIR="$dir" CCQ_INCLUDE_DIR="$CCQ_ROOT/include" CCQ_WERROR=1 \
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation \
    --no-deps --force-reinstall ./bindings/python)
"$venv/bin/python" -m ccq --version
echo "== pytest (bindings/python)"
ccq_pytest "$venv" 900
