#!/bin/sh
# The examples of docs/multiprocess.md, run as the document says: ccq_world as two plain
# processes meeting in a directory, then (if given) under mpiexec; ccq_world_store forking 3.
# Usage: run_world_examples.sh <dir of ccq_world> [mpiexec and its flags...]
set -eu
bin=$1
shift
dir=$(mktemp -d /tmp/ccq-example-XXXXXX)
trap 'rm -rf "$dir"' EXIT
pids=""
for r in 0 1; do
    CCQ_WORLD_RANK=$r CCQ_WORLD_SIZE=2 CCQ_BOOTSTRAP=file:$dir CCQ_TIMEOUT_MS=30000 \
        "$bin/ccq_world" >"$dir/out.$r" 2>&1 &
    pids="$pids $!"
done
for p in $pids; do wait "$p"; done
cat "$dir"/out.*
grep -q "process 1 of 2" "$dir/out.1"
if [ $# -gt 0 ]; then
    CCQ_BOOTSTRAP=mpi "$@" -n 2 "$bin/ccq_world"
fi
"$bin/ccq_world_store" 3
