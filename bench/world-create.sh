#!/usr/bin/env bash
# How the cost of starting a world grows: ccq_runtime_create + a world ccq_comm_init + the
# first all_reduce (bench/bench_world_create.c), P processes x 1 host device, for P = 2, 4,
# 8, 16 on the tcp://, file: and mpi bootstraps (the host backend's default engine, UCX, in
# all three), REPS runs each, the slowest process's time, median of the runs. With more
# processes than cores this is growth, not speed. Also the tcp rendezvous server's peak
# memory (what it held: records and buffers) at the largest P.
# Usage: bench/world-create.sh ["2 4 8 16"]   Env: REPS (5), OUTDIR, PORT (29700).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
SIZES=${1:-"2 4 8 16"}
REPS=${REPS:-5}
PORT=${PORT:-29700}
dir=$CCQ_ROOT/build-bench
out=${OUTDIR:-$dir/results}
mkdir -p "$out"
ccq_build "$dir" -DCMAKE_BUILD_TYPE=Release -DCCQ_BUILD_TESTS=OFF >/dev/null
bin=$dir/bench/bench_world_create
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
res=$out/world-create.jsonl
: >"$res"

plain() { # plain <P> <bootstrap> <outfile>: P processes of the benchmark, no launcher
    local pids=() r
    for r in $(seq 0 $(($1 - 1))); do
        CCQ_WORLD_RANK=$r CCQ_WORLD_SIZE=$1 CCQ_BOOTSTRAP=$2 CCQ_TCP_STATS=1 CCQ_TIMEOUT_MS=120000 \
            "$bin" >>"$3" 2>>"$3.err" &
        pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r"; done
}

for rep in $(seq 1 "$REPS"); do
    for p in $SIZES; do
        for boot in tcp file mpi; do
            f=$out/create.$boot.$p.$rep
            rm -f "$f" "$f.err"
            case $boot in
            tcp) plain "$p" "tcp://127.0.0.1:$((PORT + p))" "$f" ;;
            file) d=$(mktemp -d); plain "$p" "file:$d" "$f"; rm -rf "$d" ;;
            mpi) CCQ_TIMEOUT_MS=120000 mpirun --oversubscribe --bind-to none -x CCQ_TIMEOUT_MS \
                     -np "$p" "$bin" >"$f" 2>"$f.err" ;;
            esac
            python3 - "$f" "$boot" "$p" "$rep" >>"$res" <<'PY'
import json, re, sys
f, boot, p, rep = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = [json.loads(l) for l in open(f) if l.startswith("{")]
assert len(rows) == p, f"{f}: {len(rows)} of {p} processes reported"
peak = None
for l in open(f + ".err"):
    m = re.search(r"peak (\d+) bytes held", l)
    if m:
        peak = int(m.group(1))
out = {"boot": boot, "p": p, "rep": rep, "server_peak_bytes": peak}
for k in ("create_ms", "comm_init_ms", "first_all_reduce_ms", "total_ms"):
    out[k] = max(r[k] for r in rows)
print(json.dumps(out))
PY
        done
    done
done

python3 - "$res" <<'PY' | tee "$out/world-create.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("# ccq_runtime_create + world ccq_comm_init + first all_reduce (256 floats), 1 host device per")
print("# process, UCX engine; slowest process, median of runs, ms")
print(f"# {'P':>3} {'boot':>5} {'create':>9} {'comm_init':>9} {'1st a_r':>9} {'total':>9} {'server peak':>12}")
for p in sorted({r["p"] for r in rows}):
    for boot in ("tcp", "file", "mpi"):
        rs = [r for r in rows if r["p"] == p and r["boot"] == boot]
        if not rs:
            continue
        m = lambda k: statistics.median(r[k] for r in rs)
        peak = max((r["server_peak_bytes"] or 0) for r in rs)
        print(f"  {p:>3} {boot:>5} {m('create_ms'):>9.1f} {m('comm_init_ms'):>9.1f}"
              f" {m('first_all_reduce_ms'):>9.1f} {m('total_ms'):>9.1f}"
              f" {(str(peak) + ' B') if boot == 'tcp' else '':>12}")
PY
