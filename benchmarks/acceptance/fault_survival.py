"""The fault-survival run: one tuning run of ``--n`` candidates, ``--fault-frac`` of them planted faults, through
the real sandbox executor; then the trials store is counted against the plan.

    python benchmarks/acceptance/fault_survival.py --device cuda --out DIR                   # H100: 200 candidates, 10% faults
    python benchmarks/acceptance/fault_survival.py --device cuda --out DIR --kill-after 100  # ... kill -9 the tuner, then resume
    python benchmarks/acceptance/fault_survival.py --device cpu --n 20 --shapes 16_16_16,17_19_23 --timeout-s 15 --out DIR

The plan (``gemmrl.search.faults``): shapes in turn, groups of ``--group``; at ``round(n * fault_frac)`` seeded
positions a planted fault (GPU: the planted CUDA sources, illegal_address, hang, huge_malloc, legacy_stream,
device_sync, syntax_error; CPU: Triton-source stand-ins, crash, hang, oom, wrong, load_error), kinds dealt out in
turn; everywhere else the next good Triton config of the shape (GPU: the cost model's top configs, precompiled into
a Triton cache the workers share; CPU: small tiled configs). The tuner (``search.loop.Tuner``) runs it through
``SandboxExecutor`` (in ``PrebuildExecutor`` on the GPU: every CUDA source is built before the run), one worker; a
group whose worker dies is split and its candidates re-run one at a time.

Afterwards everything is counted from the trials store: outcomes stored, per verdict, each fault's stored verdict
against the one it must have, good candidates ``ok``, duplicates. Writes ``fault_survival_summary.csv`` (one row)
and ``fault_survival_candidates.csv`` (one row per planned candidate) to ``--out``, prints a table, and exits 1 when
a bar fails: every planted candidate stored once, every fault with its expected class, every good one ok.

``--kill-after K``: the tuner runs in a child process that is SIGKILLed once K outcomes are stored; then the same
run is resumed here, and the counts must be as without the kill (the summary adds the outcomes stored before the
kill). Expected time: printed before the run (a model: group time, worker restarts, and a hang's two timeouts --
the group's and the hang's own when the group is re-run one candidate at a time). Measured on an H100: 48 candidates
with one fault of each kind, killed after 20 outcomes and resumed, 66 s of tuning after 28 s of setup (vendor
library, planted sources, 42 Triton configs precompiled, from empty caches); the model then expects ~270 s of
tuning for the default 200 candidates (4 hangs, 4 illegal addresses: 16 worker restarts at ~5.5 s, 4-8 timeouts).
Workers read the parent's build cache: ``GEMMRL_CACHE_DIR`` is set to it when unset.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gemmrl.library import TrialsStore  # noqa: E402
from gemmrl.problem import parse_mnk  # noqa: E402
from gemmrl.search import faults  # noqa: E402
from gemmrl.search.proposer import spec_key  # noqa: E402

SHAPES = {"cuda": "256_4096_4096,1024_1024_1024,128_8192_1024,2048_2048_2048,64_4096_4096",
          "cpu": "16_32_64,33_65_129"}
BASELINES = ("cublas_tn", "cublaslt_heuristic_tn")
# seconds: a group of `group` in a warm worker, one candidate alone, a worker's replacement (spawn, imports, CUDA
# context and vendor handles at its first job); GPU: graph+cold beside 2 baselines, kernels precompiled (H100);
# CPU: the interpreter, offline protocol, 2 cores
COST = {"cuda": {"group": 1.5, "solo": 1.0, "restart": 5.5}, "cpu": {"group": 4.0, "solo": 1.5, "restart": 6.0}}


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--n", type=int, default=200, help="candidates in the run (default 200)")
    ap.add_argument("--fault-frac", type=float, default=0.1, help="share of planted faults (default 0.1)")
    ap.add_argument("--faults", default="", help="fault kinds, comma-separated (default: every kind of --device)")
    ap.add_argument("--seed", type=int, default=0, help="where the faults go")
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--shapes", default="", help="M_N_K,... (default: five medium shapes on cuda, two tiny on cpu)")
    ap.add_argument("--timeout-s", type=float, default=None,
                    help="per group job; default 10 on cuda (a group's first job in a fresh worker took 7 s on an "
                         "H100), 30 on cpu")
    ap.add_argument("--kill-after", type=int, default=0, help="SIGKILL the tuner after K stored outcomes, then resume")
    ap.add_argument("--run", default="fault-survival")
    ap.add_argument("--out", required=True)
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)   # the tuner alone, on the saved plan
    args = ap.parse_args(argv)
    if args.timeout_s is None:
        args.timeout_s = 10.0 if args.device == "cuda" else 30.0
    return args


def gpu_label(device: str) -> str:
    if device == "cpu":
        return "cpu"
    import torch

    return torch.cuda.get_device_name(0)


def executor(args, out: Path):
    from gemmrl.search.executor import PrebuildExecutor, RequestTemplate, SandboxExecutor

    scratch = out / "scratch" / str(os.getpid())
    if args.device == "cpu":
        from gemmrl.timing import TimingConfig

        tmpl = RequestTemplate(protocols=("offline",), baselines=(), device="cpu", graph_check=False,
                               timing=TimingConfig(warmup_s=0.0, benchmark_s=0.05))
        return SandboxExecutor(template=tmpl, timeout_s=args.timeout_s, gpus=(), scratch_root=scratch,
                               env={"TRITON_INTERPRET": "1"})
    d = os.environ["TRITON_CACHE_DIR"]   # set by setup_env(): the Triton cache the good configs are precompiled into
    return PrebuildExecutor(SandboxExecutor(template=RequestTemplate(baselines=BASELINES), timeout_s=args.timeout_s,
                                            gpus=(0,), scratch_root=scratch, env={"TRITON_CACHE_DIR": d},
                                            writable=[d]))


def setup_env(args) -> None:
    """Workers inherit these: the parent's build cache (workers read what the parent built) and the shared Triton
    cache the good configs are precompiled into."""
    if args.device == "cuda":
        from gemmrl.paths import cache_dir

        os.environ.setdefault("GEMMRL_CACHE_DIR", str(cache_dir()))
        os.environ.setdefault("TRITON_CACHE_DIR", str(cache_dir("triton-shared")))


def prepare(plan: list, args) -> list:
    """GPU: build the vendor library and every planted source, precompile every good Triton config; a good config
    that does not compile is replaced by the next of its shape (it is not a planted fault). Returns the plan."""
    if args.device == "cpu":
        return plan
    from dataclasses import replace

    from gemmrl.kernels.cuda_source import build_many
    from gemmrl.kernels.triton_gemm.configs import H100, parse_config
    from gemmrl.kernels.triton_gemm.precompile import precompile
    from gemmrl.kernels.vendor import build_library

    t0 = time.monotonic()
    build_library()
    srcs = [p.spec.payload for p in plan if p.spec.family == "cuda"]
    built = build_many(srcs)
    print(f"built the vendor library and {len(srcs)} planted sources ({sum(b.ok for b in built)} ok, the "
          f"syntax_error ones must fail) in {time.monotonic() - t0:.0f} s", flush=True)
    for _ in range(3):
        t0 = time.monotonic()
        good = [p for p in plan if p.kind == "good"]
        failed = precompile([(parse_config(str(p.spec.payload)), p.problem.with_(layout=p.spec.layout)) for p in good],
                            H100, None, args.progress)
        bad = {(str(p.spec.payload), p.problem.mnk) for p in good} & set(failed)
        print(f"precompiled {len(good)} good Triton configs in {time.monotonic() - t0:.0f} s, {len(bad)} failed",
              flush=True)
        if not bad:
            return plan
        used = frozenset(p.key for p in plan)
        for i, p in enumerate(plan):
            if p.kind == "good" and (str(p.spec.payload), p.problem.mnk) in bad:
                why = failed[(str(p.spec.payload), p.problem.mnk)]
                print(f"  replaced {p.spec.label()} at {p.problem.mnk}: {why[:120]}")
                new = faults.top_triton(p.problem, 1, used)[0]
                used |= {spec_key(new)}
                plan[i] = replace(p, spec=new)
    raise SystemExit("good Triton configs still fail to compile after 3 rounds of replacement")


def estimate_s(plan: list, args) -> float:
    """Expected seconds of the tuning run (setup excluded): see COST."""
    c = COST[args.device]
    groups: dict = {}
    for p in plan:
        groups.setdefault((p.problem.mnk, p.round), []).append(p)
    total = 0.0
    for g in groups.values():
        killers = [p for p in g if p.expected in faults.KILLS_WORKER]
        if not killers:
            total += c["group"]
            continue
        first = killers[0].expected
        total += (args.timeout_s if first == "timeout" else c["group"] / 2) + c["restart"]
        for p in g:   # the group split: each candidate alone
            if p.expected == "timeout":
                total += args.timeout_s + c["restart"]
            elif p.expected in faults.KILLS_WORKER:
                total += c["solo"] / 2 + c["restart"]
            else:
                total += c["solo"]
    return total + c["restart"]


def tune(plan: list, args, out: Path, progress: bool = False) -> object:
    from gemmrl.search.loop import Tuner, TuneSpec

    problems = tuple(dict.fromkeys(p.problem for p in plan))
    rounds = max(p.round for p in plan) + 1
    spec = TuneSpec(problems, group=args.group, rounds=rounds, run=args.run, gpu=gpu_label(args.device),
                    seed=args.seed)
    t0 = time.monotonic()

    def on_group(mnk, outs):
        print(f"[{time.monotonic() - t0:6.1f} s] {mnk}: " + " ".join(
            o.verdict if o.proposal.info == "good" else f"{o.verdict}({o.proposal.info})" for o in outs), flush=True)

    ex = executor(args, out)
    try:
        return Tuner(spec, [faults.PlanProposer(plan)], ex, TrialsStore(out / "trials.sqlite"), on_group=on_group,
                     progress=progress).run()
    finally:
        ex.close()


def stored(store: TrialsStore, gpu: str, run: str) -> int:
    try:
        return len(store.outcomes(gpu=gpu, run=run))
    except Exception:  # noqa: BLE001 - the writer may hold the lock
        return -1


def kill_then_resume(plan: list, args, argv: list[str], out: Path) -> dict:
    """The tuner in a child process, SIGKILLed once ``args.kill_after`` outcomes are stored; then resumed here."""
    store, gpu = TrialsStore(out / "trials.sqlite"), gpu_label(args.device)
    if not 0 < args.kill_after < len(plan):
        raise SystemExit(f"--kill-after must be between 1 and {len(plan) - 1}")
    t0 = time.monotonic()
    child = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *argv, "--child"])
    n = 0
    while child.poll() is None and n < args.kill_after:
        time.sleep(0.1)
        n = max(n, stored(store, gpu, args.run))
    if child.poll() is not None:
        raise SystemExit(f"the tuner finished (exit {child.returncode}) before {args.kill_after} outcomes were stored: "
                         "nothing was killed; use a smaller --kill-after")
    child.send_signal(signal.SIGKILL)
    child.wait()
    killed_s = time.monotonic() - t0
    before = stored(store, gpu, args.run)
    print(f"SIGKILLed the tuner (pid {child.pid}) after {killed_s:.1f} s with {before} outcomes stored; resuming",
          flush=True)
    t1 = time.monotonic()
    rep = tune(plan, args, out, args.progress)
    return {"killed_after_s": round(killed_s, 1), "outcomes_before_kill": before,
            "outcomes_after_resume": stored(store, gpu, args.run), "resume_groups": rep.groups,
            "resume_wall_s": round(time.monotonic() - t1, 1)}


def run_meta(device: str) -> dict:
    """The run's GPU, clocks-free software versions, git sha and time (results.collect_meta; no GPU: the CPU's)."""
    from gemmrl.results import Meta, collect_meta, git_sha, now

    import torch

    meta = collect_meta(0) if device == "cuda" else Meta("cpu", "", "", "", torch.__version__, "", git_sha())
    return {**meta.row(), "timestamp": now()}


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["index"])
        w.writeheader()
        w.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    out = Path(args.out)
    setup_env(args)
    if args.child:   # the tuner alone, on the parent's plan and store (killed by the parent)
        tune(faults.load_plan(out / "plan.json"), args, out, args.progress)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "scratch", ignore_errors=True)   # a measurement starts from nothing
    for f in out.glob("trials.sqlite*"):
        f.unlink()
    problems = [parse_mnk(s.strip()) for s in (args.shapes or SHAPES[args.device]).split(",") if s.strip()]
    kinds = tuple(k.strip() for k in args.faults.split(",") if k.strip()) or None
    t0 = time.monotonic()
    good = faults.tiny_triton if args.device == "cpu" else faults.top_triton
    plan = prepare(faults.make_plan(problems, args.n, args.fault_frac, args.seed, args.group, args.device, good, kinds),
                   args)
    faults.save_plan(plan, out / "plan.json")
    setup_s = time.monotonic() - t0
    nf = sum(p.kind != "good" for p in plan)
    est = estimate_s(plan, args)
    print(f"plan: {len(plan)} candidates ({nf} planted faults: "
          f"{', '.join(f'{k} {v}' for k, v in sorted(Counter(p.kind for p in plan if p.kind != 'good').items()))}) "
          f"over {len(problems)} shapes in groups of {args.group}; setup {setup_s:.0f} s; expected tuning time "
          f"~{est:.0f} s ({args.device}, timeout {args.timeout_s:g} s)", flush=True)
    t1 = time.monotonic()
    extra = kill_then_resume(plan, args, argv, out) if args.kill_after else {}
    if not args.kill_after:
        tune(plan, args, out, args.progress)
    wall = time.monotonic() - t1
    summary, per, failed = faults.tally(TrialsStore(out / "trials.sqlite"), gpu_label(args.device), args.run, plan)
    summary = {"device": args.device, "n": args.n, "fault_frac": args.fault_frac, "seed": args.seed,
               "group": args.group, "timeout_s": args.timeout_s, **summary, **extra, "setup_s": round(setup_s, 1),
               "wall_s": round(wall, 1), "expected_s": round(est), "passed": not failed}
    write_csv(out / "fault_survival_summary.csv", [{**summary, **run_meta(args.device)}])
    write_csv(out / "fault_survival_candidates.csv", per)
    shutil.rmtree(out / "scratch", ignore_errors=True)
    width = max(len(k) for k in summary)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in summary.items()))
    for f in failed:
        print(f"FAILED: {f}")
    print(f"{'PASS' if not failed else 'FAIL'}: {summary['stored']}/{summary['planned']} stored, "
          f"{summary['good_ok']}/{summary['good']} good ok, {summary['faults_as_expected']}/{summary['faults']} faults "
          f"as expected, wall {wall:.0f} s (expected ~{est:.0f} s); CSVs in {out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
