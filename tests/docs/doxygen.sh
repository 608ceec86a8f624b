#!/bin/sh
# The API reference (docs/api/Doxyfile.in, the `docs` target's configuration) built with
# warnings as errors: any Doxygen warning fails, and so does any public symbol the reference
# leaves undocumented (check_api_docs.py, on Doxygen's XML). Without Doxygen it skips
# (exit 77), except in CI (CI set in the environment, as .ci/run does), where it fails.
# Usage: doxygen.sh <doxygen or ""> <configured Doxyfile> <include dir> <scratch dir>
set -eu
doxygen=$1 doxyfile=$2 include=$3 out=$4
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "$doxygen" ] || ! command -v "$doxygen" >/dev/null 2>&1; then
    if [ -n "${CI:-}" ]; then
        echo "FAIL: doxygen not found, and CI needs the API reference checked (apt-get install doxygen)" >&2
        exit 1
    fi
    echo "doxygen not found: the API reference is not checked (apt-get install doxygen, then reconfigure)"
    exit 77
fi
rm -rf "$out"
mkdir -p "$out"
rc=0
{
    cat "$doxyfile"
    echo "OUTPUT_DIRECTORY = $out"
    echo "WARN_LOGFILE = $out/warnings.log"
    echo "WARN_AS_ERROR = FAIL_ON_WARNINGS"
    echo "GENERATE_XML = YES"
} | "$doxygen" - >"$out/doxygen.log" 2>&1 || rc=$?
if [ "$rc" != 0 ] || [ -s "$out/warnings.log" ]; then
    cat "$out/doxygen.log" "$out/warnings.log" >&2
    echo "FAIL: Doxygen warned (exit $rc): document what it names in the header" >&2
    exit 1
fi
[ -f "$out/html/index.html" ] && [ -f "$out/html/ccq_8h.html" ] ||
    { echo "FAIL: no html/index.html or html/ccq_8h.html" >&2; exit 1; }
python3 "$here/check_api_docs.py" "$out/xml" "$include"
