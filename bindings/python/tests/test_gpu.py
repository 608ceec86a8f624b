"""The nccl backend with CUDA arrays (CuPy or PyTorch), on a machine with a GPU: skipped
elsewhere, as the C suite's GPU tests (exit code 77). Device memory through DLPack and through
__cuda_array_interface__, every device the machine has, and the GPU-side wait."""

import pytest

import ccq


def nccl_runtime():
    try:
        return ccq.Runtime(backend="nccl", timeout_ms=60000)
    except ccq.Error as e:
        pytest.skip("no usable GPU / NCCL here: %s" % e)


def arrays():
    """(make(n, value, device) -> CUDA array, to_list(a), synchronize(), stream of a device)."""
    try:
        import cupy as cp
        return (lambda n, v, d: _on(cp, d, lambda: cp.full(n, v, cp.float32)),
                lambda a: a.get().tolist(), lambda: cp.cuda.runtime.deviceSynchronize(),
                lambda d: _on(cp, d, lambda: cp.cuda.Stream(non_blocking=True)))
    except ImportError:
        pass
    try:
        import torch
        if not torch.cuda.is_available():
            raise ImportError
        return (lambda n, v, d: torch.full((n,), float(v), device="cuda:%d" % d),
                lambda a: a.cpu().tolist(), torch.cuda.synchronize,
                lambda d: torch.cuda.Stream(device=d))
    except ImportError:
        pytest.skip("neither CuPy nor PyTorch with CUDA")


def _on(cp, d, fn):
    with cp.cuda.Device(d):
        return fn()


class CaiOnly:
    """Only __cuda_array_interface__ (as Numba's device arrays)."""

    def __init__(self, a):
        self._a = a
        self.__cuda_array_interface__ = a.__cuda_array_interface__


@pytest.mark.parametrize("wrap", [lambda a: a, CaiOnly], ids=["dlpack", "cuda_array_interface"])
def test_all_reduce_on_every_gpu(wrap):
    with nccl_runtime() as rt:
        make, to_list, sync, _ = arrays()
        devs = list(rt.local_devices)
        rt.comm_init(devs)
        bufs = [make(1024, d + 1, d) for d in devs]
        sync()
        for d in devs:
            rt.all_reduce(d, wrap(bufs[d]), devices=devs)
        for d in devs:
            rt.sync(d)
        want = float(sum(d + 1 for d in devs))
        assert all(to_list(b)[:4] == [want] * 4 for b in bufs)


def test_host_memory_refused_on_nccl():
    import numpy as np
    with nccl_runtime() as rt:
        with pytest.raises(ccq.InvalidArgumentError, match="not in CUDA memory"):
            rt.all_reduce(0, np.ones(4, np.float32), devices=[0])


def test_gpu_side_wait():
    with nccl_runtime() as rt:
        make, to_list, sync, stream = arrays()
        rt.comm_init([0])
        a = make(1 << 20, 2, 0)
        sync()
        rt.all_reduce(0, a, devices=[0], op=ccq.PROD)
        s = stream(0)
        rt.nccl_stream_wait(0, 0, s)  # returns at once; the CUDA stream waits on the GPU
        s.synchronize()
        assert to_list(a)[:2] == [2.0, 2.0]
        rt.sync(0)
