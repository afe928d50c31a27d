"""Launchers: how a library entry becomes the call ``gemmrl.mm`` makes. One interface for every family.

``launch(entry, problem, bufs) -> Launch`` makes the entry's candidate through the family table
(``kernels/registry.py``) and prepares it at ``problem`` on the warm-up buffers ``bufs`` (the family's validity
predicate, its build, its plan). ``Launch.call(a, b, out)`` is the Python call (``b`` as ``mm`` received it,
[K, N]; for ``tn`` the transpose view of a row-major [N, K]); ``Launch.candidate`` is what the correctness battery
runs; ``Launch.spec`` is what the compiled hot paths run instead (``csrc/fastpath_spec.h``), chosen by what the
prepared candidate offers, not by its family's name:

  kind 1  direct launches (``direct_launches()``: Triton's compiled kernels launched from C)
  kind 2  a C plan entry ``int run(plan, A, B, C, stream)`` (``hot_plan()``: CUTLASS and tiny configs, cuBLAS and
          cuBLASLt plans)
  kind 3  torch.matmul (ATen's matmul_out)
A call whose pointers are not aligned as the plan needs (16 bytes; a cuBLASLt plan: what it was made for) goes to
torch.matmul. A vendor entry pins its cuBLASLt algorithm by description (``pin_algorithm``), or with
``GEMMRL_VENDOR_TUNE=here`` is autotuned on this machine (``vendor_tune``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from ..candidate import Buffers
from ..kernels import vendor
from ..kernels.registry import family
from ..library import Entry
from ..problem import GemmProblem

VENDOR_TUNE_ENV = "GEMMRL_VENDOR_TUNE"
VENDOR_TUNE_CHOICES = ("pin", "here")


class DispatchError(ValueError):
    """A call gemmrl.mm cannot serve as asked (bad operands, a bad setting): the caller's error, with what to do."""


def torch_mm(a, b, out):
    torch.matmul(a, b, out=out)


TORCH_MM = torch_mm  # spec kind 3 (a compiled path may call ATen's matmul_out itself), by identity: a replaced
#                      torch_mm, e.g. a test's counting spy, stays a Python call


def raw_stream() -> Callable[[int], int]:
    """device index -> torch's current raw stream handle (0 = the legacy default stream)."""
    return vendor.raw_stream_getter()


@dataclass(frozen=True)
class Launch:
    """A served entry: ``call(a, b, out)``, the candidate the battery runs, the compiled hot path's spec (() = call
    ``call``) and a note for what ``served_by`` reports (a vendor pin honoured or not)."""

    call: Callable
    candidate: Any
    spec: tuple = ()
    note: str = field(default="")
    built: bool = False  # a cuBLASLt configuration its heuristic does not list at this shape, built here


def launch(e: Entry, problem: GemmProblem, bufs: Buffers) -> Launch:
    """The launcher of entry ``e`` at ``problem``: its candidate prepared on ``bufs`` and wrapped by what it offers.
    Raises whatever makes it unservable here (validity predicate, build, plan); the caller falls back."""
    if e.family == "vendor":  # the baseline itself, not a kernel family: its pinned algorithm, or torch.matmul
        return _vendor(e, problem, bufs)
    fam = family(e.family)
    cand = fam.candidate(fam.parse(e.impl), problem, f"gemmrl:{e.family}:{e.impl}")
    cand.prepare(problem, bufs, e.protocol, None)  # validity predicate, build, plan, self-check
    return wrap(cand, problem, bufs)


def wrap(cand, problem: GemmProblem, bufs: Buffers, note: str = "") -> Launch:
    """A prepared candidate as a launch, by what it offers: direct launches, a C plan, or its own call."""
    if getattr(cand, "direct_launches", None) is not None:
        return _direct(cand, problem, bufs, note)
    if getattr(cand, "hot_plan", None) is not None:
        return _planned(cand, problem, bufs, note)
    tn = problem.layout == "tn"

    def call(a, b, out):
        cand(a, b, b.t() if tn else b, out)

    return Launch(call, cand, (), note)


def _direct(cand, problem: GemmProblem, bufs: Buffers, note: str) -> Launch:
    """A candidate launched from C (Triton): ``launch_ptrs`` on aligned pointers, else its own path."""
    launch_ptrs = cand.launch_ptrs
    tn = problem.layout == "tn"

    def slow(a, b, out):  # pointers not 16-byte aligned, or no direct launcher (interpreter, another Triton)
        if a.is_cuda and (cand.launch_path == "direct" or (a.data_ptr() | b.data_ptr() | out.data_ptr()) & 15):
            torch.matmul(a, b, out=out)  # never a new specialization (a compile) in a hot call
        else:
            K = b.shape[0]
            cand(a.reshape(-1, K), b, b.t() if tn else b, out.view(-1, out.shape[-1]))

    def call(a, b, out):
        if not launch_ptrs(a.data_ptr(), b.data_ptr(), out.data_ptr()):
            slow(a, b, out)

    launches = cand.direct_launches()  # CUDA only; () under the interpreter or where Triton's own path serves
    spec = (1, raw_stream(), bufs.a.device.index, 15, slow, launches, cand) if launches else ()
    return Launch(call, cand, spec, note)


def _planned(cand, problem: GemmProblem, bufs: Buffers, note: str) -> Launch:
    """A candidate with a prepared C plan (``hot_plan()``): the compiled hot path calls the plan's entry directly
    (B's pointer is the same for b and its tn view); unaligned pointers go to torch.matmul."""
    tn = problem.layout == "tn"
    mask = getattr(cand, "align_mask", 15)  # TMA and cp.async need 16-byte aligned rows; a cuBLASLt plan says its own

    def call(a, b, out):
        if (a.data_ptr() | b.data_ptr() | out.data_ptr()) & mask:
            torch_mm(a, b, out)  # the plan was made for this alignment; cuBLAS via torch takes any
        else:
            cand(a, b, b.t() if tn else b, out)

    def error(st: int):
        raise cand.plan_error(st)

    fnaddr, plan = cand.hot_plan()
    spec = (2, raw_stream(), bufs.a.device.index, mask, torch_mm, fnaddr, plan, error, cand)
    return Launch(call, cand, spec, note)


# -- vendor entries: the pinned algorithm, or a tune on this machine --------------------------------------------
class _Named:
    """A prepared vendor candidate under the served name and layout (what the battery reports), and its plan."""

    def __init__(self, cand, name: str, layout: str):
        self.cand, self.name, self.layout, self.acc = cand, name, layout, "fp32"

    def prepare(self, problem, bufs, protocol, timer) -> None:
        pass

    def __call__(self, a, b, bt, c) -> None:
        self.cand(a, b, bt, c)

    def info(self) -> dict:
        return self.cand.info()

    @property
    def align_mask(self) -> int:
        return self.cand.align_mask

    def hot_plan(self) -> tuple[int, int]:
        return self.cand.hot_plan()

    def plan_error(self, st: int) -> Exception:
        return self.cand.plan_error(st)


def vendor_tune() -> str:
    """``GEMMRL_VENDOR_TUNE``, checked: ``pin`` (default: a cuBLASLt-autotuned entry runs the algorithm the library
    measured, where this cuBLASLt offers it) or ``here`` (it is autotuned on this machine when first built)."""
    v = os.environ.get(VENDOR_TUNE_ENV, "pin").strip().lower() or "pin"
    if v not in VENDOR_TUNE_CHOICES:
        raise DispatchError(f"{VENDOR_TUNE_ENV}={v!r}: use 'pin' (the library's algorithm) or 'here' (autotune "
                          "cuBLASLt-autotuned entries on this machine)")
    return v


def pin_algorithm(e: Entry, descs: list[str]) -> tuple[int | None, str]:
    """The index of the entry's pinned cuBLASLt algorithm among this cuBLASLt's heuristic results ``descs``
    (None where it is not offered), and a note for what `served_by` and a bench row's ``algo`` report: whether
    the pin was honoured. A measure pass compares the served entry with a fresh autotune; where those differ, the
    note tells a pin that was not found (tuned again here, or the heuristic's first) from a run-to-run change of
    the autotune's own choice."""
    if e.algo in descs:
        i = descs.index(e.algo)
        return i, f" [pinned: heuristic #{i} of {len(descs)}]"
    what = "tuned here" if e.impl.startswith("cublaslt_autotuned") else "the heuristic's first"
    return None, f" [pinned algorithm not among this cuBLASLt's {len(descs)}: {what}]"


def _vendor(e: Entry, problem: GemmProblem, bufs: Buffers) -> Launch:
    if e.impl == "torch":
        tc = vendor.TorchCandidate()
        tc.prepare(problem.with_(layout="nn"), bufs, e.protocol, None)
        return Launch(torch_mm, _Named(tc, "torch", problem.layout))
    mode = {"cublas": "cublas", "cublaslt_heuristic": "heuristic", "cublaslt_autotuned": "heuristic"}[e.impl[:-3]]
    here = e.impl.startswith("cublaslt_autotuned") and vendor_tune() == "here"
    cand = vendor.CtypesCandidate(f"gemmrl:{e.impl}", problem.layout, "fp32", "autotuned" if here else mode)
    cand.prepare(problem, bufs, e.protocol, None)
    note = ""
    if here:  # the library's pin is not used: what this machine's autotune chose (or its cache held)
        note = f" [{VENDOR_TUNE_ENV}=here: {cand.info().get('algo', '?')}]"
    elif mode == "heuristic" and e.algo:
        idx, note = pin_algorithm(e, cand.algorithms())
        if idx is not None:
            cand.select_algorithm(idx)
        elif e.impl.startswith("cublaslt_autotuned"):  # this cuBLASLt does not offer it: tune here
            cand = vendor.CtypesCandidate(f"gemmrl:{e.impl}", problem.layout, "fp32", "autotuned")
            cand.prepare(problem, bufs, e.protocol, None)
            note = f"{note[:-1]}: {cand.info().get('algo', '?')}]"
    return wrap(_Named(cand, f"gemmrl:{e.impl}", problem.layout), problem, bufs, note)


def vendor_plan(kind: str, algo: str, problem: GemmProblem, bufs: Buffers) -> Launch:
    """The lean vendor call of a vendor-fallback choice (serve/vendor_choice.py) at ``problem``: torch.matmul,
    cublasGemmEx, or cuBLASLt with the configuration described by ``algo``: from this shape's heuristic list
    (compared without what depends on M), else built from its description where it runs here (a split-K factor
    the heuristic does not list, or another M's pick), else the heuristic's first (the note says which)."""
    if kind == "torch":
        tc = vendor.TorchCandidate()
        tc.prepare(problem.with_(layout="nn"), bufs, "graph", None)
        return Launch(torch_mm, _Named(tc, "vendor:torch", problem.layout))
    if kind not in ("cublas", "cublaslt"):
        raise ValueError(f"unknown vendor plan kind {kind!r}")
    cand = vendor.CtypesCandidate(f"vendor:{kind}", problem.layout, "fp32", "cublas" if kind == "cublas" else
                                  "heuristic")
    cand.prepare(problem, bufs, "graph", None)
    note, built = "", False
    if kind == "cublaslt" and algo:
        n = len(cand.algorithms())
        idx = cand.add_config(algo)  # listed at this M, else built from its description
        if idx is not None:
            cand.select_algorithm(idx)
            if idx >= n:
                note, built = " [raced configuration, built at this M]", True
        else:
            note = f" [raced algorithm does not run at this shape (heuristic lists {n}): the heuristic's first]"
    return replace(wrap(_Named(cand, f"vendor:{kind}", problem.layout), problem, bufs, note), built=built)
