#!/usr/bin/env python3
"""ccq-trace status on heartbeat records that carry a suspicion (runtime/health/judge.c): a
process whose data engine reported another failed lists it (how CCQ_HOW_SUSPECT) after its
losses; status must show the suspect alive, name who reports it, and exit 1, never call it lost.
The records are packed here as runtime/health/record.h lays them out (test_status.sh checks
the layout against a real job's records).

Usage: test_status_suspect.py CCQ_TRACE
"""
import os
import struct
import subprocess
import sys
import tempfile
import time

HEAD = struct.Struct("=IHHIIQQQIIQQIIIIII64s")
LOST = struct.Struct("=IIIIQQ")
MAGIC, VERSION, SUSPECT = 0x48514343, 2, 6


def record(rank, size, suspects):
    head = HEAD.pack(MAGIC, VERSION, HEAD.size, size, rank, 7, 5, time.time_ns(), 0, 1000 + rank,
                     1, 1, 1000, 10000, rank, 1, len(suspects), 0, b"node%d" % rank)
    return head + b"".join(LOST.pack(q, rank, SUSPECT, 0, 0, time.time_ns()) for q in suspects)


def main():
    tool = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        for rank, suspects in ((0, []), (1, [2]), (2, [])):
            with open(os.path.join(d, "ccq.job1.0.~hb.r%d" % rank), "wb") as f:
                f.write(record(rank, 3, suspects))
        p = subprocess.run([sys.executable, tool, "status", d], capture_output=True, text=True)
    out = p.stdout + p.stderr
    print(out)
    lines = {int(ln.split()[0]): ln for ln in p.stdout.splitlines() if ln[:1].isdigit()}
    bad = []
    if p.returncode != 1:
        bad.append("exit status %d, not 1" % p.returncode)
    if sorted(lines) != [0, 1, 2]:
        bad.append("not one line per process")
    elif "alive" not in lines[2].split()[1] or \
            "the data engine of process 1 reports it failed" not in lines[2]:
        bad.append("process 2's line does not show it alive and suspected by process 1")
    elif any("lost" in lines[r] for r in lines):
        bad.append("a suspicion shown as a loss")
    for b in bad:
        print("FAIL:", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
