"""`gemmrl headroom`: how much room the vendor leaves, per shape and protocol (headroom.py says what is measured).

    gemmrl headroom --shapes benchmarks/shapes/decode-grid120.txt --protocol graph,cold
    gemmrl headroom --grid cuda-l2 --protocol cold --vendor torch,cublaslt_heuristic_tn --quick
    gemmrl headroom --table benchmarks/results/h100/h100_headroom_*.csv*     # the class table of finished runs, no GPU

Rows go to ``--out`` as each (shape, protocol) finishes (a killed run resumes where it stopped).
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

from ..kernels.touch import CONFIGS, TouchError, parse
from ..measure.headroom import CLASSES, VENDOR_DEFAULT, HeadroomError, bounds, by_class, measure_shape
from ..results import ResultsWriter, collect_meta, read_rows
from ..timing import TimingConfig
from .common import CliError, check_out, gpu_slug, parse_protocols, problems_from, shape_args


def add_parser(sub) -> None:
    h = sub.add_parser("headroom", help="the fastest any GEMM could run per shape (a probe that only reads A, B and "
                                        "writes C, and the tensor-core peak), against the vendor paths timed beside it")
    shape_args(h)
    h.add_argument("--protocol", default="graph,cold", help="graph and/or cold (device-time protocols)")
    h.add_argument("--vendor", default=",".join(VENDOR_DEFAULT),
                   help="vendor paths timed beside the probe (fewer paths: a looser, never a wrong, bound)")
    h.add_argument("--touch", help="probe configs, touch_b<BLOCK>_w<WARPS> comma list (default: all of touch.CONFIGS)")
    h.add_argument("--quick", action="store_true",
                   help="sweep settings: 50 ms settle (200 ms at most) and 2 ms graphs instead of 200 ms and 10 ms")
    h.add_argument("--out", default="benchmarks/results", help="directory (file name derived) or a .csv path; an "
                                                             "existing file is resumed")
    h.add_argument("--table", nargs="+", metavar="CSV", help="print the class table of these finished runs (no GPU)")
    h.add_argument("--no-progress", action="store_true")
    h.set_defaults(func=cmd_headroom)


def format_table(hs) -> str:
    lines = ["| class | protocol | shapes | geomean headroom | median | min | max | within 2% of the bound |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for h in hs:
        lines.append(f"| {h.cls} | {h.protocol} | {h.n} | {h.geomean:.3f} | {h.median:.3f} | {h.lo:.3f} | "
                     f"{h.hi:.3f} | {h.at_floor} |")
    return "\n".join(lines)


def cmd_headroom(args) -> int:
    if args.table:
        missing = [p for p in args.table if not Path(p).is_file()]
        if missing:
            raise CliError(f"--table: no such file(s): {', '.join(missing)}")
        bs = bounds(read_rows(args.table))
        if not bs:
            raise CliError("--table: no (shape, protocol) in these files has both a verified vendor row and a probe "
                           "row; give the CSVs of a gemmrl headroom run")
        print(format_table(by_class(bs, CLASSES)))
        return 0
    import torch  # start-up cost: torch (not needed by --table)

    from ..measure.bench import _progress, require_cuda  # start-up cost: the bench, not needed by --help

    if args.kernel_dir:
        raise CliError("--kernel-dir: headroom times the vendor paths and the probe only; measure imported kernels "
                       "with gemmrl bench --kernel-dir")
    protocols = parse_protocols(args.protocol)
    bad = [p for p in protocols if p not in ("graph", "cold")]
    if bad:
        raise CliError(f"--protocol {','.join(bad)}: headroom is measured in device time; use graph and/or cold")
    problems, what = problems_from(args)
    vendor = tuple(v.strip() for v in args.vendor.split(",") if v.strip())
    if not vendor:
        raise CliError("--vendor names no path; give at least one (e.g. cublaslt_heuristic_tn)")
    try:
        touch = tuple(parse(t.strip()) for t in args.touch.split(",") if t.strip()) if args.touch else CONFIGS
    except TouchError as e:
        raise CliError(f"--touch: {e}") from None
    if not touch:
        raise CliError("--touch names no config; leave it out for all of them")
    check_out(Path(args.out))
    require_cuda(args.gpu_device_id)
    torch.cuda.set_device(args.gpu_device_id)
    torch.set_grad_enabled(False)
    cfg = TimingConfig()  # timing seeds: fresh per measurement, in the rows
    if args.quick:
        cfg = cfg.quick()
    out = Path(args.out)
    if out.suffix != ".csv":
        out = out / f"{gpu_slug()}_headroom_{what}_{'-'.join(protocols)}_{date.today().isoformat()}.csv"
    writer = ResultsWriter(out)
    meta = collect_meta(args.gpu_device_id).row()
    bar = None if args.no_progress else _progress(len(problems), "headroom")
    try:
        for p in problems:
            todo = [x for x in protocols if (p.mnk, p.dtype, p.acc, x, "0") not in writer.done]
            if todo:
                try:
                    got = measure_shape(p, todo, vendor, touch, cfg, meta, args.gpu_device_id)
                except HeadroomError as e:
                    raise CliError(str(e)) from None
                for proto in todo:
                    writer.write_batch(got[proto])
                torch.cuda.empty_cache()
            if bar:
                bs = bounds(r for x in got.values() for r in x) if todo else []
                if bs:
                    bar.set_postfix_str(" ".join(f"{b.protocol} x{b.headroom:.2f}" for b in bs) + f" {p.mnk}")
                bar.update(1)
    finally:
        if bar:
            bar.close()
    bs = bounds(read_rows([out]))
    print(f"\nrows: {out}\n")
    if bs:
        print(format_table(by_class(bs, CLASSES)))
    return 0 if bs else 1
