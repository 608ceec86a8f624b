#!/usr/bin/env python3
"""Synthetic per-rank trace dumps for the ccq-trace tests: the stories of small jobs, written
as textual views that write_view (tests/trace_tools/write_view.c) turns into dumps with ccq's
own JSON writer, so they have exactly the library's format.

Usage: gen_dumps.py WRITE_VIEW OUTDIR SCENARIO      (writes OUTDIR/rank<R>.json)
Scenarios: clean, skip, count, wrapped, wrapped_clean, missing, version, version_mix,
multidev, single (see SCENARIOS at the end).

Each rank has its own CLOCK_MONOTONIC (a different origin per process) and the matching
realtime offset, so the merge has to align them. Times below are microseconds of wall time.
"""
import os
import subprocess
import sys

REAL0 = 1764547200 * 10**9  # 2025-12-01 00:00 UTC: wall time of the job's start


class Rank:
    def __init__(self, rank, size, first, ndev, cap=None, backend="nccl"):
        self.rank, self.size, self.first, self.ndev = rank, size, first, ndev
        self.mono0 = (1000 + 37 * rank) * 10**9  # this process's monotonic clock at REAL0
        self.cap, self.backend = cap, backend
        self.ev, self.notes, self.comms = [], [], []
        self.next_id, self.next_batch = 1, 1
        self.dump_us = 0

    def ns(self, us):
        return self.mono0 + int(us * 1000)

    def comm(self, devs):
        self.comms.append(tuple(devs))
        return len(self.comms) - 1

    def local(self, devs):
        return [d for d in devs if self.first <= d < self.first + self.ndev]

    def add(self, us, **kv):
        self.ev.append((self.ns(us), kv))
        self.dump_us = max(self.dump_us, us)

    def part(self, us, dev, comm, seq, kind, count, dtype="float32", op=None, peer=None,
             state="completed", status=None, stream=0, run_us=20.0, fail_us=None):
        """One command: submitted at us; issued 3 us later; ended run_us after that (a
        failure at fail_us, e.g. the watchdog's time)."""
        cid = self.next_id
        self.next_id += 1
        base = dict(id=cid, seq=seq, count=count, thread=100 + dev, dev=dev, stream=stream,
                    comm=comm, kind=kind, dtype=dtype)
        if op is not None:
            base["op"] = op
        if peer is not None:
            base["peer"] = peer
        self.add(us, type="submitted", **base)
        if state in ("issued", "completed") or (state == "failed" and status == "CCQ_ERR_BACKEND"):
            b = self.next_batch
            self.next_batch += 1
            self.add(us + 3, type="batch", id=b, count=1, bytes=500, status="CCQ_OK")
            self.add(us + 3, type="issued", batch=b, **base)
            if state == "completed":
                self.add(us + 3 + run_us, type="completed", batch=b, status="CCQ_OK", **base)
        if state == "failed":
            self.add(fail_us if fail_us is not None else us + run_us, type="failed",
                     status=status or "CCQ_ERR_TIMEOUT", **base)
        return cid

    def coll(self, us, comm, seq, kind="all_reduce", count=1024, dtype="float32", op="sum",
             root=None, state="completed", status=None, skew=0.0, fail_us=None):
        for k, dev in enumerate(self.local(self.comms[comm])):
            self.part(us + skew + k, dev, comm, seq, kind, count, dtype,
                      op if kind in ("all_reduce", "reduce", "reduce_scatter") else None,
                      root, state, status, fail_us=fail_us)

    def note(self, us, typ, text):
        self.notes.append((self.ns(us), typ, text))

    def write(self, write_view, outdir, reason="destroy", dump_extra_us=10.0):
        evs = sorted(self.ev, key=lambda e: e[0])
        dropped = 0
        if self.cap is not None and len(evs) > self.cap:  # the ring keeps the newest
            dropped = len(evs) - self.cap
            evs = evs[dropped:]
        txt = os.path.join(outdir, "rank%d.txt" % self.rank)
        with open(txt, "w") as f:
            f.write("header backend=%s ndev=%d max_streams=4 rank=%d size=%d first=%d pid=%d "
                    "host=node%d dump=%d offset=%d dropped=%d reason=%s\n"
                    % (self.backend, self.ndev, self.rank, self.size, self.first,
                       4000 + self.rank, self.rank // 2, self.ns(self.dump_us + dump_extra_us),
                       REAL0 - self.mono0, dropped, reason))
            for devs in self.comms:
                f.write("comm %s\n" % ",".join(str(d) for d in devs))
            for t, typ, text in self.notes:
                f.write("note t=%d type=%s %s\n" % (t, typ, text))
            for t, kv in evs:
                f.write("ev t=%d %s\n" % (t, " ".join("%s=%s" % x for x in kv.items())))
        out = os.path.join(outdir, "rank%d.json" % self.rank)
        subprocess.run([write_view, txt, out], check=True)
        os.remove(txt)
        return out


def world(size, ndev=1, caps=None):
    ranks = [Rank(r, size, r * ndev, ndev, (caps or {}).get(r)) for r in range(size)]
    return ranks


def timeout_story(r, us, seq, missing):
    r.add(us, type="watchdog", id=0, comm=0, seq=seq, status="CCQ_ERR_TIMEOUT")
    r.note(us, "watchdog", "all_reduce #%d (float32 x 1024, sum) on comm {0,1,2}: not issued "
           "within timeout_ms; waiting for process %s" % (seq, missing))


def scenario_clean(wv, out, n=8):
    ranks = world(3)
    for r in ranks:
        c = r.comm([0, 1, 2])
        r.comm([0, 1])
        for s in range(n):
            r.coll(100.0 * s, c, s, skew=3.0 * r.rank)
        for s in range(4):  # rank 0 sends to rank 1 on the pair's channel
            if r.rank == 0:
                r.part(100.0 * s + 50, 0, 1, s, "send", 256, "int32", peer=1, stream=1)
            elif r.rank == 1:
                r.part(100.0 * s + 51, 1, 1, s, "recv", 256, "int32", peer=0, stream=1)
    return [r.write(wv, out) for r in ranks]


def scenario_skip(wv, out):
    """Rank 1 stopped before collective #5; ranks 0 and 2 went on to #7 and timed out."""
    ranks = world(3)
    for r in ranks:
        c = r.comm([0, 1, 2])
        last = 5 if r.rank == 1 else 8
        for s in range(last):
            st = "completed" if s < 5 else "failed"
            r.coll(100.0 * s, c, s, state=st, status="CCQ_ERR_TIMEOUT" if s >= 5 else None,
                   skew=3.0 * r.rank, fail_us=1500.0 + r.rank)
        if r.rank != 1:
            timeout_story(r, 1500.0 + r.rank, 5, 1)
    return [r.write(wv, out, reason="error" if r.rank != 1 else "destroy") for r in ranks]


def scenario_count(wv, out):
    """Rank 2 submitted #3 with another count; a broadcast's root differs on rank 2."""
    ranks = world(3)
    for r in ranks:
        c = r.comm([0, 1, 2])
        for s in range(6):
            count = 2048 if (r.rank == 2 and s == 3) else 1024
            r.coll(100.0 * s, c, s, count=count, skew=3.0 * r.rank)
        r.coll(700.0, c, 6, kind="broadcast", root=2 if r.rank == 2 else 0, skew=r.rank)
    return [r.write(wv, out) for r in ranks]


def scenario_wrapped(wv, out, stuck=40, n=48):
    """Ranks 0 and 2 also send each other a lot: their rings wrap and keep only the newest
    collectives; rank 1 (little traffic) keeps all. With stuck, rank 1 stopped there."""
    ranks = world(3, caps={0: 300, 2: 300})
    for r in ranks:
        c = r.comm([0, 1, 2])
        p = r.comm([0, 2])
        last = stuck if (stuck is not None and r.rank == 1) else n
        for s in range(last):
            failed = stuck is not None and s >= stuck
            r.coll(100.0 * s, c, s, state="failed" if failed else "completed",
                   status="CCQ_ERR_TIMEOUT" if failed else None, skew=2.0 * r.rank,
                   fail_us=100.0 * n + 1000)
            if r.rank in (0, 2):
                for k in range(3):
                    seq = 3 * s + k
                    if r.rank == 0:
                        r.part(100.0 * s + 40 + 10 * k, 0, p, seq, "send", 64, peer=2, stream=1,
                               run_us=3)
                    else:
                        r.part(100.0 * s + 41 + 10 * k, 2, p, seq, "recv", 64, peer=0, stream=1,
                               run_us=3)
    return [r.write(wv, out) for r in ranks]


def scenario_wrapped_clean(wv, out):
    return scenario_wrapped(wv, out, stuck=None)


def scenario_missing(wv, out):
    """Rank 2 left no dump; ranks 0 and 1 wait in #5 (dumped on SIGUSR1, no timeout)."""
    ranks = world(3)
    files = []
    for r in ranks[:2]:
        c = r.comm([0, 1, 2])
        for s in range(6):
            r.coll(100.0 * s, c, s, state="completed" if s < 5 else "queued", skew=r.rank)
        files.append(r.write(wv, out, reason="signal", dump_extra_us=5000.0))
    return files


def patch(path, old, new):
    with open(path) as f:
        text = f.read()
    assert old in text, (path, old)
    with open(path, "w") as f:
        f.write(text.replace(old, new, 1))


def scenario_version(wv, out):
    files = scenario_clean(wv, out, n=3)
    patch(files[2], '"ccq":{"format":1,', '"ccq":{"format":2,')
    return files


def scenario_version_mix(wv, out):
    files = scenario_clean(wv, out, n=3)
    with open(files[1]) as f:
        text = f.read()
    v = text.split('"ccq":{"format":1,"version":"', 1)[1].split('"', 1)[0]
    patch(files[1], '"version":"%s"' % v, '"version":"0.0.9"')
    return files


def scenario_multidev(wv, out):
    """2 ranks of 2 devices; rank 1's device 3 never submitted #2 (device 2 did)."""
    ranks = world(2, ndev=2)
    for r in ranks:
        c = r.comm([0, 1, 2, 3])
        for s in range(3):
            for k, dev in enumerate(r.local(r.comms[c])):
                if dev == 3 and s == 2:
                    continue
                st = "completed" if s < 2 else "queued"
                r.part(100.0 * s + k + r.rank, dev, c, s, "all_reduce", 512, op="sum", state=st)
    return [r.write(wv, out) for r in ranks]


def scenario_single(wv, out):
    """One process of 4 devices (a world of 1); device 3 never submitted #2 of comm {2,3},
    device 2 timed out waiting. Process 0 owns every rank: the output must say which rank
    (device 3, rank 1 of {2,3}) is missing, not that "rank 0" is."""
    ranks = world(1, ndev=4)
    r = ranks[0]
    c = r.comm([2, 3])
    for s in range(3):
        for dev in (2, 3):
            if dev == 3 and s == 2:
                continue
            failed = s == 2
            r.part(100.0 * s + dev, dev, c, s, "all_reduce", 512, op="sum",
                   state="failed" if failed else "completed",
                   status="CCQ_ERR_TIMEOUT" if failed else None, fail_us=1500.0)
    return [r.write(wv, out, reason="error")]


SCENARIOS = {name[len("scenario_"):]: fn for name, fn in globals().items()
             if name.startswith("scenario_")}


def main():
    if len(sys.argv) != 4 or sys.argv[3] not in SCENARIOS:
        sys.exit("usage: gen_dumps.py WRITE_VIEW OUTDIR {%s}" % ",".join(sorted(SCENARIOS)))
    os.makedirs(sys.argv[2], exist_ok=True)
    for f in SCENARIOS[sys.argv[3]](sys.argv[1], sys.argv[2]):
        print(f)


if __name__ == "__main__":
    main()
