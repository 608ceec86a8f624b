#!/bin/sh
# ccq-trace status on a real stuck job: examples/survive.c (on the fake NCCL) with process 1
# stalling (alive, submitting nothing); status must show every process alive and mark process
# 1 furthest behind on the world's communicator, and exit 1. A directory without records is
# bad input (exit 2).
# Usage: test_status.sh <survive_fake> <python3> <tools/ccq-trace>
set -u
survive=$1 py=$2 tool=$3
out=$(mktemp /tmp/ccq-status-XXXXXX)
trap 'rm -f "$out"' EXIT
CCQ_TIMEOUT_MS=6000 "$survive" 3 --stall 1 >"$out" 2>&1 &
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
[ $rc -eq 1 ] || { echo "status exited $rc, want 1" >&2; fail=1; }
for p in 0 1 2; do
    grep -Eq "^$p +alive" "$out.status" || { echo "process $p not alive" >&2; fail=1; }
done
grep -Eq "^  1 +15 +15 +- +<- furthest behind: has not submitted #15" "$out.status" ||
    { echo "process 1 not marked furthest behind" >&2; fail=1; }
grep -Eq "^  0 +16 +15 +all_reduce #15 for" "$out.status" ||
    { echo "process 0's oldest pending all_reduce missing" >&2; fail=1; }
rm -f "$out.status"
wait $job
empty=$(mktemp -d /tmp/ccq-status-XXXXXX)
"$py" "$tool" status "file:$empty" 2>/dev/null
rc=$?
rmdir "$empty"
[ $rc -eq 2 ] || { echo "status of an empty directory exited $rc, want 2" >&2; fail=1; }
exit $fail
