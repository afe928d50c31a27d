"""`gemmrl` command line: one entry point, each subcommand a thin shell over a typed function."""

from __future__ import annotations

import argparse
import csv
import functools
import re
import sys
from dataclasses import replace
from datetime import date
from pathlib import Path

from ..library import LibraryError
from ..problem import ProblemError, grid, parse_mnk, parse_part, part_of, read_shapes, sample_grid
from ..results import COLUMNS, ResultsError
from ..timing import PROTOCOLS, TimingConfig

EXIT_USAGE = 2


class CliError(Exception):
    pass


def _names(text: str | None) -> tuple[str, ...]:
    """A comma list as given on the command line, blanks dropped."""
    return tuple(x.strip() for x in (text or "").split(",") if x.strip())


def _config_names(text: str | None, family: str) -> tuple[str, ...]:
    """``gemmrl select --configs``: CUTLASS names are a comma list; Triton configs (``str(cfg)`` holds commas) are
    separated by ';' or newlines, and ``@FILE`` reads them from a file, one per line ('#' starts a comment)."""
    text = (text or "").strip()
    if family != "triton":
        return _names(text)
    if text.startswith("@"):
        path = Path(text[1:])
        if not path.is_file():
            raise CliError(f"--configs {text}: no such file; give Triton configs separated by ';' or @FILE")
        text = "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())
    return tuple(x.strip() for x in text.replace("\n", ";").split(";") if x.strip())


def _protocols(text: str) -> tuple[str, ...]:
    ps = _names(text)
    bad = [p for p in ps if p not in PROTOCOLS]
    if bad or not ps:
        raise CliError(f"--protocol takes a comma list of {', '.join(PROTOCOLS)}; got {text!r}")
    return ps


def _problems(args) -> tuple[list, str]:
    """(problems, short name of what is measured) from --mnk / --grid / --shapes (and the checks of the other
    flags every shape-taking subcommand shares)."""
    kw = {"dtype": args.dtype, "acc": args.acc}
    chosen = [x for x in (args.mnk, args.grid, args.shapes) if x]
    if len(chosen) != 1:
        raise CliError("give exactly one of --mnk M_N_K, --grid cuda-l2 or --shapes FILE")
    if args.sample is not None and not args.grid:
        raise CliError("--sample N draws N shapes of --grid cuda-l2; with --mnk or --shapes leave it out")
    if args.gpu_device_id is not None and args.gpu_device_id < 0:
        raise CliError(f"--gpu-device-id takes a GPU index >= 0 (as nvidia-smi lists them), got {args.gpu_device_id}")
    part = parse_part(args.part) if getattr(args, "part", None) else None
    if args.mnk:
        ps = [parse_mnk(s, **kw) for s in args.mnk.split(",")]
        what = ps[0].mnk if len(ps) == 1 else f"{len(ps)}shapes"
    elif args.grid:
        if args.grid != "cuda-l2":
            raise CliError(f"--grid knows only 'cuda-l2', got {args.grid!r}")
        if args.sample is not None:
            ps, what = sample_grid(args.sample, args.seed, **kw), f"grid{args.sample}s{args.seed}"
        else:
            ps, what = grid(**kw), "grid1000"
    else:
        if not Path(args.shapes).is_file():
            raise CliError(f"--shapes {args.shapes}: no such file (one M_N_K per line)")
        ps, what = read_shapes(args.shapes, **kw), Path(args.shapes).stem
    if part is None:
        return ps, what
    return apply_part(ps, args.part), f"{what}-part{part[0]}of{part[1]}"


def apply_part(ps: list, text: str) -> list:
    """``--part K/N`` of these shapes (``problem.part_of``), refused when there are fewer shapes than parts."""
    k, n = parse_part(text)
    if n > len(ps):
        raise CliError(f"--part {text}: {len(ps)} shape(s) cannot make {n} parts; give N <= {len(ps)}")
    return part_of(ps, k, n)


def _check_out(out: Path, flag: str = "--out") -> None:
    """--out is a directory (file name derived) or a .csv that an earlier run of this version wrote (resumed): refuse
    anything else before any work, so a wrong path never costs a run nor touches a file that is not ours."""
    if out.suffix != ".csv":
        if out.exists() and not out.is_dir():
            raise CliError(f"{flag} {out}: an existing file that is not a .csv; give a directory or a .csv path")
        return
    if out.is_dir():
        raise CliError(f"{flag} {out}: a directory; give a .csv path (or the directory without the .csv name)")
    if out.is_file() and out.stat().st_size:
        try:
            with open(out, newline="") as fh:
                header = next(csv.reader([fh.readline()]), [])
        except (OSError, UnicodeDecodeError) as e:
            raise CliError(f"{flag} {out}: cannot read it ({e}); give a new {flag}") from None
        if tuple(header) != COLUMNS:
            raise CliError(f"{flag} {out}: not a results CSV this gemmrl writes (other columns), so it cannot be "
                           f"resumed; give a new {flag} (the file is left as it is)")


def _gpu_slug() -> str:
    import torch

    name = torch.cuda.get_device_name(torch.cuda.current_device()).lower()
    for key in ("h200", "h100", "a100", "l40", "b200", "4090", "3090"):
        if key in name:
            return key
    return "".join(ch for ch in name.replace("nvidia", "") if ch.isalnum())[:12] or "gpu"


def _triton_top(k: int) -> tuple:
    """BenchSpec.extra for --triton-top K: the cost model's K best Triton configs per shape (none for 0)."""
    if k < 0:
        raise CliError(f"--triton-top takes a count of configs per shape, >= 0 (0 = off); got {k}")
    if k == 0:
        return ()
    from ..search.top import top_candidates

    return (functools.partial(top_candidates, k=k),)


def _selection_from(flag: str, paths: list[str] | None, problems) -> tuple:
    """BenchSpec.extra for --triton-from / --cutlass-from CSV...: the configs a selection run picked, re-measured."""
    if not paths:
        return ()
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise CliError(f"--{flag}-from: no such file(s): {', '.join(missing)} (give the CSVs of a gemmrl select run)")
    from ..results import ResultsError
    from ..search.selection import load_selection, selected_candidates

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
    from ..summary import BASELINES

    got = _names(text)
    bad = [x for x in got if x not in BASELINES]
    if bad or not got:
        raise CliError(f"--baselines {text!r}: {'unknown ' + ', '.join(bad) if bad else 'no path named'}; give a comma "
                       f"list of {', '.join(BASELINES)}")
    return got


def _cuda_sources(args) -> tuple:
    """--cuda-source FILE...: the declared candidates (entry, ABI, layout, shapes), one per file."""
    from ..kernels.cuda_source import CudaSource, CudaSourceError, ShapeRange

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
    from ..measure.bench import summary_text, write_summary
    from ..measure.sandboxed import SandboxBenchSpec, run_sandboxed

    out = Path(args.out)
    if out.suffix != ".csv":
        out = out / f"{_gpu_slug()}_{what}_sandbox-{'-'.join(protocols)}_{date.today().isoformat()}.csv"
    spec = SandboxBenchSpec(tuple(problems), sources, protocols, out, cfg, gpus=(args.gpu_device_id,),
                            timeout_s=args.sandbox_timeout)
    path = run_sandboxed(spec, progress=not args.no_progress)
    md = write_summary(path)
    print(f"\nrows: {path}\nsummary: {md}\n")
    print(summary_text(path))
    return 0


def cmd_bench(args) -> int:
    from ..measure.bench import BenchSpec, require_cuda, run_bench, summary_text, write_summary

    extra = _triton_top(args.triton_top)
    protocols = _protocols(args.mode or args.protocol)
    if args.mode and args.mode not in ("offline", "server"):
        raise CliError("--mode is CUDA-L2's flag and takes offline or server; use --protocol for graph/cold")
    problems, what = _problems(args)
    baselines = _baselines(args.baselines)
    if baselines is not None and args.cuda_source:
        raise CliError("--baselines does not apply to --cuda-source (its sandboxed bench times every vendor path); "
                       "drop one of them")
    sources = _cuda_sources(args) if args.cuda_source else ()
    if sources and (extra or args.kernel_dir or args.library or args.triton_from or args.cutlass_from
                    or args.wgmma_from or args.tiny_from):
        raise CliError("--cuda-source runs in the sandbox with the vendor baselines only; measure other candidates "
                       "in a separate bench run")
    extra += _selection_from("triton", args.triton_from, problems)
    extra += _selection_from("cutlass", args.cutlass_from, problems)
    extra += _selection_from("wgmma", args.wgmma_from, problems)
    extra += _selection_from("tiny", args.tiny_from, problems)
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
    _check_out(Path(args.out))
    library = None
    if args.library:
        from ..library import Library, load_default

        try:  # read and checked here, before any GPU work; served from below
            library = Library.load(args.library) if args.library != "default" else load_default()
        except LibraryError as e:
            raise CliError(f"--library: {e}") from None
    require_cuda(args.gpu_device_id)
    if library is not None:
        from ..serve import dispatch
        from ..serve.bench_candidate import gemmrl_candidates

        dispatch.use_library(library)
        extra += (gemmrl_candidates,)
    labels = ()
    if args.shapes:
        from ..problem import read_shape_labels

        labels = tuple(read_shape_labels(args.shapes).items())
    sweep = len(problems) > 1
    base = TimingConfig(seed=args.seed, qps=args.target_qps)
    if getattr(args, "timing", "full") == "quick":
        base = base.quick()
    cfg = base.for_sweep() if sweep else base
    if args.warmup_seconds is not None:
        cfg = replace(cfg, warmup_s=args.warmup_seconds)
    if args.benchmark_seconds is not None:
        cfg = replace(cfg, benchmark_s=args.benchmark_seconds)
    if sources:
        return _bench_sandboxed(args, sources, problems, protocols, cfg, what)
    out = Path(args.out)
    if out.suffix != ".csv":
        import torch

        torch.cuda.set_device(args.gpu_device_id)
        tag = "-".join(protocols) + ("-quick" if args.timing == "quick" else "")
        out = out / f"{_gpu_slug()}_{what}_{tag}_{date.today().isoformat()}.csv"
    spec = BenchSpec(problems=tuple(problems), protocols=protocols, out=out, cfg=cfg, kernel_dir=args.kernel_dir,
                     kernel_acc=args.kernel_acc, device=args.gpu_device_id, repeat=args.repeat,
                     extra=extra, labels=labels, baselines=baselines)
    path = run_bench(spec, progress=not args.no_progress)
    md = write_summary(path)
    print(f"\nrows: {path}\nsummary: {md}\n")
    print(summary_text(path))
    return 0


def cmd_select(args) -> int:
    from ..measure.bench import require_cuda
    from ..search.screen import ScreenSpec, run_screen, selection_table

    problems, what = _problems(args)
    for name in ("top", "explore", "chunk"):
        if getattr(args, name) < 0:
            raise CliError(f"--{name} must be >= 0, got {getattr(args, name)}")
    if args.workers is not None and args.workers < 1:
        raise CliError(f"--workers must be >= 1 (leave it out for CPU count - 1), got {args.workers}")
    protocols = _protocols(args.protocol)
    if set(protocols) - {"graph", "cold"}:
        raise CliError("gemmrl select screens in the device protocols graph and cold; re-measure the selection "
                       "with gemmrl bench --triton-from for the host protocols")
    out = Path(args.out)
    _check_out(out)
    try:  # every flag checked before the GPU is asked for; the derived file name needs it
        spec = ScreenSpec(problems=tuple(problems), out=out, top=args.top, explore=args.explore, chunk=args.chunk or 16,
                          layouts=_names(args.layouts),
                          protocols=protocols, seed=args.seed, device=args.gpu_device_id, workers=args.workers,
                          family=args.family, pdl=args.pdl,
                          configs=_config_names(args.configs, args.family),
                          all_knobs=args.knobs == "all",
                          variants=_names(args.variants),
                          diverse=args.diverse,
                          retrieve=tuple(args.retrieve or ()), retrieve_shapes=args.retrieve_shapes,
                          retrieve_per_shape=args.retrieve_per_shape, retrieve_any_gpu=args.retrieve_any_gpu,
                          **({"timing": TimingConfig()} if args.timing == "full" else {}))
        if spec.retrieve:
            from ..search.retrieve import read_winners

            read_winners(spec.retrieve, spec.retrieve_per_shape)  # its rows checked here; read once (cached)
    except ValueError as e:
        raise CliError(str(e)) from None
    require_cuda(args.gpu_device_id)
    if out.suffix != ".csv":
        import torch

        torch.cuda.set_device(args.gpu_device_id)
        tag = (f"triton-select-top{args.top}-explore{args.explore}" + ("" if args.pdl == "off" else f"-pdl-{args.pdl}")
               if args.family == "triton" else f"{args.family}-select") + ("-full-timing" if args.timing == "full" else "") \
            + (f"-configs{len(spec.configs)}" if spec.configs else "") + ("-all-knobs" if spec.all_knobs else "") \
            + (f"-{'-'.join(spec.variants)}" if spec.variants else "") + ("-diverse" if spec.diverse else "") \
            + ("-retrieved" if spec.retrieve else "")
        spec = replace(spec, out=out / f"{_gpu_slug()}_{what}_{tag}_{date.today().isoformat()}.csv")
    from ..search.retrieve import RetrieveError

    try:
        path = run_screen(spec, progress=not args.no_progress)
    except RetrieveError as e:  # the retrieved rows are filtered by this GPU once it is known, before any timing
        raise CliError(str(e)) from None
    from ..results import read_rows

    table = selection_table(read_rows([path]))
    print(f"\nrows: {path}\nselected per shape and protocol (screen timing; re-measure with "
          f"gemmrl bench --{args.family}-from {path}):")
    for t in table:
        print(f"  {t['mnk']:>20} {t['protocol']:5} {t['best_ms'] * 1e3:9.2f} us  vs {t['ref']} "
              f"{t['ref_ms'] * 1e3:9.2f} us  x{t['ratio']:.3f}  {t['config']}")
    return 0


def cmd_verify(args) -> int:
    from .verify import run_verify

    problems, _ = _problems(args)
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


def cmd_report(args) -> int:
    from ..report.make import make_report
    from ..results import ResultsError

    if not args.results and not args.compare:
        raise CliError("give RESULTS.csv files (and/or --compare A.csv B.csv)")
    missing = [str(p) for p in [*(args.results or []), *(args.compare or [])] if not Path(p).is_file()]
    if missing:
        raise CliError(f"no such file(s): {', '.join(missing)} (give result CSVs of gemmrl bench, select or "
                       "tune --rows-out)")
    try:
        rep = make_report(args.results or [], Path(args.out), candidate=args.candidate, claims=args.claims,
                          compare_files=args.compare)
    except (ResultsError, OSError) as e:
        raise CliError(str(e)) from None
    for note in rep.notes:
        print(f"note: {note}")
    print(f"markdown: {rep.markdown}\nhtml: {rep.html}\nplots: {len(rep.images)} PNG in {rep.out}")
    if args.readme:
        from ..report.make import write_readme_block

        cmd = " ".join(["gemmrl report", *map(str, args.results or []), *(["--candidate", args.candidate]
                                                                          if args.candidate else []),
                        "--out", str(args.out), "--readme", str(args.readme)])
        try:
            write_readme_block(rep, args.readme, cmd)
        except (ResultsError, OSError) as e:
            raise CliError(str(e)) from None
        print(f"readme: {args.readme} (block between the report markers)")
    return 0


def cmd_lib(args) -> int:
    from .lib import run

    return run(args)


def cmd_warmup(args) -> int:
    from .lib import cmd_warmup as warm

    problems, _ = _problems(args)
    layouts = _names(args.layouts)
    if not layouts or set(layouts) - {"tn", "nn"}:
        raise CliError(f"--layouts takes tn and/or nn, got {args.layouts!r}")
    return warm(args, problems)


def cmd_serve_reward(args) -> int:
    """`gemmrl serve-reward`: the LLM reward (extract, build, verify, time) over HTTP; see search/reward_server.py."""
    from ..search.reward_server import RewardServerError, check_host, serve_reward

    try:
        check_host(args.host, args.allow_remote)  # before any worker starts
    except RewardServerError as e:
        raise CliError(str(e)) from None
    if args.max_request_kb <= 0 or args.time_limit_s <= 0:
        raise CliError("--max-request-kb and --time-limit-s must be positive")
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port takes 0..65535 (0 picks a free one), got {args.port}")
    from ..search.executor import InlineExecutor, RequestTemplate, SandboxExecutor

    cpu = args.device == "cpu"
    template = RequestTemplate(protocols=_protocols(args.protocol or ("offline" if cpu else "graph,cold")),
                               baselines=() if cpu else None, graph_check=not cpu, device=args.device,
                               timing=TimingConfig(warmup_s=0.0, benchmark_s=0.05) if cpu else None)
    if not args.sandbox:
        executor = InlineExecutor(template)
    elif cpu:
        executor = SandboxExecutor(template=template, timeout_s=args.time_limit_s, gpus=(),
                                   env={"TRITON_INTERPRET": "1"})
    else:
        executor = SandboxExecutor(template=template, timeout_s=args.time_limit_s)
    try:
        try:
            srv = serve_reward(args.host, args.port, executor, args.max_request_kb * 1024, args.time_limit_s,
                               args.allow_remote)
        except OSError as e:
            raise CliError(f"cannot listen on {args.host}:{args.port} ({e}); pick another --port (0 picks a free "
                           "one)") from None
        print(f"gemmrl serve-reward: POST {srv.url}/score, GET {srv.url}/health ({args.device}, "
              f"{'sandboxed' if args.sandbox else 'in-process, unisolated'}); Ctrl-C stops", flush=True)
        try:
            srv.wait()
        finally:
            srv.close()
    finally:
        executor.close()
    return 0


def _shape_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mnk", help="one shape M_N_K (or a comma list), e.g. 64_4096_64")
    p.add_argument("--grid", help="'cuda-l2': CUDA-L2's 1000 grid shapes")
    p.add_argument("--sample", type=int, help="with --grid: a reproducible sample of N shapes")
    p.add_argument("--seed", type=int, default=0, help="sample and timing seed")
    p.add_argument("--shapes", help="file with one M_N_K per line")
    p.add_argument("--part", help="K/N: only the K-th of N interleaved parts of those shapes (by FLOPs, so each part "
                                  "is a like mix; e.g. --grid cuda-l2 --part 1/5 for a 200-shape chunk)")
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    p.add_argument("--acc", default="fp32", choices=("fp32", "fp16"), help="accumulator (fp16 is its own mode)")
    p.add_argument("--gpu-device-id", type=int, default=0)
    p.add_argument("--kernel-dir", help="directory of CUDA-L2-style M_N_K.cu files to import and measure")
    p.add_argument("--kernel-acc", default="fp32", choices=("fp32", "fp16"),
                   help="accumulator the imported set claims (checked by the battery, not trusted)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gemmrl", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    b = sub.add_parser("bench", help="verify, then time candidates against the vendor baselines")
    _shape_args(b)
    b.add_argument("--protocol", default="graph,cold,offline", help=f"comma list of {','.join(PROTOCOLS)}")
    b.add_argument("--mode", help="CUDA-L2's name for --protocol offline|server")
    b.add_argument("--target-qps", type=float, default=100.0, help="server mode: mean arrivals per second")
    b.add_argument("--warmup-seconds", type=float, help="offline/server warm-up (default 5 for one shape, 0.25 in sweeps)")
    b.add_argument("--benchmark-seconds", type=float, help="offline/server duration (default 10 for one shape, 1 in sweeps)")
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

    s = sub.add_parser("select", help="screen a family's configs per shape (Triton: the cost model's top + exploration; "
                                      "CUTLASS: its family x knobs) to select one per shape and protocol; re-measure "
                                      "with bench --triton-from / --cutlass-from")
    _shape_args(s)
    s.add_argument("--protocol", default="graph,cold", help="graph, cold or both")
    s.add_argument("--family", default="triton", choices=("triton", "cutlass", "wgmma", "tiny"))
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
                        "'benchmarks/results/h100_*triton-select*.csv.gz'); their fastest configs on the shapes nearest "
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

    v = sub.add_parser("verify", help="run the correctness battery (and CUDA-L2's own check) on candidates")
    _shape_args(v)
    v.add_argument("--planted", action="store_true", help="also the planted wrong kernels (must all be rejected)")
    v.add_argument("--no-vendor", action="store_true", help="skip the vendor paths")
    v.add_argument("--seeds", type=int, default=3, help="random trials per candidate (calibration: seeds per shape)")
    v.add_argument("--calibrate", action="store_true", help="write the error statistics the tolerance is calibrated on")
    v.add_argument("--out", default="benchmarks/results/verify.csv")
    v.set_defaults(func=cmd_verify)

    r = sub.add_parser("report", help="tables, plots, markdown and one HTML page from result CSVs")
    r.add_argument("results", nargs="*", metavar="RESULTS.csv", help="result files (several: compared on shared shapes)")
    r.add_argument("--out", default="benchmarks/report", help="directory for report.md, report.html and PNGs")
    r.add_argument("--candidate", help="the candidate reported as ours (default: every non-baseline one present)")
    r.add_argument("--claims", help="CUDA-L2's published per-shape ratios, shown beside ours as claims")
    r.add_argument("--compare", nargs=2, metavar=("A.csv", "B.csv"), help="speed in B / speed in A on shared rows")
    r.add_argument("--readme", help="write the headline tables and two plots into this markdown file, between "
                                    "'<!-- report:begin -->' and '<!-- report:end -->'")
    r.set_defaults(func=cmd_report)
    from .lib import add_parsers

    add_parsers(sub, cmd_lib)
    w = sub.add_parser("warmup", help="build what serves these shapes now (compiles into the on-disk caches)")
    _shape_args(w)
    w.add_argument("--layouts", default="tn,nn")
    w.set_defaults(func=cmd_warmup)
    from .tune import add_parser as add_tune

    add_tune(sub, _shape_args)
    from .headroom import add_parser as add_headroom

    add_headroom(sub, _shape_args)
    from .worker import add_parser as add_worker

    add_worker(sub)
    sr = sub.add_parser("serve-reward", help="serve the LLM reward (extract, build, verify, time a completion) over "
                                             "HTTP: POST /score, GET /health")
    sr.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback unless --allow-remote)")
    sr.add_argument("--port", type=int, default=8787, help="port (default 8787; 0 picks a free one)")
    sr.add_argument("--allow-remote", action="store_true",
                    help="allow a non-loopback --host: anyone who reaches it can make this machine run their code")
    sr.add_argument("--max-request-kb", type=int, default=256, help="largest request body accepted (413 beyond)")
    sr.add_argument("--time-limit-s", type=float, default=600.0, help="seconds per request before a 504")
    sr.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: Triton interpreter, no baselines (reward 0.0 for a verified kernel); for tests")
    sr.add_argument("--sandbox", action=argparse.BooleanOptionalAction, default=True,
                    help="evaluate in sandboxed worker processes (default); --no-sandbox runs them in-process")
    sr.add_argument("--protocol", help=f"comma list of {','.join(PROTOCOLS)} (default graph,cold; offline on cpu)")
    sr.set_defaults(func=cmd_serve_reward)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (CliError, ProblemError, ResultsError, LibraryError) as e:  # bad flags or input files
        print(f"gemmrl {args.cmd}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeError as e:
        from ..measure.bench import BenchError

        if isinstance(e, BenchError):
            print(f"gemmrl {args.cmd}: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        raise
    except KeyboardInterrupt:
        print(f"gemmrl {args.cmd}: interrupted; finished rows are kept, run the same command to resume", file=sys.stderr)
        return 130

