#!/usr/bin/env bash
# ccq's host all_reduce vs Open MPI's MPI_Allreduce with the same number of ranks and the
# same sizes, measured one after the other in one run. Installs Open MPI from Debian when
# missing (as root). Usage: bench/compare-mpi.sh [NP] [maxbytes]   (defaults: 2, 64M)
# Env: ITERS (20), WARMUP (5), FACTOR (2), OUTDIR (build-bench/results).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
NP=${1:-2}
MAX=${2:-64M}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
FACTOR=${FACTOR:-2}
ccq_install_deps openmpi-bin libopenmpi-dev
dir=$CCQ_ROOT/build-bench
out=${OUTDIR:-$dir/results}
mkdir -p "$out"
ccq_build "$dir" -DCMAKE_BUILD_TYPE=Release -DCCQ_BUILD_TESTS=OFF >/dev/null
mpicc -O2 -o "$dir/mpi_allreduce" bench/mpi_allreduce.c

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "== Open MPI $(mpirun --version | head -1 | awk '{print $NF}'): MPI_Allreduce, $NP processes"
mpirun --oversubscribe --bind-to none -np "$NP" "$dir/mpi_allreduce" \
    -b 8 -e "$MAX" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" >"$out/mpi-np$NP.json"
echo "== ccq-perf: host backend, $NP devices"
"$dir/tools/ccq-perf" -g "$NP" -b 8 -e "$MAX" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" --json \
    >"$out/ccq-np$NP.json"

python3 - "$out/mpi-np$NP.json" "$out/ccq-np$NP.json" "$NP" <<'PY'
import json, sys
mpi = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ccq = json.load(open(sys.argv[2]))
np_ = sys.argv[3]
by = {r["size"]: r for r in mpi}
print(f"# float32 sum, out of place, {np_} ranks; time per op in us (mean of iterations)")
print(f"# {'size(B)':>10} {'MPI us':>10} {'ccq us':>10} {'speed-up':>9} {'MPI busbw':>10} {'ccq busbw':>10}")
for r in ccq:
    m = by.get(r["size"])
    if m is None:
        continue
    c = r["out_of_place"]
    print(f"  {r['size']:>10} {m['time_us']:>10.2f} {c['time_us']:>10.2f} "
          f"{m['time_us'] / c['time_us']:>8.1f}x {m['busbw']:>10.2f} {c['busbw']:>10.2f}")
PY
echo "(JSON: $out/mpi-np$NP.json, $out/ccq-np$NP.json)"
