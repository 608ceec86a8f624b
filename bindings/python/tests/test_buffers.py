"""Buffers: what is refused, with which message (the binding's own checks and ccq's C detail),
and how long a buffer is kept alive (until a fence covering its command answers)."""

import gc
import weakref

import numpy as np
import pytest

import ccq
from conftest import DEVS, fence_all


def refused(call, *words, cls=ccq.InvalidArgumentError):
    with pytest.raises(cls) as e:
        call()
    for w in words:
        assert w in str(e.value), "%r not in %r" % (w, str(e.value))
    assert isinstance(e.value, ccq.Error)
    return e.value


# ---- what the binding refuses itself --------------------------------------------------------

def test_refused_wrong_dtype(rt):
    a = np.zeros(8, np.float32)
    e = refused(lambda: rt.all_reduce(0, a, np.zeros(8, np.float64), devices=DEVS),
                "src holds float32 but dst holds float64")
    assert e.status == ccq.Status.INVALID_ARGUMENT and isinstance(e, ValueError)
    refused(lambda: rt.all_reduce(0, a, devices=DEVS, dtype=ccq.INT32),
            "dtype=int32, but src", "holds float32")
    refused(lambda: rt.all_reduce(0, np.zeros(8, np.int16), devices=DEVS),
            "holds int16, which is no ccq dtype")
    refused(lambda: rt.all_reduce(0, np.zeros(8, np.uint16), devices=DEVS),
            "uint16", "dtype=ccq.BFLOAT16")
    refused(lambda: rt.all_reduce(0, np.zeros(8, bool), devices=DEVS), "bool")
    refused(lambda: rt.all_reduce(0, np.zeros(8, np.complex64), devices=DEVS), "src")
    refused(lambda: rt.all_reduce(0, np.zeros(8, ">f4"), devices=DEVS), "big-endian")
    # A raw view must have the type's width: uint8 is no bfloat16.
    refused(lambda: rt.all_reduce(0, np.zeros(8, np.uint8), devices=DEVS, dtype=ccq.BFLOAT16),
            "dtype=bfloat16, but src", "holds uint8", "uint16 for bfloat16")
    refused(lambda: rt.all_reduce(0, a, devices=DEVS, dtype="float99"), "float99")
    # dtype by name works as well as by enum.
    rt.comm_init([0])
    rt.all_reduce(0, np.zeros(8, np.uint16), devices=[0], dtype="bfloat16")
    rt.sync(0)


def test_refused_ml_dtypes_array_says_how(rt):
    ml = pytest.importorskip("ml_dtypes")
    a = np.zeros(8, ml.bfloat16)
    refused(lambda: rt.all_reduce(0, a, devices=DEVS), "a.view(np.uint16)", "ccq.BFLOAT16")
    f8 = np.zeros(8, ml.float8_e5m2)
    refused(lambda: rt.all_reduce(0, f8, devices=DEVS), "a.view(np.uint8)", "FLOAT8E5M2")


def test_refused_not_contiguous(rt):
    a = np.zeros((4, 4), np.float32)
    refused(lambda: rt.all_reduce(0, a[:, 1], devices=DEVS), "src", "not contiguous")
    refused(lambda: rt.all_reduce(0, np.zeros(4, np.float32), a.T, devices=DEVS),
            "dst", "not contiguous")


def test_refused_read_only_destination(rt):
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    refused(lambda: rt.all_reduce(0, np.zeros(8, np.float32), ro, devices=DEVS),
            "dst", "read-only")
    refused(lambda: rt.all_reduce(0, ro, devices=DEVS), "src (in place)", "read-only")
    refused(lambda: rt.recv(0, b"\0" * 8, peer=1), "buf", "read-only")
    # Through DLPack too: NumPy's versioned capsule carries the read-only flag.
    from test_collectives import DLPackOnly
    refused(lambda: rt.all_reduce(0, np.zeros(8, np.float32), DLPackOnly(ro), devices=DEVS),
            "dst", "read-only")
    # A read-only source is fine.
    outs = [np.zeros(8, np.float32) for _ in DEVS]
    for d in DEVS:
        rt.all_reduce(d, ro, outs[d], devices=DEVS)
    fence_all(rt, DEVS)


def test_refused_wrong_sizes(rt):
    f = lambda n: np.zeros(n, np.float32)  # noqa: E731
    refused(lambda: rt.all_reduce(0, f(8), f(9), devices=DEVS),
            "dst holds 9 float32 elements, expected 8")
    refused(lambda: rt.all_gather(0, f(4), f(12), devices=DEVS),
            "dst holds 12 float32 elements, expected 16 (4 ranks x 4)")
    refused(lambda: rt.reduce_scatter(0, f(15), f(4), devices=DEVS),
            "src holds 15 float32 elements, expected 16")
    refused(lambda: rt.all_to_all(0, f(10), f(10), devices=DEVS), "not a multiple of the 4 ranks")
    refused(lambda: rt.gather(1, f(4), f(8), root=1, devices=DEVS), "expected 16")
    refused(lambda: rt.scatter(0, f(8), f(4), root=0, devices=DEVS), "src holds 8")


def test_refused_missing_buffers_and_arguments(rt):
    a = np.zeros(8, np.float32)
    refused(lambda: rt.broadcast(2, None, a, root=2, devices=DEVS), "src is None on the root")
    refused(lambda: rt.reduce(0, a, None, root=0, devices=DEVS), "dst is None on the root")
    refused(lambda: rt.all_gather(0, a, None, devices=DEVS), "dst is None")
    refused(lambda: rt.all_reduce(0, object(), devices=DEVS),
            "neither the buffer protocol nor __dlpack__")
    with pytest.raises(TypeError, match="root="):
        rt.broadcast(0, a, a, devices=DEVS)
    with pytest.raises(TypeError, match="peer="):
        rt.send(0, a)
    with pytest.raises(TypeError, match="unexpected keyword argument 'root'"):
        rt.all_reduce(0, a, root=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        rt.all_reduce(0, a, bogus=1)
    with pytest.raises(TypeError):
        rt.all_reduce(0)
    refused(lambda: rt.all_reduce(-1, a, devices=DEVS), "device", "out of range")
    refused(lambda: rt.all_reduce(0, a, devices=[0, "x"]), "devices")


def test_refused_cuda_memory_on_host_backend(rt):
    class CudaArray:
        __cuda_array_interface__ = {"shape": (8,), "typestr": "<f4", "data": (1 << 40, False),
                                    "version": 3}
    refused(lambda: rt.all_reduce(0, CudaArray(), devices=DEVS), "CUDA memory", "host backend")


def test_cuda_array_interface_parsing():
    """How a CUDA array is read on the nccl backend (no GPU needed to parse it)."""
    class CudaArray:
        def __init__(self, **kw):
            self.__cuda_array_interface__ = dict(
                {"shape": (2, 3), "typestr": "<f4", "data": (4096, False), "version": 3}, **kw)
    describe = ccq._ccq._describe
    assert describe(CudaArray(), cuda=True) == (4096, 24, int(ccq.FLOAT32), "float32")
    assert describe(CudaArray(typestr="<u2"), cuda=True)[2] is None  # raw 16 bits: needs dtype=
    assert describe(CudaArray(strides=(12, 4)), cuda=True)[1] == 24
    with pytest.raises(ccq.InvalidArgumentError, match="not contiguous"):
        describe(CudaArray(strides=(4, 8)), cuda=True)
    with pytest.raises(ccq.InvalidArgumentError, match="read-only"):
        describe(CudaArray(data=(4096, True)), cuda=True, writable=True)
    with pytest.raises(ccq.InvalidArgumentError, match="native-order"):
        describe(CudaArray(typestr=">f4"), cuda=True)
    # A NumPy array is host memory: refused where CUDA memory is needed.
    with pytest.raises(ccq.InvalidArgumentError, match="not in CUDA memory"):
        describe(np.zeros(4, np.float32), cuda=True)


# ---- what ccq's C checks refuse: the detail is ccq's own --------------------------------------

def test_c_detail_passes_through(rt):
    a = np.zeros(8, np.float32)
    e = refused(lambda: rt.all_reduce(9, a, devices=DEVS), "ccq_all_reduce", "device 9")
    assert e.detail.startswith("ccq_all_reduce")
    refused(lambda: rt.all_reduce(0, a, devices=DEVS, op=17), "op")
    refused(lambda: rt.all_reduce(0, a, devices=DEVS, stream=999), "stream")
    refused(lambda: rt.all_reduce(0, a, devices=[1, 2]), "device 0")  # not in the set
    refused(lambda: rt.broadcast(0, a, a, root=3, devices=[0, 1]), "root")
    refused(lambda: rt.all_reduce(0, a[:6], a[2:], devices=DEVS), "overlap")
    with pytest.raises(ccq.NotInitializedError) as e:
        rt.all_reduce(0, a, devices=[0, 2])
    assert e.value.status == ccq.Status.NOT_INITIALIZED and "ccq_comm_init" in e.value.detail
    refused(lambda: rt.comm_init([0, 0]), "twice")
    refused(lambda: rt.sync(7), "device 7")


# ---- lifetime: a reference on every buffer until a fence covering its command answers ------

def in_flight(rt, dtype=np.float32):
    """Device 0's part of an all_reduce over {0, 1}: it cannot run before device 1's part."""
    a = np.ones(1024, dtype)
    w = weakref.ref(a)
    rt.comm_init([0, 1])
    rt.all_reduce(0, a, devices=[0, 1])
    del a
    gc.collect()
    return w


def finish(rt):
    b = np.ones(1024, np.float32)
    rt.all_reduce(1, b, devices=[0, 1])
    rt.sync(1)


def test_lifetime_until_sync(rt):
    w = in_flight(rt)
    assert w() is not None, "dropped by the caller while ccq still writes it"
    finish(rt)
    assert w() is not None, "device 0's stream was not fenced yet"
    rt.sync(0)
    gc.collect()
    assert w() is None, "kept after the fence answered"


def test_lifetime_until_fence_answers(rt):
    w = in_flight(rt)
    f = rt.fence(0)
    assert f.test() is False and w() is not None
    assert f.wait(timeout=0.05) is False and w() is not None
    finish(rt)
    assert f.wait(timeout=10) is True
    gc.collect()
    assert w() is None
    assert f.done and "done" in repr(f)


def test_lifetime_fence_covers_only_earlier_commands(rt):
    """A fence taken before a submission never releases that submission's buffers."""
    rt.comm_init([0, 1])
    f = rt.fence(0)  # covers nothing yet
    w = in_flight(rt)
    assert f.wait(timeout=5) is True
    gc.collect()
    assert w() is not None
    finish(rt)
    rt.sync(0)
    gc.collect()
    assert w() is None


def test_lifetime_dlpack_deleter_runs_at_the_fence(rt):
    from test_collectives import DLPackOnly
    a = np.ones(1024, np.float32)
    w = weakref.ref(a)
    rt.comm_init([0, 1])
    rt.all_reduce(0, DLPackOnly(a), devices=[0, 1])
    del a
    gc.collect()
    assert w() is not None  # the capsule's manager (NumPy) holds the array until the deleter
    finish(rt)
    rt.sync(0)
    gc.collect()
    assert w() is None


def test_lifetime_refused_submission_keeps_nothing(rt):
    a = np.ones(8, np.float32)
    w = weakref.ref(a)
    with pytest.raises(ccq.NotInitializedError):
        rt.all_reduce(0, a, devices=[0, 3])
    del a
    gc.collect()
    assert w() is None


def test_lifetime_close_releases_unfenced_buffers():
    rt = ccq.Runtime(host_devices=2, timeout_ms=20000)
    w = in_flight(rt)
    assert w() is not None
    rt.close()  # the part of device 1 never came: cancelled by the shutdown
    gc.collect()
    assert w() is None


def test_lifetime_kept_after_a_sync_that_timed_out():
    """sync's TIMEOUT may mean 'still pending': the buffers stay until a later answer."""
    with ccq.Runtime(host_devices=2, timeout_ms=300) as rt:
        w = in_flight(rt)
        with pytest.raises(ccq.TimeoutError) as e:
            rt.sync(0)
        assert e.value.status == ccq.Status.TIMEOUT and e.value.detail
        gc.collect()
        assert w() is not None
        # The watchdog ended the command: a new fence says so and lets the buffer go.
        assert rt.fence(0).wait(timeout=10) is True
        gc.collect()
        assert w() is None


def test_no_reference_leaked(rt):
    """Submitting, refusing, fencing: the arrays' reference counts come back exactly."""
    import sys
    from test_collectives import DLPackOnly
    srcs = [np.ones(64, np.float32) for _ in DEVS]
    dsts = [np.zeros(64, np.float32) for _ in DEVS]
    ro = np.ones(64, np.float32)
    ro.flags.writeable = False
    base = [sys.getrefcount(x) for x in srcs + dsts + [ro]]
    for i in range(50):
        for d in DEVS:
            if i % 2:
                rt.all_reduce(d, srcs[d], dsts[d], devices=DEVS)
            else:
                rt.all_reduce(d, DLPackOnly(srcs[d]), DLPackOnly(dsts[d]), devices=DEVS)
        for d in DEVS:
            rt.fence(d).wait() if i % 3 else rt.sync(d)
        with pytest.raises(ccq.InvalidArgumentError):
            rt.all_reduce(0, srcs[0], ro, devices=DEVS)
        with pytest.raises(ccq.NotInitializedError):
            rt.all_reduce(0, srcs[0], dsts[0], devices=[0, 3])
        with pytest.raises(ccq.InvalidArgumentError):
            rt.all_gather(0, srcs[0], dsts[0], devices=DEVS)
    gc.collect()
    assert [sys.getrefcount(x) for x in srcs + dsts + [ro]] == base
