#!/usr/bin/env bash
# The host backend across processes against MPI_Allreduce and Gloo, one run, the same sizes:
# ccq-perf under mpirun (P processes x G devices, bootstrap "mpi"), bench/mpi_allreduce.c
# with P*G processes, bench/gloo_allreduce.cc (TCP on loopback, a FileStore) with P*G
# processes. float32 sum, out of place, mean time per op, the slowest process's.
# Usage: bench/compare-world.sh [P] [G] [maxbytes]   (defaults: 2, 1, 64M)
# Env: ITERS (10), WARMUP (3), MINB (16), FACTOR (4), OUTDIR (build-bench/results).
# Installs openmpi-bin, libopenmpi-dev and libgloo-dev from Debian when missing (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
P=${1:-2}
G=${2:-1}
MAX=${3:-64M}
ITERS=${ITERS:-10}
WARMUP=${WARMUP:-3}
MINB=${MINB:-16}
FACTOR=${FACTOR:-4}
N=$((P * G))
ccq_install_deps openmpi-bin libopenmpi-dev libgloo-dev
dir=$CCQ_ROOT/build-bench
out=${OUTDIR:-$dir/results}
mkdir -p "$out"
ccq_build "$dir" -DCMAKE_BUILD_TYPE=Release -DCCQ_BUILD_TESTS=OFF >/dev/null
mpicc -O2 -o "$dir/mpi_allreduce" bench/mpi_allreduce.c
g++ -std=c++17 -O2 -o "$dir/gloo_allreduce" bench/gloo_allreduce.cc -lgloo -lpthread

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run="mpirun --oversubscribe --bind-to none"
flags=(-b "$MINB" -e "$MAX" -f "$FACTOR" -n "$ITERS" -w "$WARMUP")
echo "== ccq-perf: $P processes x $G host devices"
$run -np "$P" "$dir/tools/ccq-perf" -g "$G" "${flags[@]}" --json >"$out/world-ccq-p${P}g${G}.json"
echo "== MPI_Allreduce: $N processes"
$run -np "$N" "$dir/mpi_allreduce" "${flags[@]}" >"$out/world-mpi-np$N.json"
echo "== Gloo allreduce (TCP loopback, FileStore): $N processes"
store=$(mktemp -d)
GLOO_STORE_DIR=$store $run -x GLOO_STORE_DIR -np "$N" "$dir/gloo_allreduce" "${flags[@]}" \
    >"$out/world-gloo-np$N.json"
rm -rf "$store"

python3 - "$out/world-ccq-p${P}g${G}.json" "$out/world-mpi-np$N.json" "$out/world-gloo-np$N.json" \
    "$P" "$G" <<'PY'
import json, sys
ccq = json.load(open(sys.argv[1]))
mpi = {r["size"]: r for r in (json.loads(l) for l in open(sys.argv[2]) if l.strip())}
gloo = {r["size"]: r for r in (json.loads(l) for l in open(sys.argv[3]) if l.strip())}
p, g = sys.argv[4], sys.argv[5]
print(f"# float32 sum, out of place; ccq: {p} processes x {g} devices; MPI and Gloo: "
      f"{int(p) * int(g)} processes; time per op (us), ratio = other / ccq")
print(f"# {'size(B)':>10} {'ccq us':>10} {'MPI us':>10} {'Gloo us':>10} {'MPI/ccq':>8} {'Gloo/ccq':>8}"
      f" {'ccq busbw':>9} {'#wrong':>6}")
for r in ccq:
    c = r["out_of_place"]
    m, gl = mpi.get(r["size"]), gloo.get(r["size"])
    mt = m["time_us"] if m else float("nan")
    gt = gl["time_us"] if gl else float("nan")
    print(f"  {r['size']:>10} {c['time_us']:>10.2f} {mt:>10.2f} {gt:>10.2f} {mt / c['time_us']:>7.2f}x"
          f" {gt / c['time_us']:>7.2f}x {c['busbw']:>9.3f} {c['wrong']:>6}")
PY
echo "(JSON in $out)"
