"""An all_reduce over the devices of 3 processes, from Python.

    python3 world_all_reduce.py          starts 3 plain processes of itself (no launcher) that
                                         meet in a temporary directory (bootstrap "file:DIR")
    CCQ_BOOTSTRAP=mpi mpirun -np 3 python3 world_all_reduce.py
                                         the same processes, started by mpirun

Each process owns 2 host devices; device d contributes d + 1, so every element of the result
is 1 + 2 + ... + 6 = 21.
"""

import os
import subprocess
import sys
import tempfile

import numpy as np

import ccq

LAUNCHED = ("CCQ_WORLD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def process():
    with ccq.Runtime(host_devices=2, timeout_ms=30000) as rt:  # the world from the environment
        mine, world = list(rt.local_devices), list(range(rt.device_count))
        print("process %d of %d: devices %s of %d" % (rt.world_rank, rt.world_size, mine,
                                                      rt.device_count))
        try:
            rt.comm_init(world)
        except ccq.UnsupportedError as e:
            print("  process %d: %s" % (rt.world_rank, e))
            return
        bufs = {d: np.full(1 << 16, d + 1, np.float32) for d in mine}
        for d in mine:
            rt.all_reduce(d, bufs[d], devices=world)
        for d in mine:
            rt.sync(d)
        print("  process %d: all_reduce over %d devices: %s" % (
            rt.world_rank, len(world), sorted({float(b[0]) for b in bufs.values()})))


def launch(n=3):
    with tempfile.TemporaryDirectory() as rendezvous:
        procs = [subprocess.Popen(
            [sys.executable, __file__], stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, CCQ_WORLD_RANK=str(r), CCQ_WORLD_SIZE=str(n),
                     CCQ_BOOTSTRAP="file:" + rendezvous)) for r in range(n)]
        outs = [p.communicate(timeout=120)[0] for p in procs]
    for out in outs:
        print(out, end="")
    return max(p.returncode for p in procs)


if __name__ == "__main__":
    if any(v in os.environ for v in LAUNCHED):
        process()
    else:
        sys.exit(launch())
