"""The tuning loop on Dask distributed (search/dask_executor.py, gemmrl worker): a real scheduler and three CPU workers
on loopback, one killed mid-run; every candidate ends in the trials store exactly once."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

distributed = pytest.importorskip("distributed")

from gemmrl.measure.evaluate import CandidateSpec  # noqa: E402
from gemmrl.library import TrialsStore  # noqa: E402
from gemmrl.problem import GemmProblem  # noqa: E402
from gemmrl.search.dask_executor import DaskExecutor, model_resource  # noqa: E402
from gemmrl.search.executor import RequestTemplate  # noqa: E402
from gemmrl.search.loop import Tuner, TuneSpec  # noqa: E402
from gemmrl.search.proposer import Proposal  # noqa: E402
from gemmrl.timing import TimingConfig  # noqa: E402

CPU = RequestTemplate(protocols=("offline",), baselines=(), graph_check=False, device="cpu",
                      timing=TimingConfig(warmup_s=0.0, benchmark_s=0.05))
CONFIGS = ["tiled(BM=16,BN=16,BK=16,warps=1,stages=2,group_m=1)", "tiled(BM=16,BN=32,BK=16,warps=1,stages=2,group_m=1)"]


class Fixed:
    name = "fixed"

    def __init__(self, specs):
        self.specs = specs

    def propose(self, ctx, k, rng=None):
        tried = ctx.tried()
        return [p for p in (Proposal(s, "fixed") for s in self.specs) if p.key not in tried][:k]

    def update(self, ctx, outcomes):
        pass


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(procs) -> None:
    """SIGTERM each process still running, then wait for it (SIGKILL after 20 s)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


def _scheduler(port: int, tmp_path, env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                             "--port", str(port), "--no-dashboard"], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"scheduler-{time.time()}.log", "w"))


@pytest.fixture()
def cluster(tmp_path):
    """A Dask scheduler and three `gemmrl worker --cpu` processes on loopback; yields (address, worker procs)."""
    port = _port()
    addr = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "TRITON_INTERPRET": "1", "GEMMRL_CACHE_DIR": str(tmp_path / "cache"),
           "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "3"}
    sched = _scheduler(port, tmp_path, env)
    workers = [subprocess.Popen([sys.executable, "-m", "gemmrl.cli", "worker", "--cpu", "--scheduler", addr,
                                 "--host", "127.0.0.1", "--name", f"cpu|w{i}|cpu"], env=env, cwd=tmp_path,
                                stdout=open(tmp_path / f"worker{i}.log", "w"), stderr=subprocess.STDOUT)
               for i in range(3)]
    try:
        from distributed import Client

        deadline = time.time() + 120
        with Client(addr, timeout="60s") as c:
            while len(c.scheduler_info(n_workers=-1)["workers"]) < 3:
                assert time.time() < deadline, "workers did not connect: " + (tmp_path / "worker0.log").read_text()[-2000:]
                time.sleep(0.5)
        yield addr, workers
    finally:
        _stop(workers + [sched])


def test_model_resource_names():
    assert model_resource("NVIDIA H100 80GB HBM3") == "MODEL-NVIDIA_H100_80GB_HBM3"
    assert model_resource("cpu") == "MODEL-cpu"


@pytest.mark.interpreter
def test_three_workers_one_killed_every_candidate_stored_once(cluster, tmp_path):
    addr, workers = cluster
    shapes = tuple(GemmProblem(m, n, k, layout="nn") for m, n, k in
                   [(16, 16, 16), (16, 32, 16), (32, 16, 32), (17, 33, 16), (32, 32, 32), (48, 16, 16), (16, 48, 32),
                    (33, 17, 48), (64, 16, 16), (16, 64, 16), (40, 40, 16), (24, 56, 32)])
    specs = [CandidateSpec("triton", c, layout="nn") for c in CONFIGS]
    store = TrialsStore(tmp_path / "trials.sqlite")
    ex = DaskExecutor(addr, "inline", CPU, timeout_s=300)
    assert ex.gpu_model == "cpu" and ex.slots == 3
    killed = {}

    def on_group(mnk, outs):
        if not killed and len(store.outcomes()) >= 6:
            victim = workers[1]
            victim.send_signal(signal.SIGKILL)   # a host lost mid-run: its in-flight group is re-run elsewhere
            killed["after"] = len(store.outcomes())

    try:
        rep = Tuner(TuneSpec(shapes, group=2, rounds=1, run="dask", gpu="cpu"), [Fixed(specs)], ex, store,
                    on_group=on_group, progress=False).run()
    finally:
        ex.close()
    outs = store.outcomes(gpu="cpu")
    assert killed and workers[1].poll() is not None
    assert rep.groups == len(shapes) and len(outs) == 2 * len(shapes), rep
    assert len({(o["mnk"], o["key"]) for o in outs}) == len(outs)          # each candidate exactly once
    assert {o["verdict"] for o in outs} == {"ok"}, {o["verdict"]: json.loads(o["record"])["reason"] for o in outs}
    hosts = {o["worker"].split()[0] for o in outs}
    assert len(hosts) >= 2                                                  # the work was spread
    print(f"\ndask: {len(shapes)} groups, {len(outs)} candidates stored once each; worker 1 killed after "
          f"{killed['after']} outcomes; groups per worker process: "
          f"{ {h: sum(1 for o in outs if o['worker'].startswith(h)) // 2 for h in sorted(hosts)} }")


@pytest.mark.interpreter
def test_a_retried_group_is_not_stored_twice(cluster, tmp_path):
    """The same group's result arriving twice (a retry after a lost reply) adds nothing the second time."""
    addr, _ = cluster
    store = TrialsStore(tmp_path / "t.sqlite")
    ex = DaskExecutor(addr, "inline", CPU, timeout_s=300)
    p = GemmProblem(16, 16, 16, layout="nn")
    props = [Proposal(CandidateSpec("triton", CONFIGS[0], layout="nn"), "fixed")]
    try:
        t = Tuner(TuneSpec((p,), group=1, rounds=1, run="r", gpu="cpu"), [Fixed([])], ex, store, progress=False)
        res = ex.submit(p, [props[0].spec]).result(timeout=300)
        t._record(p, [(t.proposers[0], props[0])], res, "g1")
        t._record(p, [(t.proposers[0], props[0])], res, "g1-retry")
    finally:
        ex.close()
    assert len(store.outcomes()) == 1


def test_tune_cli_refuses_an_unreachable_scheduler(tmp_path):
    env = {**os.environ, "GEMMRL_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "gemmrl.cli", "tune", "--mnk", "64_64_64", "--scheduler",
                        f"tcp://127.0.0.1:{_port()}", "--no-progress"], env=env, capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 2 and "--scheduler" in r.stderr, r.stderr


def test_worker_cli_checks_its_arguments(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gemmrl.cli", "worker", "--scheduler", "localhost:8786", "--cpu"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "tcp://" in r.stderr


def test_worker_gives_up_on_a_scheduler_that_never_answers(tmp_path):
    """A Dask worker waits for its scheduler forever; gemmrl worker says it cannot reach it after --connect-s."""
    env = {**os.environ, "GEMMRL_CACHE_DIR": str(tmp_path / "cache")}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "gemmrl.cli", "worker", "--scheduler", f"tcp://127.0.0.1:{_port()}",
                        "--cpu", "--no-warmup", "--connect-s", "3"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "cannot reach the scheduler" in r.stderr and "--connect-s" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 60
    r = subprocess.run([sys.executable, "-m", "gemmrl.cli", "worker", "--scheduler", "tcp://127.0.0.1:1", "--cpu",
                        "--connect-s", "0"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--connect-s must be > 0" in r.stderr, r.stderr


@pytest.mark.interpreter
def test_a_scheduler_restart_loses_nothing_stored(tmp_path):
    """The scheduler is killed mid-run and started again at the same address: the workers (warm sandboxes kept)
    and the tuner's client rejoin it, the groups in flight are submitted again, and every candidate ends in the
    trials store exactly once, in sandboxed workers that warmed up before joining."""
    port = _port()
    addr = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "TRITON_INTERPRET": "1", "GEMMRL_CACHE_DIR": str(tmp_path / "cache")}
    sched = _scheduler(port, tmp_path, env)
    workers = [subprocess.Popen([sys.executable, "-m", "gemmrl.cli", "worker", "--cpu", "--scheduler", addr,
                                 "--host", "127.0.0.1", "--name", f"cpu|r{i}|cpu", "--reconnect-s", "120"],
                                env=env, cwd=tmp_path, stdout=open(tmp_path / f"rworker{i}.log", "w"),
                                stderr=subprocess.STDOUT) for i in range(2)]
    shapes = tuple(GemmProblem(m, n, k, layout="nn") for m, n, k in
                   [(16, 16, 16), (16, 32, 16), (32, 16, 32), (17, 33, 16), (32, 32, 32), (48, 16, 16), (16, 48, 32),
                    (33, 17, 48), (64, 16, 16), (16, 64, 16)])
    specs = [CandidateSpec("triton", c, layout="nn") for c in CONFIGS]
    store = TrialsStore(tmp_path / "trials.sqlite")
    restarted = {}
    procs = [sched, *workers]
    try:
        from distributed import Client

        deadline = time.time() + 180
        with Client(addr, timeout="60s") as c:
            while len(c.scheduler_info(n_workers=-1)["workers"]) < 2:
                assert time.time() < deadline, (tmp_path / "rworker0.log").read_text()[-2000:]
                time.sleep(0.5)
        for i in range(2):
            assert "sandbox warm in" in (tmp_path / f"rworker{i}.log").read_text()
            assert "(ok)" in (tmp_path / f"rworker{i}.log").read_text(), (tmp_path / f"rworker{i}.log").read_text()
        ex = DaskExecutor(addr, "sandbox", CPU, timeout_s=300, shared_triton=True, reconnect_s=120)

        def on_group(mnk, outs):
            if not restarted and len(store.outcomes()) >= 4:
                restarted["after"] = len(store.outcomes())
                sched.send_signal(signal.SIGKILL)
                sched.wait()
                procs.append(_scheduler(port, tmp_path, env))

        try:
            rep = Tuner(TuneSpec(shapes, group=2, rounds=1, run="restart", gpu="cpu"), [Fixed(specs)], ex, store,
                        on_group=on_group, progress=False).run()
        finally:
            ex.close()
        outs = store.outcomes(gpu="cpu")
        assert restarted and all(w.poll() is None for w in workers), "the workers should have rejoined"
        assert rep.groups == len(shapes) and len(outs) == 2 * len(shapes), rep
        assert len({(o["mnk"], o["key"]) for o in outs}) == len(outs)
        assert {o["verdict"] for o in outs} == {"ok"}
        assert any("rejoining" in (tmp_path / f"rworker{i}.log").read_text() for i in range(2))
        print(f"\ndask restart: scheduler killed after {restarted['after']} outcomes and restarted; {len(outs)} "
              f"candidates stored once each; groups submitted again: {ex.resubmitted}")
    finally:
        _stop(procs)
