"""Compile throughput of the CUTLASS SM90 family: every config of ``cutlass_sm90.family()`` built from scratch
(an empty cache) with ``--jobs`` parallel nvcc processes; one CSV row per config and a summary row.

    python benchmarks/acceptance/compile_throughput.py --jobs 16 --out DIR
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--arch", default="90a")
    ap.add_argument("--out", default=".")
    ap.add_argument("--limit", type=int, default=0, help="only the first N configs (0: all)")
    args = ap.parse_args(argv)
    os.environ["GEMMRL_CACHE_DIR"] = tempfile.mkdtemp(prefix="gemmrl_compile_bench_")  # nothing cached
    from gemmrl.kernels import cutlass_sm90 as cs
    from gemmrl.kernels.toolchain import find_nvcc, nvcc_version
    from gemmrl.results import git_sha, now

    cfgs = cs.family()[: args.limit or None]
    t0 = time.perf_counter()
    built = cs.build_family(cfgs, args.arch, jobs=args.jobs, progress=True)
    wall = time.perf_counter() - t0
    ok = sum(b.ok for b in built.values())
    common = {"nvcc": nvcc_version(find_nvcc()), "cpus": os.cpu_count(), "jobs": args.jobs, "host": platform.node(),
              "git_sha": git_sha(), "timestamp": now()}
    rows = [{"config": str(c), "ok": b.ok, "seconds": b.seconds, "registers": b.ptxas.max_registers,
             "spill_bytes": b.ptxas.spill_store_bytes + b.ptxas.spill_load_bytes,
             "error": str(b.error or ""), **common} for c, b in built.items()]
    rows.append({"config": "ALL", "ok": ok, "seconds": round(wall, 2), "registers": "", "spill_bytes": "",
                 "error": f"{len(cfgs)} configs, {ok} built, {60 * len(cfgs) / wall:.2f} configs/min", **common})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"cutlass-compile-throughput_jobs{args.jobs}_{time.strftime('%Y-%m-%d')}.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    per = sorted(b.seconds for b in built.values())
    print(f"compile throughput: {len(cfgs)} CUTLASS configs, {ok} built, {wall:.1f} s wall with {args.jobs} jobs on "
          f"{os.cpu_count()} CPUs = {60 * len(cfgs) / wall:.2f} configs/min (per config {per[0]:.0f}-{per[-1]:.0f} s, "
          f"median {per[len(per) // 2]:.0f} s) -> {path}")
    return 0 if ok == len(cfgs) else 1


if __name__ == "__main__":
    sys.exit(main())
