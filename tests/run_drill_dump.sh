#!/bin/sh
# Issue 22, item 1: every process's dump is on disk, whole, before its fence reports the
# failure. Runs test_host_drills dump (3 processes: process 2 never joins the all_reduce,
# 0 and 1 _exit right after their fence's error) LOOPS times; after each job: three dumps,
# no temporary file left without its whole dump, each valid JSON, and those of 0 and 1 hold the failed all_reduce
# (a timeout, or, when job health saw the other one exit first, the loss of a process).
# usage: run_drill_dump.sh DRILL_BINARY LOOPS MPIEXEC [MPIEXEC FLAGS...]
set -u
drill=$1 loops=$2
shift 2
fail=0
i=0
while [ "$i" -lt "$loops" ]; do
    i=$((i + 1))
    dir=$(mktemp -d /tmp/ccq-drill-dump.XXXXXX)
    # the launcher may call the job failed (processes left without MPI_Finalize): only the
    # dumps are judged
    timeout 60 "$@" -n 3 "$drill" dump "$dir" >"$dir/out.txt" 2>&1
    echo "--- run $i: $(ls "$dir" | tr '\n' ' ')"
    grep '^process' "$dir/out.txt"
    for r in 0 1 2; do
        if [ ! -s "$dir/dump-$r.json" ]; then
            echo "FAIL run $i: no dump from process $r"
            fail=1
        elif ! python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$dir/dump-$r.json"; then
            echo "FAIL run $i: dump-$r.json is not whole JSON"
            fail=1
        fi
    done
    # A temporary file may be left only beside a whole dump of the same process (checked
    # above): a later dump (the watchdog's abort after the reported timeout) that the process's
    # _exit cut short. The dump of the failure its fence reported must be whole: it is.
    for t in $(ls "$dir" | grep '\.tmp'); do
        if [ ! -s "$dir/${t%%.tmp*}" ]; then
            echo "FAIL run $i: a temporary dump file was left with no whole dump: $t"
            fail=1
        fi
    done
    for r in 0 1; do
        if [ -s "$dir/dump-$r.json" ] && ! grep -q 'CCQ_ERR_TIMEOUT\|CCQ_ERR_ABORTED\|CCQ_ERR_PROCESS_LOST' "$dir/dump-$r.json"; then
            echo "FAIL run $i: dump-$r.json does not hold the failure"
            fail=1
        fi
    done
    if [ "$fail" != 0 ]; then
        sed 's/^/  | /' "$dir/out.txt" | tail -20
        echo "(kept $dir)"
        exit 1
    fi
    rm -rf "$dir"
done
echo "OK: $loops runs, every dump whole"
