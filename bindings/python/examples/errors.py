"""What ccq refuses, and how: ccq.Error subclasses with .status and .detail."""

import numpy as np

import ccq

with ccq.Runtime(host_devices=4, timeout_ms=2000) as rt:
    devs = [0, 1, 2, 3]
    rt.comm_init(devs)
    a = np.zeros(8, np.float32)
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    for what, call in [
        ("wrong dtype", lambda: rt.all_reduce(0, a, np.zeros(8, np.float64), devices=devs)),
        ("not contiguous", lambda: rt.all_reduce(0, np.zeros((8, 2), np.float32)[:, 0])),
        ("read-only dst", lambda: rt.all_reduce(0, a, ro, devices=devs)),
        ("wrong size", lambda: rt.all_gather(0, a, np.zeros(16, np.float32), devices=devs)),
        ("int16", lambda: rt.all_reduce(0, np.zeros(8, np.int16), devices=devs)),
        ("unknown device (ccq's detail)", lambda: rt.all_reduce(7, a, devices=devs)),
        ("no communicator", lambda: rt.all_reduce(0, a, devices=[0, 2])),
    ]:
        try:
            call()
        except ccq.Error as e:
            print("%-30s %s(%s): %s" % (what, type(e).__name__, e.status.name, e.detail))

    # Errors found after submission come back from the fence: here the parts disagree.
    bufs = [np.ones(8, np.float32) for _ in devs]
    for d in devs:
        rt.all_reduce(d, bufs[d], devices=devs, op=ccq.MAX if d == 3 else ccq.SUM)
    for d in devs:
        try:
            rt.sync(d)
        except ccq.MismatchError as e:
            if d == 0:
                print("fence:", e)
    # A part that never comes: the watchdog ends it after timeout_ms.
    rt.comm_init([0, 1])
    rt.all_reduce(0, a, devices=[0, 1])
    try:
        rt.fence(0).wait()
    except ccq.TimeoutError as e:
        print("fence:", type(e).__name__, "is a TimeoutError:", isinstance(e, TimeoutError))
        print("      ", e.detail[:150], "...")
