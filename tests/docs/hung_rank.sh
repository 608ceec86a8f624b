#!/bin/sh
# docs/tracing.md's hung-rank walkthrough, for real: examples/hung_rank.c under mpiexec with
# 3 processes (the host backend's default engine; process 1 stops after all_reduce #4), then
# `ccq-trace analyze` on their dumps. The analysis must exit 1 and print every line the
# document shows between its hung-rank-output markers (but the lines with timings), and each
# process's fence line must be what the document shows up to its timing.
# Usage: hung_rank.sh <dir of ccq_hung_rank> <docs/tracing.md> <tools/ccq-trace> <mpiexec> [flags...]
set -eu
bin=$1 doc=$2 tool=$3
shift 3
tmp=$(mktemp -d /tmp/ccq-hung-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cd "$bin"
CCQ_TRACE_FILE=$tmp/trace.%r.json CCQ_TIMEOUT_MS=2000 CCQ_BOOTSTRAP=mpi "$@" -n 3 ./ccq_hung_rank >"$tmp/run" 2>&1 ||
    { cat "$tmp/run"; echo "FAIL: the job failed" >&2; exit 1; }
cat "$tmp/run"
rc=0
python3 "$tool" analyze "$tmp"/trace.*.json >"$tmp/analysis" || rc=$?
cat "$tmp/analysis"
[ "$rc" = 1 ] || { echo "FAIL: analyze exited $rc, not 1" >&2; exit 1; }

sed -n '/hung-rank-output:begin/,/hung-rank-output:end/p' "$doc" >"$tmp/doc"
[ -s "$tmp/doc" ] || { echo "FAIL: no hung-rank-output block in $doc" >&2; exit 1; }
bad=0
# The analysis, line for line, but lines carrying a time.
grep -E '^(ccq-trace: |comm |  PROBLEM|    #|  last sequence|[0-9]+ problem)' "$tmp/doc" >"$tmp/want"
[ "$(wc -l <"$tmp/want")" -ge 5 ] || { echo "FAIL: the document's block lost its analysis" >&2; exit 1; }
while IFS= read -r line; do
    grep -qxF -- "$line" "$tmp/analysis" || { echo "FAIL: the analysis lacks: $line" >&2; bad=1; }
done <"$tmp/want"
# The fences, up to the time the engine waited.
grep -E '^process [0-9]: fence: ' "$tmp/doc" | sed -e 's/ still pending after .*//' \
    -e 's/ not started after .*//' -e 's/, pending for .*//' >"$tmp/want"
while IFS= read -r line; do
    grep -qF -- "$line" "$tmp/run" || { echo "FAIL: the run lacks: $line" >&2; bad=1; }
done <"$tmp/want"
exit $bad
