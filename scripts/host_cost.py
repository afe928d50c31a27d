"""Per-call host cost of the ways to call cuBLASLt (our ctypes extension, nvmath-python) and torch.matmul,
to choose the baseline's call path (in CUDA-L2's offline protocol the call path weighs as much as the
kernel). Writes host_cost.csv under $GEMMRL_OUT.

    GEMMRL_OUT=/tmp/out python scripts/host_cost.py
"""

from __future__ import annotations

import csv
import json
import os

from gemmrl.kernels import vendor as V
from gemmrl.problem import GemmProblem
from gemmrl.results import collect_meta, now


def main() -> None:
    out = os.environ.get("GEMMRL_OUT", ".")
    print(json.dumps(V.library_info()))
    meta = {**collect_meta().row(), "timestamp": now()}
    rows = []
    for mnk in [(64, 64, 64), (64, 4096, 64), (1024, 1024, 1024), (64, 4096, 4096)]:
        rows += [{**r, **meta} for r in V.host_cost(GemmProblem(*mnk), n=2000)]
    with open(os.path.join(out, "host_cost.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        print(f"{r['mnk']:>16} {r['path']:16} call {r['call_us_median']:7.2f} us  call+sync {r['call_sync_us_median']:7.2f} us "
              f"{r.get('reason', '')[:80]}")


if __name__ == "__main__":
    main()
