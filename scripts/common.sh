# shellcheck shell=bash
# Shared by scripts/*.sh: install missing Debian packages (as root), configure and build.
# Usage: . scripts/common.sh; ccq_build <build-dir> [extra cmake args...]

CCQ_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# libucx-dev: the host backend's UCX engine; ucx-utils: ucx_info and ucx_perftest (what the
# transport itself does, next to ccq's numbers in docs/performance.md).
CCQ_DEBS="build-essential cmake pkg-config libck-dev libcmocka-dev python3 openmpi-bin libopenmpi-dev libucx-dev ucx-utils"
# What the test suite needs beyond the build: Doxygen, for the API reference's check (ctest
# api_docs; the `docs` target); iproute2 (`ip netns`), for the partition drill (ctest
# drill_partition). scripts/test.sh installs these too.
CCQ_TEST_DEBS="doxygen iproute2"

ccq_need_pkg() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

ccq_install_deps() {
    local missing=""
    for p in $CCQ_DEBS "$@"; do
        ccq_need_pkg "$p" || missing="$missing $p"
    done
    [ -z "$missing" ] && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "== installing Debian packages:$missing"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq && apt-get install -y -qq $missing >/dev/null
    else
        echo "missing Debian packages:$missing (run as root, or: sudo apt-get install$missing)" >&2
        return 1
    fi
}

ccq_build() {
    local dir=$1
    shift
    cmake -S "$CCQ_ROOT" -B "$dir" "$@" >/dev/null &&
        cmake --build "$dir" -j"$(nproc)"
}

# Build only <targets> (space-separated) in <dir>, configuring it with the remaining cmake
# args only if it has never been configured (an existing build keeps its options), with all
# output in <dir>/<log>; on failure print the log's tail. Prints one status line.
# Usage: ccq_build_targets <dir> <log name> "<targets>" [cmake args...]
ccq_build_targets() {
    local dir=$1 log=$2 targets=$3 start=$SECONDS
    shift 3
    mkdir -p "$dir"
    log=$dir/$log
    : >"$log"
    # shellcheck disable=SC2086 # targets are words
    if { [ -f "$dir/CMakeCache.txt" ] || cmake -S "$CCQ_ROOT" -B "$dir" "$@" >>"$log" 2>&1; } &&
        cmake --build "$dir" -j"$(nproc)" --target $targets >>"$log" 2>&1; then
        echo "== built $targets in $dir ($((SECONDS - start)) s; log: $log)"
    else
        tail -n 40 "$log" >&2
        echo "== building $targets in $dir failed (log: $log)" >&2
        return 1
    fi
}

# Python: a virtual environment with what the Python bindings' build and tests need, from PyPI
# (pip); Debian's python3-venv and python3-dev when the python3 on PATH lacks venv or Python.h.
# Usage: ccq_python_env <venv-dir>
CCQ_PY_PACKAGES="setuptools>=64 wheel numpy pytest pytest-timeout ml_dtypes"
ccq_python_env() {
    local venv=$1
    command -v python3 >/dev/null || ccq_install_deps python3 || return 1
    if ! python3 -c 'import ensurepip, os, sys, sysconfig, venv
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
        2>/dev/null; then
        ccq_install_deps python3-venv python3-dev || return 1
    fi
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv" || return 1
    "$venv/bin/python" -m pip install -q --disable-pip-version-check $CCQ_PY_PACKAGES
}

# pytest, bounded in time; its "no tests collected" (exit code 5) is reported, not fatal: the
# suite's own files decide what runs (a missing module skips, never fails the build).
# Usage: ccq_pytest <venv-dir> <seconds> [pytest args...]
ccq_pytest() {
    local venv=$1 limit=$2 rc=0
    shift 2
    (cd "$CCQ_ROOT/bindings/python" &&
        OPENBLAS_NUM_THREADS=1 timeout "$limit" "$venv/bin/python" -m pytest -p no:cacheprovider \
            -q -rs "$@") || rc=$?
    if [ "$rc" = 5 ]; then
        echo "== pytest collected no tests (bindings/python/tests)"
        return 0
    fi
    return "$rc"
}

# Draw the DDP step's plot (bench/plot_ddp.py RESULTS_DIR OUT.png) with a python3 that has
# matplotlib: the one on PATH, else Debian's (python3-matplotlib); says so when neither has it.
ccq_plot_ddp() {
    local py=python3
    python3 -c "import matplotlib" 2>/dev/null || py=/usr/bin/python3
    if $py -c "import matplotlib" 2>/dev/null; then
        $py "$CCQ_ROOT/bench/plot_ddp.py" "$1" "$2"
    else
        echo "(matplotlib missing: no plot; apt-get install python3-matplotlib)"
    fi
}
