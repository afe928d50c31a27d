"""Small-tile mma.sync HGEMM family with a one-launch cluster/DSMEM split-K (``csrc/tiny_splitk.cu``), layout tn.

Why a family of its own: where M x N is a few 64x64 tiles and K is long enough to matter (the grid's 3-5 us graph
band: 64_64_1024, 256_256_2048, 512_256_2048...), a GEMM is latency: one CTA pulls its K slice from L2 at ~32
bytes a clock, so the tile that walks all of K alone sets the time, and every reduction the other families have
costs a launch (Triton's two-pass split), a global workspace fix-up (CUTLASS stream-K) or a TMA/mbarrier set-up of
~0.6 us (the wgmma family). Here the S CTAs that split one tile's K form a thread-block cluster, issue all their
cp.async loads up front, and reduce through distributed shared memory in rank order (deterministic), in the same
launch. The price is mma.sync (about a quarter of wgmma's rate, the headroom run), so the family keeps to tiles of at most
128x128 and to the shapes with few of them.

A config (:class:`TinyConfig`) is (BM x BN tile, cluster split S, ring depth, KW warp groups that split each K step)
for one dtype. Every instantiation is in one shared object per dtype (one nvcc run, ~35 s), so a screen compiles
once. ``valid_config`` is the compile-time predicate (an instantiated tile, split and depth), ``valid`` adds the problem (tn, fp32 accumulation, the dtype,
K % 8 for 16-byte cp.async, no split deeper than the K steps, at most 2 x SMs CTAs when split); ``prepare`` also asks
the device how many clusters of the config fit at once and refuses a config that fits none.

Candidates are named ``tiny:<config>``; a selection (``gemmrl select --family tiny``) is re-measured as
``tiny-sel:<protocols>`` (``gemmrl bench --tiny-from``); the library serves ``tiny`` entries (dispatch's hot path
calls the prepared plan, spec kind 2, as for CUTLASS).

Tests: ``pytest tests/kernels/test_tiny_gemm.py`` (predicates, names, screen lists, a compile without spills on the CPU tier
where nvcc exists; ``-m gpu`` runs configs through the battery and graph capture).
"""

from __future__ import annotations

import ctypes
import re
import weakref
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

from ..problem import GemmProblem
from .cuda_source import Build, CudaSource, PerDtype, load_library
from .vendor import raw_stream_getter

SOURCE = Path(__file__).with_name("csrc") / "tiny_splitk.cu"
# the .cu's instantiated tiles (BM, BN, KW K groups) and their warp grids: keep in step with its GEMMRL_TILE lines.
# KW > 1 (the tiny K-step run): KW warp groups split each 64-deep K step and sum their partial tiles in shared memory after the
# main loop (one CTA's warps were issue-bound, so a step's time was its instruction chain)
TILES = {(16, 32, 1): (1, 2), (16, 64, 1): (1, 4), (32, 32, 1): (2, 2), (32, 64, 1): (2, 2), (64, 32, 1): (4, 1),
         (64, 64, 1): (2, 2), (64, 128, 1): (2, 4), (128, 64, 1): (4, 2), (128, 128, 1): (2, 4),
         (16, 32, 2): (1, 2), (16, 64, 2): (1, 4), (32, 32, 2): (2, 2), (32, 64, 2): (2, 2), (64, 32, 2): (4, 1),
         (64, 64, 2): (2, 2), (16, 32, 4): (1, 2), (32, 32, 4): (2, 2)}
SPLITS = (1, 2, 4, 8, 16)
STAGES = (2, 4, 8)
BK = 64
LDS = BK + 8                 # elements per shared row (the .cu's padding)
SMEM_LIMIT = 232448          # opt-in shared memory per block on H100/H200
PREFIX = "tiny:"
DTYPES = ("fp16", "bf16")


class TinyConfigError(ValueError):
    """A config that must not be built or launched; the message says what to use instead."""


@dataclass(frozen=True)
class TinyConfig:
    bm: int = 64
    bn: int = 64
    split: int = 1
    stages: int = 4
    dtype: str = "fp16"
    kw: int = 1                  # warp groups that split each K step (sliced K)
    staged: bool = False         # split 1: C through shared memory in 16-byte chunks (suffix _es), not from registers

    @property
    def layout(self) -> str:
        return "tn"

    @property
    def tile(self) -> tuple[int, int, int]:
        return self.bm, self.bn, self.kw

    def __str__(self) -> str:
        kw = f"_kw{self.kw}" if self.kw != 1 else ""
        es = "_es" if self.staged else ""
        return f"{self.bm}x{self.bn}{kw}_s{self.split}_st{self.stages}{es}_{self.dtype}"

    @classmethod
    def parse(cls, text: str) -> "TinyConfig":
        m = re.fullmatch(r"(\d+)x(\d+)(?:_kw(\d+))?_s(\d+)_st(\d+)(_es)?_(fp16|bf16)", text.strip())
        if not m:
            raise TinyConfigError(f"cannot read tiny config {text!r}; expected e.g. {TinyConfig()}, "
                                  f"{TinyConfig(16, 32, 8, 4, kw=2)} or {TinyConfig(128, 128, 1, 2, staged=True)} "
                                  "(BMxBN[_kw<K groups>]_s<split>_st<stages>[_es]_<dtype>)")
        bm, bn, kw, s, st, es, dtype = m.groups()
        return cls(int(bm), int(bn), int(s), int(st), dtype, int(kw or 1), bool(es))

    @property
    def threads(self) -> int:
        wm, wn = TILES.get(self.tile, (0, 0))
        return 32 * wm * wn * self.kw

    @property
    def smem_bytes(self) -> int:
        """What a launch asks for (the .cu's smem_bytes): the cp.async ring, and with a split the region the cluster
        pushes this CTA's rows of every partial into (its own: peers may push while this CTA is still in its loop) and
        the mbarrier those stores complete on."""
        ring = self.stages * (self.bm + self.bn) * LDS * 2
        return ring + (self.bm * (self.bn + 4) * 4 + 8 if self.split > 1 else 0)


def valid_config(cfg: TinyConfig) -> tuple[bool, str]:
    """Compile-time validity: an instantiated tile, split and ring depth, and a dtype the family builds."""
    if cfg.tile not in TILES:
        return False, (f"tile {cfg.bm}x{cfg.bn} with {cfg.kw} K groups: instantiated tiles are "
                       f"{', '.join(f'{m}x{n}' + (f'_kw{k}' if k > 1 else '') for m, n, k in TILES)}")
    if cfg.split not in SPLITS:
        return False, f"split {cfg.split}: instantiated splits are {SPLITS} (cluster sizes; 16 is non-portable)"
    if cfg.stages not in STAGES:
        return False, f"stages {cfg.stages}: instantiated ring depths are {STAGES}"
    if cfg.dtype not in DTYPES:
        return False, f"dtype {cfg.dtype}: use fp16 or bf16"
    if cfg.smem_bytes > SMEM_LIMIT:
        return False, f"needs {cfg.smem_bytes} bytes of shared memory (> {SMEM_LIMIT})"
    if cfg.staged and cfg.split != 1:
        return False, (f"staged stores (_es) are split 1's epilogue; split {cfg.split} already writes C from the "
                       "summed partials in shared memory")
    return True, ""


def ktiles(problem: GemmProblem) -> int:
    return -(-problem.K // BK)


def tiles(cfg: TinyConfig, problem: GemmProblem) -> int:
    return -(-problem.M // cfg.bm) * -(-problem.N // cfg.bn)


def valid(cfg: TinyConfig, problem: GemmProblem, sms: int = 132, cc: int = 90) -> tuple[bool, str]:
    """The config at a problem (what search, dispatch and tests call; an invalid pair is never launched)."""
    ok, why = valid_config(cfg)
    if not ok:
        return ok, why
    if cc != 90:
        return False, f"sm_{cc}: the family is built for sm_90a (thread-block clusters, distributed shared memory)"
    if problem.layout != "tn":
        return False, "the tiny family reads B^T (layout tn)"
    if problem.acc != "fp32":
        return False, "the tiny family accumulates in fp32"
    if problem.dtype != cfg.dtype:
        return False, f"config dtype {cfg.dtype} vs problem {problem.dtype}"
    if problem.K % 8:
        return False, f"K={problem.K}: 16-byte cp.async needs K % 8 == 0"
    if cfg.split > ktiles(problem):
        return False, f"split {cfg.split} > {ktiles(problem)} K steps of {BK}: some CTAs would have no work"
    if cfg.split > 1 and tiles(cfg, problem) * cfg.split > 2 * sms:
        return False, f"{tiles(cfg, problem)} tiles x split {cfg.split} > 2 x {sms} SMs: split only few-tile shapes"
    return True, ""


def check(cfg: TinyConfig, problem: GemmProblem, sms: int = 132, cc: int = 90) -> None:
    ok, why = valid(cfg, problem, sms, cc)
    if not ok:
        raise TinyConfigError(f"{cfg} at {problem.mnk}: {why}")


def all_configs(dtypes: Iterable[str] = DTYPES) -> list[TinyConfig]:
    return [c for d in dtypes for (bm, bn, kw) in TILES for s in SPLITS for st in STAGES for es in (False, True)
            if valid_config(c := TinyConfig(bm, bn, s, st, d, kw, es))[0]]


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def screen_configs(problem: GemmProblem, sms: int = 132) -> list[TinyConfig]:
    """The configs screened at ``problem``: tiles no taller than M or wider than N need (rounded up to a power of
    two, at least the smallest tile), each with no split and the three deepest splits valid there whose CTAs fit one
    wave (tiles x split <= SMs); the ring as deep as a CTA's K steps use (2, 4 past two steps, 8 from eight steps
    where it fits). Where an unsplit config has at least half a wave of tiles, also its staged twin (``_es``: C
    through shared memory in 16-byte chunks; where C is megabytes the register stores' half sectors cost most of the
    time, the pace-probe run)."""
    out = []
    for bm, bn, kw in TILES:
        if bm > max(16, _pow2_at_least(problem.M)) or bn > max(32, _pow2_at_least(problem.N)):
            continue
        base = TinyConfig(bm, bn, 1, 2, problem.dtype, kw)
        one_wave = [s for s in SPLITS[1:] if tiles(base, problem) * s <= sms]
        for s in [1] + one_wave[-3:]:
            steps = -(-ktiles(problem) // s)
            for st in (8, 4, 2):
                c = TinyConfig(bm, bn, s, st, problem.dtype, kw)
                if (st == 2 or steps > {8: 7, 4: 2}[st]) and valid(c, problem, sms)[0]:
                    out.append(c)
                    if s == 1 and 2 * tiles(c, problem) >= sms:
                        out.append(replace(c, staged=True))
                    break
    return out


def space_size() -> int:
    return len(all_configs())


# ---------------------------------------------------------------------------------------------------------
# building and calling
# ---------------------------------------------------------------------------------------------------------
_FAMILY = PerDtype(SOURCE, TinyConfigError)
_BUILT = _FAMILY.built  # (dtype, arch) -> Build, this process's builds


def source(dtype: str = "fp16") -> CudaSource:
    """Every config of one dtype, as one CUDA source (entry gemmrl_gemm: the .cu's own pick of config)."""
    return _FAMILY.source(dtype)


def build_dtype(dtype: str = "fp16", arch: str | None = None) -> Build:
    """The shared object of ``dtype`` (cached on disk by cuda_source; once per process here)."""
    return _FAMILY.build(dtype, arch)


def typed(lib):
    """``lib`` (a loaded tiny_splitk.cu) with the C signatures of its entries set, once: the one place that knows
    them, so callers (this module, the tests) follow an ABI change together."""
    if not getattr(lib, "_gemmrl_typed", False):  # (ctypes' default restype is already c_int: a flag, not a test)
        lib.gemmrl_tiny_gemm.restype = ctypes.c_int
        lib.gemmrl_tiny_gemm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 6 + [ctypes.c_void_p] + \
            [ctypes.c_int] * 6
        lib.gemmrl_tiny_plan.restype = ctypes.c_void_p
        lib.gemmrl_tiny_plan.argtypes = [ctypes.c_int] * 12
        lib.gemmrl_tiny_plan_run.restype = ctypes.c_int
        lib.gemmrl_tiny_plan_run.argtypes = [ctypes.c_void_p] * 5
        lib.gemmrl_tiny_plan_free.restype = None
        lib.gemmrl_tiny_plan_free.argtypes = [ctypes.c_void_p]
        for fn in (lib.gemmrl_tiny_max_active_clusters, lib.gemmrl_tiny_smem_bytes):
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_int] * 5
        lib._gemmrl_typed = True
    return lib


def _lib(dtype: str):
    return typed(load_library(build_dtype(dtype).so))


class TinyCandidate:
    """One config as a bench candidate (``cand(a, b, bt, c)``, reads ``bt``). ``prepare`` makes the shape's plan
    (host memory only); every call passes the plan, the operands and the stream, as the vendor's cuBLASLt plans and
    the CUTLASS family's do."""

    def __init__(self, cfg: TinyConfig, name: str | None = None):
        self.cfg = cfg
        self.name = name or f"{PREFIX}{cfg}"
        self.layout, self.acc = "tn", "fp32"
        self._lib = None
        self._plan: int | None = None
        self._dims = (0, 0, 0)
        self._stream = None
        self._args = (cfg.bm, cfg.bn, cfg.split, cfg.stages, cfg.kw)

    def prepare(self, problem: GemmProblem, bufs, protocol: str, timer) -> None:
        import torch  # start-up cost: torch loads on first use, not on import

        dev = bufs.a.device
        if dev.type != "cuda":
            raise TinyConfigError("the tiny family runs on CUDA tensors only")
        props = torch.cuda.get_device_properties(dev)
        check(self.cfg, problem, props.multi_processor_count, props.major * 10 + props.minor)
        lib = _lib(self.cfg.dtype)
        fit = int(lib.gemmrl_tiny_max_active_clusters(*self._args))
        if fit <= 0:
            raise TinyConfigError(f"{self.cfg}: no cluster of {self.cfg.split} CTAs with {self.cfg.smem_bytes} bytes "
                                  f"of shared memory fits on this device ({fit})")
        smem = int(lib.gemmrl_tiny_smem_bytes(*self._args))
        if smem != self.cfg.smem_bytes:
            raise TinyConfigError(f"{self.cfg}: shared memory sizes disagree (library {smem}, Python "
                                  f"{self.cfg.smem_bytes}): rebuild tiny_splitk.cu")
        M, N, K = problem.M, problem.N, problem.K
        plan = lib.gemmrl_tiny_plan(M, N, K, K, K, N, *self._args, int(self.cfg.staged))
        if not plan:
            raise TinyConfigError(f"{self.name}: gemmrl_tiny_plan refused {problem.mnk}")
        weakref.finalize(self, lib.gemmrl_tiny_plan_free, ctypes.c_void_p(plan))
        self._lib, self._plan, self._dims = lib, plan, (M, N, K)
        self._stream = raw_stream_getter()

    def hot_plan(self) -> tuple[int, int]:
        """(address of ``gemmrl_tiny_plan_run``, the plan ``prepare`` made): what the compiled hot path calls per
        call, ``int run(plan, A, B, C, stream)`` (fastpath_spec.h, spec kind 2). Call after ``prepare``."""
        if self._plan is None:
            raise TinyConfigError(f"{self.name}: hot_plan() before prepare()")
        return ctypes.cast(self._lib.gemmrl_tiny_plan_run, ctypes.c_void_p).value, self._plan

    def plan_error(self, st: int) -> Exception:
        """What a non-zero status of the plan's run means, as an exception to raise."""
        M, N, K = self._dims
        return RuntimeError(f"{self.name}: gemmrl_tiny_plan_run returned {st} for {M}_{N}_{K} (a cudaError_t)")

    def __call__(self, a, b, bt, c) -> None:
        rc = self._lib.gemmrl_tiny_plan_run(self._plan, a.data_ptr(), bt.data_ptr(), c.data_ptr(),
                                            self._stream(a.device.index))
        if rc != 0:
            raise RuntimeError(f"{self.name}: gemmrl_tiny_plan_run returned {rc} for {'_'.join(map(str, self._dims))}")

    def info(self) -> dict[str, Any]:
        return {"algo": str(self.cfg), "smem_bytes": self.cfg.smem_bytes}



__all__ = ["TinyConfig", "TinyCandidate", "TinyConfigError", "valid_config", "valid", "check", "all_configs",
           "screen_configs", "space_size", "source", "build_dtype", "typed"]
