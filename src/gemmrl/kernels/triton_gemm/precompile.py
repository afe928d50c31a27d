"""Compile many (config, problem) pairs ahead of timing, in parallel worker processes.

Timing hundreds of configs per shape is cheap once they are compiled; compiling them one after another in the
timing process is not (1-3 s per config on the H100 machine's CPU). ``precompile`` builds each pair's launch
plan with workspaces on the ``meta`` device (nothing allocated), groups the pairs by what Triton specializes
on (the config, the constexprs, and for every int argument whether it is 1 or a multiple of 16, exactly the
JIT's specialization key), and has ``workers`` spawned processes call ``JITFunction.warmup`` once per group.
Warmup compiles into Triton's on-disk cache (``TRITON_CACHE_DIR``), where the timing process's first launch
finds it. A pair whose compile fails is reported with the error; nothing is launched.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
from typing import Iterable

from ...problem import GemmProblem
from . import plans
from .configs import Arch, Config, ConfigError, parse_config


def _spec_key(plan: plans.Plan) -> tuple:
    """What Triton's JIT specializes a launch on: constexpr values, int arguments' (==1, %16==0), dtypes."""
    out = [str(plan.cfg), plan.problem.dtype]
    for L in plan.launches:
        out.append((L.kernel.__name__, *sorted(L.options().items())))  # the options it compiles with
        for x in L.args:
            if isinstance(x, plans.Operand):
                out.append("op")
            elif isinstance(x, bool) or not isinstance(x, int):
                out.append(repr(x) if not hasattr(x, "dtype") else str(x.dtype))
            else:
                out.append(("i", x == 1, x % 16 == 0))
    return tuple(out)


def _warm(plan: plans.Plan) -> None:
    import torch  # start-up cost: torch loads on first use, not on import

    dt = plan.torch_dtype
    for L in plan.launches:
        args = [dt if isinstance(x, plans.Operand) else (x.dtype if isinstance(x, torch.Tensor) else x)
                for x in L.args]
        L.kernel.warmup(*args, grid=L.grid, **L.options())


def _plan(cfg: Config, problem: GemmProblem, arch: Arch) -> plans.Plan:
    import torch  # start-up cost: torch loads on first use, not on import

    return plans.build(cfg, problem, torch.device("meta"), arch)


def _worker(items: list[tuple[str, GemmProblem]]) -> list[tuple[str, str, str]]:
    """In a spawned process: warm up each (config text, problem); returns (config, mnk, error or '')."""
    import torch  # start-up cost: torch loads on first use, not on import

    arch = Arch.from_device(0)
    torch.cuda.set_device(0)
    out = []
    for text, problem in items:
        try:
            _warm(_plan(parse_config(text), problem, arch))
            out.append((text, problem.mnk, ""))
        except Exception as e:  # noqa: BLE001 - a config that does not compile is a result, not a crash
            out.append((text, problem.mnk, f"{type(e).__name__}: {e}"[:300]))
    return out


def groups(pairs: Iterable[tuple[Config, GemmProblem]], arch: Arch) -> tuple[dict, list]:
    """({specialization key: (config text, problem)} with one representative per key, [(cfg, mnk, reason)] of
    pairs whose plan is invalid)."""
    reps: dict[tuple, tuple[str, GemmProblem]] = {}
    bad = []
    for cfg, problem in pairs:
        try:
            key = _spec_key(_plan(cfg, problem, arch))
        except ConfigError as e:
            bad.append((str(cfg), problem.mnk, str(e)))
            continue
        reps.setdefault(key, (str(cfg), problem))
    return reps, bad


def precompile(pairs: Iterable[tuple[Config, GemmProblem]], arch: Arch, workers: int | None = None,
               progress: bool = True) -> dict[tuple[str, str], str]:
    """Compile every distinct specialization among ``pairs`` in ``workers`` processes (default: CPU count - 1).
    Returns {(config text, mnk): error} for the representatives that failed (and invalid pairs)."""
    reps, bad = groups(pairs, arch)
    failed = {(c, m): r for c, m, r in bad}
    items = list(reps.values())
    if not items:
        return failed
    workers = max(1, min(workers or (os.cpu_count() or 2) - 1, len(items)))
    chunks = [items[i::workers * 4] for i in range(min(len(items), workers * 4))]
    bar = None
    if progress:
        try:
            from tqdm import tqdm  # optional dependency: progress bars where installed

            bar = tqdm(total=len(items), desc="compile", unit="kernel", dynamic_ncols=True)
        except ImportError:
            bar = None
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        for fut in cf.as_completed([ex.submit(_worker, ch) for ch in chunks]):
            try:
                res = fut.result()
            except Exception as e:  # noqa: BLE001 - a worker that died (segfault in a compiler pass)
                res = []
                print(f"precompile: a worker died ({type(e).__name__}: {e}); its kernels compile at first launch")
            for text, mnk, err in res:
                if err:
                    failed[(text, mnk)] = err
            if bar:
                bar.update(len(res))
    if bar:
        bar.close()
    return failed
