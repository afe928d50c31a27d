"""Host cost of gemmrl's dispatch (the serving bar: "host cost added by the lookup once a shape has been seen: < 0.5 us").

Per shape and kind of served kernel (a Triton entry, a cuBLASLt entry, no entry = torch.matmul), the median
per-call host time, batches of N calls issued back to back behind a device sleep that outlasts them (so no call
waits for the GPU: host time alone), a sync between batches, interleaved over R rounds, of:
  launcher   the served kernel's own call (what the dispatcher calls after its lookup)
  mm_out     gemmrl.mm(a, b, out=c)            (through the hot path of the row: ``torch``, built against torch's
                                                headers, fastpath_torch.cpp; ``c``, CPython API only, fastpath.c)
  mm_out_py  gemmrl.mm's Python hot path       (for comparison)
  mm         gemmrl.mm(a, b)            (allocates C)
  linear     gemmrl.linear(x, w)        (w [N, K]; the w.t() view is made per call)
  torch_out  torch.matmul(a, b, out=c)  (for scale)
``lookup_us`` = mm_out - launcher. Writes dispatch_host_cost.csv under $GEMMRL_OUT.

    GEMMRL_OUT=/tmp/out PYTHONPATH=src python benchmarks/acceptance/dispatch_host_cost.py
"""

from __future__ import annotations

import csv
import os
import statistics
import time

import torch

from gemmrl.serve import dispatch
from gemmrl.library import Entry, Library
from gemmrl.results import collect_meta, now

SHAPES = [(1, 4096, 4096), (16, 4096, 4096), (128, 4096, 4096)]
TRITON = "smallm(BM=16,BN=64,BK=128,warps=4,stages=4,split=1,reduction=none,tma=False)"
TILED = "tiled(BM=64,BN=64,BK=64,warps=4,stages=3,group_m=8)"


def entry(gpu, M, N, K, family, impl):
    return Entry(gpu=gpu, cc="", dtype="fp16", acc="fp32", layout="tn", protocol="offline", M=M, N=N, K=K,
                 family=family, impl=impl, algo="", time_ms=0.01, vendor_best_ms=0.01, vendor_best="cublas_tn",
                 m_lo=M, m_hi=M, members=(f"{M}_{N}_{K}",), verified=True)


def per_call_us(fns: dict, n: int = 200, rounds: int = 15) -> dict:
    """Host time per call: each batch of ``n`` calls is queued behind a device sleep long enough to outlast it,
    so no call waits for the GPU (the launch queue holds them) and the time is the host's alone."""
    from gemmrl.timing import max_sm_mhz

    cycles = int(n * 60e-6 * max_sm_mhz(torch.cuda.current_device()) * 1e6)  # 60 us of device sleep per call
    got = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            torch.cuda.synchronize()
            torch.cuda._sleep(cycles)
            t = time.perf_counter()
            for _ in range(n):
                f()
            got[k].append((time.perf_counter() - t) / n * 1e6)
            torch.cuda.synchronize()
    return {k: statistics.median(v) for k, v in got.items()}


def main() -> None:
    meta = {**collect_meta().row(), "timestamp": now()}
    gpu = meta["gpu"]
    rows = []
    for hot, M, N, K, kind, impl in [(hot, M, N, K, kind, impl) for hot in ("torch", "c") for M, N, K in SHAPES
                                     for kind, impl in (("triton", TRITON if M < 64 else TILED),
                                                        ("vendor", "cublaslt_heuristic_tn"), ("none", ""))]:
        dispatch.use_hot_path(hot)
        lib = Library([] if kind == "none" else [entry(gpu, M, N, K, kind, impl)])
        dispatch.use_library(lib)
        a = torch.randn(M, K, device="cuda").half()
        w = torch.randn(N, K, device="cuda").half()
        b = w.t()
        c = torch.empty(M, N, device="cuda", dtype=torch.half)
        served = dispatch._mm_served(a, b)
        with torch.no_grad():
            t = per_call_us({"launcher": lambda: served.eager(a, b, c),
                             "mm_out": lambda: dispatch.mm(a, b, out=c),
                             "mm_out_py": lambda: dispatch._hot_py(a, b, c),
                             "mm": lambda: dispatch.mm(a, b),
                             "linear": lambda: dispatch.linear(a, w),
                             "torch_out": lambda: torch.matmul(a, b, out=c)})
        row = {"mnk": f"{M}_{N}_{K}", "layout": "tn", "served": served.eager_desc, "kind": kind,
               "hot_path": dispatch.hot_path(),
               **{f"{k}_us": round(v, 3) for k, v in t.items()},
               "lookup_us": round(t["mm_out"] - t["launcher"], 3), **meta}
        rows.append(row)
        print(f"{hot:5} {row['mnk']:>16} {kind:6} launcher {t['launcher']:6.2f}  mm(out) {t['mm_out']:6.2f}  mm {t['mm']:6.2f}"
              f"  linear {t['linear']:6.2f}  torch(out) {t['torch_out']:6.2f}  lookup {row['lookup_us']:5.2f} us",
              flush=True)
    out = os.path.join(os.environ.get("GEMMRL_OUT", "."), "dispatch_host_cost.csv")
    with open(out, "w", newline="") as fh:
        wr = csv.DictWriter(fh, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)


if __name__ == "__main__":
    main()
