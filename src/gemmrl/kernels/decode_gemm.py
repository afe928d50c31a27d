"""Decode family: the weight streamed at the HBM roofline for M <= 64 (``csrc/decode_stream.cu``), layout tn.

Why a family of its own: at decode sizes (M tokens <= 64 against an nn.Linear weight [N, K] of 100+ MB) the GEMM is
the time the weight takes to cross from HBM, and what a kernel must do is keep enough bytes in flight on every SM
for the whole stream and end all CTAs together. The kernel (see the .cu's header) swaps A and B on mma.sync
m16n8k16 (weight rows are the m16 operand, tokens the n8 one), permutes K inside 32-column chunks so that each lane's
share of both operands is one 16-byte cp.async, and gives every warp a private ring of ST chunks in shared memory
(no barrier in the main loop). A CTA is WR x WK warps: WR warps on R m16 row tiles each (RB = 16 R WR rows of the
weight), WK warps interleaving the K chunks; a split S along K (grid.y) for shapes with too few row blocks reduces
in the same launch (the last CTA of a tile sums the S fp32 partials in split order through a workspace and a
self-resetting counter per tile, both allocated once in ``prepare``).

A config (:class:`DecodeConfig`) is (R, WR, WK, U chunks a warp step, ST, S) for one dtype; the token tile MT (n8 tiles: 1, 2, 4, 8 for
M <= 8, 16, 32, 64) follows M. Every (R, WR, WK) x (U, ST) x MT is instantiated in one shared object per dtype (one nvcc
run, ~25 s). ``valid_config`` is the compile-time predicate (an instantiated shape and depth, a split in 1..32, the
dtype), ``valid`` adds the problem (tn, fp32 accumulation, the dtype, M <= 64, K % 8 for 16-byte cp.async, the
ring and epilogue within the opt-in shared memory at that M, every split with K work, and a split only where the
row blocks alone give fewer than 2 x SMs CTAs); ``prepare`` also asks the device how many CTAs fit an SM and refuses
a config that fits none.

Candidates are named ``decode:<config>``, e.g. ``decode:r1_w1x8_u4_st3_s1_fp16`` (``_u1`` is left out of a name).

Tests: ``pytest tests/kernels/test_decode_gemm.py`` (names, predicates at tiny and odd shapes, the screened configs,
the kernel's data map checked in numpy, and a compile without spills where nvcc exists; ``-m gpu`` runs configs
through the battery, graph capture and repeated calls).
"""

from __future__ import annotations

import ctypes
import re
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ..problem import GemmProblem
from .cuda_source import Build, CudaSource, PerDtype, load_library
from .vendor import raw_stream_getter

SOURCE = Path(__file__).with_name("csrc") / "decode_stream.cu"
# the .cu's instantiations (its g_insts): (R m16 row tiles a warp, WR row warps, WK K warps), ring depths, token tiles
SHAPES = ((1, 1, 8), (2, 1, 8), (2, 2, 4), (2, 4, 2), (2, 4, 1), (4, 2, 2))
# (U adjacent 32-column chunks a warp step, ST ring depth in steps): U = 1 asks for 64 bytes of a row at a time, U = 4
# for 256 back to back. A warp keeps ST - 1 steps in flight: the deep rings (U = 1: 12, 16; U = 2: 6, 8; U = 4: 4)
# hold 100-135 KB of weight in flight an SM at M <= 8 (the vendor's 64x8 tiles, 16 stages of 64 K columns: 128 KB),
# the shallow ones 32-64 KB, which on the H200 streamed at ~3.2 TB/s against the vendor's ~4.4 (fits of two shapes)
DEPTHS = ((1, 4), (1, 6), (1, 8), (1, 12), (1, 16), (2, 3), (2, 4), (2, 6), (2, 8), (4, 2), (4, 3), (4, 4))
STAGES = tuple(sorted({st for _, st in DEPTHS}))
MTS = (1, 2, 4, 8)
MAX_M = 64
MAX_SPLIT = 32
CHUNK = 32                   # K columns of one warp step
SMEM_LIMIT = 232448          # opt-in shared memory per block on H100/H200
SM_SMEM = 233472             # shared memory per SM (228 KB), of which 1 KB per CTA is reserved
PREFIX = "decode:"
DTYPES = ("fp16", "bf16")


class DecodeConfigError(ValueError):
    """A config that must not be built or launched; the message says what to use instead."""


def mt_for(M: int) -> int:
    """n8 token tiles the kernel instantiates for M tokens (0: M is past the family)."""
    return next((mt for mt in MTS if M <= 8 * mt), 0)


@dataclass(frozen=True)
class DecodeConfig:
    r: int = 2
    wr: int = 1
    wk: int = 8
    stages: int = 3
    split: int = 1
    dtype: str = "fp16"
    u: int = 4                   # adjacent 32-column chunks a warp step

    @property
    def layout(self) -> str:
        return "tn"

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.r, self.wr, self.wk

    @property
    def warps(self) -> int:
        return self.wr * self.wk

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def rows(self) -> int:
        """RB: weight rows (output columns) of one CTA."""
        return 16 * self.r * self.wr

    def __str__(self) -> str:
        u = f"_u{self.u}" if self.u != 1 else ""
        return f"r{self.r}_w{self.wr}x{self.wk}{u}_st{self.stages}_s{self.split}_{self.dtype}"

    @classmethod
    def parse(cls, text: str) -> "DecodeConfig":
        m = re.fullmatch(r"r(\d+)_w(\d+)x(\d+)(?:_u(\d+))?_st(\d+)_s(\d+)_(fp16|bf16)", text.strip())
        if not m:
            raise DecodeConfigError(f"cannot read decode config {text!r}; expected e.g. {DecodeConfig()} "
                                    "(r<m16 tiles a warp>_w<row warps>x<K warps>[_u<chunks a step>]_st<ring depth>"
                                    "_s<split>_<dtype>)")
        r, wr, wk, u, st, s, dtype = m.groups()
        return cls(int(r), int(wr), int(wk), int(st), int(s), dtype, int(u or 1))

    def smem_bytes(self, M: int) -> int:
        """What a launch at M asks for (the .cu's Cfg::SMEM): the warps' rings, or their partial tiles if larger."""
        mt = mt_for(M)
        ring = self.warps * self.stages * self.u * (2 * self.r + mt) * 512
        return max(ring, self.warps * self.r * mt * 512)


def valid_config(cfg: DecodeConfig) -> tuple[bool, str]:
    """Compile-time validity: an instantiated (R, WR, WK) and ring depth, a split in 1..MAX_SPLIT, a dtype built."""
    if cfg.shape not in SHAPES:
        return False, (f"r{cfg.r}_w{cfg.wr}x{cfg.wk}: instantiated (R, WR, WK) are "
                       f"{', '.join(f'r{r}_w{a}x{b}' for r, a, b in SHAPES)}")
    if (cfg.u, cfg.stages) not in DEPTHS:
        return False, (f"u{cfg.u} with stages {cfg.stages}: instantiated (chunks a step, ring depth) are "
                       f"{', '.join(f'u{u}_st{st}' for u, st in DEPTHS)}")
    if not 1 <= cfg.split <= MAX_SPLIT:
        return False, f"split {cfg.split}: use 1..{MAX_SPLIT}"
    if cfg.dtype not in DTYPES:
        return False, f"dtype {cfg.dtype}: use fp16 or bf16"
    return True, ""


def chunks(problem: GemmProblem, u: int = 1) -> int:
    """Warp steps of ``u`` chunks that cover K."""
    return -(-problem.K // (CHUNK * u))


def row_blocks(cfg: DecodeConfig, problem: GemmProblem) -> int:
    return -(-problem.N // cfg.rows)


def valid(cfg: DecodeConfig, problem: GemmProblem, sms: int = 132, cc: int = 90) -> tuple[bool, str]:
    """The config at a problem (what search, bench and tests call; an invalid pair is never launched)."""
    ok, why = valid_config(cfg)
    if not ok:
        return ok, why
    if cc != 90:
        return False, f"sm_{cc}: the family is built for sm_90a"
    if problem.layout != "tn":
        return False, "the decode family reads B^T (layout tn: the nn.Linear weight as stored)"
    if problem.acc != "fp32":
        return False, "the decode family accumulates in fp32"
    if problem.dtype != cfg.dtype:
        return False, f"config dtype {cfg.dtype} vs problem {problem.dtype}"
    if problem.M > MAX_M:
        return False, f"M={problem.M}: the decode family takes M <= {MAX_M} (its token tile is at most 64)"
    if problem.K % 8:
        return False, f"K={problem.K}: 16-byte cp.async needs K % 8 == 0"
    if cfg.smem_bytes(problem.M) > SMEM_LIMIT:
        return False, (f"needs {cfg.smem_bytes(problem.M)} bytes of shared memory at M={problem.M} (> {SMEM_LIMIT}): "
                       "fewer stages")
    nst = chunks(problem, cfg.u)
    if (cfg.split - 1) * -(-nst // cfg.split) >= nst:
        return False, f"split {cfg.split} of {nst} K steps of {CHUNK * cfg.u}: some split would have no work"
    if cfg.split > 1 and row_blocks(cfg, problem) >= 2 * sms:
        return False, (f"{row_blocks(cfg, problem)} row blocks of {cfg.rows} >= 2 x {sms} SMs: split only shapes "
                       "with too few CTAs")
    return True, ""


def check(cfg: DecodeConfig, problem: GemmProblem, sms: int = 132, cc: int = 90) -> None:
    ok, why = valid(cfg, problem, sms, cc)
    if not ok:
        raise DecodeConfigError(f"{cfg} at {problem.mnk}: {why}")


def ctas_per_sm(cfg: DecodeConfig, M: int) -> int:
    """CTAs an SM holds by shared memory and threads alone (the device's occupancy query also counts registers)."""
    by_smem = SM_SMEM // (cfg.smem_bytes(M) + 1024)
    return min(by_smem, 2048 // cfg.threads, 32)


def weight_in_flight(cfg: DecodeConfig, M: int, per_sm: int | None = None) -> int:
    """Bytes of weight one SM keeps in flight: ``per_sm`` CTAs (default: as many as shared memory and threads allow),
    each warp ST - 1 steps of U chunks of its 2R half-tiles (512 bytes each)."""
    n = ctas_per_sm(cfg, M) if per_sm is None else per_sm
    return n * cfg.warps * (cfg.stages - 1) * cfg.u * 2 * cfg.r * 512


def all_configs(dtypes: Iterable[str] = DTYPES, splits: Iterable[int] = (1, 2, 3, 4, 6, 8)) -> list[DecodeConfig]:
    return [DecodeConfig(r, wr, wk, st, s, d, u) for d in dtypes for (r, wr, wk) in SHAPES for u, st in DEPTHS
            for s in splits]


def split_for(cfg: DecodeConfig, problem: GemmProblem, sms: int = 132) -> int:
    """The smallest split that gives at least one CTA an SM (1 where the row blocks alone do), within the splits
    that leave every split K work."""
    tiles, nch = row_blocks(cfg, problem), chunks(problem, cfg.u)
    best = 1
    if tiles >= sms:
        return 1
    for s in (2, 3, 4, 6, 8, 12, 16, 24, 32):
        if (s - 1) * -(-nch // s) >= nch:
            break
        best = s
        if tiles * s >= sms:
            break
    return best


def deepest(shape: tuple[int, int, int], u: int, problem: GemmProblem, per_sm: int = 1) -> int:
    """The deepest ring of ``shape`` with steps of ``u`` chunks at M with ``per_sm`` CTAs an SM by shared memory
    (0: none)."""
    r, wr, wk = shape
    for st in sorted((st for uu, st in DEPTHS if uu == u), reverse=True):
        c = DecodeConfig(r, wr, wk, st, 1, problem.dtype, u)
        if c.smem_bytes(problem.M) <= SMEM_LIMIT and ctas_per_sm(c, problem.M) >= per_sm:
            return st
    return 0


# the (R, WR, WK) screened first: K-interleaved warps for M <= 8, row warps sharing activations above
ORDER_SMALL_M = ((1, 1, 8), (2, 1, 8), (2, 2, 4), (2, 4, 2), (4, 2, 2), (2, 4, 1))
ORDER_LARGE_M = ((2, 2, 4), (4, 2, 2), (2, 4, 2), (2, 1, 8), (1, 1, 8), (2, 4, 1))


def screen_configs(problem: GemmProblem, sms: int = 132, limit: int = 6) -> list[DecodeConfig]:
    """The configs measured at ``problem``: the first three (R, WR, WK) in the order for its M, each with 256-byte
    then 128-byte row runs (U = 4, 2) at the deepest ring that fits one CTA an SM and at the deepest that fits two,
    with the split that gives at least an SM's worth of CTAs; the last place goes to the first shape with U = 1
    (64-byte runs, the deepest ring), the pattern the others are measured against."""
    order = ORDER_SMALL_M if problem.M <= 8 else ORDER_LARGE_M

    def make(shape, u, per_sm):
        st = deepest(shape, u, problem, per_sm)
        if not st:
            return None
        c = DecodeConfig(*shape, st, 1, problem.dtype, u)
        c = DecodeConfig(*shape, st, split_for(c, problem, sms), problem.dtype, u)
        return c if valid(c, problem, sms)[0] else None

    out: list[DecodeConfig] = []
    for shape in order[:3]:
        for u in (4, 2):
            for per_sm in (1, 2):
                c = make(shape, u, per_sm)
                if c is not None and c not in out:
                    out.append(c)
    base = next((c for shape in order if (c := make(shape, 1, 1)) is not None), None)
    return out[:limit - 1] + ([base] if base is not None else [])


# ---------------------------------------------------------------------------------------------------------
# building and calling
# ---------------------------------------------------------------------------------------------------------
_FAMILY = PerDtype(SOURCE, DecodeConfigError)
_BUILT = _FAMILY.built


def source(dtype: str = "fp16") -> CudaSource:
    """Every config of one dtype, as one CUDA source (entry gemmrl_gemm: the .cu's own pick, split 1)."""
    return _FAMILY.source(dtype)


def build_dtype(dtype: str = "fp16", arch: str | None = None) -> Build:
    return _FAMILY.build(dtype, arch)


_BUILD_LOCK = threading.Lock()


def ready(cfg: DecodeConfig) -> bool:
    """Whether ``cfg``'s dtype is built already (this process or the disk cache): a first call may race it without
    waiting on nvcc (~25 s a dtype)."""
    return _FAMILY.ready(cfg.dtype)


def prebuild(payload, arch: str | None = None) -> Build:
    """A config's dtype built into the build cache ahead of its evaluation (the tuner's prebuild threads: several
    configs of one dtype share one nvcc run, so they wait on each other instead of compiling it twice)."""
    cfg = payload if isinstance(payload, DecodeConfig) else DecodeConfig.parse(str(payload))
    with _BUILD_LOCK:
        return build_dtype(cfg.dtype, arch)


def typed(lib):
    """``lib`` (a loaded decode_stream.cu) with the C signatures of its entries set, once."""
    if not getattr(lib, "_gemmrl_typed", False):
        i, p, z = ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t
        lib.gemmrl_decode_gemm.restype = i
        lib.gemmrl_decode_gemm.argtypes = [p] * 3 + [i] * 6 + [p] * 2 + [i] * 6 + [p]
        lib.gemmrl_decode_plan.restype = p
        lib.gemmrl_decode_plan.argtypes = [i] * 12 + [p, p]
        lib.gemmrl_decode_plan_run.restype = i
        lib.gemmrl_decode_plan_run.argtypes = [p] * 5
        lib.gemmrl_decode_plan_free.restype = None
        lib.gemmrl_decode_plan_free.argtypes = [p]
        for fn in (lib.gemmrl_decode_smem_bytes, lib.gemmrl_decode_ctas_per_sm):
            fn.restype = i
            fn.argtypes = [i] * 6
        lib.gemmrl_decode_workspace_bytes.restype = z
        lib.gemmrl_decode_workspace_bytes.argtypes = [i] * 5
        lib.gemmrl_decode_counter_bytes.restype = z
        lib.gemmrl_decode_counter_bytes.argtypes = [i] * 4
        lib._gemmrl_typed = True
    return lib


def _lib(dtype: str):
    return typed(load_library(build_dtype(dtype).so))


class DecodeCandidate:
    """One config as a bench candidate (``cand(a, b, bt, c)``, reads ``bt``). ``prepare`` makes the shape's plan and,
    for a split, its fp32 workspace and zeroed counters (once; the kernel leaves the counters zero); every call passes
    the plan, the operands and torch's current stream."""

    def __init__(self, cfg: DecodeConfig, name: str | None = None):
        self.cfg = cfg
        self.name = name or f"{PREFIX}{cfg}"
        self.layout, self.acc = "tn", "fp32"
        self._lib = None
        self._plan: int | None = None
        self._dims = (0, 0, 0)
        self._stream = None
        self._keep: tuple = ()
        self._fit = 0

    def prepare(self, problem: GemmProblem, bufs, protocol: str, timer) -> None:
        import torch  # start-up cost: torch loads on first use, not on import

        dev = bufs.a.device
        if dev.type != "cuda":
            raise DecodeConfigError("the decode family runs on CUDA tensors only")
        props = torch.cuda.get_device_properties(dev)
        check(self.cfg, problem, props.multi_processor_count, props.major * 10 + props.minor)
        if self._plan is not None and self._dims == (problem.M, problem.N, problem.K):
            return  # the same shape in another protocol: the plan, workspace and counters stand
        c, M, N, K = self.cfg, problem.M, problem.N, problem.K
        lib = _lib(c.dtype)
        args = (c.r, c.wr, c.wk, c.u, c.stages, M)
        smem = int(lib.gemmrl_decode_smem_bytes(*args))
        if smem != c.smem_bytes(M):
            raise DecodeConfigError(f"{c}: shared memory sizes disagree (library {smem}, Python {c.smem_bytes(M)}): "
                                    "rebuild decode_stream.cu")
        fit = int(lib.gemmrl_decode_ctas_per_sm(*args))
        if fit <= 0:
            raise DecodeConfigError(f"{c} at M={M}: no CTA with {smem} bytes of shared memory fits an SM ({fit})")
        ws_bytes = int(lib.gemmrl_decode_workspace_bytes(M, N, c.r, c.wr, c.split))
        cnt_bytes = int(lib.gemmrl_decode_counter_bytes(N, c.r, c.wr, c.split))
        ws = torch.empty(max(ws_bytes, 16), dtype=torch.uint8, device=dev)
        cnt = torch.zeros(max(cnt_bytes, 16), dtype=torch.uint8, device=dev)
        torch.cuda.synchronize(dev)
        plan = lib.gemmrl_decode_plan(M, N, K, K, K, N, c.r, c.wr, c.wk, c.u, c.stages, c.split,
                                      ws.data_ptr() if ws_bytes else None, cnt.data_ptr() if cnt_bytes else None)
        if not plan:
            raise DecodeConfigError(f"{self.name}: gemmrl_decode_plan refused {problem.mnk}")
        if self._plan is not None:
            self._lib.gemmrl_decode_plan_free(ctypes.c_void_p(self._plan))
        weakref.finalize(self, lib.gemmrl_decode_plan_free, ctypes.c_void_p(plan))
        self._lib, self._plan, self._dims, self._keep, self._fit = lib, plan, (M, N, K), (ws, cnt), fit
        self._stream = raw_stream_getter()

    def hot_plan(self) -> tuple[int, int]:
        """(address of ``gemmrl_decode_plan_run``, the plan ``prepare`` made): ``int run(plan, A, B, C, stream)``, the
        hot-path calling form the tiny and CUTLASS families share (spec kind 2). Call after ``prepare``."""
        if self._plan is None:
            raise DecodeConfigError(f"{self.name}: hot_plan() before prepare()")
        return ctypes.cast(self._lib.gemmrl_decode_plan_run, ctypes.c_void_p).value, self._plan

    def __call__(self, a, b, bt, c) -> None:
        rc = self._lib.gemmrl_decode_plan_run(self._plan, a.data_ptr(), bt.data_ptr(), c.data_ptr(),
                                              self._stream(a.device.index))
        if rc != 0:
            raise RuntimeError(f"{self.name}: gemmrl_decode_plan_run returned {rc} for "
                               f"{'_'.join(map(str, self._dims))} (a cudaError_t)")

    def info(self) -> dict[str, Any]:
        M = self._dims[0] or 1
        return {"algo": str(self.cfg), "smem_bytes": self.cfg.smem_bytes(M), "ctas_per_sm": self._fit,
                "weight_in_flight_kb": round(weight_in_flight(self.cfg, M, self._fit) / 1024, 1)}


__all__ = ["DecodeConfig", "DecodeCandidate", "DecodeConfigError", "valid_config", "valid", "check", "all_configs",
           "screen_configs", "split_for", "mt_for", "weight_in_flight", "source", "build_dtype", "prebuild", "ready",
           "typed"]
