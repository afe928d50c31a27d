"""Retrieval: the Triton configs that won earlier screens on the shapes nearest a new one, screened beside the cost
model's picks.

The cost model ranks from first principles and misses kernels its terms do not see (the traffic probe's probe: two-pass
split-K and a 4-warp small-M tile won where the model's diverse top 12 held neither). Every screen a session commits
already measured what won on its shapes; ``gemmrl select --retrieve FILES`` reads those rows and adds, per shape,
the ``per_shape`` fastest distinct configs of each protocol on its ``shapes`` nearest screened shapes (the shape itself
first where it was screened). They are timed in the new selection run like any other candidate, so a retrieved
config is chosen only if it wins again there; the re-measure stays a separate run.

Distance: Euclidean in (log2 M, log2 N, log2 K). Rows count only where verified, timed and named
``triton:<config>:<layout>`` (screen rows; re-measure rows name a selection, not a config), measured on the GPU
screened on (``--retrieve-any-gpu`` lifts that), of the problem's dtype where any are. PDL configs are skipped
(the library serves none) and so are names this gemmrl cannot parse (an older field set).

Measured (H100; docs/measurements.md, Triton family: the retrieval run): the Triton-family bar's 120 shapes re-selected with retrieval picked a retrieved
config in 116 of 240 (shape, protocol) cells, 104 of them the shape's own earlier winner; small class 0.999 -> 1.016
graph, 0.989 -> 1.007 cold against vendor_best. Neighbours' winners alone transfer worse than the trained RL policy
ranks (replay on 50 held-out shapes, benchmarks/acceptance/retrieval_replay.py: first-4 share 0.780 -> 0.747 when put first),
so the policy does not use them.
"""

from __future__ import annotations

import glob
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

from ..kernels.triton_gemm.configs import Config, parse_config
from ..problem import GemmProblem
from ..results import read_rows
from ..summary import usable

PREFIX = "triton:"


class RetrieveError(ValueError):
    """A retrieval source that cannot be used; the message says what to give instead."""


@dataclass(frozen=True)
class Winner:
    """One screened config that was among the fastest on its shape and protocol."""
    M: int
    N: int
    K: int
    protocol: str
    layout: str
    config: Config
    time_ms: float
    dtype: str = "fp16"

    @property
    def mnk(self) -> str:
        return f"{self.M}_{self.N}_{self.K}"


def _parse(candidate: str) -> tuple[Config, str] | None:
    """``triton:<config>:<layout>`` -> (config, layout); None for other names, PDL configs and unparsable ones."""
    if not candidate.startswith(PREFIX):
        return None
    body, sep, layout = candidate[len(PREFIX):].rpartition(":")
    if not sep or layout not in ("tn", "nn"):
        return None
    try:
        cfg = parse_config(body)
    except (TypeError, ValueError):   # ConfigError is a ValueError
        return None
    if getattr(cfg, "pdl", False):
        return None
    return cfg, layout


def winners(rows: Iterable[dict], per_shape: int = 2, gpu: str | None = None) -> list[Winner]:
    """Per (shape, dtype, protocol), the ``per_shape`` fastest distinct configs among usable screen rows
    (``summary.usable``; the layout of each config's fastest row), of rows measured on ``gpu`` (the results' ``gpu``
    column) when given; sorted by shape, dtype, protocol, time."""
    if per_shape < 1:
        raise RetrieveError(f"per_shape must be >= 1, got {per_shape}")
    best: dict[tuple, dict[str, Winner]] = {}
    for r in rows:
        if not usable(r) or r.get("members") or (gpu is not None and r.get("gpu") != gpu):
            continue
        parsed = _parse(r.get("candidate", ""))
        if parsed is None:
            continue
        cfg, layout = parsed
        M, N, K, t = int(r["M"]), int(r["N"]), int(r["K"]), float(r["time_ms"])
        dtype = r.get("dtype") or "fp16"
        group = best.setdefault((M, N, K, dtype, r.get("protocol", "")), {})
        key = str(cfg)
        if key not in group or t < group[key].time_ms:
            group[key] = Winner(M, N, K, r.get("protocol", ""), layout, cfg, t, dtype)
    out = []
    for key in sorted(best):
        out += sorted(best[key].values(), key=lambda w: (w.time_ms, str(w.config)))[:per_shape]
    return out


def expand(paths: Sequence[str]) -> list[str]:
    """File names and glob patterns -> the files (sorted per pattern); a pattern or name matching nothing is an
    error (a typo would otherwise retrieve nothing, silently)."""
    out: list[str] = []
    for p in paths:
        hits = sorted(glob.glob(p)) if any(ch in p for ch in "*?[") else ([p] if os.path.isfile(p) else [])
        if not hits:
            raise RetrieveError(f"--retrieve {p}: no such file; give screen CSVs (gemmrl select output, .csv or "
                                f".csv.gz) or a glob pattern matching some")
        out += [h for h in hits if h not in out]
    return out


def read_winners(paths: Sequence[str], per_shape: int = 2, gpu: str | None = None) -> tuple[Winner, ...]:
    """``winners`` of the rows in ``paths`` (files or globs), measured on ``gpu`` when given (another GPU's winners
    are refused, naming the GPUs the files hold). The files are read once per process."""
    by_gpu = _winners_by_gpu(tuple(paths), per_shape)
    found = by_gpu[None] if gpu is None else by_gpu.get(gpu, ())
    if not found and by_gpu[None]:
        held = sorted(g for g, w in by_gpu.items() if g is not None and w)
        raise RetrieveError(f"--retrieve: no screen rows measured on this GPU ({gpu}) in {', '.join(paths)}; they "
                            f"hold {', '.join(held)}. Give screens of this GPU, or --retrieve-any-gpu to screen "
                            f"another GPU's winners here")
    if not found:
        raise RetrieveError(f"--retrieve: no verified Triton screen rows in {', '.join(paths)}; give files written "
                            f"by gemmrl select (candidates named triton:<config>:<layout>)")
    return found


@lru_cache(maxsize=4)
def _winners_by_gpu(paths: tuple[str, ...], per_shape: int) -> dict[str | None, tuple[Winner, ...]]:
    """{gpu: its rows' winners, None: the winners of every GPU's rows}: one read serves the check before the GPU is
    known and the screen after."""
    rows = read_rows(expand(paths))
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r.get("gpu", ""), []).append(r)
    out: dict[str | None, tuple[Winner, ...]] = {g: tuple(winners(rs, per_shape)) for g, rs in by.items()}
    out[None] = tuple(winners(rows, per_shape))
    return out


def distance(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    return math.sqrt(sum((math.log2(x) - math.log2(y)) ** 2 for x, y in zip(a, b)))


def nearest(problem: GemmProblem, table: Sequence[Winner], shapes: int = 2) -> list[tuple[Config, str]]:
    """(config, layout) of the winners on the ``shapes`` screened shapes nearest ``problem`` (nearest first, then
    by time; each config once, with the layout it won in); of ``problem``'s dtype where the table holds any."""
    if shapes < 1:
        raise RetrieveError(f"shapes must be >= 1, got {shapes}")
    same = [w for w in table if w.dtype == problem.dtype]
    table = same or table
    here = (problem.M, problem.N, problem.K)
    dims = sorted({(w.M, w.N, w.K) for w in table},
                  key=lambda d: (distance(here, d), d))[:shapes]
    out: list[tuple[Config, str]] = []
    seen: set[str] = set()
    for d in dims:
        for w in sorted((w for w in table if (w.M, w.N, w.K) == d), key=lambda w: (w.time_ms, str(w.config))):
            if str(w.config) not in seen:
                seen.add(str(w.config))
                out.append((w.config, w.layout))
    return out
