"""Correctness battery: a candidate earns reward only if every check passes (DESIGN.md "Correctness battery").

A candidate is called ``cand(a, b, bt, c)`` (candidate.py) on CUDA tensors, or on CPU tensors (Triton
interpreter tier). Every call the battery makes goes through one guarded harness:

* each operand is a contiguous view into the middle of a larger buffer whose bands hold random bits;
  the bands and the inputs must be bit-identical afterwards (``guard_band``, ``inputs_unchanged``);
* C is pre-filled with NaN and every element must be written (``nan_fill``);
* C is read back by a copy enqueued on the current stream straight after the call, with no synchronize
  in between, and must equal C after a device synchronize (``stream``: work left on another stream);
* the timing and reference functions (``torch.cuda.Event``/``synchronize``, ``time.perf_counter``,
  ``Tensor.__matmul__``...) must be the same objects afterwards and no thread may be left running
  (``tamper``; the originals are put back); an exception is a failed ``crash`` check;
* where C is unwritten or still changing after the call returned, the reason names any OS thread the call
  started that is still alive (a C++ thread finishing the work late escapes every timer);
* the harness's tensors keep their memory, shape and strides, and a returned tensor must not share memory
  with an input (``alias``: the result belongs in C);
* fd 1 and 2 (Python's and C's output) are captured around the call; text that reads as a timing claim
  fails (``output``: gemmrl times candidates itself and never reads what they print).

No reference exists while a candidate runs: each check computes its fp64 product after the call returned,
so a candidate that looks for the expected answer in the process (the garbage collector, the caller's
frames) finds none.

On top of that the checks, in order, stop at the first failure:

1. ``nan_fill``    one call on random data: integrity only.
   ``stream_order`` the call queues on torch's current stream (a fresh non-blocking stream held busy by
                   a device sleep: C must stay untouched until it drains); CUDA only.
2. ``exact_int``   small integers such that every partial sum, in any order, and the output are exact
                   in the output dtype; C must match the exact product bit for bit (indexing, tails).
3. ``accuracy``    random-normal unit-scale inputs, a fresh seed per trial, fp64 reference on the same
                   device; a global statistic and an element-wise bound (``Tolerance``).
4. ``second_call`` two calls on the same buffers refilled in place with new inputs: both right
                   (cached results).
5. ``memo``        ``MEMO_REPEATS`` calls on one input set, then in place: all inputs new, one random row of
                   A, one element of A, one column of B, one element of B, each call against fp64 with the
                   accuracy check's bounds (a replayed output keyed on pointers, part of the inputs or a
                   sample of them; rows recomputed only where a sample changed).

``cuda_l2_check`` is CUDA-L2's own 0/1 check, reported beside the battery, never instead of it: it
cannot see fp16 accumulation. ``adversarial/planted.py`` holds deliberately wrong Triton kernels (and one
correct one) that the battery must reject, each with the reason. ``calibrate`` and ``verify_rows``
produce CSV rows for the GPU runs that set and justify the tolerance constants.

Tests: ``pytest tests/test_verify.py`` (CPU and interpreter tiers; ``-m gpu`` on a GPU machine).
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import random
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from .candidate import Candidate, make_buffers, torch_dtype
from .problem import GemmProblem
from .clocks import max_sm_mhz

# Unit roundoff of the output dtypes (half an ulp at 1.0), half the smallest subnormal, and the largest
# integer L such that every integer in [-L, L] is exact.
_U = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
_TINY = {"fp16": 2.0 ** -25, "bf16": 2.0 ** -134}
_EXACT_INT = {"fp16": 2048, "bf16": 256}
_GROSS = 16.0  # an element this many times over its bound (and over R) is a wrong value, not lost precision
# R (the output's error over that of the correctly rounded answer) is a statistic: over a handful of elements the
# correctly rounded error can be near zero by chance, and one honest fp32 sum rounded to the other neighbour reads as
# R = 2-3 (measured: 2.18 at 1_1_16383). It is judged over at least this many elements (the accuracy check pools its
# trials to get there on small outputs); fewer are judged element by element only.
R_MIN_ELEMENTS = 256
_POOL_MAX_TRIALS = 64


# ---------------------------------------------------------------------------------------------------
# Tolerance
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tolerance:
    """The accuracy check's constants.

    With ``ref`` the exact product (fp64 of the fp16/bf16 inputs) and ``u`` the output's unit roundoff:

    * global: ``R = ||c - ref||_F / ||round(ref) - ref||_F`` (1.0 for the correctly rounded answer) must be
      at most ``r_max * growth(K)``;
    * element-wise: ``|c - ref| <= alpha*u*|ref| + beta*u_acc*growth(K)*sigma + tiny`` where
      ``sigma = sqrt((A*A) @ (B*B))`` is the size of the products of that element (what its rounding and
      accumulation errors scale with; ``~1`` for unit-scale data) and ``tiny`` half the smallest subnormal.

    ``acc_chunk == 0`` is the fp32-accumulation model: growth 1, ``u_acc = u``; an fp32 accumulator's own
    error is far below ``u``, so ``alpha = 1`` covers the final rounding exactly (|round(x)-x| <= u|x|)
    and ``beta`` is pure margin for it. ``acc_chunk > 0`` models an fp16 accumulator updated every
    ``acc_chunk`` products (mma k16): each of ``S = ceil(K/acc_chunk)`` updates rounds a partial sum of
    size ``~sigma*sqrt(j/S)``, so the expected R is ``sqrt((S+1)/2) = growth(K)`` and ``u_acc = 2**-11``.
    """

    name: str
    r_max: float
    alpha: float
    beta: float
    acc_chunk: int
    calibration: str

    def growth(self, K: int) -> float:
        if not self.acc_chunk:
            return 1.0
        s = -(-K // self.acc_chunk)
        return math.sqrt((s + 1) / 2)

    def r_limit(self, K: int) -> float:
        return self.r_max * self.growth(K)

    def abs_unit(self, dtype: str) -> float:
        """u_acc: the unit roundoff the accumulation error is measured in."""
        return _U["fp16"] if self.acc_chunk else _U[dtype]


FP32_ACC = Tolerance(
    "fp32", r_max=1.25, alpha=1.0, beta=2.0, acc_chunk=0,
    calibration=(
        "Confirmed on an H100 (benchmarks/results/h100/h100_verify-calibration_2026-11-22.csv.gz, "
        "benchmarks/acceptance/calibrate_tolerance.py): every vendor path R <= 1.004 over 2360 trials each; planted fp16 "
        "accumulation R >= 1.52 (64^3), bf16-rounded inputs R >= 11.7. From the error model: correctly rounded fp32 accumulation gives R = 1.000 (CPU fp32 matmul, "
        "every seed and shape of tests/test_verify.py) and needs beta < 0.01; the accumulator's own error "
        "(u32*sqrt(K), or a biased K/16 * 2**-23 from truncating tensor-core adds) stays below 0.4u*sigma, "
        "R < 1.15, up to K = 16384. fp16 accumulation in k16 steps gives R = sqrt((K/16+1)/2) (CPU "
        "simulation: 1.59 at K = 64, 12.3 at K = 4096), so 1.25 rejects it from K = 64 up; below that it is "
        "numerically harmless (1.0 at K <= 16) or borderline (1.22 at K = 32). bf16-rounded inputs give "
        "R ~ 11.5 on fp16 data, 3-bit-mantissa inputs R ~ 23 on bf16 data. beta = 2: one dropped product "
        "(~sigma/sqrt(K), 16u*sigma at K = 16384 on fp16) is still far outside the bound."),
)
FP16_ACC = Tolerance(
    "fp16", r_max=2.0, alpha=1.0, beta=16.0, acc_chunk=16,
    calibration=(
        "For acc='fp16' problems (H100: fp16-compute vendor paths R/limit <= 0.51 over 300 trials each) (compared with CUBLAS_COMPUTE_16F vendor calls). An fp16 "
        "accumulator updated every 16 products has expected R = sqrt((ceil(K/16)+1)/2) = growth(K) (CPU "
        "simulation: R/growth 1.00-1.01; every 8 products: 1.34-1.41); 2x growth admits both and rejects "
        "per-product fp16 FMA (3.7x at K = 64, growing like sqrt(K/16)) and bf16-rounded inputs up to "
        "K ~ 1000. beta: the k16 simulation needs 4.6, k8 5.5 (400k elements); 16 leaves room for 1e8+."),
)


def tolerance_for(problem: GemmProblem) -> Tolerance:
    return FP16_ACC if problem.acc == "fp16" else FP32_ACC


# ---------------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    reason: str = ""
    stats: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """All checks' results; ``reason`` names the failing check and its numbers ('' if passed).
    ``cuda_l2`` is CUDA-L2's own check when asked for; it never affects ``passed``."""

    passed: bool
    reason: str
    checks: tuple[CheckResult, ...]
    stats: Mapping[str, Any] = field(default_factory=dict)
    cuda_l2: CheckResult | None = None

    @property
    def failed_check(self) -> str:
        return next((c.name for c in self.checks if not c.passed), "")


class _Fail(Exception):
    """A check failed; carries the CheckResult."""

    def __init__(self, result: CheckResult):
        super().__init__(result.reason)
        self.result = result


def _fail(name: str, reason: str, **stats) -> _Fail:
    return _Fail(CheckResult(name, False, f"{name}: {reason}", stats))


# ---------------------------------------------------------------------------------------------------
# Guarded harness
# ---------------------------------------------------------------------------------------------------
def _torch():
    import torch  # start-up cost: torch loads on first use, not on import

    return torch


def _sync(device) -> None:
    if device.type == "cuda":
        _torch().cuda.synchronize(device)


def _same_bits(x, y) -> bool:
    torch = _torch()
    return bool(torch.equal(x.view(torch.int16), y.view(torch.int16)))


def _band(rowlen: int) -> int:
    """Guard band length in elements: covers a whole tile of rows run past the end, 512-byte aligned so the
    views keep the alignment the allocator gives (vendor algorithm choice depends on it)."""
    n = min(max(16384, 128 * rowlen), 1 << 22)
    return -(-n // 256) * 256


class _Guarded:
    """a [M,K], b [K,N], bt [N,K], c [M,N]: contiguous views into buffers with random-bit guard bands."""

    def __init__(self, problem: GemmProblem, device, seed: int = 0):
        torch = _torch()
        self.problem, self.device = problem, device
        self.dt = torch_dtype(problem.dtype)
        M, N, K = problem.M, problem.N, problem.K
        gen = torch.Generator(device=device).manual_seed(seed ^ 0x5EED)
        self.bufs, self.views, self.bands = {}, {}, {}
        for name, (rows, cols) in (("a", (M, K)), ("b", (K, N)), ("bt", (N, K)), ("c", (M, N))):
            band = _band(cols)
            buf = torch.randint(-2 ** 15, 2 ** 15, (rows * cols + 2 * band,), dtype=torch.int16,
                                device=device, generator=gen).view(self.dt)
            self.bufs[name], self.bands[name] = buf, band
            self.views[name] = buf[band:band + rows * cols].view(rows, cols)
        self.canary = {n: (buf[:self.bands[n]].clone(), buf[-self.bands[n]:].clone()) for n, buf in self.bufs.items()}
        self.saved: dict[str, Any] = {}

    def load(self, a, b) -> None:
        """Write inputs in place (same addresses every time), save copies, NaN-fill C."""
        v = self.views
        v["a"].copy_(a)
        v["b"].copy_(b)
        v["bt"].copy_(b.t())
        v["c"].fill_(float("nan"))
        self.saved = {n: v[n].clone() for n in ("a", "b", "bt")}

    def args(self):
        v = self.views
        return v["a"], v["b"], v["bt"], v["c"]


def _watched() -> list[tuple[Any, str, str, Any]]:
    """(owner, attribute, label, original) for what a candidate could replace to fake a time or a check."""
    torch = _torch()

    owners = [(time, "time", ("perf_counter", "perf_counter_ns", "time", "monotonic", "process_time")),
              (torch.cuda, "torch.cuda", ("synchronize", "Event", "Stream", "current_stream")),
              (torch.cuda.Event, "torch.cuda.Event", ("record", "elapsed_time", "synchronize", "query")),
              (torch, "torch", ("matmul", "mm", "equal")),
              (torch.Tensor, "torch.Tensor", ("__matmul__", "clone", "copy_", "double", "to", "equal", "view"))]
    return [(o, n, f"{label}.{n}", getattr(o, n)) for o, label, names in owners for n in names if hasattr(o, n)]


def _os_threads() -> set[int]:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:  # no procfs: the Python-level thread count still applies
        return set()


def _thread_names(tids: Iterable[int]) -> str:
    names = []
    for t in sorted(tids):
        try:
            names.append(open(f"/proc/self/task/{t}/comm").read().strip())
        except OSError:
            names.append(str(t))
    return ", ".join(names)


_TIMING_CLAIM = re.compile(r"\b\d+(\.\d+)?\s*(ms|us|µs|ns|sec|seconds?)\b|tflops|gflops|speedup|elapsed|latency",
                           re.IGNORECASE)


@functools.lru_cache(maxsize=1)
def _libc():
    return ctypes.CDLL(None)


def _flush_c_stdio() -> None:
    try:
        _libc().fflush(None)
    except (OSError, AttributeError):
        pass


class _Output:
    """fd 1 and 2 (C's stdio too) and ``sys.stdout``/``sys.stderr`` captured around a call; what was captured is
    written back to fd 1 afterwards, so nothing a candidate prints is lost to whoever collects the output."""

    def __enter__(self) -> "_Output":
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except (AttributeError, OSError, ValueError):
                pass
        self.tmp = tempfile.TemporaryFile()
        self.saved = (os.dup(1), os.dup(2))
        os.dup2(self.tmp.fileno(), 1)
        os.dup2(self.tmp.fileno(), 2)
        self.streams = (sys.stdout, sys.stderr)
        self.text_io = open(os.dup(self.tmp.fileno()), "w", buffering=1, errors="replace")
        sys.stdout = sys.stderr = self.text_io
        self.text = ""
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.text_io.flush()
        except (OSError, ValueError):
            pass
        _flush_c_stdio()  # C stdio's buffers, before fd 1 points back
        sys.stdout, sys.stderr = self.streams
        os.dup2(self.saved[0], 1)
        os.dup2(self.saved[1], 2)
        for fd in self.saved:
            os.close(fd)
        try:
            self.text_io.close()
        except (OSError, ValueError):
            pass
        self.tmp.seek(0)
        data = self.tmp.read()
        self.tmp.close()
        self.text = data.decode(errors="replace")
        if data:
            try:
                sys.stdout.write(self.text)
                sys.stdout.flush()
            except (AttributeError, OSError, ValueError):
                pass


def _identity(t) -> tuple:
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.untyped_storage().data_ptr())


def _aliases(ret, g: _Guarded) -> str:
    """The name of the input a returned tensor shares memory with, or ''."""
    torch = _torch()
    if not isinstance(ret, torch.Tensor) or ret.numel() == 0:
        return ""
    lo = ret.data_ptr()
    hi = lo + ret.numel() * ret.element_size()
    for name in ("a", "b", "bt"):
        v = g.views[name]
        vlo = v.data_ptr()
        if lo < vlo + v.numel() * v.element_size() and vlo < hi:
            return name
    return ""


def _call(cand, g: _Guarded, during: str):
    """One guarded call; returns C as read on the current stream straight after it. Raises _Fail."""
    torch = _torch()
    watched = _watched()
    threads = threading.active_count()
    os_threads = _os_threads()
    ids = {n: _identity(v) for n, v in g.views.items()}
    _sync(g.device)
    out = _Output()
    try:
        with out:
            ret = cand(*g.args())
    except Exception as e:  # a crash is a failed check, not an error of the battery
        _restore(watched)
        raise _fail("crash", f"{type(e).__name__}: {e} (during {during})") from None
    changed = _restore(watched)
    if changed:
        raise _fail("tamper", f"candidate replaced {', '.join(changed)} (during {during}); originals restored")
    moved = [n for n, v in g.views.items() if _identity(v) != ids[n]]
    if moved:
        raise _fail("alias", f"the call re-pointed or reshaped the harness's tensor(s) {', '.join(moved)} "
                             f"(set_/resize_/.data=; during {during}): write the result into C in place")
    alias = _aliases(ret, g)
    if alias:
        raise _fail("alias", f"the call returned a tensor that shares memory with input {alias} (during {during}): "
                             f"an input alias is not a result; write the product into C")
    snap = g.views["c"].clone()  # enqueued on the current stream, no synchronize before it
    _sync(g.device)
    extra = threading.active_count() - threads
    if extra > 0:
        raise _fail("tamper", f"candidate left {extra} thread(s) running (during {during})")
    new = _os_threads() - os_threads
    # OS threads are no verdict by themselves (OpenMP and torch start pools lazily, inside a first call), but
    # where the work was not done when the call returned, a thread the call started is the likely culprit
    threads_note = (f"; {len(new)} OS thread(s) that the call started still alive ({_thread_names(new)}): work "
                    f"handed to a thread of its own?" if new else "")
    claim = _TIMING_CLAIM.search(out.text)
    if claim:
        line = next((ln for ln in out.text.splitlines() if claim.group(0) in ln), claim.group(0))
        raise _fail("output", f"the call printed a timing claim ({line.strip()[:120]!r}, during {during}): gemmrl "
                              f"times candidates itself and never reads their output")
    c = g.views["c"]
    if not _same_bits(snap, c):
        n = int((snap.view(torch.int16) != c.view(torch.int16)).sum())
        raise _fail("stream", f"{n} elements of C changed after the call returned: work left running on another "
                              f"stream or thread (read on the current stream right after the call vs after a "
                              f"device synchronize, during {during}){threads_note}", elements=n)
    for name, buf in g.bufs.items():
        lo, hi = g.canary[name]
        band = g.bands[name]
        for side, now, was in (("before", buf[:band], lo), ("after", buf[-band:], hi)):
            if not _same_bits(now, was):
                n = int((now.view(torch.int16) != was.view(torch.int16)).sum())
                raise _fail("guard_band", f"{n} elements in the guard band {side} {name} were overwritten "
                                          f"(out-of-bounds write, during {during})", elements=n)
    for name, was in g.saved.items():
        if not _same_bits(g.views[name], was):
            n = int((g.views[name].view(torch.int16) != was.view(torch.int16)).sum())
            raise _fail("inputs_unchanged", f"input {name} was modified ({n} elements, during {during})", elements=n)
    nan = torch.isnan(snap)
    if bool(nan.any()):
        n = int(nan.sum())
        i, j = (int(x) for x in nan.nonzero()[0])
        raise _fail("nan_fill", f"{n} of {snap.numel()} elements of C not written (NaN from the pre-fill left: never "
                                f"written, or accumulated into C's prior contents), first at C[{i},{j}] "
                                f"(during {during}){threads_note}", elements=n)
    return snap


def _restore(watched) -> list[str]:
    """Put back whatever the candidate replaced; returns the labels of what it had."""
    changed = []
    for owner, name, label, orig in watched:
        if getattr(owner, name, None) is not orig:
            changed.append(label)
            setattr(owner, name, orig)
    return changed


# ---------------------------------------------------------------------------------------------------
# Inputs and reference
# ---------------------------------------------------------------------------------------------------
def _normal_inputs(problem: GemmProblem, device, seed: int):
    """Random-normal A, B scaled by K**-0.25 each (unit-scale C), as make_buffers does, on the device."""
    torch = _torch()
    gen = torch.Generator(device=device).manual_seed(seed)
    s = problem.K ** -0.25
    dt = torch_dtype(problem.dtype)
    a = (torch.randn(problem.M, problem.K, device=device, generator=gen) * s).to(dt)
    b = (torch.randn(problem.K, problem.N, device=device, generator=gen) * s).to(dt)
    return a, b


def _int_inputs(problem: GemmProblem, device, seed: int):
    """Integers such that sum_k |a_ik b_kj| <= L (exact-integer limit of the output dtype): then every partial
    sum, in any order and in any accumulator at least as wide as the output, and C itself are exact.
    Dense nonzeros in +-{1..v} when K*v*v <= L; beyond that +-1 with a density that keeps the mean of that
    sum at L/4, checked exactly."""
    torch = _torch()
    M, N, K = problem.M, problem.N, problem.K
    L = _EXACT_INT[problem.dtype]
    v = next((v for v in (4, 3, 2, 1) if K * v * v <= L), 1)
    density = 1.0 if K * v * v <= L else L / (4.0 * K)
    gen = torch.Generator(device=device).manual_seed(seed)

    def draw(rows, cols, p):
        mag = torch.randint(1, v + 1, (rows, cols), device=device, generator=gen).double()
        sign = torch.randint(0, 2, (rows, cols), device=device, generator=gen).double() * 2 - 1
        keep = (torch.rand(rows, cols, device=device, generator=gen, dtype=torch.float64) < p).double()
        return mag * sign * keep

    for _ in range(8):
        p = math.sqrt(density)
        a, b = draw(M, K, p), draw(K, N, p)
        if float((a.abs() @ b.abs()).max()) <= L:
            dt = torch_dtype(problem.dtype)
            return a.to(dt), b.to(dt)
        density /= 2
    raise RuntimeError(f"could not draw exact-integer inputs for {problem.mnk}")  # pragma: no cover


def _row_chunks(M: int, N: int):
    rows = max(1, (1 << 24) // max(N, 1))
    return [(i, min(M, i + rows)) for i in range(0, M, rows)]


@dataclass
class _Reference:
    ref: Any    # fp64 [M,N], the exact product of the (rounded) inputs
    sigma: Any  # fp64 [M,N], sqrt((A*A) @ (B*B))
    e0: float   # ||round(ref) - ref||_F: the error of the correctly rounded answer


def _reference(a, b, dtype: str) -> _Reference:
    a64, b64 = a.double(), b.double()
    ref = a64 @ b64
    sigma = (a64.square_() @ b64.square_()).sqrt_()
    del a64, b64
    dt = torch_dtype(dtype)
    e0sq = 0.0
    for i0, i1 in _row_chunks(*ref.shape):
        r = ref[i0:i1]
        e0sq += float((r.to(dt).double() - r).square().sum())
    return _Reference(ref, sigma, math.sqrt(e0sq))


def _measure(c, r: _Reference, problem: GemmProblem, tol: Tolerance) -> dict[str, Any]:
    """R, its limit, the worst element (ratio to its bound, where, values) and the beta it would need."""
    u, ua, gK = _U[problem.dtype], tol.abs_unit(problem.dtype), tol.growth(problem.K)
    tiny = _TINY[problem.dtype]
    se, worst, at, beta_needed = 0.0, -1.0, (0, 0), 0.0
    for i0, i1 in _row_chunks(problem.M, problem.N):
        ref, sig = r.ref[i0:i1], r.sigma[i0:i1]
        err = (c[i0:i1].double() - ref).abs_()
        se += float(err.square().sum())
        rel = tol.alpha * u * ref.abs() + tiny
        ratio = err / (rel + tol.beta * ua * gK * sig)
        ratio = ratio.nan_to_num(nan=math.inf)
        k = int(ratio.argmax())
        m = float(ratio.view(-1)[k])
        if m > worst:
            worst, at = m, (i0 + k // problem.N, k % problem.N)
        beta_needed = max(beta_needed, float(((err - rel) / (ua * gK * sig.clamp_min(1e-300))).max()))
    e = math.sqrt(se)
    R = e / r.e0 if r.e0 > 0 else (1.0 if e == 0 else math.inf)
    i, j = at
    return {"r": R, "r_limit": tol.r_limit(problem.K), "elem_ratio": worst, "beta_needed": beta_needed,
            "at": at, "got": float(c[i, j]), "want": float(r.ref[i, j]), "n": problem.M * problem.N,
            "se": se, "e0sq": r.e0 ** 2}


def _judge(m: Mapping[str, Any], problem: GemmProblem, tol: Tolerance, where: str) -> None:
    """Raise an accuracy failure naming the numbers, with a hint: errors far beyond the global statistic
    (or R > 256, i.e. errors of ~100u) are wrong values, not a precision shortfall."""
    over_r = m["r"] > m["r_limit"] and m.get("n", R_MIN_ELEMENTS) >= R_MIN_ELEMENTS
    over_e = m["elem_ratio"] > 1.0
    if not (over_r or over_e):
        return
    i, j = m["at"]
    if m["elem_ratio"] > _GROSS * max(1.0, m["r"]) or m["r"] > 256:
        hint = "wrong values: indexing, tail or race?"
    elif over_r:
        hint = ("fp16 accumulation or reduced-precision inputs?" if not tol.acc_chunk
                else "less accurate than an fp16 accumulator updated every 16 products")
    else:
        hint = "a few elements off"
    glob = (f"error {m['r']:.2f}x that of the correctly rounded result (limit {m['r_limit']:.2f}, {tol.name} "
            f"accumulation); " if over_r else "")
    raise _fail("accuracy", f"{glob}worst C[{i},{j}] = {m['got']:.6g}, expected {m['want']:.6g}, "
                            f"{m['elem_ratio']:.3g}x its element bound, at {problem.mnk} {where} ({hint})",
                **{k: m[k] for k in ("r", "r_limit", "elem_ratio", "beta_needed")})


def _accuracy_trial(cand, g: _Guarded, tol: Tolerance, seed: int, during: str):
    """Random-normal inputs from ``seed`` into ``g``, one guarded call, measured against fp64: (C, measures)."""
    a, b = _normal_inputs(g.problem, g.device, seed)
    g.load(a, b)
    c = _call(cand, g, during)
    return c, _measure(c, _reference(a, b, g.problem.dtype), g.problem, tol)


# ---------------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------------
def _device(device):
    torch = _torch()
    return torch.device(device)


def _run_check(name: str, body: Callable[[], Mapping[str, Any]]) -> CheckResult:
    torch = _torch()
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            stats = dict(body())
    except _Fail as f:
        r = f.result
        return CheckResult(r.name, False, r.reason, {**r.stats, "check": name, "seconds": time.perf_counter() - t0})
    stats["seconds"] = time.perf_counter() - t0
    return CheckResult(name, True, "", stats)


def check_nan_fill(cand: Candidate, problem: GemmProblem, device="cuda", seed: int = 0) -> CheckResult:
    """One call on random data with C pre-filled with NaN: every element written, nothing else touched."""
    dev = _device(device)

    def body():
        g = _Guarded(problem, dev, seed)
        g.load(*_normal_inputs(problem, dev, seed))
        _call(cand, g, "nan_fill")
        return {}

    return _run_check("nan_fill", body)


STREAM_BLOCK_MS = 20.0
STREAM_PROBE_MS = 2.0


def check_stream_order(cand: Candidate, problem: GemmProblem, device="cuda", seed: int = 0,
                       block_ms: float = STREAM_BLOCK_MS) -> CheckResult:
    """The work runs on torch's current stream. A fresh torch stream (non-blocking, as torch's pool streams
    are) is made current and held busy by a device sleep of ``block_ms``; the call must queue behind it. C,
    read on a second stream ~2 ms after the call returns while the current stream is still blocked, must
    still be all NaN. A kernel launched on the legacy default stream (``<<<grid, block, smem>>>`` with no
    stream), the per-thread stream or a stream of its own writes C at once and fails: inside a CUDA graph
    capture or any serving stack's side stream it would run unordered (its events time nothing, its graph
    is empty). CPU tensors: nothing to check."""
    dev = _device(device)
    torch = _torch()

    def body():
        if dev.type != "cuda":
            return {"skipped": "not a CUDA device"}

        g = _Guarded(problem, dev, seed)
        g.load(*_normal_inputs(problem, dev, seed))
        cur, probe = torch.cuda.Stream(device=dev), torch.cuda.Stream(device=dev)
        c = g.views["c"]
        for ms in (block_ms, 8 * block_ms):
            c.fill_(float("nan"))
            _sync(dev)
            watched = _watched()
            with torch.cuda.stream(cur):
                torch.cuda._sleep(int(ms * 1e3 * max_sm_mhz(dev.index or 0)))  # >= ms at any SM clock
                t0 = time.perf_counter()
                try:
                    cand(*g.args())
                except Exception as e:  # noqa: BLE001
                    _restore(watched)
                    raise _fail("crash", f"{type(e).__name__}: {e} (during stream_order)") from None
                t_call = time.perf_counter() - t0
            _restore(watched)
            time.sleep(STREAM_PROBE_MS * 1e-3)  # time for work on another stream to start writing
            with torch.cuda.stream(probe):
                written = int((~torch.isnan(c)).sum())  # on the probe stream, not behind the sleep
            t_probe = time.perf_counter() - t0
            _sync(dev)
            if t_probe * 1e3 < 0.5 * ms:  # conclusive: the current stream was still blocked when probed
                if written:
                    raise _fail("stream_order", f"{written} of {c.numel()} elements of C were written while torch's "
                                                f"current stream was still blocked ({t_probe * 1e3:.1f} ms into a "
                                                f"{ms:g} ms device sleep queued before the call): the work does not "
                                                f"run on torch's current stream (legacy default stream, per-thread "
                                                f"stream or a stream of its own)", elements=written)
                if bool(torch.isnan(c).any()):
                    raise _fail("stream_order", "C is incomplete after the current stream drained (launched on a "
                                                "side stream that was not joined?)")
                return {"block_ms": ms, "call_ms": t_call * 1e3, "probe_ms": t_probe * 1e3}
        raise _fail("stream_order", f"inconclusive: the call held the host {t_call * 1e3:.1f} ms while the current "
                                    f"stream was blocked for {ms:g} ms (does it synchronize the device or the stream?)")

    return _run_check("stream_order", body)


def _exact_mismatch(c, ref, problem: GemmProblem, seed: int) -> None:
    """Raise the exact_int failure unless C equals the exact integer product ``ref`` (fp64) element for element."""
    c = c.double()
    bad = c != ref
    if bool(bad.any()):
        idx = bad.nonzero()
        i, j = (int(x) for x in idx[0])
        rows, cols = idx[:, 0], idx[:, 1]
        raise _fail("exact_int", f"{int(bad.sum())} of {bad.numel()} elements wrong on integer inputs at "
                                 f"{problem.mnk} seed {seed}, first C[{i},{j}] = {float(c[i, j]):g}, expected "
                                 f"{float(ref[i, j]):g}; wrong rows {int(rows.min())}..{int(rows.max())}, cols "
                                 f"{int(cols.min())}..{int(cols.max())}", elements=int(bad.sum()))


def check_exact_int(cand: Candidate, problem: GemmProblem, device="cuda", seeds: Sequence[int] = (0, 1)) -> CheckResult:
    """Small-integer inputs whose product is exact in the output dtype: C must match it exactly."""
    dev = _device(device)

    def body():
        g = _Guarded(problem, dev, seeds[0])
        for seed in seeds:
            a, b = _int_inputs(problem, dev, seed)
            g.load(a, b)
            c = _call(cand, g, f"exact_int seed {seed}")
            _exact_mismatch(c, a.double() @ b.double(), problem, seed)
        return {"seeds": list(seeds)}

    return _run_check("exact_int", body)


def accuracy_seeds(problem: GemmProblem, seeds: Sequence[int]) -> list[int]:
    """The seeds the accuracy check draws: ``seeds``, and on an output of fewer than R_MIN_ELEMENTS elements more of
    them (derived from the last) until R is judged over that many pooled elements (at most _POOL_MAX_TRIALS trials;
    an output too small for that is judged element by element only)."""
    n, trials = problem.M * problem.N, list(seeds)
    if n < R_MIN_ELEMENTS and n * _POOL_MAX_TRIALS >= R_MIN_ELEMENTS:
        extra = -(-R_MIN_ELEMENTS // n) - len(trials)
        trials += [trials[-1] + 7919 * (i + 1) for i in range(max(0, extra))]
    return trials


def check_accuracy(cand: Candidate, problem: GemmProblem, device="cuda", seeds: Sequence[int] = (0, 1, 2),
                   tolerance: Tolerance | None = None) -> CheckResult:
    """Random-normal inputs, one fresh seed per trial, against the fp64 product (``Tolerance``)."""
    dev = _device(device)
    tol = tolerance or tolerance_for(problem)

    n = problem.M * problem.N
    trials = accuracy_seeds(problem, seeds)

    def body():
        g = _Guarded(problem, dev, trials[0])
        worst: dict[str, Any] = {}
        se = e0sq = 0.0
        for seed in trials:
            _, m = _accuracy_trial(cand, g, tol, seed, f"accuracy seed {seed}")
            _judge(m, problem, tol, f"seed {seed}")
            se, e0sq = se + m["se"], e0sq + m["e0sq"]
            if not worst or m["r"] > worst["r"]:
                worst = {"r": m["r"], "r_limit": m["r_limit"], "seed": seed}
            for k in ("elem_ratio", "beta_needed"):
                worst[k] = max(worst.get(k, -math.inf), m[k])
        if n < R_MIN_ELEMENTS:  # R over the pooled trials
            pooled = {**m, "r": math.sqrt(se / e0sq) if e0sq > 0 else (1.0 if se == 0 else math.inf),
                      "n": n * len(trials), "elem_ratio": 0.0}
            _judge(pooled, problem, tol, f"{len(trials)} seeds pooled from {trials[0]}")
            worst["r"] = pooled["r"]
        return {**worst, "seeds": list(trials) if len(trials) <= 8 else len(trials), "tolerance": tol.name}

    return _run_check("accuracy", body)


def check_output(c, a, b, problem: GemmProblem, tolerance: Tolerance | None = None) -> CheckResult:
    """A product already computed on the caller's own operands (a model's activations and weights): ``c`` [M, N]
    against the fp64 product of ``a`` [M, K] and ``b`` [K, N] with the accuracy check's bounds (the global R
    statistic, judged from R_MIN_ELEMENTS outputs up, and the element-wise bound)."""
    tol = tolerance or tolerance_for(problem)

    def body():
        m = _measure(c, _reference(a, b, problem.dtype), problem, tol)
        _judge(m, problem, tol, "on the given operands")
        return {k: m[k] for k in ("r", "r_limit", "elem_ratio", "beta_needed")} | {"tolerance": tol.name}

    return _run_check("accuracy", body)


def check_second_call(cand: Candidate, problem: GemmProblem, device="cuda", seeds: Sequence[int] = (0, 1),
                      tolerance: Tolerance | None = None) -> CheckResult:
    """Two calls on the same buffers, refilled in place with new inputs in between: both must be right."""
    dev = _device(device)
    tol = tolerance or tolerance_for(problem)

    def body():
        g = _Guarded(problem, dev, seeds[0])
        for n, seed in enumerate(seeds[:2], 1):
            _, m = _accuracy_trial(cand, g, tol, seed, f"second_call call {n}")
            try:
                _judge(m, problem, tol, f"seed {seed}")
            except _Fail as f:
                raise _fail("second_call", f"call {n} of 2 on the same buffers (new inputs in place) is wrong: "
                                           f"{f.result.reason}" + (" (cached result?)" if n > 1 else "")) from None
        return {}

    return _run_check("second_call", body)


MEMO_REPEATS = 8  # calls on one input set before the inputs change in place: arms a memo that waits a few calls


def check_memo(cand: Candidate, problem: GemmProblem, device="cuda", seed: int = 0,
               tolerance: Tolerance | None = None) -> CheckResult:
    """Calls a remembered output would answer. ``MEMO_REPEATS`` calls on one input set in the same buffers (a memo
    keyed on the pointers and armed after a few calls fires from there), then in place, each call checked against
    the fp64 product: all new inputs; one row of A new; one element of A changed; one column of B new; one element
    of B changed (B in both forms). A memo keyed on part of the inputs (a row, a sampled checksum, a few elements),
    one keeping several outputs, and a kernel recomputing only the rows whose sampled elements changed all replay a
    stale answer in one of them. A key sampling both operands misses only if both changed elements fall in its
    samples (one in 97 times one in 89 for a stride-97/89 checksum). The changed row, elements and column are drawn
    from ``seed``, away from the first row and column where M, N, K allow (where a cheap key looks first)."""
    dev = _device(device)
    tol = tolerance or tolerance_for(problem)
    M, N, K = problem.M, problem.N, problem.K

    def pick(n: int, rng: random.Random) -> int:
        return rng.randrange(1, n) if n > 1 else 0

    def body():
        rng = random.Random(seed)
        g = _Guarded(problem, dev, seed)
        a, b = _normal_inputs(problem, dev, seed)
        g.load(a, b)
        for i in range(MEMO_REPEATS):
            g.views["c"].fill_(float("nan"))
            c = _call(cand, g, f"memo repeat {i + 1} of {MEMO_REPEATS}")
        _memo_judge(c, a, b, problem, tol, f"the {MEMO_REPEATS}th call on one input set")
        a, b = _normal_inputs(problem, dev, seed + 1)
        fresh_a, fresh_b = _normal_inputs(problem, dev, seed + 2)
        i = pick(M, rng)
        a_row = a.clone()
        a_row[i] = fresh_a[i]
        ii, kk = pick(M, rng), pick(K, rng)
        a_elem = a_row.clone()
        s = K ** -0.25
        old = float(a_elem[ii, kk])
        a_elem[ii, kk] = math.copysign(abs(old) + 4 * s, -old if old else 1.0)  # a change no rounding hides
        j = pick(N, rng)
        b_col = b.clone()
        b_col[:, j] = fresh_b[:, j]
        kb, jb = pick(K, rng), pick(N, rng)
        b_elem = b_col.clone()
        old = float(b_elem[kb, jb])
        b_elem[kb, jb] = math.copysign(abs(old) + 4 * s, -old if old else 1.0)
        steps = ((a, b, "all inputs new, in place"), (a_row, b, f"only row {i} of A new"),
                 (a_elem, b, f"only A[{ii},{kk}] changed"), (a_elem, b_col, f"only column {j} of B new"),
                 (a_elem, b_elem, f"only B[{kb},{jb}] changed"))
        for x, y, what in steps:
            g.load(x, y)
            c = _call(cand, g, f"memo: {what}")
            _memo_judge(c, x, y, problem, tol, what)
        return {"repeats": MEMO_REPEATS}

    return _run_check("memo", body)


def _memo_judge(c, a, b, problem: GemmProblem, tol: Tolerance, what: str) -> None:
    try:
        _judge(_measure(c, _reference(a, b, problem.dtype), problem, tol), problem, tol, f"({what})")
    except _Fail as f:
        raise _fail("memo", f"after calls on other inputs in the same buffers, {what}: the output is not the product "
                            f"of the inputs the call read ({f.result.reason.split(': ', 1)[-1]}); a remembered "
                            f"output replayed?") from None


def verify(cand: Candidate, problem: GemmProblem, device="cuda", *, seeds: Sequence[int] | None = None, trials: int = 3,
           tolerance: Tolerance | None = None, cuda_l2: bool = False, cuda_l2_iterations: int = 100) -> Verdict:
    """Run the battery on a prepared candidate; stop at the first failure.

    ``seeds`` are the accuracy trials' seeds (default: ``trials`` fresh random ones, so a candidate cannot
    know them); the other checks draw theirs from a generator seeded by ``seeds[0]`` when given.
    ``cuda_l2=True`` also runs ``cuda_l2_check`` and attaches it (it does not affect ``passed``)."""
    rng = random.Random(seeds[0]) if seeds else random.SystemRandom()
    seeds = list(seeds) if seeds else [rng.randrange(2 ** 31) for _ in range(trials)]
    draw = lambda n: [rng.randrange(2 ** 31) for _ in range(n)]  # noqa: E731
    t0 = time.perf_counter()
    plan = [
        lambda: check_nan_fill(cand, problem, device, draw(1)[0]),
        lambda: check_stream_order(cand, problem, device, draw(1)[0]),
        lambda: check_exact_int(cand, problem, device, draw(2)),
        lambda: check_accuracy(cand, problem, device, seeds, tolerance),
        lambda: check_second_call(cand, problem, device, draw(2), tolerance),
        lambda: check_memo(cand, problem, device, draw(1)[0], tolerance),
    ]
    checks: list[CheckResult] = []
    for run in plan:
        checks.append(run())
        if not checks[-1].passed:
            break
    passed = all(c.passed for c in checks)
    if passed:  # every call also went through these
        checks += [CheckResult(n, True) for n in ("guard_band", "inputs_unchanged", "stream", "tamper", "alias",
                                                  "output")]
    acc = next((c.stats for c in checks if c.name == "accuracy" and c.passed), {})
    stats = {"seeds": seeds, "seconds": time.perf_counter() - t0,
             **{k: acc[k] for k in ("r", "r_limit", "elem_ratio", "tolerance") if k in acc}}
    l2 = cuda_l2_check(cand, problem, device, iterations=cuda_l2_iterations) if cuda_l2 else None
    reason = "" if passed else checks[-1].reason
    return Verdict(passed, reason, tuple(checks), stats, l2)


# ---------------------------------------------------------------------------------------------------
# CUDA-L2's own check
# ---------------------------------------------------------------------------------------------------
def cuda_l2_check(cand: Candidate, problem: GemmProblem, device="cuda", *, iterations: int = 100,
                  max_seconds: float = 60.0, padding: tuple[int, int, int] = (0, 0, 0), seed: int | None = None) -> CheckResult:
    """CUDA-L2's ``zero_one_correctness_check.py``, named as such (its semantics, our code).

    Per iteration: A, B drawn from {0, 1} ({0, 0, 1} when max(M,N,K) > 8192); truth = the CPU fp32 product
    rounded to the dtype; elements with |truth| > 2047 (255 for bf16) ignored. Operands padded with zeros
    to ``padding`` = (pad_m, pad_n, pad_k) (its tile multiples) sit after 16384 random elements and before
    16384 more; C is zero-filled (not NaN). Fails on any change to those bands ("memory overflow"), on
    NaN/Inf, or if the mean over iterations of the max |C - truth| is not exactly 0. At most
    ``iterations`` iterations and ``max_seconds`` (100 and 60 there). It cannot see fp16 accumulation:
    0/1 inputs make every partial sum a small integer, exact in fp16.
    """
    torch = _torch()
    dev = _device(device)
    dt = torch_dtype(problem.dtype)
    M, N, K = problem.M, problem.N, problem.K
    pm, pn, pk = padding
    Mp, Np, Kp = M + pm, N + pn, K + pk
    limit = 2047.0 if problem.dtype == "fp16" else 255.0
    bar = 16384
    gen = torch.Generator(device=dev).manual_seed(random.SystemRandom().randrange(2 ** 31) if seed is None else seed)
    values = torch.tensor([0.0, 1.0] if max(M, N, K) <= 8192 else [0.0, 0.0, 1.0], dtype=dt, device=dev)

    def guarded(rows, cols):
        big = torch.randn(rows * cols + 2 * bar, dtype=dt, device=dev, generator=gen)
        view = big[bar:bar + rows * cols].view(rows, cols)
        view.zero_()
        return big, view

    diffs, overflow, t0 = [], False, time.perf_counter()
    with torch.no_grad():
        for _ in range(iterations):
            if time.perf_counter() - t0 > max_seconds:
                break
            a = values[torch.randint(0, len(values), (M, K), device=dev, generator=gen)]
            b = values[torch.randint(0, len(values), (K, N), device=dev, generator=gen)]
            truth = (a.cpu().float() @ b.cpu().float()).to(dt)
            mask = truth.abs() > limit
            bufs = [guarded(Mp, Kp), guarded(Kp, Np), guarded(Np, Kp), guarded(Mp, Np)]
            (_, av), (_, bv), (_, btv), (_, cv) = bufs
            av[:M, :K] = a
            bv[:K, :N] = b
            btv.copy_(bv.t())  # B^T of the padded B, [Np, Kp]: the bytes of its b_col_major
            backups = [big.clone() for big, _ in bufs]
            _sync(dev)
            try:
                cand(av, bv, btv, cv)
                _sync(dev)
            except Exception as e:
                return CheckResult("cuda_l2", False, f"cuda_l2: {type(e).__name__}: {e}", {"iterations": len(diffs)})
            for (big, _), was in zip(bufs, backups):
                if not (torch.equal(big[:bar], was[:bar]) and torch.equal(big[-bar:], was[-bar:])):
                    overflow = True
            out = cv[:M, :N].cpu().float()
            diff = (out - truth.float()).abs()
            diff[mask] = 0.0
            diffs.append(float(diff.max()))
    stats = {"iterations": len(diffs), "avg_max_diff": sum(diffs) / max(len(diffs), 1)}
    if overflow:
        return CheckResult("cuda_l2", False, "cuda_l2: memory overflow detected.", stats)
    avg = stats["avg_max_diff"]
    if not math.isfinite(avg):
        return CheckResult("cuda_l2", False, f"cuda_l2: has nan or Inf value: {avg}", stats)
    if avg > 0.0:
        return CheckResult("cuda_l2", False, f"cuda_l2: diff ({avg:.6f}) exceeds 0", stats)
    return CheckResult("cuda_l2", True, "", stats)


# ---------------------------------------------------------------------------------------------------
# Calibration and result rows
# ---------------------------------------------------------------------------------------------------
def _candidates_for(candidates, problem: GemmProblem) -> list:
    return list(candidates) if isinstance(candidates, (list, tuple)) else list(candidates(problem))


def _prepare(cand, problem: GemmProblem, bufs, timer) -> str:
    """Call ``prepare`` once (protocol 'graph'); returns '' or the error as a reason."""
    try:
        cand.prepare(problem, bufs, "graph", timer)
        return ""
    except Exception as e:
        return f"prepare: {type(e).__name__}: {e}"


def calibrate(problems: Iterable[GemmProblem], candidates, seeds: Iterable[int], device="cuda", *,
              timer=None, tolerance: Tolerance | None = None) -> list[dict]:
    """Per (problem, candidate, seed): R, its limit, the worst element's ratio to its bound and the beta it
    would need, for setting ``Tolerance``. ``candidates``: a list, or ``problem -> list`` (e.g.
    ``vendor_candidates``); each is prepared once per problem. One fp64 reference per (problem, seed) is
    shared by all candidates. A call that breaks the harness gives a row with ``error`` set."""
    torch = _torch()
    dev = _device(device)
    seeds = list(seeds)
    rows: list[dict] = []
    with torch.no_grad():
        for p in problems:
            tol = tolerance or tolerance_for(p)
            cands = _candidates_for(candidates, p)
            bufs = make_buffers(p, dev)
            errors = {id(c): _prepare(c, p, bufs, timer) for c in cands}
            del bufs
            g = _Guarded(p, dev)
            for seed in seeds:
                a, b = _normal_inputs(p, dev, seed)
                ref = _reference(a, b, p.dtype)
                for cand in cands:
                    row = {"mnk": p.mnk, "dtype": p.dtype, "acc": p.acc, "layout": getattr(cand, "layout", ""),
                           "candidate": getattr(cand, "name", repr(cand)), "seed": seed, "tolerance": tol.name,
                           "r": math.nan, "r_limit": tol.r_limit(p.K), "elem_ratio": math.nan,
                           "beta_needed": math.nan, "error": errors[id(cand)]}
                    if not row["error"]:
                        g.load(a, b)
                        try:
                            m = _measure(_call(cand, g, f"calibrate seed {seed}"), ref, p, tol)
                            row.update({k: m[k] for k in ("r", "r_limit", "elem_ratio", "beta_needed")})
                        except _Fail as f:
                            row["error"] = f.result.reason
                    rows.append(row)
                del ref
    return rows


def calibration_summary(rows: Iterable[Mapping[str, Any]]) -> list[dict]:
    """Per (tolerance, dtype, candidate) over ``calibrate`` rows: how many, how many failed the current
    constants, and the worst R, R/limit, element ratio and needed beta, with the shape and seed of the worst R."""
    groups: dict[tuple, dict] = {}
    for r in rows:
        g = groups.setdefault((r["tolerance"], r["dtype"], r["candidate"]), {
            "tolerance": r["tolerance"], "dtype": r["dtype"], "candidate": r["candidate"], "n": 0, "errors": 0,
            "fails": 0, "r_max": 0.0, "r_over_limit_max": 0.0, "elem_ratio_max": 0.0, "beta_needed_max": 0.0,
            "worst": ""})
        g["n"] += 1
        if r["error"]:
            g["errors"] += 1
            continue
        g["fails"] += int(r["r"] > r["r_limit"] or r["elem_ratio"] > 1.0)
        if r["r"] > g["r_max"]:
            g["r_max"], g["worst"] = r["r"], f"{r['mnk']} seed {r['seed']}"
        g["r_over_limit_max"] = max(g["r_over_limit_max"], r["r"] / r["r_limit"])
        g["elem_ratio_max"] = max(g["elem_ratio_max"], r["elem_ratio"])
        g["beta_needed_max"] = max(g["beta_needed_max"], r["beta_needed"])
    return list(groups.values())


def verify_rows(problems: Iterable[GemmProblem], candidates, device="cuda", *, seeds: Sequence[int] | None = None,
                trials: int = 3, cuda_l2: bool = True, cuda_l2_iterations: int = 100, timer=None) -> list[dict]:
    """Rows for a results CSV: per (problem, candidate) one row ``check='battery'`` (ours: ``verified``,
    ``reason``, the failing check and the accuracy statistics) and, with ``cuda_l2``, one ``check='cuda_l2'``."""
    dev = _device(device)
    rows: list[dict] = []
    for p in problems:
        bufs = make_buffers(p, dev)
        for cand in _candidates_for(candidates, p):
            base = {"mnk": p.mnk, "dtype": p.dtype, "acc": p.acc, "layout": getattr(cand, "layout", ""),
                    "candidate": getattr(cand, "name", repr(cand))}
            err = _prepare(cand, p, bufs, timer)
            if err:
                rows.append({**base, "check": "battery", "verified": False, "reason": err, "failed_check": "prepare"})
                continue
            v = verify(cand, p, dev, seeds=seeds, trials=trials, cuda_l2=cuda_l2, cuda_l2_iterations=cuda_l2_iterations)
            rows.append({**base, "check": "battery", "verified": v.passed, "reason": v.reason,
                         "failed_check": v.failed_check, **{k: v.stats.get(k, "") for k in
                                                              ("r", "r_limit", "elem_ratio", "tolerance", "seconds")}})
            if v.cuda_l2 is not None:
                rows.append({**base, "check": "cuda_l2", "verified": v.cuda_l2.passed, "reason": v.cuda_l2.reason,
                             "failed_check": "" if v.cuda_l2.passed else "cuda_l2",
                             "iterations": v.cuda_l2.stats.get("iterations", 0)})
    return rows


# ---------------------------------------------------------------------------------------------------
# The accuracy measure for other checks of C (outputs.py: C after a timed call)
# ---------------------------------------------------------------------------------------------------
class AccuracyError(Exception):
    """C is outside the accuracy bounds; ``detail`` is the accuracy check's reason without its name."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


def accuracy(c, a, b, problem: GemmProblem, tol: Tolerance) -> dict[str, Any]:
    """The accuracy check's measures (R, its limit, the worst element) of ``c`` against the fp64 product ``a @ b``
    (``problem`` gives the shape of ``c`` and the dtype)."""
    return _measure(c, _reference(a, b, problem.dtype), problem, tol)


def judge(m: Mapping[str, Any], problem: GemmProblem, tol: Tolerance, where: str) -> None:
    """Raise :class:`AccuracyError` when the measures ``m`` (from :func:`accuracy`) break the accuracy bounds."""
    try:
        _judge(m, problem, tol, where)
    except _Fail as e:
        raise AccuracyError(e.result.reason.split(": ", 1)[-1]) from None
