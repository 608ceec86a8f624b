#!/usr/bin/env bash
# The host backend across processes against MPI_Allreduce and Gloo, side by side in one run:
#   ccq UCX   ccq-perf on the UCX engine, P plain processes x G devices (no launcher: a shell
#             loop, the tcp:// rendezvous on loopback)
#   ccq MPI   ccq-perf on the MPI engine under mpirun (P x G, bootstrap "mpi")
#   MPI       blocking MPI_Allreduce, bench/mpi_allreduce.c, P*G processes
#   Gloo      bench/gloo_allreduce.cc (TCP loopback, a FileStore), P*G processes
#   floor     no all_reduce: P*G processes each copying its input into its output at once
#             (bench/mpi_allreduce.c --copy-floor), the least memory traffic any out-of-place
#             all_reduce of theirs has; Gloo/floor is the most any implementation could be
#             faster than Gloo on this machine (sizes beyond the caches only)
# float32 sum, out of place, mean time per op over ITERS (the slowest process's, as
# nccl-tests reports); the four run in turn, in an order rotating from run to run, REPS times,
# and each cell is the median of its REPS runs. Ratios: other / ccq UCX.
# Usage: bench/compare-world.sh [P] [G] [maxbytes]   (defaults: 2, 1, 64M)
# Env: ITERS (10), WARMUP (100: every column alike; the first ~64 operations on a shared-memory
# path pay UCX's first touch of its receive descriptors, docs/performance.md), MINB (8), FACTOR (2), REPS (3), OUTDIR (build-bench/results),
# PORT (29600), SKIP (columns not run: "mpie" the MPI engine, "gloo", "floor"; e.g. SKIP="mpie gloo floor"
# with ITERS=200 for the steady state against MPI alone). Installs openmpi-bin, libopenmpi-dev, libucx-dev and libgloo-dev from Debian
# when missing (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
P=${1:-2}
G=${2:-1}
MAX=${3:-64M}
ITERS=${ITERS:-10}
WARMUP=${WARMUP:-100}
MINB=${MINB:-8}
FACTOR=${FACTOR:-2}
REPS=${REPS:-3}
PORT=${PORT:-29600}
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
tag=p${P}g${G}

# P plain processes of ccq-perf on the UCX engine, meeting at tcp://127.0.0.1:PORT; rank 0's
# JSON is the table (only it prints).
plain_ucx() {
    local pids=() r
    for r in $(seq 0 $((P - 1))); do
        CCQ_WORLD_RANK=$r CCQ_WORLD_SIZE=$P CCQ_BOOTSTRAP=tcp://127.0.0.1:$PORT \
            CCQ_HOST_ENGINE=ucx "$dir/tools/ccq-perf" -g "$G" "${flags[@]}" --json >"$1.r$r" &
        pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r"; done
    mv "$1.r0" "$1"
    rm -f "$1".r*
}

# One column's run number $2 ($1: ucx, mpie, mpi or gloo; a skipped one does nothing).
run_one() {
    case $1 in
    ucx)
        echo "== run $2 of $REPS: ccq (UCX engine, plain processes): $P processes x $G devices"
        plain_ucx "$out/world-ccq-ucx-$tag.$2.json"
        ;;
    mpie)
        rm -f "$out/world-ccq-mpi-$tag.$2.json"
        [[ " ${SKIP:-} " != *" mpie "* ]] || return 0
        echo "== run $2 of $REPS: ccq (MPI engine, mpirun): $P processes x $G devices"
        CCQ_HOST_ENGINE=mpi $run -x CCQ_HOST_ENGINE -np "$P" "$dir/tools/ccq-perf" -g "$G" \
            "${flags[@]}" --json >"$out/world-ccq-mpi-$tag.$2.json"
        ;;
    mpi)
        echo "== run $2 of $REPS: MPI_Allreduce: $N processes"
        $run -np "$N" "$dir/mpi_allreduce" "${flags[@]}" >"$out/world-mpi-np$N.$2.json"
        ;;
    floor)
        rm -f "$out/world-floor-np$N.$2.json"
        [[ " ${SKIP:-} " != *" floor "* ]] || return 0
        echo "== run $2 of $REPS: the copy floor: $N processes each copying its buffer at once"
        $run -np "$N" "$dir/mpi_allreduce" --copy-floor "${flags[@]}" >"$out/world-floor-np$N.$2.json"
        ;;
    gloo)
        rm -f "$out/world-gloo-np$N.$2.json"
        [[ " ${SKIP:-} " != *" gloo "* ]] || return 0
        echo "== run $2 of $REPS: Gloo allreduce (TCP loopback, FileStore): $N processes"
        local store
        store=$(mktemp -d)
        GLOO_STORE_DIR=$store $run -x GLOO_STORE_DIR -np "$N" "$dir/gloo_allreduce" \
            "${flags[@]}" >"$out/world-gloo-np$N.$2.json"
        rm -rf "$store"
        ;;
    esac
}

# The columns take turns in an order that rotates from run to run (whichever of two
# back-to-back runs came second was often faster on these VMs: bench/ab-ddp.sh).
cols=(ucx mpie mpi gloo floor)
for rep in $(seq 1 "$REPS"); do
    k=$(((rep - 1) % ${#cols[@]}))
    for c in "${cols[@]:k}" "${cols[@]:0:k}"; do
        run_one "$c" "$rep"
    done
done

python3 - "$out" "$tag" "$N" "$P" "$G" "$REPS" <<'PY' | tee "$out/world-compare-$tag.txt"
import json, os, statistics, sys
out, tag, n, p, g, reps = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])
def ccq(path):
    if not os.path.exists(path):  # a column SKIP left out
        return {}
    return {r["size"]: r["out_of_place"] for r in json.load(open(path))}
def lines(path):
    if not os.path.exists(path):
        return {}
    return {r["size"]: r for r in (json.loads(l) for l in open(path) if l.strip())}
runs = {k: [] for k in ("ucx", "mpie", "mpi", "gloo", "floor")}
for rep in range(1, reps + 1):
    runs["ucx"].append(ccq(f"{out}/world-ccq-ucx-{tag}.{rep}.json"))
    runs["mpie"].append(ccq(f"{out}/world-ccq-mpi-{tag}.{rep}.json"))
    runs["mpi"].append(lines(f"{out}/world-mpi-np{n}.{rep}.json"))
    runs["gloo"].append(lines(f"{out}/world-gloo-np{n}.{rep}.json"))
    runs["floor"].append(lines(f"{out}/world-floor-np{n}.{rep}.json"))
def med(k, size):
    v = [r[size]["time_us"] for r in runs[k] if size in r]
    return statistics.median(v) if v else float("nan")
wrong = lambda k, size: sum(r[size]["wrong"] for r in runs[k] if size in r)
print(f"# float32 sum, out of place; ccq: {p} processes x {g} devices (UCX engine: plain "
      f"processes over tcp://; MPI engine: mpirun); MPI_Allreduce and Gloo: {n} processes")
print(f"# time per op (us), median of {reps} runs; ratio = other / ccq UCX (> 1: ccq UCX faster);")
print(f"# floor: {n} processes each copying its buffer at once (no all_reduce can take less), "
      f"Gloo/floor: the most any all_reduce could be faster than Gloo here")
print(f"# {'size(B)':>10} {'ccq UCX':>10} {'ccq MPI':>10} {'MPI':>10} {'Gloo':>10} {'floor':>10}"
      f" {'MPI/UCX':>8} {'Gloo/UCX':>8} {'ccqMPI/UCX':>10} {'MPI/ccqMPI':>10} {'Gloo/floor':>10}"
      f" {'#wrong':>6}")
for size in sorted(runs["ucx"][0]):
    u, e, m, gl = med("ucx", size), med("mpie", size), med("mpi", size), med("gloo", size)
    fl = med("floor", size)
    print(f"  {size:>10} {u:>10.2f} {e:>10.2f} {m:>10.2f} {gl:>10.2f} {fl:>10.2f} {m / u:>7.2f}x"
          f" {gl / u:>7.2f}x {e / u:>9.2f}x {m / e:>9.2f}x {gl / fl:>9.2f}x"
          f" {wrong('ucx', size) + wrong('mpie', size):>6}")
PY
echo "(JSON in $out)"
