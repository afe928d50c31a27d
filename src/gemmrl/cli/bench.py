"""`gemmrl bench`: verify, then time candidates (imported kernels, the cost model's top Triton configs, a selection
run's picks, the library, untrusted CUDA sources in a sandbox) against the vendor baselines.

    gemmrl bench --mnk 64_4096_64 --protocol graph,cold,offline
    gemmrl bench --grid cuda-l2 --sample 60 --triton-top 8 --out benchmarks/results
    gemmrl bench --shapes shapes.txt --triton-from select.csv --library default

Without a CUDA GPU nothing is timed: the Triton kernels the flags name (else the cost model's best per shape) are
verified under Triton's interpreter instead, and the output says what needs a GPU (``cpu_bench``).
Rows go to ``--out`` (a directory: file name derived; a .csv: resumed) and a markdown summary beside them.
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import replace
from datetime import date
from pathlib import Path

from ..kernels.cuda_source import CudaSource, CudaSourceError, ShapeRange
from ..library import Library, LibraryError, load_default
from ..problem import read_shape_labels
from ..results import ResultsError
from ..summary import BASELINES
from ..timing import HOST_LOOPS, PROTOCOLS, TimingConfig
from . import cpu_bench
from .common import CliError, check_out, comma_list, gpu_slug, parse_protocols, problems_from, shape_args


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="verify, then time candidates against the vendor baselines")
    shape_args(b)
    b.add_argument("--protocol", default="graph,cold,offline", help=f"comma list of {','.join(PROTOCOLS)}")
    b.add_argument("--mode", help="CUDA-L2's name for --protocol offline|server")
    b.add_argument("--target-qps", type=float, default=100.0, help="server mode: mean arrivals per second")
    b.add_argument("--warmup-seconds", type=float, help="offline/server warm-up (default 5 for one shape, 0.25 in sweeps)")
    b.add_argument("--benchmark-seconds", type=float, help="offline/server duration (default 10 for one shape, 1 in sweeps)")
    b.add_argument("--pin-cpu", action="store_true",
                   help="offline/server: hold the timing thread on one CPU for each loop (rows say pinned_cpu=N)")
    b.add_argument("--host-loop", default="pairs", choices=HOST_LOOPS,
                   help="offline/server: pairs (default, CUDA-L2's harness) times one loop per vendor path, holding "
                        "the kernels measured and that path; all: one loop of every candidate (rows say host_loop=)")
    b.add_argument("--repeat", type=int, default=1, help="measure every (shape, protocol) this many times (rep column)")
    b.add_argument("--baselines", metavar="LIST",
                   help="time only these vendor paths (comma list of torch, cublas_tn, cublas_nn, cublaslt_heuristic_tn, "
                        "cublaslt_heuristic_nn, cublaslt_autotuned_tn, cublaslt_autotuned_nn; default all). An aggregate "
                        "(cublas, cublaslt_*, vendor_best) is written only where all its members ran, e.g. "
                        "cublaslt_autotuned_tn,cublaslt_autotuned_nn for CUDA-L2's offline statistic alone")
    b.add_argument("--timing", default="full", choices=("full", "quick"),
                   help="graph/cold statistics: full (200 ms settle, 10 ms graphs, >= 500 ms of timed replays per path) "
                        "or quick (50 ms, 2 ms, >= 100 ms: ~4x less device time, for re-measuring hundreds of shapes; "
                        "recorded in each graph row's info)")
    b.add_argument("--out", default="benchmarks/results", help="directory (file name derived) or a .csv path; an existing file is resumed")
    b.add_argument("--triton-from", nargs="+", metavar="CSV",
                   help="re-measure the Triton configs a --triton-top run selected (per shape and protocol, its "
                        "fastest verified config), as triton-sel:<protocols> candidates: the unbiased second run")
    b.add_argument("--cutlass-from", nargs="+", metavar="CSV",
                   help="re-measure the CUTLASS (config, knobs) a `gemmrl select --family cutlass` run selected, as "
                        "cutlass-sel:<protocols> candidates")
    b.add_argument("--wgmma-from", nargs="+", metavar="CSV",
                   help="re-measure the wgmma configs a `gemmrl select --family wgmma` run selected, as "
                        "wgmma-sel:<protocols> candidates")
    b.add_argument("--tiny-from", nargs="+", metavar="CSV",
                   help="re-measure the tiny configs a `gemmrl select --family tiny` run selected, as "
                        "tiny-sel:<protocols> candidates")
    b.add_argument("--decode-from", nargs="+", metavar="CSV",
                   help="re-measure the decode configs a `gemmrl select --family decode` run selected, as "
                        "decode-sel:<protocols> candidates")
    b.add_argument("--triton-top", type=int, default=0, metavar="K",
                   help="also verify and time the cost model's K best Triton configs per shape (a few of each "
                        "variant), named triton:<config>; 0 (default) = off")
    b.add_argument("--library", metavar="FILE|default",
                   help="also time `gemmrl` (each call gemmrl.mm, served from this library JSON, or 'default': the "
                        "package's and the user's) against the vendor paths")
    b.add_argument("--cuda-source", nargs="+", metavar="FILE.cu",
                   help="untrusted CUDA C++ candidates, built here and verified and timed beside the vendor paths in "
                        "sandboxed worker processes (a crash, hang or fault costs only its worker and is recorded)")
    b.add_argument("--entry", help="--cuda-source: the entry point (default gemmrl_gemm; cuda_l2_h100_fp32 for --abi cuda_l2)")
    b.add_argument("--abi", default="gemmrl", choices=("gemmrl", "cuda_l2"),
                   help="--cuda-source: gemmrl (extern \"C\" int entry(A, B, C, M, N, K, lda, ldb, ldc, workspace, "
                        "workspace_bytes, stream)) or cuda_l2 (CUDA-L2's torch-tensor entry, one shape)")
    b.add_argument("--source-layout", default="tn", choices=("tn", "nn"), help="--cuda-source: the B it reads")
    b.add_argument("--declare", default="", help="--cuda-source: shapes it handles (M_N_K[,...] or e.g. "
                                                 "'M=1..64,N%%8,K%%8'; default any, or the file's M_N_K name for cuda_l2)")
    b.add_argument("--sandbox-timeout", type=float, default=300.0, help="--cuda-source: seconds per shape before the "
                                                                        "worker is killed")
    b.add_argument("--no-progress", action="store_true")
    b.set_defaults(func=cmd_bench)


def _triton_top(k: int) -> tuple:
    """BenchSpec.extra for --triton-top K: the cost model's K best Triton configs per shape (none for 0)."""
    if k < 0:
        raise CliError(f"--triton-top takes a count of configs per shape, >= 0 (0 = off); got {k}")
    if k == 0:
        return ()
    from ..search.top import top_candidates  # start-up cost: only with --triton-top

    return (functools.partial(top_candidates, k=k),)


def _selection_from(flag: str, paths: list[str] | None, problems) -> tuple:
    """BenchSpec.extra for --triton-from / --cutlass-from CSV...: the configs a selection run picked, re-measured."""
    if not paths:
        return ()
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise CliError(f"--{flag}-from: no such file(s): {', '.join(missing)} (give the CSVs of a gemmrl select run)")
    from ..search.selection import load_selection, selected_candidates  # start-up cost: only with --<family>-from

    try:
        sel = load_selection(paths, flag)
    except (ResultsError, ValueError) as e:
        raise CliError(f"--{flag}-from: {e}") from None
    if not sel:
        hint = "--triton-top K" if flag == "triton" else f"gemmrl select --family {flag}"
        raise CliError(f"--{flag}-from: no verified {flag}:* rows in {', '.join(paths)}; run {hint} first")
    lacking = sorted({p.mnk for p in problems} - set(sel))
    if lacking:
        print(f"--{flag}-from: no selected config for {len(lacking)} shape(s) (other paths only there): "
              f"{', '.join(lacking[:8])}{' ...' if len(lacking) > 8 else ''}", file=sys.stderr)
    return (functools.partial(selected_candidates, selection=sel, name=flag),)


def _baselines(text: str | None) -> tuple[str, ...] | None:
    """--baselines LIST: the vendor paths to time (None: all)."""
    if text is None:
        return None
    got = comma_list(text)
    bad = [x for x in got if x not in BASELINES]
    if bad or not got:
        raise CliError(f"--baselines {text!r}: {'unknown ' + ', '.join(bad) if bad else 'no path named'}; give a comma "
                       f"list of {', '.join(BASELINES)}")
    return got


def _cuda_sources(args) -> tuple:
    """--cuda-source FILE...: the declared candidates (entry, ABI, layout, shapes), one per file."""
    out = []
    for f in args.cuda_source:
        path = Path(f)
        if not path.is_file():
            raise CliError(f"--cuda-source {f}: no such file")
        if args.abi == "cuda_l2" and not args.declare and not re.fullmatch(r"\d+_\d+_\d+", path.stem):
            raise CliError(f"--cuda-source {f}: a cuda_l2-ABI file serves the one shape its name says (M_N_K.cu); "
                           "rename it or pass --declare M_N_K")
        try:
            declare = args.declare or (path.stem if args.abi == "cuda_l2" else "")
            out.append(CudaSource(path.read_text(errors="replace"), entry=args.entry or
                                  ("gemmrl_gemm" if args.abi == "gemmrl" else "cuda_l2_h100_fp32"), abi=args.abi,
                                  layout=args.source_layout, dtype=args.dtype, acc=args.acc,
                                  shapes=ShapeRange.parse(declare), name=f"cuda:{path.stem}"))
        except CudaSourceError as e:
            raise CliError(f"--cuda-source {f}: {e}") from None
    return tuple(out)


def _bench_sandboxed(args, sources, problems, protocols, cfg, what) -> int:
    from ..measure.bench import summary_text, write_summary  # start-up cost: the bench, not needed by --help
    from ..measure.sandboxed import SandboxBenchSpec, run_sandboxed  # start-up cost: the sandbox pool

    out = Path(args.out)
    if out.suffix != ".csv":
        out = out / f"{gpu_slug()}_{what}_sandbox-{'-'.join(protocols)}_{date.today().isoformat()}.csv"
    spec = SandboxBenchSpec(tuple(problems), sources, protocols, out, cfg, gpus=(args.gpu_device_id,),
                            timeout_s=args.sandbox_timeout)
    path = run_sandboxed(spec, progress=not args.no_progress)
    md = write_summary(path)
    print(f"\nrows: {path}\nsummary: {md}\n")
    print(summary_text(path))
    return 0


def timing_config(args, sweep: bool) -> TimingConfig:
    """The TimingConfig of a bench run from its flags (``sweep``: more than one shape: short host-protocol
    durations)."""
    base = TimingConfig(qps=args.target_qps, pin_cpu=args.pin_cpu,  # timing seeds: fresh per measurement, in the rows
                        host_loop=args.host_loop)
    if getattr(args, "timing", "full") == "quick":
        base = base.quick()
    cfg = base.for_sweep() if sweep else base
    if args.warmup_seconds is not None:
        cfg = replace(cfg, warmup_s=args.warmup_seconds)
    if args.benchmark_seconds is not None:
        cfg = replace(cfg, benchmark_s=args.benchmark_seconds)
    return cfg


def cmd_bench(args) -> int:
    from ..measure.bench import (  # start-up cost
        BenchError, BenchSpec, require_cuda, run_bench, summary_text, write_summary)

    extra = _triton_top(args.triton_top)
    protocols = parse_protocols(args.mode or args.protocol)
    if args.mode and args.mode not in ("offline", "server"):
        raise CliError("--mode is CUDA-L2's flag and takes offline or server; use --protocol for graph/cold")
    problems, what = problems_from(args)
    baselines = _baselines(args.baselines)
    if baselines is not None and args.cuda_source:
        raise CliError("--baselines does not apply to --cuda-source (its sandboxed bench times every vendor path); "
                       "drop one of them")
    sources = _cuda_sources(args) if args.cuda_source else ()
    if sources and (extra or args.kernel_dir or args.library or args.triton_from or args.cutlass_from
                    or args.wgmma_from or args.tiny_from or args.decode_from):
        raise CliError("--cuda-source runs in the sandbox with the vendor baselines only; measure other candidates "
                       "in a separate bench run")
    extra += _selection_from("triton", args.triton_from, problems)
    triton_extra = extra
    extra += _selection_from("cutlass", args.cutlass_from, problems)
    extra += _selection_from("wgmma", args.wgmma_from, problems)
    extra += _selection_from("tiny", args.tiny_from, problems)
    extra += _selection_from("decode", args.decode_from, problems)
    for flag, v, ok, want in (("--repeat", args.repeat, args.repeat >= 1, ">= 1"),
                              ("--target-qps", args.target_qps, args.target_qps > 0, "> 0"),
                              ("--warmup-seconds", args.warmup_seconds, (args.warmup_seconds or 0) >= 0, ">= 0"),
                              ("--benchmark-seconds", args.benchmark_seconds,
                               args.benchmark_seconds is None or args.benchmark_seconds > 0, "> 0"),
                              ("--sandbox-timeout", args.sandbox_timeout, args.sandbox_timeout > 0, "> 0")):
        if not ok:
            raise CliError(f"{flag} must be {want}, got {v}")
    if args.kernel_dir and not Path(args.kernel_dir).is_dir():
        raise CliError(f"--kernel-dir {args.kernel_dir}: not a directory of M_N_K.cu files")
    check_out(Path(args.out))
    library = None
    if args.library:
        try:  # read and checked here, before any GPU work; served from below
            library = Library.load(args.library) if args.library != "default" else load_default()
        except LibraryError as e:
            raise CliError(f"--library: {e}") from None
    try:
        require_cuda(args.gpu_device_id)
    except BenchError:
        if not cpu_bench.torch_without_cuda():  # no torch, or no such device: the check's own message
            raise
        # no CUDA GPU here: verify the Triton kernels instead, and say what needs a GPU
        return cpu_bench.run(cpu_bench.plan(args, problems, triton_extra, protocols))
    if library is not None:
        from ..serve import dispatch  # start-up cost: imports torch
        from ..serve.bench_candidate import gemmrl_candidates  # start-up cost: imports torch

        dispatch.use_library(library)
        extra += (gemmrl_candidates,)
    labels = ()
    if args.shapes:
        labels = tuple(read_shape_labels(args.shapes).items())
    cfg = timing_config(args, sweep=len(problems) > 1)
    if sources:
        return _bench_sandboxed(args, sources, problems, protocols, cfg, what)
    out = Path(args.out)
    if out.suffix != ".csv":
        import torch  # start-up cost: torch

        torch.cuda.set_device(args.gpu_device_id)
        tag = "-".join(protocols) + ("-quick" if args.timing == "quick" else "")
        out = out / f"{gpu_slug()}_{what}_{tag}_{date.today().isoformat()}.csv"
    spec = BenchSpec(problems=tuple(problems), protocols=protocols, out=out, cfg=cfg, kernel_dir=args.kernel_dir,
                     kernel_acc=args.kernel_acc, device=args.gpu_device_id, repeat=args.repeat,
                     extra=extra, labels=labels, baselines=baselines)
    path = run_bench(spec, progress=not args.no_progress)
    md = write_summary(path)
    print(f"\nrows: {path}\nsummary: {md}\n")
    print(summary_text(path))
    return 0
