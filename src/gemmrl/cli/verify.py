"""`gemmrl verify`: the battery (and CUDA-L2's own 0/1 check, reported beside it) over vendor paths,
planted wrong kernels and an imported kernel set; or, with ``--calibrate``, the error statistics the
tolerance constants are calibrated on. Rows carry the machine metadata of the results schema.

    gemmrl verify --mnk 64_4096_64 --planted --out benchmarks/results/verify.csv
    gemmrl verify --grid cuda-l2 --sample 20 --calibrate --seeds 5
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Iterable

from ..adversarial.planted import planted_candidates
from ..kernels.vendor import vendor_candidates
from ..problem import GemmProblem
from ..results import collect_meta, now
from .common import CliError, problems_from, shape_args


def add_parser(sub) -> None:
    v = sub.add_parser("verify", help="run the correctness battery (and CUDA-L2's own check) on candidates")
    shape_args(v)
    v.add_argument("--planted", action="store_true", help="also the planted wrong kernels (must all be rejected)")
    v.add_argument("--no-vendor", action="store_true", help="skip the vendor paths")
    v.add_argument("--seeds", type=int, default=3, help="random trials per candidate (calibration: seeds per shape)")
    v.add_argument("--calibrate", action="store_true", help="write the error statistics the tolerance is calibrated on")
    v.add_argument("--out", default="benchmarks/results/verify.csv")
    v.set_defaults(func=cmd_verify)


def cmd_verify(args) -> int:
    problems, _ = problems_from(args)
    if args.seeds < 1:
        raise CliError(f"--seeds must be >= 1 (random trials per candidate), got {args.seeds}")
    if args.kernel_dir and not Path(args.kernel_dir).is_dir():
        raise CliError(f"--kernel-dir {args.kernel_dir}: not a directory of M_N_K.cu files")
    if Path(args.out).is_dir():
        raise CliError(f"--out {args.out}: a directory; give a .csv path")
    out = run_verify(problems, out=Path(args.out), planted=args.planted, vendor=not args.no_vendor,
                     kernel_dir=args.kernel_dir, kernel_acc=args.kernel_acc, seeds=args.seeds,
                     calibrate=args.calibrate, device=args.gpu_device_id)
    print(out)
    return 0


def _factory(vendor: bool, planted: bool, imported: dict | None, kernel_dir: str | None):
    def make(problem: GemmProblem) -> list:
        out: list = []
        if vendor:
            out += vendor_candidates(problem)
        if planted:
            out += planted_candidates("nn") + planted_candidates("tn")
        if imported is not None:
            got = imported.get(problem.mnk)
            if got is not None and callable(got) and hasattr(got, "layout"):
                out.append(got)
        return out

    return make


def _import_failures(problems: Iterable[GemmProblem], imported: dict, kernel_dir: str) -> list[dict]:
    rows = []
    name = f"import:{Path(kernel_dir).name}"
    for p in problems:
        got = imported.get(p.mnk)
        if got is None or getattr(got, "missing", False):
            rows.append({"mnk": p.mnk, "dtype": p.dtype, "acc": p.acc, "candidate": name, "check": "build",
                         "verified": False, "reason": f"no {p.mnk}.cu in {kernel_dir}"})
        elif not (callable(got) and hasattr(got, "layout")):
            rows.append({"mnk": p.mnk, "dtype": p.dtype, "acc": p.acc, "candidate": name, "check": "build",
                         "verified": False,
                         "reason": f"build failed: {getattr(got, 'reason', None) or getattr(got, 'message', got)}"[:400]})
    return rows


def _write(rows: list[dict], out: Path, meta: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [{**r, **meta} for r in rows]
    fields: list[str] = []
    for r in rows:
        fields += [k for k in r if k not in fields]
    with open(out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def run_verify(problems: list[GemmProblem], *, out: Path, planted: bool = False, vendor: bool = True,
               kernel_dir: str | None = None, kernel_acc: str = "fp32", seeds: int = 3, calibrate: bool = False,
               device: int = 0) -> str:
    """Run and write ``out``; returns a short text table."""
    import torch  # start-up cost: torch

    from .. import verify as V  # start-up cost: the battery, not needed by --help
    from ..measure.bench import require_cuda  # start-up cost: the bench, not needed by --help

    require_cuda(device)
    torch.cuda.set_device(device)
    meta = {**collect_meta(device).row(), "timestamp": now()}
    imported = None
    if kernel_dir:
        from ..kernels.cuda_l2_import import load_kernel_dir  # start-up cost: only with --kernel-dir

        imported = load_kernel_dir(kernel_dir, problems, acc=kernel_acc)
    make = _factory(vendor, planted, imported, kernel_dir)
    if calibrate:
        rows = V.calibrate(problems, make, range(seeds), "cuda")
        _write(rows, out, meta)
        summ = V.calibration_summary(rows)
        _write(summ, out.with_name(out.stem + "_summary.csv"), meta)
        lines = [f"{s['tolerance']:4} {s['dtype']:4} {s['candidate'][:28]:28} n={s['n']} fails={s['fails']} "
                 f"R={s['r_max']:.3f} R/lim={s['r_over_limit_max']:.2f} elem={s['elem_ratio_max']:.2f} worst={s['worst']}"
                 for s in summ]
        return "\n".join([f"calibration rows: {out}"] + lines)
    rows: list[dict] = []
    if imported is not None and kernel_dir:
        rows += _import_failures(problems, imported, kernel_dir)
    for p in problems:  # written after every shape: a run stopped by a time limit keeps what it checked
        rows += V.verify_rows([p], make, "cuda", trials=seeds, cuda_l2=True)
        _write(rows, out, meta)
    _write(rows, out, meta)
    lines = [f"verify rows: {out}", f"{'mnk':>18} {'candidate':34} {'check':8} verdict  reason"]
    for r in rows:
        lines.append(f"{r['mnk']:>18} {str(r['candidate'])[:34]:34} {r['check']:8} "
                     f"{'PASS' if r['verified'] else 'FAIL':7}  {str(r.get('reason', ''))[:110]}")
    return "\n".join(lines)
