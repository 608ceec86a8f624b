#!/usr/bin/env bash
# Small all_reduce latency across 2 processes on the host backend's MPI engine, two ccq-perf
# builds side by side: runs alternate A, B, A, B, ... (ROUNDS of each), and the table gives
# each build's median over its runs of ccq-perf's per-operation time (us) per size, with B/A.
# usage: bench/xproc_latency.sh PERF_A PERF_B [ROUNDS] [NGPUS...]
#   e.g. bench/xproc_latency.sh /tmp/ccq-main/build/tools/ccq-perf build/tools/ccq-perf 7 1 2
# -g 1: one device per process (a pair: 2 ranks in 2 processes); -g 2: 2 x 2 devices (a
# communicator over member processes). Env: ITERS (500), WARMUP (50), MINB/MAXB/STEP (8, 4K, 8:
# the sizes, as ccq-perf -b -e -f), MPIRUN (mpirun
# --oversubscribe, as root with the allow variables set).
set -euo pipefail
a=$1 b=$2 rounds=${3:-7}
shift $(($# < 3 ? $# : 3))
gs=${*:-1 2}
iters=${ITERS:-500} warm=${WARMUP:-50}
mpirun=${MPIRUN:-mpirun --oversubscribe}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
for g in $gs; do
    for r in $(seq 1 "$rounds"); do
        for which in a b; do
            bin=$a
            [ "$which" = b ] && bin=$b
            $mpirun -np 2 "$bin" -g "$g" -b "${MINB:-8}" -e "${MAXB:-4K}" -f "${STEP:-8}" -n "$iters" -w "$warm" --json \
                >>"$out/g$g.$which.json" 2>/dev/null
        done
    done
done
python3 - "$out" "$gs" <<'PY'
import json, re, statistics, sys
out, gs = sys.argv[1], sys.argv[2].split()
def rows(path):
    text = open(path).read()
    res = {}
    for block in re.findall(r"\[.*?\n\]", text, re.S):
        for r in json.loads(block):
            res.setdefault(r["size"], []).append(r["out_of_place"]["time_us"])
    return res
for g in gs:
    A, B = rows(f"{out}/g{g}.a.json"), rows(f"{out}/g{g}.b.json")
    print(f"\n-g {g} ({'a pair: 1 device per process' if g == '1' else g + ' devices per process'}), "
          f"float32 sum, out of place, us per all_reduce (median of {len(next(iter(A.values())))} runs)")
    print("| size | A | B | B/A |")
    print("|---|---|---|---|")
    for size in sorted(A):
        ma, mb = statistics.median(A[size]), statistics.median(B[size])
        print(f"| {size} B | {ma:.2f} | {mb:.2f} | {mb / ma:.2f} |")
PY
rm -rf "$out"
