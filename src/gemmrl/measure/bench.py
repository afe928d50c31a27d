"""`gemmrl bench`: vendor baselines (and any imported kernel set) verified, then timed side by side,
interleaved on identical inputs, in the protocols asked for; rows in the results schema.

Per shape: make inputs once; per protocol: measure the problem with core.measure_problem (prepare every
candidate in that protocol, verify what has not been verified with that algorithm, time the verified ones
interleaved, add the aggregate rows, flag times under the roofline floor, re-measure pairs that break the
noise rule's bar) and append the batch to the CSV. A killed sweep resumes at the next unfinished
(shape, protocol). The noise rule's verdict on a results CSV is :func:`noise_rule_below`.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from .core import Verifier, base_row, measure_problem, vendor_baselines
from ..candidate import make_buffers
from ..kernels.cuda_l2_import import load_kernel_dir
from ..problem import GemmProblem
from ..results import Meta, ResultsWriter, collect_meta, git_sha, now, read_rows, sm_clock_mhz
from ..summary import AGGREGATES, BASELINES, format_summary, markdown_summary, summarize
from ..timing import PROTOCOLS, TimingConfig, floor_ms, l2_bytes, without_grad


class BenchError(RuntimeError):
    pass


def require_cuda(device: int = 0) -> None:
    try:
        import torch  # optional dependency: its absence is this check's message
    except ImportError as e:
        raise BenchError("gemmrl bench needs PyTorch with CUDA; install torch first") from e
    if not torch.cuda.is_available():
        raise BenchError("gemmrl bench needs a CUDA GPU, and torch.cuda.is_available() is False here "
                         f"(torch {torch.__version__}). Run it on a machine with an NVIDIA GPU and a CUDA build "
                         "of PyTorch.")
    if device >= torch.cuda.device_count():
        raise BenchError(f"--gpu-device-id {device} does not exist; this machine has {torch.cuda.device_count()} GPU(s)")


@dataclass(frozen=True)
class BenchSpec:
    problems: tuple[GemmProblem, ...]
    protocols: tuple[str, ...]
    out: Path
    cfg: TimingConfig = TimingConfig()
    kernel_dir: str | None = None
    kernel_acc: str = "fp32"
    device: int = 0
    repeat: int = 1
    vendor: bool = True
    extra: tuple[Any, ...] = field(default=(), compare=False)  # factories problem -> [candidates]
    labels: tuple[tuple[str, str], ...] = ()  # (mnk, label): a name for the shape (e.g. the model layer), per row
    # the vendor paths timed (None: all of summary.BASELINES); an aggregate (cublas, ..., vendor_best) is written only
    # where every one of its members that applies was timed, so a row named vendor_best is always the best of all
    baselines: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        bad = [p for p in self.protocols if p not in PROTOCOLS]
        if bad:
            raise BenchError(f"unknown protocol(s) {bad}; use any of {', '.join(PROTOCOLS)}")
        if self.baselines is not None:
            unknown = [b for b in self.baselines if b not in BASELINES]
            if unknown or not self.baselines:
                what = f"unknown {', '.join(unknown)}" if unknown else "none given"
                raise BenchError(f"--baselines {','.join(self.baselines)}: {what}; name any of {', '.join(BASELINES)}")
        if not self.problems:
            raise BenchError("no shapes to measure; pass --mnk, --grid cuda-l2 or --shapes FILE")
        if self.repeat < 1:
            raise BenchError("--repeat must be >= 1")


def _progress(total: int, desc: str):
    try:
        from tqdm import tqdm  # optional dependency: a plain counter without it

        return tqdm(total=total, desc=desc, unit="shape-protocol", dynamic_ncols=True)
    except ImportError:
        class _P:
            def __init__(self):
                self.n = 0

            def update(self, k=1):
                self.n += k
                print(f"{desc}: {self.n}/{total}", flush=True)

            def set_postfix_str(self, s):
                pass

            def close(self):
                pass

        return _P()


def _candidates(problem: GemmProblem, spec: BenchSpec, imported: dict) -> tuple[list, list[dict]]:
    """(runnable candidates, rows for candidates that could not even be built)."""
    cands: list = []
    broken: list[dict] = []
    if spec.vendor:
        cands += vendor_baselines(problem, spec.baselines)
    for factory in spec.extra:
        cands += list(factory(problem))
    if spec.kernel_dir is not None:
        got = imported.get(problem.mnk)
        name = f"import:{Path(spec.kernel_dir).name}"
        if got is None or getattr(got, "missing", False):
            broken.append({"candidate": name, "reason": f"no {problem.mnk}.cu in {spec.kernel_dir}"})
        elif callable(got) and hasattr(got, "layout"):
            cands.append(got)
        else:
            broken.append({"candidate": name, "layout": getattr(got, "layout", ""),
                           "reason": f"build failed: {getattr(got, 'reason', None) or getattr(got, 'message', got)}"[:400]})
    return cands, broken


def _pair_runs(rows: Iterable[dict], cand: str, ref: str):
    """(first, kernels, again) for the pair: ``first`` {key: {name: first-run row}} of ``cand`` and ``ref`` (an
    aggregate's row only where it names its member); ``kernels`` {key: {side: {(layout, algo)}}} of each side's
    members' first runs; ``again`` {key: [{side: tflops}]} one dict per recheck batch (the best member of each side
    timed in that batch). key: (mnk, dtype, acc, protocol)."""
    members = {cand: AGGREGATES.get(cand, (cand,)), ref: AGGREGATES.get(ref, (ref,))}
    first: dict[tuple, dict[str, dict]] = {}
    kernels: dict[tuple, dict[str, set]] = {}
    again: dict[tuple, list[dict[str, float]]] = {}  # one dict per re-measurement batch
    batch: dict[tuple, tuple[str, set]] = {}  # key -> (recheck number, candidates seen) of the batch being read
    for r in rows:
        if r.get("verified") not in ("true", True) or str(r.get("rep", "0") or "0") != "0":
            continue
        key = (r["mnk"], r["dtype"], r["acc"], r["protocol"])
        if r.get("recheck") not in ("", None):
            # Each recheck pair writes its own batches, and several pairs write recheck numbers 1..RECHECKS: a batch
            # is a run of rows with one recheck number in which no candidate repeats. Only members timed in the same
            # batch are compared (taking the best of two batches would favour the side with more members in both).
            k, seen = batch.get(key, (None, set()))
            if k != str(r["recheck"]) or r["candidate"] in seen:
                k, seen = str(r["recheck"]), set()
                again.setdefault(key, []).append({})
            seen.add(r["candidate"])
            batch[key] = (k, seen)
            d = again[key][-1]
            for who, ms in members.items():
                if r["candidate"] in ms:
                    d[who] = max(d.get(who, 0.0), float(r["tflops"]))
        else:
            if r["candidate"] in (cand, ref) and (r["candidate"] not in AGGREGATES or r.get("members")):
                first.setdefault(key, {})[r["candidate"]] = r
            for who, ms in members.items():
                if r["candidate"] in ms and not r.get("members"):
                    kernels.setdefault(key, {}).setdefault(who, set()).add((r.get("layout"), r.get("algo") or None))
    return first, kernels, again


def noise_rule_below(rows: Iterable[dict], cand: str, ref: str, margin: float = 0.0) -> list[tuple[str, str]]:
    """(mnk, protocol) where ``cand`` stays slower than ``ref`` by more than ``margin`` (0.02: 2%) after the
    rechecks (median of the 3).

    ``cand``/``ref`` may be aggregates (their first-run aggregate rows are compared; a recheck compares the
    fastest member of each). Two candidates that ran the same algorithm on the same layout are the same kernel,
    and two aggregates whose members ran the same set of (layout, algorithm) are the same kernels: never counted as
    below (their difference is the noise between two measurements of one kernel)."""
    first, kernels, again = _pair_runs(rows, cand, ref)
    bad = []
    for key, by in first.items():
        if cand not in by or ref not in by or float(by[cand]["tflops"]) >= float(by[ref]["tflops"]) * (1 - margin):
            continue
        if (by[cand].get("layout"), by[cand].get("algo")) == (by[ref].get("layout"), by[ref].get("algo")) \
                and by[cand].get("algo"):
            continue
        ks = kernels.get(key, {})
        if ks.get(cand) and ks.get(cand) == ks.get(ref) and all(a for _, a in ks[cand]):
            continue
        rc = [d for d in again.get(key, []) if cand in d and ref in d]
        if not rc or statistics.median(d[cand] for d in rc) < statistics.median(d[ref] for d in rc) * (1 - margin):
            bad.append((key[0], key[3]))
    return bad


def second_run(rows: Iterable[dict], cand: str = "gemmrl", ref: str = "vendor_best") -> dict[tuple, float]:
    """{(mnk, dtype, acc, protocol): speed of ``cand`` over ``ref``} from the rechecks alone: the median over the
    recheck batches of each side's speed (the member each side won its first run with, re-measured head to head),
    so ``ref``'s winner is chosen on the first run and reported from others (DESIGN: no winner's curse). Only the
    shapes with a first run of both and at least one batch holding both are in it; a bench that rechecks the pair
    at every shape (``core.RECHECK_EVERY``) has them all."""
    first, _, again = _pair_runs(rows, cand, ref)
    out = {}
    for key, by in first.items():
        rc = [d for d in again.get(key, []) if cand in d and ref in d]
        if cand in by and ref in by and rc:
            den = statistics.median(d[ref] for d in rc)
            if den > 0:
                out[key] = statistics.median(d[cand] for d in rc) / den
    return out


@without_grad
def run_bench(spec: BenchSpec, progress: bool = True, *, on_cpu: bool = False,
              verifier: Callable | None = None) -> Path:
    """Measure ``spec`` into ``spec.out`` (resuming a killed run); returns the CSV path.

    ``on_cpu`` runs the host protocols on CPU tensors (the test tier: resume, schema); never a result.
    ``verifier(cand, problem) -> (ok, reason)`` replaces the battery (tests only).
    """
    import torch  # optional dependency, imported on use: importing gemmrl.measure.bench does not need it

    if on_cpu:
        if set(spec.protocols) - {"offline", "server"}:
            raise BenchError("on the CPU only the host protocols (offline, server) run")
        meta_row = Meta("cpu", "", "", "", torch.__version__, "", git_sha()).row()
        dev, l2 = "cpu", None
    else:
        require_cuda(spec.device)
        torch.cuda.set_device(spec.device)
        meta_row = collect_meta(spec.device).row()
        dev, l2 = "cuda", l2_bytes(spec.device)
    writer = ResultsWriter(spec.out)
    imported: dict = {}
    if spec.kernel_dir is not None:
        imported = load_kernel_dir(spec.kernel_dir, list(spec.problems), acc=spec.kernel_acc, progress=progress)
    verifier = verifier or Verifier(dev)
    todo = [(p, proto, rep) for p in spec.problems for rep in range(spec.repeat) for proto in spec.protocols]
    bar = _progress(len(todo), "bench") if progress else None
    current: GemmProblem | None = None
    bufs = cands = broken = None
    for problem, protocol, rep in todo:
        key = (problem.mnk, problem.dtype, problem.acc, protocol, str(rep))
        if key in writer.done:
            if bar:
                bar.update(1)
            continue
        if problem != current:
            bufs = cands = None
            if dev == "cuda":
                torch.cuda.empty_cache()
            bufs = make_buffers(problem, dev, seed=spec.cfg.seed or 0)  # first inputs only: every protocol refills
            cands, broken = _candidates(problem, spec, imported)
            current = problem
        base = base_row(problem, protocol, meta_row, rep, spec.cfg)
        base["sm_clock_mhz"] = sm_clock_mhz(spec.device) if dev == "cuda" else ""
        floor = floor_ms(problem, meta_row["gpu"], protocol, l2) if dev == "cuda" else math.nan
        rows = measure_problem(problem, protocol, cands, bufs, spec.cfg, verifier, floor, base, spec.baselines)
        rows += [{**base, **b, "verified": False, "timestamp": now()} for b in broken]
        label = dict(spec.labels).get(problem.mnk)
        if label:
            for r in rows:
                r["label"] = label
        writer.write_batch(rows)
        if bar:
            best = next((r for r in rows if r["candidate"] == "vendor_best"), None)
            if best:
                bar.set_postfix_str(f"{problem.mnk} {protocol} vendor_best={best['time_ms']:.4g}ms ({best['members']})")
            bar.update(1)
    if bar:
        bar.close()
    return spec.out


def summary_text(csv_path: Path, candidates: Iterable[str] | None = None) -> str:
    rows = read_rows([csv_path])
    return format_summary(summarize(rows, candidates))


def write_summary(csv_path: Path, candidates: Iterable[str] | None = None) -> Path:
    rows = read_rows([csv_path])
    md = Path(str(csv_path)[:-4] + ".summary.md")
    recs = summarize(rows, candidates)
    md.write_text(f"# Summary of {Path(csv_path).name}\n\nSpeedup of each candidate over each baseline "
                  "(per-shape ratio of TFLOPS; verified, timed, first-run rows only).\n\n" + markdown_summary(recs))
    return md
