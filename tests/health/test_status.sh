#!/bin/sh
# ccq-trace status on a real stuck job: examples/survive.c (on the fake NCCL) with process 1
# stalling (alive, submitting nothing); status must show every process alive and mark process
# 1 furthest behind on the world's communicator, and exit 1. A directory without records is
# bad input (exit 2). With "tcp", the job meets at a tcp:// rendezvous and status asks its
# server (as an observer: it takes no rank); nothing listening there is bad input too.
# Usage: test_status.sh <survive_fake> <python3> <tools/ccq-trace> [file|tcp]
set -u
survive=$1 py=$2 tool=$3 mode=${4:-file}
# a port below the kernel's ephemeral range (tests/free_port.py says why)
free_port_py=$(cd "$(dirname "$0")/.." && pwd)/free_port.py
free_port() { "$py" "$free_port_py"; }
boot=""
if [ "$mode" = tcp ]; then
    boot="--boot tcp://127.0.0.1:$(free_port)"
fi
out=$(mktemp /tmp/ccq-status-XXXXXX)
trap 'rm -f "$out"' EXIT
# shellcheck disable=SC2086
CCQ_TIMEOUT_MS=6000 "$survive" 3 --stall 1 $boot >"$out" 2>&1 &
job=$!
for _ in $(seq 100); do
    grep -q "stops submitting" "$out" && break
    sleep 0.1
done
sleep 1
dir=$(head -1 "$out" | awk '{print $5}')
"$py" "$tool" status "$dir" >"$out.status" 2>&1
rc=$?
cat "$out.status"
fail=0
if [ "$mode" = tcp ]; then # an observer of another job is refused by the server, with why
    "$py" "$tool" status --job other "$dir" 2>"$out.err"
    orc=$?
    cat "$out.err"
    [ $orc -eq 2 ] && grep -q 'refused: another job: this rendezvous serves job "default"' \
        "$out.err" || { echo "an observer of another job was not refused ($orc)" >&2; fail=1; }
fi
[ $rc -eq 1 ] || { echo "status exited $rc, want 1" >&2; fail=1; }
for p in 0 1 2; do
    grep -Eq "^$p +alive" "$out.status" || { echo "process $p not alive" >&2; fail=1; }
done
grep -Eq "^  1 +15 +15 +- +<- furthest behind: has not submitted #15" "$out.status" ||
    { echo "process 1 not marked furthest behind" >&2; fail=1; }
grep -Eq "^  0 +16 +15 +all_reduce #15 for" "$out.status" ||
    { echo "process 0's oldest pending all_reduce missing" >&2; fail=1; }
case $dir in tcp://*) place=$dir ;; *) place="file:$dir" ;; esac
grep -Fq "world of 3 ($place)" "$out.status" || { echo "the heading does not name $place" >&2; fail=1; }
rm -f "$out.status"
wait $job
if [ "$mode" = tcp ]; then
    "$py" "$tool" status "tcp://127.0.0.1:$(free_port)" 2>"$out.err"
    rc=$?
    cat "$out.err"
    grep -q "cannot reach the rendezvous" "$out.err" || { echo "no reason given" >&2; fail=1; }
    rm -f "$out.err"
    [ $rc -eq 2 ] || { echo "status of a closed port exited $rc, want 2" >&2; fail=1; }
else
    empty=$(mktemp -d /tmp/ccq-status-XXXXXX)
    "$py" "$tool" status "file:$empty" 2>/dev/null
    rc=$?
    rmdir "$empty"
    [ $rc -eq 2 ] || { echo "status of an empty directory exited $rc, want 2" >&2; fail=1; }
fi
exit $fail
