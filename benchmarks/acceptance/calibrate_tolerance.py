"""Calibrate the battery's tolerance on the GPU: error statistics of every vendor path over 100 seeds on a
sample of the grid (5 seeds on the largest shapes), bf16 and acc-fp16 variants, and the planted wrong
kernels, which must fail. Writes verify_calibration.csv and its summary under $GEMMRL_OUT.

    GEMMRL_OUT=/tmp/out python benchmarks/acceptance/calibrate_tolerance.py [--seeds 100] [--sample 30]
"""

from __future__ import annotations

import argparse
import csv
import os
import time

from gemmrl import verify as V
from gemmrl.adversarial.planted import planted_candidates
from gemmrl.kernels.vendor import vendor_candidates
from gemmrl.problem import GemmProblem, sample_grid
from gemmrl.results import collect_meta, now


def _write(path: str, data: list[dict], meta: dict) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(data[0]) + list(meta))
        w.writeheader()
        w.writerows({**r, **meta} for r in data)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--sample", type=int, default=30)
    args = ap.parse_args()
    out = os.environ.get("GEMMRL_OUT", ".")
    odd = [GemmProblem(*s) for s in [(1, 4096, 4096), (7, 4096, 16384), (64, 64, 16384), (257, 129, 1000), (33, 65, 129)]]
    probs = sample_grid(args.sample, seed=0) + odd
    small = [p for p in probs if p.M * p.N * p.K <= 2**33]
    big = [p for p in probs if p.M * p.N * p.K > 2**33]

    def planted(p):
        return planted_candidates("nn") + planted_candidates("tn")

    plan = ([(p, vendor_candidates, range(args.seeds)) for p in small]
            + [(p, vendor_candidates, range(5)) for p in big]
            + [(p.with_(dtype="bf16"), vendor_candidates, range(30)) for p in small[:10]]
            + [(p.with_(acc="fp16"), vendor_candidates, range(30)) for p in small[:10]]
            + [(p, planted, range(5)) for p in (GemmProblem(64, 64, 64), GemmProblem(128, 256, 4096),
                                               GemmProblem(512, 512, 16384), GemmProblem(128, 256, 4096, dtype="bf16"))])
    meta = {**collect_meta().row(), "timestamp": now()}
    rows: list[dict] = []
    t0 = time.time()
    for i, (p, cands, seeds) in enumerate(plan, 1):
        rows += V.calibrate([p], cands, seeds, "cuda")
        _write(os.path.join(out, "verify_calibration.csv"), rows, meta)  # partial results survive a timeout
        print(f"[{i}/{len(plan)} {time.time() - t0:5.0f}s] {p.mnk} {p.dtype} acc={p.acc}", flush=True)
    summ = V.calibration_summary(rows)
    _write(os.path.join(out, "verify_calibration_summary.csv"), summ, meta)
    for s in summ:
        print(f"{s['tolerance']:4} {s['dtype']:4} {s['candidate'][:28]:28} n={s['n']} err={s['errors']} fails={s['fails']} "
              f"R={s['r_max']:.3f} R/lim={s['r_over_limit_max']:.2f} elem={s['elem_ratio_max']:.2f} "
              f"beta={s['beta_needed_max']:.2f} worst={s['worst']}")


if __name__ == "__main__":
    main()
