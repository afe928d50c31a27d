"""Hopper TMA + wgmma HGEMM family with a cluster/DSMEM split-K reduction (``csrc/wgmma_splitk.cu``), layout tn.

Why a family of our own: on shapes with few output tiles and long K, a GEMM must split K to use the SMs, and the
reductions the Triton and CUTLASS families have (a second pass, atomics, stream-K's global-workspace fixup) cost what
the split saves: CUTLASS's split-K got slower past 4 splits and the Triton screen's best stayed 0.76-0.96x of the
vendor on the six worst graph shapes (docs/measurements.md, Headroom: the headroom run). Here the S CTAs that split one tile's K form a
thread-block cluster and reduce their fp32 partials through distributed shared memory, in rank order
(deterministic), in the same launch, with no workspace. A cluster lives on one GPC, though, and 16-CTA clusters ran each
K step twice as slowly as one CTA (the wgmma-family run): the global split ``g`` (with split 1) spreads a tile's K over G CTAs
anywhere on the device, which write fp32 partials to a workspace, meet at a self-resetting per-tile barrier and each
sum a slice of the tile over the G partials in a fixed order (deterministic, one launch). Its CTAs wait for each
other, so the whole grid must be resident at once: ``valid`` allows at most one CTA per SM and ``prepare`` checks the
device's occupancy.

A config (:class:`WgmmaConfig`) is (WG consumer warpgroups: BM = 64 * WG; BN; cluster split S; pipeline stages; global
split G) for one dtype. Every (WG, BN, S) is instantiated in one shared object per dtype (one nvcc run, ~10 s), so a whole screen
compiles once; stages and G are run-time arguments. ``valid_config`` is the compile-time predicate (the instantiated
values, shared memory, the 2..8 stages), ``valid`` adds the problem (tn, fp32 accumulation, the dtype, K % 8 for
TMA's 16-byte row pitch, no CTA without K tiles, at most ``2 x SMs`` CTAs); ``prepare`` also asks the device how many
clusters of the config fit at once (``cudaOccupancyMaxActiveClusters``) and refuses a config that fits none.

Candidates are named ``wgmma:<config>``; a selection (``gemmrl select --family wgmma``) is re-measured as
``wgmma-sel:<protocols>`` (``gemmrl bench --wgmma-from``).

Tests: ``pytest tests/kernels/test_wgmma_gemm.py`` (predicates, names and a compile without spills on the CPU tier where nvcc
exists; ``-m gpu`` runs configs through the battery and graph capture).
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..problem import GemmProblem
from .cuda_source import Build, CudaSource, PerDtype, load_library
from .vendor import raw_stream_getter

SOURCE = Path(__file__).with_name("csrc") / "wgmma_splitk.cu"
WGS = (1, 2)
BNS = (64, 128, 256)
SPLITS = (1, 2, 4, 8, 16)
GSPLITS = (1, 2, 4, 8, 16, 32, 64, 128)   # global splits (split 1 only); a power of two keeps the screen small
MIN_STAGES, MAX_STAGES = 2, 8
BK = 64
SMEM_LIMIT = 232448          # opt-in shared memory per block on H100/H200 (the .cu's SMEM_LIMIT)
PREFIX = "wgmma:"
DTYPES = ("fp16", "bf16")


class WgmmaConfigError(ValueError):
    """A config that must not be built or launched; the message says what to use instead."""


@dataclass(frozen=True)
class WgmmaConfig:
    wg: int = 1
    bn: int = 128
    split: int = 1
    stages: int = 4
    dtype: str = "fp16"
    g: int = 1                 # global split: G CTAs per tile reduce through a workspace (split 1 only)

    @property
    def bm(self) -> int:
        return 64 * self.wg

    @property
    def layout(self) -> str:
        return "tn"

    def __str__(self) -> str:
        g = f"_g{self.g}" if self.g != 1 else ""
        return f"{self.bm}x{self.bn}_s{self.split}{g}_st{self.stages}_{self.dtype}"

    @classmethod
    def parse(cls, text: str) -> "WgmmaConfig":
        m = re.fullmatch(r"(64|128)x(\d+)_s(\d+)(?:_g(\d+))?_st(\d+)_(fp16|bf16)", text.strip())
        if not m:
            raise WgmmaConfigError(f"cannot read wgmma config {text!r}; expected e.g. {WgmmaConfig()} or "
                                   f"{WgmmaConfig(1, 64, 1, 4, g=32)} (BMxBN_s<split>[_g<global split>]_st<stages>_<dtype>, "
                                   f"BM 64 or 128)")
        bm, bn, s, g, st, dtype = m.groups()
        return cls(int(bm) // 64, int(bn), int(s), int(st), dtype, int(g or 1))

    @property
    def stage_bytes(self) -> int:
        return (self.bm + self.bn) * BK * 2

    @property
    def smem_bytes(self) -> int:
        """What a launch asks for (the .cu's smem_bytes): the ring, or the parked fp32 partial that reuses it, 1024
        for alignment and the 2 x stages mbarriers."""
        ring = self.stages * self.stage_bytes
        red = self.bm * (self.bn + 8) * 4 if self.split > 1 else 0
        return max(ring, red) + 1024 + 16 * self.stages

    @property
    def threads(self) -> int:
        return 128 * self.wg + 32

    def workspace_bytes(self, M: int, N: int) -> int:
        """What a launch at M x N needs (the .cu's workspace_bytes): per tile two barrier words (a 256-byte aligned
        region), then G fp32 partials of BM x BN per tile; 0 without a global split."""
        if self.g <= 1:
            return 0
        tiles = -(-M // self.bm) * -(-N // self.bn)
        return -(-tiles * 8 // 256) * 256 + tiles * self.g * self.bm * self.bn * 4


def valid_config(cfg: WgmmaConfig) -> tuple[bool, str]:
    """Compile-time validity: an instantiated (WG, BN, S), 2..8 stages, shared memory within the opt-in limit."""
    if cfg.wg not in WGS:
        return False, f"BM {cfg.bm}: the kernel has BM 64 or 128 (1 or 2 consumer warpgroups)"
    if cfg.bn not in BNS:
        return False, f"BN {cfg.bn}: instantiated BN are {BNS}"
    if cfg.split not in SPLITS:
        return False, f"split {cfg.split}: instantiated splits are {SPLITS} (cluster sizes; 16 is non-portable)"
    if cfg.g not in GSPLITS:
        return False, f"global split g{cfg.g}: use one of {GSPLITS}"
    if cfg.g > 1 and cfg.split > 1:
        return False, (f"split {cfg.split} with global split g{cfg.g}: a cluster split and a global split do not "
                       f"combine; use split 1 with g{cfg.g}, or g1")
    if not MIN_STAGES <= cfg.stages <= MAX_STAGES:
        return False, f"stages {cfg.stages}: use {MIN_STAGES}..{MAX_STAGES}"
    if cfg.dtype not in DTYPES:
        return False, f"dtype {cfg.dtype}: use fp16 or bf16"
    if cfg.smem_bytes > SMEM_LIMIT:
        return False, f"needs {cfg.smem_bytes} bytes of shared memory (> {SMEM_LIMIT}); use fewer stages"
    return True, ""


def ktiles(problem: GemmProblem) -> int:
    return -(-problem.K // BK)


def tiles(cfg: WgmmaConfig, problem: GemmProblem) -> int:
    return -(-problem.M // cfg.bm) * -(-problem.N // cfg.bn)


def valid(cfg: WgmmaConfig, problem: GemmProblem, sms: int = 132, cc: int = 90) -> tuple[bool, str]:
    """The config at a problem (what search, dispatch and tests call; an invalid pair is never launched)."""
    ok, why = valid_config(cfg)
    if not ok:
        return ok, why
    if cc != 90:
        return False, f"sm_{cc}: TMA, wgmma and clusters need Hopper (sm_90a)"
    if problem.layout != "tn":
        return False, "the wgmma family reads B^T (layout tn)"
    if problem.acc != "fp32":
        return False, "the wgmma family accumulates in fp32"
    if problem.dtype != cfg.dtype:
        return False, f"config dtype {cfg.dtype} vs problem {problem.dtype}"
    if problem.K % 8:
        return False, f"K={problem.K}: TMA needs rows of a multiple of 16 bytes (K % 8 == 0)"
    if cfg.split > ktiles(problem):
        return False, f"split {cfg.split} > {ktiles(problem)} K tiles of {BK}: some CTAs would have no work"
    if cfg.split > 1 and tiles(cfg, problem) * cfg.split > 2 * sms:
        return False, f"{tiles(cfg, problem)} tiles x split {cfg.split} > 2 x {sms} SMs: split only few-tile shapes"
    if cfg.g > ktiles(problem):
        return False, f"global split g{cfg.g} > {ktiles(problem)} K tiles of {BK}: some CTAs would have no work"
    if cfg.g > 1 and tiles(cfg, problem) * cfg.g > sms:
        return False, (f"{tiles(cfg, problem)} tiles x global split g{cfg.g} > {sms} SMs: the CTAs of a global split "
                       f"wait for each other, so the whole grid must be resident at once (one CTA per SM); use a "
                       f"smaller g")
    return True, ""


def check(cfg: WgmmaConfig, problem: GemmProblem, sms: int = 132, cc: int = 90) -> None:
    ok, why = valid(cfg, problem, sms, cc)
    if not ok:
        raise WgmmaConfigError(f"{cfg} at {problem.mnk}: {why}")


def all_configs(dtypes: Iterable[str] = DTYPES) -> list[WgmmaConfig]:
    return [c for d in dtypes for wg in WGS for bn in BNS for s in SPLITS for st in range(MIN_STAGES, MAX_STAGES + 1)
            for g in GSPLITS if valid_config(c := WgmmaConfig(wg, bn, s, st, d, g))[0]]


def screen_configs(problem: GemmProblem, sms: int = 132) -> list[WgmmaConfig]:
    """The configs screened at ``problem``: every (WG, BN, split) valid there, each with two ring depths: the
    deepest that fits (capped at the CTA's K tiles) and 3 (less shared memory: room for a second CTA per SM); and
    every (WG, BN, global split g > 1) valid there, with the deepest ring (capped likewise)."""
    out = []
    for wg in WGS:
        for bn in BNS:
            deep = max(st for st in range(MIN_STAGES, MAX_STAGES + 1)
                       if valid_config(WgmmaConfig(wg, bn, 1, st, problem.dtype))[0])
            for s in SPLITS:
                per = -(-ktiles(problem) // s)
                deep_s = max(st for st in range(MIN_STAGES, MAX_STAGES + 1)
                             if valid_config(WgmmaConfig(wg, bn, s, st, problem.dtype))[0])
                for st in sorted({max(MIN_STAGES, min(deep_s, per)), min(3, deep_s)}):
                    c = WgmmaConfig(wg, bn, s, st, problem.dtype)
                    if valid(c, problem, sms)[0]:
                        out.append(c)
            for g in GSPLITS[1:]:
                c = WgmmaConfig(wg, bn, 1, max(MIN_STAGES, min(deep, -(-ktiles(problem) // g))), problem.dtype, g)
                if valid(c, problem, sms)[0]:
                    out.append(c)
    return out


def space_size() -> int:
    return len(all_configs())


# ---------------------------------------------------------------------------------------------------------
# building and calling
# ---------------------------------------------------------------------------------------------------------
_FAMILY = PerDtype(SOURCE, WgmmaConfigError)
_BUILT = _FAMILY.built  # (dtype, arch) -> Build, this process's builds


def source(dtype: str = "fp16") -> CudaSource:
    """Every config of one dtype, as one CUDA source (entry gemmrl_gemm: the .cu's own pick of config)."""
    return _FAMILY.source(dtype)


def build_dtype(dtype: str = "fp16", arch: str | None = None) -> Build:
    """The shared object of ``dtype`` (cached on disk by cuda_source; once per process here)."""
    return _FAMILY.build(dtype, arch)


def typed(lib):
    """``lib`` (a loaded wgmma_splitk.cu, any build flags) with the C signatures of its entries set, once: the one
    place that knows them, so callers (this module, benchmarks/acceptance/wgmma_pace.py, the tests) follow an ABI change together."""
    if not getattr(lib, "_gemmrl_typed", False):  # (ctypes' default restype is already c_int: a flag, not a test)
        fn = lib.gemmrl_wgmma_gemm
        fn.restype = ctypes.c_int
        fn.argtypes = ([ctypes.c_void_p] * 3 + [ctypes.c_int] * 6 + [ctypes.c_void_p, ctypes.c_size_t,
                                                                       ctypes.c_void_p] + [ctypes.c_int] * 5)
        lib.gemmrl_wgmma_workspace_bytes.restype = ctypes.c_size_t
        lib.gemmrl_wgmma_workspace_bytes.argtypes = [ctypes.c_int] * 5
        lib.gemmrl_wgmma_max_active_clusters.restype = ctypes.c_int
        lib.gemmrl_wgmma_max_active_clusters.argtypes = [ctypes.c_int] * 4
        lib.gemmrl_wgmma_smem_bytes.restype = ctypes.c_int
        lib.gemmrl_wgmma_smem_bytes.argtypes = [ctypes.c_int] * 4
        lib._gemmrl_typed = True
    return lib


def _lib(dtype: str):
    return typed(load_library(build_dtype(dtype).so))


def max_active_clusters(cfg: WgmmaConfig) -> int:
    """Clusters of ``cfg`` that fit on the current device at once (0: none; CUDA initialised by the caller)."""
    return int(_lib(cfg.dtype).gemmrl_wgmma_max_active_clusters(cfg.wg, cfg.bn, cfg.split, cfg.stages))


class WgmmaCandidate:
    """One config as a bench candidate (``cand(a, b, bt, c)``, reads ``bt``)."""

    def __init__(self, cfg: WgmmaConfig, name: str | None = None):
        self.cfg = cfg
        self.name = name or f"{PREFIX}{cfg}"
        self.layout, self.acc = "tn", "fp32"
        self._fn = None
        self._dims = (0, 0, 0)
        self._stream = None
        self._args = (cfg.wg, cfg.bn, cfg.split, cfg.stages)
        self._ws = None           # the global split's workspace: zeroed in prepare (its barrier words reset themselves)
        self._ws_ptr, self._ws_bytes = None, 0

    def prepare(self, problem: GemmProblem, bufs, protocol: str, timer) -> None:
        import torch  # start-up cost: torch loads on first use, not on import

        dev = bufs.a.device
        props = torch.cuda.get_device_properties(dev)
        check(self.cfg, problem, props.multi_processor_count, props.major * 10 + props.minor)
        lib = _lib(self.cfg.dtype)
        fit = int(lib.gemmrl_wgmma_max_active_clusters(*self._args))
        if fit <= 0:
            raise WgmmaConfigError(f"{self.cfg}: no cluster of {self.cfg.split} CTAs with "
                                   f"{self.cfg.smem_bytes} bytes of shared memory fits on this device ({fit})")
        grid = tiles(self.cfg, problem) * self.cfg.g
        if self.cfg.g > 1 and grid > fit:
            raise WgmmaConfigError(f"{self.cfg} at {problem.mnk}: {grid} CTAs wait for each other but only {fit} fit on "
                                   f"this device at once; use a smaller g")
        need = int(lib.gemmrl_wgmma_workspace_bytes(self.cfg.wg, self.cfg.bn, self.cfg.g, problem.M, problem.N))
        if need != self.cfg.workspace_bytes(problem.M, problem.N):
            raise WgmmaConfigError(f"{self.cfg}: workspace sizes disagree (library {need}, Python "
                                   f"{self.cfg.workspace_bytes(problem.M, problem.N)}): rebuild wgmma_splitk.cu")
        if need > self._ws_bytes:
            self._ws = torch.empty(need, dtype=torch.uint8, device=dev)
            self._ws_ptr, self._ws_bytes = self._ws.data_ptr(), need
        if self._ws is not None:  # another shape's partials may lie where this one's barrier words are
            self._ws.zero_()
        self._fn = lib.gemmrl_wgmma_gemm
        self._dims = (problem.M, problem.N, problem.K)
        self._stream = raw_stream_getter()

    def __call__(self, a, b, bt, c) -> None:
        M, N, K = self._dims
        rc = self._fn(a.data_ptr(), bt.data_ptr(), c.data_ptr(), M, N, K, K, K, N, self._ws_ptr, self._ws_bytes,
                      self._stream(a.device.index), *self._args, self.cfg.g)
        if rc != 0:
            raise RuntimeError(f"{self.name}: gemmrl_wgmma_gemm returned {rc} for {M}_{N}_{K}")

    def info(self) -> dict[str, Any]:
        return {"algo": str(self.cfg), "smem_bytes": self.cfg.smem_bytes, "workspace_bytes": self._ws_bytes}



__all__ = ["WgmmaConfig", "WgmmaCandidate", "WgmmaConfigError", "valid_config", "valid", "check", "all_configs",
           "screen_configs", "space_size", "source", "build_dtype", "typed", "max_active_clusters"]
