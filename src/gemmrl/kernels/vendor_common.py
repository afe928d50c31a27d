"""What the two paths of the cuBLASLt baselines share: ``vendor`` (ctypes, csrc/vendor_blas.cu) and
``vendor_nvmath`` (nvmath-python). Their configuration (:class:`VendorConfig`), errors, the checks before any
CUDA work (:func:`require_cuda`, :func:`check_buffers`, :func:`alignment`) and the autotuning of cuBLASLt's
heuristic candidates with its on-disk cache (:func:`autotune`, :class:`AutotuneKey`, :func:`event_timer`).

``vendor`` describes the baselines and the choices made; importing this module does no CUDA work.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping

from ..candidate import Buffers, Timer, torch_dtype
from ..paths import cache_dir, write_json_atomic
from ..problem import GemmProblem

WORKSPACE_BYTES = 32 << 20
MAX_ALIGN = 256
FLAG_STRICT_REDUCTION = 1


class VendorError(RuntimeError):
    """A vendor call or plan failed; the message carries cuBLAS's / CUDA's own words."""


class VendorUnavailable(VendorError):
    """No CUDA GPU (or no CUDA build of torch) in this process."""


@dataclass(frozen=True)
class VendorConfig:
    """How the vendor baselines are set up (DESIGN.md defaults)."""

    requested_algos: int = 100          # cuBLASLt heuristic results asked for
    autotune_min_calls: int = 20        # timed calls per algorithm, interleaved, in the protocol
    strict_reduction: bool = False      # True: split-K partial sums only in the compute type
    lt_backend: str = "ctypes"          # "ctypes" (vendor_blas.cu) or "nvmath" (nvmath-python)
    use_autotune_cache: bool = True

    @classmethod
    def from_env(cls) -> "VendorConfig":
        """``GEMMRL_CUBLASLT_BACKEND`` (ctypes|nvmath) and ``GEMMRL_VENDOR_STRICT_REDUCTION`` (0|1)."""
        return cls(lt_backend=os.environ.get("GEMMRL_CUBLASLT_BACKEND", "ctypes"),
                   strict_reduction=os.environ.get("GEMMRL_VENDOR_STRICT_REDUCTION", "0") == "1")

    @property
    def flags(self) -> int:
        return FLAG_STRICT_REDUCTION if self.strict_reduction else 0


def require_cuda(device: int | None = None):
    """Import torch and initialise CUDA (so torch's own libcublas is loaded first); clear error without a GPU."""
    try:
        import torch  # optional here: a machine without torch gets the clear error below
    except ImportError as e:
        raise VendorUnavailable("the vendor baselines need PyTorch with CUDA; install torch") from e
    if not torch.cuda.is_available():
        raise VendorUnavailable(
            "the vendor baselines (cuBLAS, cuBLASLt, torch.matmul) need a CUDA GPU, and torch.cuda.is_available() "
            f"is False here (torch {torch.__version__}, CUDA build: {torch.version.cuda}). Run on a machine with an "
            "NVIDIA GPU and a CUDA build of PyTorch.")
    torch.cuda.init()
    if device is not None and device >= torch.cuda.device_count():
        raise VendorUnavailable(f"cuda:{device} does not exist; {torch.cuda.device_count()} GPU(s) visible")
    return torch


# -- autotune cache ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class AutotuneKey:
    """Everything the autotuned choice depends on; a change in any field is a cache miss."""

    mnk: str
    dtype: str
    acc: str
    layout: str
    protocol: str
    gpu: str
    cc: str
    cublaslt: int
    driver: int
    torch: str
    backend: str = "ctypes"
    requested: int = 100
    workspace: int = WORKSPACE_BYTES
    strict_reduction: bool = False
    align: int = MAX_ALIGN
    method: str = "screen+confirm3"  # how the choice was made (a change of method re-tunes)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:32]


def _cache_file(key: AutotuneKey) -> Path:
    return cache_dir("autotune") / f"cublaslt-{key.digest()}.json"


def load_choice(key: AutotuneKey) -> dict | None:
    try:
        rec = json.loads(_cache_file(key).read_text())
    except (OSError, ValueError):
        return None
    return rec if rec.get("key") == asdict(key) else None


def store_choice(key: AutotuneKey, record: dict) -> bool:
    """Write the choice to the autotune cache; False (nothing written, nothing raised) where the cache cannot
    be written. A sandbox worker is such a place by design: Landlock keeps the cache read-only there, so a
    candidate running in the same process cannot plant a slow algorithm for the vendor baseline it is
    measured against; the choice is then made afresh per process, which costs time, not correctness."""
    try:
        path = _cache_file(key)
    except OSError:
        return False
    return write_json_atomic(path, {"key": asdict(key), **record})


AUTOTUNE_TIE = 0.02
AUTOTUNE_CONFIRM = 3


def autotune(key: AutotuneKey, descriptions: list[str], make_call: Callable[[int], Callable[[], None]],
             timer: Timer, min_calls: int = 20, use_cache: bool = True,
             confirm: int = AUTOTUNE_CONFIRM) -> tuple[int, dict, bool]:
    """Pick the fastest of ``descriptions`` (heuristic order) with ``timer``; (index, record, cache_hit).

    Screening times every algorithm (``min_calls`` interleaved calls each). The heuristic's first
    algorithm is the incumbent: the screening's fastest replaces it only if it is faster by more than
    AUTOTUNE_TIE (2%) there AND in ``confirm`` fresh head-to-head rounds (median of the per-round ratios).
    Picking the screening's minimum outright is a winner's curse: among algorithms within noise of each
    other it picks one that re-measures slower than the heuristic (seen on the H100: 14 of 180 pairs, and
    56 of 174 with no tie rule at all).

    A cached choice is used when its algorithm is still among the heuristic's results."""
    if use_cache:
        rec = load_choice(key)
        if rec is not None and rec.get("algo") in descriptions:
            return descriptions.index(rec["algo"]), rec, True
    names = [f"algo{i:03d}" for i in range(len(descriptions))]
    calls = {n: make_call(i) for i, n in enumerate(names)}
    times = dict(timer(calls, min_calls))
    finite = {n: t for n, t in times.items() if n in names and t is not None and math.isfinite(t) and t > 0}
    if not finite:
        raise VendorError(f"autotuning {key.mnk} {key.layout}: none of {len(names)} cuBLASLt algorithms ran "
                          f"(timer returned {times})")
    best = min(finite, key=lambda n: (finite[n], names.index(n)))
    inc = names[0]
    confirm_ratios: list[float] = []
    if inc in finite and best != inc:
        if finite[best] > finite[inc] * (1.0 - AUTOTUNE_TIE):
            best = inc
        else:
            for _ in range(confirm):
                t = timer({inc: calls[inc], best: calls[best]}, min_calls)
                ok = all(math.isfinite(t.get(n, math.inf)) and t.get(n, 0) > 0 for n in (inc, best))
                confirm_ratios.append(t[best] / t[inc] if ok else math.inf)
            if statistics.median(confirm_ratios) > 1.0 - AUTOTUNE_TIE:
                best = inc
    idx = names.index(best)
    rec = {"index": idx, "algo": descriptions[idx], "n_algos": len(descriptions), "time_ms": finite[best],
           "times_ms": {n: t for n, t in sorted(times.items())}, "screen_best": min(finite, key=finite.get),
           "confirm_ratios": confirm_ratios, "min_calls": min_calls, "tie": AUTOTUNE_TIE,
           "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if use_cache:
        store_choice(key, rec)
    return idx, rec, False


def gpu_identity(device: int) -> dict[str, str]:
    import torch  # torch: seconds of start-up; importing this module must not load it

    cc = torch.cuda.get_device_capability(device)
    return {"gpu": torch.cuda.get_device_name(device), "cc": f"{cc[0]}.{cc[1]}", "torch": torch.__version__}


def autotune_key(problem: GemmProblem, layout: str, protocol: str, device: int, backend: str, cublaslt: int,
                 driver: int, config: VendorConfig, align: int) -> AutotuneKey:
    g = gpu_identity(device)
    return AutotuneKey(problem.mnk, problem.dtype, problem.acc, layout, protocol, g["gpu"], g["cc"], int(cublaslt),
                       int(driver), g["torch"], backend, config.requested_algos, WORKSPACE_BYTES,
                       config.strict_reduction, align)


def alignment(*ptrs: int) -> int:
    """The largest power of two (at most 256) dividing every pointer."""
    a = MAX_ALIGN
    for p in ptrs:
        while a > 1 and p % a:
            a //= 2
    return a


def check_buffers(problem: GemmProblem, bufs: Buffers) -> int:
    """Validate harness buffers for ``problem``; returns the CUDA device index."""
    M, N, K = problem.M, problem.N, problem.K
    dt = torch_dtype(problem.dtype)
    want = {"a": (M, K), "b": (K, N), "bt": (N, K), "c": (M, N)}
    for name, shape in want.items():
        t = getattr(bufs, name)
        if tuple(t.shape) != shape or t.dtype != dt or not t.is_contiguous():
            raise VendorError(f"buffer {name} must be a contiguous {problem.dtype} tensor of shape {shape}, got "
                              f"{tuple(t.shape)} {t.dtype} contiguous={t.is_contiguous()}")
        if not t.is_cuda:
            raise VendorUnavailable(f"the vendor baselines run on CUDA tensors; buffer {name} is on {t.device}")
    return bufs.a.device.index if bufs.a.device.index is not None else 0


def event_timer(fns: Mapping[str, Callable[[], None]], min_calls: int = 20) -> dict[str, float]:
    """Fallback timer when ``prepare`` gets none: CUDA events around single calls, interleaved, median ms."""
    import torch  # torch: seconds of start-up; importing this module must not load it

    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    out: dict[str, float] = {}
    for n in names:  # warm-up; drop the failures
        try:
            fns[n]()
        except Exception:  # noqa: BLE001
            out[n] = math.inf
    torch.cuda.synchronize()
    live = [n for n in names if n not in out]
    rng = random.Random(0)
    for _ in range(min_calls):
        rng.shuffle(live)
        for n in live:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fns[n]()
            e.record()
            e.synchronize()
            samples[n].append(s.elapsed_time(e))
    out.update({n: statistics.median(samples[n]) for n in live})
    return out
