"""Why a selected Triton kernel loses to vendor_best: Nsight Compute metrics of both, and a reason in words.

On the GPU machine (ncu on PATH; the clocks are left alone: ``--clock-control none``):

    PYTHONPATH=src python3 -m gemmrl.measure.ncu losses REMEASURE.csv --protocol cold --n 10 --out $OUT/ncu_losses_cold.csv

``losses`` takes the rows of a re-measure run (``gemmrl bench --triton-from``), picks the ``n`` shapes where the
config selected in ``protocol`` loses most to vendor_best, and profiles, per shape, one call of our kernel and
one of the vendor path that was fastest there (each in its own ncu process running ``python -m gemmrl.measure.ncu run``,
which starts the profiler around exactly that call). ``cold`` keeps ncu's default cache control (caches
flushed before each replayed kernel: our cold protocol); ``graph`` passes ``--cache-control none``. It writes a
CSV and a markdown table (OUT.md). A shape whose profiling fails gets a row with the error; the others go on.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Mapping

from .. import results  # results.read_rows looked up at call time: tests replace it
from ..candidate import make_buffers
from ..kernels.registry import family
from ..problem import parse_mnk
from ..search.selection import selected_for
from ..summary import usable
from ..timing import make_timer

# Checked on the H100 with ncu 2025.3: ``--page raw`` has one column per metric asked for (four: .avg/.max/.min/.sum
# of a ratio) plus every ``launch__*`` attribute; a name ncu does not know is dropped without an error, so a
# missing column reads nan. gh100 has no ``sm__pipe_tensor_op_gmma_cycles_active``: the hmma pipe's cycles also
# count wgmma there (cuBLAS 4096^3 fp16: 94%).
TENSOR_METRIC = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
METRICS = (
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_sector_hit_rate.pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    TENSOR_METRIC,
    "launch__grid_size",
    "launch__block_size",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
    "launch__shared_mem_per_block_static",
    "launch__waves_per_multiprocessor",
)
SMS = 132
GAP = 0.95  # a throughput counter names a cause only when ours is under 95% of the vendor's


class NcuError(RuntimeError):
    pass


@dataclass(frozen=True)
class Loss:
    mnk: str
    protocol: str
    config: str
    layout: str
    vendor: str
    ours_ms: float
    vendor_ms: float
    speedup: float      # vendor_best time / ours: < 1 is a loss


def worst_shapes(rows: Iterable[Mapping[str, str]], protocol: str, n: int = 10) -> list[Loss]:
    """The ``n`` shapes where the config selected in ``protocol`` is slowest against vendor_best."""
    rows = list(rows)
    vendor = {r["mnk"]: r for r in rows if r["protocol"] == protocol and usable(r) and r["candidate"] == "vendor_best"}
    out = []
    for r in rows:
        if r["protocol"] != protocol or not usable(r) or r.get("members") or not selected_for(r["candidate"], protocol):
            continue
        v = vendor.get(r["mnk"])
        if v is None:
            continue
        t, tv = float(r["time_ms"]), float(v["time_ms"])
        out.append(Loss(r["mnk"], protocol, r.get("algo", ""), r.get("layout", "tn"), v.get("members", ""), t, tv,
                        tv / t))
    return sorted(out, key=lambda x: x.speedup)[:n]


# -- the profiled child ----------------------------------------------------------------------------------------
def run_child(mnk: str, which: str, config: str, layout: str, vendor: str, protocol: str) -> None:
    """Build the candidate, warm it up, then run it once between profiler start and stop."""
    import torch  # optional dependency, imported on use: picking the shapes and reading ncu's output do without it

    problem = parse_mnk(mnk)
    bufs = make_buffers(problem, "cuda")
    fam = family(which)  # a config as its family names it (a vendor path by its baseline name)
    cfg = fam.parse(vendor if which == "vendor" else config)
    problem = problem.with_(layout=fam.fixed(cfg)[0] if fam.fixed else layout)  # a compiled config fixes its layout
    cand = fam.candidate(cfg, problem, None)
    cand.prepare(problem, bufs, protocol, make_timer(bufs, protocol))
    args = bufs.args()
    for _ in range(5):
        cand(*args)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    cand(*args)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


# -- ncu output --------------------------------------------------------------------------------------------------
def parse_raw_csv(text: str) -> list[dict[str, str]]:
    """Rows of ``ncu --csv --page raw``: skips ``==PROF==`` and program output before the header (the line that
    starts with ``"ID"``) and the units row after it."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        return []
    body = [ln for ln in lines[start:] if ln.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(body))))
    return [r for r in rows if (r.get("ID") or "").strip().isdigit()]


def _num(x) -> float:
    try:
        return float(str(x).replace(",", ""))
    except (TypeError, ValueError):
        return math.nan


def combine(kernels: list[dict[str, str]]) -> dict[str, float]:
    """One candidate's kernels as one record: durations and DRAM bytes summed, the rest from its longest kernel."""
    if not kernels:
        return {}
    main = max(kernels, key=lambda k: _num(k.get("gpu__time_duration.sum")))
    out = {m: _num(main.get(m)) for m in METRICS}
    for m in ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum"):
        out[m] = sum(_num(k.get(m)) for k in kernels)
    out["kernels"] = len(kernels)
    out["name"] = main.get("Kernel Name", "")[:80]
    return out


def _tail(waves: float) -> float:
    """Time in whole waves over the work in waves: 1.0 for full waves (or unknown), 1.54 for 1.3 waves."""
    return 1.0 if math.isnan(waves) or waves <= 0 else math.ceil(waves) / waves


def reason(ours: Mapping[str, float], vendor: Mapping[str, float], sms: int = SMS) -> str:
    """The dominant causes in words, with the numbers; ordered by how far ours is from the vendor's."""
    def g(d, k):
        return d.get(k, math.nan)

    causes: list[tuple[float, str]] = []
    if ours.get("kernels", 1) > vendor.get("kernels", 1):
        causes.append((2.0, f"{int(ours['kernels'])} kernels against {int(vendor.get('kernels', 1))}"))
    dr_o, dr_v = g(ours, "dram__throughput.avg.pct_of_peak_sustained_elapsed"), g(vendor, "dram__throughput.avg.pct_of_peak_sustained_elapsed")
    if dr_v >= 50 and dr_o < GAP * dr_v:
        causes.append((dr_v / max(dr_o, 1e-9), f"memory-bound: DRAM at {dr_o:.0f}% of peak vs the vendor's {dr_v:.0f}%"))
    by_o = g(ours, "dram__bytes_read.sum") + g(ours, "dram__bytes_write.sum")
    by_v = g(vendor, "dram__bytes_read.sum") + g(vendor, "dram__bytes_write.sum")
    if by_v > 0 and by_o > 1.15 * by_v:
        causes.append((by_o / by_v, f"moves {by_o / by_v:.2f}x the vendor's DRAM bytes ({by_o / 1e6:.1f} vs {by_v / 1e6:.1f} MB)"))
    grid, w_o, w_v = (g(ours, "launch__grid_size"), g(ours, "launch__waves_per_multiprocessor"),
                      g(vendor, "launch__waves_per_multiprocessor"))
    if grid < sms:
        waves = "" if math.isnan(w_o) else f", {w_o:.2f} waves"
        causes.append((sms / max(grid, 1), f"grid of {grid:.0f} CTAs on {sms} SMs{waves} "
                                           f"(vendor {g(vendor, 'launch__grid_size'):.0f})"))
    elif 1 < w_o < 4 and _tail(w_o) > _tail(w_v) * 1.05:  # the last wave leaves SMs idle
        causes.append((_tail(w_o) / _tail(w_v), f"wave tail: {w_o:.2f} waves, the last {100 * (w_o % 1):.0f}% full "
                                               f"(vendor {w_v:.2f} waves)"))
    t_o, t_v = g(ours, TENSOR_METRIC), g(vendor, TENSOR_METRIC)
    if t_v >= 30 and t_o < GAP * t_v:
        causes.append((t_v / max(t_o, 1e-9), f"tensor pipe active {t_o:.0f}% vs the vendor's {t_v:.0f}%"))
    sm_o, sm_v = g(ours, "sm__throughput.avg.pct_of_peak_sustained_elapsed"), g(vendor, "sm__throughput.avg.pct_of_peak_sustained_elapsed")
    if sm_v >= 30 and sm_o < GAP * sm_v:
        causes.append((sm_v / max(sm_o, 1e-9), f"SM throughput {sm_o:.0f}% vs the vendor's {sm_v:.0f}%"))
    oc_o, oc_v = g(ours, "sm__warps_active.avg.pct_of_peak_sustained_active"), g(vendor, "sm__warps_active.avg.pct_of_peak_sustained_active")
    if oc_o < 0.75 * oc_v:
        causes.append((oc_v / max(oc_o, 1e-9), f"achieved occupancy {oc_o:.0f}% vs {oc_v:.0f}%"))
    hit_o, hit_v = g(ours, "lts__t_sector_hit_rate.pct"), g(vendor, "lts__t_sector_hit_rate.pct")
    if hit_o < hit_v - 15:
        causes.append((hit_v / max(hit_o, 1e-9), f"L2 hit rate {hit_o:.0f}% vs {hit_v:.0f}%"))
    head = (f"{g(ours, 'gpu__time_duration.sum') / 1e3:.1f} vs {g(vendor, 'gpu__time_duration.sum') / 1e3:.1f} us "
            f"(ncu, one call)")
    if not causes:
        return head + ": no single counter explains it (same DRAM, SM and occupancy levels)"
    causes.sort(key=lambda c: -c[0])
    return head + ": " + "; ".join(c[1] for c in causes[:3])


def _ncu_cmd(ncu: str, protocol: str, metrics: Iterable[str], child: list[str]) -> list[str]:
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--csv", "--page", "raw",
           "--metrics", ",".join(metrics)]
    if protocol == "graph":
        cmd += ["--cache-control", "none"]
    return cmd + [sys.executable, "-m", "gemmrl.measure.ncu", "run", *child]


def profile(loss: Loss, which: str, ncu: str, timeout: float = 240.0) -> dict[str, float]:
    child = ["--mnk", loss.mnk, "--which", which, "--config", loss.config, "--layout", loss.layout,
             "--vendor", loss.vendor, "--protocol", loss.protocol]
    p = subprocess.run(_ncu_cmd(ncu, loss.protocol, METRICS, child), capture_output=True, text=True,
                       timeout=timeout, env=os.environ.copy())
    rows = parse_raw_csv(p.stdout)
    if not rows:
        raise NcuError(f"ncu (exit {p.returncode}) gave no kernel rows for {which} at {loss.mnk}: "
                       f"{(p.stdout + p.stderr)[-400:]}")
    return combine(rows)


def _write(recs: list[dict], out: Path) -> None:
    keys = list(dict.fromkeys(k for r in recs for k in r))
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(recs)
    md = ["| shape | speedup | our config | vendor path | reason (ncu) |", "|---|---:|---|---|---|"]
    md += [f"| {r['mnk']} | {r['speedup']:.3f} | {r['layout']} {r['config']} | {r['vendor']} | "
           f"{r['reason'] or 'profiling failed: ' + r['error'][:120]} |" for r in recs]
    Path(str(out)[:-4] + ".md").write_text("\n".join(md) + "\n")


def losses(paths: list[str], protocol: str, n: int, out: Path) -> Path:
    ncu = shutil.which("ncu")
    if ncu is None:
        raise NcuError("ncu (Nsight Compute) is not on PATH; run this on the GPU machine, or add "
                       "/opt/nvidia/nsight-compute/<version> to PATH")
    worst = worst_shapes(results.read_rows(paths), protocol, n)
    if not worst:
        raise NcuError(f"no shape has both a selected triton-sel row and vendor_best in {protocol}; give the CSV of "
                       f"a gemmrl bench --triton-from run")
    recs = []
    for i, loss in enumerate(worst, 1):
        rec = {**asdict(loss), "reason": "", "error": ""}
        try:
            ours, vend = profile(loss, "triton", ncu), profile(loss, "vendor", ncu)
            rec.update({f"ours_{k}": v for k, v in ours.items()})
            rec.update({f"vendor_{k}": v for k, v in vend.items()})
            rec["reason"] = reason(ours, vend)
        except (NcuError, subprocess.TimeoutExpired, OSError) as e:
            rec["error"] = f"{type(e).__name__}: {e}"[:400]
        recs.append(rec)
        print(f"[{i}/{len(worst)}] {loss.mnk} x{loss.speedup:.3f}: {rec['reason'] or rec['error']}", flush=True)
        _write(recs, out)  # after every shape: a run cut short keeps what it profiled
    print(Path(str(out)[:-4] + ".md").read_text())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gemmrl.measure.ncu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="(the profiled child) one call of one candidate between profiler start/stop")
    for a in ("--mnk", "--which", "--config", "--layout", "--vendor", "--protocol"):
        r.add_argument(a, required=a in ("--mnk", "--which"), default="")
    lo = sub.add_parser("losses", help="profile the n shapes where the selected config loses most")
    lo.add_argument("results", nargs="+")
    lo.add_argument("--protocol", default="cold", choices=("cold", "graph"))
    lo.add_argument("--n", type=int, default=10)
    lo.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "run":
            run_child(args.mnk, args.which, args.config, args.layout or "tn", args.vendor, args.protocol or "cold")
            return 0
        missing = [p for p in args.results if not Path(p).is_file()]
        if missing:
            raise NcuError(f"no such file(s): {', '.join(missing)}")
        if not args.out.endswith(".csv"):
            raise NcuError(f"--out {args.out}: give a .csv path (the markdown goes next to it)")
        losses(args.results, args.protocol, args.n, Path(args.out))
        return 0
    except (NcuError, results.ResultsError) as e:
        print(f"gemmrl.measure.ncu: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
