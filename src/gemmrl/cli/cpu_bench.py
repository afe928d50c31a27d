"""`gemmrl bench` where there is no CUDA GPU: nothing can be timed, so the Triton kernels the bench would time are
verified instead, under Triton's interpreter on CPU tensors, through the correctness battery (every check of
``gemmrl.verify.verify`` against an fp64 reference), and the output says plainly what needs a GPU.

    gemmrl bench --mnk 64_4096_64 --triton-top 1     # no GPU: the cost model's best config verified, not timed

Which kernels: the Triton candidates the flags ask for (``--triton-top K``, ``--triton-from CSV``), else the cost
model's best config per shape (what ``--triton-top 1`` times on a GPU). Everything else the flags ask for (the vendor
paths, ``--library``, ``--kernel-dir``, ``--cuda-source``, the CUTLASS/wgmma/tiny re-measures) needs a GPU and is
named as such. Nothing is written: there are no timings to record. Exit 0 when every kernel verified, 1 otherwise.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

from ..problem import GemmProblem
from .common import CliError

DEFAULT_TOP = 1          # configs per shape when the flags name no Triton kernel
MAX_MACS = 1 << 28       # M*N*K beyond which one kernel takes minutes under the interpreter (64_4096_64: 2^24)
GPU_ONLY_FLAGS = ("library", "kernel_dir", "cuda_source", "cutlass_from", "wgmma_from", "tiny_from", "decode_from")
INSTALL = "python3 -m pip install -c constraints.txt -e \".[triton]\" (or: pip install triton)"


@dataclass(frozen=True)
class CpuPlan:
    problems: tuple[GemmProblem, ...]
    sources: tuple[Callable[[GemmProblem], list], ...]  # per shape, the Triton candidates to verify
    what: str                                            # those candidates, in words
    too_large: tuple[str, ...]                           # shapes left out: minutes per kernel under the interpreter
    needs_gpu: tuple[str, ...]                           # what the flags asked for that only a GPU can do


def torch_without_cuda() -> bool:
    """torch imports and sees no CUDA device (no torch at all: False, and bench's own check says to install it)."""
    try:
        import torch  # start-up cost: torch, only once bench is past its flag checks
    except ImportError:
        return False
    return not torch.cuda.is_available()


def has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def plan(args, problems: Sequence[GemmProblem], triton_sources: tuple, protocols: Sequence[str]) -> CpuPlan:
    """What this machine can do of the bench the flags ask for."""
    sources = triton_sources
    what = "the Triton configs the flags name"
    if not sources:
        from ..search.top import top_candidates  # start-up cost: the cost model

        sources = (lambda p: top_candidates(p, DEFAULT_TOP),)
        what = f"the cost model's best Triton config per shape (what --triton-top {DEFAULT_TOP} times on a GPU)"
    elif args.triton_top:
        k = args.triton_top
        what = f"the cost model's best {'' if k == 1 else f'{k} '}Triton config{'s' if k > 1 else ''} per shape" + (
            " and the selected ones of --triton-from" if args.triton_from else "")
    elif args.triton_from:
        what = "the Triton configs --triton-from selected"
    small = tuple(p for p in problems if p.M * p.N * p.K <= MAX_MACS)
    large = tuple(p.mnk for p in problems if p.M * p.N * p.K > MAX_MACS)
    needs = [f"timing ({', '.join(protocols)}) and the vendor paths"]
    needs += [f"--{f.replace('_', '-')}" for f in GPU_ONLY_FLAGS if getattr(args, f, None)]
    return CpuPlan(small, sources, what, large, tuple(needs))


def _line(mnk: str, name: str, passed: bool, reason: str, r, seconds) -> str:
    stat = f"R={float(r):.3f}, " if r not in ("", None) else ""
    secs = f"{float(seconds):.1f} s" if seconds not in ("", None) else ""
    tail = f"({stat}{secs})" if passed else f"{reason[:160]}"
    return f"  {mnk:>16}  {'PASS' if passed else 'FAIL'}  {name}  {tail}"


def run(p: CpuPlan, out=print) -> int:
    """Verify every planned kernel under the interpreter, print one line each and what needs a GPU; the exit code."""
    gpu = "; ".join(p.needs_gpu)
    out("gemmrl bench: no CUDA GPU here (torch.cuda.is_available() is False), so nothing is timed: timing needs a "
        "CUDA GPU.")
    if not has_triton():
        raise CliError(f"verifying kernels without a GPU needs Triton's interpreter, and triton is not installed: "
                       f"{INSTALL}; timing needs a CUDA GPU")
    for mnk in p.too_large:
        out(f"  {mnk:>16}  left out: M*N*K > 2^{MAX_MACS.bit_length() - 1} takes minutes per kernel under the "
            "interpreter; verify and time it on a GPU")
    if not p.problems:
        out(f"Nothing verified. Needs a CUDA GPU: {gpu}.")
        return 1
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from .. import verify as V  # start-up cost: the battery and torch

    out(f"Verifying instead {p.what}, under Triton's interpreter on the CPU, through the correctness battery "
        "(fp64 reference; nan_fill, exact_int, accuracy, second_call, memo):")
    passed = total = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the interpreter's, not the user's business
        for prob in p.problems:
            for src in p.sources:
                cands = list(src(prob))
                for cand in cands:
                    t0 = time.perf_counter()
                    rows = V.verify_rows([prob], [cand], "cpu", cuda_l2=False)
                    row = rows[0]
                    total += 1
                    passed += bool(row["verified"])
                    out(_line(prob.mnk, row["candidate"], bool(row["verified"]), str(row.get("reason", "")),
                              row.get("r"), row.get("seconds") or time.perf_counter() - t0))
                    sys.stdout.flush()
                if not cands:
                    out(f"  {prob.mnk:>16}  no Triton config for this shape from {p.what}")
    out(f"Verified {passed} of {total} kernel(s) on the CPU. Not done here, needs a CUDA GPU: {gpu}.")
    return 0 if total and passed == total else 1
