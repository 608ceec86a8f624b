"""Many Python threads at once: submitting and fencing concurrently with results checked, a
blocking fence or a submit waiting for room never stalls the other threads (the GIL is
released), several threads waiting on one fence."""

import threading
import time

import numpy as np

import ccq

ITERS = 150
COUNT = 256


def run_threads(targets, timeout=90):
    errors = []

    def wrap(fn, *args):
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append((fn.__name__, args, e))

    ts = [threading.Thread(target=wrap, args=t) for t in targets]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
    assert not any(t.is_alive() for t in ts), "threads still running after %d s" % timeout
    assert not errors, errors


def test_many_threads_submit_and_fence():
    """Per device three threads on three streams: all_reduce over the 4 devices, all_reduce
    over a pair, a send/recv ring; fences alternate between sync, fence().wait() and polling
    fence().test(); every result is checked."""
    devs = [0, 1, 2, 3]
    start = threading.Barrier(12)
    with ccq.Runtime(host_devices=4, timeout_ms=60000) as rt:
        rt.comm_init(devs)
        rt.comm_init([0, 1])
        rt.comm_init([2, 3])

        def fence(d, stream, i):
            if i % 3 == 0:
                rt.sync(d, stream)
            elif i % 3 == 1:
                assert rt.fence(d, stream).wait()
            else:
                f = rt.fence(d, stream)
                while not f.test():
                    time.sleep(0)

        def all_four(d):
            start.wait()
            for i in range(ITERS):
                a = np.full(COUNT, d + i, np.int64)
                rt.all_reduce(d, a, devices=devs, stream=0)
                fence(d, 0, i)
                assert (a == sum(x + i for x in devs)).all(), (d, i, a[:4])

        def pair(d):
            start.wait()
            peers = [0, 1] if d < 2 else [2, 3]
            for i in range(ITERS):
                a = np.full(COUNT, float(d * i), np.float32)
                out = np.zeros(COUNT, np.float32)
                rt.all_reduce(d, a, out, devices=peers, stream=1, op=ccq.MAX)
                fence(d, 1, i + 1)
                assert (out == max(p * i for p in peers)).all(), (d, i)

        def ring(d):
            start.wait()
            for i in range(ITERS):
                a = np.full(COUNT, d * 1000 + i, np.int32)
                b = np.zeros(COUNT, np.int32)
                rt.send(d, a, peer=(d + 1) % 4, stream=2)
                rt.recv(d, b, peer=(d + 3) % 4, stream=2)
                del a  # held by ccq until the fence: the send may not have run yet
                fence(d, 2, i + 2)
                assert (b == ((d + 3) % 4) * 1000 + i).all(), (d, i, b[:4])

        run_threads([(fn, d) for d in devs for fn in (all_four, pair, ring)])
        s = rt.stats()
        assert s.completed == s.submitted == ITERS * (4 + 4 + 8) and s.failed == 0


def test_blocking_fence_does_not_stall_other_threads():
    with ccq.Runtime(host_devices=4, timeout_ms=60000) as rt:
        rt.comm_init([0, 1])
        rt.comm_init([2, 3])
        held = np.ones(8, np.float32)
        rt.all_reduce(0, held, devices=[0, 1])  # device 1's part comes only at the end
        f = rt.fence(0)
        waiting = threading.Event()
        answer = []

        def blocked():
            waiting.set()
            answer.append(f.wait())  # no timeout: blocks until the end of the test

        def worker():
            for i in range(200):
                a, b = np.full(4, i, np.int32), np.full(4, 1, np.int32)
                rt.all_reduce(2, a, devices=[2, 3])
                rt.all_reduce(3, b, devices=[2, 3])
                rt.sync(2)
                rt.sync(3)
                assert (a == i + 1).all()

        tb = threading.Thread(target=blocked)
        tb.start()
        waiting.wait(10)
        tw = threading.Thread(target=worker)
        t0 = time.monotonic()
        tw.start()
        tw.join(60)
        assert not tw.is_alive(), "other threads stalled behind a blocked fence"
        assert tb.is_alive() and not answer, "the fence answered before its command could run"
        print("200 fenced all_reduce in %.3f s while another thread waited in a fence"
              % (time.monotonic() - t0))
        rt.all_reduce(1, np.ones(8, np.float32), devices=[0, 1])
        tb.join(30)
        assert answer == [True]
        rt.sync(1)
        assert (held == 2).all()


def test_submit_waiting_for_room_does_not_stall_other_threads():
    with ccq.Runtime(host_devices=4, queue_depth=2, timeout_ms=60000) as rt:
        rt.comm_init([0, 1])
        rt.comm_init([2, 3])
        bufs = [np.ones(4, np.float32) for _ in range(3)]
        submitted = []

        def producer():
            for b in bufs:  # the third waits: two are outstanding and cannot run yet
                rt.all_reduce(0, b, devices=[0, 1])
                submitted.append(1)

        tp = threading.Thread(target=producer)
        tp.start()
        deadline = time.monotonic() + 10
        while len(submitted) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert len(submitted) == 2 and tp.is_alive(), "the third submit should wait for room"
        a, b = np.ones(4, np.int64), np.ones(4, np.int64)
        rt.all_reduce(2, a, devices=[2, 3])
        rt.all_reduce(3, b, devices=[2, 3])
        rt.sync(2)  # runs while the producer waits inside ccq with the GIL released
        assert (a == 2).all()
        for _ in bufs:
            rt.all_reduce(1, np.ones(4, np.float32), devices=[0, 1])
        tp.join(30)
        assert not tp.is_alive() and len(submitted) == 3
        rt.sync(0)
        rt.sync(1)
        assert all((x == 2).all() for x in bufs)


def test_many_threads_wait_on_one_fence():
    with ccq.Runtime(host_devices=2, timeout_ms=60000) as rt:
        rt.comm_init([0, 1])
        a = np.ones(16, np.float32)
        rt.all_reduce(0, a, devices=[0, 1])
        f = rt.fence(0)
        answers = []
        lock = threading.Lock()

        def wait_or_poll(i):
            r = f.wait(timeout=30) if i % 2 else _poll(f)
            with lock:
                answers.append(r)

        ts = [threading.Thread(target=wait_or_poll, args=(i,)) for i in range(8)]
        for t in ts:
            t.start()
        time.sleep(0.1)
        rt.all_reduce(1, np.ones(16, np.float32), devices=[0, 1])
        for t in ts:
            t.join(30)
        assert answers == [True] * 8
        rt.sync(1)


def _poll(f):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if f.test():
            return True
        time.sleep(0.001)
    return False
