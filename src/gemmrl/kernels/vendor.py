"""Vendor baselines (DESIGN.md "Baselines"): torch.matmul, cublasGemmEx, cuBLASLt heuristic / autotuned.

Candidates (gemmrl.candidate convention, ``cand(a, b, bt, c)``), per problem:
  ``torch``                  torch.matmul(a, b, out=c), layout nn. ``prepare`` sets
                             torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False and
                             allow_bf16_reduced_precision_reduction = False (process-wide, on purpose: the
                             baseline is torch with fp32 reductions). torch has no fp16-accumulate mode, so it
                             is not a candidate for acc fp16.
  ``cublas_tn|nn``           cublasGemmEx, CUBLAS_GEMM_DEFAULT.
  ``cublaslt_heuristic_tn|nn``   cuBLASLt, the heuristic's first algorithm.
  ``cublaslt_autotuned_tn|nn``   cuBLASLt, every heuristic candidate (asking for 100) timed with the harness's
                             timer in the protocol it is then measured in, fastest kept; cached on disk.
acc fp32 = CUBLAS_COMPUTE_32F (float scalars, never the _FAST_ variants); acc fp16 = CUBLAS_COMPUTE_16F (fp16
data only). Every path: handles made once per device, one real 32 MiB workspace (cudaMalloc), torch's
current stream. cuBLAS's split-K reduction policy is the library default (as in CUDA-L2) unless
``VendorConfig(strict_reduction=True)``, which keeps partial sums in the compute type (torch's setting).

The C++ side (csrc/vendor_blas.cu) is built with nvcc on first use into ``cache_dir("build", ...)``, keyed by
a hash of the source, flags, nvcc version and the cuBLAS include/lib files, and loaded with ctypes after torch
has loaded its own libcublas (same soname, so the loader reuses it). ``GEMMRL_VENDOR_LIB=/path/to.so`` uses a
prebuilt library instead; ``GEMMRL_CUBLAS_DIR`` names a root with include/ and lib/ holding cuBLAS. nvcc is
found as for every native build (``toolchain.find_nvcc``).

The call path is lean: one ctypes call with argtypes bound once (plan pointer, three data pointers, the raw
current stream from ``torch._C._cuda_getCurrentRawStream``, the exact value of
``torch.cuda.current_stream(d).cuda_stream`` without building a Stream object per call). Measured with a no-op
C function in place of vendor_blas, the Python side of a call costs ~0.75 us (3x data_ptr ~0.27 us, the ctypes
call ~0.35 us). Calls do not re-check shapes: ``prepare`` validates the buffers, and later calls must pass
tensors of the same problem (the candidate convention). cuBLASLt plans are made for the alignment of the
prepared buffers (at most 256 B, as cuBLASLt assumes by default); a call with less aligned pointers is refused.

Where CUDA-L2's own baselines differ (on purpose): they run cuBLAS with its default workspace pool, the
cuBLASLt heuristic with 0 bytes (``20 * 1024 * 1024 * 1024`` overflows int) and the autotuned one with 20 GiB;
on the legacy default stream; with CUBLAS_GEMM_DEFAULT_TENSOR_OP (deprecated, same as DEFAULT); their
autotuning is its own CUDA-event loop, ours the harness's timer in the measured protocol.
The configuration, errors, buffer checks and autotuning (with its cache) are in vendor_common.py, shared with the
nvmath-python path (vendor_nvmath.py), whose candidates this module serves for ``lt_backend="nvmath"``.
Importing this module does no CUDA work and compiles nothing.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..candidate import Buffers, Timer, make_buffers
from ..paths import cache_dir
from ..problem import GemmProblem
from ..summary import AGGREGATES, BASELINES  # noqa: F401 - one definition, shared with the summaries
from .toolchain import DEFAULT_CUDA_ROOTS, find_nvcc, nvcc_version_text
from .vendor_common import (
    MAX_ALIGN, VendorConfig, VendorError, alignment, autotune, autotune_key, check_buffers, event_timer, require_cuda,
)
from .vendor_common import VendorUnavailable  # noqa: F401 - what this module's candidates raise without a GPU: its API
from .vendor_nvmath import NvmathCandidate  # imports nvmath only in its prepare

CSRC = Path(__file__).with_name("csrc") / "vendor_blas.cu"
FLAGS = ("-x", "c++", "-std=c++17", "-O2", "-shared", "-Xcompiler", "-fPIC,-fvisibility=hidden")

LAYOUTS_BY_NAME = {"tn": 1, "nn": 0}
DTYPE_CODES = {"fp16": 0, "bf16": 1}
ACC_CODES = {"fp32": 0, "fp16": 1}

class VendorBuildError(VendorError):
    """vendor_blas.cu cannot be built here: says what is missing and what to do."""


# -- finding nvcc and cuBLAS -------------------------------------------------------------------------

@dataclass(frozen=True)
class Toolchain:
    """What a build of vendor_blas.cu uses."""

    nvcc: str
    nvcc_version: str
    include_dir: str      # holds cublas_v2.h and cublasLt.h
    lib_dir: str          # holds the libcublasLt / libcublas linked (and put on the rpath)
    cublaslt: str
    cublas: str
    cudart_dir: str       # toolkit lib dir with libcudart.so ("" = link cudart statically)


def _run(cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _nvidia_paths() -> list[str]:
    """Directories of the ``nvidia`` namespace package (pip wheels: nvidia/cu13/..., nvidia/cublas/...)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    return list(spec.submodule_search_locations or []) if spec else []


def _loaded_libs(stem: str) -> list[str]:
    """Paths of already-loaded shared objects whose file name starts with ``stem`` (Linux /proc/self/maps)."""
    out: list[str] = []
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 6 and os.path.basename(parts[-1]).startswith(stem + ".so") and parts[-1] not in out:
                    out.append(parts[-1])
    except OSError:
        pass
    return out


def _search_roots(env: Mapping[str, str], nvcc: str | None) -> list[str]:
    roots: list[str] = []
    if env.get("GEMMRL_CUBLAS_DIR"):
        roots.append(env["GEMMRL_CUBLAS_DIR"])
    for lib in _loaded_libs("libcublasLt"):  # the one torch already loaded wins
        roots.append(os.path.dirname(os.path.dirname(lib)))
    for p in _nvidia_paths():
        roots += sorted(glob.glob(os.path.join(p, "*")))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            roots.append(env[var])
    if nvcc:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    roots += list(DEFAULT_CUDA_ROOTS)
    return list(dict.fromkeys(os.path.abspath(r) for r in roots if r))


def _pick_lib(d: str, stem: str) -> str | None:
    """``libX.so.<major>`` (the soname torch's wheels ship) over ``libX.so`` over anything else."""
    files = sorted(glob.glob(os.path.join(d, stem + ".so*")))
    if not files:
        return None
    loaded = [f for f in files if any(os.path.realpath(f) == os.path.realpath(x) for x in _loaded_libs(stem))]
    soname = [f for f in files if re.fullmatch(re.escape(stem) + r"\.so\.\d+", os.path.basename(f))]
    plain = [f for f in files if os.path.basename(f) == stem + ".so"]
    return (loaded or soname or plain or files)[0]


def find_cublas(env: Mapping[str, str] | None = None, nvcc: str | None = None) -> tuple[str, str, str, str]:
    """(include_dir, lib_dir, libcublasLt path, libcublas path), searching $GEMMRL_CUBLAS_DIR, the directory
    of the libcublasLt torch loaded, the ``nvidia`` pip packages, $CUDA_HOME, $CUDA_PATH, nvcc's root and
    /usr/local/cuda; headers and libraries from the same root are preferred."""
    env = os.environ if env is None else env
    roots = _search_roots(env, nvcc)
    incs: list[str] = []
    libs: list[tuple[str, str, str]] = []
    for r in roots:
        for inc in [os.path.join(r, "include")] + sorted(glob.glob(os.path.join(r, "targets", "*", "include"))):
            if all(os.path.isfile(os.path.join(inc, h)) for h in ("cublas_v2.h", "cublasLt.h")):
                incs.append(inc)
        for ld in [os.path.join(r, d) for d in ("lib", "lib64")] + sorted(glob.glob(os.path.join(r, "targets", "*", "lib"))):
            lt, bl = _pick_lib(ld, "libcublasLt"), _pick_lib(ld, "libcublas")
            if lt and bl:
                libs.append((ld, lt, bl))
    if not incs:
        raise VendorBuildError(
            "cannot build the cuBLAS/cuBLASLt baselines: cublas_v2.h and cublasLt.h were not found under "
            f"{', '.join(roots) or '(no candidate roots)'}. Install the cuBLAS headers (the CUDA toolkit, or "
            "`pip install nvidia-cublas` matching torch's CUDA), or set GEMMRL_CUBLAS_DIR to a directory with "
            "include/ and lib/, or set GEMMRL_VENDOR_LIB to a prebuilt vendor_blas .so.")
    if not libs:
        raise VendorBuildError(
            f"cannot build the cuBLAS/cuBLASLt baselines: headers found in {incs[0]} but no libcublasLt.so*/"
            f"libcublas.so* under {', '.join(roots)}. Install cuBLAS (torch's CUDA wheels ship it as "
            "nvidia-cublas) or set GEMMRL_CUBLAS_DIR.")
    for ld, lt, bl in libs:  # a library directory whose sibling include/ has the headers
        sib = os.path.join(os.path.dirname(ld), "include")
        if sib in incs:
            return sib, ld, lt, bl
    ld, lt, bl = libs[0]
    return incs[0], ld, lt, bl


def find_toolchain(env: Mapping[str, str] | None = None) -> Toolchain:
    """nvcc (``toolchain.find_nvcc``'s search) and the cuBLAS it builds vendor_blas.cu against (:func:`find_cublas`);
    VendorBuildError saying what is missing and what to do."""
    env = os.environ if env is None else env
    nvcc = find_nvcc(env)
    if not nvcc:
        raise VendorBuildError(
            "cannot build the cuBLAS/cuBLASLt baselines: nvcc was not found (looked at $GEMMRL_NVCC, $CUDA_HOME/bin, "
            f"$CUDA_PATH/bin, PATH and {', '.join(DEFAULT_CUDA_ROOTS)}). Install the CUDA toolkit (nvcc) and set "
            "CUDA_HOME, or set GEMMRL_VENDOR_LIB to a prebuilt vendor_blas .so.")
    try:
        ver = nvcc_version_text(nvcc)
    except (OSError, subprocess.SubprocessError) as e:
        raise VendorBuildError(f"{nvcc} --version failed ({e}); check the CUDA toolkit install") from e
    inc, ld, lt, bl = find_cublas(env, nvcc)
    root = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    cudart = next((d for d in (os.path.join(root, "lib64"), os.path.join(root, "lib"))
                   if glob.glob(os.path.join(d, "libcudart.so*"))), "")
    return Toolchain(nvcc, ver, inc, ld, lt, bl, cudart)


# -- building ----------------------------------------------------------------------------------------

def nvcc_command(tc: Toolchain, src: str, out: str, compile_only: bool = False) -> list[str]:
    cmd = [tc.nvcc, *FLAGS, f"-I{tc.include_dir}", src, "-o", out]
    if compile_only:
        return [c for c in cmd if c != "-shared"] + ["-c"]
    # nvcc splits -Xlinker values at commas: pass the rpath as its own value, directories joined with ':'.
    rpath = ":".join(d for d in (tc.lib_dir, tc.cudart_dir) if d)
    cmd += ["-Xlinker", tc.cublaslt, "-Xlinker", tc.cublas, "-Xlinker", "-rpath", "-Xlinker", rpath]
    cmd += ["--cudart", "shared" if tc.cudart_dir else "static"]
    return cmd


def build_key(tc: Toolchain, source: bytes) -> str:
    blob = json.dumps({"source": hashlib.sha256(source).hexdigest(), "flags": FLAGS, "nvcc": tc.nvcc,
                       "nvcc_version": tc.nvcc_version, "include": tc.include_dir, "lib": tc.lib_dir,
                       "cublaslt": tc.cublaslt, "cublas": tc.cublas, "cudart": tc.cudart_dir}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def enum_names(include_dir: str) -> dict[str, dict[str, str]]:
    """Tile, stages, cluster, inner-shape and reduction-scheme names by value, read from cublasLt.h."""
    try:
        text = Path(include_dir, "cublasLt.h").read_text(errors="replace")
    except OSError:
        return {}
    pats = {"tile": "CUBLASLT_MATMUL_TILE_", "stages": "CUBLASLT_MATMUL_STAGES_", "cluster": "CUBLASLT_CLUSTER_SHAPE_",
            "inner": "CUBLASLT_MATMUL_INNER_SHAPE_", "reduction": "CUBLASLT_REDUCTION_SCHEME_"}
    out: dict[str, dict[str, str]] = {}
    for key, prefix in pats.items():
        d: dict[str, str] = {}
        for name, val in re.findall(re.escape(prefix) + r"(\w+)\s*=\s*(\d+)\s*,", text):
            d.setdefault(val, name)
        out[key] = d
    return out


def compile_check(tc: Toolchain | None = None) -> str:
    """Compile vendor_blas.cu to an object file only (no link, no GPU); returns nvcc's output."""
    tc = tc or find_toolchain()
    with tempfile.TemporaryDirectory(prefix="gemmrl-vendor-cc-") as d:
        cmd = nvcc_command(tc, str(CSRC), os.path.join(d, "vendor_blas.o"), compile_only=True)
        r = _run(cmd, timeout=300)
        if r.returncode != 0:
            raise VendorBuildError(f"nvcc failed on {CSRC.name}:\n$ {' '.join(cmd)}\n{(r.stdout + r.stderr)[-4000:]}")
        return r.stdout + r.stderr


def build_library(tc: Toolchain | None = None) -> Path:
    """Build (once) and return the path of vendor_blas.so. Safe when several processes build at once: each
    builds in its own temporary directory and renames it into place; the first rename wins."""
    tc = tc or find_toolchain()
    source = CSRC.read_bytes()
    key = build_key(tc, source)
    root = cache_dir("build")
    final = root / f"vendor_blas-{key}"
    so = final / "vendor_blas.so"
    if so.is_file():
        return so
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-vendor_blas-{key}-", dir=root))
    try:
        cmd = nvcc_command(tc, str(CSRC), str(tmp / "vendor_blas.so"))
        r = _run(cmd, timeout=600)
        if r.returncode != 0:
            raise VendorBuildError(f"nvcc failed on {CSRC.name}:\n$ {' '.join(cmd)}\n{(r.stdout + r.stderr)[-4000:]}")
        (tmp / "names.json").write_text(json.dumps(enum_names(tc.include_dir)))
        (tmp / "build.json").write_text(json.dumps({**asdict(tc), "command": cmd, "key": key}, indent=1))
        try:
            os.rename(tmp, final)
        except OSError:
            if not so.is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return so


def prebuild_for(baselines: Sequence[str] | None) -> str | None:
    """Build vendor_blas.so in this process when ``baselines`` (None: all seven) include a cuBLAS path, so sandboxed
    workers -- which may write only their scratch directory -- find it built in the cache (a worker that had to
    build it failed with PermissionError, and its cuBLAS baselines with it). Needs nvcc, no GPU. Returns why it
    could not (the workers then report the same failure), else None."""
    if baselines is not None and not any(str(b).startswith("cublas") for b in baselines):
        return None
    if os.environ.get("GEMMRL_VENDOR_LIB"):
        return None
    try:
        build_library()
    except (VendorBuildError, OSError, subprocess.SubprocessError) as e:
        return f"{type(e).__name__}: {e}"[:400]
    return None


# -- loading -----------------------------------------------------------------------------------------

_P = ctypes.c_void_p
_I = ctypes.c_int
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "vb_status_string": (ctypes.c_char_p, [_I]),
    "vb_versions": (_I, [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(_I), ctypes.POINTER(_I), ctypes.POINTER(_I)]),
    "vb_cublaslt_path": (_I, [ctypes.c_char_p, _I]),
    "vb_cublas_path": (_I, [ctypes.c_char_p, _I]),
    "vb_ctx_create": (_I, [_I, ctypes.c_uint, ctypes.POINTER(_P)]),
    "vb_ctx_destroy": (_I, [_P]),
    "vb_workspace_bytes": (ctypes.c_size_t, []),
    "vb_gemmex_plan_create": (_I, [_P, _I, _I, _I, _I, _I, _I, ctypes.POINTER(_P)]),
    "vb_lt_plan_create": (_I, [_P, _I, _I, _I, _I, _I, _I, _I, _I, ctypes.POINTER(_P)]),
    "vb_plan_destroy": (_I, [_P]),
    "vb_plan_count": (_I, [_P]),
    "vb_plan_select": (_I, [_P, _I]),
    "vb_run": (_I, [_P, _P, _P, _P, _P]),
    "vb_run_index": (_I, [_P, _I, _P, _P, _P, _P]),
    "vb_describe": (_I, [_P, _I, ctypes.c_char_p, _I]),
    "vb_lt_plan_add_config": (_I, [_P, ctypes.POINTER(ctypes.c_longlong), ctypes.POINTER(_I)]),
    "vb_lt_splitk_support": (_I, [_P, _I, ctypes.POINTER(_I)]),
}


_RAW_NAMES = {"vb_versions": "versions_raw", "vb_describe": "describe_raw"}


class VendorLib:
    """vendor_blas.so loaded with ctypes; every function bound once with argtypes/restype."""

    def __init__(self, path: str | os.PathLike, names: Mapping[str, Mapping[str, str]] | None = None):
        self.path = str(path)
        self.cdll = ctypes.CDLL(self.path)
        for fname, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(self.cdll, fname)
            fn.restype, fn.argtypes = restype, argtypes
            setattr(self, _RAW_NAMES.get(fname, fname[3:]), fn)
        self.names = dict(names or {})
        self._contexts: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()

    def message(self, status: int) -> str:
        return self.status_string(status).decode(errors="replace")

    def check(self, status: int, what: str) -> None:
        if status != 0:
            raise VendorError(f"{what}: {self.message(status)} (status {status})")

    def versions(self) -> dict[str, int]:
        lt, bl, rt, drv = ctypes.c_size_t(), _I(), _I(), _I()
        self.check(self.versions_raw(lt, bl, rt, drv), "vb_versions")
        return {"cublaslt": lt.value, "cublas": bl.value, "cudart": rt.value, "driver": drv.value}

    def lib_paths(self) -> dict[str, str]:
        out = {}
        for key, fn in (("cublaslt", self.cublaslt_path), ("cublas", self.cublas_path)):
            buf = ctypes.create_string_buffer(4096)
            fn(buf, len(buf))
            out[key] = buf.value.decode(errors="replace")
        return out

    def context(self, device: int, flags: int = 0) -> int:
        """The device's context (handles + 32 MiB workspace), made once per (device, flags)."""
        with self._lock:
            if (device, flags) not in self._contexts:
                p = _P()
                self.check(self.ctx_create(device, flags, ctypes.byref(p)), f"creating the cuBLAS context on cuda:{device}")
                self._contexts[(device, flags)] = p.value
            return self._contexts[(device, flags)]

    def describe(self, plan: int, index: int) -> str:
        buf = ctypes.create_string_buffer(512)
        self.check(self.describe_raw(plan, index, buf, len(buf)), "vb_describe")
        return pretty_algo(buf.value.decode(errors="replace"), self.names)


CONFIG_FIELDS = ("id", "tile", "stages", "splitk", "reduction", "swizzle", "custom", "inner", "cluster")
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # split-K factors tried beside the heuristic's own (split_variants)
MIN_SPLIT_K = 128   # a split shorter than this along K is not tried
SPLIT_BASES = 4     # distinct heuristic kernels whose split-K factor is varied


def config_key(desc: str) -> str:
    """A cuBLASLt algorithm's description without what depends on the problem's M (its workspace and wave count):
    the same configuration at another M of a bucket has the same key."""
    return " ".join(item for item in desc.split() if item.partition("=")[0] in CONFIG_FIELDS)


def parse_config(desc: str, names: Mapping[str, Mapping[str, str]]) -> list[int] | None:
    """vb_describe's attributes of ``desc`` as numbers in CONFIG_FIELDS order (names read back through ``names``),
    or None where one is missing or unknown."""
    got = dict(item.partition("=")[::2] for item in desc.split())
    out = []
    for k in CONFIG_FIELDS:
        v = got.get(k)
        if v is None:
            return None
        if v.lstrip("-").isdigit():
            out.append(int(v))
            continue
        back = {name: val for val, name in names.get(k, {}).items()}
        if v not in back:
            return None
        out.append(int(back[v]))
    return out


def tile_dims(desc: str) -> tuple[int, int] | None:
    """(rows, cols) of a description's tile (``tile=256x8``): rows along N, cols along M (cuBLAS computes C^T)."""
    for item in desc.split():
        k, _, v = item.partition("=")
        if k == "tile":
            a, _, b = v.partition("x")
            if a.isdigit() and b.isdigit():
                return int(a), int(b)
    return None


def pretty_algo(raw: str, names: Mapping[str, Mapping[str, str]]) -> str:
    """Replace enum values in vb_describe's ``k=v`` string by their cublasLt.h names where known."""
    out = []
    for item in raw.split():
        k, _, v = item.partition("=")
        name = names.get(k, {}).get(v) if k in ("tile", "stages", "cluster", "inner", "reduction") else None
        out.append(f"{k}={name}" if name else item)
    return " ".join(out)


_LIB: VendorLib | None = None
_LIB_LOCK = threading.Lock()


_BUILD_ERROR: VendorBuildError | None = None


def load_library() -> VendorLib:
    """The loaded vendor_blas library (built on first use, or $GEMMRL_VENDOR_LIB)."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is not None:
            return _LIB
        torch = require_cuda()
        if not _loaded_libs("libcublasLt"):
            torch.cuda.current_blas_handle()  # makes torch load its cuBLAS(Lt) before ours resolves the soname
        pre = os.environ.get("GEMMRL_VENDOR_LIB")
        if pre:
            if not os.path.isfile(pre):
                raise VendorBuildError(f"GEMMRL_VENDOR_LIB={pre} does not exist; unset it to build vendor_blas.cu here")
            names_file = Path(pre).with_name("names.json")
            so = Path(pre)
        else:
            if _BUILD_ERROR is not None:  # a failed build is not retried for every candidate in this process
                raise _BUILD_ERROR
            try:
                so = build_library()
            except VendorBuildError as e:
                globals()["_BUILD_ERROR"] = e
                raise
            names_file = so.with_name("names.json")
        names = json.loads(names_file.read_text()) if names_file.is_file() else {}
        lib = VendorLib(so, names)
        ours = os.path.realpath(lib.lib_paths()["cublaslt"])
        loaded = {os.path.realpath(p) for p in _loaded_libs("libcublasLt")}
        if len(loaded) > 1 or (loaded and ours not in loaded):
            warnings.warn(f"two libcublasLt copies in this process (ours: {ours}; loaded: {sorted(loaded)}); the "
                          "vendor baselines may not run the cuBLASLt torch uses", RuntimeWarning, stacklevel=2)
        _LIB = lib
        return _LIB


def library_info() -> dict[str, Any]:
    """Which .so, which libcublasLt it resolved, and whether that is the one torch loaded."""
    lib = load_library()
    paths = lib.lib_paths()
    torch_lt = _loaded_libs("libcublasLt")
    same = any(os.path.realpath(paths["cublaslt"]) == os.path.realpath(p) for p in torch_lt)
    return {"so": lib.path, **{f"{k}_path": v for k, v in paths.items()}, "loaded_cublaslt": torch_lt,
            "single_cublaslt": same and len({os.path.realpath(p) for p in torch_lt}) == 1, **lib.versions()}


# -- candidates --------------------------------------------------------------------------------------

def raw_stream_getter() -> Callable[[int], int]:
    """``device -> cudaStream_t`` of torch's current stream, as cheaply as torch allows."""
    import torch  # torch: seconds of start-up; importing this module must not load it

    f = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return f if f is not None else (lambda d: torch.cuda.current_stream(d).cuda_stream)


class TorchCandidate:
    """``torch``: torch.matmul(a, b, out=c), layout nn, fp32 reductions (see module docstring)."""

    def __init__(self, name: str = "torch"):
        self.name, self.layout, self.acc = name, "nn", "fp32"
        self._mm: Callable | None = None

    def prepare(self, problem: GemmProblem, bufs: Buffers, protocol: str, timer: Timer | None) -> None:
        if problem.acc != "fp32":
            raise VendorError("torch.matmul has no fp16-accumulate mode; `torch` is a baseline for acc fp32 only")
        torch = require_cuda()
        check_buffers(problem, bufs)
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        self._mm = torch.matmul

    def __call__(self, a, b, bt, c) -> None:
        self._mm(a, b, out=c)

    def info(self) -> dict[str, Any]:
        return {}


class CtypesCandidate:
    """cublasGemmEx (mode "cublas") or cuBLASLt (mode "heuristic" | "autotuned") through vendor_blas."""

    def __init__(self, name: str, layout: str, acc: str, mode: str, config: VendorConfig | None = None):
        if mode not in ("cublas", "heuristic", "autotuned"):
            raise ValueError(f"unknown mode {mode!r}")
        self.name, self.layout, self.acc, self.mode = name, layout, acc, mode
        self.config = config or VendorConfig()
        self._tn = layout == "tn"
        self._plan: _Plan | None = None
        self._plan_key: tuple | None = None
        self._ptr = 0
        self._run: Callable[..., int] = _unprepared
        self._stream: Callable[[int], int] = lambda d: 0
        self._device = 0
        self._info: dict[str, Any] = {}
        self.align_mask = 15

    def _make_plan(self, lib: VendorLib, problem: GemmProblem, device: int, align: int) -> "_Plan":
        key = (problem.M, problem.N, problem.K, problem.dtype, problem.acc, device, align)
        if self._plan is not None and self._plan_key == key:
            return self._plan
        ctx = lib.context(device, self.config.flags)
        args = (ctx, DTYPE_CODES[problem.dtype], ACC_CODES[problem.acc], LAYOUTS_BY_NAME[self.layout],
                problem.M, problem.N, problem.K)
        p = _P()
        if self.mode == "cublas":
            st = lib.gemmex_plan_create(*args, ctypes.byref(p))
        else:
            st = lib.lt_plan_create(*args, self.config.requested_algos, align, ctypes.byref(p))
        lib.check(st, f"{self.name} plan for {problem.mnk} {problem.dtype} acc {problem.acc}")
        self._plan, self._plan_key = _Plan(lib, p.value), key
        return self._plan

    def prepare(self, problem: GemmProblem, bufs: Buffers, protocol: str, timer: Timer | None) -> None:
        if problem.acc != self.acc:
            raise VendorError(f"{self.name} is the acc-{self.acc} baseline; the problem asks for acc {problem.acc}")
        if problem.dtype == "bf16" and problem.acc == "fp16":
            raise VendorError("bf16 has no fp16-accumulate GEMM in cuBLAS (CUBLAS_COMPUTE_16F takes fp16 data only)")
        self._run, self._ptr, self._info = _unprepared, 0, {}  # a failed prepare leaves nothing callable
        require_cuda()
        device = check_buffers(problem, bufs)
        lib = load_library()
        bop = bufs.bt if self._tn else bufs.b
        align = alignment(bufs.a.data_ptr(), bop.data_ptr(), bufs.c.data_ptr()) if self.mode != "cublas" else MAX_ALIGN
        plan = self._make_plan(lib, problem, device, align)
        self._stream, self._device, self._lib = raw_stream_getter(), device, lib
        self.align_mask = (16 if self.mode == "cublas" else align) - 1  # the alignment the plan was made for
        n = lib.plan_count(plan.ptr)
        if self.mode == "cublas":
            self._info = {"algo": lib.describe(plan.ptr, 0)}
        elif self.mode == "heuristic":
            lib.check(lib.plan_select(plan.ptr, 0), "vb_plan_select")
            self._info = {"algo": lib.describe(plan.ptr, 0), "n_algos": n}
        else:
            descs = [lib.describe(plan.ptr, i) for i in range(n)]
            a, bb, c = bufs.a.data_ptr(), bop.data_ptr(), bufs.c.data_ptr()
            run_index, stream, ptr = lib.run_index, self._stream, plan.ptr

            def make_call(i: int) -> Callable[[], None]:
                def call() -> None:
                    st = run_index(ptr, i, a, bb, c, stream(device))
                    if st:
                        raise VendorError(f"cuBLASLt algorithm {i} ({descs[i]}): {lib.message(st)}")
                return call

            v = lib.versions()
            key = autotune_key(problem, self.layout, protocol if timer is not None else "builtin-events", device,
                               "ctypes", v["cublaslt"], v["driver"], self.config, align)
            idx, rec, hit = autotune(key, descs, make_call, timer or event_timer, self.config.autotune_min_calls,
                                     self.config.use_autotune_cache)
            lib.check(lib.plan_select(plan.ptr, idx), "vb_plan_select")
            self._info = {"algo": descs[idx], "n_algos": n, "index": idx, "cache_hit": hit,
                          "tune_protocol": key.protocol}
        self._run, self._ptr = lib.run, plan.ptr

    def __call__(self, a, b, bt, c) -> None:
        st = self._run(self._ptr, a.data_ptr(), (bt if self._tn else b).data_ptr(), c.data_ptr(),
                       self._stream(self._device))
        if st:
            raise VendorError(f"{self.name}: {self._lib.message(st)} (status {st})")

    # -- the prepared plan, for a server that pins an algorithm and calls the plan from C (serve/launchers.py)
    def algorithms(self) -> list[str]:
        """The descriptions of the prepared plan's heuristic results, in the heuristic's order."""
        return [self._lib.describe(self._ptr, i) for i in range(self._lib.plan_count(self._ptr))]

    def algorithm_call(self, index: int) -> Callable[[Any, Any, Any, Any], None]:
        """``f(a, b, bt, c)`` running heuristic result ``index`` of the prepared plan (the selected one unchanged):
        what a race among the plan's algorithms calls."""
        lib, ptr, tn, device, stream = self._lib, self._ptr, self._tn, self._device, self._stream

        def call(a, b, bt, c) -> None:
            st = lib.run_index(ptr, index, a.data_ptr(), (bt if tn else b).data_ptr(), c.data_ptr(), stream(device))
            if st:
                raise VendorError(f"{self.name} algorithm {index}: {lib.message(st)} (status {st})")
        return call

    def add_config(self, desc: str) -> int | None:
        """The index of the cuBLASLt configuration described by ``desc`` in the prepared plan: among its results
        (compared without workspace and wave count, which depend on M), else built from its attributes and
        appended where cuBLASLt says it runs this problem (another M's race chose it, or a split-K factor the
        heuristic did not list); None where it cannot be built or does not run here."""
        descs = [config_key(d) for d in self.algorithms()]
        if config_key(desc) in descs:
            return descs.index(config_key(desc))
        attrs = parse_config(desc, self._lib.names)
        return None if attrs is None else self._add_attrs(attrs)

    def _add_attrs(self, attrs: list[int]) -> int | None:
        """vb_lt_plan_add_config on CONFIG_FIELDS values: the index of that configuration in the plan (an equal one
        already there, else appended where cuBLASLt says it runs), None where it does not."""
        if self.align_mask != MAX_ALIGN - 1:
            return None
        idx = _I(-1)
        st = self._lib.lt_plan_add_config(self._ptr, (ctypes.c_longlong * len(attrs))(*attrs), ctypes.byref(idx))
        return idx.value if st == 0 and idx.value >= 0 else None

    def split_variants(self, problem: GemmProblem, sms: int, bases: Sequence[int] | None = None) -> list[int]:
        """Indices of split-K configurations the heuristic did not list, appended to the prepared plan: the first
        SPLIT_BASES distinct kernels among results ``bases`` (default all) that take a split-K factor, each with the
        factors of SPLITS that keep a split at least MIN_SPLIT_K long and the grid within two waves of ``sms``
        (shapes whose tiles fill the GPU get none). Factors > 1 reduce in fp32."""
        descs = self.algorithms()
        seen, out = set(), []
        for i in (range(len(descs)) if bases is None else bases):
            d = descs[i]
            attrs = parse_config(d, self._lib.names)
            tile = tile_dims(d)
            if attrs is None or tile is None:
                continue
            kernel = tuple(attrs[:3]) + tuple(attrs[5:])  # everything but the split and its reduction
            if kernel in seen:
                continue
            ok = _I(0)
            if self._lib.lt_splitk_support(self._ptr, i, ctypes.byref(ok)) != 0 or not ok.value:
                continue
            seen.add(kernel)
            tiles = -(-problem.N // tile[0]) * -(-problem.M // tile[1])
            for k in SPLITS:
                if k == attrs[3] or problem.K // k < MIN_SPLIT_K or tiles * k > max(2 * sms, tiles):
                    continue
                j = self._add_attrs(attrs[:3] + [k] + attrs[4:])  # the C side finds an equal one already there
                if j is not None and j >= len(descs) and j not in out:
                    out.append(j)
            if len(seen) >= SPLIT_BASES:
                break
        return out

    def select_algorithm(self, index: int) -> None:
        """Run heuristic result ``index`` of the prepared plan from now on."""
        self._lib.check(self._lib.plan_select(self._ptr, index), "vb_plan_select")

    def hot_plan(self) -> tuple[int, int]:
        """(address of ``vb_run``, the prepared plan): ``int run(plan, A, B, C, stream)``, what a compiled caller
        calls per call. Call after ``prepare``."""
        if not self._ptr:
            raise VendorError(f"{self.name}: hot_plan() before prepare()")
        return ctypes.cast(self._lib.run, ctypes.c_void_p).value, self._ptr

    def plan_error(self, st: int) -> Exception:
        """What a non-zero status of the plan's run means, as an exception to raise."""
        return VendorError(f"{self.name}: {self._lib.message(st)} (status {st})")

    def info(self) -> dict[str, Any]:
        return {k: v for k, v in self._info.items() if k in ("algo", "n_algos")}

    def details(self) -> dict[str, Any]:
        """info() plus the heuristic index, whether the autotune cache hit, and the tuning protocol."""
        return dict(self._info)


def _unprepared(*_args) -> int:
    raise VendorError("call prepare(problem, bufs, protocol, timer) before calling a vendor candidate")


class _Plan:
    """Owns a vb_plan pointer; destroyed with the Python object."""

    def __init__(self, lib: VendorLib, ptr: int):
        self.lib, self.ptr = lib, ptr

    def __del__(self):
        try:
            if self.ptr:
                self.lib.plan_destroy(self.ptr)
                self.ptr = 0
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def vendor_candidates(problem: GemmProblem, config: VendorConfig | None = None) -> list:
    """The baselines for ``problem``: 7 for acc fp32, 6 for acc fp16 (torch has no fp16-accumulate mode).

    Nothing touches CUDA here; ``prepare`` does. ``config.lt_backend == "nvmath"`` serves the cuBLASLt
    baselines through nvmath-python (same names)."""
    config = config or VendorConfig.from_env()
    acc = problem.acc
    out: list = [] if acc == "fp16" else [TorchCandidate()]
    for layout in ("tn", "nn"):
        out.append(CtypesCandidate(f"cublas_{layout}", layout, acc, "cublas", config))
    for mode in ("heuristic", "autotuned"):
        for layout in ("tn", "nn"):
            name = f"cublaslt_{mode}_{layout}"
            if config.lt_backend == "nvmath":
                out.append(NvmathCandidate(name, layout, acc, mode, config))
            elif config.lt_backend == "ctypes":
                out.append(CtypesCandidate(name, layout, acc, mode, config))
            else:
                raise VendorError(f"unknown cuBLASLt backend {config.lt_backend!r}; use 'ctypes' or 'nvmath'")
    order = {n: i for i, n in enumerate(BASELINES)}
    return sorted(out, key=lambda c: order[c.name])


# -- per-call host cost ------------------------------------------------------------------------------

def host_cost(problem: GemmProblem, n: int = 2000, device: int = 0, extra: dict | None = None) -> list[dict]:
    """Per-call host time of each way to call cuBLASLt (and torch.matmul) for ``problem``: the time until
    the call returns (no synchronize) and call + synchronize (what CUDA-L2's offline mode measures),
    medians over ``n`` calls, paths interleaved. A path that cannot run gets a row with its ``reason``.
    ``extra``: more paths, {name: candidate or zero-arg factory} (e.g. our Triton kernels' launch paths)."""
    torch = require_cuda(device)
    with torch.cuda.device(device):
        bufs = make_buffers(problem, device=f"cuda:{device}")
        cfg = VendorConfig()
        paths: dict[str, Any] = {
            "cublaslt_ctypes": CtypesCandidate("cublaslt_heuristic_" + problem.layout, problem.layout, problem.acc,
                                               "heuristic", cfg),
            "cublas_ctypes": CtypesCandidate("cublas_" + problem.layout, problem.layout, problem.acc, "cublas", cfg),
        }
        paths["cublaslt_nvmath"] = NvmathCandidate("cublaslt_heuristic_" + problem.layout, problem.layout,
                                                   problem.acc, "heuristic", cfg)
        if problem.acc == "fp32":
            paths["torch"] = TorchCandidate()
        paths.update(extra or {})
        rows: dict[str, dict] = {}
        live: dict[str, Any] = {}
        for name, cand in paths.items():
            row = {"path": name, "mnk": problem.mnk, "dtype": problem.dtype, "acc": problem.acc,
                   "layout": getattr(cand, "layout", problem.layout), "call_us_median": math.nan,
                   "call_sync_us_median": math.nan, "n": 0, "reason": ""}
            try:
                if not hasattr(cand, "prepare"):  # a factory that prepares its own candidate
                    cand = paths[name] = cand(problem, bufs)
                else:
                    cand.prepare(problem, bufs, "offline", None)
                for _ in range(20):
                    cand(*bufs.args())
                torch.cuda.synchronize()
                live[name] = cand
            except Exception as e:  # noqa: BLE001 - e.g. nvmath-python not installed
                row["reason"] = f"{type(e).__name__}: {e}"[:300]
            rows[name] = row
        call: dict[str, list[float]] = {k: [] for k in live}
        both: dict[str, list[float]] = {k: [] for k in live}
        args = bufs.args()
        clock, sync = time.perf_counter_ns, torch.cuda.synchronize
        names = list(live)
        for i in range(n if names else 0):
            r = i % len(names)  # rotate the order: no path always runs first
            for name in names[r:] + names[:r]:
                fn = live[name]
                sync()
                t0 = clock()
                fn(*args)
                t1 = clock()
                sync()
                t2 = clock()
                call[name].append((t1 - t0) / 1e3)
                both[name].append((t2 - t0) / 1e3)
        for name in live:
            rows[name].update(call_us_median=statistics.median(call[name]),
                              call_sync_us_median=statistics.median(both[name]), n=len(call[name]))
        return list(rows.values())
