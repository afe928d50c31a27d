"""Configs of the Triton GEMM family and their validity predicates (one per variant).

A config is a frozen dataclass: the search action, the cache key and the library row at once. Each variant
has exactly one predicate ``valid(cfg, problem, arch) -> (ok, reason)``; ``check`` raises ``ConfigError``
with that reason. The search, the dispatcher, the launcher and the tests all call the same predicate, so
an invalid config is never launched. The reasons say what to use instead.

Variants (kernels in ``jit/``):
  ``tiled``       one output tile per program, pointer loads, GROUP_M swizzle, any M, N, K (masked tails).
  ``persistent``  one program per SM (times ``ctas_per_sm``) looping over tiles in a chosen order, TMA tensor
                  descriptors (Hopper) or a pointer-load fallback (``tma=False``, any shape).
  ``splitk``      K split over ``split`` programs per tile, fp32 partials; deterministic reductions
                  (``two_pass``: workspace [split,M,N] + a second kernel; ``fused``: the last program of a
                  tile sums the partials in fixed order) or fp32 atomics (``atomic``, needs
                  ``nondeterministic=True``).
  ``smallm``      decode shapes (M in 1..63): swap-AB (C^T = B^T A^T, the MMA's M dimension is N), one M tile,
                  wide N tiles streaming B, optional TMA loads and split-K. ``mma=False`` (M in 1..8): no tensor
                  cores, a GEMV: each program streams BN rows (or columns) of B into registers and multiplies them
                  with A's BM rows on the CUDA cores in fp32, summing along K once after the loop.

Nothing here imports torch or triton.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar, Union

from ...problem import GemmProblem, ProblemError, peaks_for


class ConfigError(ValueError):
    """A config that must not be launched for this problem on this GPU; the message says why and what to use."""


# ---------------------------------------------------------------------------------------------------
# Architecture
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arch:
    """What the validity predicates and the cost model need to know about a GPU."""

    name: str
    cc: int                      # compute capability, 90 for sm_90
    num_sms: int
    smem_per_block: int          # opt-in shared memory per block (bytes)
    smem_per_sm: int
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    l2_bytes: int = 50 << 20
    peak_tflops: float = 989.0   # dense fp16/bf16 tensor-core peak
    hbm_tbps: float = 3.35
    l2_tbps: float = 11.0        # sustained L2 -> SM bandwidth (approximate; >= 9 TB/s is implied by cuBLAS at 4096^3)

    @staticmethod
    def from_device(device=None) -> "Arch":
        """The GPU torch sees (``torch.cuda.get_device_properties``); peaks from problem.GPU_PEAKS where known."""
        import torch  # start-up cost: torch loads on first use, not on import

        p = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
        cc = p.major * 10 + p.minor
        smem_block = getattr(p, "shared_memory_per_block_optin", 0) or (232448 if cc >= 90 else 166912)
        smem_sm = getattr(p, "shared_memory_per_multiprocessor", 0) or smem_block + 1024
        try:
            tflops, bw = peaks_for(p.name)
        except ProblemError:
            tflops, bw = H100.peak_tflops, H100.hbm_tbps
        return Arch(p.name, cc, p.multi_processor_count, smem_block, smem_sm,
                    regs_per_sm=getattr(p, "regs_per_multiprocessor", 65536),
                    l2_bytes=getattr(p, "L2_cache_size", 50 << 20), peak_tflops=tflops, hbm_tbps=bw)


H100 = Arch("H100", 90, 132, 232448, 233472)
H200 = Arch("H200", 90, 132, 232448, 233472, l2_bytes=60 << 20, hbm_tbps=4.8)
A100 = Arch("A100", 80, 108, 166912, 167936, l2_bytes=40 << 20, peak_tflops=312.0, hbm_tbps=2.0, l2_tbps=5.0)
# The Triton interpreter (CPU tensors): judged as an H100, so the CPU tier exercises the same predicate.
INTERPRETER = Arch("interpreter", 90, 132, 232448, 233472)


# ---------------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------------
class _Base:
    variant: ClassVar[str] = ""

    def as_dict(self) -> dict:
        return {"variant": self.variant, **asdict(self)}

    def __str__(self) -> str:
        """``tiled(BM=64,BN=64,...)``: the string ``info()`` reports and ``parse_config`` reads back. Fields added
        after configs were first named (``pdl``) are left out at their default, so earlier names stay valid."""
        body = ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                        if not (f.metadata.get("omit_default") and getattr(self, f.name) == f.default))
        return f"{self.variant}({body})"


def _pdl():
    """``pdl``: programmatic dependent launch (Hopper). The kernel waits (griddepcontrol.wait) for the grid before
    it in the stream to finish before it touches memory, then lets the next grid launch; launched with the
    programmatic-serialization attribute, its own launch overlaps the previous kernel instead of following it."""
    return field(default=False, metadata={"omit_default": True})


GEMV_MAX_M = 8  # smallm with mma=False: M x the B tile's fp32 products per step live in registers
WS_MAX_STAGES = 4  # see the ws rule in the persistent predicate: stages=5 raced on the H100


@dataclass(frozen=True)
class TiledConfig(_Base):
    """One output tile per program; pointer loads with masked tails; GROUP_M swizzle over the tile grid."""

    variant: ClassVar[str] = "tiled"
    BM: int = 64
    BN: int = 64
    BK: int = 32
    warps: int = 4
    stages: int = 3
    group_m: int = 8
    pdl: bool = _pdl()


@dataclass(frozen=True)
class PersistentConfig(_Base):
    """``min(tiles, num_sms*ctas_per_sm)`` programs loop over tiles. ``order`` 'm' walks groups of ``group_m``
    tile rows (the usual swizzle), 'n' groups of ``group_m`` tile columns. ``tma``: tensor-descriptor loads and
    stores (Hopper; K and N multiples of 8); ``tma=False`` is the pointer-load fallback for any shape.
    ``flatten``/``ws``: tl.range(flatten=, warp_specialize=) on the tile loop (ws needs tma, sm_90+, 4 warps).
    ``subtile``: the epilogue stores two BM x BN/2 halves (less staging shared memory)."""

    variant: ClassVar[str] = "persistent"
    BM: int = 128
    BN: int = 128
    BK: int = 64
    warps: int = 8
    stages: int = 3
    group_m: int = 8
    order: str = "m"
    tma: bool = True
    flatten: bool = False
    ws: bool = False
    subtile: bool = False
    ctas_per_sm: int = 1
    pdl: bool = _pdl()


@dataclass(frozen=True)
class SplitKConfig(_Base):
    """Tiles x ``split`` programs, each over a contiguous range of whole BK steps of K.
    ``reduction``: 'two_pass' (fp32 workspace [split,M,N], then a reduction kernel: no atomics),
    'fused' (the last of a tile's programs, found with an atomic counter, sums the partials in fixed order:
    bitwise deterministic, one launch), 'atomic' (fp32 atomic adds: run-to-run nondeterministic, so only with
    ``nondeterministic=True``). ``tma``: descriptor loads for A and B (Hopper, K and N multiples of 8)."""

    variant: ClassVar[str] = "splitk"
    BM: int = 64
    BN: int = 64
    BK: int = 64
    warps: int = 4
    stages: int = 4
    group_m: int = 8
    split: int = 4
    reduction: str = "two_pass"
    tma: bool = False
    nondeterministic: bool = False
    pdl: bool = _pdl()


@dataclass(frozen=True)
class SmallMConfig(_Base):
    """Decode shapes, M in 1..63: swap-AB (acc[BN, BM] = B^T[BN,BK] @ A^T[BK,BM]), BM the next power of two
    >= max(M, 16) (one M tile), BN wide, B streamed once. ``split`` > 1 splits K (reduction 'two_pass' or
    'fused' as in SplitKConfig); split 1 has reduction 'none'. ``tma``: descriptor loads (Hopper).
    ``mma=False`` (M in 1..8, jit/gemv.py): no tensor cores; BM the next power of two >= M, B's [BN, BK] tiles
    loaded straight into registers (no shared-memory ring: stages 1, no TMA) and multiplied with A's rows in
    fp32 on the CUDA cores, block K up to 1024. Where M is 1, the MMA's 16-row minimum pads 15 of 16 rows."""

    variant: ClassVar[str] = "smallm"
    BM: int = 16
    BN: int = 64
    BK: int = 128
    warps: int = 4
    stages: int = 4
    split: int = 1
    reduction: str = "none"
    tma: bool = False
    pdl: bool = _pdl()
    mma: bool = field(default=True, metadata={"omit_default": True})


Config = Union[TiledConfig, PersistentConfig, SplitKConfig, SmallMConfig]
CONFIG_TYPES = {c.variant: c for c in (TiledConfig, PersistentConfig, SplitKConfig, SmallMConfig)}


def parse_config(text: str) -> Config:
    """Inverse of ``str(cfg)``: ``tiled(BM=64,BN=64,BK=32,warps=4,stages=3,group_m=8)``."""
    text = text.strip()
    name, _, body = text.partition("(")
    if name not in CONFIG_TYPES or not body.endswith(")"):
        raise ConfigError(f"cannot parse config {text!r}; expected e.g. {TiledConfig()}")
    cls = CONFIG_TYPES[name]
    types = {f.name: f.type for f in fields(cls)}
    kw = {}
    for item in filter(None, body[:-1].split(",")):
        k, _, v = item.partition("=")
        if k not in types:
            raise ConfigError(f"{name} has no field {k!r}; fields: {', '.join(types)}")
        t = types[k]
        kw[k] = (v == "True") if t in (bool, "bool") else int(v) if t in (int, "int") else v
    return cls(**kw)


# ---------------------------------------------------------------------------------------------------
# Resource estimates
# ---------------------------------------------------------------------------------------------------
def _pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def acc_bytes(problem: GemmProblem) -> int:
    return 2 if problem.acc == "fp16" else 4


def smem_bytes(cfg: Config, problem: GemmProblem) -> int:
    """Shared memory one program needs: ``stages`` buffers of the A and B tiles (2 B per element), plus the
    epilogue's staging tile where it stays live beside them (TMA store of the persistent kernel)."""
    if not getattr(cfg, "mma", True):  # GEMV: loads go to registers; shared memory only for the final sum along K
        return 8 * cfg.BM * cfg.BN * cfg.warps + 2048  # across warps (ptxas on sm_90: 1-8 KB, under this bound)
    ring = cfg.stages * (cfg.BM + cfg.BN) * cfg.BK * 2
    epi = 0
    if isinstance(cfg, PersistentConfig) and cfg.tma:
        epi = cfg.BM * (cfg.BN // 2 if cfg.subtile else cfg.BN) * 2
    else:  # layout conversion before the store reuses the ring's memory once the loop is done
        ring = max(ring, cfg.BM * cfg.BN * acc_bytes(problem))
    if getattr(cfg, "flatten", False):  # the flattened loop keeps an epilogue buffer live beside the ring
        epi += cfg.BM * cfg.BN * 2
    if getattr(cfg, "ws", False) and cfg.BM == 64:  # consumers of 32 rows each stage their halves separately
        epi += cfg.BM * cfg.BN * 2
    return ring + epi + 1024  # barriers and alignment


def acc_regs(cfg: Config, problem: GemmProblem) -> int:
    """32-bit registers per thread that the accumulator tile alone occupies. With warp specialization (Triton
    3.6, Hopper) the tile is split over two consumer warpgroups of ``warps`` warps each."""
    consumers = cfg.warps * (2 if getattr(cfg, "ws", False) else 1)
    if not getattr(cfg, "mma", True):  # GEMV: fp32 products of a whole [BM, BN, BK] step, summed after the loop
        return cfg.BM * cfg.BN * cfg.BK // (32 * consumers)
    return cfg.BM * cfg.BN * acc_bytes(problem) // 4 // (32 * consumers)


# Of 255 registers per thread: the rest holds addresses, fragments and the epilogue. Calibrated with ptxas -v on
# sm_90 (compile_check.py): every variant at 128 compiles without spills (154-252 registers), except a fused
# split-K epilogue, which holds the running sum beside each partial it loads (128x128 on 4 warps: 16 bytes of
# spills; at 64 registers: 166-197, none). 256 spills kilobytes and serializes wgmma.
ACC_REG_LIMIT = 128
ACC_REG_LIMIT_FUSED = 96
# mma.sync (no wgmma: tiles under 64 MMA rows, or warps not in whole warpgroups, or before sm_90) keeps operand
# fragments in registers: accumulator + half the A and B elements per thread per K step. ptxas on 30 sampled
# configs: at or under 240 at most 8 bytes of spills, over it 256 bytes to 3 KB.
MMA_V2_REG_LIMIT = 240
# Unaligned pointer loads (see aligned_operands) hold an address per element: ~3 registers per loaded element
# per thread, plus the accumulator (three times over for a fused/atomic epilogue, whose workspace addresses are
# per element too). Calibrated with ptxas on 33x65x129 and 128x128x136: at or under 224 no spills, over it
# spills of 0.2-15 KB.
UNALIGNED_REG_LIMIT = 224


def aligned_operands(problem: GemmProblem) -> tuple[bool, bool]:
    """Whether Triton can prove the rows of A and of B (as the layout reads it) 16-element aligned. Its JIT marks
    an int argument divisible only when it is a multiple of 16, so a row stride of K=136 is as unknown as K=129:
    pointer loads are then scalar, not pipelined through shared memory (no cp.async), and register-hungry. TMA
    descriptors do not care (they need 16 bytes, K % 8)."""
    return problem.K % 16 == 0, (problem.N if problem.layout == "nn" else problem.K) % 16 == 0


MAX_WORKSPACE = 1 << 30


def workspace_bytes(cfg: Config, problem: GemmProblem) -> int:
    split = getattr(cfg, "split", 1)
    if split <= 1:
        return 0
    if getattr(cfg, "reduction", "") == "atomic":
        return problem.M * problem.N * 4
    return split * problem.M * problem.N * 4


# ---------------------------------------------------------------------------------------------------
# Validity
# ---------------------------------------------------------------------------------------------------
def _common(cfg: Config, problem: GemmProblem, arch: Arch, out: list[str]) -> None:
    gemv = not getattr(cfg, "mma", True)  # no tl.dot: BM may be under 16, BK up to 1024
    for name in ("BM", "BN", "BK"):
        v = getattr(cfg, name)
        least = 1 if gemv and name == "BM" else 16
        if not _pow2(v) or v < least:
            out.append(f"{name}={v} must be a power of two >= {least} (tl.arange{'' if gemv else ', tl.dot'})")
    if cfg.BK > (1024 if gemv else 256) or cfg.BM > 256 or cfg.BN > 256:
        out.append("tile dims above 256 are not supported (TMA box and register limits); use <= 256 (block K up to "
                   "1024 with mma=False)")
    if cfg.warps not in (1, 2, 4, 8):
        out.append(f"warps={cfg.warps} must be one of 1, 2, 4, 8 (16 warps leave 128 registers per thread: ptxas "
                   f"fails on a 256x256 tile)")
    if not 1 <= cfg.stages <= 8:
        out.append(f"stages={cfg.stages} must be in 1..8")
    if getattr(cfg, "group_m", 1) < 1:
        out.append("group_m must be >= 1")
    if cfg.pdl and arch.cc < 90:
        out.append(f"pdl (programmatic dependent launch) needs sm_90+, {arch.name} is sm_{arch.cc}; use pdl=False")
    big = max(problem.M * problem.K, problem.K * problem.N, problem.M * problem.N)
    if big >= 1 << 31:
        out.append(f"an operand of {big} elements overflows the kernels' int32 offsets; split the GEMM")
    if problem.acc == "fp16" and problem.dtype != "fp16":
        out.append("acc='fp16' is defined for fp16 data only (F16F16F16F16); use acc='fp32' for bf16")
    if out:
        return
    if isinstance(cfg, SmallMConfig):  # memory-bound: warps are there to stream B, 16 bytes each at least
        if cfg.BN * cfg.BK < cfg.warps * 32 * 8:
            out.append(f"{cfg.warps} warps on a {cfg.BN}x{cfg.BK} B tile load less than 16 bytes each per step; use "
                       f"fewer warps or a larger BN*BK")
    elif (cfg.BM // 16) * (cfg.BN // 16) < cfg.warps:
        out.append(f"{cfg.warps} warps on a {cfg.BM}x{cfg.BN} tile leave warps idle; use fewer warps or a larger tile")
    regs = acc_regs(cfg, problem)
    limit = ACC_REG_LIMIT_FUSED if getattr(cfg, "reduction", "") == "fused" else ACC_REG_LIMIT
    if getattr(cfg, "split", 1) > 1:  # the split-K epilogue handles fp32 partials, whatever the accumulator
        regs = max(regs, cfg.BM * cfg.BN // (32 * cfg.warps))
    if regs > limit:
        out.append(f"accumulator needs {regs} registers/thread (> {limit}): spills; use more warps or a "
                   f"smaller tile")
    elems = (cfg.BM + cfg.BN) * cfg.BK // (32 * cfg.warps)  # A and B elements per thread per K step
    mma_m = cfg.BN if isinstance(cfg, SmallMConfig) else cfg.BM
    # (a GEMV holds no MMA operand fragments: its products are the accumulator acc_regs counts)
    if not gemv and not (arch.cc >= 90 and mma_m >= 64 and cfg.warps % 4 == 0) and regs + elems // 2 > MMA_V2_REG_LIMIT:
        out.append(f"without wgmma (MMA M dimension {mma_m} < 64 or {cfg.warps} warps not whole warpgroups) the "
                   f"operand fragments of a {cfg.BM}x{cfg.BN}x{cfg.BK} step live in registers: ~{regs + elems // 2} "
                   f"(> {MMA_V2_REG_LIMIT}); use a smaller BK or more warps")
    if not getattr(cfg, "tma", False) and not all(aligned_operands(problem)):
        mult = 3 if getattr(cfg, "reduction", "") in ("fused", "atomic") else 1
        need = mult * regs + 3 * elems
        if need > UNALIGNED_REG_LIMIT:
            out.append(f"K={problem.K}, N={problem.N} rows are not 16-element aligned: scalar loads of "
                       f"{elems} elements/thread per K step need ~{need} registers (> {UNALIGNED_REG_LIMIT}); use a "
                       f"smaller BK or tile, more warps, or TMA")
    smem = smem_bytes(cfg, problem)
    if smem > arch.smem_per_block:
        out.append(f"needs ~{smem // 1024} KB shared memory > {arch.smem_per_block // 1024} KB on {arch.name}; "
                   f"use fewer stages or a smaller BK")


def _tma(cfg: Config, problem: GemmProblem, arch: Arch, out: list[str], store_c: bool) -> None:
    """TMA descriptors: sm_90+, 16-byte strides (K*2 and N*2), 16-byte boxes' inner dims, boxes <= 256."""
    if arch.cc < 90:
        out.append(f"TMA needs sm_90+, {arch.name} is sm_{arch.cc}; use tma=False")
    if problem.K % 8:
        out.append(f"TMA needs K*2 bytes to be a multiple of 16 (K % 8 == 0), K={problem.K}; use tma=False")
    if (problem.layout == "nn" or store_c) and problem.N % 8:
        out.append(f"TMA needs N*2 bytes to be a multiple of 16 (N % 8 == 0), N={problem.N}; use tma=False")


def _valid_tiled(cfg: TiledConfig, problem: GemmProblem, arch: Arch, out: list[str]) -> None:
    _common(cfg, problem, arch, out)


def _valid_persistent(cfg: PersistentConfig, problem: GemmProblem, arch: Arch, out: list[str]) -> None:
    _common(cfg, problem, arch, out)
    if cfg.order not in ("m", "n"):
        out.append(f"order={cfg.order!r} must be 'm' or 'n'")
    if cfg.ctas_per_sm not in (1, 2):
        out.append("ctas_per_sm must be 1 or 2")
    if cfg.tma:
        _tma(cfg, problem, arch, out, store_c=True)
    if cfg.ws and not (cfg.tma and arch.cc >= 90 and cfg.warps == 4):
        out.append("ws (warp specialization) needs tma=True, sm_90+ and warps=4 (Triton 3.6's Hopper pass turns a "
                   "4-warp loop into a producer and two consumer warpgroups; at 8 warps the flag does nothing)")
    if cfg.ws and cfg.BM == 64 and cfg.BN > 128:
        out.append("ws with BM=64 needs BN <= 128 (Triton 3.6's Hopper warp-specialization pass fails on 64x256)")
    if cfg.ws and cfg.stages > WS_MAX_STAGES:
        out.append(f"ws needs stages <= {WS_MAX_STAGES}: on the H100 (Triton 3.6; docs/measurements.md, Triton family: the "
                   f"first Triton measurements) every ws config with "
                   f"stages=5 that ran (128x256x32 at 4096^3) left 15-16k elements of C unwritten, a different "
                   f"count each call (a race); stages=3 passed the battery")
    if cfg.ws and (cfg.flatten or cfg.subtile or cfg.ctas_per_sm > 1):
        out.append("ws goes with flatten=False (with it the pass does nothing), subtile=False (the pass fails on the "
                   "split epilogue) and ctas_per_sm=1 (12 warps of 168 registers fill an SM)")
    if cfg.subtile and not cfg.tma:
        out.append("subtile is a TMA-store epilogue option; use subtile=False with tma=False")
    if cfg.subtile and cfg.BN < 32:
        out.append("subtile needs BN >= 32")
    if not out and cfg.ctas_per_sm > 1:
        smem = smem_bytes(cfg, problem)
        if cfg.ctas_per_sm * smem > arch.smem_per_sm:
            out.append(f"{cfg.ctas_per_sm} programs/SM need {cfg.ctas_per_sm * smem // 1024} KB shared memory "
                       f"> {arch.smem_per_sm // 1024} KB; use ctas_per_sm=1")
        regs = cfg.ctas_per_sm * cfg.warps * 32 * min(arch.max_regs_per_thread, acc_regs(cfg, problem) + 64)
        if regs > arch.regs_per_sm:
            out.append(f"{cfg.ctas_per_sm} programs/SM need ~{regs} registers > {arch.regs_per_sm}; use ctas_per_sm=1")


def _valid_split(cfg, problem: GemmProblem, arch: Arch, out: list[str]) -> None:
    k_tiles = -(-problem.K // cfg.BK)
    if cfg.split > k_tiles:
        out.append(f"split={cfg.split} exceeds the {k_tiles} BK={cfg.BK} steps of K={problem.K}; use a smaller split "
                   f"or BK")
    elif cfg.split > 1 and (cfg.split - 1) * -(-k_tiles // cfg.split) >= k_tiles:
        out.append(f"split={cfg.split} over {k_tiles} K steps leaves a slice empty; use split <= "
                   f"{_max_split(k_tiles)}")
    ws = workspace_bytes(cfg, problem)
    if ws > MAX_WORKSPACE:
        out.append(f"fp32 workspace of {ws >> 20} MiB > {MAX_WORKSPACE >> 20} MiB; use a smaller split")
    if cfg.tma:
        _tma(cfg, problem, arch, out, store_c=False)


def _max_split(k_tiles: int) -> int:
    return max(s for s in range(1, k_tiles + 1) if (s - 1) * -(-k_tiles // s) < k_tiles)


def _valid_splitk(cfg: SplitKConfig, problem: GemmProblem, arch: Arch, out: list[str]) -> None:
    _common(cfg, problem, arch, out)
    if cfg.split < 2:
        out.append(f"split={cfg.split}: split-K needs split >= 2; use the tiled variant for split 1")
    if cfg.reduction not in ("two_pass", "fused", "atomic"):
        out.append(f"reduction={cfg.reduction!r} must be 'two_pass', 'fused' or 'atomic'")
    if cfg.reduction == "atomic" and not cfg.nondeterministic:
        out.append("reduction='atomic' sums fp32 partials in arrival order (run-to-run nondeterministic): it needs "
                   "nondeterministic=True; use 'two_pass' or 'fused' for deterministic results")
    if cfg.nondeterministic and cfg.reduction != "atomic":
        out.append("nondeterministic=True only goes with reduction='atomic'")
    if not out:
        _valid_split(cfg, problem, arch, out)


def _valid_smallm(cfg: SmallMConfig, problem: GemmProblem, arch: Arch, out: list[str]) -> None:
    if not 1 <= problem.M <= 63:
        out.append(f"smallm is for decode shapes, M in 1..63; M={problem.M}: use tiled, persistent or splitk")
        return
    if cfg.mma:
        want = next_pow2(max(problem.M, 16))
        if cfg.BM != want:
            out.append(f"smallm covers M={problem.M} with one tile of BM={want} (next power of two >= max(M, 16)); "
                       f"BM={cfg.BM} given")
    else:
        if problem.M > GEMV_MAX_M:
            out.append(f"mma=False (a GEMV on the CUDA cores) is for M in 1..{GEMV_MAX_M}; M={problem.M}: use "
                       f"mma=True")
            return
        want = next_pow2(problem.M)
        if cfg.BM != want:
            out.append(f"mma=False covers M={problem.M} with one tile of BM={want} (next power of two >= M); "
                       f"BM={cfg.BM} given")
        if cfg.tma or cfg.stages != 1:
            out.append("mma=False loads B straight into registers: use tma=False and stages=1")
        if problem.acc == "fp16":
            out.append("mma=False accumulates in fp32 only; use mma=True for acc='fp16'")
    _common(cfg, problem, arch, out)
    if cfg.split < 1:
        out.append("split must be >= 1")
    elif cfg.split == 1 and cfg.reduction != "none":
        out.append("split=1 has no reduction: use reduction='none'")
    elif cfg.split > 1 and cfg.reduction not in ("two_pass", "fused"):
        out.append(f"split={cfg.split} needs reduction 'two_pass' or 'fused', got {cfg.reduction!r}")
    if not out:
        _valid_split(cfg, problem, arch, out)


_PREDICATES = {"tiled": _valid_tiled, "persistent": _valid_persistent, "splitk": _valid_splitk,
               "smallm": _valid_smallm}


def valid(cfg: Config, problem: GemmProblem, arch: Arch = H100) -> tuple[bool, str]:
    """(True, '') if ``cfg`` may be launched for ``problem`` on ``arch``; else (False, every reason, '; '-joined)."""
    pred = _PREDICATES.get(getattr(cfg, "variant", ""))
    if pred is None:
        return False, f"unknown config type {type(cfg).__name__}; use one of {', '.join(CONFIG_TYPES)}"
    out: list[str] = []
    pred(cfg, problem, arch, out)
    return (not out), "; ".join(out)


def check(cfg: Config, problem: GemmProblem, arch: Arch = H100) -> None:
    ok, why = valid(cfg, problem, arch)
    if not ok:
        raise ConfigError(f"{cfg} is invalid for {problem.mnk} {problem.dtype} acc={problem.acc} {problem.layout} "
                          f"on {arch.name}: {why}")
