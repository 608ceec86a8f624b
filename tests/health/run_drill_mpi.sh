#!/bin/sh
# One drill of drill_mpi under mpiexec, judged on what the processes print: every survivor ran
# its 100 steps over the survivors exactly (and a stopped victim, once continued, fenced itself
# off). mpiexec's own status is not the verdict: a process of the job died on purpose.
# Usage: run_drill_mpi.sh NP VICTIM STEP BOOT MODE mpiexec [its flags...] drill_mpi
set -u
np=$1 victim=$2 step=$3 boot=$4 mode=$5
shift 5
dir=$(mktemp -d /tmp/ccq-drill-mpi-XXXXXX)
trap 'rm -rf "$dir"' EXIT
[ "$boot" = file ] && boot="file:$dir"
n=$#
i=0
for a in "$@"; do # the last argument is the program; insert -n NP before it
    i=$((i + 1))
    if [ $i -eq 1 ]; then set --; fi
    if [ $i -eq $n ]; then set -- "$@" -n "$np" --mca orte_abort_on_non_zero_status 0 "$a"; else set -- "$@" "$a"; fi
done
# Bounded below ctest's limit: Open MPI's mpiexec may wait forever once a process exited with a
# failure (with orte_abort_on_non_zero_status 0), and the output is what tells why (TERM first:
# mpiexec takes its processes down with it).
timeout -k 5 90 "$@" "$victim" "$step" "$boot" "$mode" >"$dir/out" 2>&1
grep '^process' "$dir/out"
ok=$(grep -c 'surviving devices, exact' "$dir/out")
if [ "$ok" -ne $((np - 1)) ]; then
    echo "run_drill_mpi: $ok of $((np - 1)) survivors finished" >&2
    cat "$dir/out" >&2
    exit 1
fi
if [ "$mode" = stop ] && ! grep -q 'fenced off: .*(this process' "$dir/out"; then
    echo "run_drill_mpi: the continued victim did not fence itself off" >&2
    exit 1
fi
exit 0
