"""Why memory-bound shapes sit at about half of HBM bandwidth in the ``cold`` protocol: the flush writes 2x L2,
so the L2 the GEMM finds is full of dirty lines, and each line it brings in first writes one back.

Times one call of torch.matmul (and a plain read, ``x.sum()``) after three kinds of flush of 2x L2:
``write`` (what timing.time_cold does: ``fill_``, dirty lines), ``read`` (a sum over the buffer: clean lines)
and ``none`` (warm). Median of 25 calls each, events, the GPU kept busy before the start event.

    PYTHONPATH=src GEMMRL_OUT=$OUT python3 benchmarks/acceptance/cold_dirty_probe.py
"""

from __future__ import annotations

import csv
import os
import statistics

import torch

from gemmrl.results import collect_meta, now
from gemmrl.timing import _event_ms, l2_bytes


def main() -> None:
    out = os.environ.get("GEMMRL_OUT", ".")
    dev = torch.cuda.current_device()
    flush = torch.empty(2 * l2_bytes(dev) // 4, dtype=torch.int32, device="cuda")
    flushes = {"write": lambda i: flush.fill_(i), "read": lambda i: flush.sum(), "none": lambda i: None}
    meta = {**collect_meta().row(), "timestamp": now()}
    rows = []
    for m, n, k in ((1, 4096, 4096), (32, 4096, 4096), (1, 14336, 4096), (64, 4096, 4096)):
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        bt = torch.randn(n, k, device="cuda", dtype=torch.float16)
        c = torch.empty(m, n, device="cuda", dtype=torch.float16)
        ops = {"matmul": lambda: torch.matmul(a, bt.t(), out=c), "read_B": lambda: bt.sum()}
        nbytes = 2 * (m * k + n * k + m * n)
        for op, fn in ops.items():
            for kind, fl in flushes.items():
                fn()
                xs = []
                for i in range(25):
                    fl(i)
                    xs.append(_event_ms(fn))
                t = statistics.median(xs)
                rows.append({"mnk": f"{m}_{n}_{k}", "op": op, "flush": kind, "time_us": round(t * 1e3, 3),
                             "bytes": nbytes, "gb_s": round(nbytes / (t * 1e-3) / 1e9, 1), **meta})
                print(f"{m}_{n}_{k:<6} {op:7} flush={kind:5} {t * 1e3:8.2f} us  {nbytes / (t * 1e-3) / 1e9:7.0f} GB/s")
    with open(os.path.join(out, "cold_dirty_probe.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
