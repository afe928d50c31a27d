"""Serving the library: ``gemmrl.mm``, ``gemmrl.linear``, the torch custom op ``gemmrl::mm`` and ``warmup``.

A call ``mm(a, b, out=None)`` computes ``a @ b`` for ``a`` [..., K] (leading dims flattened into M) and ``b``
[K, N], fp16 or bf16, fp32 accumulation (torch.matmul's semantics with reduced-precision reductions off).

How a call is served, per (shapes, strides, dtypes, devices) of its operands, decided once:
- ``b`` row-major is layout ``nn``; ``b`` the transpose of a row-major [N, K] tensor (``w.t()``, what
  ``nn.Linear`` holds) is ``tn``. The library is asked for that layout, for this GPU model, at this shape (exact
  entry, else a bucket holding M): an eager call takes the entry measured in ``offline`` (host-timed, what eager
  PyTorch sees), a call inside CUDA-graph capture the one measured in ``graph`` (device time).
- An entry is a Triton config (compiled once, launched through its C launcher on torch's current stream), a
  CUTLASS SM90 config with its scheduler knobs (built with nvcc once and cached, loaded with ctypes, launched on
  torch's current stream; CUDA tensors only) or the vendor path measured fastest there (cuBLAS/cuBLASLt through
  our extension, with the measured algorithm where this cuBLASLt offers it, or torch.matmul). With
  ``GEMMRL_VENDOR_TUNE=here`` a cuBLASLt-autotuned entry is autotuned on this machine at build time instead (the
  same screen-and-confirm rule as the baseline, its choice cached per machine) rather than pinned: the autotune's
  pick among near-tie algorithms moves from machine to machine by more than the noise rule's 2%.
- A shape not measured here (no entry, an M between tuned shapes, an entry relabelled from another GPU model) or
  whose entry cannot be built or fails its check here: the fallback race, once per bucket of M (powers of two) on
  this GPU, cached per GPU, driver and cuBLASLt version: the lean cuBLAS / cuBLASLt plans and torch.matmul against
  the generated kernels the library measured for the shape or at the nearest tuned M below and above it
  (serve/vendor_choice.py), at a launch-bound shape a few small Triton tiles (serve/launch_bound.py), at M <= 8
  a few Triton GEMV configs (serve/gemv_rows.py), and at M <= 32 two decode-family configs where nvcc is found
  (serve/decode_rows.py); a generated winner serves after the full correctness battery at
  this shape (``GEMMRL_VENDOR_FALLBACK=off`` for torch.matmul and entries as they are). Eager calls take the plan
  raced cold (operands from device memory), graph replays the one raced warm (``GEMMRL_GRAPH_RACE=cold``: graph
  replays too take the cold race's, as a layer inside a whole model's graph reads its weight from device memory).
- ``a`` not row-major contiguous, ``b`` in neither layout, pointers not 16-byte aligned, or a kernel the GPU's
  validity predicate rejects: ``torch.matmul`` (cuBLAS, which reads any transpose as is).
- Nothing compiles or races inside CUDA-graph capture: a shape first seen during capture is served by torch.matmul
  (and built at its next eager call). ``warmup(shapes)`` builds ahead of time. A call's first sight spends at most
  ``GEMMRL_FIRST_CALL_BUILD_S`` seconds (default 2; 0: none, inf: no cap) building generated contenders (Triton
  compiles, nvcc builds; checked before each build starts, so one build may run past it); the rest are left out of
  its race, its choice is cached under the contenders it raced (the next process races all of them again), and
  ``warmup`` of the shape builds them and races again. ``warmup`` and ``served_by`` build with no cap. A kernel that fails to build or
  disagrees with an fp32 reference at build time is not served (a warning says why; the vendor fallback serves).
- Entries measured under other torch/Triton/CUDA versions are run through the full correctness battery before first
  use.

Under torch.compile (and for tensor subclasses) the call goes through the custom op ``torch.ops.gemmrl.mm``
(register_fake for tracing, dynamic M included; autograd registered). Eager autograd (an operand requires grad
and grad mode is on) goes through an autograd.Function with the same backward, which costs less host time per
call than the op's dispatcher; backward runs its two GEMMs through ``mm`` too. Plain eager calls go straight to
the served kernel.
One served kernel per shape: its split-K workspace is shared, so do not run the same shape on two streams
at once.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from ..candidate import Buffers, make_buffers
from ..kernels.registry import family
from ..library import PROTOCOL_ORDER, Entry, Library, load_default
from ..problem import GemmProblem, parse_mnk
from ..verify import verify
from . import decode_rows, fastpath, gemv_rows, launch_bound, launchers, vendor_choice
from .launchers import DispatchError

_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_Tensor = torch.Tensor


@dataclass(frozen=True)
class Served:
    """How one call signature is served: ``eager``/``graph`` are ``f(a, b, out)`` taking the call's tensors."""
    eager: Callable
    graph: Callable
    out_shape: tuple
    dtype: Any
    dev: int
    device: Any
    eager_desc: str
    graph_desc: str
    eager_spec: tuple = ()
    graph_spec: tuple = ()
    deferred: tuple = ()  # generated contenders a call's first sight left out of its race (GEMMRL_FIRST_CALL_BUILD_S)


FIRST_CALL_BUILD_ENV = "GEMMRL_FIRST_CALL_BUILD_S"
FIRST_CALL_BUILD_S = 2.0  # seconds a call's first sight may spend building generated contenders (warmup: no cap)
_AHEAD = threading.local()  # building ahead of the calls (warmup, served_by, the bench's preparation) on this thread
_clock: Callable[[], float] = time.perf_counter  # what a build budget reads


@contextlib.contextmanager
def building_ahead():
    """Builds inside this block are made ahead of the calls they serve (``warmup``, ``served_by``, a bench's
    preparation): a first sight builds every generated contender, whatever ``GEMMRL_FIRST_CALL_BUILD_S`` says."""
    _AHEAD.depth = getattr(_AHEAD, "depth", 0) + 1
    try:
        yield
    finally:
        _AHEAD.depth -= 1


def first_call_build_s() -> float:
    """The seconds a first sight may spend building generated contenders: ``GEMMRL_FIRST_CALL_BUILD_S`` (default
    FIRST_CALL_BUILD_S; 0 builds none, ``inf`` has no cap); no cap while building ahead. A bad value raises
    DispatchError saying what to give."""
    if getattr(_AHEAD, "depth", 0):
        return math.inf
    raw = os.environ.get(FIRST_CALL_BUILD_ENV, "").strip()
    if not raw:
        return FIRST_CALL_BUILD_S
    try:
        v = float(raw)
    except ValueError:
        v = math.nan
    if not v >= 0:
        raise DispatchError(f"{FIRST_CALL_BUILD_ENV}={raw!r}: give the seconds a call's first sight may spend "
                            "building generated contenders, a number >= 0 (0: none, inf: no cap); gemmrl.warmup "
                            "builds the rest")
    return v


class _BuildBudget:
    """What a first sight may still spend building generated contenders (shared by its graph and cold races), and
    the contenders it left out: once the budget is spent, no new build starts (one build may overrun it); under a
    cap, a contender whose family builds with nvcc and is not built yet (``ready`` false: tens of seconds) waits for
    warmup from the start."""

    def __init__(self, seconds: float):
        self.left = seconds
        self.capped = math.isfinite(seconds)
        self.deferred: list[str] = []
        self.built: set[str] = set()

    def build(self, name: str, make: Callable[[], Any], ready: Callable[[], bool] = lambda: True) -> Any:
        """``make()`` timed against the budget; None (``name`` deferred) once the budget is spent, or under a cap
        where ``ready()`` says the build is an nvcc run, unless ``name`` was built before (the cold race launches
        again what the graph race built: both races time the same contenders)."""
        if name in self.deferred:
            return None
        if (self.left <= 0 or self.capped and not ready()) and name not in self.built:
            self.deferred.append(name)
            return None
        self.built.add(name)
        t0 = _clock()
        try:
            return make()
        finally:
            self.left -= _clock() - t0

    def raced(self, names: Iterable[str]) -> tuple[str, ...]:
        """``names`` less the deferred: what a race that ran with this budget raced (its choice's cache key)."""
        return tuple(n for n in names if n not in self.deferred)


def _spec(fn: Callable, spec: tuple) -> tuple:
    """The compiled hot path's spec for a served launcher: its own, torch.matmul's (kind 3), or a Python call."""
    return spec or ((3, fn) if fn is launchers.TORCH_MM else (0, fn))


class _State:
    def __init__(self) -> None:
        self.library: Library | None = None
        self.table: dict[tuple, Served] = {}      # call signature -> served
        self.fast: dict[tuple, Served] = {}       # (a.shape, b.shape, b.stride(), dtype, device) -> served, a row-major
        self.cfast: dict[tuple, tuple] = {}       # the same keys -> the C hot path's entries (fastpath.c)
        self.ctorch: Any = None                   # the torch-built hot path's module (fastpath_torch.cpp), if serving
        self.built: dict[tuple, Served] = {}      # (M, N, K, dtype, layout, dev) -> served, shared by signatures
        self.in_capture: dict[tuple, Served] = {}  # the same keys -> a cached vendor choice served inside capture
        self.gpu: dict[int, tuple[str, dict]] = {}
        self.lock = threading.RLock()
        self.warned: set[str] = set()
        self.fastpath_tried = False
        self.choices: dict[Any, vendor_choice.ChoiceCache] = {}  # vendor identity -> its raced choices


_S = _State()
_TABLE = _S.table
_FAST = _S.fast
_CFAST = _S.cfast


def use_library(lib: Library | str | os.PathLike | None) -> Library:
    """Serve from ``lib`` (a Library or a JSON path); None reloads the default (package + user library).
    Clears everything built so far. A file that is not a usable library raises LibraryError (and the library
    served so far stays)."""
    if lib is not None and not isinstance(lib, (Library, str, os.PathLike)):
        raise TypeError(f"use_library takes a Library, a library JSON path or None; got {type(lib).__name__}")
    with _S.lock:
        _S.library = Library.load(lib) if isinstance(lib, (str, os.PathLike)) else (
            lib if lib is not None else load_default(skip_unusable=True))
        _S.warned.clear()
        reset()
        return _S.library


def library() -> Library:
    if _S.library is None:
        with _S.lock:
            if _S.library is None:
                _S.library = load_default(skip_unusable=True)
    return _S.library


def reset() -> None:
    """Forget every served kernel (the next call of each shape builds again)."""
    with _S.lock:
        _forget_signatures()
        _S.built.clear()
        _S.in_capture.clear()
        _S.choices.clear()


def _forget_signatures() -> None:
    """Forget which call signature takes which served kernel (the next call of each looks it up again in what was
    built)."""
    with _S.lock:
        _S.table.clear()
        _S.fast.clear()
        _S.cfast.clear()
        if _S.ctorch is not None:
            _S.ctorch.clear()


def _warn(msg: str) -> None:
    if msg not in _S.warned:
        _S.warned.add(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=4)


# -- the call path ---------------------------------------------------------------------------------------
_capturing: Callable[[], bool] = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or (lambda: False)


def _not_tensors(a, b) -> DispatchError:
    return DispatchError(f"gemmrl.mm takes two torch.Tensors, got {type(a).__name__} and {type(b).__name__}")


def mm(a, b, out=None):
    """``a @ b`` through the library (see the module docstring); ``out`` (contiguous, right shape and dtype)
    receives the result when given, and is returned. ``out`` must not overlap ``a`` or ``b``: ``out=a`` or
    ``out=b`` raises DispatchError; an overlapping view is not checked (as with torch.matmul on CUDA)."""
    if out is not None and (out is a or out is b or not isinstance(out, _Tensor)):
        _bad_out_arg(a, b, out)
    if _is_compiling():
        return _op(a, b, out)
    return _hot(a, b, out)


# Under dynamo the call becomes the custom op (is_dynamo_compiling reads True there; one Python frame where
# is_compiling takes two). Other tracers (make_fx, non-strict export) pass fake or functional tensors, which the
# hot path hands to _slow, which sends them to the op too.
_is_compiling = getattr(torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling)


def _bad_out_arg(a, b, out):
    if not isinstance(out, _Tensor):
        raise DispatchError(f"gemmrl.mm: out must be a torch.Tensor (or None), got {type(out).__name__}")
    raise DispatchError(f"gemmrl.mm: out is {'a' if out is a else 'b'} itself; the product cannot be written over its "
                        "own input: pass a separate out (or none)")


def _hot_py(a, b, out):
    """The hot path in Python (where neither compiled one, fastpath_torch.cpp or fastpath.c, could be built): same
    lookups and checks."""
    try:
        if type(a) is not _Tensor or type(b) is not _Tensor or ((a.requires_grad or b.requires_grad)
                                                                 and torch.is_grad_enabled()):
            return _slow(a, b, out)
        # a row-major a seen before with this b (shape, strides), dtype and device
        s = _FAST.get((a.shape, b.shape, b.stride(), a.dtype, a.get_device()))
    except AttributeError:
        raise _not_tensors(a, b) from None
    if s is None or b.dtype is not s.dtype or b.get_device() != s.dev or not a.is_contiguous():
        return _mm(a, b, out)
    if out is None:
        out = torch.empty(s.out_shape, dtype=s.dtype, device=s.device)
    elif out.shape != s.out_shape or out.dtype is not s.dtype or not out.is_contiguous() or out.get_device() != s.dev:
        _bad_out(out, s)
    if s.dev >= 0 and s.graph is not s.eager and _stream_of(s.dev) and _capturing():
        s.graph(a, b, out)  # (the legacy default stream, handle 0, cannot be captured: no need to ask)
    else:
        s.eager(a, b, out)
    return out


def _stream_of(dev: int) -> int:
    global _stream_of
    _stream_of = launchers.raw_stream()  # bound on first use: nothing at import time
    return _stream_of(dev)


_hot: Callable = _hot_py


def _slow(a, b, out):
    """What the hot path hands on: fake/functional or subclassed tensors and autograd go through the custom op,
    everything else through the full path (first sight of a signature, non-contiguous a, a bad ``out``)."""
    if not isinstance(a, _Tensor) or not isinstance(b, _Tensor):
        raise _not_tensors(a, b)
    if type(a) is not _Tensor or type(b) is not _Tensor:
        return _op(a, b, out)
    if (a.requires_grad or b.requires_grad) and torch.is_grad_enabled():
        if out is not None:
            raise DispatchError(_NO_OUT)
        return _MMFunction.apply(a, b)
    return _mm(a, b, out)


def _use_fastpath() -> None:
    """Switch to a compiled hot path (once per process; keeps the Python one where none can be built): the one
    built against torch's headers, else the CPython-only one (fastpath.py says which and why)."""
    if _S.fastpath_tried:
        return
    _S.fastpath_tried = True
    mod = fastpath.load()
    if mod is not None:
        _install(mod)


def _install(mod) -> None:
    global _hot
    _S.ctorch = mod if fastpath.kind_of(mod) == "torch" else None
    if _S.ctorch is not None:
        mod.init(_Tensor, _slow, _capturing)
    elif mod is not None:
        mod.init(_Tensor, _CFAST, _slow, _capturing, torch.is_grad_enabled, torch.empty)
    _hot = _hot_py if mod is None else mod.mm


def use_hot_path(kind: str) -> None:
    """Serve through hot path ``kind`` ('torch', 'c' or 'python') from now on, forgetting what was built (for
    tests and probes that compare them; ``GEMMRL_FASTPATH`` picks for a process). Raises RuntimeError where that
    one cannot be built."""
    if kind not in ("torch", "c", "python"):
        raise ValueError(f"hot path {kind!r}: 'torch', 'c' or 'python'")
    mod = None if kind == "python" else fastpath.load_kind(kind)
    if kind != "python" and mod is None:
        raise RuntimeError(f"the {kind} hot path cannot be built here: {fastpath.why(kind)}")
    with _S.lock:
        reset()
        _S.fastpath_tried = True
        _install(mod)


def hot_path() -> str:
    """'torch' (built against torch's headers), 'c' (CPython API only) or 'python', with the reason a faster one
    is not used."""
    if _hot is _hot_py:
        return f"python ({fastpath.why() or 'not built yet'})"
    if _S.ctorch is not None:
        return "torch"
    return f"c (torch: {fastpath.why('torch') or 'not asked for'})"


def _op(a, b, out):
    if not isinstance(a, _Tensor) or not isinstance(b, _Tensor):
        raise _not_tensors(a, b)
    if out is not None:
        raise DispatchError(_NO_OUT)
    return torch.ops.gemmrl.mm(a, b)


_NO_OUT = "gemmrl.mm(out=...) is for inference: under autograd or torch.compile call gemmrl.mm(a, b) without out="


def _bad_out(out, s: Served):
    raise DispatchError(f"gemmrl.mm: out must be a contiguous {s.dtype} tensor of shape {tuple(s.out_shape)} on "
                        f"{s.device}; got {out.dtype} {tuple(out.shape)} on {out.device} "
                        f"(contiguous={out.is_contiguous()})")


def _mm(a, b, out):
    """Every call that is not on the hot path (first sight of a signature, non-contiguous a, the op's body)."""
    try:
        key = (a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, a.get_device(), b.get_device())
    except (AttributeError, TypeError):
        raise _not_tensors(a, b) from None
    s = _TABLE.get(key)
    if s is None:
        s = _miss(key, a, b)
    if out is None:
        out = torch.empty(s.out_shape, dtype=s.dtype, device=s.device)
    elif out.shape != s.out_shape or out.dtype != s.dtype or out.get_device() != s.dev or not out.is_contiguous():
        _bad_out(out, s)
    if s.dev >= 0 and _capturing():
        s.graph(a, b, out)
    else:
        s.eager(a, b, out)
    return out


def linear(x, weight, bias=None):
    """``x @ weight.T (+ bias)``, ``weight`` [N, K] as nn.Linear holds it (served in layout ``tn``). The bias is
    added by a separate elementwise kernel (our GEMMs have no bias epilogue)."""
    if not isinstance(weight, _Tensor):
        raise DispatchError(f"gemmrl.linear takes a torch.Tensor weight [N, K], got {type(weight).__name__}")
    y = mm(x, weight.t())
    if bias is None:
        return y
    if y.requires_grad or torch.compiler.is_compiling():
        return y + bias
    return y.add_(bias)


def _check(a, b) -> None:
    if a.dtype not in _DTYPES or b.dtype not in _DTYPES:
        raise DispatchError(f"gemmrl.mm serves float16 and bfloat16 tensors; got {a.dtype} and {b.dtype}. Cast them "
                            "(x.half(), x.bfloat16()) or call torch.matmul for other dtypes")
    if a.dtype != b.dtype:
        raise DispatchError(f"gemmrl.mm: a is {a.dtype} and b is {b.dtype}; give both the same dtype")
    if a.device != b.device:
        raise DispatchError(f"gemmrl.mm: a is on {a.device} and b on {b.device}; move them to one device")
    if a.dim() < 2 or b.dim() != 2:
        raise DispatchError(f"gemmrl.mm takes a [..., K] (2-D or more) and b [K, N] (2-D); got {tuple(a.shape)} "
                            f"and {tuple(b.shape)} (for a batched b use torch.matmul)")
    if a.shape[-1] != b.shape[0]:
        raise DispatchError(f"gemmrl.mm: a is {tuple(a.shape)} and b is {tuple(b.shape)}; a's last dim (K) must "
                            "equal b's first")
    if a.numel() == 0 or b.numel() == 0:
        raise DispatchError(f"gemmrl.mm: empty operand ({tuple(a.shape)} @ {tuple(b.shape)})")


def _layout(b) -> str | None:
    if b.is_contiguous():
        return "nn"
    if b.t().is_contiguous():
        return "tn"
    return None


def _miss(key: tuple, a, b) -> Served:
    """Decide how a new call signature is served (builds at most once per problem; never during capture)."""
    _check(a, b)
    K, N = b.shape
    M = a.numel() // K
    out_shape = torch.Size((*a.shape[:-1], N))
    dev = a.get_device()
    fallback = Served(launchers.torch_mm, launchers.torch_mm, out_shape, a.dtype, dev, a.device, "torch.matmul", "torch.matmul")
    layout = _layout(b)
    if not a.is_contiguous() or layout is None:
        with _S.lock:
            _TABLE[key] = fallback
            _put_hot(a, b, fallback)
        return fallback
    pkey = (M, N, K, a.dtype, layout, dev)
    with _S.lock:
        got = _S.built.get(pkey)
        if got is None:
            if dev >= 0 and _capturing():  # nothing compiles or races inside a capture; the next eager call builds
                if pkey not in _S.in_capture:
                    _S.in_capture[pkey] = _cached_in_capture(M, N, K, layout, a, b, out_shape) or fallback
                return _S.in_capture[pkey]
            got = _build(M, N, K, a.dtype, layout, a.device)
            _S.built[pkey] = got
        s = Served(got.eager, got.graph, out_shape, a.dtype, dev, a.device, got.eager_desc, got.graph_desc,
                   got.eager_spec, got.graph_spec, got.deferred)
        _TABLE[key] = s
        _FAST[_fast_key(a, b)] = s  # a is row-major here; the hot path checks that per call
        _use_fastpath()
        _put_hot(a, b, s)
        return s


def _cached_in_capture(M: int, N: int, K: int, layout: str, a, b, out_shape) -> Served | None:
    """Inside CUDA-graph capture, a shape not built yet: its bucket's cached vendor choice on this GPU (raced by an
    earlier call or process; a generated winner's race gives its vendor plan, since the battery cannot run in a
    capture), the plan made on the call's own operands: nothing compiles, races or synchronizes. None (torch.matmul
    serves) where nothing is cached, the mode is 'off', or an entry measured here serves this shape (built at the
    next eager call)."""
    try:
        m = vendor_choice.mode()
    except vendor_choice.VendorChoiceError:
        return None
    if m == "off":
        return None
    device = a.device
    gpu, _ = _identity(device)
    dt = _DTYPES[a.dtype]
    problem = GemmProblem(M, N, K, dtype=dt, acc="fp32", layout=layout)
    lib = library()
    e = lib.lookup_any(gpu, dt, "fp32", layout, PROTOCOL_ORDER["graph"], M, N, K)
    if e is not None and _measured_here(e, problem):
        return None
    try:
        if m == "heuristic":
            choice = vendor_choice.Choice("cublaslt", how="heuristic")
        else:
            cache = _choice_cache(device, gpu)
            got = cache.get(problem, tuple(sorted(_by_name(_contenders(lib, gpu, problem)))),
                            vendor_choice.graph_race())
            if got is None:
                return None
            choice = got.vendor()
        bt = b.t() if layout == "tn" else b.view(N, K)  # the form the plan reads is the call's own
        bufs = Buffers(problem, a.reshape(M, K), bt.view(K, N) if layout == "tn" else b, bt,
                       torch.empty((M, N), dtype=a.dtype, device=device))
        plan = launchers.vendor_plan(choice.kind, choice.algo, problem, bufs)
    except Exception as ex:  # noqa: BLE001 - torch.matmul serves in the capture; the next eager call builds
        _warn(f"gemmrl: the cached vendor choice for {problem.mnk} {layout} cannot serve inside capture "
              f"({type(ex).__name__}: {ex}); torch.matmul serves it there")
        return None
    desc = f"vendor: {choice.describe()}{plan.note} (cached choice, first seen inside capture)"
    return Served(plan.call, plan.call, out_shape, a.dtype, device.index, device, desc, desc, plan.spec, plan.spec)


def _fast_key(a, b) -> tuple:
    return (a.shape, b.shape, b.stride(), a.dtype, a.get_device())


def _put_hot(a, b, s: Served) -> None:
    """Hand the signature of (a, b), served by ``s``, to the compiled hot path in use (if any)."""
    if _hot is _hot_py:
        return
    eager = _spec(s.eager, s.eager_spec)
    graph = eager if s.graph is s.eager else _spec(s.graph, s.graph_spec)
    centry = (s.out_shape, s.dtype, s.dev, {"dtype": s.dtype, "device": s.device}, eager, graph, launchers.raw_stream())
    if _S.ctorch is not None:
        _S.ctorch.put(a, b, centry)  # its key holds whether a is row-major
    elif a.is_contiguous():  # the C path's table holds row-major a only (it checks that per call)
        _CFAST[_fast_key(a, b)] = centry


# -- building what serves a problem --------------------------------------------------------------------
def _identity(device) -> tuple[str, dict]:
    """(GPU model name as results rows record it, software versions) of ``device``; ('cpu', ...) on the CPU."""
    dev = device.index if device.type == "cuda" else -1
    if dev not in _S.gpu:
        try:
            import triton  # optional: a CPU install may serve without it

            tv = triton.__version__
        except ImportError:
            tv = ""
        sw = {"torch": torch.__version__, "triton": tv, "cuda": str(torch.version.cuda)}
        name = torch.cuda.get_device_properties(device).name if dev >= 0 else "cpu"
        _S.gpu[dev] = (name, sw)
    return _S.gpu[dev]


def _build(M: int, N: int, K: int, dtype, layout: str, device) -> Served:
    gpu, sw = _identity(device)
    dt = _DTYPES[dtype]
    launchers.vendor_tune()  # a bad GEMMRL_VENDOR_TUNE is the caller's error, not a kernel that failed to build
    racing = _fallback_settings() == "race" and device.type == "cuda"
    lib = library()
    problem = GemmProblem(M, N, K, dtype=dt, acc="fp32", layout=layout)
    made: dict[tuple, tuple[Callable, str, tuple]] = {}
    found: list[tuple[Entry, ...]] = []  # the generated contenders, found on the first race
    budget = _BuildBudget(first_call_build_s() if racing else math.inf)
    drawn: list[Buffers] = []  # the races' operands: drawn once, shared by the graph and the cold race

    def buffers() -> Buffers:
        if not drawn:
            drawn.append(make_buffers(problem, device, seed=1234, on_device=True))
        return drawn[0]

    def fallback(race: bool = False, protocol: str = "graph") -> tuple[Callable, str, tuple]:
        """The vendor fallback; with ``race`` raced in ``protocol`` against the generated kernels measured at or
        near M."""
        key = ("vendor", race, protocol if race else "")
        if key not in made:
            if race and not found:
                found.append(_contenders(lib, gpu, problem))
            made[key] = _vendor_fallback(problem, device, gpu, buffers, found[0] if race else (), protocol, budget)
        return made[key]

    def serve(order, raced_in: str) -> tuple[Callable, str, tuple]:
        e = lib.lookup_any(gpu, dt, "fp32", layout, order, M, N, K)
        if racing and (e is None or not _measured_here(e, problem)):  # race what was measured at or near M
            return fallback(race=True, protocol=raced_in)
        if e is None:
            return fallback()
        ek = (e.family, e.impl, e.algo)
        if ek not in made:
            got = _make(e, problem, device, sw)
            if isinstance(got, str):  # not servable here: the fallback, saying which entry it stands in for
                call, desc, spec = fallback()
                got = (call, f"{desc} (entry {e.family}:{e.impl} not served: {got})", spec)
            made[ek] = got
        return made[ek]

    if device.type == "cuda":  # the graph race first (warm: its plans timed right after the clocks settle)
        graph, gd, gs = serve(PROTOCOL_ORDER["graph"], vendor_choice.graph_race() if racing else "graph")
        eager, ed, es = serve(PROTOCOL_ORDER["eager"], "cold")  # an eager call reads its weight from HBM
    else:
        eager, ed, es = serve(PROTOCOL_ORDER["eager"], "cold")
        graph, gd, gs = eager, ed, es
    dev = device.index if device.type == "cuda" else -1
    if budget.deferred:  # what served_by says: the race ran without them; warmup builds them and races again
        note = (f" [first sight: {len(budget.deferred)} generated contender(s) not built within "
                f"{FIRST_CALL_BUILD_ENV}; gemmrl.warmup races them]")
        ed, gd = ed + note, gd + note
    return Served(eager, graph, torch.Size((M, N)), dtype, dev, device, ed, gd, es, gs, tuple(budget.deferred))


MAX_CONTENDERS = 4  # generated kernels a first sight races beside the vendor plans (each is built, then timed)


def _measured_here(e: Entry, problem: GemmProblem) -> bool:
    """``e`` was measured at this very shape on this GPU model (not relabelled from another, not a bucket's
    unmeasured M): served as it is, no race."""
    return problem.mnk in e.members and not e.relabelled


def _by_name(contenders: Iterable[Entry]) -> dict[str, Entry]:
    """Contenders by their race name ('<family>:<impl>', what the choice cache's key and a generated choice hold)."""
    return {f"{e.family}:{e.impl}": e for e in contenders}


def _contenders(lib: Library, gpu: str, problem: GemmProblem) -> tuple[Entry, ...]:
    """The generated kernels a shape not measured here races beside the vendor plans: the library's entries for it
    (any protocol; relabelled, or a bucket at an unmeasured M) and those measured at the nearest tuned M below and
    above at this (N, K) of a family that takes any M (``Family.buckets``: a CUTLASS pick's scheduler knobs were
    chosen for its measured grid of tiles, and it builds with nvcc); at a launch-bound shape, also the small Triton
    tiles of serve/launch_bound.py (``GEMMRL_LAUNCH_BOUND=0``: not), at M <= 8 the Triton GEMV rows of
    serve/gemv_rows.py (``GEMMRL_GEMV_ROWS=0``: not), and at M <= 32 the decode family's configs of
    serve/decode_rows.py (``GEMMRL_DECODE_ROWS=0``: not). Vendor entries are not contenders: the race times every
    vendor plan here."""
    p = problem
    own = [lib.lookup(gpu, p.dtype, p.acc, p.layout, proto, p.M, p.N, p.K) for proto in PROTOCOL_ORDER["graph"]]
    near = [e for e in lib.neighbours(gpu, p.dtype, p.acc, p.layout, p.M, p.N, p.K) if family(e.family).buckets]
    out: list[Entry] = []
    for e in own + near:
        if e is not None and e.family != "vendor" and all((e.family, e.impl) != (x.family, x.impl) for x in out) \
                and _valid_at(e, p):
            out.append(e)
    out = out[:MAX_CONTENDERS]
    # small Triton tiles where launch, not arithmetic, sets the time; Triton GEMV rows at a decode step's M (<= 8);
    # the decode family's rings at M <= 32
    for e in (*launch_bound.here(p, gpu), *gemv_rows.here(p, gpu), *decode_rows.here(p, gpu)):
        if all((e.family, e.impl) != (x.family, x.impl) for x in out):
            out.append(e)
    return tuple(out)


def _ready(e: Entry) -> bool:
    """Whether building ``e`` costs no nvcc run (its family's ``ready``; families without one compile in seconds)."""
    fam = family(e.family)
    try:
        return fam.ready is None or bool(fam.ready(fam.parse(e.impl)))
    except (ValueError, KeyError):
        return True  # an impl that does not parse fails in its launch, reported there


def _valid_at(e: Entry, problem: GemmProblem) -> bool:
    """Whether ``e``'s config passes its family's validity predicate at ``problem`` (a decode-only config measured
    at M = 1 is no contender at M = 3531)."""
    fam = family(e.family)
    try:
        return bool(fam.valid(fam.parse(e.impl), problem)[0])
    except (ValueError, KeyError):
        return False


def _fallback_settings() -> str:
    """The vendor fallback's settings, checked (a bad one is the caller's error): its mode."""
    try:
        m = vendor_choice.mode()
        if m == "race":
            vendor_choice.race_budget_s()
            vendor_choice.graph_race()
            launch_bound.enabled()
            gemv_rows.enabled()
            decode_rows.enabled()
        return m
    except (vendor_choice.VendorChoiceError, launch_bound.LaunchBoundError, gemv_rows.GemvRowsError,
            decode_rows.DecodeRowsError) as e:
        raise DispatchError(str(e)) from None


def _make(e: Entry, problem: GemmProblem, device, sw: dict) -> tuple[Callable, str, tuple] | str:
    """A launcher for entry ``e`` at ``problem``, checked, with its spec for the compiled hot paths (() = call the
    launcher); the error's type name (with a warning) when it cannot serve: the vendor fallback serves instead."""
    desc = f"{e.family}:{e.impl} ({e.protocol} entry {e.mnk}{'' if e.m_lo == e.m_hi else f', M {e.m_lo}..{e.m_hi}'})"
    try:
        bufs = make_buffers(problem, device, seed=1234, on_device=True)
        got = launchers.launch(e, problem, bufs)
        desc += got.note
        measured = problem.mnk in e.members and not e.relabelled  # measured here, on this GPU model
        if e.same_software(sw) and measured:
            _reference_check(got.call, bufs, problem)
        elif device.type == "cuda":  # another software stack or GPU model, or an M the bucket was not measured at
            v = verify(got.candidate, problem, "cuda")
            if not v.passed:
                raise RuntimeError(f"failed the correctness battery: {v.reason}")
        else:
            _reference_check(got.call, bufs, problem)
        return got.call, desc, got.spec
    except Exception as ex:  # noqa: BLE001 - any failure to build (no nvcc, no CUTLASS headers...): the fallback serves
        _warn(f"gemmrl: {desc} not served at {problem.mnk} {problem.layout} ({type(ex).__name__}: {ex}); "
              "the vendor fallback serves it (torch.matmul off CUDA)")
        return type(ex).__name__


def _vendor_fallback(problem: GemmProblem, device, gpu: str, buffers: Callable[[], Buffers],
                     contenders: tuple[Entry, ...] = (), protocol: str = "graph",
                     budget: _BuildBudget | None = None) -> tuple[Callable, str, tuple]:
    """What serves a problem not measured here: the plan raced best in ``protocol`` (graph for graph replays, cold
    for eager calls) on this GPU for its bucket of M among the vendor plans and the generated ``contenders``
    (serve/vendor_choice.py). A generated winner serves once it passes the
    correctness battery at this shape (else the race's fastest vendor plan, recorded for the bucket); a vendor plan
    once it matches an fp32 product. torch.matmul off CUDA, with GEMMRL_VENDOR_FALLBACK=off, or where the vendor
    extension cannot be loaded (one warning says why). ``buffers()`` gives the operands the plans are timed on (one
    set per build, drawn on the device). ``budget`` (none: no cap) bounds the time spent building the generated
    contenders; those it leaves out do not race, and the choice is cached under the ones that raced."""
    if device.type != "cuda" or vendor_choice.mode() == "off":
        return launchers.torch_mm, "torch.matmul", ()
    gen = _by_name(contenders)
    names = tuple(sorted(gen))
    budget = budget if budget is not None else _BuildBudget(math.inf)
    try:
        bufs = buffers()
        launched: dict[str, launchers.Launch] = {}

        def plans() -> dict[str, Callable[[], Any]]:
            out = dict(vendor_choice.plans_for(problem, bufs))
            a, b, bt, c = bufs.args()
            bv = bt.t() if problem.layout == "tn" else b
            for name, e in gen.items():
                try:
                    got = budget.build(name, functools.partial(launchers.launch, e, problem, bufs),
                                       functools.partial(_ready, e))
                except Exception as ex:  # noqa: BLE001 - a contender that cannot be built here does not race
                    _warn(f"gemmrl: {name} not raced at {problem.mnk} {problem.layout} ({type(ex).__name__}: {ex})")
                    continue
                if got is None:  # the first sight's build budget is spent: warmup builds it
                    continue
                launched[name] = got
                out[vendor_choice.GEN + name] = functools.partial(got.call, a, bv, c)
            return out

        cache = _choice_cache(device, gpu)
        choice = vendor_choice.choose(problem, cache, plans, timer=_race_timer(bufs, problem, protocol),
                                      generated=names, protocol=protocol,
                                      vendor_plans=lambda desc: vendor_choice.plans_for(problem, bufs, desc),
                                      stored_as=lambda: budget.raced(names))
        keyed = budget.raced(names)  # the contenders the stored choice raced (all, where nothing was left out)
        if choice.kind == "gen":
            won = _generated_winner(choice, gen, launched, problem, bufs)
            if won is not None:
                return won
            choice = choice.vendor()
            if cache is not None:  # the battery said no here: the bucket's vendor plan from now on
                cache.put(problem, choice, keyed, protocol)
        got, choice = _checked_plan(choice, problem, bufs, cache, keyed, protocol)
        return got.call, f"vendor: {choice.describe()}{got.note}", got.spec
    except Exception as ex:  # noqa: BLE001 - no vendor extension here (no nvcc, no cuBLASLt): torch serves
        _warn(f"gemmrl: the vendor fallback cannot serve {problem.mnk} {problem.layout} here ({type(ex).__name__}: "
              f"{ex}); torch.matmul serves it (GEMMRL_VENDOR_FALLBACK=off says so without trying)")
        return launchers.torch_mm, f"torch.matmul (vendor fallback unavailable: {type(ex).__name__})", ()


def _checked_plan(choice: vendor_choice.Choice, problem: GemmProblem, bufs, cache, names: tuple[str, ...],
                  protocol: str) -> tuple[launchers.Launch, vendor_choice.Choice]:
    """The launch of the vendor plan ``choice`` once it computes right here: against an fp32 product, and through
    the correctness battery where ``checks_battery`` says so (once per shape and machine: a pass is recorded in
    ``cache``). Where it does not, the next plan of ``in_turn`` (the
    race's next fastest, then the defaults), the first that passes recorded in ``cache`` in place of ``choice``
    (with a warning saying why); raises where none does."""
    failed: list[str] = []
    exact = cache is not None and cache.choices.get(
        vendor_choice.choice_key(problem, names, protocol, exact=True)) == choice
    for c in vendor_choice.in_turn(choice):
        try:
            got = launchers.vendor_plan(c.kind, c.algo, problem, bufs)
            _reference_check(got.call, bufs, problem)
            if vendor_choice.checks_battery(c, got.built) and not (cache is not None and cache.has_passed(problem, c)):
                v = verify(got.candidate, problem, "cuda")
                if not v.passed:
                    raise RuntimeError(f"failed the correctness battery: {v.reason}")
                if cache is not None:
                    cache.mark_passed(problem, c)  # once per machine: the next process serves it without the battery
        except Exception as ex:  # noqa: BLE001 - a plan that does not compute right here: the next one
            failed.append(f"{c.describe()} ({type(ex).__name__}: {str(ex)[:160]})")
            continue
        if failed:
            _warn(f"gemmrl: at {problem.mnk} {problem.layout} ({protocol}) {'; '.join(failed)}; "
                  f"{c.describe()} serves instead")
            if cache is not None:
                cache.put(problem, c, names, protocol, exact=exact)
        return got, c
    raise RuntimeError("no vendor plan computes right here: " + "; ".join(failed))


def _race_timer(bufs, problem: GemmProblem, protocol: str):
    """The graph race's timer (fresh inputs before each call, as the bench's graph protocol), or None for the
    protocol's default (cold; and graph where Triton, whose kernel writes the fresh inputs, is not installed)."""
    if protocol != "graph" or importlib.util.find_spec("triton") is None:
        return None
    return vendor_choice.fresh_timer(bufs, problem.layout)


def _generated_winner(choice: vendor_choice.Choice, gen: dict[str, Entry], launched: dict[str, launchers.Launch],
                      problem: GemmProblem, bufs) -> tuple[Callable, str, tuple] | None:
    """The generated kernel that won its bucket's race, once it passes the correctness battery at this shape (it
    was not measured here); None (with a warning) where it cannot serve."""
    e = gen.get(choice.algo)
    if e is None:
        return None
    desc = (f"{choice.algo} [raced at M={choice.measured_m} against the vendor plans; {e.protocol} entry {e.mnk}"
            f"{', relabelled' if e.relabelled else ''}]")
    try:
        got = launched.get(choice.algo) or launchers.launch(e, problem, bufs)
        v = verify(got.candidate, problem, "cuda")
        if not v.passed:
            raise RuntimeError(f"failed the correctness battery: {v.reason}")
        return got.call, desc + got.note, got.spec
    except Exception as ex:  # noqa: BLE001 - the race's vendor plan serves instead
        _warn(f"gemmrl: {desc} not served at {problem.mnk} {problem.layout} ({type(ex).__name__}: {ex}); the "
              "fastest vendor plan of its race serves it")
        return None


def _choice_cache(device, gpu: str) -> vendor_choice.ChoiceCache | None:
    """The raced choices of this GPU model, driver and cuBLASLt (one per process and identity)."""
    from ..kernels import vendor  # the vendor extension: loaded on first use

    v = vendor.load_library().versions()
    ident = vendor_choice.Identity(gpu, int(v["driver"]), int(v["cublaslt"]))
    if ident not in _S.choices:
        _S.choices[ident] = vendor_choice.ChoiceCache(ident)
    return _S.choices[ident]


REFERENCE_CHUNK = 1 << 24  # elements of B converted to fp32 at a time by the reference check (64 MiB)


def _reference_check(fn, bufs, problem: GemmProblem) -> None:
    """One call on the warm-up buffers against an fp32 product (inputs scaled so C is of unit size), computed over
    slices of N: B in fp32 at once doubled a first call's peak at an lm_head (128256 x 4096: +2 GiB). The product
    reads the form of B the call reads: after the graph race the other form holds other numbers."""
    a, b, bt, c = bufs.args()
    w = b if problem.layout == "nn" else bt.t()  # the form the call reads (the graph race refills only that one)
    c.fill_(float("nan"))
    fn(a, w, c)
    af = a.float()
    cols = max(1, REFERENCE_CHUNK // max(problem.K, 1))
    err = 0.0
    for n0 in range(0, problem.N, cols):
        n1 = min(problem.N, n0 + cols)
        e = (c[:, n0:n1].float() - af @ w[:, n0:n1].float()).abs().max().item()
        if e != e:  # NaN: an unwritten or wrong output (Python's max() would drop it)
            err = e
            break
        err = max(err, e)
    tol = 2e-2 if problem.dtype == "bf16" else 4e-3
    if not err <= tol:
        raise RuntimeError(f"max error {err:.3g} against an fp32 reference (limit {tol})")


# -- ahead of time ---------------------------------------------------------------------------------------
def _parse_shape(s) -> tuple[int, int, int]:
    if isinstance(s, GemmProblem):
        return s.M, s.N, s.K
    if isinstance(s, str):
        p = parse_mnk(s)
        return p.M, p.N, p.K
    try:
        M, N, K = (int(x) for x in s)
    except (TypeError, ValueError):
        raise DispatchError(f"warmup takes shapes as 'M_N_K', (M, N, K) or GemmProblem; got {s!r}") from None
    return M, N, K


def warmup(shapes: Iterable, dtype=torch.float16, layouts: Iterable[str] = ("tn", "nn"), device=None) -> list[dict]:
    """Build what serves each shape and layout now (compile, plan, check), so that no later call, and no CUDA-graph
    capture, builds anything. Returns one record per (shape, layout): what serves it eagerly and in a graph."""
    if dtype not in _DTYPES:
        raise DispatchError(f"warmup: dtype {dtype} is not served; use torch.float16 or torch.bfloat16")
    device = torch.device(device) if device is not None else (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
    out = []
    with building_ahead():
        for s in shapes:
            M, N, K = _parse_shape(s)
            for layout in layouts:
                if layout not in ("nn", "tn"):
                    raise DispatchError(f"warmup: layout {layout!r}; use 'nn' or 'tn'")
                a = torch.empty((M, K), dtype=dtype, device=device)
                b = torch.empty((K, N), dtype=dtype, device=device) if layout == "nn" else \
                    torch.empty((N, K), dtype=dtype, device=device).t()
                _rebuild_if_deferred((M, N, K, dtype, layout, a.get_device()))
                s_ = _mm_served(a, b)
                out.append({"mnk": f"{M}_{N}_{K}", "layout": layout, "eager": s_.eager_desc, "graph": s_.graph_desc})
    return out


def _rebuild_if_deferred(pkey: tuple) -> None:
    """A problem whose first sight left generated contenders out of its race (``Served.deferred``) is forgotten, so
    the next lookup builds it again (ahead of the calls: with every contender), and so is which signature takes
    which kernel."""
    with _S.lock:
        got = _S.built.get(pkey)
        if got is not None and got.deferred:
            del _S.built[pkey]
            _forget_signatures()


def served_by(a, b) -> dict:
    """What serves ``mm(a, b)`` (building it ahead if needed, outside capture): {'eager': ..., 'graph': ...}."""
    with building_ahead():
        s = _mm_served(a, b)
    return {"eager": s.eager_desc, "graph": s.graph_desc}


def _mm_served(a, b) -> Served:
    key = (a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, a.get_device(), b.get_device())
    return _TABLE.get(key) or _miss(key, a, b)


# -- the custom op -----------------------------------------------------------------------------------------
@torch.library.custom_op("gemmrl::mm", mutates_args=())
def _mm_op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _mm(a, b, None)


@_mm_op.register_fake
def _mm_fake(a, b):
    if a.dim() < 2 or b.dim() != 2 or a.shape[-1] != b.shape[0]:
        raise DispatchError(f"gemmrl::mm: a is {tuple(a.shape)} and b is {tuple(b.shape)}; a [..., K] @ b [K, N]")
    return a.new_empty((*a.shape[:-1], b.shape[1]))


def _setup_context(ctx, inputs, output) -> None:
    a, b = inputs
    ctx.save_for_backward(a, b)


def _backward(ctx, grad):
    a, b = ctx.saved_tensors
    ga = gb = None
    if ctx.needs_input_grad[0]:
        ga = mm(grad, b.t())                                        # [..., N] @ [N, K]
    if ctx.needs_input_grad[1]:
        K, N = b.shape
        if not b.is_contiguous() and b.t().is_contiguous():
            # b is w.t() (nn.Linear's weight, [N, K]): compute the gradient as [N, K] and hand back its [K, N]
            # view, so that w.t()'s backward gives w a contiguous gradient (no transpose copy per step)
            gb = mm(grad.reshape(-1, N).t(), a.reshape(-1, K)).t()  # ([N, M] @ [M, K]).t()
        else:
            gb = mm(a.reshape(-1, K).t(), grad.reshape(-1, N))      # [K, M] @ [M, N]
    return ga, gb


_mm_op.register_autograd(_backward, setup_context=_setup_context)


class _MMFunction(torch.autograd.Function):
    """Eager autograd for mm: the custom op's forward and backward without its dispatcher hops."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _hot(a, b, None)  # grad mode is off in here: the hot path serves

    @staticmethod
    def backward(ctx, grad):
        return _backward(ctx, grad)
