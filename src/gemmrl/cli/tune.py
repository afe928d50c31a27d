"""`gemmrl tune`: the tuning loop from the command line (search/loop.py does the work).

    gemmrl tune --grid cuda-l2 --sample 50 --seed 2 --proposer rl --budget-gpu-minutes 5
    gemmrl tune --model llama-3-8b --dtypes fp16,bf16 --proposer both --resume

Outcomes go to the trials store (``--trials``, default the user cache's trials.sqlite) as they arrive; ``--resume``
continues a run (same ``--run``) where it stopped. The policy (``--policy``; default the shipped H100 policy, saved to
the user cache after every group) and the library built from every stored row of this GPU are written at the end:
into the user library (``gemmrl.mm`` serves it from the next process on; ``--no-user-library`` leaves it alone) and,
with ``--library-out``, to that file. ``--executor model`` runs the whole loop against the analytic cost model (no GPU: a dry run,
what CI does); ``inline`` evaluates in this process (trusted candidates only).
"""

from __future__ import annotations

import argparse
import math
import os
import sqlite3
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

from ..kernels import cutlass_sm90 as cs
from ..kernels.toolchain import CutlassNotFound, arch_for, cutlass_include_dirs, find_nvcc
from ..kernels.triton_gemm.configs import H100, parse_config
from ..library import Library, LibraryError, TrialsStore, add_to_user_library, packaged
from ..paths import cache_dir
from ..problem import GemmProblem
from ..results import ResultsWriter
from ..summary import BASELINES
from ..timing import TimingConfig
from .common import CliError, apply_part, parse_protocols, problems_from, shape_args

PROPOSERS = ("rl", "llm", "both", "costmodel", "random")
EXECUTORS = ("sandbox", "inline", "model")
GENERATED = frozenset({"triton", "cutlass"})  # the generated families the policy proposes
OWN_CONFIGS = frozenset({"decode"})  # families that pick their own configs at a shape, proposed first (own_configs.py)


class TuneError(ValueError):
    pass


def packaged_policy() -> Path:
    return Path(__file__).parent.parent / "policies" / "h100.json"   # gemmrl/policies, package data


def user_policy() -> Path:
    return cache_dir() / "policy.json"


def add_parser(sub) -> None:
    t = sub.add_parser("tune", help="the tuning loop: propose, build, verify, time, reward, update; winners to the library")
    shape_args(t)
    # tune spreads its groups over every visible GPU (one sandbox worker each) unless --gpu-device-id names one
    t.set_defaults(gpu_device_id=None)
    t.add_argument("--model", help="shapes of an open model's linear layers (llama-3-8b, llama-3-70b, qwen2.5-7b, "
                                   "mixtral-8x7b, deepseek-v3, deepseek-v2-lite, or all), M in 1..4096")
    t.add_argument("--dtypes", help="comma list of fp16,bf16 (overrides --dtype; e.g. --model X --dtypes fp16,bf16)")
    t.add_argument("--proposer", default="rl", choices=PROPOSERS,
                   help="rl: the learned policy; llm: an OpenAI-compatible endpoint (GEMMRL_LLM_BASE_URL, "
                        "GEMMRL_LLM_MODEL, GEMMRL_LLM_API_KEY); both: the group shared between them")
    t.add_argument("--budget-gpu-minutes", type=float, default=math.inf, help="stop proposing past this device time")
    t.add_argument("--budget-wall-minutes", type=float, default=math.inf, help="stop proposing past this wall time, counted from the command's start (candidate sets, "
                   "precompile and worker start-up included)")
    t.add_argument("--group", type=int, default=4, help="proposals per group (the policy-gradient group)")
    t.add_argument("--policy-lr", type=float,
                   help="the policy's learning rate in live tuning (default: search/policy.py's LIVE_LR, 25x below "
                        "replay training's; 0 proposes without learning)")
    t.add_argument("--rounds", type=int, default=2, help="groups per shape")
    t.add_argument("--more-below", type=float, default=math.inf, metavar="SPEEDUP",
                   help="a shape's groups after its first only while its best speedup so far is below this (e.g. "
                        "1.02 with --rounds 3: search on where the vendor still wins, stop where a kernel beats it)")
    t.add_argument("--run", default="tune", help="name of this run in the trials store (what --resume continues)")
    t.add_argument("--resume", action="store_true", help="continue the run named by --run")
    t.add_argument("--trials", help="trials store (SQLite; default: the user cache's trials.sqlite)")
    t.add_argument("--policy", help="policy file to start from and save to (default: the user cache's); a file "
                                    "that does not exist yet starts from the shipped H100 policy")
    t.add_argument("--priors", metavar="LIBRARY|package",
                   help="propose first, at each shape, the kernels this library measured best on another GPU (its "
                        "generated entries at the shape's N and K, nearest M first; 'package': the shipped libraries)")
    t.add_argument("--priors-gpu", help="with --priors: the GPU model whose entries are the priors (default: the "
                                        "library's only one)")
    t.add_argument("--library-out", help="write the library built from this GPU's stored rows here (JSON)")
    t.add_argument("--no-user-library", action="store_true",
                   help="do not put the built library into the user cache (by default gemmrl.mm serves it from the "
                        "next process on)")
    t.add_argument("--summary-out", help="write one CSV row per outcome of this run here")
    t.add_argument("--executor", default="sandbox", choices=EXECUTORS)
    t.add_argument("--protocol", default="graph,cold", help="protocols timed (the reward averages their log speedups)")
    t.add_argument("--baselines", help="comma list of vendor baselines timed beside (default: all seven)")
    t.add_argument("--layouts", default="tn,nn", help="layouts the RL policy proposes in")
    t.add_argument("--timeout-s", type=float, default=600.0, help="per-group limit in a sandbox worker")
    t.add_argument("--llm-log", help="JSONL of (prompt, completion, reward, verdict) (default: user cache)")
    t.add_argument("--rows-out", help="write every result row this run measured here (a results CSV)")
    t.add_argument("--no-shared-triton-cache", action="store_true",
                   help="each worker compiles its own Triton kernels (always so with --proposer llm/both)")
    t.add_argument("--scheduler", help="run the groups on Dask workers (gemmrl worker) of this scheduler, tcp://HOST:PORT")
    t.add_argument("--gpu-model", help="with --scheduler: the GPU model to tune (default: the only one connected)")
    t.add_argument("--worker-executor", default="sandbox", choices=("sandbox", "inline", "model"),
                   help="with --scheduler: how a worker evaluates a group (sandbox; inline/model for tests)")
    t.add_argument("--no-progress", action="store_true")
    t.set_defaults(func=cmd_tune)


def problems_for(args) -> list[GemmProblem]:
    from ..models import model_shapes  # start-up cost: the model tables, not needed by --help

    dtypes = [d.strip() for d in (args.dtypes or args.dtype).split(",") if d.strip()]
    bad = [d for d in dtypes if d not in ("fp16", "bf16")]
    if bad or not dtypes:
        raise CliError(f"--dtypes takes fp16 and/or bf16, got {args.dtypes!r}")
    out: list[GemmProblem] = []
    for dt in dtypes:
        if args.model:
            if args.mnk or args.grid or args.shapes:
                raise CliError("give one of --model, --mnk, --grid or --shapes")
            try:
                ps = model_shapes(args.model, dtype=dt, acc=args.acc)
            except ValueError as e:
                raise CliError(str(e)) from None
            out += apply_part(ps, args.part) if args.part else ps
        else:
            ns = argparse.Namespace(**{**vars(args), "dtype": dt})
            out += problems_from(ns)[0]
    return out


def make_proposers(args, layouts: tuple[str, ...], families: frozenset[str] = GENERATED) -> tuple[list, object]:
    """(proposers, the RL policy or None); ``families``: the generated families built here (buildable_families)."""
    # start-up cost: the policy imports numpy
    from ..search.policy import LIVE_ADV_EPS, LIVE_LR, CostModelProposer, RandomProposer, RLPolicy, candidate_set

    cands = partial(candidate_set, layouts=layouts, cutlass="cutlass" in families)
    live = {"lr": LIVE_LR if args.policy_lr is None else args.policy_lr, "adv_eps": LIVE_ADV_EPS}
    out, policy = [], None
    if args.proposer in ("rl", "both"):
        path = Path(args.policy) if args.policy else user_policy()
        if not path.is_file():
            path = packaged_policy()   # a new policy file starts from the shipped one
        if path.is_file():
            try:
                policy = RLPolicy.load(path, candidates=cands, **live)
            except (ValueError, AttributeError, KeyError, TypeError) as e:  # also JSON that is not a policy
                raise TuneError(str(e) if str(path) in str(e) else
                                f"policy file {path} is not a gemmrl policy ({type(e).__name__}: {e}); give another "
                                "--policy, or delete it to start from the shipped one (it is left as it is)") from None
        else:
            policy = RLPolicy(candidates=cands, **live)
        out.append(policy)
    if args.proposer in ("llm", "both"):
        from ..search.llm import LLMConfig, LLMProposer  # start-up cost: only with --proposer llm/both

        try:
            cfg = LLMConfig.from_env()
        except Exception as e:  # noqa: BLE001 - a missing endpoint is a usage error with its own message
            raise TuneError(str(e)) from None
        out.append(LLMProposer(cfg, log_path=Path(args.llm_log) if args.llm_log else cache_dir() / "llm_trajectories.jsonl"))
    if args.proposer == "costmodel":
        out.append(CostModelProposer(cands))
    if args.proposer == "random":
        out.append(RandomProposer(cands))
    return out, policy


def buildable_families(args) -> frozenset[str]:
    """The generated families this tune can build: without CUTLASS's headers on the machine that builds (this one,
    unless a scheduler's workers do), every CUTLASS proposal would end as a build failure (on an H200 without them,
    93 of a journey's 212 candidates), so the CUTLASS family is left out, said once; the decode family (nvcc, M <= 32,
    proposed ahead of the policy: search/own_configs.py) where nvcc is found. A dry run (the cost model times
    Triton and CUTLASS configs only) proposes the policy's families."""
    if args.executor == "model" and not args.scheduler:
        return GENERATED
    if args.scheduler:   # workers elsewhere build
        return GENERATED | OWN_CONFIGS
    own = OWN_CONFIGS if find_nvcc() else frozenset()
    try:
        cutlass_include_dirs()
    except CutlassNotFound as e:
        print(f"tune: {e}; the CUTLASS family is left out of the proposals (Triton only)", flush=True)
        return (GENERATED - {"cutlass"}) | own
    return GENERATED | own


def primed(proposer, args, families: frozenset[str] | None = None):
    """``proposer`` with ``--priors``' kernels proposed first (at most half of each group)."""
    from ..search.priors import Primed, PriorsError, prior_gpu  # start-up cost: the evaluator, only with --priors

    try:
        lib = packaged() if args.priors == "package" else Library.load(args.priors)
        return Primed(proposer, lib, prior_gpu(lib, args.priors_gpu), most=max(1, args.group // 2),
                      families=families)
    except (LibraryError, PriorsError) as e:
        raise CliError(f"--priors: {e}") from None


def make_executor(args, protocols: tuple[str, ...]):
    # start-up cost: the executors, not needed by --help
    from ..search.executor import InlineExecutor, ModelExecutor, PrebuildExecutor, RequestTemplate, SandboxExecutor

    if args.scheduler:
        from ..search.dask_executor import DaskExecutor  # start-up cost: only with --scheduler

        baselines = tuple(b.strip() for b in args.baselines.split(",")) if args.baselines else None
        template = RequestTemplate(protocols=protocols, baselines=baselines, seed=args.seed)
        try:
            ex = DaskExecutor(args.scheduler, args.worker_executor, template, args.timeout_s, args.gpu_model,
                              shared_triton=shared_triton_cache(args))
        except (OSError, TimeoutError, RuntimeError, ValueError) as e:
            raise CliError(f"--scheduler {args.scheduler}: {e}") from None
        if ex.gpu_model == "cpu":   # CPU workers: the Triton interpreter, no vendor baselines, a host protocol
            ex.template = RequestTemplate(protocols=("offline",), baselines=(), seed=args.seed, device="cpu",
                                          graph_check=False, timing=TimingConfig(warmup_s=0.0, benchmark_s=0.05))
        return ex
    if args.executor == "model":
        return ModelExecutor(seed=args.seed)
    baselines = tuple(b.strip() for b in args.baselines.split(",")) if args.baselines else None
    template = RequestTemplate(protocols=protocols, baselines=baselines, seed=args.seed)
    if args.executor == "inline":
        return InlineExecutor(template)
    gpus = (args.gpu_device_id,) if args.gpu_device_id is not None else None
    kw = {}
    if shared_triton_cache(args):
        d = triton_cache()
        kw = {"env": {"TRITON_CACHE_DIR": str(d)}, "writable": [d]}
    return PrebuildExecutor(SandboxExecutor(template=template, timeout_s=args.timeout_s, gpus=gpus, **kw))


def shared_triton_cache(args) -> bool:
    """Workers share one Triton kernel cache (what ``precompile`` fills ahead) only when every candidate is one of
    our own configs: a candidate's own Triton code could otherwise plant kernels in it for the others."""
    return args.proposer not in ("llm", "both") and not args.no_shared_triton_cache


def triton_cache() -> Path:
    d = cache_dir("triton-shared")
    d.mkdir(parents=True, exist_ok=True)
    return d


def precompile_first_round(args, problems, policy) -> None:
    """Compile every shape's first group (the greedy policy's is known ahead) before tuning starts, in parallel:
    the Triton kernels into the shared cache (processes), the CUTLASS configs into the build cache (nvcc), so the
    workers' first groups find them built. Without the second, each group waited for its own new configs: the
    bf16 model shapes on the H100 (22 CUTLASS configs, none in the carried cache) stood 40-140 s per group
    behind nvcc, most of the 41 minutes that tune took."""
    from ..kernels.triton_gemm.precompile import precompile  # start-up cost: the compile pool
    from ..search.proposer import Context  # start-up cost: the proposers, not needed by --help

    if policy is None:
        return
    first = [(p, pr.spec) for p in problems for pr in policy.propose(Context(p), args.group)]
    prebuild_cutlass([s for _, s in first], not args.no_progress)
    if not shared_triton_cache(args):
        return
    os.environ["TRITON_CACHE_DIR"] = str(triton_cache())
    items = [(parse_config(str(s.payload)), p.with_(layout=s.layout)) for p, s in first if s.family == "triton"]
    if items:
        failed = precompile(items, H100, None, not args.no_progress)
        print(f"tune: precompiled {len(items) - len(failed)} of {len(items)} first-round Triton kernels", flush=True)


def prebuild_cutlass(specs, progress: bool = False) -> int:
    """Build the CUTLASS configs among ``specs`` (deduplicated; cached ones are found, not rebuilt) with parallel
    nvcc; returns how many built. A failure is reported and left to the group that proposes the config (its
    worker records the build error as that candidate's verdict), never raised here."""
    names = list(dict.fromkeys(str(s.payload) for s in specs if s.family == "cutlass"))
    if not names:
        return 0
    try:
        cfgs = list(dict.fromkeys(cs.parse_name(n)[0] for n in names))
        built = cs.build_family(cfgs, arch_for(), progress=progress)
    except Exception as e:  # noqa: BLE001 - no nvcc, no GPU to name the arch, an invalid config: groups build their own
        print(f"tune: first-round CUTLASS configs not prebuilt ({type(e).__name__}: {e}); each group builds its own",
              flush=True)
        return 0
    ok = sum(1 for b in built.values() if b.ok)
    print(f"tune: prebuilt {ok} of {len(cfgs)} first-round CUTLASS configs", flush=True)
    return ok


def check_flags(args) -> None:
    """The numeric flags, --baselines and the output paths, checked before the trials store is opened or anything
    runs (a path that cannot be written would otherwise fail only after the whole run)."""
    for flag, v, want in (("--group", args.group, 1), ("--rounds", args.rounds, 1)):
        if v < want:
            raise CliError(f"{flag} must be >= {want}, got {v}")
    for flag, v in (("--budget-gpu-minutes", args.budget_gpu_minutes),
                    ("--budget-wall-minutes", args.budget_wall_minutes), ("--timeout-s", args.timeout_s),
                    ("--more-below", args.more_below)):
        if not v > 0:
            raise CliError(f"{flag} must be > 0, got {v} (leave it out for the default)")
    if args.policy_lr is not None and not (math.isfinite(args.policy_lr) and args.policy_lr >= 0):
        raise CliError(f"--policy-lr must be >= 0 (0: the policy proposes without learning), got {args.policy_lr}")
    if args.baselines is not None:
        names = [b.strip() for b in args.baselines.split(",") if b.strip()]
        bad = [b for b in names if b not in BASELINES]
        if bad or not names:
            raise CliError(f"--baselines takes a comma list of {', '.join(BASELINES)}; got {args.baselines!r}")
    if args.gpu_model and not args.scheduler:
        raise CliError("--gpu-model picks the GPU model among a scheduler's workers; give --scheduler too, or leave "
                       "it out")
    for flag in ("policy", "library_out", "summary_out", "rows_out", "trials", "llm_log"):
        v = getattr(args, flag)
        if v and Path(v).is_dir():
            raise CliError(f"--{flag.replace('_', '-')} {v}: a directory; give a file path")


def open_store(path: str | None):
    """The trials store at ``path`` (default: the user cache's), or a CliError saying why it cannot be used."""
    try:
        return TrialsStore(path)
    except (sqlite3.Error, OSError) as e:
        raise CliError(f"--trials {path or 'default'}: cannot use it as the trials store ({e}); give a new file or "
                       "one an earlier gemmrl tune wrote (the file is left as it is)") from None


def cmd_tune(args) -> int:
    from ..search.loop import Tuner, TuneSpec, run_rows, summary_rows, winners, write_summary  # start-up cost
    from ..search.proposer import Hardware  # start-up cost: the proposers, not needed by --help

    t_start = time.monotonic()   # --budget-wall-minutes counts from here: the warm-up and precompile are inside it
    problems = problems_for(args)
    protocols = parse_protocols(args.protocol)
    layouts = tuple(x.strip() for x in args.layouts.split(",") if x.strip())
    if not layouts or any(x not in ("tn", "nn") for x in layouts):
        raise CliError(f"--layouts takes tn and/or nn, got {args.layouts!r}")
    check_flags(args)
    try:
        families = buildable_families(args)
        proposers, policy = make_proposers(args, layouts, families)
    except TuneError as e:
        raise CliError(str(e)) from None
    if args.priors:
        proposers[0] = primed(proposers[0], args, families)
    if families & OWN_CONFIGS:
        from ..search.own_configs import OwnFirst  # start-up cost: only where such a family is built

        proposers[0] = OwnFirst(proposers[0], layouts, sorted(families & OWN_CONFIGS), most=max(1, args.group // 4))
    executor = None
    if args.scheduler:
        executor = make_executor(args, protocols)
        hardware = replace(Hardware(), name=executor.gpu_model)
        gpu = hardware.name if args.worker_executor != "model" else "model:" + hardware.name
    else:
        hardware = Hardware() if args.executor == "model" else _hardware(args.gpu_device_id)
        gpu = "model:" + hardware.name if args.executor == "model" else hardware.name
    try:
        store = open_store(args.trials)
    except CliError:
        if executor is not None:
            executor.close()
        raise
    done = store.outcomes(gpu=gpu, run=args.run)
    if done and not args.resume:
        if executor is not None:
            executor.close()
        store.close()
        raise CliError(f"run {args.run!r} already has {len(done)} outcomes in {store.path}: pass --resume to continue "
                       "it, or --run NEW for a new run")
    spec = TuneSpec(tuple(problems), group=args.group, rounds=args.rounds,
                    budget_gpu_s=args.budget_gpu_minutes * 60.0, budget_wall_s=args.budget_wall_minutes * 60.0,
                    run=args.run, gpu=gpu, seed=args.seed, more_below=args.more_below)
    dry = gpu.startswith("model:")  # the cost model stands in for the GPU: nothing is measured
    # a dry run keeps the user's policy as it is unless --policy names where its own goes
    policy_out = Path(args.policy) if args.policy else (None if dry else user_policy())
    save = (lambda: policy.save(policy_out)) if policy is not None and policy_out is not None else None
    try:
        tuner = Tuner(spec, proposers, None, store, hardware, save_policy=save, progress=not args.no_progress)
    except BaseException:
        if executor is not None:
            executor.close()
        store.close()
        raise
    pending = tuner.pending()  # a resumed run warms and precompiles only the shapes it has left
    if policy is not None:
        policy.warm(pending)
    if args.executor == "sandbox" and executor is None:
        precompile_first_round(args, pending, policy)
    executor = executor or make_executor(args, protocols)
    tuner.executor = executor
    if hasattr(executor, "prebuild_vendor"):
        executor.prebuild_vendor()   # vendor_blas.so (~1 min of nvcc on a fresh machine) inside the set-up
    setup_s = time.monotonic() - t_start
    tuner.spec = replace(spec, budget_wall_s=max(0.0, spec.budget_wall_s - setup_s))
    print(f"tune: {len(pending)} shapes to tune; setup (candidate sets, precompile, workers) {setup_s:.0f} s of the "
          f"wall budget", flush=True)
    try:
        report = tuner.run()
    except RuntimeError as e:
        if "--resume" not in str(e):
            raise
        raise CliError(f"{e} (stored now: {len(store.outcomes(gpu=gpu, run=args.run))} outcomes in {store.path})") from None
    finally:
        executor.close()
        store.checkpoint()
    where = ("none" if policy is None else f"-> {policy_out}" if policy_out is not None
             else "not saved (a dry run; --policy FILE saves it)")
    print(f"tune: policy {where} ({policy.state.updates if policy is not None else 0} updates)", flush=True)
    if args.summary_out:
        write_summary(summary_rows(store, gpu, args.run), Path(args.summary_out))
    if args.rows_out:
        rows = run_rows(store, gpu, args.run)
        ResultsWriter(Path(args.rows_out)).write_batch(rows)
        print(f"tune: {len(rows)} result rows -> {args.rows_out} (re-measure the winners with gemmrl bench "
              f"--triton-from/--cutlass-from {args.rows_out})")
    built = winners(store, gpu) if args.library_out or not (dry or args.no_user_library) else []
    if args.library_out:
        lib = Library(built)
        lib.save(args.library_out)
        print(f"tune: library of {len(lib.entries)} entries -> {args.library_out}; {library_figure(lib)}")
    if not dry and not args.no_user_library:
        path, mine = add_to_user_library(built, gpu)
        print(f"tune: the user library {path} holds {len(mine.entries)} entries for {gpu}, served by gemmrl.mm from "
              f"the next process on (every other shape by the fallback race); {library_figure(mine)}")
    geo = math.exp(sum(math.log(max(1.0, v)) for v in report.best.values()) / max(1, len(problems)))
    if dry:
        print(f"tune (dry run: the cost model's guesses, nothing built or measured): {report.groups} groups, "
              f"{report.evaluated} candidates predicted, {report.wall_s:.1f} s wall, stopped: {report.stopped}; "
              f"{len(report.best)} shapes where the model predicts a candidate faster than its vendor estimate, "
              f"predicted geomean {geo:.3f}x (shapes without one count as 1)")
    else:
        print(f"tune: {report.groups} groups, {report.evaluated} candidates ({report.failures or 'no failures'}), "
              f"{report.gpu_s:.1f} device-s, {report.wall_s:.1f} s wall, stopped: {report.stopped}; "
              f"{len(report.best)} shapes with a verified candidate; best per shape over vendor_best, geomean "
              f"{geo:.3f}x (shapes without a winner count as 1; selection-run numbers: re-measure with gemmrl bench "
              f"--library)")
    store.close()
    return 0


def library_figure(lib: Library) -> str:
    """What a built library claims, from its entries' own measurements (vendor_best_ms / time_ms per entry), or
    that it claims nothing: the figure of the library, not of the clipped rewards."""
    ratios = [e.vendor_best_ms / e.time_ms for e in lib.entries if e.time_ms > 0 and e.vendor_best_ms > 0]
    if not ratios:
        return "no entry: nothing measured faster than vendor_best (the vendor fallback serves every shape)"
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    return (f"its entries over vendor_best where they were measured: geomean {geo:.3f}x over {len(ratios)} entries "
            f"(min {min(ratios):.3f}x; selection-run numbers: re-measure with gemmrl bench --library FILE)")


def _hardware(device: int | None):
    from ..search.proposer import Hardware  # start-up cost: the proposers, not needed by --help

    try:
        return Hardware.from_device(device or 0)
    except Exception as e:  # noqa: BLE001 - no GPU: say what to do
        raise CliError(f"no CUDA GPU to tune on ({type(e).__name__}: {e}); --executor model runs the loop "
                       "against the cost model without one") from None
