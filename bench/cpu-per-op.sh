#!/usr/bin/env bash
# Where the time of a small all_reduce goes when processes share cores: the CPU time and the
# context switches one process spends per operation, ccq (the UCX engine, P plain processes
# over tcp://, a chain of all_reduces and one fence, as ccq-perf times it) beside blocking
# MPI_Allreduce (P processes under mpirun), float32 sum, out of place.
#
# Each run starts the P processes with enough operations for several seconds, waits until
# they are in their timed loop (SETTLE seconds), then reads process 0's threads from /proc
# for WINDOW seconds: CPU time (schedstat, ns) and context switches (voluntary and not,
# status). Per operation, with the operation's time from the benchmark's own report:
#   cpu_us    process 0's CPU time per operation (all threads; ccq's is nearly all its
#             scheduler's, busiest_us)
#   switches  process 0's context switches per operation
# When every core is busy (P processes on fewer cores, each spinning or yielding while it
# waits for a peer) the operation takes about P / cores times a process's CPU per
# operation: the cores run the processes' work one after another, so what a process spends
# per operation, switches included, is what the operation costs (docs/performance.md,
# "Where the time of a small operation goes (2026-12-06)").
# Usage: bench/cpu-per-op.sh [P] [SIZE]   (defaults: 4, 8). Each run must outlast SETTLE + WINDOW:
# raise ITERS_CCQ and ITERS_MPI where an operation takes less than ~10 us (2 x 1: 2000000 and
# 10000000); a run too short is reported and left out.
# Env: REPS (5; each cell the median of REPS runs, ccq and MPI alternating), SETTLE (1.5),
#   WINDOW (1), ITERS_CCQ (300000), ITERS_MPI (800000), PORT (29900).
set -euo pipefail
cd "$(dirname "$0")/.."
P=${1:-4}
S=${2:-8}
REPS=${REPS:-5}
SETTLE=${SETTLE:-1.5}
WINDOW=${WINDOW:-1}
ITERS_CCQ=${ITERS_CCQ:-300000}
ITERS_MPI=${ITERS_MPI:-800000}
PORT=${PORT:-29900}
perf=$PWD/build-bench/tools/ccq-perf
mpi=$PWD/build-bench/mpi_allreduce
if [ ! -x "$perf" ] || [ ! -x "$mpi" ]; then
    echo "build build-bench and its MPI benchmark first (bench/compare-world.sh does)" >&2
    exit 2
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# threads PID: per thread of PID, "tid cpu_ns switches" (schedstat's time on a CPU; voluntary
# and involuntary context switches).
threads() {
    local t
    for t in /proc/"$1"/task/*; do
        echo "${t##*/} $(cut -d' ' -f1 "$t/schedstat" 2>/dev/null || echo 0)" \
            "$(awk '/ctxt_switches/ {s += $2} END {print s + 0}' "$t/status" 2>/dev/null || echo 0)"
    done
}

# sample PID FILE: its threads now and WINDOW seconds later, with the times of both readings.
sample() {
    date +%s%N >"$2.t0"
    threads "$1" >"$2.0"
    sleep "$WINDOW"
    date +%s%N >"$2.t1"
    threads "$1" >"$2.1"
}

run_ccq() { # run_ccq REP
    local pids=() r port=$((PORT + $1))
    for r in $(seq 0 $((P - 1))); do
        CCQ_WORLD_RANK=$r CCQ_WORLD_SIZE=$P CCQ_BOOTSTRAP=tcp://127.0.0.1:$port \
            CCQ_HOST_ENGINE=ucx "$perf" -g 1 -b "$S" -e "$S" -n "$ITERS_CCQ" -w 100 --json \
            >"$out/ccq.$1.r$r" &
        pids+=($!)
    done
    sleep "$SETTLE"
    if kill -0 "${pids[0]}" 2>/dev/null; then
        sample "${pids[0]}" "$out/ccq.$1.s"
    else
        echo "ccq run $1 ended before its window: raise ITERS_CCQ" >&2
    fi
    for r in "${pids[@]}"; do wait "$r"; done
}

run_mpi() { # run_mpi REP
    mpirun --oversubscribe --bind-to none -np "$P" "$mpi" -b "$S" -e "$S" -n "$ITERS_MPI" -w 100 \
        >"$out/mpi.$1" 2>/dev/null &
    local launcher=$! pid=""
    sleep "$SETTLE"
    # The rank that printed nothing yet is any of them: take the lowest pid of the benchmark.
    pid=$(pgrep -f "^$mpi " | sort -n | head -1)
    if [ -n "$pid" ]; then
        sample "$pid" "$out/mpi.$1.s"
    else
        echo "MPI run $1 ended before its window: raise ITERS_MPI" >&2
    fi
    wait "$launcher"
}

for rep in $(seq 1 "$REPS"); do
    if [ $((rep % 2)) = 1 ]; then run_ccq "$rep"; run_mpi "$rep"; else run_mpi "$rep"; run_ccq "$rep"; fi
done

python3 - "$out" "$REPS" "$P" "$S" "$(nproc)" <<'PY'
import json, statistics, sys
out, reps, p, size, cores = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]

def time_us(path):
    text = open(path).read()
    try:
        return json.loads(text)[0]["out_of_place"]["time_us"]  # ccq-perf --json
    except (ValueError, KeyError, TypeError, IndexError):
        return json.loads(text.splitlines()[0])["time_us"]  # mpi_allreduce

def window(prefix):
    def read(f):
        return {l.split()[0]: (int(l.split()[1]), int(l.split()[2])) for l in open(f) if l.strip()}
    a, b = read(prefix + ".0"), read(prefix + ".1")
    d = [(b[t][0] - a[t][0], b[t][1] - a[t][1]) for t in b if t in a]
    ns = int(open(prefix + ".t1").read()) - int(open(prefix + ".t0").read())
    return ns, sum(x[0] for x in d), max(x[0] for x in d), sum(x[1] for x in d)

print(f"# all_reduce float32 sum {size} B, {p} processes on {cores} cores; process 0 over a window "
      f"inside the timed loop; medians of {reps} runs")
print(f"{'':>8} {'time_us':>8} {'cpu_us':>8} {'busiest':>8} {'switches':>8}  (per operation)")
for name, tag, res in (("ccq UCX", "ccq", "ccq.{}.r0"), ("MPI", "mpi", "mpi.{}")):
    cells = []
    for r in range(1, reps + 1):
        try:
            t = time_us(f"{out}/" + res.format(r))
            ns, cpu, busiest, sw = window(f"{out}/{tag}.{r}.s")
        except (OSError, ValueError, KeyError, IndexError):
            continue
        ops = ns / (t * 1000.0)  # operations in the window
        cells.append((t, cpu / 1e3 / ops, busiest / 1e3 / ops, sw / ops))
    if not cells:
        print(f"{name:>8} (no run measured)")
        continue
    med = [statistics.median(c[k] for c in cells) for k in range(4)]
    print(f"{name:>8} {med[0]:>8.2f} {med[1]:>8.2f} {med[2]:>8.2f} {med[3]:>8.2f}")
PY
