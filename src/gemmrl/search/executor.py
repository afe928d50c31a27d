"""Where the tuning loop's candidates run: ``submit(problem, specs)`` returns a future of a :class:`GroupResult`.

* :class:`SandboxExecutor` -- the local pool of sandboxed workers (``sandbox.SandboxPool``), one per visible GPU.
  A group whose worker died (crash, timeout, CUDA fault) is split and each of its candidates re-run alone, so the
  faulty one is named and the others keep their results.
* :class:`InlineExecutor` -- ``evaluate_group`` in this process (tests on the CPU tier, the Triton interpreter).
* :class:`ModelExecutor` -- no GPU at all: times are the analytic cost model's, with seeded log-normal noise, and
  the vendor reference is the model's time of a fixed set of vendor-like tiles. What CI runs the loop against.
* ``replay.TableExecutor`` -- measured H100 screens replayed (policy training and the search-efficiency table).

The distributed issue adds a Dask executor with the same interface.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from ..kernels import cutlass_sm90
from ..kernels.toolchain import arch_for
from ..kernels.registry import family
from ..kernels.vendor import prebuild_for
from ..measure.evaluate import CandidateSpec, GroupRequest, evaluate_group
from ..problem import GemmProblem
from ..sandbox import Job, SandboxPool
from .costmodel import ESTIMATES, estimate, estimate_cutlass, estimate_spec, prune


@dataclass(frozen=True)
class GroupResult:
    """One group's evaluations (records of ``evaluate.Evaluation``, in the order of the specs), its result rows,
    the device seconds it took, and where it ran."""

    problem: GemmProblem
    evaluations: tuple[dict, ...]
    rows: tuple[dict, ...] = ()
    gpu_s: float = 0.0
    worker: str = ""
    isolation: str = ""


class Executor(Protocol):
    slots: int   # groups it runs at once (GPUs)

    def submit(self, problem: GemmProblem, specs: Sequence[CandidateSpec]) -> "Future[GroupResult]": ...

    def close(self) -> None: ...


def failed_record(problem: GemmProblem, spec: CandidateSpec, failure: str, reason: str, output: str = "") -> dict:
    return {"mnk": problem.mnk, "candidate": spec.label(), "failure": failure, "reason": reason[:400],
            "build": {}, "graph_safe": None, "speedup": {}, "reward": math.nan, "rows": (), "output": output[-2000:]}


@dataclass(frozen=True)
class RequestTemplate:
    """Everything of a ``GroupRequest`` but the problem and candidates."""

    protocols: tuple[str, ...] = ("graph", "cold")
    baselines: tuple[str, ...] | None = None
    timing: Any = None
    graph_check: bool = True
    device: str = "cuda"
    seed: int = 0

    def request(self, problem: GemmProblem, specs: Sequence[CandidateSpec]) -> GroupRequest:
        kw = {} if self.timing is None else {"timing": self.timing}
        return GroupRequest(problem, tuple(specs), self.protocols, self.baselines, graph_check=self.graph_check,
                            device=self.device, seed=self.seed, **kw)


class InlineExecutor:
    """``evaluate_group`` in this process, one group at a time (no isolation: for trusted candidates and tests)."""

    slots = 1

    def __init__(self, template: RequestTemplate = RequestTemplate()):
        self.template = template

    def submit(self, problem: GemmProblem, specs: Sequence[CandidateSpec]) -> "Future[GroupResult]":
        fut: Future = Future()
        try:
            got = evaluate_group(self.template.request(problem, specs))
            fut.set_result(GroupResult(problem, tuple(got["evaluations"]), tuple(got["rows"]), got["wall_s"],
                                       "inline", "unisolated: in-process"))
        except BaseException as e:  # noqa: BLE001 - the loop records it
            fut.set_exception(e)
        return fut

    def close(self) -> None:
        pass


class SandboxExecutor:
    """Groups as ``evaluate_group_job`` jobs on a ``SandboxPool`` (one worker per GPU)."""

    def __init__(self, pool: Any = None, template: RequestTemplate = RequestTemplate(), timeout_s: float = 600.0,
                 **pool_kw: Any):
        self.pool = pool if pool is not None else SandboxPool(**pool_kw)
        self.template = template
        self.timeout_s = timeout_s
        self.slots = max(1, len(getattr(self.pool, "workers", ())) or getattr(self.pool, "n_workers", 1) or 1)
        self._ids = itertools.count()

    def _job(self, problem: GemmProblem, specs: Sequence[CandidateSpec]):
        return Job(f"group-{next(self._ids)}-{problem.mnk}", "gemmrl.measure.evaluate:evaluate_group_job",
                   self.template.request(problem, specs), self.timeout_s)

    def submit(self, problem: GemmProblem, specs: Sequence[CandidateSpec]) -> "Future[GroupResult]":
        out: Future = Future()
        first = self.pool.submit(self._job(problem, specs))
        first.add_done_callback(lambda f: self._first_done(f, problem, list(specs), out))
        return out

    def _first_done(self, f: Future, problem: GemmProblem, specs: list[CandidateSpec], out: Future) -> None:
        try:
            res = f.result()
        except BaseException as e:  # noqa: BLE001
            out.set_exception(e)
            return
        if res.status == "ok":
            v = res.value
            out.set_result(GroupResult(problem, tuple(v["evaluations"]), tuple(v["rows"]), res.wall_s,
                                       f"pid {res.worker_pid} gpu {res.gpu}", res.isolation))
            return
        if len(specs) == 1:
            rec = failed_record(problem, specs[0], res.status, res.error or res.status, res.output or "")
            out.set_result(GroupResult(problem, (rec,), (), res.wall_s, f"pid {res.worker_pid} gpu {res.gpu}",
                                       res.isolation))
            return
        # the worker did not survive the group: run each candidate alone to name the culprit and keep the rest
        parts = [self.submit(problem, [s]) for s in specs]
        lock, left = threading.Lock(), [len(parts)]

        def part_done(_):
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            try:
                got = [p.result() for p in parts]
            except BaseException as e:  # noqa: BLE001
                out.set_exception(e)
                return
            out.set_result(GroupResult(problem, tuple(g.evaluations[0] for g in got),
                                       tuple(r for g in got for r in g.rows), res.wall_s + sum(g.gpu_s for g in got),
                                       ",".join(sorted({g.worker for g in got})), got[0].isolation))

        for p in parts:
            p.add_done_callback(part_done)

    def close(self) -> None:
        self.pool.close()


# -- the analytic environment -------------------------------------------------------------------------------
@dataclass
class ModelExecutor:
    """Times from the analytic cost model, so the whole loop runs with no GPU (CI, tests, dry runs). Each config's
    time at a shape is the model's estimate times a log-normal factor fixed by (seed, shape, config) -- a noisy but
    repeatable world whose optimum the model alone does not know -- plus measurement noise per call. The vendor
    reference is the model's own estimate of its best Triton config and CUTLASS family config (layout tn), so speedups sit
    around 1 and only the world's deviations from the model are there to find. ``gpu_s`` charges each candidate what timing
    it would cost: 2 protocols x (50 calls of its time + 2 ms of fixed overhead)."""

    seed: int = 0
    world_sigma: float = 0.25
    noise_sigma: float = 0.02
    slots: int = 1
    calls: int = 0
    _rng: random.Random = field(default_factory=lambda: random.Random(0))
    _vendor: dict = field(default_factory=dict)

    def model_time(self, problem: GemmProblem, spec: CandidateSpec) -> float:
        t = estimate_spec(spec, problem)
        h = random.Random(f"{self.seed}|{problem.mnk}|{problem.dtype}|{spec.family}|{spec.layout}|{spec.payload}")
        return t * math.exp(h.gauss(0.0, self.world_sigma))

    def vendor_time(self, problem: GemmProblem) -> float:
        key = (problem.M, problem.N, problem.K, problem.dtype, problem.acc)
        if key not in self._vendor:
            pl, cs = problem.with_(layout="tn"), cutlass_sm90
            ts = [estimate(prune(pl, 1)[0], pl).seconds]
            ts += [estimate_cutlass(c, k, pl).seconds for c, k in cs.screen_entries(pl, cs.family("tn", problem.dtype))]
            self._vendor[key] = min(ts)
        return self._vendor[key]

    def submit(self, problem: GemmProblem, specs: Sequence[CandidateSpec]) -> "Future[GroupResult]":
        fut: Future = Future()
        evs, gpu_s = [], 0.0
        tv = self.vendor_time(problem)
        for s in specs:
            self.calls += 1
            if s.family not in ESTIMATES:
                evs.append(failed_record(problem, s, "error", f"the model executor times configs only, not {s.family}"))
                continue
            if not _valid(s, problem):
                evs.append(failed_record(problem, s, "build", "invalid config for this problem"))
                continue
            try:
                t = self.model_time(problem, s)
            except ValueError as e:
                evs.append(failed_record(problem, s, "build", str(e)))
                continue
            sp = {p: tv / (t * math.exp(self._rng.gauss(0.0, self.noise_sigma))) for p in ("graph", "cold")}
            gpu_s += 2 * (50 * t + 2e-3)
            evs.append({"mnk": problem.mnk, "candidate": s.label(), "failure": "", "reason": "", "build": {},
                        "graph_safe": True, "speedup": sp, "reward": sum(math.log(x) for x in sp.values()) / 2,
                        "rows": ()})
        fut.set_result(GroupResult(problem, tuple(evs), (), gpu_s, "model", "model"))
        return fut

    def close(self) -> None:
        pass


def _valid(spec: CandidateSpec, problem: GemmProblem) -> bool:
    """The family's validity predicate (on an H100-class GPU) at the spec's layout; False for an unreadable config."""
    fam = family(spec.family)
    try:
        return bool(fam.valid(fam.parse(str(spec.payload)), problem.with_(layout=spec.layout))[0])
    except ValueError:
        return False


class PrebuildExecutor:
    """Builds the compiled candidates of a group (CUTLASS configs, CUDA sources) in this process, in parallel
    threads running nvcc, before handing the group to ``inner``: the workers then find the objects in the build
    cache, and compile time never counts as device time. Triton kernels compile in the worker (seconds)."""

    def __init__(self, inner: Any, jobs: int | None = None):
        self.inner = inner
        self.slots = inner.slots
        self.template = getattr(inner, "template", None)
        self._pool = ThreadPoolExecutor(max_workers=jobs or max(1, (os.cpu_count() or 2) - 1))
        self.vendor_note: str | None = None
        self._vendor_done = False

    def prebuild_vendor(self) -> None:
        """vendor_blas.so built here once, before the first group (the sandboxed workers cannot write the build
        cache: on a fresh machine every cuBLAS baseline failed with PermissionError)."""
        if self._vendor_done:
            return
        self._vendor_done = True
        if self.template is not None and getattr(self.template, "device", "cuda") == "cuda":
            self.vendor_note = prebuild_for(getattr(self.template, "baselines", None))

    def prebuild(self, specs: Sequence[CandidateSpec]) -> None:
        todo = [(family(s.family).prebuild, s.payload) for s in specs if family(s.family).prebuild is not None]
        if not todo:
            return   # nothing to compile here (and no GPU needed to name the arch)
        arch = arch_for()
        futs = [self._pool.submit(build, payload, arch) for build, payload in todo]
        for f in futs:
            try:
                f.result()
            except Exception:  # noqa: BLE001 - the worker's own build reports the failure in its record
                pass

    def submit(self, problem: GemmProblem, specs: Sequence[CandidateSpec]) -> "Future[GroupResult]":
        self.prebuild_vendor()
        self.prebuild(specs)
        return self.inner.submit(problem, specs)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.inner.close()
