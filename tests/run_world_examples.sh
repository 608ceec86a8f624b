#!/bin/sh
# The examples of docs/multiprocess.md, run as the document says, from the directory the build
# puts them in: the file-bootstrap one-liner (taken from the document's table, only its
# directory made unique, and not created beforehand: the bootstrap creates it), the tcp and
# torchrun-style one-liners (only their port made unique; with CCQ_EXPECT_SPAN set, as when
# ccq has its UCX engine, the world's all_reduce must work in both processes), then (if
# given) the same program under mpiexec, then ccq_world_store forking 3 processes, piped
# through cat (its children must flush their lines before they exit).
# Usage: run_world_examples.sh <dir of ccq_world> <docs/multiprocess.md> [mpiexec and flags...]
set -eu
bin=$1
doc=$2
shift 2
tmp=$(mktemp -d /tmp/ccq-example-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
free_port_py=$(cd "$(dirname "$0")" && pwd)/free_port.py
cd "$bin"

# The one-liner, exactly as the table's "file:DIR" row has it but for the directory.
line=$(grep '^| `"file:DIR"` |' "$doc" | sed -n 's/.*| `\(for r in .*\)` |$/\1/p')
[ -n "$line" ] || { echo "no file-bootstrap one-liner in $doc" >&2; exit 1; }
case $line in *"file:/tmp/myjob "*) ;; *) echo "the one-liner no longer uses /tmp/myjob: $line" >&2; exit 1 ;; esac
job=$tmp/myjob # does not exist yet
line=$(printf '%s\n' "$line" | sed "s|file:/tmp/myjob |file:$job |")
echo "\$ $line"
sh -c "$line" >"$tmp/out" 2>&1 || true
cat "$tmp/out"
for r in 0 1; do
    grep -q "^process $r of 2 " "$tmp/out" || { echo "FAIL: no line from process $r" >&2; exit 1; }
done
if grep -q "^ccq_runtime_create: " "$tmp/out"; then
    echo "FAIL: ccq_runtime_create failed" >&2
    exit 1
fi
mode=$(stat -c %a "$job")
[ "$mode" = 700 ] || { echo "FAIL: the bootstrap made $job with mode $mode, not 700" >&2; exit 1; }

# The tcp one-liner and the torchrun-style one, each as the table has it but for the port
# (a free one below the kernel's ephemeral range, tests/free_port.py: tests run in parallel).
# On the UCX engine the world's all_reduce works.
free_port() { python3 "$free_port_py"; }
for row in '`"tcp://HOST:PORT"`' 'torchrun'; do
    line=$(grep -F "| $row" "$doc" | sed -n 's/.*| `\(for r in .*\)` |$/\1/p')
    [ -n "$line" ] || { echo "no $row one-liner in $doc" >&2; exit 1; }
    port=$(free_port)
    line=$(printf '%s\n' "$line" | sed -e "s|127.0.0.1:29500 |127.0.0.1:$port |" \
        -e "s|MASTER_PORT=29501 |MASTER_PORT=$port |")
    case $line in *"$port"*) ;; *) echo "the $row one-liner lost its port: $line" >&2; exit 1 ;; esac
    echo "\$ $line"
    sh -c "$line" >"$tmp/out" 2>&1 || true
    cat "$tmp/out"
    for r in 0 1; do
        grep -q "^process $r of 2 " "$tmp/out" || { echo "FAIL: no line from process $r" >&2; exit 1; }
    done
    if [ -n "${CCQ_EXPECT_SPAN:-}" ]; then
        n=$(grep -c "the world over 4 devices: OK" "$tmp/out" || true)
        [ "$n" = 2 ] || { echo "FAIL: the world's all_reduce did not work in both processes" >&2; exit 1; }
    fi
done

if [ $# -gt 0 ]; then
    CCQ_BOOTSTRAP=mpi "$@" -n 2 ./ccq_world
fi

# Every process's line must come through a pipe (the children _exit: they flush first).
./ccq_world_store 3 | cat >"$tmp/store"
cat "$tmp/store"
n=$(grep -c "^process [0-2] of 3: " "$tmp/store" || true)
[ "$n" = 3 ] || { echo "FAIL: $n of 3 processes' lines came through the pipe" >&2; exit 1; }
grep -q "^OK: every process checked its results" "$tmp/store"
