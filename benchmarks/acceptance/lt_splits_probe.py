"""How much cuBLASLt leaves on the table by listing few configurations: per shape, every plan the fallback race
would time (torch.matmul, cublasGemmEx, the heuristic's first 32 cuBLASLt results, and the split-K configurations of
its first kernels that the heuristic does not list), each timed as the race times it (CUDA graphs of back-to-back
calls; ``graph`` with operands in L2, ``cold`` after 2x L2 written), all plans in every round, interleaved.

    python benchmarks/acceptance/lt_splits_probe.py --shapes benchmarks/shapes/decode_models5_m1-32_weights100mb.txt \
        --dtype fp16 --out OUT.csv

One row per shape and protocol: the fastest listed plan (what the vendor paths can reach), the fastest unlisted
configuration, their ratio, the roofline floor (989 TFLOP/s, 4.8 TB/s; a time under it is a bug) and whether the
fastest configuration matched an fp32 product. Prints a short table last.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch

from gemmrl.candidate import make_buffers
from gemmrl.kernels import vendor
from gemmrl.problem import GemmProblem, parse_mnk
from gemmrl.serve import vendor_choice as VCH
from gemmrl.serve.dispatch import _reference_check

ROUNDS = 7
PEAK_FLOPS, PEAK_BYTES = 989e12, 4.8e12
FIELDS = ["mnk", "dtype", "layout", "protocol", "n_listed", "n_unlisted", "best_listed", "listed_us",
          "best_unlisted", "unlisted_us", "speedup", "floor_us", "unlisted_tbs", "checked", "git"]


def floor_us(p: GemmProblem) -> float:
    bytes_ = 2 * (p.M * p.K + p.N * p.K + p.M * p.N)
    return max(bytes_ / PEAK_BYTES, 2 * p.M * p.N * p.K / PEAK_FLOPS) * 1e6


def shapes_of(path: str) -> list[str]:
    out = []
    for line in Path(path).read_text().splitlines():
        s = line.split("#", 1)[0].strip()
        if s:
            out.append(s)
    return out


def probe(p: GemmProblem, sms: int) -> tuple[dict, list[str], list[str], dict]:
    bufs = make_buffers(p, torch.device("cuda"), seed=7, on_device=True)
    a, b, bt, c = bufs.args()
    bv = bt.t() if p.layout == "tn" else b
    plans = {"torch": lambda: torch.matmul(a, bv, out=c)}
    cb = vendor.CtypesCandidate("vendor:cublas", p.layout, "fp32", "cublas")
    cb.prepare(p, bufs, "graph", None)
    plans["cublas"] = lambda: cb(a, b, bt, c)
    lt = vendor.CtypesCandidate("vendor:cublaslt", p.layout, "fp32", "heuristic")
    lt.prepare(p, bufs, "graph", None)
    listed = list(range(min(VCH.RACE_ALGOS, len(lt.algorithms()))))
    extra = lt.split_variants(p, sms, listed)
    descs = lt.algorithms()
    for i in listed + extra:
        plans[f"cublaslt#{i} {descs[i]}"] = (lambda f=lt.algorithm_call(i): f(a, b, bt, c))
    names_listed = ["torch", "cublas"] + [f"cublaslt#{i} {descs[i]}" for i in listed]
    names_extra = [f"cublaslt#{i} {descs[i]}" for i in extra]
    meds = {}
    for proto, timer in (("graph", VCH.event_timer), ("cold", VCH.cold_timer)):
        live = dict(plans)
        for n, fn in list(live.items()):
            try:
                fn()
            except Exception:  # noqa: BLE001 - a plan that does not run here is not timed
                del live[n]
        VCH.settle(next(iter(live.values())))
        samples: dict[str, list[float]] = {n: [] for n in live}
        for r in range(ROUNDS):
            order = list(live) if r % 2 == 0 else list(reversed(live))
            for n, t in zip(order, timer.many([live[n] for n in order])):
                samples[n].append(t * 1e3)
        meds[proto] = {n: statistics.median(v) for n, v in samples.items()}
    checks = {}
    for proto in meds:
        ex = [n for n in names_extra if n in meds[proto]]
        if ex:
            best = min(ex, key=meds[proto].get)
            try:
                _reference_check(lambda x, y, out, f=plans[best]: f(), bufs, p)
                checks[best] = "pass"
            except Exception as e:  # noqa: BLE001 - reported in the row
                checks[best] = f"fail: {e}"[:80]
    return meds, names_listed, names_extra, checks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", action="append", required=True, help="shape files (M_N_K per line); repeatable")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--layout", default="tn", choices=["tn", "nn"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--git", default="")
    ap.add_argument("--budget-s", type=float, default=400.0, help="stop starting shapes after this many seconds")
    args = ap.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = [s for f in args.shapes for s in shapes_of(f)]
    rows, t0 = [], time.time()
    with open(args.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, FIELDS)
        w.writeheader()
        for s in shapes:
            if time.time() - t0 > args.budget_s:
                print(f"budget spent: {len(rows) // 2} of {len(shapes)} shapes", file=sys.stderr)
                break
            p = parse_mnk(s).with_(dtype=args.dtype, layout=args.layout)
            try:
                meds, nl, ne, checks = probe(p, sms)
            except Exception as e:  # noqa: BLE001 - one shape's failure is reported, the rest go on
                print(f"{s}: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            for proto, med in meds.items():
                bl = min((n for n in nl if n in med), key=med.get)
                ex = [n for n in ne if n in med]
                be = min(ex, key=med.get) if ex else ""
                row = {"mnk": p.mnk, "dtype": p.dtype, "layout": p.layout, "protocol": proto, "n_listed": len(nl),
                       "n_unlisted": len(ne), "best_listed": bl, "listed_us": f"{med[bl]:.3f}", "best_unlisted": be,
                       "unlisted_us": f"{med[be]:.3f}" if be else "",
                       "speedup": f"{med[bl] / med[be]:.4f}" if be else "",
                       "floor_us": f"{floor_us(p):.3f}",
                       "unlisted_tbs": f"{2 * (p.M * p.K + p.N * p.K + p.M * p.N) / med[be] / 1e6:.3f}" if be else "",
                       "checked": checks.get(be, ""), "git": args.git}
                w.writerow(row)
                fh.flush()
                rows.append(row)
    print(f"{'mnk':<18} {'proto':<5} {'listed_us':>9} {'unlisted_us':>11} {'speedup':>7} {'floor':>7} check")
    for r in rows:
        print(f"{r['mnk']:<18} {r['protocol']:<5} {r['listed_us']:>9} {r['unlisted_us'] or '-':>11} "
              f"{r['speedup'] or '-':>7} {r['floor_us']:>7} {r['checked']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
