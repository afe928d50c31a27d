"""Per-call host cost of the ways to call cuBLASLt (our ctypes extension, nvmath-python) and torch.matmul,
to choose the baseline's call path (in CUDA-L2's offline protocol the call path weighs as much as the
kernel), and of our Triton kernels' two launch paths (``triton_direct``: the compiled kernel's C launcher with
bound arguments; ``triton_jit``: Triton's own ``kernel[grid](...)``). Writes host_cost.csv under $GEMMRL_OUT.

    GEMMRL_OUT=/tmp/out python benchmarks/acceptance/host_cost.py
"""

from __future__ import annotations

import csv
import json
import os

from gemmrl.kernels import vendor as V
from gemmrl.problem import GemmProblem
from gemmrl.results import collect_meta, now


def _triton_paths() -> dict:
    from gemmrl.kernels.triton_gemm import TiledConfig, TritonGemm

    def make(mode):
        def factory(problem, bufs):
            old = os.environ.get("GEMMRL_TRITON_LAUNCH")
            os.environ["GEMMRL_TRITON_LAUNCH"] = mode
            try:
                cand = TritonGemm(TiledConfig(64, 64, 64, 4, 3, 8), layout=problem.layout, acc=problem.acc)
                cand.prepare(problem, bufs, "offline", None)
            finally:
                if old is None:
                    os.environ.pop("GEMMRL_TRITON_LAUNCH")
                else:
                    os.environ["GEMMRL_TRITON_LAUNCH"] = old
            if cand.launch_path != mode:
                raise RuntimeError(f"asked for the {mode} launch path, got {cand.launch_path} ({cand.launch_note})")
            return cand
        return factory

    return {"triton_direct": make("direct"), "triton_jit": make("jit")}


def main() -> None:
    out = os.environ.get("GEMMRL_OUT", ".")
    print(json.dumps(V.library_info()))
    meta = {**collect_meta().row(), "timestamp": now()}
    rows = []
    for mnk in [(64, 64, 64), (64, 4096, 64), (1024, 1024, 1024), (64, 4096, 4096)]:
        rows += [{**r, **meta} for r in V.host_cost(GemmProblem(*mnk), n=2000, extra=_triton_paths())]
    with open(os.path.join(out, "host_cost.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        print(f"{r['mnk']:>16} {r['path']:16} call {r['call_us_median']:7.2f} us  call+sync {r['call_sync_us_median']:7.2f} us "
              f"{r.get('reason', '')[:80]}")


if __name__ == "__main__":
    main()
