"""The examples of docs/python.md run as the document shows, and print what it pastes."""

import os
import re
import subprocess
import sys

import pytest
from conftest import has_ucx_engine

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")


def run(name, timeout=120):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    for k in ("CCQ_WORLD_RANK", "CCQ_WORLD_SIZE", "CCQ_BOOTSTRAP", "OMPI_COMM_WORLD_RANK",
              "PMI_RANK"):
        env.pop(k, None)
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)], capture_output=True,
                       text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_quickstart():
    out = run("quickstart.py")
    assert "all_reduce avg: [2.5 2.5 2.5] on every device: True" in out
    assert "ring: [3, 0, 1, 2]" in out and "submitted=12, completed=12" in out


def test_errors():
    out = run("errors.py")
    for line in ("wrong dtype", "not contiguous", "read-only dst", "wrong size", "int16",
                 "ccq_all_reduce: device 7 does not exist", "NotInitializedError",
                 "fence: MISMATCH", "TimeoutError is a TimeoutError: True"):
        assert line in out, line


def test_lifetime():
    out = run("lifetime.py")
    assert "dropped by the caller, still alive: True" in out
    assert "fence.test(): False | fence.wait(0.1): False" in out
    assert "after the fence answered, alive: False | b[0] = 2.0" in out


def test_world_all_reduce_plain_processes():
    out = run("world_all_reduce.py")
    for r in range(3):
        assert "process %d of 3: devices [%d, %d] of 6" % (r, 2 * r, 2 * r + 1) in out
    if not has_ucx_engine():
        assert "cannot span processes" in out, out
        pytest.skip("this libccq has no UCX engine (libccq-ucx.so.0): plain processes cannot "
                    "span a communicator")
    assert out.count("all_reduce over 6 devices: [21.0]") == 3, out


def test_readme_python_example():
    """The example of the README's Python section, run as written, prints what it shows."""
    readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                          "README.md")
    if not os.path.exists(readme):
        pytest.skip("README.md not found")
    section = open(readme).read().split("\n## Python\n", 1)[1]
    # The first ```python block, and the plain ``` block right after it (its output).
    code, shown = re.search(r"```python\n(.*?)```\s*```\n(.*?)```", section, re.S).groups()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    assert r.stdout == shown, (r.stdout, shown)
