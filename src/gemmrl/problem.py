"""GEMM problems: C[M,N] = A[M,K] @ B[K,N] in fp16/bf16, the CUDA-L2 grid, shape features.

A is row-major [M,K] and C row-major [M,N]. B comes in two forms (DESIGN.md): layout ``nn`` reads
B row-major [K,N]; ``tn`` reads B^T row-major [N,K] (nn.Linear's weight). ``acc`` is the
accumulator: ``fp32`` (default) or ``fp16`` (an explicit mode, compared only with fp16-compute
vendor calls). Nothing here touches a GPU.
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass, replace

DTYPES = ("fp16", "bf16")
ACCS = ("fp32", "fp16")
LAYOUTS = ("nn", "tn")
GRID_DIMS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384)
# Beyond this a single operand no longer fits in any GPU we target; almost always a typo.
MAX_DIM = 1 << 20
MAX_ELEMENTS = 1 << 34

# Datasheet peaks used for the floor (DESIGN.md "Floors"): dense fp16/bf16 tensor TFLOP/s, HBM TB/s.
GPU_PEAKS = {
    "H100": (989.0, 3.35),
    "H200": (989.0, 4.8),
}


class ProblemError(ValueError):
    """A GEMM problem that cannot be run, with a message that says what to pass instead."""


@dataclass(frozen=True, order=True)
class GemmProblem:
    M: int
    N: int
    K: int
    dtype: str = "fp16"
    acc: str = "fp32"
    layout: str = "tn"

    def __post_init__(self) -> None:
        for name in ("M", "N", "K"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ProblemError(f"{name} must be an int, got {v!r}")
            if v < 1:
                raise ProblemError(f"{name} must be >= 1, got {v} (shapes are M_N_K with positive dims)")
            if v > MAX_DIM:
                raise ProblemError(f"{name}={v} exceeds {MAX_DIM}; split the GEMM or check the shape")
        for a, b in (("M", "K"), ("K", "N"), ("M", "N")):
            if getattr(self, a) * getattr(self, b) > MAX_ELEMENTS:
                raise ProblemError(f"{a}*{b} = {getattr(self, a) * getattr(self, b)} elements is too large for one operand")
        if self.dtype not in DTYPES:
            raise ProblemError(f"unknown dtype {self.dtype!r}; use one of {', '.join(DTYPES)}")
        if self.acc not in ACCS:
            raise ProblemError(f"unknown accumulator {self.acc!r}; use one of {', '.join(ACCS)}")
        if self.layout not in LAYOUTS:
            raise ProblemError(f"unknown layout {self.layout!r}; use 'nn' (B is [K,N]) or 'tn' (B^T is [N,K])")

    # -- names -------------------------------------------------------------------------------
    @property
    def mnk(self) -> str:
        return f"{self.M}_{self.N}_{self.K}"

    def with_(self, **kw) -> "GemmProblem":
        return replace(self, **kw)

    # -- features ------------------------------------------------------------------------------
    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    @property
    def bytes(self) -> int:
        """Fewest bytes moved through device memory: A and B read once, C written once (2 B each)."""
        return 2 * (self.M * self.K + self.K * self.N + self.M * self.N)

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    def floor_s(self, gpu: str, in_l2: bool = False) -> float:
        """T_floor = max(2MNK / P_tc, bytes / BW) from datasheet peaks (seconds).

        ``in_l2`` drops the bytes term (graph protocol with operands resident in L2).
        """
        p_tc, bw = peaks_for(gpu)
        t_math = self.flops / (p_tc * 1e12)
        t_mem = 0.0 if in_l2 else self.bytes / (bw * 1e12)
        return max(t_math, t_mem)

    def features(self) -> dict[str, float]:
        return {
            "M": self.M, "N": self.N, "K": self.K, "flops": self.flops, "bytes": self.bytes,
            "intensity": self.intensity,
        }


def peaks_for(gpu: str) -> tuple[float, float]:
    """Datasheet (TFLOP/s, TB/s) for a GPU name as torch reports it ('NVIDIA H100 80GB HBM3')."""
    g = gpu.upper()
    for key, val in GPU_PEAKS.items():
        if key in g:
            return val
    raise ProblemError(f"no datasheet peaks for GPU {gpu!r}; known: {', '.join(GPU_PEAKS)}")


def parse_mnk(text: str, **kw) -> GemmProblem:
    """Parse ``64_4096_64`` (also ``64x4096x64``) into a GemmProblem."""
    s = str(text).strip().lower().replace("x", "_")
    parts = s.split("_")
    if len(parts) != 3 or not all(p.strip().lstrip("-").isdigit() for p in parts):
        raise ProblemError(f"cannot parse shape {text!r}; write it as M_N_K, e.g. 64_4096_64")
    m, n, k = (int(p) for p in parts)
    return GemmProblem(m, n, k, **kw)


def grid(**kw) -> list[GemmProblem]:
    """CUDA-L2's 1000 configurations, M, N, K each in GRID_DIMS, in M-major order."""
    return [GemmProblem(m, n, k, **kw) for m, n, k in itertools.product(GRID_DIMS, repeat=3)]


def sample_grid(n: int, seed: int = 0, **kw) -> list[GemmProblem]:
    """A reproducible sample of ``n`` grid shapes (sorted by FLOPs so sweeps start small)."""
    g = grid(**kw)
    if not 1 <= n <= len(g):
        raise ProblemError(f"--sample must be in 1..{len(g)}, got {n}")
    picked = random.Random(seed).sample(g, n)
    return sorted(picked, key=lambda p: (p.flops, p.mnk))


def parse_part(text: str) -> tuple[int, int]:
    """``K/N`` (1 <= K <= N) into (K, N): the K-th of N parts of a shape list (see ``part_of``)."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ProblemError(f"--part takes K/N with 1 <= K <= N (the K-th of N parts), e.g. 1/5; got {text!r}")
    return int(m.group(1)), int(m.group(2))


def part_of(problems: list[GemmProblem], k: int, n: int) -> list[GemmProblem]:
    """The ``k``-th (1-based) of ``n`` interleaved parts: the shapes ordered by (FLOPs, mnk) and dealt out like cards,
    so every part holds a like mix of small and large shapes (and about the same GPU time); the parts are disjoint,
    cover the list, and do not depend on the order they were given in. Within a part, smallest first."""
    if not 1 <= k <= n:
        raise ProblemError(f"part {k} of {n}: want 1 <= K <= N")
    ordered = sorted(dict.fromkeys(problems), key=lambda p: (p.flops, p.mnk, p.dtype, p.acc, p.layout))
    return ordered[k - 1 :: n]


def read_shapes(path: str, **kw) -> list[GemmProblem]:
    """One M_N_K per line (``#`` comments and blank lines ignored; a CSV with an ``mnk`` column works too)."""
    out: list[GemmProblem] = []
    try:
        with open(path) as fh:
            lines = fh.read().splitlines()
    except UnicodeDecodeError:
        raise ProblemError(f"{path} is not a text file; write one M_N_K per line") from None
    first = 1
    if lines and "mnk" in lines[0].split(","):
        col, first = lines[0].split(",").index("mnk"), 2
        lines = [ln.split(",")[col] if len(ln.split(",")) > col else ln for ln in lines[1:]]  # short row: its text
    for i, line in enumerate(lines, first):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            out.append(parse_mnk(line, **kw))
        except ProblemError as e:
            raise ProblemError(f"{path}:{i}: {e}") from None
    if not out:
        raise ProblemError(f"{path} holds no shapes; write one M_N_K per line")
    return list(dict.fromkeys(out))


def read_shape_labels(path: str) -> dict[str, str]:
    """``{mnk: label}`` from a shapes file whose lines carry a comment after the shape (``16_4096_4096  # llama-3-8b
    o_proj``); shapes without one are left out."""
    out: dict[str, str] = {}
    with open(path) as fh:
        for line in fh:
            shape, sep, note = line.partition("#")
            shape, note = shape.strip(), note.strip()
            if sep and shape and note:
                out[parse_mnk(shape).mnk] = note
    return out
