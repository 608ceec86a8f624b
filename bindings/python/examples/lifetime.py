"""ccq keeps every buffer alive until a fence covering its command answers."""

import gc
import weakref

import numpy as np

import ccq

with ccq.Runtime(host_devices=2) as rt:
    rt.comm_init([0, 1])
    a = np.ones(1 << 16, np.float32)
    alive = weakref.ref(a)
    rt.all_reduce(0, a, devices=[0, 1])  # device 1's part is not there yet: in flight
    del a
    gc.collect()
    print("dropped by the caller, still alive:", alive() is not None)
    f = rt.fence(0)
    print("fence.test():", f.test(), "| fence.wait(0.1):", f.wait(timeout=0.1))
    b = np.ones(1 << 16, np.float32)
    rt.all_reduce(1, b, devices=[0, 1])  # the other part: the all_reduce runs
    print("fence.wait():", f.wait(), f)
    gc.collect()
    print("after the fence answered, alive:", alive() is not None, "| b[0] =", b[0])
