"""The package: versions, python3 -m ccq, the tables from ccq.h, errors, and the config
keywords (every ccq_config field, from one table)."""

import os
import pickle
import re
import subprocess
import sys

import pytest

import ccq
from conftest import INCLUDE


def test_versions():
    assert re.fullmatch(r"\d+\.\d+\.\d+", ccq.__version__)
    assert ccq.library_version() == ccq.__version__  # built and run against the same ccq
    assert os.path.exists(ccq.library_path())


def test_python_m_ccq_version():
    out = subprocess.run([sys.executable, "-m", "ccq", "--version"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert out.startswith("ccq %s (libccq %s, " % (ccq.__version__, ccq.library_version()))


def test_python_m_ccq_config_reads_the_environment():
    env = dict(os.environ, CCQ_HOST_DEVICES="3", CCQ_TIMEOUT_MS="1234")
    out = subprocess.run([sys.executable, "-m", "ccq", "--config"], capture_output=True,
                         text=True, timeout=60, check=True, env=env).stdout
    assert "host_devices = 3" in out and "timeout_ms = 1234" in out


def header_config_fields():
    """The fields of struct ccq_config, read from ccq.h."""
    path = os.path.join(INCLUDE, "ccq.h")
    if not os.path.exists(path):
        pytest.skip("ccq.h not found (set CCQ_INCLUDE_DIR)")
    text = open(path).read()
    body = re.search(r"typedef struct ccq_config \{(.*?)\} ccq_config;", text, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    return [m.group(1) for m in re.finditer(r"(\w+)\s*;", body)]


def test_every_config_field_is_a_keyword():
    """A field appended to ccq_config must get its line in csrc/config.c's table."""
    own = {"struct_size", "env_error"}  # set by ccq itself
    want = [f for f in header_config_fields() if f not in own]
    assert list(ccq.config_fields()) == want


def test_config_keywords_reach_ccq():
    with ccq.Runtime(backend="host", host_devices=3, max_streams=5, timeout_ms=3000,
                     trace_capacity=0, spin_us=0, host_workers=1) as rt:
        assert (rt.device_count, rt.max_streams, rt.backend) == (3, 5, "host")
        with pytest.raises(ccq.InvalidArgumentError, match="stream"):
            rt.sync(0, 5)


def test_config_from_environment(monkeypatch):
    monkeypatch.setenv("CCQ_HOST_DEVICES", "2")
    assert ccq.config_defaults()["host_devices"] == 2
    with ccq.Runtime() as rt:
        assert rt.device_count == 2
    with ccq.Runtime(host_devices=3) as rt:  # a keyword wins over the variable
        assert rt.device_count == 3
    monkeypatch.setenv("CCQ_HOST_DEVICES", "many")
    with pytest.raises(ccq.InvalidArgumentError, match="CCQ_HOST_DEVICES"):
        ccq.Runtime()


def test_config_errors():
    with pytest.raises(TypeError, match="hostdevices"):
        ccq.Runtime(hostdevices=2)
    with pytest.raises(TypeError, match="keywords only"):
        ccq._ccq.Runtime(4)
    with pytest.raises(ccq.InvalidArgumentError, match="host_devices: out of range"):
        ccq.Runtime(host_devices=-1)
    with pytest.raises(ccq.InvalidArgumentError, match="an integer is required"):
        ccq.Runtime(timeout_ms="soon")
    # ccq's own validation, with its detail:
    with pytest.raises(ccq.InvalidArgumentError, match="ccq_config.host_devices is 0"):
        ccq.Runtime(host_devices=0)
    with pytest.raises(ccq.InvalidArgumentError, match="unknown kind"):
        ccq.Runtime(fault="explode:op=1")
    with pytest.raises(ccq.InvalidArgumentError, match="store"):
        ccq.Runtime(store=object())
    with pytest.raises(ccq.InvalidArgumentError, match="unknown backend \"nosuch\""):
        ccq.Runtime(backend="nosuch")


def test_enums_follow_ccq_h():
    assert ccq.Status.OK == 0 and ccq.Status.IN_PROGRESS == 1 and ccq.Status.TIMEOUT == -6
    assert [d.name for d in ccq.DType][:3] == ["INT8", "UINT8", "INT32"]
    assert str(ccq.FLOAT8E4M3) == "float8e4m3" and ccq.BFLOAT16 == 9
    assert [o.name for o in ccq.ReduceOp] == ["SUM", "PROD", "MAX", "MIN", "AVG"]
    assert ccq.SUM is ccq.ReduceOp.SUM and ccq.AVG == 4
    assert ccq.Kind.ALL_REDUCE == 0 and ccq.EventType.SUBMITTED == 0


def test_errors():
    for s in ccq.Status:
        if s < 0:
            cls = ccq.ERRORS[s]
            assert issubclass(cls, ccq.Error) and getattr(ccq, cls.__name__) is cls
            e = cls(s, "why")
            assert e.status is s and e.detail == "why" and str(e) == "%s: why" % s.name
    assert issubclass(ccq.TimeoutError, TimeoutError)
    assert issubclass(ccq.InvalidArgumentError, ValueError)
    assert issubclass(ccq.NoMemoryError, MemoryError)
    e = pickle.loads(pickle.dumps(ccq.MismatchError(ccq.Status.MISMATCH, "rank 1: count")))
    assert type(e) is ccq.MismatchError and e.detail == "rank 1: count"
