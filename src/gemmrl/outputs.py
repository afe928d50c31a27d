"""The timed-output check: after a timed call, outside the timed window, random rows of C compared with an fp64
recompute from the inputs that call read.

The battery (verify.py) proves a candidate right on inputs it draws itself; this check proves that the calls the
timing protocols actually time computed their answer. A kernel that remembers an output and replays it when its
inputs look unchanged is right in every battery check (fresh inputs: the memo never fires) and fast in a timing
loop that reuses its inputs. The protocols give every timed call new inputs (timing.py), so a replayed output is a
wrong output, and this check finds it.

What is compared: ``CHECK_ROWS`` random rows of C (every row when M is smaller), against all of their columns while
K x N stays under ``CHECK_ELEMENTS`` (the fp64 copy of B the recompute needs), else against a random subset of
columns of that size; the rows and columns are drawn from the protocol's fresh seed, so a kernel cannot know them.
The tolerance is the battery's (``verify.tolerance_for``: the same R and element bounds, K-scaled), measured on the
sampled elements.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from .candidate import Buffers
from .verify import AccuracyError, accuracy, judge, tolerance_for

CHECK_ROWS = 8
CHECK_ELEMENTS = 1 << 24  # K x columns of B in one recompute: 128 MiB of fp64 at most
REASON = "timed_output"


def operands(bufs: Buffers, layout: str | None) -> tuple[Any, Any]:
    """(A, B as [K, N]) that a candidate of ``layout`` read: ``b`` for nn, ``bt`` transposed for tn; both forms hold
    the same B where the protocol wrote both (``layout`` None)."""
    return bufs.a, (bufs.bt.t() if layout == "tn" else bufs.b)


def check_output(bufs: Buffers, layout: str | None, rng: random.Random, where: str,
                 rows: int = CHECK_ROWS) -> str:
    """'' when the sampled rows of ``bufs.c`` match the fp64 product of the operands a ``layout`` candidate read,
    else the reason (``timed_output: ...``, naming ``where`` the call was timed and the worst element)."""
    import torch  # start-up cost: torch loads on first use, not on import

    p = bufs.problem
    a, b = operands(bufs, layout)
    r_idx = sorted(rng.sample(range(p.M), min(p.M, rows)))
    ncols = p.N if p.K * p.N <= CHECK_ELEMENTS else max(1, CHECK_ELEMENTS // p.K)
    c_idx = None if ncols >= p.N else sorted(rng.sample(range(p.N), ncols))
    dev = a.device
    ri = torch.tensor(r_idx, device=dev, dtype=torch.long)
    a_s, c_s = a.index_select(0, ri), bufs.c.index_select(0, ri)
    if c_idx is not None:
        ci = torch.tensor(c_idx, device=dev, dtype=torch.long)
        b, c_s = b.index_select(1, ci), c_s.index_select(1, ci)
    sub = replace(p, M=len(r_idx), N=c_s.shape[1])
    tol = tolerance_for(p)
    m = accuracy(c_s, a_s, b, sub, tol)
    try:
        judge(m, sub, tol, f"(sampled rows {_span(r_idx)}{'' if c_idx is None else f', {len(c_idx)} columns'})")
    except AccuracyError as e:
        i, j = m["at"]
        i, j = r_idx[i], (j if c_idx is None else c_idx[j])
        return (f"{REASON}: C after a timed call ({where}) is not the product of the inputs that call read: "
                f"C[{i},{j}] = {m['got']:.6g}, expected {m['want']:.6g} ({e.detail}); an output replayed or left "
                f"from an earlier call?")[:400]
    return ""


def _span(idx: list[int]) -> str:
    return ",".join(map(str, idx[:4])) + (",..." if len(idx) > 4 else "")


__all__ = ["CHECK_ELEMENTS", "CHECK_ROWS", "REASON", "check_output", "operands"]
