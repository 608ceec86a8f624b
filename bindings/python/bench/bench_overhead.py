"""What Python adds to a ccq call: the same all_reduce loops through the Python binding and
through ccq's C API (Runtime._c_loop: a C loop inside the extension, on the same runtime and
buffers), side by side in one process, rounds alternating, medians reported.

    python3 bench_overhead.py [--ops 2000] [--rounds 15] [--count 1]

Cases:
  submit        `ops` submits of device 0's part of an all_reduce over {0, 1}, in place. Device
                1's parts come after the timed loop, so the scheduler only queues them: the
                time is the submitting call itself (validation, the lock-free push; in Python
                also reading the array and holding it). The queue has room for all of them.
  sync          the blocking fence on a stream with nothing in flight: the fence call itself
                (Python: rt.sync(0, 2); C: ccq_sync_collective).
  fence         a fence value taken and waited on, nothing in flight (Python:
                rt.fence(0, 2).wait(); C: ccq_fence_begin + ccq_fence_wait).
  submit+sync   an all_reduce over {0} then the blocking fence, per op: a round trip through
                the scheduler, whose wake-ups dominate (and on a loaded machine, its noise).
  submit+fence  the same with a fence value waited on.
"""

import argparse
import os
import statistics
import sys
import time

# NumPy's BLAS threads must not spin on the cores ccq's threads need (a 2-core machine).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import ccq  # noqa: E402


def py_submit(rt, a, ops):
    pair = [0, 1]
    t0 = time.perf_counter_ns()
    for _ in range(ops):
        rt.all_reduce(0, a, devices=pair)
    return time.perf_counter_ns() - t0


def py_sync(rt, ops):
    t0 = time.perf_counter_ns()
    for _ in range(ops):
        rt.sync(0, 2)
    return time.perf_counter_ns() - t0


def py_fence(rt, ops):
    t0 = time.perf_counter_ns()
    for _ in range(ops):
        rt.fence(0, 2).wait()
    return time.perf_counter_ns() - t0


def py_submit_sync(rt, a, ops):
    one = [0]
    t0 = time.perf_counter_ns()
    for _ in range(ops):
        rt.all_reduce(0, a, devices=one, stream=1)
        rt.sync(0, 1)
    return time.perf_counter_ns() - t0


def py_submit_fence(rt, a, ops):
    one = [0]
    t0 = time.perf_counter_ns()
    for _ in range(ops):
        rt.all_reduce(0, a, devices=one, stream=1)
        rt.fence(0, 1).wait()
    return time.perf_counter_ns() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--count", type=int, default=1, help="float32 elements per all_reduce")
    a = p.parse_args(argv)
    with ccq.Runtime(host_devices=2, trace_capacity=0, queue_depth=max(1024, a.ops)) as rt:
        rt.comm_init([0, 1])
        rt.comm_init([0])
        buf = np.ones(a.count, np.float32)
        other = np.ones(a.count, np.float32)

        def drain():
            """Device 1's parts of the parked all_reduces, then both fences (not timed)."""
            rt._c_loop(1, other, other, a.ops, [0, 1], -1)
            rt.sync(0)
            rt.sync(1)

        def c_submit():
            t = rt._c_loop(0, buf, buf, a.ops, [0, 1], -1)
            drain()
            return t

        def python_submit():
            t = py_submit(rt, buf, a.ops)
            drain()
            return t

        cases = [
            ("submit", c_submit, python_submit),
            ("sync", lambda: rt._c_loop(0, buf, buf, a.ops, [0], 1, 2, False, False),
             lambda: py_sync(rt, a.ops)),
            ("fence", lambda: rt._c_loop(0, buf, buf, a.ops, [0], 1, 2, True, False),
             lambda: py_fence(rt, a.ops)),
            ("submit+sync", lambda: rt._c_loop(0, buf, buf, a.ops, [0], 1, 1),
             lambda: py_submit_sync(rt, buf, a.ops)),
            ("submit+fence", lambda: rt._c_loop(0, buf, buf, a.ops, [0], 1, 1, True),
             lambda: py_submit_fence(rt, buf, a.ops)),
        ]
        for _, c, py in cases:  # warm up: pools, caches, the scheduler's first wake-ups
            c(), py()
        print("# ccq %s, Python %s, %d ops x %d rounds, all_reduce of %d float32"
              % (ccq.__version__, sys.version.split()[0], a.ops, a.rounds, a.count))
        print("%-14s %10s %13s %10s %7s" % ("case", "C ns/op", "Python ns/op", "added ns",
                                             "ratio"))
        for name, c, py in cases:
            cs, ps, added = [], [], []
            for _ in range(a.rounds):
                tc, tp = c() / a.ops, py() / a.ops
                cs.append(tc), ps.append(tp), added.append(tp - tc)
            mc, mp = statistics.median(cs), statistics.median(ps)
            print("%-14s %10.0f %13.0f %10.0f %7.2f" % (name, mc, mp, statistics.median(added),
                                                        mp / mc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
