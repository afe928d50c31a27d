"""What fresh inputs and checked outputs cost the device-time protocols, and the bias they leave on vendor times.

For each shape and protocol (graph, cold), every vendor path is measured in the same process with the protocol as it
is (new inputs before every timed call, C checked after random timed calls) and with ``fresh_inputs=False`` (the
inputs of the first call reused throughout, outputs unchecked: the protocol before the change), the two modes
alternating in a random order over ``--reps`` repetitions. Per (shape, protocol, path): the median time of each
mode and their ratio (the bias: fresh / fixed - 1); per (shape, protocol): the wall time of each mode's measurement
(all paths; the GPU is busy throughout, so this is the added device time) and the refill time subtracted in graph.

    python benchmarks/acceptance/fresh_inputs_cost.py --out DIR [--shapes 1_4096_4096,...] [--reps 2] [--quick]

Writes ``<gpu>_fresh-inputs-cost_<sha>_<date>.csv`` (one row per shape, protocol, path, mode and repetition) and
prints a table last: per protocol the geometric-mean bias over shapes and paths, its worst shape, and the added wall
time.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import statistics
import sys
import time
from dataclasses import replace
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gemmrl.candidate import make_buffers  # noqa: E402
from gemmrl.kernels.vendor import vendor_candidates  # noqa: E402
from gemmrl.problem import parse_mnk  # noqa: E402
from gemmrl.results import collect_meta, git_sha  # noqa: E402
from gemmrl.timing import TimingConfig, make_timer, measure  # noqa: E402

SHAPES = ("1_4096_4096", "16_4096_4096", "1_8192_28672", "64_64_64", "256_256_4096", "128_1024_1024",
          "1024_1024_1024", "2048_2048_2048", "4096_4096_4096", "4096_128_16384", "333_777_1111")
FIELDS = ("mnk", "protocol", "candidate", "layout", "mode", "rep", "time_ms", "ok", "reason", "fill_us", "wall_s",
          "output_checks", "gpu", "git_sha")


def geomean(xs):
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else math.nan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--protocols", default="graph,cold")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="the quick statistics (bench --timing quick)")
    ap.add_argument("--sha", default="", help="git sha of the code measured (default: git rev-parse)")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    torch.set_grad_enabled(False)
    meta = collect_meta(0).row()
    gpu, sha = meta["gpu"], args.sha or git_sha()
    base = TimingConfig().quick() if args.quick else TimingConfig()
    modes = {"fresh": base, "fixed": replace(base, fresh_inputs=False)}
    rng = random.Random(0)
    rows = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = next((k for k in ("h200", "h100", "a100") if k in gpu.lower()), "gpu")
    path = out / f"{tag}_fresh-inputs-cost_{sha[:12]}_{date.today().isoformat()}.csv"
    for mnk in args.shapes.split(","):
        p = parse_mnk(mnk)
        bufs = make_buffers(p, "cuda")
        for proto in args.protocols.split(","):
            cands = []
            for v in vendor_candidates(p):
                try:
                    v.prepare(p, bufs, proto, make_timer(bufs, proto, base))
                    cands.append(v)
                except Exception as e:  # noqa: BLE001 - a path that does not take this shape
                    print(f"  {mnk} {proto} {v.name}: not prepared ({type(e).__name__}: {str(e)[:80]})")
            a, b, bt, c = bufs.args()
            fns = {v.name: (lambda f=v: f(a, b, bt, c)) for v in cands}
            layouts = {v.name: v.layout for v in cands}
            for rep in range(args.reps):
                for mode in rng.sample(list(modes), 2):
                    t0 = time.perf_counter()
                    res = measure(fns, bufs, proto, modes[mode], layouts=layouts)
                    torch.cuda.synchronize()
                    wall = time.perf_counter() - t0
                    for name, t in res.items():
                        rows.append({"mnk": mnk, "protocol": proto, "candidate": name, "layout": layouts[name],
                                     "mode": mode, "rep": rep, "time_ms": t.time_ms, "ok": t.ok,
                                     "reason": t.reason[:200], "fill_us": round(t.extra.get("fill_ms", 0.0) * 1e3, 3),
                                     "wall_s": round(wall, 4), "output_checks": t.extra.get("output_checks", ""),
                                     "gpu": gpu, "git_sha": sha})
            with open(path, "w", newline="") as fh:  # partial results survive a kill
                w = csv.DictWriter(fh, fieldnames=FIELDS)
                w.writeheader()
                w.writerows(rows)
        del bufs
        torch.cuda.empty_cache()
        print(f"{mnk}: done", flush=True)
    print(f"\nrows: {path}\n")
    print(table(rows))
    bad = [r for r in rows if not r["ok"]]
    for r in bad:
        print(f"  NOT OK {r['mnk']} {r['protocol']} {r['candidate']} {r['mode']}: {r['reason']}")
    return 1 if bad else 0


def summarize(rows):
    """Per protocol: [(shape, path, fresh/fixed median ratio)], {shape: (wall fresh, wall fixed)}, fill share."""
    by = {}
    walls = {}
    for r in rows:
        if not r["ok"]:
            continue
        by.setdefault((r["protocol"], r["mnk"], r["candidate"], r["mode"]), []).append(float(r["time_ms"]))
        walls.setdefault((r["protocol"], r["mnk"], r["mode"], r["rep"]), float(r["wall_s"]))
    out = {}
    for (proto, mnk, cand, mode), xs in by.items():
        if mode != "fresh" or (proto, mnk, cand, "fixed") not in by:
            continue
        ratio = statistics.median(xs) / statistics.median(by[(proto, mnk, cand, "fixed")])
        out.setdefault(proto, {"ratios": [], "wall": {}})["ratios"].append((mnk, cand, ratio))
    for (proto, mnk, mode, rep), w in walls.items():
        if proto in out:
            out[proto]["wall"].setdefault(mnk, {"fresh": 0.0, "fixed": 0.0})[mode] += w
    return out


def table(rows) -> str:
    s = summarize(rows)
    lines = ["| protocol | shapes | paths x shapes | vendor time fresh/fixed (geomean) | worst shape (geomean of its "
             "paths) | wall time fresh/fixed |", "|---|---|---|---|---|---|"]
    for proto, d in s.items():
        per_shape = {}
        for mnk, _, r in d["ratios"]:
            per_shape.setdefault(mnk, []).append(r)
        worst = max(per_shape.items(), key=lambda kv: abs(math.log(geomean(kv[1]))))
        wf = sum(w["fresh"] for w in d["wall"].values())
        wx = sum(w["fixed"] for w in d["wall"].values())
        lines.append(f"| {proto} | {len(per_shape)} | {len(d['ratios'])} | {geomean([r for *_, r in d['ratios']]):.4f} "
                     f"| {worst[0]} {geomean(worst[1]):.4f} | {wf / wx:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
