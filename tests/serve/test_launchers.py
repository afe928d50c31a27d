"""serve/launchers.py on the CPU: a prepared candidate becomes gemmrl.mm's call by what it offers (direct launches,
a C plan, or only its own call), never by its family's name, and a call whose pointers the plan cannot take goes
to torch.matmul."""

from __future__ import annotations

import pytest
import torch

from gemmrl.candidate import make_buffers
from gemmrl.library import Entry
from gemmrl.problem import GemmProblem
from gemmrl.serve import launchers as L


class _Own:
    """A candidate that offers only its call."""

    name, acc = "own", "fp32"

    def __init__(self, layout="tn"):
        self.layout, self.calls = layout, []

    def prepare(self, problem, bufs, protocol, timer):
        pass

    def __call__(self, a, b, bt, c):
        self.calls.append((b, bt))
        torch.matmul(a, b, out=c)


class _Planned(_Own):
    """A candidate with a prepared C plan (what CUTLASS, tiny and the vendor's plans offer)."""

    def __init__(self, layout="tn", align_mask=None):
        super().__init__(layout)
        if align_mask is not None:
            self.align_mask = align_mask

    def hot_plan(self):
        return 1234, 5678

    def plan_error(self, st):
        return RuntimeError(f"status {st}")


class _Direct(_Own):
    """A Triton-like candidate: launch_ptrs, direct launches (none here: no GPU), its own slow path."""

    launch_path = "interpreter"

    def direct_launches(self):
        return ()

    def launch_ptrs(self, pa, pb, pc):
        return False


def _operands(layout, M=8, N=16, K=32, offset=0):
    p = GemmProblem(M, N, K, layout=layout)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(M * K + offset, generator=g).half()[offset:].view(M, K)
    w = torch.randn(N, K, generator=g).half()
    b = w.t() if layout == "tn" else w.t().contiguous()
    return p, a, b, torch.empty(M, N, dtype=torch.half)


@pytest.mark.parametrize("layout", ["tn", "nn"])
def test_a_plan_is_served_through_its_c_entry(layout):
    p, a, b, out = _operands(layout)
    cand = _Planned(layout)
    got = L.wrap(cand, p, make_buffers(p, "cpu", seed=0))
    kind, _stream, _dev, mask, unaligned, fnaddr, plan, error, keep = got.spec
    assert (kind, mask, fnaddr, plan, keep) == (2, 15, 1234, 5678, cand) and unaligned is L.torch_mm
    with pytest.raises(RuntimeError, match="status 3"):
        error(3)
    got.call(a, b, out)
    (cb, cbt), = cand.calls
    assert cbt.data_ptr() == b.data_ptr() if layout == "tn" else cb is b  # the layout's operand, not a copy
    assert torch.allclose(out.float(), a.float() @ b.float(), atol=1e-2)


def test_pointers_the_plan_was_not_made_for_go_to_torch_matmul():
    p, a, b, out = _operands("tn", offset=1)  # a starts 2 bytes past an aligned address
    assert a.data_ptr() & 15
    cand = _Planned("tn")
    L.wrap(cand, p, make_buffers(p, "cpu", seed=0)).call(a, b, out)
    assert cand.calls == [] and torch.allclose(out.float(), a.float() @ b.float(), atol=1e-2)
    cand = _Planned("tn", align_mask=1)  # a plan made for 2-byte alignment takes it
    got = L.wrap(cand, p, make_buffers(p, "cpu", seed=0))
    got.call(a, b, out)
    assert got.spec[3] == 1 and len(cand.calls) == 1


def test_direct_launches_and_plain_calls():
    p, a, b, out = _operands("tn")
    d = L.wrap(_Direct("tn"), p, make_buffers(p, "cpu", seed=0))
    assert d.spec == ()  # no direct launches under the interpreter: the call serves
    d.call(a, b, out)
    assert torch.allclose(out.float(), a.float() @ b.float(), atol=1e-2)
    own = _Own("nn")
    p2, a2, b2, out2 = _operands("nn")
    got = L.wrap(own, p2, make_buffers(p2, "cpu", seed=0))
    assert got.spec == () and got.candidate is own
    got.call(a2, b2, out2)
    assert own.calls[0][0] is b2 and torch.allclose(out2.float(), a2.float() @ b2.float(), atol=1e-2)


def test_a_vendor_torch_entry_is_torch_matmul(monkeypatch):
    class _Torch:
        name = "torch"

        def prepare(self, problem, bufs, protocol, timer):
            self.prepared = problem.layout

    monkeypatch.setattr(L.vendor, "TorchCandidate", _Torch)
    e = Entry(gpu="cpu", cc="", dtype="fp16", acc="fp32", layout="tn", protocol="graph", M=8, N=16, K=32,
              family="vendor", impl="torch", algo="", time_ms=0.01, vendor_best_ms=0.01, vendor_best="torch",
              m_lo=8, m_hi=8, members=("8_16_32",), verified=True)
    p = GemmProblem(8, 16, 32, layout="tn")
    got = L.launch(e, p, make_buffers(p, "cpu", seed=0))
    assert got.call is L.torch_mm and got.spec == () and got.candidate.name == "torch"
    assert got.candidate.cand.prepared == "nn" and got.candidate.layout == "tn"  # torch reads b as mm got it
