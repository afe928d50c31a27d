"""CUTLASS 3.x SM90 GEMM family: TMA warp-specialized kernels (cooperative and ping-pong), persistent and
stream-K tile schedulers, tile and cluster shapes, the epilogue (TMA store with CUTLASS's auto subtile or a wider one
that stores whole 128-byte lines, or stores from registers); fp16/bf16 in and out, fp32 accumulation, layouts tn and
nn.

One template (``csrc/cutlass_sm90_gemm.cu``) is rendered per :class:`CutlassConfig` with ``-D`` flags and
compiled once through ``cuda_source.build`` (nvcc, ``sm_90a``, headers of the ``nvidia-cutlass`` wheel; the
``.so`` is cached by source, flags, arch, toolkit and CUTLASS version, so a GPU run that carries the cache
compiles nothing). The problem size is a runtime argument, never compiled in. So are the tile scheduler's
knobs (:class:`Knobs`: swizzle, raster order; for stream-K the decomposition and split count): one build
serves every shape and knob setting.

``valid_config`` is the compile-time predicate (architecture, schedule vs tile, accumulator registers,
shared-memory stages, cluster); ``valid`` adds the problem and the knobs (dtype, layout, 16-byte TMA
alignment of the contiguous dims, knobs only where the scheduler has them). Search, dispatch and tests call
these; an invalid config is never built or launched. ``FAMILY`` is the set of configs screened per shape;
``space_size`` counts the whole valid space.

Candidates are named ``cutlass:<config>:<knobs>``; a selection (``gemmrl select --family cutlass``) is
re-measured as ``cutlass-sel:<protocols>`` (``gemmrl bench --cutlass-from``).

Tests: ``pytest tests/kernels/test_cutlass_sm90.py`` (predicates and rendering on the CPU tier, a compile where nvcc
and the CUTLASS headers exist; ``-m gpu`` runs the kernels through the battery).
"""

from __future__ import annotations

import ctypes
import itertools
import re
import weakref
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from ..problem import GemmProblem
from .cuda_source import Build, CudaSource, ShapeRange, Workspace, build, build_many, load_library
from .toolchain import arch_for
from .vendor import raw_stream_getter

TEMPLATE = Path(__file__).with_name("csrc") / "cutlass_sm90_gemm.cu"
SCHEDULES = ("coop", "pingpong")
SCHEDULERS = ("persistent", "streamk")
RASTERS = ("heuristic", "m", "n")
EPILOGUES = ("tma", "nosmem")
EPI_NS = (0, 64, 128)        # the TMA epilogue tile's width in the kernel's N (0: CUTLASS's auto, 32 for 16-bit D)
DECOMPOSITIONS = ("heuristic", "dp", "splitk", "streamk")
SWIZZLES = (1, 2, 4, 8)        # CUTLASS's own scheduler swizzles
WIDE_SWIZZLES = (16, 32)       # past CUTLASS's cap of 8, persistent scheduler only (the template's widen_swizzle)
SMEM_BYTES = 232448          # H100/H200 opt-in shared memory per block
EPILOGUE_SMEM = 16384        # what the TMA epilogue keeps in shared memory (auto epilogue tile, 2 stages), rounded up
MAX_STAGES = 16          # the pipeline's depth is capped here (tiles under 64x64 fit 17-25 stages; an odd count
                         # with a 2-CTA multicast failed to compile, and more than 16 hides no more latency)
MAX_ACC_REGS = 128           # fp32 accumulators per consumer thread that leave room for the rest
# Tile widths of the space (wgmma takes N % 8 up to 256; the predicate 8 and N % 16). CuTe picks the
# MMA atom by the largest N that divides the tile, but N other than 64/128/192/256 (and 8..56) only with
# CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED: without it a 160-wide tile ran five 64x32x16 wgmma per k-step (ncu, session
# 16: 2.4x the issued instructions, L1 at 97%) at 0.61-0.71x of the family's best (the PDL run); ``flags`` sets it.
# cuBLASLt's "128x160" and "176x128" are in its column-major view (m = our N): with swap=True the kernel computes
# C^T = B^T A^T, so its BM (the MMA's 64-row dimension) runs along our N and its BN along our M.
BNS = (8, 16, 32, 48, 64, 96, 128, 160, 176, 192, 256)
CLUSTERS = ((1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (1, 4), (4, 2), (2, 4))  # at most 8 CTAs: the portable size
TINY_TILE = 64 * 64      # tiles smaller than this are screened only where the grid of tiles is at most TINY_WAVES waves
TINY_WAVES = 32
PREFIX = "cutlass:"


class CutlassConfigError(ValueError):
    """A config or knob setting that must not be built or launched; the message says what to use instead."""


@dataclass(frozen=True)
class CutlassConfig:
    """The compile-time choices of one kernel."""

    bm: int = 128
    bn: int = 128
    bk: int = 64
    cm: int = 1
    cn: int = 1
    schedule: str = "coop"
    scheduler: str = "persistent"
    layout: str = "tn"
    dtype: str = "fp16"
    # swap: the kernel computes C^T[N,M] = B^T A^T (operands swapped, column-major output), so BM and CM run along
    # our N and BN and CN along our M; the memory the caller passes is the same. Named with a ``_swap`` suffix.
    swap: bool = False
    # epilogue: "tma" (the accumulators staged through shared memory and stored by TMA) or "nosmem" (stored from
    # registers, CUTLASS's NoSmemWarpSpecialized: no staging and no TMA store to wait for; persistent scheduler
    # only). Named with a ``_nosmem`` suffix.
    epilogue: str = "tma"
    # epi_n: the TMA epilogue's subtile width along the kernel's N (its height is 128 rows for coop, 64 for ping-pong).
    # 0 is CUTLASS's auto choice, 32 wide for a 16-bit D: in a row-major D (not swapped) every TMA store then writes
    # 64-byte halves of 128-byte lines; 64 or 128 store whole lines, at 2x or 4x the epilogue's shared memory.
    # Named with an ``_e<N>`` suffix.
    epi_n: int = 0

    def __str__(self) -> str:
        return (f"{self.schedule}_{self.bm}x{self.bn}x{self.bk}_c{self.cm}x{self.cn}_{self.scheduler}_"
                f"{self.layout}_{self.dtype}" + ("_swap" if self.swap else "")
                + ("_nosmem" if self.epilogue == "nosmem" else "") + (f"_e{self.epi_n}" if self.epi_n else ""))

    @classmethod
    def parse(cls, text: str) -> "CutlassConfig":
        m = re.fullmatch(r"(coop|pingpong)_(\d+)x(\d+)x(\d+)_c(\d)x(\d)_(persistent|streamk)_(tn|nn)_(fp16|bf16)(_swap)?"
                         r"(_nosmem)?(?:_e(\d+))?", text.strip())
        if not m:
            raise CutlassConfigError(f"cannot read CUTLASS config {text!r}; expected e.g. {CutlassConfig()} "
                                     "(schedule_BMxBNxBK_cCMxCN_scheduler_layout_dtype[_swap][_nosmem][_e<N>])")
        s, bm, bn, bk, cm, cn, sched, layout, dtype, swap, nosmem, epi_n = m.groups()
        return cls(int(bm), int(bn), int(bk), int(cm), int(cn), s, sched, layout, dtype, bool(swap),
                   "nosmem" if nosmem else "tma", int(epi_n or 0))

    def tiles(self, M: int, N: int) -> int:
        """Output tiles of an M x N problem (the kernel's BM runs along N when swapped)."""
        if self.swap:
            M, N = N, M
        return -(-M // self.bm) * -(-N // self.bn)

    @property
    def stage_bytes(self) -> int:
        return (self.bm + self.bn) * self.bk * 2

    @property
    def epilogue_bytes(self) -> int:
        """Shared memory the epilogue keeps: two staged D subtiles (CUTLASS's StagesD for a D with no C source)."""
        if self.epilogue != "tma":
            return 0
        if not self.epi_n:
            return EPILOGUE_SMEM
        return max(EPILOGUE_SMEM, 2 * (128 if self.schedule == "coop" else 64) * self.epi_n * 2)

    @property
    def stages(self) -> int:
        return min(MAX_STAGES, (SMEM_BYTES - self.epilogue_bytes) // self.stage_bytes)

    def flags(self) -> tuple[str, ...]:
        return (f"-DGEMMRL_BF16={int(self.dtype == 'bf16')}", f"-DGEMMRL_B_ROW={int(self.layout == 'nn')}",
                f"-DGEMMRL_BM={self.bm}", f"-DGEMMRL_BN={self.bn}", f"-DGEMMRL_BK={self.bk}",
                f"-DGEMMRL_CM={self.cm}", f"-DGEMMRL_CN={self.cn}",
                f"-DGEMMRL_PINGPONG={int(self.schedule == 'pingpong')}",
                f"-DGEMMRL_STREAMK={int(self.scheduler == 'streamk')}", f"-DGEMMRL_SWAP={int(self.swap)}") \
            + (() if self.bn in (64, 128, 192, 256) else ("-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED",)) \
            + ((f"-DGEMMRL_STAGES={MAX_STAGES}",) if self.stages == MAX_STAGES else ()) \
            + (("-DGEMMRL_EPI_NOSMEM=1",) if self.epilogue == "nosmem" else ()) \
            + ((f"-DGEMMRL_EPI_N={self.epi_n}",) if self.epi_n else ())

    def source(self) -> CudaSource:
        return CudaSource(code=_template(), entry="gemmrl_cutlass_gemm", layout=self.layout, dtype=self.dtype,
                          shapes=ShapeRange(n_mult=8, k_mult=8), name=f"{PREFIX}{self}", flags=self.flags(),
                          includes=("cutlass",))


@dataclass(frozen=True)
class Knobs:
    """Runtime choices of the tile scheduler (no rebuild)."""

    swizzle: int = 1
    raster: str = "heuristic"
    decomposition: str = "heuristic"
    splits: int = 1

    def __str__(self) -> str:
        return f"s{self.swizzle}_r{self.raster[0]}_d{self.decomposition}_k{self.splits}"

    @classmethod
    def parse(cls, text: str) -> "Knobs":
        m = re.fullmatch(r"s(\d+)_r([hmn])_d(heuristic|dp|splitk|streamk)_k(\d+)", text.strip())
        if not m:
            raise CutlassConfigError(f"cannot read knobs {text!r}; expected e.g. {Knobs()}")
        return cls(int(m.group(1)), {"h": "heuristic", "m": "m", "n": "n"}[m.group(2)], m.group(3), int(m.group(4)))

    def args(self) -> tuple[int, int, int, int]:
        return self.swizzle, RASTERS.index(self.raster), DECOMPOSITIONS.index(self.decomposition), self.splits


@lru_cache(maxsize=1)
def _template() -> str:
    return TEMPLATE.read_text()


# ---------------------------------------------------------------------------------------------------------
# validity
# ---------------------------------------------------------------------------------------------------------
def valid_config(cfg: CutlassConfig, cc: int = 90) -> tuple[bool, str]:
    """Whether ``cfg`` can be built and run on a GPU of compute capability ``cc``."""
    if cc < 90 or cc >= 100:
        return False, f"the CUTLASS SM90 family needs a Hopper GPU (sm_90a); this one is sm_{cc}: use the vendor path"
    if cfg.schedule not in SCHEDULES or cfg.scheduler not in SCHEDULERS:
        return False, f"schedule must be one of {SCHEDULES} and scheduler one of {SCHEDULERS}"
    if cfg.layout not in ("tn", "nn") or cfg.dtype not in ("fp16", "bf16"):
        return False, "layout tn|nn and dtype fp16|bf16"
    if cfg.epilogue not in EPILOGUES:
        return False, f"epilogue {cfg.epilogue!r}: one of {EPILOGUES}"
    if cfg.epilogue == "nosmem" and cfg.scheduler != "persistent":
        return False, "the register epilogue (nosmem) is built with the persistent scheduler only: use the tma epilogue"
    if cfg.epi_n not in EPI_NS:
        return False, f"epilogue tile width {cfg.epi_n}: one of {EPI_NS} (0 is CUTLASS's auto)"
    if cfg.epi_n and cfg.epilogue != "tma":
        return False, "an epilogue tile width is a knob of the TMA epilogue: drop _e<N> or the _nosmem suffix"
    if cfg.epi_n and cfg.bn % cfg.epi_n:
        return False, f"epilogue tile width {cfg.epi_n} must divide BN={cfg.bn} (use a narrower one, or 0 for auto)"
    if cfg.bk not in (32, 64, 128):
        return False, f"BK={cfg.bk}: use 64 (or 128 for small tiles; 32 for the largest)"
    # BN: wgmma takes any multiple of 8, but CuTe's shared-memory partition of an odd multiple of 8 above 8 (24, 40)
    # fails its stride divisibility (compile evidence, the small-tile CUTLASS run): 8, or a multiple of 16 up to 256
    if not (cfg.bn == 8 or (cfg.bn % 16 == 0 and 16 <= cfg.bn <= 256)) or cfg.bm not in (64, 128, 256):
        return False, f"tile {cfg.bm}x{cfg.bn}: BM in 64/128/256, BN 8 or a multiple of 16 in 16..256"
    wgs = 2 if cfg.schedule == "coop" else 1
    if cfg.schedule == "coop" and cfg.bm % 128:
        return False, f"the cooperative schedule splits BM over two warpgroups: BM={cfg.bm} must be 128 or 256 (or use pingpong)"
    if cfg.schedule == "pingpong" and cfg.bm > 128:
        return False, f"ping-pong gives one warpgroup a whole tile: BM={cfg.bm} must be <= 128 (or use coop)"
    # a cluster's CTAs each load 1/CN of the A tile (BM rows) and 1/CM of the B tile (BN rows) and multicast it:
    # those rows must be a multiple of 8 (the 128-byte swizzle's 8-row atom) or divide it (compile evidence: BN=8
    # over CM=2 and 4 compiled; 12-row slices are refused unseen, as the 24-row tiles failed)
    for rows, side in ((cfg.bm // cfg.cn, "BM / CN"), (cfg.bn // cfg.cm, "BN / CM")):
        if rows % 8 and 8 % rows:
            return False, (f"cluster {cfg.cm}x{cfg.cn} on tile {cfg.bm}x{cfg.bn}: {side} = {rows} rows per CTA's "
                           "multicast slice must be a multiple of 8 or divide 8 (use a smaller cluster)")
    if cfg.stages < 2:
        return False, f"only {cfg.stages} pipeline stage(s) of {cfg.stage_bytes} bytes fit in shared memory: use a smaller BK"
    acc = cfg.bm * cfg.bn // (128 * wgs)
    if acc > MAX_ACC_REGS:
        return False, f"{acc} fp32 accumulators per thread (> {MAX_ACC_REGS}): use a smaller tile or the cooperative schedule"
    if (cfg.cm, cfg.cn) not in CLUSTERS:
        return False, (f"cluster {cfg.cm}x{cfg.cn}: use one of " + ", ".join(f"{m}x{n}" for m, n in CLUSTERS)
                       + " (sides 1, 2 or 4, at most 8 CTAs)")
    if cfg.scheduler == "streamk" and cfg.schedule != "coop":
        return False, "stream-K needs the cooperative schedule"
    return True, ""


def valid(cfg: CutlassConfig, knobs: Knobs, problem: GemmProblem, cc: int = 90) -> tuple[bool, str]:
    """``valid_config`` plus the problem (dtype, layout, accumulator, TMA alignment) and the knobs."""
    ok, why = valid_config(cfg, cc)
    if not ok:
        return ok, why
    if (problem.dtype, problem.layout) != (cfg.dtype, cfg.layout):
        return False, f"config is {cfg.dtype}/{cfg.layout}, problem is {problem.dtype}/{problem.layout}"
    if problem.acc != "fp32":
        return False, "the CUTLASS family accumulates in fp32; acc fp16 is the vendor's explicit mode"
    if problem.K % 8 or problem.N % 8:
        return False, (f"TMA needs 16-byte aligned rows: K={problem.K} and N={problem.N} must be multiples of 8 "
                       "(pad, or use the vendor or Triton path)")
    if knobs.swizzle not in SWIZZLES + WIDE_SWIZZLES or knobs.raster not in RASTERS:
        return False, f"swizzle in {'/'.join(map(str, SWIZZLES + WIDE_SWIZZLES))} and raster in {RASTERS}"
    if knobs.swizzle in WIDE_SWIZZLES and cfg.scheduler == "streamk":
        return False, (f"swizzle {knobs.swizzle} is set past CUTLASS's cap of 8 for the persistent scheduler only; "
                       "stream-K takes 1/2/4/8")
    if knobs.decomposition not in DECOMPOSITIONS or knobs.splits < 1:
        return False, f"decomposition in {DECOMPOSITIONS}, splits >= 1"
    if cfg.scheduler != "streamk" and (knobs.decomposition != "heuristic" or knobs.splits != 1):
        return False, "decomposition and splits are knobs of the stream-K scheduler: use a streamk config"
    if knobs.splits > max(1, -(-problem.K // cfg.bk)):
        return False, f"{knobs.splits} splits of K={problem.K} leave some splits without a {cfg.bk}-wide K tile"
    return True, ""


def check(cfg: CutlassConfig, knobs: Knobs, problem: GemmProblem, cc: int = 90) -> None:
    ok, why = valid(cfg, knobs, problem, cc)
    if not ok:
        raise CutlassConfigError(f"{cfg} {knobs} for {problem.mnk}: {why}")


# ---------------------------------------------------------------------------------------------------------
# the space and the screened family
# ---------------------------------------------------------------------------------------------------------
def all_configs(layouts: Iterable[str] = ("tn", "nn"), dtypes: Iterable[str] = ("fp16", "bf16")) -> list[CutlassConfig]:
    """Every valid compile-time config."""
    out = []
    for layout, dtype, sched, scheduler, bm, bn, bk, (cm, cn), swap, epi, epi_n in itertools.product(
            layouts, dtypes, SCHEDULES, SCHEDULERS, (64, 128, 256), BNS, (32, 64, 128),
            CLUSTERS, (False, True), EPILOGUES, EPI_NS):
        c = CutlassConfig(bm, bn, bk, cm, cn, sched, scheduler, layout, dtype, swap, epi, epi_n)
        if valid_config(c)[0]:
            out.append(c)
    return out


def all_knobs(cfg: CutlassConfig, max_splits: int = 8) -> list[Knobs]:
    base = [Knobs(s, r) for s in SWIZZLES for r in RASTERS]
    if cfg.scheduler != "streamk":
        return base + [Knobs(s, r) for s in WIDE_SWIZZLES for r in RASTERS]
    return base + [Knobs(s, r, d, k) for s in SWIZZLES for r in RASTERS for d in DECOMPOSITIONS[1:]
                   for k in (range(2, max_splits + 1) if d == "splitk" else (1,))]


def space_size() -> dict[str, int]:
    """Compile-time configs and (config, knobs) points of the valid space (both layouts and dtypes)."""
    cfgs = all_configs()
    return {"configs": len(cfgs), "points": sum(len(all_knobs(c)) for c in cfgs)}


# The configs screened per shape (fp16, tn): the tile/cluster/schedule mix cuBLAS's own SM90 kernels cover,
# from launch-bound small tiles to 256-wide persistent tiles, plus stream-K for few-tile long-K shapes.
_FAMILY_SPECS = (
    ("coop", 128, 128, 64, 1, 1, "persistent"), ("coop", 128, 128, 64, 2, 1, "persistent"),
    ("coop", 128, 128, 64, 1, 2, "persistent"), ("coop", 128, 256, 64, 1, 1, "persistent"),
    ("coop", 128, 256, 64, 2, 1, "persistent"), ("coop", 128, 256, 64, 1, 2, "persistent"),
    ("coop", 256, 128, 64, 1, 1, "persistent"), ("coop", 256, 128, 64, 2, 1, "persistent"),
    ("coop", 256, 128, 64, 1, 2, "persistent"), ("coop", 128, 64, 64, 1, 1, "persistent"),
    ("pingpong", 64, 128, 64, 1, 1, "persistent"), ("pingpong", 64, 256, 64, 1, 1, "persistent"),
    ("pingpong", 64, 64, 128, 1, 1, "persistent"), ("pingpong", 64, 128, 128, 1, 1, "persistent"),
    ("pingpong", 128, 128, 64, 1, 1, "persistent"), ("pingpong", 128, 128, 64, 2, 1, "persistent"),
    ("pingpong", 128, 64, 64, 1, 1, "persistent"),
    ("coop", 128, 192, 64, 1, 1, "persistent"), ("coop", 128, 192, 64, 2, 1, "persistent"),
    ("pingpong", 64, 192, 64, 1, 1, "persistent"), ("coop", 128, 176, 64, 2, 1, "persistent"),
    ("coop", 128, 128, 64, 1, 1, "streamk"), ("coop", 128, 256, 64, 1, 1, "streamk"),
    ("coop", 128, 64, 64, 1, 1, "streamk"),
)
# Swapped twins (C^T = B^T A^T; the swapped-CUTLASS run's probe, h100_swap-probe7_*: pingpong 128x128 swapped was the fastest
# config on 11 of 14 shape x protocol cells of large-M*N shapes, 3-9% ahead of its unswapped twin), 128x64
# swapped for few rows and many columns (BM=128 along N, 64 along M), and cuBLASLt's own large tiles read in our
# view: its "128x160 c2x1" is 128x160 c2x1 swapped, its "176x128 c1x2" is 128x176 c2x1 unswapped (above); 128x176
# c1x2 swapped was the best config on 2 of the large7 cells (the swapped-CUTLASS run, run 3).
_SWAP_SPECS = (
    ("pingpong", 128, 128, 64, 1, 1, "persistent"), ("pingpong", 64, 256, 64, 1, 1, "persistent"),
    ("coop", 128, 192, 64, 2, 1, "persistent"), ("coop", 256, 128, 64, 1, 2, "persistent"),
    ("coop", 128, 256, 64, 1, 1, "streamk"), ("coop", 128, 64, 64, 1, 1, "persistent"),
    ("coop", 128, 160, 64, 2, 1, "persistent"), ("coop", 128, 176, 64, 1, 2, "persistent"),
    # decode and few-row shapes: 16 or 32 rows of C per tile, the MMA's 64 rows along N (the swapped-CUTLASS run, decode20: every
    # config the selection kept was one of these; unswapped, a 64-row tile wastes 48-63 of its rows there)
    ("pingpong", 64, 16, 128, 1, 1, "persistent"), ("pingpong", 64, 32, 128, 1, 1, "persistent"),
    ("coop", 128, 16, 128, 1, 1, "streamk"), ("coop", 128, 32, 128, 1, 1, "streamk"),
)


# cuBLASLt's own picks on the small class (min(M, N) <= 256; its autotuned algo in the CUTLASS-family bar's grid-100 re-measure,
# read in our view: its tile is (along our N) x (along our M)): 8- to 48-wide tiles in clusters of 2x4, 4x2, 1x4 and
# 1x2, a grid of 16-64 CTAs that share their operands by TMA multicast, where our family ran one 64x64 tile per SM.
# (swap, tile, cluster): cuBLASLt's "64x8 c2x4" is pingpong 64x8 c2x4 swapped (BM=64 along N, BN=8 along M, CM=2
# along N); its "32x64 c4x2" is 64x32 c2x4 unswapped (BM=64 along M, CN=4 along N). Its 24-wide tiles run 16 wide
# here (BN=24 does not compile, see ``valid_config``). Screened on 52 small grid shapes (the small-tile CUTLASS run): fastest config on
# a third of them, +1% in geomean over the family without them.
_SMALL_SPECS = (
    (True, 64, 8, 2, 4), (True, 64, 8, 1, 4), (True, 64, 16, 1, 4), (True, 64, 32, 1, 2), (True, 64, 48, 1, 4),
    (True, 64, 64, 2, 4),
    (False, 64, 32, 2, 4), (False, 64, 16, 2, 4), (False, 64, 8, 2, 4), (False, 64, 32, 1, 2),
)


# Register-epilogue twins (``_nosmem``): the swapped narrow tiles whose twin was the fastest config on some cell of
# the register-epilogue run's small52 screen (h100_grid100s1-small52-epilogue_*: nosmem twins fastest on 55 of 104 cells, +1.4% graph
# / +1.1% cold over the family; on tiles of 8-32 columns the twin ran 0-2% faster, on 64-256-column tiles 11-28%
# slower, so only narrow ones). (schedule, BM, BN, BK, CM, CN), swapped, persistent.
_NOSMEM_SWAP_SPECS = (
    ("pingpong", 64, 16, 128, 1, 1), ("pingpong", 64, 32, 128, 1, 1), ("pingpong", 64, 8, 64, 1, 4),
    ("pingpong", 64, 16, 64, 1, 4), ("pingpong", 64, 32, 64, 1, 2), ("pingpong", 64, 8, 64, 2, 4),
)


def family(layout: str = "tn", dtype: str = "fp16") -> list[CutlassConfig]:
    return ([CutlassConfig(bm, bn, bk, cm, cn, s, sched, layout, dtype) for s, bm, bn, bk, cm, cn, sched in _FAMILY_SPECS]
            + [CutlassConfig(bm, bn, bk, cm, cn, s, sched, layout, dtype, True)
               for s, bm, bn, bk, cm, cn, sched in _SWAP_SPECS]
            + [CutlassConfig(bm, bn, 64, cm, cn, "pingpong", "persistent", layout, dtype, swap)
               for swap, bm, bn, cm, cn in _SMALL_SPECS]
            + [CutlassConfig(bm, bn, bk, cm, cn, s, "persistent", layout, dtype, True, epilogue="nosmem")
               for s, bm, bn, bk, cm, cn in _NOSMEM_SWAP_SPECS])


def knobs_for(cfg: CutlassConfig, problem: GemmProblem, sms: int = 132) -> list[Knobs]:
    """The knob settings screened for ``cfg`` at ``problem``: the defaults, swizzle 8 where the grid of tiles is
    large enough for it to matter; for stream-K configs, split-K where there are fewer output tiles than
    SMs (2, 4, 8, 16 while tiles x splits <= 2 x SMs: few-tile long-K shapes need more than 4, where the vendor
    runs split 5-9), and the stream-K decomposition wherever the last wave of tiles leaves SMs idle. None for a
    tile smaller than 64x64 on a grid of more than ``TINY_WAVES`` waves of tiles (its fixed cost per tile is all it
    adds there; 32 waves still admit the decode configs (4008 tiles of 64x16 at 32_128256))."""
    tiles = cfg.tiles(problem.M, problem.N)
    if cfg.bm * cfg.bn < TINY_TILE and tiles > TINY_WAVES * sms:
        return []
    out = [Knobs()]
    if tiles >= 4 * sms:
        out.append(Knobs(swizzle=8))
    if cfg.scheduler == "streamk":
        ktiles = -(-problem.K // cfg.bk)
        if tiles < sms:
            out += [Knobs(decomposition="splitk", splits=s) for s in (2, 4, 8, 16)
                    if s <= ktiles and (s <= 4 or tiles * s <= 2 * sms)]
        if ktiles >= 4 and tiles % sms:
            out.append(Knobs(decomposition="streamk"))
    return [k for k in out if valid(cfg, k, problem)[0]]


# ---------------------------------------------------------------------------------------------------------
# building and calling
# ---------------------------------------------------------------------------------------------------------
def build_config(cfg: CutlassConfig, arch: str = "90a", **kw) -> Build:
    ok, why = valid_config(cfg, int(re.sub(r"\D", "", arch)[:2] or 0))
    if not ok:
        raise CutlassConfigError(f"{cfg}: {why}")
    return build(cfg.source(), arch, **kw)


def build_family(cfgs: Iterable[CutlassConfig], arch: str = "90a", jobs: int | None = None,
                 progress: bool = False) -> dict[CutlassConfig, Build]:
    """Compile configs in parallel (cached ones are found, not rebuilt)."""
    cfgs = list(dict.fromkeys(cfgs))
    for c in cfgs:
        ok, why = valid_config(c)
        if not ok:
            raise CutlassConfigError(f"{c}: {why}")
    return dict(zip(cfgs, build_many([c.source() for c in cfgs], arch, jobs=jobs, progress=progress)))


class CutlassCandidate:
    """One (config, knobs) as a bench candidate. ``prepare`` applies ``valid`` and CUTLASS's own
    ``can_implement``, sizes and allocates the workspace; a non-zero return code raises."""

    def __init__(self, cfg: CutlassConfig, knobs: Knobs = Knobs(), built: Build | None = None, name: str | None = None):
        self.cfg, self.knobs = cfg, knobs
        self.name = name or f"{PREFIX}{cfg}:{knobs}"
        self.layout, self.acc = cfg.layout, "fp32"
        self._built = built
        self._dims = (0, 0, 0)
        self._ws = Workspace()
        self._stream = None
        self._args = knobs.args()
        self._lib = None
        self._plan: int | None = None

    def _load(self, device):
        if device.type != "cuda":  # nothing is built for CPU tensors
            raise RuntimeError("CUTLASS kernels run on CUDA tensors only")
        if self._built is None:
            self._built = build_config(self.cfg, arch_for())
        if not self._built.ok:
            raise CutlassConfigError(f"{self.cfg} did not build: {self._built.error}")
        lib = load_library(self._built.so)
        lib.gemmrl_cutlass_workspace.restype = ctypes.c_size_t
        lib.gemmrl_cutlass_workspace.argtypes = [ctypes.c_int] * 7
        lib.gemmrl_cutlass_can_implement.restype = ctypes.c_int
        lib.gemmrl_cutlass_can_implement.argtypes = [ctypes.c_int] * 6
        lib.gemmrl_cutlass_plan.restype = ctypes.c_void_p
        lib.gemmrl_cutlass_plan.argtypes = [ctypes.c_int] * 6 + [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 4
        lib.gemmrl_cutlass_plan_free.restype = None
        lib.gemmrl_cutlass_plan_free.argtypes = [ctypes.c_void_p]
        lib.gemmrl_cutlass_plan_run.restype = ctypes.c_int
        lib.gemmrl_cutlass_plan_run.argtypes = [ctypes.c_void_p] * 5
        self._lib = lib
        return lib

    def prepare(self, problem: GemmProblem, bufs, protocol: str, timer) -> None:
        """Checks, builds (cached), sizes the workspace and makes the plan of this problem (host memory only): every
        call then passes the plan, the operands and the stream, 5 ctypes arguments, as the vendor's cuBLASLt plans
        do (the plan of an earlier prepare is freed with the candidate)."""
        check(self.cfg, self.knobs, problem, _cc(bufs.a.device))  # why it cannot serve this shape, before a build
        lib = self._load(bufs.a.device)
        M, N, K = problem.M, problem.N, problem.K
        ldb = K if self.layout == "tn" else N
        if lib.gemmrl_cutlass_can_implement(M, N, K, K, ldb, N) != 0:
            raise CutlassConfigError(f"{self.cfg}: CUTLASS cannot implement {problem.mnk} (can_implement failed)")
        self._ws.ensure(int(lib.gemmrl_cutlass_workspace(M, N, K, *self._args)), bufs.a.device)
        self._dims = (M, N, K)
        self._stream = raw_stream_getter()
        plan = lib.gemmrl_cutlass_plan(M, N, K, K, ldb, N, self._ws.ptr, self._ws.bytes, *self._args)
        if not plan:
            raise MemoryError(f"{self.name}: gemmrl_cutlass_plan returned NULL")
        weakref.finalize(self, lib.gemmrl_cutlass_plan_free, ctypes.c_void_p(plan))
        self._plan = plan

    def hot_plan(self) -> tuple[int, int]:
        """(address of ``gemmrl_cutlass_plan_run``, the plan ``prepare`` made): what the compiled hot path calls per
        call, ``int run(plan, A, B, D, stream)`` (fastpath_spec.h, spec kind 2). The plan lives as long as this
        candidate. Call after ``prepare``."""
        if self._plan is None:
            raise CutlassConfigError(f"{self.name}: hot_plan() before prepare()")
        return ctypes.cast(self._lib.gemmrl_cutlass_plan_run, ctypes.c_void_p).value, self._plan

    def plan_error(self, st: int) -> Exception:
        """What a non-zero status of the plan's run means, as an exception to raise."""
        M, N, K = self._dims
        return RuntimeError(f"{self.name}: gemmrl_cutlass_gemm returned {st} for {M}_{N}_{K} (1 cannot implement, 2 "
                            "workspace too small, 3 initialize failed, 4 launch failed)")

    def __call__(self, a, b, bt, c) -> None:
        # through the prepared plan: the same host path as the vendor's cuBLASLt plans (kernels/vendor.py), so the
        # host protocols time both alike
        rc = self._lib.gemmrl_cutlass_plan_run(self._plan, a.data_ptr(), (bt if self.layout == "tn" else b).data_ptr(),
                                               c.data_ptr(), self._stream(a.device.index))
        if rc != 0:
            raise RuntimeError(f"{self.name}: gemmrl_cutlass_plan_run returned {rc} for {'_'.join(map(str, self._dims))}")

    def info(self) -> dict[str, Any]:
        d: dict[str, Any] = {"algo": f"{self.cfg}:{self.knobs}", "workspace_bytes": self._ws.bytes}
        if self._built is not None:
            d.update(build=self._built.key, max_registers=self._built.ptxas.max_registers)
        return d


def _cc(device) -> int:
    import torch  # start-up cost: torch loads on first use, not on import

    if getattr(device, "type", "cuda") != "cuda":
        return 90
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def parse_name(algo: str) -> tuple[CutlassConfig, Knobs]:
    cfg, _, knobs = algo.partition(":")
    return CutlassConfig.parse(cfg), Knobs.parse(knobs) if knobs else Knobs()


def screen_entries(problem: GemmProblem, cfgs: Iterable[CutlassConfig], sms: int = 132,
                   all_knob_settings: bool = False) -> list[tuple[CutlassConfig, Knobs]]:
    """(config, knobs) pairs to screen at ``problem`` (configs in the problem's layout and dtype only): the knobs
    ``knobs_for`` picks, or with ``all_knob_settings`` every valid one of ``all_knobs`` (every swizzle and raster
    order; for stream-K also each decomposition and split)."""
    out = []
    for cfg in cfgs:
        if (cfg.layout, cfg.dtype) != (problem.layout, problem.dtype) or not valid_config(cfg)[0]:
            continue
        knobs = ([k for k in all_knobs(cfg) if valid(cfg, k, problem)[0]] if all_knob_settings
                 else knobs_for(cfg, problem, sms))
        out += [(cfg, k) for k in knobs]
    return out


__all__ = ["CutlassConfig", "Knobs", "CutlassCandidate", "CutlassConfigError", "valid_config", "valid", "check",
           "all_configs", "all_knobs", "space_size", "family", "knobs_for", "build_config", "build_family",
           "screen_entries", "parse_name"]
