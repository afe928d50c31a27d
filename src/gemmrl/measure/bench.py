"""`gemmrl bench`: vendor baselines (and any imported kernel set) verified, then timed side by side,
interleaved on identical inputs, in the protocols asked for; rows in the results schema.

Per shape: make inputs once; per protocol: prepare every candidate in that protocol (cuBLASLt
autotuning selects its algorithm in the protocol it is then measured in), verify what has not been
verified with that algorithm (an unverified candidate is reported with its reason and not timed),
time the verified ones interleaved, add the aggregate rows (cublas, cublaslt_heuristic,
cublaslt_autotuned, vendor_best), flag times under the roofline floor, re-measure pairs that break the
noise rule's bar, and append the batch to the CSV. A killed sweep resumes at the next unfinished
(shape, protocol).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from ..candidate import make_buffers
from ..problem import GemmProblem
from ..results import Meta, ResultsWriter, collect_meta, git_sha, now, read_rows, sm_clock_mhz
from ..summary import AGGREGATES, BASELINES, format_summary, markdown_summary, summarize
from ..timing import PROTOCOLS, TimingConfig, below_floor, floor_ms, l2_bytes, make_timer, measure, without_grad

# (slower-suspect, reference) aggregates: re-measured 3 more times when the first is slower (noise rule).
# ``gemmrl`` (what the dispatcher serves) is re-measured when more than RECHECK_MARGIN slower than vendor_best: the
# serving bar is "never slower by more than 2%" (noise rule).
RECHECK_PAIRS = (("cublaslt_autotuned", "cublaslt_heuristic"), ("gemmrl", "vendor_best"))
RECHECK_MARGIN = {("gemmrl", "vendor_best"): 0.02}
RECHECKS = 3
# Pairs re-measured head to head: only the member of each side that the first run compared (gemmrl, and the vendor
# path that was vendor_best), interleaved, instead of every member of both sides. In the host-timed protocols the
# crowd favours whichever call path fills most of its slots: on an H100 (h100_offline-host-probe-crowd-variants_
# 2567be1_2026-11-24.csv) the same cuBLASLt plan through gemmrl.mm ran 0.6-1.0 us slower than through the bench's
# ctypes call when 6 of 8 slots were ctypes calls, 2.9-3.3 us faster when 6 of 8 were gemmrl calls, and 0.9-1.1 us
# faster head to head. The winner chosen in the first run is re-measured, not re-chosen (DESIGN: no winner's curse).
RECHECK_HEAD_TO_HEAD = frozenset({("gemmrl", "vendor_best")})


class BenchError(RuntimeError):
    pass


def require_cuda(device: int = 0) -> None:
    try:
        import torch
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
        from tqdm import tqdm

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


class _Verifier:
    """Runs the battery once per (candidate, algorithm) and remembers the verdict."""

    def __init__(self, device: str):
        self.device = device
        self.cache: dict[tuple, tuple[bool, str]] = {}

    def __call__(self, cand, problem: GemmProblem) -> tuple[bool, str]:
        from ..verify import verify

        key = (cand.name, problem, str(cand.info().get("algo", "")))
        if key not in self.cache:
            try:
                v = verify(cand, problem, self.device)
                self.cache[key] = (bool(v.passed), v.reason)
            except Exception as e:  # noqa: BLE001 - a crashing candidate is unverified, not fatal
                self.cache[key] = (False, f"verification raised {type(e).__name__}: {e}"[:300])
        return self.cache[key]


def _candidates(problem: GemmProblem, spec: BenchSpec, imported: dict) -> tuple[list, list[dict]]:
    """(runnable candidates, rows for candidates that could not even be built)."""
    cands: list = []
    broken: list[dict] = []
    if spec.vendor:
        from ..kernels.vendor import vendor_candidates

        cands += [v for v in vendor_candidates(problem) if spec.baselines is None or v.name in spec.baselines]
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


def _base_row(problem: GemmProblem, protocol: str, meta_row: dict, rep: int, cfg: TimingConfig) -> dict:
    host = protocol in ("offline", "server")
    return {"mnk": problem.mnk, "M": problem.M, "N": problem.N, "K": problem.K, "dtype": problem.dtype,
            "acc": problem.acc, "protocol": protocol, "rep": rep,
            "qps": cfg.qps if protocol == "server" else None,
            "warmup_s": cfg.warmup_s if host else None, "benchmark_s": cfg.benchmark_s if host else None,
            **meta_row}


def _aggregate_rows(rows: list[dict], baselines: tuple[str, ...] | None = None, acc: str = "fp32") -> list[dict]:
    """The aggregates (cublas, cublaslt_heuristic, cublaslt_autotuned, vendor_best): each the fastest verified of
    its members. With ``baselines`` (the vendor paths a run was restricted to), an aggregate with a member left out
    is not written (torch does not apply to acc fp16)."""
    ok = {r["candidate"]: r for r in rows if r.get("verified") and r.get("floor_ok", True)
          and math.isfinite(r.get("time_ms", math.inf)) and not r.get("recheck")}
    out = []
    for agg, members in AGGREGATES.items():
        if baselines is not None and any(m not in baselines and not (m == "torch" and acc == "fp16") for m in members):
            continue
        have = [ok[m] for m in members if m in ok]
        if not have:
            continue
        best = max(have, key=lambda r: r["tflops"])
        out.append({**best, "candidate": agg, "members": best["candidate"]})
    return out


def _timing_fields(t) -> dict:
    return {"time_ms": t.time_ms, "tflops": t.tflops, "n": t.n, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms}


def measure_problem(problem: GemmProblem, protocol: str, cands: list, bufs, cfg: TimingConfig,
                    verifier: Callable, floor: float, base: dict, baselines: tuple[str, ...] | None = None) -> list[dict]:
    timer = make_timer(bufs, protocol, cfg)
    rows: list[dict] = []
    live: dict[str, Any] = {}
    setup: dict[str, str] = {}   # candidate -> where its time outside the timed calls went (row info)
    for cand in cands:
        row = {**base, "candidate": cand.name, "layout": cand.layout}
        t0 = time.perf_counter()
        try:
            cand.prepare(problem, bufs, protocol, timer)
        except Exception as e:  # noqa: BLE001
            rows.append({**row, "verified": False, "reason": f"prepare failed: {type(e).__name__}: {e}"[:300]})
            continue
        info = cand.info()
        row.update(algo=info.get("algo", ""), n_algos=info.get("n_algos", ""), layout=cand.layout)
        t1 = time.perf_counter()
        ok, reason = verifier(cand, problem)
        # prepare (build, plan, autotune) and the battery (once per candidate and shape: ~0 in the next protocol)
        setup[cand.name] = f"prep_ms={(t1 - t0) * 1e3:.0f};verify_ms={(time.perf_counter() - t1) * 1e3:.0f}"
        if not ok:
            rows.append({**row, "verified": False, "reason": reason or "failed verification"})
            continue
        a, b, bt, c = bufs.args()
        live[cand.name] = (row, (lambda f=cand: f(a, b, bt, c)))
    times = measure({k: v[1] for k, v in live.items()}, bufs, protocol, cfg)
    clk = sm_clock_mhz(bufs.a.device.index or 0) if bufs.a.is_cuda else ""
    for name, (row, _) in live.items():
        t = times[name]
        r = {**row, **_timing_fields(t), "verified": True, "reason": t.reason, "floor_ms": floor,
             "floor_ok": not below_floor(t.time_ms, floor), "sm_clock_mhz": f"{base['sm_clock_mhz']}/{clk}",
             "timestamp": now()}
        if protocol == "graph":
            r["info"] = f"calls_per_graph={t.extra.get('calls_per_graph', '')}"
            if cfg.graph_min_timed_ms != TimingConfig.graph_min_timed_ms:  # a shorter statistic (bench --timing quick)
                r["info"] += f";min_timed_ms={cfg.graph_min_timed_ms:g}"
        if protocol in ("graph", "cold") and "settle_ms" in t.extra:
            r["info"] = ";".join(x for x in (r.get("info", ""), f"settle_ms={t.extra['settle_ms']}",
                                             f"settle_mhz={t.extra.get('settle_mhz') or ''}") if x)
        if t.extra.get("late_retaken"):   # samples whose start event fired before the work was enqueued
            r["info"] = ";".join(x for x in (r.get("info", ""), f"late_retaken={t.extra['late_retaken']}",
                                             f"late_kept={t.extra.get('late_kept', 0)}") if x)
        r["info"] = ";".join(x for x in (r.get("info", ""), setup[name]) if x)
        if not r["floor_ok"]:
            r["reason"] = f"below the roofline floor ({t.time_ms:.4g} ms < 0.95 x {floor:.4g} ms): measurement error"
        rows.append(r)
    rows += _aggregate_rows(rows, baselines, problem.acc)
    rows += _recheck(rows, live, bufs, protocol, cfg)
    for r in rows:
        r.setdefault("timestamp", now())
        r.setdefault("sm_clock_mhz", f"{base['sm_clock_mhz']}/{clk}")
    return rows


def _recheck(rows: list[dict], live: dict, bufs, protocol: str, cfg: TimingConfig) -> list[dict]:
    """Noise rule: where aggregate ``x`` is slower than aggregate ``ref`` in the first measurement, all their
    members (for a RECHECK_HEAD_TO_HEAD pair: the member each side won with) are re-measured RECHECKS more times,
    interleaved; rows carry ``recheck`` = 1..RECHECKS."""
    by = {r["candidate"]: r for r in rows if r.get("verified") and not r.get("members")}
    agg = {r["candidate"]: r for r in rows if r.get("members")}
    out = []
    agg = {**{k: v for k, v in by.items() if k not in AGGREGATES}, **agg}
    for x, ref in RECHECK_PAIRS:
        margin = RECHECK_MARGIN.get((x, ref), 0.0)
        if x not in agg or ref not in agg or agg[x]["tflops"] >= agg[ref]["tflops"] * (1 - margin):
            continue
        if (x, ref) in RECHECK_HEAD_TO_HEAD:
            sides = ((agg[x].get("members") or x,), (agg[ref].get("members") or ref,))
        else:
            sides = (AGGREGATES.get(x, (x,)), AGGREGATES.get(ref, (ref,)))
        names = [m for m in (*sides[0], *sides[1]) if m in by and m in live]
        for k in range(1, RECHECKS + 1):
            # host protocols re-measure with the sweep durations (at most 0.25 s + 1 s), recorded in the rows
            cfg_k = replace(cfg, seed=cfg.seed + 100 * k, warmup_s=min(cfg.warmup_s, 0.25),
                            benchmark_s=min(cfg.benchmark_s, 1.0))
            ts = measure({m: live[m][1] for m in names}, bufs, protocol, cfg_k)
            host = protocol in ("offline", "server")
            for m in names:
                out.append({**by[m], **_timing_fields(ts[m]), "recheck": k, "timestamp": now(),
                            "warmup_s": cfg_k.warmup_s if host else None,
                            "benchmark_s": cfg_k.benchmark_s if host else None})
    return out


def noise_rule_below(rows: Iterable[dict], cand: str, ref: str, margin: float = 0.0) -> list[tuple[str, str]]:
    """(mnk, protocol) where ``cand`` stays slower than ``ref`` by more than ``margin`` (0.02: 2%) after the
    rechecks (median of the 3).

    ``cand``/``ref`` may be aggregates (their first-run aggregate rows are compared; a recheck compares the
    fastest member of each). Two candidates that ran the same algorithm on the same layout are the same
    kernel, and two aggregates whose members ran the same set of (layout, algorithm) are the same kernels:
    never counted as below (their difference is the noise between two measurements of one kernel)."""
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


@without_grad
def run_bench(spec: BenchSpec, progress: bool = True, *, on_cpu: bool = False,
              verifier: Callable | None = None) -> Path:
    """Measure ``spec`` into ``spec.out`` (resuming a killed run); returns the CSV path.

    ``on_cpu`` runs the host protocols on CPU tensors (the test tier: resume, schema); never a result.
    ``verifier(cand, problem) -> (ok, reason)`` replaces the battery (tests only).
    """
    import torch

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
        from ..kernels.cuda_l2_import import load_kernel_dir

        imported = load_kernel_dir(spec.kernel_dir, list(spec.problems), acc=spec.kernel_acc, progress=progress)
    verifier = verifier or _Verifier(dev)
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
            bufs = make_buffers(problem, dev, seed=spec.cfg.seed)
            cands, broken = _candidates(problem, spec, imported)
            current = problem
        base = _base_row(problem, protocol, meta_row, rep, spec.cfg)
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
