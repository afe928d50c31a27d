"""Which kernel each way of calling a GEMM launches, and its device time, per shape (torch.profiler).

For each shape: torch.matmul (B as [K, N], and as the transpose of an [N, K] weight), cublasGemmEx in both layouts
and cuBLASLt's heuristic first plan in both layouts (kernels/vendor.py's lean calls), and gemmrl.mm as it serves
the shape here (eager, in the layout given by --layout). Each is called ``--calls`` times after a warm-up; the
profiler's CUDA kernel records give the kernel names and their mean device time (warm: back to back, no flush).
Writes kernel_names.csv under $GEMMRL_OUT (shape, path, kernel, calls, mean_us) and prints a short table.

    GEMMRL_OUT=/tmp/out python benchmarks/acceptance/kernel_names.py --mnk 4_14_2,198_20_3 --dtype fp16
"""

from __future__ import annotations

import argparse
import csv
import os
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from gemmrl.candidate import make_buffers
from gemmrl.kernels.vendor import vendor_candidates
from gemmrl.problem import parse_mnk
from gemmrl.serve import dispatch

PATHS = ("cublas_tn", "cublas_nn", "cublaslt_heuristic_tn", "cublaslt_heuristic_nn")


def kernels_of(fn, calls: int) -> list[tuple[str, int, float]]:
    """(kernel name, launches, mean device us) of ``calls`` calls of ``fn`` after 10 untimed ones."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    got: dict[str, list[float]] = defaultdict(list)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            got[ev.name].append(ev.device_time if hasattr(ev, "device_time") else ev.cuda_time)
    return [(k, len(v), sum(v) / len(v)) for k, v in sorted(got.items(), key=lambda kv: -len(kv[1]))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mnk", required=True, help="comma list of M_N_K")
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    ap.add_argument("--layout", default="tn", choices=("tn", "nn"), help="the B gemmrl.mm is given")
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    out = os.environ.get("GEMMRL_OUT", ".")
    rows = []
    for s in args.mnk.split(","):
        p = parse_mnk(s, dtype=args.dtype)
        bufs = make_buffers(p, "cuda", seed=0)
        a, b, bt, c = bufs.args()
        fns = {"torch.matmul nn": lambda: torch.matmul(a, b, out=c),
               "torch.matmul tn": lambda: torch.matmul(a, bt.t(), out=c)}
        for cand in vendor_candidates(p):
            if cand.name in PATHS:
                cand.prepare(p, bufs, "cold", None)
                fns[cand.name] = (lambda f=cand: f(a, b, bt, c))
        w = bt.t() if args.layout == "tn" else b
        dispatch.served_by(a, w)
        fns[f"gemmrl.mm {args.layout}"] = lambda: dispatch.mm(a, w, c)
        for path, fn in fns.items():
            for name, n, us in kernels_of(fn, args.calls):
                rows.append({"mnk": p.mnk, "dtype": p.dtype, "path": path, "kernel": name[:160], "calls": n,
                             "mean_us": round(us, 3), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__})
    with open(os.path.join(out, "kernel_names.csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    for r in rows:
        print(f"{r['mnk']:14s} {r['path']:24s} {r['calls']:4d} {r['mean_us']:8.3f}  {r['kernel'][:90]}")


if __name__ == "__main__":
    main()
