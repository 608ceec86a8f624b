"""ccq from Python: four host devices, one thread each, all_reduce and a send/recv ring."""

import threading

import numpy as np

import ccq

with ccq.Runtime(backend="host", host_devices=4) as rt:
    devs = list(rt.local_devices)  # [0, 1, 2, 3]
    rt.comm_init(devs)
    grads = [np.full(1 << 20, d + 1, np.float32) for d in devs]  # 4 MiB each
    rings = [np.zeros(4, np.int64) for _ in devs]

    def step(d):  # what each device's thread of a runtime would do
        rt.all_reduce(d, grads[d], devices=devs, op=ccq.AVG)  # in place
        rt.send(d, np.full(4, d, np.int64), peer=(d + 1) % 4, stream=1)
        rt.recv(d, rings[d], peer=(d - 1) % 4, stream=1)
        rt.sync(d)                   # blocking fence of stream 0 (the GIL is released)
        assert rt.fence(d, 1).wait(timeout=10)  # a fence object, waited on

    threads = [threading.Thread(target=step, args=(d,)) for d in devs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("all_reduce avg:", grads[0][:3], "on every device:",
          all((g == 2.5).all() for g in grads))
    print("ring:", [int(r[0]) for r in rings])
    print(rt.stats())
