"""cuBLASLt baselines through nvmath-python (optional extra ``gemmrl[nvmath]``), an alternative to the
ctypes path in vendor.py with the same names and the same choices.

One stateful ``nvmath.linalg.advanced.Matmul`` per candidate, planned once with up to 100 heuristic
algorithms (``MatmulPlanPreferences(limit=100)``) and a 32 MiB workspace limit (nvmath sets the
preference's max workspace to ``memory_limit``; it then allocates what the chosen algorithms need
from torch's allocator). It runs in place into ``c`` (``inplace=True``, beta = 0) on torch's current
stream (nvmath's default for torch operands), compute type COMPUTE_32F (float scalars) or COMPUTE_16F.
Operands are re-bound only when the caller passes different tensors (``reset_operands``).
``heuristic`` runs the plan's first algorithm; ``autotuned`` times each with the harness's timer, as
vendor.py does, with the same on-disk cache (``backend="nvmath"`` in the key): both take what they share from
vendor_common.py, and vendor.py serves these candidates when ``VendorConfig.lt_backend`` is ``"nvmath"``.
Nothing is imported from nvmath until ``prepare``.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, Callable

from ..candidate import Buffers, Timer
from ..problem import GemmProblem
from .vendor_common import (
    MAX_ALIGN, WORKSPACE_BYTES, VendorConfig, VendorError, VendorUnavailable, alignment, autotune, autotune_key,
    check_buffers, event_timer, require_cuda,
)

_LOG = logging.getLogger("gemmrl.nvmath")  # nvmath logs to the root logger unless given one


def import_nvmath():
    try:
        import nvmath  # noqa: F401 - optional dependency (gemmrl[nvmath]), may be missing
        from nvmath.linalg import advanced  # optional dependency, as above
    except ImportError as e:
        raise VendorUnavailable(
            "the nvmath cuBLASLt path needs nvmath-python: `pip install nvmath-python` (gemmrl[nvmath]), "
            f"matching torch's CUDA major version ({e})") from e
    return advanced


def nvmath_versions() -> dict[str, Any]:
    """nvmath-python's version and the cuBLASLt version its bindings load."""
    import nvmath  # optional dependency (gemmrl[nvmath]), may be missing
    from nvmath.bindings import cublasLt  # optional dependency, as above

    return {"nvmath": getattr(nvmath, "__version__", "?"), "cublaslt": int(cublasLt.get_version())}


def describe(alg) -> str:
    """Algorithm id, tile, stages, split-K, swizzle, cluster of an nvmath Algorithm (short, stable)."""
    parts = []
    for key, attr in (("id", "algorithm_id"), ("tile", "tile"), ("stages", "stages"), ("splitk", "split_k"),
                      ("reduction", "reduction_scheme"), ("swizzle", "cta_swizzling"), ("custom", "custom_option"),
                      ("inner", "inner_shape"), ("cluster", "cluster_shape")):
        try:
            v = getattr(alg, attr)
        except Exception:  # noqa: BLE001 - an attribute this cuBLASLt does not have
            continue
        if isinstance(v, tuple):
            v = "x".join(str(x) for x in v)
        parts.append(f"{key}={getattr(v, 'name', v)}")
    return " ".join(parts)


class NvmathCandidate:
    """cuBLASLt via nvmath-python, mode "heuristic" (first algorithm) or "autotuned"."""

    def __init__(self, name: str, layout: str, acc: str, mode: str, config: VendorConfig | None = None):
        if mode not in ("heuristic", "autotuned"):
            raise ValueError(f"unknown mode {mode!r}")
        self.name, self.layout, self.acc, self.mode = name, layout, acc, mode
        self.config = config or VendorConfig()
        self._tn = layout == "tn"
        self._mm = None
        self._algo = None
        self._bound: tuple = (None, None, None)
        self._execute: Callable[..., Any] = _unprepared
        self._info: dict[str, Any] = {}

    def _operand(self, b, bt):
        """B as nvmath should read it: [K,N] row-major (nn) or bt.t(), a column-major [K,N] view (tn)."""
        return bt.t() if self._tn else b

    def prepare(self, problem: GemmProblem, bufs: Buffers, protocol: str, timer: Timer | None) -> None:
        if problem.acc != self.acc:
            raise VendorError(f"{self.name} is the acc-{self.acc} baseline; the problem asks for acc {problem.acc}")
        if problem.dtype == "bf16" and problem.acc == "fp16":
            raise VendorError("bf16 has no fp16-accumulate GEMM in cuBLAS (CUBLAS_COMPUTE_16F takes fp16 data only)")
        require_cuda()
        advanced = import_nvmath()
        from nvmath.linalg import ComputeType  # optional dependency; import_nvmath above says if it is missing

        device = check_buffers(problem, bufs)
        self._execute, self._info = _unprepared, {}  # a failed prepare leaves nothing callable
        if self._mm is not None:
            self._mm.free()
            self._mm = None
        ct = ComputeType.COMPUTE_32F if problem.acc == "fp32" else ComputeType.COMPUTE_16F
        opts = advanced.MatmulOptions(inplace=True, compute_type=ct, memory_limit=WORKSPACE_BYTES, device_id=device,
                                      logger=_LOG)
        bop = self._operand(bufs.b, bufs.bt)
        self._mm = advanced.Matmul(bufs.a, bop, c=bufs.c, beta=0.0, options=opts)
        algos = self._mm.plan(preferences=advanced.MatmulPlanPreferences(limit=self.config.requested_algos))
        self._bound = (bufs.a, bufs.bt if self._tn else bufs.b, bufs.c)
        descs = [describe(a) for a in algos]
        if self.mode == "heuristic":
            idx, extra = 0, {}
        else:
            mm = self._mm

            def make_call(i: int) -> Callable[[], None]:
                alg = algos[i]
                return lambda: mm.execute(algorithm=alg)

            align = min(MAX_ALIGN, alignment(bufs.a.data_ptr(), bop.data_ptr(), bufs.c.data_ptr()))
            key = autotune_key(problem, self.layout, protocol if timer is not None else "builtin-events", device,
                               "nvmath", nvmath_versions()["cublaslt"], _driver_version(), self.config, align)
            idx, rec, hit = autotune(key, descs, make_call, timer or event_timer, self.config.autotune_min_calls,
                                     self.config.use_autotune_cache)
            extra = {"index": idx, "cache_hit": hit, "tune_protocol": key.protocol}
        self._algo = algos[idx]
        self._execute = self._mm.execute
        self._info = {"algo": descs[idx], "n_algos": len(algos), **extra}

    def __call__(self, a, b, bt, c) -> None:
        src = bt if self._tn else b
        bound = self._bound
        if (a is not bound[0] or src is not bound[1] or c is not bound[2]) and self._mm is not None:
            self._mm.reset_operands(a=a, b=self._operand(b, bt), c=c)
            self._bound = (a, src, c)
        self._execute(algorithm=self._algo)

    def info(self) -> dict[str, Any]:
        return {k: v for k, v in self._info.items() if k in ("algo", "n_algos")}

    def details(self) -> dict[str, Any]:
        return dict(self._info)

    def __del__(self):
        try:
            if self._mm is not None:
                self._mm.free()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _unprepared(*_args, **_kw):
    raise VendorError("call prepare(problem, bufs, protocol, timer) before calling a vendor candidate")


def _driver_version() -> int:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        return v.value if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 else 0
    except OSError:
        return 0
