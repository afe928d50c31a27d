"""The sandboxed worker pool (gemmrl.sandbox), CPU tier.

Every failure class is planted by a job in tests/sandbox_jobs.py (raise, MemoryError, segfault, abort,
os._exit, a hang inside C, a child that would outlive its job, a poisoned CUDA context stand-in, a reply
that would run code in the parent) and must come back classified, with the pool still serving the next
job. Isolation: writes outside the scratch dir and TCP to a listener of the test's must fail (skipped with
the reason where the platform cannot enforce it, and then the result must say so), and succeed with
``isolate=False``. Run: ``python -m pytest -q tests/test_sandbox.py`` (about half a minute).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gemmrl.sandbox import Job, JobResult, SandboxPool

# The workers import the job functions by name; tests/ is handed to them explicitly (any import mode).
ENV = {"PYTHONPATH": str(Path(__file__).resolve().parent)}
TIMEOUT_S = 2.0


def job(fn: str, args=None, job_id: str | None = None, timeout_s: float = 20.0) -> Job:
    return Job(job_id or fn, f"sandbox_jobs:{fn}", args, timeout_s)


@pytest.fixture
def pool(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with SandboxPool(n_workers=1, gpus=(), scratch_root=tmp_path / "scratch", env=ENV) as p:
        yield p


def run1(pool: SandboxPool, j: Job) -> JobResult:
    return pool.submit(j).result(timeout=60)


def gone(pid: int, within_s: float = 3.0) -> bool:
    """The process no longer runs (missing, or a zombie nobody reaped yet)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


# ------------------------------------------------------------------------------------------ basics


def test_import_does_nothing():
    code = "import threading, sys, gemmrl.sandbox; print(threading.active_count(), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "False"]


def test_job_validation_and_closed_pool(tmp_path):
    with pytest.raises(ValueError, match="package.module:function"):
        Job("j", "no_colon")
    with pytest.raises(ValueError, match="timeout_s"):
        Job("j", "m:f", timeout_s=0)
    p = SandboxPool(n_workers=1, scratch_root=tmp_path, env=ENV)
    with pytest.raises(TypeError, match="not picklable"):  # fails in submit, not in a worker
        p.submit(job("double", args=lambda: 1))
    p.close()
    with pytest.raises(RuntimeError, match="closed"):
        p.submit(job("double", 1))


def test_ok_value_and_output_from_python_and_c(pool):
    r = run1(pool, job("echo", {"a": [1, 2.5, "x"]}))
    assert r.status == "ok", r
    assert r.value["value"] == {"a": [1, 2.5, "x"]}
    assert r.worker_pid == r.value["pid"] and r.replaced is False and r.error == ""
    for line in ("python stdout", "python stderr", "fd1 from C level", "fd2 from C level", "libc puts"):
        assert line in r.output, (line, r.output)
    r2 = run1(pool, job("double", 21))
    assert r2.status == "ok" and r2.value["value"] == 42
    assert r2.output == ""  # output is per job


def test_output_is_the_tail(pool):
    r = run1(pool, job("spam", 2000))  # ~100 KB
    assert r.status == "ok"
    assert r.output.startswith("[... ") and len(r.output) < 8300
    assert r.output.rstrip().endswith("line 01999 " + "x" * 40)


def test_scratch_dir_env_and_cwd(pool):
    r = run1(pool, job("where"))
    assert r.status == "ok", r
    scratch = Path(r.value["scratch"])
    assert scratch.parent == pool.scratch_root and scratch.name == f"worker-0-{r.worker_pid}"
    assert Path(r.value["cwd"]) == scratch
    assert Path(r.value["tmp"]).parent == scratch
    for var, path in r.value["env"].items():
        assert Path(path).is_relative_to(scratch), (var, path)
    assert r.value["isolation"] == r.isolation and r.value["worker_index"] == 0


# ------------------------------------------------------------------------------- failure classes


def test_error_keeps_the_worker(pool):
    r = run1(pool, job("raise_value_error"))
    assert r.status == "error" and r.error == "ValueError: planted failure"
    assert "Traceback" in r.output and "raise_value_error" in r.output
    assert r.replaced is False
    nxt = run1(pool, job("double", 2))
    assert nxt.status == "ok" and nxt.worker_pid == r.worker_pid
    assert pool.replaced == 0


@pytest.mark.parametrize("fn, error", [("segfault", "SIGSEGV"), ("kill_self_segv", "SIGSEGV"),
                                       ("abort", "SIGABRT"), ("exit3", "exit code 3")])
def test_crash_replaces_the_worker(pool, fn, error):
    r = run1(pool, job(fn))
    assert r.status == "crash" and r.error == error, r
    assert r.replaced is True
    if fn == "segfault":
        assert "about to segfault" in r.output  # read from the log after the worker died
    nxt = run1(pool, job("double", 5))
    assert nxt.status == "ok" and nxt.value["value"] == 10
    assert nxt.worker_pid != r.worker_pid and nxt.replaced is False
    assert pool.replaced == 1
    assert gone(r.worker_pid)


@pytest.mark.parametrize("fn", ["hang_in_c", "spawn_and_hang"])
def test_timeout_kills_the_process_group(pool, fn):
    t0 = time.monotonic()
    r = run1(pool, job(fn, timeout_s=TIMEOUT_S))
    assert r.status == "timeout" and r.replaced is True, r
    assert TIMEOUT_S <= r.wall_s < TIMEOUT_S + 3 and time.monotonic() - t0 < TIMEOUT_S + 5
    assert gone(r.worker_pid)
    if fn == "spawn_and_hang":
        child = int(r.output.split("child ")[1].split()[0])
        assert gone(child), "the job's child outlived the timeout"
    else:
        assert "hanging" in r.output
    nxt = run1(pool, job("double", 1))
    assert nxt.status == "ok" and nxt.worker_pid != r.worker_pid
    assert pool.replaced == 1


@pytest.mark.parametrize("fn", ["raise_memory_error", "raise_cuda_oom_message", "raise_torch_oom"])
def test_oom(pool, fn):
    r = run1(pool, job(fn, timeout_s=60))
    assert r.status == "oom", r
    assert r.replaced is False
    nxt = run1(pool, job("double", 1))
    assert nxt.status == "ok" and nxt.worker_pid == r.worker_pid


def test_poisoned_cuda_context_replaces_the_worker(pool):
    r = run1(pool, job("poison_cuda"))
    assert r.status == "cuda_fault" and "illegal memory access" in r.error, r
    assert r.replaced is True and gone(r.worker_pid)
    nxt = run1(pool, job("double", 1))
    assert nxt.status == "ok" and nxt.worker_pid != r.worker_pid


def test_job_that_leaves_a_thread_retires_its_worker(pool):
    """A job whose thread is still running when it returns (its value still comes back) retires the worker, so the
    thread cannot run into the next job; a job that joins its threads keeps the worker."""
    r = run1(pool, job("join_thread", 0.05))
    assert r.status == "ok" and r.replaced is False and r.retired == ""
    r = run1(pool, job("leave_thread", 30.0))
    assert r.status == "ok" and r.value["pid"] == r.worker_pid, r
    assert r.replaced is True and "left 1 Python thread(s) running (late-work)" in r.retired
    assert gone(r.worker_pid)  # the thread died with it
    nxt = run1(pool, job("double", 3))
    assert nxt.status == "ok" and nxt.worker_pid != r.worker_pid and nxt.replaced is False
    assert pool.replaced == 1


def test_reply_cannot_run_code_in_the_parent(pool, tmp_path):
    marker = tmp_path / "pwned"
    r = run1(pool, job("return_evil_pickle", str(marker)))
    assert r.status == "error" and "posix.system is not plain data" in r.error, r
    assert not marker.exists()
    r2 = run1(pool, job("return_unpicklable"))
    assert r2.status == "error" and "not picklable" in r2.error
    nxt = run1(pool, job("double", 1))
    assert nxt.status == "ok" and nxt.worker_pid == r.worker_pid


def test_value_types_admit_named_classes_only(tmp_path):
    import datetime

    with SandboxPool(n_workers=1, gpus=(), scratch_root=tmp_path / "a", env=ENV) as p:
        r = run1(p, job("return_timedelta", 3))
    assert r.status == "error" and "datetime.timedelta is not plain data" in r.error, r
    with SandboxPool(n_workers=1, gpus=(), scratch_root=tmp_path / "b", env=ENV, value_types=["datetime:timedelta"]) as p:
        r = run1(p, job("return_timedelta", 3))
    assert r.status == "ok" and r.value == {"t": datetime.timedelta(seconds=3)}, r
    with pytest.raises(ValueError, match="module:Name"):
        SandboxPool(n_workers=1, scratch_root=tmp_path / "c", value_types=["datetime.timedelta"])


def test_worker_that_cannot_start_is_reported(tmp_path):
    with SandboxPool(n_workers=1, scratch_root=tmp_path, env=ENV, start_timeout_s=0.001) as p:
        r = run1(p, job("double", 1))
    assert r.status == "crash" and "did not start" in r.error, r


# ------------------------------------------------------------------------------ pool behaviour


def test_two_workers_run_concurrently_with_their_own_gpu(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    shared = tmp_path / "shared"  # a `writable` dir: both workers may write there
    shared.mkdir()

    def meet(me, other, **kw):
        return job("rendezvous", {"dir": str(shared), "me": me, "other": other, **kw}, me)

    with SandboxPool(gpus=[0, 1], scratch_root=tmp_path / "scratch", env=ENV, writable=[shared]) as p:
        assert p.n_workers == 2
        a, b = p.run([meet("a", "b"), meet("b", "a")])  # each waits up to 10 s for the other to start
        assert a.job_id == "a" and b.job_id == "b"  # input order
        assert a.status == b.status == "ok", (a, b)
        assert a.value["saw_other"] and b.value["saw_other"], "the two jobs did not run at the same time"
        assert {a.gpu, b.gpu} == {0, 1} and a.worker_pid != b.worker_pid
        for r in (a, b):
            assert r.value["gpu"] == r.gpu and r.value["cvd"] == str(r.gpu)
        # "slow" finishes 1 s after "fast" has started: completion order
        order = [r.job_id for r in p.map([meet("slow", "fast", linger=1.0), meet("fast", None)])]
        assert order == ["fast", "slow"]


def test_stream_with_faults(tmp_path):
    faults = {5: ("segfault", "crash"), 13: ("raise_value_error", "error"), 22: ("hang_in_c", "timeout"),
              31: ("exit3", "crash"), 37: ("raise_memory_error", "oom")}
    jobs = [job(faults[i][0], job_id=f"j{i}", timeout_s=TIMEOUT_S if faults[i][1] == "timeout" else 20)
            if i in faults else job("double", i, job_id=f"j{i}") for i in range(40)]
    with SandboxPool(n_workers=2, gpus=(), scratch_root=tmp_path, env=ENV) as p:
        results = list(p.map(jobs))
        assert p.replaced == 3
    by_id = {r.job_id: r for r in results}
    assert len(results) == 40 and set(by_id) == {j.job_id for j in jobs}
    for i in range(40):
        r = by_id[f"j{i}"]
        if i in faults:
            assert r.status == faults[i][1], (i, r)
        else:
            assert r.status == "ok" and r.value["value"] == 2 * i, (i, r)


# ------------------------------------------------------------------------------------- isolation


def _write_job(tmp_path: Path) -> tuple[Job, Path, Path]:
    outside, victim = tmp_path / "outside.txt", tmp_path / "victim.txt"
    victim.write_text("keep")
    return job("write_files", {"outside": str(outside), "victim": str(victim)}), outside, victim


def test_writes_outside_scratch_are_denied(tmp_path):
    j, outside, victim = _write_job(tmp_path)
    with SandboxPool(n_workers=1, gpus=(), scratch_root=tmp_path / "scratch", env=ENV) as p:
        r = run1(p, j)
    assert r.status == "ok", r
    if "filesystem" in r.isolation:
        assert r.isolation.startswith("unisolated: ")
        pytest.skip(f"this platform cannot restrict writes (Landlock): {r.isolation}")
    assert r.value["outside"] == "PermissionError" and not outside.exists()
    assert r.value["remove"] == "PermissionError" and victim.read_text() == "keep"
    assert r.value["inside"] == "hello"  # the scratch dir stays writable, TMPDIR too
    assert Path(r.value["tmpfile"]).is_relative_to(tmp_path / "scratch")


def test_own_proc_dir_stays_writable(pool):
    """CUDA initialization writes beneath /proc/self/task; on an H100 it failed (304) without this rule."""
    r = run1(pool, job("name_thread"))
    assert r.status == "ok" and r.value == "cuda-like", r


def test_network_is_cut_off(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as listener, \
            SandboxPool(n_workers=1, gpus=(), scratch_root=tmp_path, env=ENV) as p:
        r = run1(p, job("connect", listener.getsockname()[1]))
        assert r.status == "ok", r
        if "network" in r.isolation:
            assert r.isolation.startswith("unisolated: ")
            pytest.skip(f"this platform cannot isolate the network: {r.isolation}")
        assert r.value["connect"] != "connected", r.value
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert r.isolation == "isolated"


def test_isolate_false_allows_what_isolation_denies(tmp_path):
    j, outside, victim = _write_job(tmp_path)
    with socket.create_server(("127.0.0.1", 0)) as listener, \
            SandboxPool(n_workers=1, gpus=(), scratch_root=tmp_path / "scratch", env=ENV, isolate=False) as p:
        r = run1(p, j)
        net = run1(p, job("connect", listener.getsockname()[1]))
        listener.settimeout(5)
        conn, _ = listener.accept()  # the connection the job made
        conn.close()
    assert r.status == "ok" and r.isolation == "unisolated: disabled"
    assert r.value["outside"] == "written" and outside.read_text() == "escaped"
    assert r.value["remove"] == "removed" and not victim.exists()
    assert net.value["connect"] == "connected"
