"""``gemmrl bench --cuda-source FILE.cu``: untrusted CUDA C++ measured through the sandbox pool.

The source is compiled once in this process (nvcc subprocesses, in parallel with nothing on the GPU), then each
shape is one ``evaluate_job`` in a worker of the pool (one per visible GPU, or ``--gpu-device-id``): the worker
verifies the candidate, checks it for serving (CUDA-graph capture on a side stream) and times it beside the
vendor baselines on the same inputs. Whatever the candidate does -- crash, hang, fault, exhaust memory -- costs
only its worker and is recorded: a row with ``verified=false`` and ``reason`` = the failure class and why.
Rows go to the results CSV per shape as they arrive; a killed run resumes at the next unfinished shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .bench import _progress, require_cuda
from .evaluate import CandidateSpec, EvalRequest, outcome
from ..kernels.cuda_source import CudaSource, build_many
from ..kernels.vendor import build_library
from ..paths import cache_dir
from ..problem import GemmProblem
from ..results import ResultsWriter, collect_meta, now
from ..sandbox import Job, SandboxPool
from ..timing import TimingConfig


@dataclass(frozen=True)
class SandboxBenchSpec:
    problems: tuple[GemmProblem, ...]
    sources: tuple[CudaSource, ...]
    protocols: tuple[str, ...]
    out: Path
    timing: TimingConfig = TimingConfig()
    gpus: tuple[int, ...] | None = None
    timeout_s: float = 300.0


def _failure_rows(problem: GemmProblem, src: CudaSource, protocols: Sequence[str], why: str, meta: dict) -> list[dict]:
    return [{"mnk": problem.mnk, "M": problem.M, "N": problem.N, "K": problem.K, "dtype": problem.dtype,
             "acc": problem.acc, "layout": src.layout, "candidate": src.name, "protocol": p, "verified": False,
             "reason": why[:400], "time_ms": math.inf, "timestamp": now(), "rep": 0, "info": "sandbox", **meta}
            for p in protocols]


def run_sandboxed(spec: SandboxBenchSpec, progress: bool = True) -> Path:
    require_cuda((spec.gpus or (0,))[0])
    meta = collect_meta((spec.gpus or (0,))[0]).row()
    writer = ResultsWriter(spec.out)
    todo = [p for p in spec.problems if any((p.mnk, p.dtype, p.acc, proto, "0") not in writer.done
                                             for proto in spec.protocols)]
    build_library()  # workers cannot write the build cache: everything they load is built here first
    ours = [s for s in spec.sources if s.abi == "gemmrl"]
    for s, b in zip(ours, build_many(ours)):
        if not b.ok:
            print(f"{s.name}: build failed: {b.error} (every shape records it)")
    jobs, owner = [], {}
    for p in todo:
        for s in spec.sources:
            jid = f"{p.mnk}|{s.name}"
            owner[jid] = (p, s)
            jobs.append(Job(jid, "gemmrl.measure.evaluate:evaluate_job",
                            EvalRequest(p, CandidateSpec("cuda", s), protocols=spec.protocols, timing=spec.timing),
                            timeout_s=spec.timeout_s))
    bar = _progress(len(jobs), "sandbox") if progress else None
    # a cuda_l2-ABI source is a torch extension built in the worker: its build dirs must be writable there
    writable = (cache_dir("build", "import"), cache_dir("build", "cuda_l2_src")) \
        if any(s.abi == "cuda_l2" for s in spec.sources) else ()
    with SandboxPool(gpus=spec.gpus, writable=writable) as pool:
        for r in pool.map(jobs):
            p, s = owner[r.job_id]
            cls = outcome(r)
            if cls == "ok":
                rows = [dict(x) for x in r.value["rows"]]
                for x in rows:
                    x["info"] = ";".join(v for v in (x.get("info", ""), f"sandbox={r.isolation}") if v)
            else:
                why = (r.value or {}).get("reason") or r.error or ""
                rows = _failure_rows(p, s, spec.protocols, f"{cls}: {why}", meta)
            by_proto: dict[str, list[dict]] = {}
            for x in rows:
                by_proto.setdefault(x["protocol"], []).append(x)
            for proto in spec.protocols:
                writer.write_batch(by_proto.get(proto, []) or
                                   _failure_rows(p, s, (proto,), f"{cls}: no rows", meta))
            if bar:
                bar.set_postfix_str(f"{p.mnk} {s.name}: {cls}")
                bar.update(1)
    if bar:
        bar.close()
    return spec.out
