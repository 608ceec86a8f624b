"""The runtime: lifetime and close, world queries, fences, errors found after submission,
stats, metrics, the event log, fault injection, the CUDA-stream calls on the host backend."""

import gc
import json
import threading
import time

import numpy as np
import pytest

import ccq
from conftest import DEVS, fence_all


def test_context_manager_and_close():
    with ccq.Runtime(host_devices=2) as rt:
        assert not rt.closed and "devices=0..1 of 2" in repr(rt)
    assert rt.closed and "closed" in repr(rt)
    rt.close()  # idempotent
    for call in (lambda: rt.comm_init([0, 1]), lambda: rt.sync(0), lambda: rt.fence(0),
                 lambda: rt.all_reduce(0, np.zeros(4, np.float32)), lambda: rt.stats(),
                 lambda: rt.world_rank):
        with pytest.raises(ccq.ShutdownError, match="closed"):
            call()


def test_world_of_one(rt):
    assert (rt.world_rank, rt.world_size, rt.device_count) == (0, 1, 4)
    assert rt.local_devices == range(0, 4) and rt.backend == "host"


def test_sync_and_fence_on_idle_streams(rt):
    rt.sync(0)
    rt.sync(3, stream=7)
    f = rt.fence(2, 5)
    assert (f.device, f.stream) == (2, 5)
    assert f.test() is True and f.wait() is True and f.wait(timeout=0) is True


def test_mismatch_reported_by_every_fence(rt):
    a = [np.zeros(8, np.float32) for _ in DEVS]
    for d in DEVS:
        rt.all_reduce(d, a[d], devices=DEVS, op=ccq.MAX if d == 2 else ccq.SUM)
    f = rt.fence(2)
    with pytest.raises(ccq.MismatchError) as e:
        f.wait(timeout=10)
    assert e.value.status == ccq.Status.MISMATCH and "op" in e.value.detail
    with pytest.raises(ccq.MismatchError):  # the same answer every time
        f.test()
    assert "CCQ_ERR_MISMATCH" in repr(f)
    for d in DEVS:
        with pytest.raises(ccq.MismatchError, match="do not match"):
            rt.sync(d)
        rt.sync(d)  # reported once, then cleared
    status, detail = rt.stream_last_error(0)
    assert status == ccq.Status.MISMATCH and "do not match" in detail


def test_fence_wait_timeout_then_success(rt):
    rt.comm_init([0, 1])
    a, b = np.ones(4, np.float32), np.ones(4, np.float32)
    rt.all_reduce(0, a, devices=[0, 1])
    f = rt.fence(0)
    t0 = time.monotonic()
    assert f.wait(timeout=0.2) is False
    assert 0.15 < time.monotonic() - t0 < 5
    assert not f.done and "pending" in repr(f)
    rt.all_reduce(1, b, devices=[0, 1])
    assert f.wait() is True
    rt.sync(1)
    np.testing.assert_array_equal(a, [2, 2, 2, 2])
    with pytest.raises(ccq.InvalidArgumentError, match="timeout"):
        f.wait(timeout=-1)


def test_stats_metrics_and_events(rt, tmp_path):
    a = [np.ones(64, np.float32) for _ in DEVS]
    for _ in range(3):
        for d in DEVS:
            rt.all_reduce(d, a[d], devices=DEVS)
    fence_all(rt, DEVS)
    s = rt.stats()
    assert isinstance(s, ccq.Stats)
    assert (s.submitted, s.completed, s.failed, s.pending) == (12, 12, 0, 0)
    assert s.batched_ops >= 3 and len(s.batch_size_hist) == 8
    m = rt.metrics()
    assert m.commands_ended == 12 and m.uptime_ns > 0
    events, dropped = rt.trace_events()
    kinds = {ccq.EventType(e.type) for e in events}
    assert ccq.EventType.SUBMITTED in kinds and ccq.EventType.COMPLETED in kinds
    sub = [e for e in events if e.type == ccq.EventType.SUBMITTED]
    assert len(sub) == 12 and all(e.kind == ccq.Kind.ALL_REDUCE and e.count == 64 for e in sub)
    assert dropped == 0
    path = tmp_path / "trace.json"
    rt.trace_dump(path)
    trace = json.loads(path.read_text())
    assert trace["traceEvents"]
    assert rt.queue_depth(0) == 0


def test_trace_disabled_is_an_error():
    with ccq.Runtime(host_devices=1, trace_capacity=0) as rt:
        with pytest.raises(ccq.InvalidArgumentError):
            rt.trace_dump("/tmp/never-written.json")


def test_fault_injection_reaches_the_fence():
    with ccq.Runtime(host_devices=2, fault="fail:op=1") as rt:
        rt.comm_init([0, 1])
        a = [np.ones(4, np.float32) for _ in range(2)]
        for i in range(2):
            for d in (0, 1):
                rt.all_reduce(d, a[d], devices=[0, 1])
        with pytest.raises(ccq.BackendError) as e:
            rt.sync(0)
        assert "fault" in e.value.detail
        assert rt.stats().failed == 2


def test_cuda_stream_calls_on_host_backend(rt):
    with pytest.raises(ccq.UnsupportedError, match="nccl"):
        rt.nccl_stream_wait(0, 0, 0x1234)
    with pytest.raises(ccq.UnsupportedError, match="nccl"):
        rt.nccl_bind_stream(0, 0, None)

    class TorchLikeStream:
        cuda_stream = 0x1234
    with pytest.raises(ccq.UnsupportedError):
        rt.nccl_stream_wait(0, 0, TorchLikeStream())
    with pytest.raises(ccq.InvalidArgumentError, match="cuda_stream"):
        rt.nccl_stream_wait(0, 0, "stream")


def test_nccl_backend_without_gpu_is_unsupported():
    try:
        ccq.Runtime(backend="nccl").close()
        pytest.skip("a usable GPU is here")
    except ccq.UnsupportedError as e:
        assert "nccl" in e.detail.lower() or "cuda" in e.detail.lower()


def test_close_while_another_thread_waits(rt):
    """close() from one thread while another waits in a fence: the waiter gets an answer or a
    ShutdownError, never a crash, and close() returns."""
    rt.comm_init([0, 1])
    rt.all_reduce(0, np.ones(4, np.float32), devices=[0, 1])  # device 1's part never comes
    f = rt.fence(0)
    got = []

    def waiter():
        try:
            got.append(f.wait())
        except ccq.Error as e:
            got.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)
    rt.close()
    t.join(30)
    assert not t.is_alive()
    assert len(got) == 1 and isinstance(got[0], ccq.ShutdownError), got


def test_runtime_dropped_without_close_is_destroyed():
    rt = ccq.Runtime(host_devices=1)
    rt.comm_init([0])
    rt.all_reduce(0, np.ones(4, np.float32), devices=[0])
    del rt
    gc.collect()  # no crash, no hang: the last reference destroys it


def test_python_store_in_one_process():
    """A world of 2 runtimes meeting through a Python store (a dict), each created in its own
    thread: ccq calls the store from its threads, taking the GIL."""
    class DictStore:
        def __init__(self):
            self.d, self.lock, self.calls = {}, threading.Lock(), 0

        def set(self, key, value):
            with self.lock:
                self.d[key] = bytes(value)
                self.calls += 1

        def get(self, key):
            with self.lock:
                self.calls += 1
                return self.d.get(key)

    store = DictStore()
    rts, errs = [None, None], []

    def make(r):
        try:
            rts[r] = ccq.Runtime(host_devices=1 + r, world_rank=r, world_size=2, store=store,
                                 bootstrap=None, timeout_ms=20000)
        except Exception as e:  # noqa: BLE001
            errs.append(e)

    ts = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errs, errs
    try:
        assert [r.world_rank for r in rts] == [0, 1]
        assert [r.device_count for r in rts] == [3, 3]
        assert rts[0].local_devices == range(0, 1) and rts[1].local_devices == range(1, 3)
        assert store.calls > 0 and any(k.startswith("ccq/") for k in store.d)
        # A communicator of one process's own devices runs as usual.
        rts[1].comm_init([1, 2])
        a = [np.full(4, d, np.float32) for d in (1, 2)]
        for i, d in enumerate((1, 2)):
            rts[1].all_reduce(d, a[i], devices=[1, 2])
        rts[1].sync(1), rts[1].sync(2)
        np.testing.assert_array_equal(a[0], [3, 3, 3, 3])
    finally:
        for r in rts:
            r.close()


def test_store_exception_fails_creation(monkeypatch):
    """A store method that raises: the exception goes to sys.unraisablehook, and creating the
    runtime fails with ccq's detail naming the key."""
    seen = []
    monkeypatch.setattr("sys.unraisablehook", lambda u: seen.append(u))

    class Broken:
        def set(self, key, value):
            raise RuntimeError("store is down")

        def get(self, key):
            return None

    with pytest.raises(ccq.Error) as e:
        ccq.Runtime(host_devices=1, world_rank=0, world_size=2, store=Broken(), timeout_ms=2000)
    assert "ccq/" in e.value.detail
    assert any(isinstance(u.exc_value, RuntimeError) and "store is down" in str(u.exc_value)
               for u in seen)


def test_detail_with_bytes_that_are_not_utf8(rt):
    """ccq's detail quotes a path given as bytes: the error still comes, its bytes replaced."""
    with pytest.raises(ccq.BackendError) as e:
        rt.trace_dump(b"/nonexistent-\xff/trace.json")
    assert "nonexistent-\ufffd" in e.value.detail


def test_job_health_alone():
    """A world of one: its own process alive, no other, no progress records; the config's
    heartbeat fields are keywords; ProcessLostError comes from the status list."""
    with ccq.Runtime(host_devices=2, heartbeat_ms=500, heartbeat_timeout_ms=5000) as rt:
        assert rt.process_state(0) is ccq.ProcessState.ALIVE
        with pytest.raises(ccq.InvalidArgumentError, match="not below world_size 1"):
            rt.process_state(1)
        assert rt.progress() == []
    assert issubclass(ccq.ProcessLostError, ccq.Error)
    assert ccq.Status.PROCESS_LOST == -11
    assert ccq.EventType.PROCESS_LOST.name == "PROCESS_LOST"
    with pytest.raises(ccq.InvalidArgumentError, match="two heartbeats"):
        ccq.Runtime(heartbeat_ms=500, heartbeat_timeout_ms=900)
