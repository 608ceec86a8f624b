#!/bin/sh
# ./scripts/demo.sh as the README runs it, into a build directory of its own: it must build
# only what the demo needs (the ccq_demo and ccq-perf targets), keep the compiler's output in
# its log, and print one status line, the demo's summary and ccq-perf's table: about 40
# lines (it printed ~250 lines of make output first when it built the whole tree).
# Usage: demo_output.sh <source dir> <scratch build dir>
set -eu
src=$1
dir=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
CCQ_BUILD_DIR=$dir "$src/scripts/demo.sh" >"$out" 2>&1 || { cat "$out"; echo "FAIL: demo.sh failed" >&2; exit 1; }
cat "$out"
lines=$(wc -l <"$out")
[ "$lines" -le 45 ] || { echo "FAIL: demo.sh printed $lines lines (at most 45 expected)" >&2; exit 1; }
head -n 1 "$out" | grep -Eq '^== built ccq_demo ccq-perf in .* \([0-9]+ s; log: .*demo-build\.log\)$' ||
    { echo "FAIL: the first line is not the build's status line" >&2; exit 1; }
grep -q '^OK: every result verified$' "$out" || { echo "FAIL: no demo verdict" >&2; exit 1; }
grep -q '^# ccq-perf ' "$out" || { echo "FAIL: no ccq-perf table" >&2; exit 1; }
if grep -E 'Built target (test_|bench_|gpu_|fuzz_|ccq_world)' "$dir/demo-build.log"; then
    echo "FAIL: demo.sh built targets the demo does not need" >&2
    exit 1
fi
echo "ok: $lines lines"
