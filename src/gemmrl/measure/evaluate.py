"""Evaluate one candidate at one problem: build, check the declaration, verify, check serving safety, and time it
beside the vendor baselines (same process, same inputs; measured by core.measure_problem, as in ``gemmrl bench``)
-- the unit of work a sandbox worker runs.

``evaluate(EvalRequest)`` returns plain data (an :class:`Evaluation` as a dict): the build record (ptxas report,
structured compile error), the verdict, the result rows (the results schema, candidate and baselines), the
speedup over ``vendor_best`` per protocol and the reward ``log(t_vendor_best / t_candidate)`` averaged over
the protocols (the geometric mean of the ratios). ``evaluate_job(request, ctx)`` is the same as a
``sandbox.Job`` function: ``Job(fn="gemmrl.measure.evaluate:evaluate_job", args=request)``.

Failure classes, in ``failure`` (empty when the candidate earned its reward):
  ``build``     it did not compile, spilled over the limit, or did not load (``build.error`` says where)
  ``shape``     the problem is outside the candidate's declared shapes (never run)
  ``rejected``  the battery or the serving-safety check (CUDA-graph capture on a side stream) rejected it; for
                a source candidate (``cuda``, ``triton_source``) also the battery at the probe shapes of
                its declaration (``ShapeRange.probes``: tails, half, and its far corners: the largest K, M and
                N it declares, open bounds capped at 16384): one right only at the measured shape is
                ``declared_range``
  ``oom``       it ran out of device memory
  ``error``     anything else it raised
The sandbox adds its own (``crash``, ``timeout``, ``cuda_fault``) when the worker did not survive the job.

Tests: tests/measure/test_evaluate.py (CPU tier, Triton interpreter), tests/test_sandbox_gpu.py (``-m gpu``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from ..candidate import make_buffers
from ..kernels.cuda_source import graph_safety
from ..kernels.registry import family as kernel_family
from ..problem import GemmProblem
from ..results import Meta, collect_meta, git_sha, sm_clock_mhz
from ..summary import BASELINES
from ..timing import TimingConfig, floor_ms, l2_bytes, without_grad
from .core import Verifier, base_row, measure_problem, vendor_baselines


@dataclass(frozen=True)
class CandidateSpec:
    """What to build: ``family`` and its ``payload`` -- a ``CudaSource`` (``cuda``), ``"<config>:<knobs>"``
    (``cutlass``), a Triton config string (``triton``), a ``TritonSource`` (``triton_source``: a Triton kernel
    written by a proposer, ``kernels/triton_source.py``) or a planted Triton kernel's mode (``planted_triton``)."""

    family: str
    payload: Any
    name: str = ""
    layout: str = "tn"

    def __post_init__(self) -> None:
        kernel_family(self.family)  # an unknown family is refused here, naming the known ones

    def label(self) -> str:
        return self.name or getattr(self.payload, "name", "") or f"{self.family}:{self.payload}"

    def make(self, problem: GemmProblem) -> tuple[Any, dict[str, Any]]:
        """(candidate or None, build record). Build failures come back in the record, never raised."""
        return kernel_family(self.family).build(self.payload, problem.with_(layout=self.layout), self.name or None)


@dataclass(frozen=True)
class EvalRequest:
    problem: GemmProblem
    candidate: CandidateSpec
    protocols: tuple[str, ...] = ("graph", "cold")
    baselines: tuple[str, ...] | None = None   # vendor candidate names; None: all seven; (): none
    timing: TimingConfig = TimingConfig(graph_min_work_ms=1.0, graph_replays=10, graph_min_timed_ms=20.0,
                                        cold_calls=15, settle_ms=30.0, settle_max_ms=300.0)
    graph_check: bool = True
    device: str = "cuda"
    seed: int = 0


@dataclass(frozen=True)
class Evaluation:
    mnk: str
    candidate: str
    failure: str = ""
    reason: str = ""
    build: dict = field(default_factory=dict)
    graph_safe: bool | None = None
    speedup: dict = field(default_factory=dict)
    reward: float = math.nan
    rows: tuple = ()

    def record(self) -> dict[str, Any]:
        """Plain data (dicts, lists, str, numbers): what a sandbox reply may carry."""
        return _plain({k: getattr(self, k) for k in self.__dataclass_fields__})


def _plain(v: Any) -> Any:
    """Plain Python data (what a sandbox reply may carry): str subclasses such as torch's TorchVersion become
    str, numpy and torch scalars become int/float, containers are converted member by member."""
    if v is None or type(v) in (bool, int, float, str, bytes):
        return v
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return (tuple if isinstance(v, tuple) else list)(_plain(x) for x in v)
    if isinstance(v, (str, int, float)):
        return type(v).__mro__[-2](v)  # the builtin base of a subclass
    if hasattr(v, "item"):
        return _plain(v.item())
    return str(v)


_OOM = ("out of memory", "cudaerrormemoryallocation", "can't allocate memory", "cannot allocate memory",
        "memoryerror", "outofmemoryerror")


def _classify(text: str) -> str:
    low = text.lower()
    return "oom" if any(w in low for w in _OOM) else "error"


def _declared_range(spec: CandidateSpec, req: "GroupRequest", verifier) -> str:
    """'' when a source candidate also passes the battery at the probe shapes of its declaration, else why not:
    on a GPU all of them (``ShapeRange.probes``: tails, half, the far corners of the declaration and their odd
    tails); on the CPU tier, where the Triton interpreter runs every program and loop step in Python (a 32x32x16
    tile kernel takes ~18 s through the battery at 1_1_16384 or 16384_1_1), tails, half and the longest K."""
    p = req.problem
    cpu = {} if req.device == "cuda" else dict(corners="K", odd_tails=False)
    for m, n, k in spec.payload.shapes.probes(p.M, p.N, p.K, **cpu):
        q = replace(p, M=m, N=n, K=k)
        where = f"declared_range: at {q.mnk}, inside its declared shapes {spec.payload.shapes}"
        try:
            cand, build = spec.make(q)
            if cand is None:
                return f"{where}, it did not build: {build.get('error', {}).get('message', '')}"[:400]
            cand.prepare(q, make_buffers(q, req.device, seed=req.seed), req.protocols[0], None)
        except Exception as e:  # noqa: BLE001 - any failure there is the candidate's
            return f"{where}: {type(e).__name__}: {e}"[:400]
        ok, why = verifier(cand, q)
        if not ok:
            return f"{where} (verified at {p.mnk}), it fails: {why}"[:400]
    return ""


@dataclass(frozen=True)
class GroupRequest:
    """Several candidates at one problem, timed together beside one measurement of the baselines: the tuning
    loop's unit of work (a group of proposals for a shape). Fields as in :class:`EvalRequest`."""

    problem: GemmProblem
    candidates: tuple[CandidateSpec, ...]
    protocols: tuple[str, ...] = ("graph", "cold")
    baselines: tuple[str, ...] | None = None
    timing: TimingConfig = EvalRequest.timing
    graph_check: bool = True
    device: str = "cuda"
    seed: int = 0

    @staticmethod
    def of(req: EvalRequest) -> "GroupRequest":
        return GroupRequest(req.problem, (req.candidate,), req.protocols, req.baselines, req.timing, req.graph_check,
                            req.device, req.seed)


def evaluate(req: EvalRequest) -> dict[str, Any]:
    """Build, verify, check and time ``req.candidate`` at ``req.problem`` beside the vendor baselines."""
    got = evaluate_group(GroupRequest.of(req))
    return {**got["evaluations"][0], "rows": tuple(got["rows"])}


def _prepared(spec: CandidateSpec, req: GroupRequest, bufs, verifier) -> tuple[Any, dict[str, Any]]:
    """(candidate ready to time or None, the evaluation fields so far)."""
    problem = req.problem
    ev: dict[str, Any] = dict(mnk=problem.mnk, candidate=spec.label())
    try:
        cand, build = spec.make(problem)
    except Exception as e:  # noqa: BLE001 - a candidate that cannot even be made is a failure record
        return None, {**ev, "failure": "build", "reason": f"{type(e).__name__}: {e}"[:400]}
    if cand is None:
        err = build.get("error", {})
        stage = err.get("stage", "build")
        return None, {**ev, "failure": "shape" if stage == "shape" else "build", "build": build,
                      "reason": f"{stage}: {err.get('message', '')}"[:400]}
    if spec.name:
        cand.name = spec.name
    ev.update(candidate=cand.name, build=build)
    try:
        cand.prepare(problem, bufs, req.protocols[0], None)
    except Exception as e:  # noqa: BLE001
        msg = f"prepare failed: {type(e).__name__}: {e}"[:400]
        return None, {**ev, "failure": _classify(msg), "reason": msg}
    ok, why = verifier(cand, problem)
    if ok and kernel_family(spec.family).declared:  # a source verified across the shapes it declares
        why = _declared_range(spec, req, verifier)
        ok = not why
    if not ok:
        return None, {**ev, "failure": "oom" if _classify(why) == "oom" else "rejected", "reason": why}
    if req.graph_check and req.device == "cuda":
        safe, gwhy = graph_safety(cand, bufs)
        ev["graph_safe"] = safe
        if not safe:
            return None, {**ev, "failure": "rejected", "reason": f"serving: {gwhy}"}
    return cand, ev


@without_grad
def evaluate_group(req: GroupRequest) -> dict[str, Any]:
    """Every candidate of ``req`` made, verified and checked one by one (a failure is that candidate's record),
    then the survivors timed together, interleaved with the baselines, per protocol. Returns plain data:
    ``evaluations`` (one record per candidate, in order, without rows), ``rows`` (every result row of the
    measurement: candidates, baselines, aggregates) and ``wall_s`` (the job's wall time on the device)."""
    import torch  # optional dependency, imported on use: CandidateSpec and the requests are used without it

    t0 = time.perf_counter()
    problem = req.problem
    cuda = req.device == "cuda"
    bufs = make_buffers(problem, req.device, seed=req.seed)
    verifier = Verifier(req.device)
    live, evs = [], []
    for spec in req.candidates:
        cand, ev = _prepared(spec, req, bufs, verifier)
        evs.append(ev)
        if cand is not None:
            if any(c.name == cand.name for c, _ in live):
                ev.update(failure="error", reason=f"duplicate candidate name {cand.name!r} in one group")
                continue
            live.append((cand, ev))
    rows: list[dict] = []
    if live:
        cands = [c for c, _ in live]
        if req.baselines != ():
            cands += vendor_baselines(problem, req.baselines)
        meta = (collect_meta(torch.cuda.current_device()).row() if cuda
                else Meta("cpu", "", "", "", torch.__version__, "", git_sha()).row())
        l2 = l2_bytes(torch.cuda.current_device()) if cuda else None
        for protocol in req.protocols:
            base = base_row(problem, protocol, meta, 0, req.timing)
            base["sm_clock_mhz"] = sm_clock_mhz(torch.cuda.current_device()) if cuda else ""
            floor = floor_ms(problem, meta["gpu"], protocol, l2) if cuda else math.nan
            got = measure_problem(problem, protocol, cands, bufs, req.timing, verifier, floor, base)
            for r in got:
                r["sandbox"] = "1"
            rows += got
            best = next((r for r in got if r["candidate"] == "vendor_best"), None)
            for cand, ev in live:
                mine = next((r for r in got if r["candidate"] == cand.name and r.get("verified")
                             and not r.get("recheck")), None)
                if mine is None:
                    bad = next((r for r in got if r["candidate"] == cand.name), {})
                    ev.setdefault("failure", "rejected" if bad.get("reason") else "error")
                    ev.setdefault("reason", str(bad.get("reason", "not timed"))[:400])
                elif best and math.isfinite(mine.get("time_ms", math.inf)):
                    ev.setdefault("speedup", {})[protocol] = best["time_ms"] / mine["time_ms"]
        for _, ev in live:
            sp = ev.get("speedup", {})
            if not ev.get("failure") and sp:
                ev["reward"] = math.fsum(math.log(s) for s in sp.values()) / len(sp)
    del bufs
    return _plain({"evaluations": [Evaluation(**ev).record() for ev in evs], "rows": rows,
                   "wall_s": time.perf_counter() - t0})


def environment_failures(rows: Sequence[dict]) -> dict[str, str]:
    """Vendor baselines among ``rows`` that could not run for a reason of the machine rather than of the problem
    (their library failed to build or load, a directory they needed was not writable ...): {name: reason}. A
    ``VendorError`` at prepare (a path that does not take this problem, e.g. torch with acc fp16) is not one. A
    reward measured without such a baseline is not against vendor_best, so the tuning loop stops on any."""
    out: dict[str, str] = {}
    for r in rows:
        why = str(r.get("reason") or "")
        if (r.get("candidate") in BASELINES and str(r.get("verified")).lower() not in ("true", "1")
                and why.startswith("prepare failed:") and not why.startswith("prepare failed: VendorError")):
            out.setdefault(str(r["candidate"]), why)
    return out


def evaluate_job(req: EvalRequest, ctx: Any = None) -> dict[str, Any]:
    """The sandbox job: ``evaluate`` in a worker (its CUDA context, its scratch directory)."""
    return evaluate(req)


def evaluate_group_job(req: GroupRequest, ctx: Any = None) -> dict[str, Any]:
    """The sandbox job of the tuning loop: ``evaluate_group`` in a worker."""
    return evaluate_group(req)


def outcome(result: Any) -> str:
    """One failure class for a sandbox ``JobResult`` of ``evaluate_job``: the sandbox's own status when the job
    did not come back (crash, timeout, cuda_fault, oom, error), else the evaluation's ``failure`` or ``ok``."""
    if result.status != "ok":
        return result.status
    return (result.value or {}).get("failure") or "ok"
