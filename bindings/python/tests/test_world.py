"""Worlds of 3 processes from Python: plain processes meeting in a directory (no launcher),
a Python store in a shared directory, mpirun with the "mpi" bootstrap, and a process that
never arrives. Each process is world_worker.py; every run is bounded in time."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import free_port, has_ucx_engine

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "world_worker.py")
CANNOT_SPAN = "cannot span processes"


def json_objects(text):
    """Every JSON object printed to text, in order. mpirun forwards each process's stdout
    through its own daemon, which may join two processes' lines (seen in CI: one process's
    object right after another's, the newline between them later), so objects are read one
    after another, not line by line."""
    dec, objs, i = json.JSONDecoder(), [], text.find("{")
    while i >= 0:
        try:
            obj, end = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        objs.append(obj)
        i = text.find("{", end)
    return objs


def spawn(n, size, tmp, extra_env=None, args=(), timeout=90, killed=()):
    """Start n plain processes of a world of `size` (ranks 0..n-1); their JSON lines (None for
    the ranks in `killed`, which must have died of SIGKILL)."""
    procs = []
    for r in range(n):
        env = dict(os.environ, CCQ_WORLD_RANK=str(r), CCQ_WORLD_SIZE=str(size),
                   CCQ_BOOTSTRAP="file:%s" % tmp)
        env.update(extra_env or {})
        procs.append(subprocess.Popen([sys.executable, WORKER, *args], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = []
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=timeout)
        finally:
            if p.poll() is None:
                p.kill()
        if r in killed:
            assert p.returncode == -9, (p.returncode, err)
            outs.append(None)
            continue
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


@pytest.fixture(scope="module")
def file_world(tmp_path_factory):
    return spawn(3, 3, tmp_path_factory.mktemp("world"))


def check_meeting(outs, per_process=2):
    n = len(outs)
    assert sorted(o["rank"] for o in outs) == list(range(n))
    for o in outs:
        r = o["rank"]
        assert o["size"] == n and o["count"] == n * per_process
        assert o["devices"] == list(range(r * per_process, (r + 1) * per_process))
        assert o["local"] == sum(d + 1 for d in o["devices"])


def test_world_of_plain_processes_meets(file_world):
    """3 plain processes (no launcher) meet through a directory: ranks, global device ids,
    and communicators of each process's own devices."""
    check_meeting(file_world)


def test_world_of_plain_processes_all_reduce_across(file_world):
    """The all_reduce over all 6 devices of the 3 processes, no launcher: the host backend
    carries data between them on its default engine, UCX. A libccq without the UCX engine
    (only MPI's, which needs mpirun) refuses with its detail, and this skips."""
    spans = [o["span"] for o in file_world]
    if not has_ucx_engine():
        assert all(CANNOT_SPAN in s.get("unsupported", "") for s in spans), spans
        pytest.skip("this libccq has no UCX engine (libccq-ucx.so.0): "
                    + spans[0]["unsupported"])
    assert all(s["all_reduce"] == [21.0] for s in spans), spans


def test_world_over_tcp_all_reduce_across(tmp_path):
    """The same 3 plain processes meeting through the tcp:// rendezvous (process 0 serves it
    on a free port) instead of a directory."""
    if not has_ucx_engine():
        pytest.skip("this libccq has no UCX engine (libccq-ucx.so.0)")
    outs = spawn(3, 3, tmp_path,
                 extra_env={"CCQ_BOOTSTRAP": "tcp://127.0.0.1:%d" % free_port()})
    check_meeting(outs)
    assert all(o["span"]["all_reduce"] == [21.0] for o in outs), outs


def test_world_through_a_python_store(tmp_path):
    """The processes meet through a Python object with set/get (world_worker.DirStore)."""
    outs = spawn(3, 3, tmp_path, args=("--store", str(tmp_path)))
    check_meeting(outs)


def test_world_process_never_arrives(tmp_path):
    """2 of 3 processes start: both fail by the deadline, naming the one that never came."""
    outs = spawn(2, 3, tmp_path, args=("--timeout-ms", "1500"), timeout=60)
    for o in outs:
        assert o["create"] == "TIMEOUT", o
        assert "process 2 never" in o["detail"], o  # "never arrived" (the missing one named)


def test_world_process_killed_survivors_finish(tmp_path):
    """Process 1 is killed (SIGKILL) once the world met: the others run their own devices'
    collectives and close on time (nothing waits for the dead process)."""
    outs = spawn(3, 3, tmp_path, args=("--kill-rank", "1"), killed=(1,), timeout=60)
    for r in (0, 2):
        assert outs[r]["rank"] == r and outs[r]["local"] == sum(d + 1 for d in outs[r]["devices"])
        # Job health: both see process 1 lost, and the world's set is refused naming it.
        assert outs[r]["killed"] == "LOST", outs[r]
        assert "process 1 (devices 2..3)" in outs[r]["span"]["lost"], outs[r]


def mpirun():
    exe = shutil.which("mpirun") or shutil.which("mpiexec")
    if exe is None:
        pytest.skip("no mpirun")
    return exe


def test_world_under_mpirun():
    """mpirun -np 3 python3 world_worker.py with bootstrap "mpi": the host backend spans the
    processes over MPI; all_reduce, all_gather and broadcast over the 6 devices."""
    env = dict(os.environ, CCQ_BOOTSTRAP="mpi", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    for k in ("CCQ_WORLD_RANK", "CCQ_WORLD_SIZE"):
        env.pop(k, None)
    r = subprocess.run([mpirun(), "-np", "3", sys.executable, WORKER, "--all-kinds"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    outs = json_objects(r.stdout)
    assert len(outs) == 3, r.stdout
    check_meeting(outs)
    for o in outs:
        assert o["span"] == {"all_reduce": [21.0], "all_gather": True, "broadcast": [5.0]}, o


def test_world_under_mpirun_disagreeing_processes():
    """Process 2 submits the spanning all_reduce with another count, check_signatures on: every
    process's fence raises ccq.MismatchError naming the processes and the field."""
    env = dict(os.environ, CCQ_BOOTSTRAP="mpi", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    for k in ("CCQ_WORLD_RANK", "CCQ_WORLD_SIZE"):
        env.pop(k, None)
    r = subprocess.run([mpirun(), "-np", "3", sys.executable, WORKER, "--devices", "1",
                        "--disagree", "--timeout-ms", "20000"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    outs = json_objects(r.stdout)
    assert len(outs) == 3, r.stdout
    for o in outs:
        assert o["span"]["fences"] == ["MISMATCH"], o
        assert "process 0 (rank 0) 8, process 2 (rank 2) 16" in o["span"]["detail"], o
