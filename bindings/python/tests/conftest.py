"""Shared fixtures of ccq's Python tests: runtimes that are always closed, and paths."""

import os

import pytest

import ccq

HERE = os.path.dirname(os.path.abspath(__file__))
#: The repository's include/ (for the header checks), when the tests run from a checkout.
INCLUDE = os.environ.get("CCQ_INCLUDE_DIR") or os.path.join(HERE, "..", "..", "..", "include")
DEVS = [0, 1, 2, 3]


def free_port():
    """A port free on 127.0.0.1 below the kernel's ephemeral range, for a tcp:// rendezvous
    (the repository's tests/free_port.py, shared with the shell tests: why not the kernel's
    pick is said there)."""
    import importlib.util
    path = os.path.join(HERE, "..", "..", "..", "tests", "free_port.py")
    spec = importlib.util.spec_from_file_location("ccq_test_free_port", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.free_port()


def has_ucx_engine():
    """Whether this libccq has the host backend's UCX engine (its module libccq-ucx.so.0 beside
    libccq, where libccq loads it from): plain processes then span a communicator with no
    launcher. A libccq built without UCX (CCQ_WITH_UCX=OFF, no libucx-dev) has only the MPI
    engine, which needs mpirun."""
    lib_dir = os.path.dirname(os.path.realpath(ccq.library_path()))
    return os.path.exists(os.path.join(lib_dir, "libccq-ucx.so.0"))


@pytest.fixture
def rt():
    """A host runtime of 4 devices with a 20 s deadline (no test waits for it on success)."""
    with ccq.Runtime(backend="host", host_devices=4, timeout_ms=20000) as r:
        r.comm_init(DEVS)
        yield r


@pytest.fixture(scope="module")
def shared_rt():
    """One runtime for a module's many small cases (the collective matrix)."""
    with ccq.Runtime(backend="host", host_devices=4, timeout_ms=20000) as r:
        r.comm_init(DEVS)
        yield r


def fence_all(rt, devices, stream=0):
    for d in devices:
        rt.sync(d, stream)
