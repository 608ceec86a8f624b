"""One process of a world, for test_world.py and docs/python.md: meets the others through
the bootstrap its environment names (CCQ_WORLD_RANK/SIZE + CCQ_BOOTSTRAP=file:DIR, or mpirun
with CCQ_BOOTSTRAP=mpi, or --store DIR: a Python store in a shared directory), runs an
all_reduce over its own devices, then the collectives over every device of the world, and
prints one JSON line of what it saw.

    python3 world_worker.py [--devices N] [--timeout-ms T] [--store DIR] [--all-kinds]
                            [--kill-rank R] [--disagree]

--kill-rank R: process R kills itself (SIGKILL) once the world has met; the others go on, and
see it lost (job health).
--disagree: the last process submits the spanning all_reduce with another count, with
check_signatures on: every process's fence must say MISMATCH.
"""

import argparse
import json
import os
import signal
import sys
import time

import numpy as np

import ccq


class DirStore:
    """A ccq store in a directory every process sees: one file per key, written atomically."""

    def __init__(self, path):
        self.path = path

    def _file(self, key):
        return os.path.join(self.path, key.replace("/", "%"))

    def set(self, key, value):
        tmp = self._file(key) + ".tmp.%d" % os.getpid()
        with open(tmp, "wb") as f:
            f.write(value)
        os.replace(tmp, self._file(key))

    def get(self, key):
        try:
            with open(self._file(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--timeout-ms", type=int, default=30000)
    p.add_argument("--store")
    p.add_argument("--all-kinds", action="store_true")
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--disagree", action="store_true")
    a = p.parse_args()
    config = dict(host_devices=a.devices, timeout_ms=a.timeout_ms, check_signatures=a.disagree)
    if a.store:
        config.update(store=DirStore(a.store), bootstrap=None)
    out = {}
    try:
        rt = ccq.Runtime(**config)
    except ccq.Error as e:
        print(json.dumps({"create": e.status.name, "detail": e.detail}), flush=True)
        return 0
    if rt.world_rank == a.kill_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    with rt:
        local = list(rt.local_devices)
        out.update(rank=rt.world_rank, size=rt.world_size, devices=local, count=rt.device_count)
        # Over this process's own devices: device d contributes d + 1.
        rt.comm_init(local)
        bufs = [np.full(1000, d + 1, np.float32) for d in local]
        for d, b in zip(local, bufs):
            rt.all_reduce(d, b, devices=local)
        for d in local:
            rt.sync(d)
        out["local"] = float(bufs[0][0])
        if a.kill_rank >= 0:
            # Job health: the killed process reads as lost here (its pidfd told at once).
            deadline = time.monotonic() + 10
            while (rt.process_state(a.kill_rank) != ccq.ProcessState.LOST
                   and time.monotonic() < deadline):
                time.sleep(0.01)
            out["killed"] = rt.process_state(a.kill_rank).name
        # Over every device of the world (needs a backend that spans processes).
        world = list(range(rt.device_count))
        try:
            rt.comm_init(world)
        except ccq.UnsupportedError as e:
            out["span"] = {"unsupported": e.detail}
        except ccq.ProcessLostError as e:
            out["span"] = {"lost": e.detail}
        else:
            out["span"] = (disagree(rt, local, world) if a.disagree
                           else run_world(rt, local, world, a.all_kinds))
    print(json.dumps(out), flush=True)
    return 0


def disagree(rt, local, world):
    """The last process's parts have twice the count of the others'."""
    n = 16 if rt.world_rank == rt.world_size - 1 else 8
    bufs = {d: np.ones(n, np.float32) for d in local}
    for d in local:
        rt.all_reduce(d, bufs[d], devices=world)
    statuses = []
    for d in local:
        try:
            rt.sync(d)
            statuses.append("OK")
        except ccq.Error as e:
            statuses.append(e.status.name)
            detail = e.detail
    return {"fences": statuses, "detail": detail if "MISMATCH" in statuses else ""}


def run_world(rt, local, world, all_kinds):
    n, res = len(world), {}
    bufs = {d: np.full(1000, d + 1, np.float32) for d in local}
    for d in local:
        rt.all_reduce(d, bufs[d], devices=world)
    for d in local:
        rt.sync(d)
    res["all_reduce"] = sorted({float(b[0]) for b in bufs.values()})
    if all_kinds:
        gat = {d: np.zeros(n * 4, np.int64) for d in local}
        for d in local:
            rt.all_gather(d, np.full(4, d, np.int64), gat[d], devices=world, stream=1)
        bc = {d: np.full(8, d, np.float64) for d in local}
        for d in local:
            rt.broadcast(d, bc[d], root=n - 1, devices=world, stream=2)
        for d in local:
            rt.sync(d, 1), rt.sync(d, 2)
        res["all_gather"] = all(list(g) == [i // 4 for i in range(n * 4)] for g in gat.values())
        res["broadcast"] = sorted({float(b[0]) for b in bc.values()})
    return res


if __name__ == "__main__":
    sys.exit(main())
