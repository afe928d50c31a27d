"""Raw CUDA C++ candidates (LLM-written, imported or rendered from a template): build, cache, load, call.

A candidate is a :class:`CudaSource`: source text, a declared entry point, the ABI it follows, the layout of
B it reads, and the shapes it declares it handles (:class:`ShapeRange`: exact shapes, or ranges with
divisibility). Nothing serves a shape outside its declaration.

ABIs
  ``gemmrl``   ours, loadable with ctypes and no torch build::

      extern "C" int <entry>(const void* A, const void* B, void* C, int M, int N, int K,
                             int lda, int ldb, int ldc, void* workspace, size_t workspace_bytes,
                             cudaStream_t stream);   // 0 = success, else the cudaError_t met

               A row-major [M,K]; B is ``bt`` [N,K] row-major for layout ``tn`` (ldb = K) or ``b`` [K,N]
               row-major for ``nn`` (ldb = N); C row-major [M,N]. Optional ``extern "C" size_t
               <workspace_entry>(int M, int N, int K)`` sizes a device workspace the harness allocates once.
               All work goes on ``stream`` (torch's current stream).
  ``cuda_l2``  CUDA-L2's ``void entry(torch::Tensor a, torch::Tensor b, torch::Tensor b_col_major,
               torch::Tensor c)``, one exact shape: built by ``cuda_l2_import`` (a torch extension).

Build (:func:`build`, :func:`build_many`): nvcc for the device's arch (``sm_90a`` on Hopper), ``-Xptxas -v``;
the result is cached under ``cache_dir("build", "cuda", <key>)`` with the key a hash of (source, flags, arch,
toolkit, include dirs' versions), so a second build of the same source compiles nothing. The ptxas report
(registers, spills, performance warnings) is kept; a build that spills more than ``max_spill_bytes`` is
rejected. A compile error comes back structured (:class:`BuildError`: stage, file, line, message, the log's
first lines) so a proposer can learn from it; an error in the candidate's own source is cached too. Builds
run as nvcc subprocesses with a timeout, in parallel threads (:func:`build_many`), apart from any GPU work.
Finding nvcc, the arch (``GEMMRL_CUDA_ARCH``), the include dirs, the ptxas report and nvcc's first error are
``toolchain``'s, shared with the other native builders (``cuda_l2_import``, ``vendor``).

Serving safety (:func:`graph_safety`): the call is captured in a CUDA graph on a side stream (global capture
mode); a candidate that launches on the legacy default stream, synchronizes the device or allocates in its
call path breaks the capture or leaves the replayed graph without its work: rejected for serving, with why.

Tests: ``pytest tests/kernels/test_cuda_source.py`` (compile-only where nvcc exists; ``-m gpu`` runs the kernels).
Nothing here runs at import time.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import hashlib
import json
import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from ..paths import cache_dir
from ..problem import GRID_DIMS, GemmProblem
from .cuda_l2_import import load_kernel_dir
from .toolchain import (
    Ptxas, arch_for, digest, find_nvcc, gencode, include_dirs, include_version, log_head, nvcc_version, parse_build_log,
)
from .vendor import raw_stream_getter

BUILDER_VERSION = "1"
ABIS = ("gemmrl", "cuda_l2")
BASE_FLAGS = ("-O3", "-std=c++17", "-DNDEBUG", "--expt-relaxed-constexpr", "-Xptxas=-v", "-Xcompiler=-fPIC",
              "-shared", "-lineinfo")
MAX_INT = (1 << 31) - 1
# Where ShapeRange.probes puts the far end of an open upper bound (``K=64..``, ``any``): the largest dim of the
# grid this project targets (problem.GRID_DIMS). A range has no largest shape to probe; this is the largest one
# it will be asked to serve in practice, and a kernel wrong only past some size (inputs truncated at K > 4096)
# is wrong there.
PROBE_MAX_DIM = max(GRID_DIMS)
DEFAULT_TIMEOUT_S = 600.0


class CudaSourceError(ValueError):
    """A malformed candidate declaration (not a build failure: those are :class:`BuildError` results)."""


# ---------------------------------------------------------------------------------------------------------
# declarations
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShapeRange:
    """The shapes a candidate declares it handles: ``exact`` shapes, or else every (M, N, K) inside the
    inclusive ranges whose dims are multiples of ``*_mult``. ``parse`` reads ``64_4096_64[,..]`` or
    ``M=1..64,N%8,K%8`` (``..`` with an empty bound is open)."""

    exact: tuple[tuple[int, int, int], ...] = ()
    m: tuple[int, int] = (1, MAX_INT)
    n: tuple[int, int] = (1, MAX_INT)
    k: tuple[int, int] = (1, MAX_INT)
    m_mult: int = 1
    n_mult: int = 1
    k_mult: int = 1

    def __post_init__(self) -> None:
        for name in ("m", "n", "k"):
            lo, hi = getattr(self, name)
            if lo < 1 or hi < lo:
                raise CudaSourceError(f"shape range {name.upper()}={lo}..{hi} is empty; use 1 <= lo <= hi")
            if getattr(self, f"{name}_mult") < 1:
                raise CudaSourceError(f"{name.upper()}%{getattr(self, f'{name}_mult')}: the multiple must be >= 1")

    def admits(self, M: int, N: int, K: int) -> bool:
        if self.exact:
            return (M, N, K) in self.exact
        return all(lo <= v <= hi and v % mult == 0 for v, (lo, hi), mult in
                   ((M, self.m, self.m_mult), (N, self.n, self.n_mult), (K, self.k, self.k_mult)))

    def _dim_ends(self, name: str) -> tuple[int, int] | None:
        """(smallest, largest) admitted value of one dim, the largest capped at ``PROBE_MAX_DIM`` when the bound
        is further (never below the smallest); None when no value in the range is a multiple."""
        (lo, hi), mult = getattr(self, name), getattr(self, f"{name}_mult")
        small = -(-lo // mult) * mult
        if small > hi:
            return None
        return small, max(small, min(hi, PROBE_MAX_DIM) // mult * mult)

    def probes(self, M: int, N: int, K: int, n: int | None = None, corners: str = "KMN",
               odd_tails: bool = True) -> list[tuple[int, int, int]]:
        """Other shapes this declaration admits, at most ``n`` (default: all of them): the shapes a candidate
        verified at (M, N, K) is also verified at, so that one hard-coded for the measured shape, or wrong only
        somewhere else in its declaration, is caught. Exact declarations give their other shapes. Ranges give,
        in this order: the shape one multiple smaller in every dimension (tails); about half the size; the far
        corners of the declaration -- its largest K, then its largest M, then its largest N, each with the other
        two dims at their smallest admitted value (a kernel that truncates long K fails at ``1_1_16384`` under
        ``any``); then, for each of those dims whose multiple is 1, the same corner one below its largest (an
        odd tail: ``1_1_16383``). An open upper bound is capped at ``PROBE_MAX_DIM`` (16384, the largest dim of
        the grid this project targets): a range has no largest shape, and that is the largest one it is served
        at in practice. The small dims are the lower bounds rounded up to the multiples (1..64 in the usual
        declarations), so a corner costs the battery's fp64 reference little (64*64*16384 multiply-adds at
        most there). ``corners`` names the dims whose far corners are given (``"K"``: the longest K only) and
        ``odd_tails`` whether their odd tails are. Every probe is admitted (``admits``)."""
        if self.exact:
            return [s for s in self.exact if s != (M, N, K)][:n]
        dims = []
        for v, (lo, hi), mult in ((M, self.m, self.m_mult), (N, self.n, self.n_mult), (K, self.k, self.k_mult)):
            tail = v - mult if v - mult >= lo else (v + mult if v + mult <= hi else v)
            half = max(lo, -(-(v // 2 + 1) // mult) * mult)
            half = half if half <= hi and half % mult == 0 else v
            dims.append((tail, half))
        shapes: list[tuple[int, ...]] = [tuple(d[0] for d in dims), tuple(d[1] for d in dims)]
        ends = [self._dim_ends(name) for name in ("m", "n", "k")]
        if all(ends):
            small = [e[0] for e in ends]  # type: ignore[index]
            far, odd = [], []
            for i in (2, 0, 1):  # K, M, N
                if "MNK"[i] not in corners.upper():
                    continue
                big = ends[i][1]  # type: ignore[index]
                far.append(tuple(big if j == i else small[j] for j in range(3)))
                if odd_tails and getattr(self, f"{'mnk'[i]}_mult") == 1 and big - 1 >= small[i]:
                    odd.append(tuple(big - 1 if j == i else small[j] for j in range(3)))
            shapes += far + odd
        out: list[tuple[int, int, int]] = []
        for shape in shapes:
            if shape != (M, N, K) and shape not in out and self.admits(*shape):
                out.append(shape)  # type: ignore[arg-type]
        return out[:n]

    def __str__(self) -> str:
        if self.exact:
            return ",".join(f"{m}_{n}_{k}" for m, n, k in self.exact)
        parts = []
        for name in ("m", "n", "k"):
            lo, hi = getattr(self, name)
            if (lo, hi) != (1, MAX_INT):
                parts.append(f"{name.upper()}={lo}..{'' if hi == MAX_INT else hi}")
            if getattr(self, f"{name}_mult") > 1:
                parts.append(f"{name.upper()}%{getattr(self, f'{name}_mult')}")
        return ",".join(parts) or "any"

    @classmethod
    def parse(cls, text: str) -> "ShapeRange":
        text = text.strip()
        if text in ("", "any"):
            return cls()
        if re.fullmatch(r"\d+_\d+_\d+(,\d+_\d+_\d+)*", text):
            return cls(exact=tuple(tuple(int(x) for x in s.split("_")) for s in text.split(",")))  # type: ignore[misc]
        kw: dict[str, Any] = {}
        for part in text.split(","):
            m = re.fullmatch(r"\s*([MNK])\s*=\s*(\d*)\s*\.\.\s*(\d*)\s*", part) or \
                re.fullmatch(r"\s*([MNK])\s*%\s*(\d+)\s*", part)
            if not m:
                raise CudaSourceError(f"shape range {text!r}: cannot read {part!r}; write M_N_K[,M_N_K...] or "
                                      "terms like M=1..64, N%8, K=64..")
            d = m.group(1).lower()
            if "%" in part:
                kw[f"{d}_mult"] = int(m.group(2))
            else:
                kw[d] = (int(m.group(2) or 1), int(m.group(3) or MAX_INT))
        return cls(**kw)


class DeclaredSource:
    """What a source candidate (CUDA here, Triton in ``triton_source``) shares: the hash of its code and the check
    of a problem against its declared dtype, accumulator and shapes. Needs ``code``, ``dtype``, ``acc``, ``shapes``."""

    @property
    def source_hash(self) -> str:
        return hashlib.sha256(self.code.encode()).hexdigest()[:16]

    def admits(self, problem: GemmProblem) -> bool:
        return problem.dtype == self.dtype and problem.acc == self.acc and \
            self.shapes.admits(problem.M, problem.N, problem.K)


@dataclass(frozen=True)
class CudaSource(DeclaredSource):
    """One candidate's source and declaration. ``flags`` are extra nvcc flags (e.g. ``-DTILE=128``);
    ``includes`` names extra include sets (``"cutlass"``: the nvidia-cutlass wheel's headers) or dirs."""

    code: str
    entry: str = "gemmrl_gemm"
    abi: str = "gemmrl"
    layout: str = "tn"
    dtype: str = "fp16"
    acc: str = "fp32"
    shapes: ShapeRange = ShapeRange()
    name: str = "cuda"
    flags: tuple[str, ...] = ()
    includes: tuple[str, ...] = ()
    workspace_entry: str = ""

    def __post_init__(self) -> None:
        if self.abi not in ABIS:
            raise CudaSourceError(f"unknown ABI {self.abi!r}; use one of {', '.join(ABIS)}")
        if self.layout not in ("tn", "nn"):
            raise CudaSourceError(f"layout {self.layout!r}: use tn (reads B^T [N,K]) or nn (reads B [K,N])")
        if not re.fullmatch(r"[A-Za-z_]\w*", self.entry):
            raise CudaSourceError(f"entry {self.entry!r} is not a C identifier")
        if self.workspace_entry and not re.fullmatch(r"[A-Za-z_]\w*", self.workspace_entry):
            raise CudaSourceError(f"workspace entry {self.workspace_entry!r} is not a C identifier")
        if self.abi == "cuda_l2" and len(self.shapes.exact) != 1:
            raise CudaSourceError("a cuda_l2-ABI source serves exactly one shape: declare shapes=M_N_K")
        if not self.code.strip():
            raise CudaSourceError("empty source")


# ---------------------------------------------------------------------------------------------------------
# build results
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BuildError:
    """``stage``: compile | link | build | timeout | spills | toolchain | headers | load; ``file``/``line`` where
    the compiler pointed (``<candidate>`` is the candidate's own source)."""

    stage: str
    message: str
    file: str | None = None
    line: int | None = None
    log_head: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}: " if self.file and self.line else ""
        return f"{self.stage}: {where}{self.message}"[:400]


@dataclass(frozen=True)
class Build:
    key: str
    arch: str
    so: str | None = None
    ptxas: Ptxas = Ptxas()
    error: BuildError | None = None
    seconds: float = 0.0
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and self.so is not None

    def record(self) -> dict[str, Any]:
        """Plain data for result rows and the trials store."""
        d = {"key": self.key, "arch": self.arch, "ok": self.ok, "seconds": self.seconds, "cached": self.cached,
             "ptxas": asdict(self.ptxas)}
        if self.error:
            d["error"] = asdict(self.error)
        return d


# ---------------------------------------------------------------------------------------------------------
# command, key, errors
# ---------------------------------------------------------------------------------------------------------
def nvcc_command(nvcc: str, src: CudaSource, arch: str, incs: Sequence[str], cu: str, so: str) -> list[str]:
    return [nvcc, *BASE_FLAGS, gencode(arch), *src.flags,
            *(f"-I{d}" for d in incs), cu, "-o", so, "-Xlinker", "-Bsymbolic"]


def build_key(src: CudaSource, arch: str, nvcc: str, incs: Sequence[str]) -> str:
    return digest((BUILDER_VERSION, src.code, "\0".join(BASE_FLAGS), "\0".join(src.flags), arch, nvcc_version(nvcc),
                   include_version(incs)), 24)


def _structured_error(log: str, cu: str, timeout: bool = False) -> BuildError:
    if timeout:
        return BuildError("timeout", "nvcc did not finish in time", log_head=log_head(log))
    p = parse_build_log(log)
    file = p.get("file")
    if file and Path(file).name == Path(cu).name:
        file = "<candidate>"
    return BuildError(p["stage"], p["message"], file, p.get("line"), log_head(log))


# ---------------------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------------------
def cached(src: CudaSource, arch: str | None = None) -> bool:
    """Whether ``build(src, arch)`` would find a built object in the cache (no nvcc run: a few file checks and, once
    a process, ``nvcc --version``). False where nvcc or the headers are missing, or where no arch is given and no GPU
    names one."""
    try:
        arch = arch_for(arch=arch)
    except RuntimeError:
        return False
    nvcc = find_nvcc()
    if not nvcc or src.abi != "gemmrl":
        return False
    try:
        d = cache_dir("build", "cuda") / build_key(src, arch, nvcc, include_dirs(src.includes))  # made by a build
    except Exception:  # noqa: BLE001 - headers missing, nvcc that does not run: nothing built here
        return False
    return (d / "candidate.so").is_file() and (d / "build.json").is_file()


def build(src: CudaSource, arch: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
          max_spill_bytes: int = 0, force: bool = False) -> Build:
    """Compile ``src`` (ABI ``gemmrl``) to a shared object, or find it in the cache. Never raises for a bad
    source: the error is in the returned :class:`Build`."""
    if src.abi != "gemmrl":
        raise CudaSourceError("build() compiles the gemmrl ABI; a cuda_l2-ABI source is built by "
                              "load_candidate (a torch extension through cuda_l2_import)")
    arch = arch_for(arch=arch)
    nvcc = find_nvcc()
    if not nvcc:
        return Build("", arch, error=BuildError("toolchain", "nvcc not found: install the CUDA toolkit, set CUDA_HOME "
                                                "or GEMMRL_NVCC"))
    try:
        incs = include_dirs(src.includes)
    except Exception as e:  # noqa: BLE001 - CutlassNotFound and friends: a clear message, no build
        return Build("", arch, error=BuildError("headers", str(e)))
    key = build_key(src, arch, nvcc, incs)
    d = cache_dir("build", "cuda", key)
    so, meta = d / "candidate.so", d / "build.json"
    if meta.is_file() and not force:  # only successes and errors in the source itself are recorded there
        rec = json.loads(meta.read_text())
        err = BuildError(**rec["error"]) if rec.get("error") else None
        if err is not None or so.is_file():
            ptxas = Ptxas(**{**rec["ptxas"], "perf_warnings": tuple(rec["ptxas"].get("perf_warnings", ()))})
            return Build(key, arch, None if err else str(so), ptxas, err, rec.get("seconds", 0.0), cached=True)
    cu = d / "candidate.cu"
    cu.write_text(src.code)
    tmp_so = d / f".candidate.{os.getpid()}.so"
    cmd = nvcc_command(nvcc, src, arch, incs, str(cu), str(tmp_so))
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=d, start_new_session=True)
        log, rc, timed_out = p.stdout + p.stderr, p.returncode, False
    except subprocess.TimeoutExpired as e:
        log = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc, timed_out = -1, True
    secs = round(time.perf_counter() - t0, 2)
    (d / "build.log").write_text(" ".join(cmd) + "\n" + log)
    ptxas = Ptxas.parse(log)
    err = None
    if rc != 0 or not tmp_so.is_file():
        err = _structured_error(log, str(cu), timed_out)
    elif ptxas.spill_store_bytes + ptxas.spill_load_bytes > max_spill_bytes:
        err = BuildError("spills", f"ptxas spills {ptxas.spill_store_bytes} bytes stored / {ptxas.spill_load_bytes} "
                         f"loaded (limit {max_spill_bytes}); use fewer registers (smaller tiles, fewer live values)")
    if err is None:
        os.replace(tmp_so, so)
    else:
        tmp_so.unlink(missing_ok=True)
    res = Build(key, arch, str(so) if err is None else None, ptxas, err, secs)
    if err is None or err.stage in ("compile", "spills") and err.file in ("<candidate>", None):
        meta.write_text(json.dumps(res.record(), indent=1))  # an error in the source itself is remembered
    return res


def build_many(srcs: Sequence[CudaSource], arch: str | None = None, *, jobs: int | None = None,
               timeout_s: float = DEFAULT_TIMEOUT_S, max_spill_bytes: int = 0, progress: bool = False) -> list[Build]:
    """:func:`build` for many sources at once: nvcc subprocesses in ``jobs`` threads (default the CPU count);
    results in input order."""
    arch = arch or (arch_for() if srcs else "")
    jobs = max(1, min(len(srcs) or 1, jobs or os.cpu_count() or 1))
    bar = None
    if progress:
        try:
            from tqdm.auto import tqdm  # optional dependency, may be missing

            bar = tqdm(total=len(srcs), desc="nvcc", unit="kernel")
        except ImportError:
            bar = None
    out: list[Build | None] = [None] * len(srcs)
    with cf.ThreadPoolExecutor(max_workers=jobs) as ex:
        futs = {ex.submit(build, s, arch, timeout_s=timeout_s, max_spill_bytes=max_spill_bytes): i
                for i, s in enumerate(srcs)}
        for f in cf.as_completed(futs):
            out[futs[f]] = f.result()
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return [b for b in out if b is not None]


# ---------------------------------------------------------------------------------------------------------
# loading and calling
# ---------------------------------------------------------------------------------------------------------
_LIBS: dict[str, ctypes.CDLL] = {}


class PerDtype:
    """A family's CUDA source that holds every config and is built once per dtype (``-DGEMMRL_BF16=0|1``; entry
    gemmrl_gemm, the .cu's own pick of config; layout tn, K % 8): one nvcc run covers a whole screen. The builds
    are cached on disk by ``build`` and per process here (``built``, keyed by (dtype, arch)); a failed build raises
    ``error`` with nvcc's message."""

    DTYPES = ("fp16", "bf16")

    def __init__(self, path: Path, error: type[Exception]):
        self.path, self.error = Path(path), error
        self.built: dict[tuple[str, str], Build] = {}
        self._code: str | None = None

    def source(self, dtype: str = "fp16") -> CudaSource:
        if dtype not in self.DTYPES:
            raise self.error(f"dtype {dtype}: use fp16 or bf16")
        if self._code is None:
            self._code = self.path.read_text()
        return CudaSource(code=self._code, entry="gemmrl_gemm", layout="tn", dtype=dtype,
                          shapes=ShapeRange(k_mult=8), name=f"cuda:{self.path.stem}_{dtype}",
                          flags=(f"-DGEMMRL_BF16={int(dtype == 'bf16')}",))

    def ready(self, dtype: str = "fp16", arch: str | None = None) -> bool:
        """Whether the dtype's object is built (in this process or the disk cache): loading it costs no nvcc run.
        False where no arch is given and no GPU names one."""
        try:
            key = (dtype, arch_for(arch=arch))
        except RuntimeError:
            return False
        b = self.built.get(key)
        return b.ok if b is not None else cached(self.source(dtype), key[1])

    def build(self, dtype: str = "fp16", arch: str | None = None) -> Build:
        key = (dtype, arch_for(arch=arch))
        if key not in self.built:
            self.built[key] = build(self.source(dtype), key[1])
        b = self.built[key]
        if not b.ok:
            raise self.error(f"{self.path.name} ({dtype}) did not build: {b.error}")
        return b


def load_library(so: str) -> ctypes.CDLL:
    if so not in _LIBS:
        _LIBS[so] = ctypes.CDLL(so, mode=os.RTLD_LOCAL | os.RTLD_NOW)
    return _LIBS[so]


# cudaError_t values an entry may return (the gemmrl ABI returns the CUDA error it met, where one applies)
_CUDA_ERRORS = {1: " (cudaErrorInvalidValue)", 2: " (cudaErrorMemoryAllocation: out of memory)",
                98: " (cudaErrorInvalidDeviceFunction)", 209: " (cudaErrorNoKernelImageForDevice)",
                700: " (cudaErrorIllegalAddress)", 701: " (cudaErrorLaunchOutOfResources)"}


class Workspace:
    """A device workspace that grows to the largest size asked for (allocated once per size, outside any call)."""

    def __init__(self) -> None:
        self._buf = None
        self.ptr, self.bytes = 0, 0

    def ensure(self, need: int, device) -> None:
        if need > self.bytes:
            import torch  # torch: seconds of start-up, needed only once a candidate runs

            self._buf = torch.empty(need, dtype=torch.uint8, device=device)
            self.ptr, self.bytes = self._buf.data_ptr(), need


class CudaCandidate:
    """A built ``gemmrl``-ABI source as a bench candidate (``cand(a, b, bt, c)``). ``prepare`` refuses a shape
    outside the declaration and allocates the declared workspace; a non-zero return code raises."""

    def __init__(self, src: CudaSource, built: Build, name: str | None = None):
        if not built.ok:
            raise CudaSourceError(f"{src.name}: not built ({built.error})")
        self.src, self.built = src, built
        self.name = name or src.name
        self.layout, self.acc = src.layout, src.acc
        lib = load_library(built.so)
        try:
            self._fn = getattr(lib, src.entry)
        except AttributeError:
            raise CudaSourceError(f"{src.name}: the built library has no extern \"C\" symbol {src.entry!r}") from None
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 6 + [ctypes.c_void_p, ctypes.c_size_t,
                                                                          ctypes.c_void_p]
        self._ws_fn = None
        if src.workspace_entry:
            self._ws_fn = getattr(lib, src.workspace_entry)
            self._ws_fn.restype = ctypes.c_size_t
            self._ws_fn.argtypes = [ctypes.c_int] * 3
        self._ws = Workspace()
        self._dims = (0, 0, 0)
        self._stream = None

    def prepare(self, problem: GemmProblem, bufs, protocol: str, timer) -> None:
        if not self.src.admits(problem):
            raise CudaSourceError(f"{self.name} declares {self.src.dtype}/{self.src.acc} shapes {self.src.shapes}; "
                                  f"{problem.mnk} {problem.dtype}/{problem.acc} is outside it")
        self._dims = (problem.M, problem.N, problem.K)
        self._ws.ensure(int(self._ws_fn(*self._dims)) if self._ws_fn else 0, bufs.a.device)
        self._stream = raw_stream_getter()

    def __call__(self, a, b, bt, c) -> None:
        M, N, K = self._dims
        if (a.shape[0], c.shape[1], a.shape[1]) != (M, N, K):
            raise CudaSourceError(f"{self.name} was prepared for {M}_{N}_{K}, called with "
                                  f"{a.shape[0]}_{c.shape[1]}_{a.shape[1]}")
        bb, ldb = (bt, K) if self.layout == "tn" else (b, N)
        rc = self._fn(a.data_ptr(), bb.data_ptr(), c.data_ptr(), M, N, K, K, ldb, N, self._ws.ptr, self._ws.bytes,
                      self._stream(a.device.index))
        if rc != 0:
            raise RuntimeError(f"{self.name}: entry {self.src.entry} returned {rc}{_CUDA_ERRORS.get(rc, '')}")

    def info(self) -> dict[str, Any]:
        return {"source_hash": self.src.source_hash, "build": self.built.key, "shapes": str(self.src.shapes),
                "max_registers": self.built.ptxas.max_registers,
                "spill_bytes": self.built.ptxas.spill_store_bytes + self.built.ptxas.spill_load_bytes}


def load_candidate(src: CudaSource, arch: str | None = None, *, max_spill_bytes: int = 0,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[Any, dict[str, Any]]:
    """Build (or find) and load ``src``: ``(candidate, build record)``; candidate is None when the build failed,
    and the record then says why (``error``: stage, file, line, message)."""
    if src.abi == "cuda_l2":
        (M, N, K), = src.shapes.exact
        mnk = f"{M}_{N}_{K}"
        d = cache_dir("build", "cuda_l2_src", src.source_hash)
        (d / f"{mnk}.cu").write_text(src.code)
        got = load_kernel_dir(d, [mnk], acc=src.acc, arch=arch, dtype=src.dtype, entry=src.entry, progress=False)[mnk]
        if not getattr(got, "ok", False):
            return None, {"ok": False, "error": {"stage": got.stage, "message": got.message,
                                                 "file": "<candidate>" if got.file else None, "line": got.line,
                                                 "log_head": got.log_head}}
        got.name = src.name
        return got, {"ok": True, **{k: v for k, v in got.info().items() if k in ("hash", "ptxas", "build_s", "cached")}}
    built = build(src, arch, timeout_s=timeout_s, max_spill_bytes=max_spill_bytes)
    if not built.ok:
        return None, built.record()
    try:
        return CudaCandidate(src, built), built.record()
    except (CudaSourceError, OSError) as e:
        return None, {**built.record(), "ok": False, "error": asdict(BuildError("load", str(e)))}


# ---------------------------------------------------------------------------------------------------------
# serving safety
# ---------------------------------------------------------------------------------------------------------
def graph_safety(cand, bufs) -> tuple[bool, str]:
    """Capture one call in a CUDA graph on a side stream (global capture mode) and replay it.

    Unsafe, with the reason: the capture fails (a sync, an allocation or a legacy-stream launch in the call
    path invalidates it), C changes during capture (work ran outside the graph), or the replay leaves C
    unwritten (work that was not captured). ``(True, "")`` otherwise. Run it in a sandbox worker: a failed
    capture can leave a CUDA context in a state only a new process clears."""
    import torch  # torch: seconds of start-up, needed only once a candidate runs

    a, b, bt, c = bufs.args()
    c.fill_(float("nan"))
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    try:
        with torch.cuda.graph(g, stream=side, capture_error_mode="global"):
            cand(a, b, bt, c)
    except Exception as e:  # noqa: BLE001 - any capture failure is the verdict
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001
            pass
        return False, (f"not capturable in a CUDA graph ({type(e).__name__}: {str(e).splitlines()[0][:200]}): it "
                       "synchronizes, allocates or launches on the legacy default stream in its call path")
    torch.cuda.synchronize()
    written = int((~torch.isnan(c)).sum())
    if written:
        return False, (f"{written} elements of C were written during capture: work ran outside the graph (legacy "
                       "default stream or another stream)")
    g.replay()
    torch.cuda.synchronize()
    left = int(torch.isnan(c).sum())
    if left:
        return False, f"the replayed graph left {left} of {c.numel()} elements of C unwritten: work was not captured"
    return True, ""


__all__ = ["ShapeRange", "CudaSource", "BuildError", "Build", "build", "build_many", "load_candidate",
           "CudaCandidate", "Workspace", "graph_safety", "CudaSourceError"]
