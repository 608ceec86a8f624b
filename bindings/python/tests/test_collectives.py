"""Every collective with NumPy arrays of every dtype ccq has (bfloat16 and float8 as raw
uint16/uint8 views with dtype=), every op, checked against numerics.py's reference."""

import numpy as np
import pytest

import ccq
from conftest import DEVS, fence_all
from numerics import NUMPY, decode, encode, inputs, kw_dtype, reduce

COUNT = 37  # not a multiple of anything a kernel might like
DTYPES = list(ccq.DType)
OPS = list(ccq.ReduceOp)


def ids(v):
    return str(v).lower() if isinstance(v, ccq.DType) else v.name.lower()


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_all_reduce(shared_rt, dtype, op):
    rt = shared_rt
    srcs = inputs(dtype, op, len(DEVS), COUNT, seed=hash((dtype, op)) & 0xFFFF)
    dsts = [np.zeros_like(s) for s in srcs]
    for d in DEVS:
        rt.all_reduce(d, srcs[d], dsts[d], devices=DEVS, op=op, **kw_dtype(dtype))
    fence_all(rt, DEVS)
    want = reduce(srcs, dtype, op)
    for d in DEVS:
        np.testing.assert_array_equal(dsts[d], want, err_msg="device %d" % d)


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_reduce_scatter(shared_rt, dtype, op):
    rt, n = shared_rt, len(DEVS)
    srcs = inputs(dtype, op, n, COUNT * n, seed=7 + int(dtype) * 8 + int(op))
    dsts = [np.zeros(COUNT, s.dtype) for s in srcs]
    for d in DEVS:
        rt.reduce_scatter(d, srcs[d], dsts[d], devices=DEVS, op=op, **kw_dtype(dtype))
    fence_all(rt, DEVS)
    for r in range(n):
        block = [s[r * COUNT:(r + 1) * COUNT] for s in srcs]
        np.testing.assert_array_equal(dsts[r], reduce(block, dtype, op), err_msg="rank %d" % r)


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_reduce(shared_rt, dtype, op):
    rt, root = shared_rt, 2
    srcs = inputs(dtype, op, len(DEVS), COUNT, seed=11 + int(dtype) * 8 + int(op))
    out = np.zeros_like(srcs[0])
    for d in DEVS:
        # Off the root, dst is not used: pass only src.
        if d == root:
            rt.reduce(d, srcs[d], out, root=root, devices=DEVS, op=op, **kw_dtype(dtype))
        else:
            rt.reduce(d, srcs[d], None, root=root, devices=DEVS, op=op, **kw_dtype(dtype))
    fence_all(rt, DEVS)
    np.testing.assert_array_equal(out, reduce(srcs, dtype, op))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_broadcast(shared_rt, dtype):
    rt, root = shared_rt, 3
    srcs = inputs(dtype, ccq.SUM, len(DEVS), COUNT, seed=13 + int(dtype))
    dsts = [np.zeros_like(s) for s in srcs]
    for d in DEVS:
        rt.broadcast(d, srcs[d] if d == root else None, dsts[d], root=root, devices=DEVS,
                     **kw_dtype(dtype))
    fence_all(rt, DEVS)
    for d in DEVS:
        np.testing.assert_array_equal(dsts[d], srcs[root])


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_all_gather(shared_rt, dtype):
    rt, n = shared_rt, len(DEVS)
    srcs = inputs(dtype, ccq.SUM, n, COUNT, seed=17 + int(dtype))
    dsts = [np.zeros(COUNT * n, s.dtype) for s in srcs]
    for d in DEVS:
        rt.all_gather(d, srcs[d], dsts[d], devices=DEVS, **kw_dtype(dtype))
    fence_all(rt, DEVS)
    for d in DEVS:
        np.testing.assert_array_equal(dsts[d], np.concatenate(srcs))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_all_to_all(shared_rt, dtype):
    rt, n = shared_rt, len(DEVS)
    srcs = inputs(dtype, ccq.SUM, n, COUNT * n, seed=19 + int(dtype))
    dsts = [np.zeros_like(s) for s in srcs]
    for d in DEVS:
        rt.all_to_all(d, srcs[d], dsts[d], devices=DEVS, **kw_dtype(dtype))
    fence_all(rt, DEVS)
    for j in range(n):
        want = np.concatenate([srcs[i][j * COUNT:(j + 1) * COUNT] for i in range(n)])
        np.testing.assert_array_equal(dsts[j], want, err_msg="rank %d" % j)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_gather(shared_rt, dtype):
    rt, n, root = shared_rt, len(DEVS), 1
    srcs = inputs(dtype, ccq.SUM, n, COUNT, seed=23 + int(dtype))
    out = np.zeros(COUNT * n, srcs[0].dtype)
    for d in DEVS:
        rt.gather(d, srcs[d], out if d == root else None, root=root, devices=DEVS,
                  **kw_dtype(dtype))
    fence_all(rt, DEVS)
    np.testing.assert_array_equal(out, np.concatenate(srcs))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_scatter(shared_rt, dtype):
    rt, n, root = shared_rt, len(DEVS), 0
    src = inputs(dtype, ccq.SUM, 1, COUNT * n, seed=29 + int(dtype))[0]
    dsts = [np.zeros(COUNT, src.dtype) for _ in DEVS]
    for d in DEVS:
        rt.scatter(d, src if d == root else None, dsts[d], root=root, devices=DEVS,
                   **kw_dtype(dtype))
    fence_all(rt, DEVS)
    for r in range(n):
        np.testing.assert_array_equal(dsts[r], src[r * COUNT:(r + 1) * COUNT])


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_send_recv_ring(shared_rt, dtype):
    """Each device sends to the next and receives from the previous, on stream 1."""
    rt, n = shared_rt, len(DEVS)
    srcs = inputs(dtype, ccq.SUM, n, COUNT, seed=31 + int(dtype))
    dsts = [np.zeros_like(s) for s in srcs]
    for d in DEVS:
        rt.send(d, srcs[d], peer=(d + 1) % n, stream=1, **kw_dtype(dtype))
        rt.recv(d, dsts[d], peer=(d - 1) % n, stream=1, **kw_dtype(dtype))
    fence_all(rt, DEVS, stream=1)
    for d in DEVS:
        np.testing.assert_array_equal(dsts[d], srcs[(d - 1) % n])


def test_in_place_forms(shared_rt):
    """all_reduce/broadcast/reduce with dst omitted run in place; all_gather and
    reduce_scatter in place through views, as NCCL's in-place rules."""
    rt, n = shared_rt, len(DEVS)
    bufs = [np.full(COUNT, d + 1, np.float32) for d in DEVS]
    for d in DEVS:
        rt.all_reduce(d, bufs[d], devices=DEVS)
    fence_all(rt, DEVS)
    for b in bufs:
        np.testing.assert_array_equal(b, np.full(COUNT, 10, np.float32))
    alls = [np.zeros(COUNT * n, np.int64) for _ in DEVS]
    for r, d in enumerate(DEVS):
        alls[r][r * COUNT:(r + 1) * COUNT] = r + 5
    for r, d in enumerate(DEVS):
        rt.all_gather(d, alls[r][r * COUNT:(r + 1) * COUNT], alls[r], devices=DEVS)
    fence_all(rt, DEVS)
    for a in alls:
        np.testing.assert_array_equal(a, np.repeat(np.arange(5, 5 + n), COUNT))
    for r, d in enumerate(DEVS):
        rt.reduce_scatter(d, alls[r], alls[r][r * COUNT:(r + 1) * COUNT], devices=DEVS)
    fence_all(rt, DEVS)
    for r, a in enumerate(alls):
        np.testing.assert_array_equal(a[r * COUNT:(r + 1) * COUNT], np.full(COUNT, 4 * (r + 5)))


def test_subset_communicator_and_multidim(shared_rt):
    """A communicator of two of the four devices, 2-D arrays, and the default stream by name."""
    rt, devs = shared_rt, [3, 1]
    rt.comm_init(devs)
    a = {d: np.arange(12, dtype=np.float64).reshape(3, 4) * (d + 1) for d in devs}
    for d in devs:
        rt.all_reduce(d, a[d], devices=devs, op=ccq.MAX, stream=2)
    fence_all(rt, devs, stream=2)
    for d in devs:
        np.testing.assert_array_equal(a[d], np.arange(12).reshape(3, 4) * 4.0)


def test_other_buffer_kinds(shared_rt):
    """array.array, bytearray, memoryview and bytes (a read-only src) work like arrays."""
    import array
    rt = shared_rt
    srcs = [array.array("i", [d] * 8) for d in DEVS]
    dsts = [bytearray(32) for _ in DEVS]  # raw bytes: dtype from src, size checked in bytes
    for d in DEVS:
        rt.all_reduce(d, srcs[d], memoryview(dsts[d]).cast("i"), devices=DEVS)
    fence_all(rt, DEVS)
    for b in dsts:
        assert list(memoryview(b).cast("i")) == [6] * 8
    ro = [bytes([d] * 8) for d in DEVS]
    outs = [bytearray(8) for _ in DEVS]
    for d in DEVS:
        rt.all_reduce(d, ro[d], outs[d], devices=DEVS, op=ccq.MAX)
    fence_all(rt, DEVS)
    assert all(o == bytes([3] * 8) for o in outs)


class DLPackOnly:
    """An object with nothing but DLPack (as a PyTorch CPU tensor or a JAX array)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class LegacyDLPackOnly(DLPackOnly):
    """A producer older than DLPack 1.0: no max_version, the unversioned capsule."""

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()


@pytest.mark.parametrize("wrap", [DLPackOnly, LegacyDLPackOnly])
def test_dlpack(shared_rt, wrap):
    rt = shared_rt
    srcs = [np.full(16, d, np.int32) for d in DEVS]
    dsts = [np.zeros(16, np.int32) for _ in DEVS]
    for d in DEVS:
        rt.all_reduce(d, wrap(srcs[d]), wrap(dsts[d]), devices=DEVS)
    fence_all(rt, DEVS)
    for b in dsts:
        np.testing.assert_array_equal(b, np.full(16, 6))


def test_numerics_reference_against_ml_dtypes():
    """numerics.py's bf16/fp8 codecs agree with ml_dtypes (an independent implementation)."""
    ml = pytest.importorskip("ml_dtypes")
    for dtype, t, raw in [(ccq.BFLOAT16, ml.bfloat16, np.uint16),
                          (ccq.FLOAT8E4M3, ml.float8_e4m3fn, np.uint8),
                          (ccq.FLOAT8E5M2, ml.float8_e5m2, np.uint8)]:
        bits = np.arange(np.iinfo(raw).max + 1, dtype=raw)
        ours = decode(bits, dtype)
        with np.errstate(invalid="ignore"):
            theirs = bits.view(t).astype(np.float64)
        np.testing.assert_array_equal(ours, theirs)
        vals = np.array([0.0, 1.0, -2.0, 0.25, 3.0])
        np.testing.assert_array_equal(encode(vals, dtype), vals.astype(t).view(raw))
