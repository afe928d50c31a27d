"""How much faster than the vendor a GEMM kernel could possibly be, per shape and protocol, measured.

A speed bar over vendor_best (the Triton-family bar's 1.10x in ``cold``, the grid-library bar's over the grid) is reachable only where the
vendor leaves that much room. The room is bounded by two things no GEMM kernel escapes:

- memory and launch: a GEMM reads every byte of A and B and writes every byte of C, in at least one launch.
  ``t_touch`` is the best time, under the same protocol (the same flush, the same graph replays, interleaved
  with the vendor calls), of a kernel that does exactly that and nothing else (kernels/touch.py);
- tensor-core work: ``t_mma`` = 2MNK / (SMs x dense fp16 FLOPs per SM per clock x the SM clock ceiling, NVML's max
  clock), the fastest the tensor cores can do the multiply-adds even at a clock the power cap does not allow.

``sol = max(min(t_touch, t_vendor), t_mma)`` and ``headroom = t_vendor / sol`` >= the best speedup over this vendor
time any kernel can reach here. ``t_vendor`` is the fastest of the vendor paths timed beside the probe (a subset
of the seven; the fewer, the slower the fastest, so the larger the headroom: the bound only gets looser). Where a
vendor path is faster than the probe, the probe is not the floor there and the headroom is taken as 1 (no room
shown), never below it.

What is assumed: that the probe's configurations (kernels/touch.CONFIGS, the best one per shape) stream memory as
fast as any kernel can under the protocol, and that no kernel runs the tensor cores faster than their datasheet
rate at the clock ceiling. The table reports the probe's achieved bandwidth so the first can be judged.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from ..candidate import make_buffers
from ..clocks import max_sm_mhz
from ..kernels.touch import TouchCandidate
from ..kernels.vendor import vendor_candidates
from ..problem import GemmProblem
from ..results import now, sm_clock_mhz
from ..timing import below_floor, floor_ms, l2_bytes, make_timer, measure

# dense fp16/bf16 tensor-core FLOPs per SM per clock (2 x FMAs): A100 1024 FMA, H100 2048 FMA (989.4 TFLOPS =
# 132 SMs x 4096 x 1830 MHz). Other architectures: no compute bound (the headroom then rests on the probe alone).
MMA_FLOPS_PER_CLK_PER_SM = {"8.0": 2048, "9.0": 4096}
VENDOR_DEFAULT = ("torch", "cublas_tn", "cublas_nn", "cublaslt_heuristic_tn", "cublaslt_heuristic_nn")
PROBE_REASON = "speed-of-light probe (reads A and B once, zero-fills C): not a GEMM"
CHECK_RTOL = 1e-2  # the vendor paths' sanity check: relative Frobenius error against an fp32 product


class HeadroomError(ValueError):
    pass


def mma_peak_flops(cc: str, sms: int, mhz: float) -> float | None:
    """FLOP/s of the tensor cores at ``mhz`` (None where this module does not know the architecture's rate)."""
    per = MMA_FLOPS_PER_CLK_PER_SM.get(cc)
    if per is None or not sms or not mhz:
        return None
    return float(per) * sms * mhz * 1e6


def parse_info(text: str) -> dict[str, str]:
    """``k=v;k=v`` (the results schema's ``info`` column) -> dict."""
    out = {}
    for part in (text or "").split(";"):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


@dataclass(frozen=True)
class Bound:
    mnk: str
    M: int
    N: int
    K: int
    protocol: str
    t_vendor_ms: float
    vendor: str
    t_touch_ms: float
    touch: str
    t_mma_ms: float  # nan where the architecture's rate is unknown

    @property
    def sol_ms(self) -> float:
        mem = min(self.t_touch_ms, self.t_vendor_ms)
        return max(mem, self.t_mma_ms) if math.isfinite(self.t_mma_ms) else mem

    @property
    def headroom(self) -> float:
        """Upper bound on t_vendor / t_any_gemm under this protocol."""
        return self.t_vendor_ms / self.sol_ms

    @property
    def limit(self) -> str:
        """What the bound rests on: the probe, the tensor cores, or the vendor itself (faster than the probe)."""
        if math.isfinite(self.t_mma_ms) and self.t_mma_ms >= min(self.t_touch_ms, self.t_vendor_ms):
            return "mma"
        return "touch" if self.t_touch_ms <= self.t_vendor_ms else "vendor"

    @property
    def touch_gbs(self) -> float:
        return 2 * (self.M * self.K + self.K * self.N + self.M * self.N) / (self.t_touch_ms * 1e-3) / 1e9


def _f(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def bounds(rows: Iterable[Mapping[str, str]]) -> list[Bound]:
    """One Bound per (shape, dtype, protocol) of a ``gemmrl headroom`` CSV: the fastest verified vendor row and the
    fastest probe row of that group. Groups lacking either (all vendor paths failed, say) are left out."""
    groups: dict[tuple, dict[str, list]] = {}
    for r in rows:
        t = _f(r.get("time_ms"))
        if not math.isfinite(t) or t <= 0:
            continue
        g = groups.setdefault((r["mnk"], r.get("dtype", ""), r["protocol"]), {"vendor": [], "touch": [], "rows": []})
        if r["candidate"].startswith("touch_"):
            g["touch"].append((t, r))
        elif str(r.get("verified", "")).lower() == "true":
            g["vendor"].append((t, r))
    out = []
    for (mnk, _dt, proto), g in sorted(groups.items()):
        if not g["vendor"] or not g["touch"]:
            continue
        tv, rv = min(g["vendor"], key=lambda x: x[0])
        tt, rt = min(g["touch"], key=lambda x: x[0])
        M, N, K = (int(x) for x in mnk.split("_"))
        info = parse_info(rt.get("info", ""))
        peak = mma_peak_flops(rt.get("cc", ""), int(_f(info.get("sms")) or 0), _f(info.get("max_mhz")))
        t_mma = 2.0 * M * N * K / peak * 1e3 if peak else math.nan
        out.append(Bound(mnk, M, N, K, proto, tv, rv["candidate"], tt, rt["candidate"], t_mma))
    return out


def geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


@dataclass(frozen=True)
class ClassHeadroom:
    cls: str
    protocol: str
    n: int
    geomean: float
    median: float
    lo: float
    hi: float
    at_floor: int  # shapes whose headroom is under 1.02: the vendor is within 2% of the bound
    bar: float | None

    @property
    def reachable(self) -> bool | None:
        """False when even a kernel at the bound on every shape would miss the bar (a geomean of headroom < bar)."""
        return None if self.bar is None else self.geomean >= self.bar


def by_class(bs: Iterable[Bound], classes: Mapping[str, Callable[[Bound], bool]],
             bars: Mapping[tuple[str, str], float] | None = None) -> list[ClassHeadroom]:
    bars = bars or {}
    bs = list(bs)
    out = []
    for proto in sorted({b.protocol for b in bs}):
        for name, pred in classes.items():
            hs = [b.headroom for b in bs if b.protocol == proto and pred(b)]
            if not hs:
                continue
            out.append(ClassHeadroom(name, proto, len(hs), geomean(hs), statistics.median(hs), min(hs), max(hs),
                                     sum(h < 1.02 for h in hs), bars.get((name, proto))))
    return out


# -- shape classes of the issues' bars ------------------------------------------------------------

def is_small(b) -> bool:
    return min(b.M, b.N) <= 256


def is_large(b) -> bool:
    return min(b.M, b.N, b.K) >= 4096


CLASSES = {
    "min(M,N) <= 256": is_small,
    "all dims >= 4096": is_large,
    "other": lambda b: not is_small(b) and not is_large(b),
    "all": lambda b: True,
}


# -- measuring (CUDA) ---------------------------------------------------------------------------------

def _check_vendor(cand, bufs, ref) -> str:
    """'' when ``cand`` wrote the product into C (relative Frobenius error under CHECK_RTOL against ``ref``, the
    fp32 product)."""
    import torch  # optional dependency, imported on use: the bounds and class table of finished runs do without it

    a, b, bt, c = bufs.args()
    c.fill_(float("nan"))
    cand(a, b, bt, c)
    torch.cuda.synchronize()
    err = float(torch.linalg.vector_norm(c.float() - ref) / max(float(torch.linalg.vector_norm(ref)), 1e-30))
    if not math.isfinite(err) or err > CHECK_RTOL:
        return f"wrong product: relative error {err:.3g} > {CHECK_RTOL} against fp32"
    return ""


def measure_shape(problem: GemmProblem, protocols: Sequence[str], vendor: Sequence[str], touch: Sequence,
                  cfg, base: Mapping[str, object], device: int = 0) -> dict[str, list[dict]]:
    """Rows per protocol: the vendor paths named in ``vendor`` and the probe configs ``touch``, timed together."""
    import torch  # optional dependency, imported on use: the bounds and class table of finished runs do without it

    bufs = make_buffers(problem, "cuda", seed=cfg.seed or 0)  # first inputs only: every protocol refills
    known = {c.name: c for c in vendor_candidates(problem)}
    unknown = [v for v in vendor if v not in known]
    if unknown:
        raise HeadroomError(f"unknown vendor path(s) {unknown}; use any of {', '.join(known)}")
    props = torch.cuda.get_device_properties(device)
    dev_info = f"sms={props.multi_processor_count};max_mhz={max_sm_mhz(device):.0f}"
    out: dict[str, list[dict]] = {}
    a, b, bt, c = bufs.args()
    ref = None
    checked: dict[tuple, str] = {}  # (vendor path, algorithm) -> why it failed ('' passed)
    for proto in protocols:
        floor = floor_ms(problem, str(base.get("gpu", "")), proto, l2_bytes(device))
        row0 = {**base, "mnk": problem.mnk, "M": problem.M, "N": problem.N, "K": problem.K, "dtype": problem.dtype,
                "acc": problem.acc, "protocol": proto, "rep": 0, "floor_ms": floor,
                "sm_clock_mhz": sm_clock_mhz(device)}
        rows, live = [], {}
        timer = make_timer(bufs, proto, cfg)
        for name in vendor:
            cand = known[name]
            row = {**row0, "candidate": name, "layout": cand.layout}
            try:
                cand.prepare(problem, bufs, proto, timer)
                key = (name, str(cand.info().get("algo", "")))
                if key not in checked:
                    if ref is None:
                        ref = a.float() @ b.float()
                    checked[key] = _check_vendor(cand, bufs, ref)
                why = checked[key]
            except Exception as e:  # noqa: BLE001 - a vendor path that fails is recorded, the rest go on
                why = f"{type(e).__name__}: {e}"[:300]
            if why:
                rows.append({**row, "verified": False, "reason": why})
                continue
            info = cand.info()
            row.update(algo=info.get("algo", ""), n_algos=info.get("n_algos", ""), verified=True)
            live[name] = (row, lambda f=cand: f(a, b, bt, c))
        for tc in touch:
            cand = TouchCandidate(tc, layout="tn")
            row = {**row0, "candidate": cand.name, "layout": "tn", "verified": False, "reason": PROBE_REASON}
            try:
                cand.prepare(problem, bufs, proto, None)
            except Exception as e:  # noqa: BLE001
                rows.append({**row, "reason": f"{PROBE_REASON}; launch failed: {type(e).__name__}: {e}"[:300]})
                continue
            live[cand.name] = (row, lambda f=cand: f(a, b, bt, c))
        times = measure({k: v[1] for k, v in live.items()}, bufs, proto, cfg)
        for name, (row, _) in live.items():
            t = times[name]
            extra = ";".join(f"{k}={t.extra[k]}" for k in ("calls_per_graph", "settle_ms", "settle_mhz") if k in t.extra)
            r = {**row, "time_ms": t.time_ms, "tflops": t.tflops, "n": t.n, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms,
                 "floor_ok": not below_floor(t.time_ms, floor),
                 "info": ";".join(x for x in (dev_info, extra) if x), "timestamp": now()}
            if t.reason:
                r["reason"] = (r.get("reason", "") + "; " + t.reason).lstrip("; ")[:300]
            rows.append(r)
        out[proto] = rows
    del bufs, ref
    return out
