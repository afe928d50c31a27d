"""Calibrate the battery's tolerance on the GPU: error statistics of every vendor path over 100 seeds on a
sample of the grid (5 seeds on the largest shapes), bf16 and acc-fp16 variants, and the planted wrong
kernels, which must fail. Writes verify_calibration.csv and its summary under $GEMMRL_OUT.

    GEMMRL_OUT=/tmp/out python scripts/calibrate_tolerance.py [--seeds 100] [--sample 30]
"""

from __future__ import annotations

import argparse
import csv
import os

from gemmrl import verify as V
from gemmrl.kernels.vendor import vendor_candidates
from gemmrl.problem import GemmProblem, sample_grid
from gemmrl.results import collect_meta, now


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
        return V.planted_candidates("nn") + V.planted_candidates("tn")

    rows = V.calibrate(small, vendor_candidates, range(args.seeds), "cuda")
    rows += V.calibrate(big, vendor_candidates, range(5), "cuda")
    rows += V.calibrate([p.with_(dtype="bf16") for p in small[:10]], vendor_candidates, range(30), "cuda")
    rows += V.calibrate([p.with_(acc="fp16") for p in small[:10]], vendor_candidates, range(30), "cuda")
    rows += V.calibrate([GemmProblem(64, 64, 64), GemmProblem(128, 256, 4096), GemmProblem(512, 512, 16384),
                         GemmProblem(128, 256, 4096, dtype="bf16")], planted, range(5), "cuda")
    summ = V.calibration_summary(rows)
    meta = {**collect_meta().row(), "timestamp": now()}
    for name, data in (("verify_calibration.csv", rows), ("verify_calibration_summary.csv", summ)):
        with open(os.path.join(out, name), "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(data[0]) + list(meta))
            w.writeheader()
            w.writerows({**r, **meta} for r in data)
    for s in summ:
        print(f"{s['tolerance']:4} {s['dtype']:4} {s['candidate'][:28]:28} n={s['n']} err={s['errors']} fails={s['fails']} "
              f"R={s['r_max']:.3f} R/lim={s['r_over_limit_max']:.2f} elem={s['elem_ratio_max']:.2f} "
              f"beta={s['beta_needed_max']:.2f} worst={s['worst']}")


if __name__ == "__main__":
    main()
