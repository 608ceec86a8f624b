# shellcheck shell=bash
# Shared by scripts/*.sh: install missing Debian packages (as root), configure and build.
# Usage: . scripts/common.sh; ccq_build <build-dir> [extra cmake args...]

CCQ_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CCQ_DEBS="build-essential cmake pkg-config libck-dev libcmocka-dev python3 openmpi-bin libopenmpi-dev"

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
