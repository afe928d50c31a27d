"""`gemmrl select`: screen a family's configs per shape (Triton: the cost model's top configs and an exploration
pool; CUTLASS, wgmma, tiny, decode: the family and its knobs) and select one per shape and protocol.

    gemmrl select --shapes shapes.txt --top 16 --explore 8
    gemmrl select --family cutlass --grid cuda-l2 --sample 50 --layouts tn

The selection is timed with short screen settings; re-measure it with ``gemmrl bench --<family>-from CSV``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import date
from pathlib import Path

from ..results import read_rows
from ..timing import TimingConfig
from .common import CliError, check_out, comma_list, gpu_slug, parse_protocols, problems_from, shape_args


def add_parser(sub) -> None:
    s = sub.add_parser("select", help="screen a family's configs per shape (Triton: the cost model's top + exploration; "
                                      "CUTLASS: its family x knobs) to select one per shape and protocol; re-measure "
                                      "with bench --triton-from / --cutlass-from")
    shape_args(s)
    s.add_argument("--protocol", default="graph,cold", help="graph, cold or both")
    s.add_argument("--family", default="triton", choices=("triton", "cutlass", "wgmma", "tiny", "decode"))
    s.add_argument("--top", type=int, default=16, help="the cost model's K best configs per shape and layout")
    s.add_argument("--explore", type=int, default=8, help="more configs per shape and layout from a shared random pool")
    s.add_argument("--layouts", default="tn,nn", help="the layouts our kernels are screened in: tn (reads B^T), nn, or both")
    s.add_argument("--chunk", type=int, default=16, help="configs timed together (interleaved with the references)")
    s.add_argument("--timing", default="screen", choices=("screen", "full"),
                   help="screen: short settings (1 ms graphs, 5 replays, 7 cold calls, 30 ms settle); full: the bench's "
                        "own settings (10 ms graphs, >= 500 ms timed, 25 cold calls, settled clocks), for shapes where "
                        "the short run's boosted clock picks configs that lose under the power cap")
    s.add_argument("--pdl", default="off", choices=("off", "on", "both"),
                   help="Triton: screen each config without programmatic dependent launch, with it, or both side by "
                        "side (Hopper: a call's launch overlaps the previous kernel)")
    s.add_argument("--configs", default="",
                   help="cutlass: comma-separated configs to screen instead of its family (names as in the CSVs, e.g. "
                        "coop_128x160x64_c2x1_persistent_tn_fp16_swap; each is screened in every --layouts layout and the "
                        "shape's dtype; 'family' adds the family). triton: configs screened beside --top and --explore "
                        "(0 and 0 for these alone) where valid for the shape, separated by ';' or given as @FILE (one "
                        "per line), e.g. 'tiled(BM=16,BN=32,BK=64,warps=2,stages=5,group_m=1)'")
    s.add_argument("--knobs", default="screen", choices=("screen", "all"),
                   help="cutlass: the scheduler knobs screened per config: screen (defaults, swizzle 8 on large grids, "
                        "stream-K splits) or all (every swizzle x raster order, and stream-K's decompositions)")
    s.add_argument("--variants", default="",
                   help="triton: comma-separated variants to screen (tiled, persistent, splitk, smallm; default all), "
                        "e.g. splitk: the cost model's --top and --explore configs of those variants only")
    s.add_argument("--diverse", action="store_true",
                   help="triton: the --top configs one per (variant, tile, split, reduction), each its group's best by "
                        "the cost model, instead of the model's K best (which crowd into twins of one kernel)")
    s.add_argument("--retrieve", nargs="+", metavar="CSV",
                   help="triton: earlier screens (gemmrl select CSVs or glob patterns, e.g. "
                        "'benchmarks/results/h100/h100_*triton-select*.csv.gz'); their fastest configs on the shapes nearest "
                        "each one screened are timed beside the others, each in the layout it won in")
    s.add_argument("--retrieve-shapes", type=int, default=2,
                   help="--retrieve: the nearest screened shapes (log-distance in M, N, K) drawn from, the shape itself "
                        "first where it was screened")
    s.add_argument("--retrieve-per-shape", type=int, default=2,
                   help="--retrieve: the fastest distinct configs per drawn shape and protocol")
    s.add_argument("--retrieve-any-gpu", action="store_true",
                   help="--retrieve: use rows measured on any GPU (default: only the screens of the GPU screened on; "
                        "another GPU's winners are refused with the GPUs the files hold)")
    s.add_argument("--workers", type=int, help="compile processes (default: CPU count - 1)")
    s.add_argument("--out", default="benchmarks/results", help="directory or .csv path; an existing file is resumed")
    s.add_argument("--no-progress", action="store_true")
    s.set_defaults(func=cmd_select)


def _config_names(text: str | None, family: str) -> tuple[str, ...]:
    """``gemmrl select --configs``: CUTLASS names are a comma list; Triton configs (``str(cfg)`` holds commas) are
    separated by ';' or newlines, and ``@FILE`` reads them from a file, one per line ('#' starts a comment)."""
    text = (text or "").strip()
    if family != "triton":
        return comma_list(text)
    if text.startswith("@"):
        path = Path(text[1:])
        if not path.is_file():
            raise CliError(f"--configs {text}: no such file; give Triton configs separated by ';' or @FILE")
        text = "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())
    return tuple(x.strip() for x in text.replace("\n", ";").split(";") if x.strip())


def cmd_select(args) -> int:
    from ..measure.bench import require_cuda  # start-up cost: the bench, not needed by --help
    from ..search.screen import ScreenSpec, run_screen, selection_table  # start-up cost: the screen

    problems, what = problems_from(args)
    for name in ("top", "explore", "chunk"):
        if getattr(args, name) < 0:
            raise CliError(f"--{name} must be >= 0, got {getattr(args, name)}")
    if args.workers is not None and args.workers < 1:
        raise CliError(f"--workers must be >= 1 (leave it out for CPU count - 1), got {args.workers}")
    protocols = parse_protocols(args.protocol)
    if set(protocols) - {"graph", "cold"}:
        raise CliError("gemmrl select screens in the device protocols graph and cold; re-measure the selection "
                       "with gemmrl bench --triton-from for the host protocols")
    out = Path(args.out)
    check_out(out)
    try:  # every flag checked before the GPU is asked for; the derived file name needs it
        spec = ScreenSpec(problems=tuple(problems), out=out, top=args.top, explore=args.explore, chunk=args.chunk or 16,
                          layouts=comma_list(args.layouts),
                          protocols=protocols, seed=args.seed, device=args.gpu_device_id, workers=args.workers,
                          family=args.family, pdl=args.pdl,
                          configs=_config_names(args.configs, args.family),
                          all_knobs=args.knobs == "all",
                          variants=comma_list(args.variants),
                          diverse=args.diverse,
                          retrieve=tuple(args.retrieve or ()), retrieve_shapes=args.retrieve_shapes,
                          retrieve_per_shape=args.retrieve_per_shape, retrieve_any_gpu=args.retrieve_any_gpu,
                          **({"timing": TimingConfig()} if args.timing == "full" else {}))
        if spec.retrieve:
            from ..search.retrieve import read_winners  # start-up cost: only with --retrieve

            read_winners(spec.retrieve, spec.retrieve_per_shape)  # its rows checked here; read once (cached)
    except ValueError as e:
        raise CliError(str(e)) from None
    require_cuda(args.gpu_device_id)
    if out.suffix != ".csv":
        import torch  # start-up cost: torch

        torch.cuda.set_device(args.gpu_device_id)
        tag = (f"triton-select-top{args.top}-explore{args.explore}" + ("" if args.pdl == "off" else f"-pdl-{args.pdl}")
               if args.family == "triton" else f"{args.family}-select") + ("-full-timing" if args.timing == "full" else "") \
            + (f"-configs{len(spec.configs)}" if spec.configs else "") + ("-all-knobs" if spec.all_knobs else "") \
            + (f"-{'-'.join(spec.variants)}" if spec.variants else "") + ("-diverse" if spec.diverse else "") \
            + ("-retrieved" if spec.retrieve else "")
        spec = replace(spec, out=out / f"{gpu_slug()}_{what}_{tag}_{date.today().isoformat()}.csv")
    from ..search.retrieve import RetrieveError  # start-up cost: the retrieval module, not needed by --help

    try:
        path = run_screen(spec, progress=not args.no_progress)
    except RetrieveError as e:  # the retrieved rows are filtered by this GPU once it is known, before any timing
        raise CliError(str(e)) from None
    table = selection_table(read_rows([path]))
    print(f"\nrows: {path}\nselected per shape and protocol (screen timing; re-measure with "
          f"gemmrl bench --{args.family}-from {path}):")
    for t in table:
        print(f"  {t['mnk']:>20} {t['protocol']:5} {t['best_ms'] * 1e3:9.2f} us  vs {t['ref']} "
              f"{t['ref_ms'] * 1e3:9.2f} us  x{t['ratio']:.3f}  {t['config']}")
    return 0
