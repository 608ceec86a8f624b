#!/usr/bin/env bash
# Every collective on the host backend: ccq-perf --floor for each of the nine, on NDEV
# devices, 16 B to 64 MiB, then one table of times at a few sizes and, at the largest, the
# bus bandwidth and the share of the memory-traffic floor (the time a parallel memcpy takes
# to move the bytes the collective must read and write, timed right after it; see ccq-perf
# --help). Usage: bench/collectives.sh [NDEV] [maxbytes]   (defaults: 4, 64M)
# Env: ITERS (20), WARMUP (5), OUTDIR (build-bench/results).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
NDEV=${1:-4}
MAX=${2:-64M}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
ccq_install_deps
dir=$CCQ_ROOT/build-bench
out=${OUTDIR:-$dir/results}
mkdir -p "$out"
ccq_build "$dir" -DCMAKE_BUILD_TYPE=Release -DCCQ_BUILD_TESTS=OFF >/dev/null

json=$out/collectives-g$NDEV.json
: >"$json"
for c in all_reduce sendrecv broadcast reduce all_gather reduce_scatter alltoall gather scatter; do
    "$dir/tools/ccq-perf" --collective "$c" -g "$NDEV" -b 16 -e "$MAX" -f 4 -n "$ITERS" \
        -w "$WARMUP" --floor --json >>"$json"
done

python3 - "$json" "$NDEV" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
rows = [r for block in re.findall(r"\[.*?\n\]", text, re.S) for r in json.loads(block)]
ndev = sys.argv[2]
shown = [64, 65536, 1 << 20]
def fmt_size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1024 else f"{b} B"
kinds = list(dict.fromkeys(r["collective"] for r in rows))
biggest = max(r["size"] for r in rows)
print(f"# host backend, {ndev} devices, float32 (sum where it reduces), out of place; "
      "time per op in us (mean of iterations)")
print("| collective | " + " | ".join(fmt_size(s) for s in shown) +
      f" | {fmt_size(biggest)} | busbw GB/s | floor | of floor |")
print("|---|" + "---|" * (len(shown) + 4))
for k in kinds:
    by = {r["size"]: r["out_of_place"] for r in rows if r["collective"] == k}
    big = by[biggest]
    cells = [f"{by[s]['time_us']:.1f}" if s in by else "-" for s in shown]
    print(f"| {k} | " + " | ".join(cells) +
          f" | {big['time_us'] / 1000:.2f} ms | {big['busbw']:.2f} | "
          f"{big['floor_us'] / 1000:.2f} ms | {100 * big['of_floor']:.0f}% |")
wrong = sum((r["out_of_place"] or {}).get("wrong", 0) + (r["in_place"] or {}).get("wrong", 0)
            for r in rows)
print(f"# wrong elements: {wrong}")
sys.exit(1 if wrong else 0)
PY
