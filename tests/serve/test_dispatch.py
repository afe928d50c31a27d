"""gemmrl.mm / linear / the custom op / patch(model).

CPU tier: a library with entries for the GPU name 'cpu' serves Triton kernels under the interpreter on CPU tensors
(lookup, buckets, fallback, errors, op registration, autograd, torch.compile, patching). GPU tier (marker ``gpu``):
CUDA-graph capture of seen and unseen shapes, torch.compile, vendor entries, and the lookup's host cost.
"""

from __future__ import annotations

import json
import math
import time
import warnings

import pytest
import torch

import gemmrl
from conftest import have_cutlass_toolchain
from gemmrl.serve import dispatch, launchers
from gemmrl.kernels import toolchain
from gemmrl.library import Entry, Library
from gemmrl.problem import GemmProblem

CFG = "tiled(BM=32,BN=32,BK=32,warps=4,stages=2,group_m=1)"
CUT = "coop_128x128x64_c1x1_persistent_tn_fp16:s1_rh_dheuristic_k1"  # a CUTLASS SM90 <config>:<knobs>


def entry(M, N, K, *, gpu="cpu", layout="tn", protocol="offline", family="triton", impl=CFG, m_lo=None, m_hi=None,
          members=None, dtype="fp16", torch_v="", t=0.01, vb=0.02):
    return Entry(gpu=gpu, cc="", dtype=dtype, acc="fp32", layout=layout, protocol=protocol, M=M, N=N, K=K,
                 family=family, impl=impl, algo="" if family == "triton" else "", time_ms=t, vendor_best_ms=vb,
                 vendor_best="cublas_tn", m_lo=m_lo or M, m_hi=m_hi or M,
                 members=tuple(members or (f"{M}_{N}_{K}",)), verified=True, torch=torch_v)


@pytest.fixture
def lib(hot_path, monkeypatch):
    """Serve from a library of the given entries, through each hot path in turn (conftest.hot_path). The decode rows
    are off (their race costs an nvcc build a dtype in a fresh cache); their own test turns them on."""
    monkeypatch.setenv("GEMMRL_DECODE_ROWS", "0")

    def use(*entries):
        lb = Library(entries)
        dispatch.use_library(lb)
        return lb

    yield use
    dispatch.use_library(Library())


@pytest.mark.parametrize("kind", ["torch", "c"])
def test_fastpath_builds_and_serves(kind, monkeypatch):
    """Where a compiler and the headers exist (CI, the GPU machine), each compiled hot path is built, and the
    default (GEMMRL_FASTPATH unset: auto) is the one built against torch's headers."""
    from gemmrl.serve import fastpath

    mod = fastpath.load_kind(kind)
    if mod is None and fastpath.why(kind).startswith(("RuntimeError: no Python.h", "RuntimeError: no C compiler",
                                                      "RuntimeError: no C++ compiler", "RuntimeError: no torch headers")):
        pytest.skip(f"no toolchain for the {kind} hot path here: {fastpath.why(kind)}")
    assert mod is not None, fastpath.why(kind)  # a toolchain that fails to build it is a bug
    assert fastpath.kind_of(mod) == kind
    try:
        dispatch.use_hot_path(kind)
        a, b = rnd(5, 16), rnd(16, 24, seed=1)
        out = gemmrl.mm(a, b)
        assert dispatch.hot_path().startswith(kind)
        assert torch.equal(gemmrl.mm(a, b), out)
        stored = mod.size() if kind == "torch" else len(dispatch._CFAST)
        assert stored == 1
        dispatch.reset()
        assert (mod.size() if kind == "torch" else len(dispatch._CFAST)) == 0
    finally:
        dispatch.use_hot_path("python")
        dispatch._S.fastpath_tried = False
    if kind == "torch":
        monkeypatch.delenv("GEMMRL_FASTPATH", raising=False)
        monkeypatch.setattr(fastpath, "_state", {k: v for k, v in fastpath._state.items() if k in ("torch", "c")})
        assert fastpath.load() is mod


def test_fastpath_choice_is_checked(monkeypatch):
    from gemmrl.serve import fastpath

    monkeypatch.setenv("GEMMRL_FASTPATH", "cuda")
    with pytest.raises(ValueError, match="GEMMRL_FASTPATH='cuda': use one of auto, torch, c, 0"):
        fastpath.choice()
    monkeypatch.setenv("GEMMRL_FASTPATH", "1")
    assert fastpath.choice() == "auto"


def ref(a, b):
    return (a.double() @ b.double()).float()


def tol(K, dtype=torch.float16):
    # inputs of unit size: |C| ~ sqrt(K); fp16/bf16 output rounding plus fp32 accumulation order
    eps = 2 ** -10 if dtype == torch.float16 else 2 ** -7
    return 4 * eps * math.sqrt(K) + 1e-3


def rnd(*shape, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


# -- CPU tier ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 7, 13), (33, 65, 129), (3, 40, 24)])
@pytest.mark.parametrize("layout", ["nn", "tn"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_no_entry_serves_torch_matmul(lib, shape, layout, dtype):
    lib()
    M, N, K = shape
    a = rnd(M, K, dtype=dtype)
    b = rnd(K, N, dtype=dtype, seed=1) if layout == "nn" else rnd(N, K, dtype=dtype, seed=1).t()
    assert gemmrl.served_by(a, b) == {"eager": "torch.matmul", "graph": "torch.matmul"}
    out = gemmrl.mm(a, b)
    assert out.shape == (M, N) and out.dtype == dtype
    assert (out.float() - ref(a, b)).abs().max() <= tol(K, dtype)


@pytest.mark.interpreter
@pytest.mark.parametrize("shape", [(33, 65, 129), (1, 7, 13), (64, 64, 64)])
@pytest.mark.parametrize("layout", ["nn", "tn"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_entry_serves_triton_interpreter(lib, shape, layout, dtype):
    M, N, K = shape
    lib(entry(M, N, K, layout=layout, dtype=dtype))
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    a = rnd(M, K, dtype=dt)
    b = rnd(K, N, dtype=dt, seed=1) if layout == "nn" else rnd(N, K, dtype=dt, seed=1).t()
    assert gemmrl.served_by(a, b)["eager"].startswith(f"triton:{CFG}")
    other = rnd(K, N, dtype=dt).t().contiguous().t() if layout == "nn" else rnd(K, N, dtype=dt)
    assert gemmrl.served_by(a, other)["eager"] == "torch.matmul"  # the other layout has no entry
    out = torch.full((M, N), float("nan"), dtype=dt)
    assert gemmrl.mm(a, b, out=out) is out
    assert (out.float() - ref(a, b)).abs().max() <= tol(K, dt)


@pytest.mark.interpreter
def test_bucket_serves_unmeasured_m_and_nothing_outside(lib):
    N, K = 40, 24
    lib(entry(20, N, K, m_lo=8, m_hi=32, members=(f"8_{N}_{K}", f"32_{N}_{K}")))
    w = rnd(N, K, seed=2)
    for M, want in ((20, "triton"), (8, "triton"), (7, "torch"), (33, "torch")):
        a = rnd(M, K)
        got = gemmrl.served_by(a, w.t())["eager"]
        assert got.startswith(want), (M, got)
        assert (gemmrl.mm(a, w.t()).float() - ref(a, w.t())).abs().max() <= tol(K)


@pytest.mark.interpreter
def test_other_gpu_and_other_protocol_order(lib):
    lib(entry(16, 32, 32, gpu="NVIDIA H100 80GB HBM3"), entry(16, 64, 32, protocol="graph"))
    a = rnd(16, 32)
    assert gemmrl.served_by(a, rnd(32, 32).t())["eager"] == "torch.matmul"   # an H100 entry never serves the CPU
    got = gemmrl.served_by(a, rnd(64, 32).t())
    assert got["eager"].startswith("triton") and "graph entry" in got["eager"]  # eager falls back to a graph entry


@pytest.mark.interpreter
def test_leading_batch_dims_and_noncontiguous_a(lib):
    lib(entry(6, 40, 24))
    w = rnd(40, 24, seed=3)
    x = rnd(2, 3, 24)
    y = gemmrl.mm(x, w.t())
    assert y.shape == (2, 3, 40)
    assert gemmrl.served_by(x, w.t())["eager"].startswith("triton")
    assert (y.float() - ref(x.reshape(6, 24), w.t()).reshape(2, 3, 40)).abs().max() <= tol(24)
    xt = rnd(24, 6).t()  # not row-major: cuBLAS (torch.matmul) reads it as is
    assert gemmrl.served_by(xt, w.t())["eager"] == "torch.matmul"
    assert (gemmrl.mm(xt, w.t()).float() - ref(xt, w.t())).abs().max() <= tol(24)


@pytest.mark.interpreter
def test_invalid_config_for_the_shape_falls_back_with_a_warning(lib):
    # TMA needs 16-byte aligned rows: K=13 fp16 rows are 26 bytes, so the validity predicate rejects this config
    bad = "persistent(BM=32,BN=32,BK=32,warps=4,stages=2,group_m=1,order=m,tma=True,flatten=False,ws=False," \
          "subtile=False,ctas_per_sm=1)"
    lib(entry(5, 8, 13, impl=bad))
    a, w = rnd(5, 13), rnd(8, 13)
    with pytest.warns(RuntimeWarning, match="not served"):
        got = gemmrl.served_by(a, w.t())
    assert got["eager"].startswith("torch.matmul")
    assert (gemmrl.mm(a, w.t()).float() - ref(a, w.t())).abs().max() <= tol(13)


@pytest.mark.parametrize("shape, why", [((16, 32, 64), "CUDA tensors only"),  # CPU tensors: nothing is built
                                        ((5, 8, 13), "multiples of 8")])          # TMA: K=13 rows are 26 bytes
def test_cutlass_entry_that_cannot_serve_falls_back_with_a_warning(lib, shape, why):
    """A CUTLASS entry that cannot be served here (no GPU, a shape its config refuses; no nvcc or CUTLASS headers
    likewise) is served by torch.matmul, with a warning that says why, and gives torch's result."""
    M, N, K = shape
    lib(entry(M, N, K, family="cutlass", impl=CUT))
    a, w = rnd(M, K), rnd(N, K, seed=1)
    with pytest.warns(RuntimeWarning, match=f"cutlass:{CUT} .*not served.*{why}"):
        got = gemmrl.served_by(a, w.t())
    assert got["eager"] == "torch.matmul (entry cutlass:" + CUT + " not served: " + (
        "RuntimeError)" if why.startswith("CUDA") else "CutlassConfigError)")
    assert (gemmrl.mm(a, w.t()).float() - ref(a, w.t())).abs().max() <= tol(K)


def test_tiny_entry_that_cannot_serve_falls_back_with_a_warning(lib):
    """A tiny-family entry on CPU tensors (nothing is built) is served by torch.matmul, with a warning that says why."""
    lib(entry(64, 64, 1024, family="tiny", impl="32x32_s8_st4_fp16"))
    a, w = rnd(64, 1024), rnd(64, 1024, seed=1)
    with pytest.warns(RuntimeWarning, match="tiny:32x32_s8_st4_fp16 .*not served.*CUDA tensors only"):
        got = gemmrl.served_by(a, w.t())
    assert got["eager"] == "torch.matmul (entry tiny:32x32_s8_st4_fp16 not served: TinyConfigError)"
    assert (gemmrl.mm(a, w.t()).float() - ref(a, w.t())).abs().max() <= tol(1024)


@pytest.mark.parametrize("bad, match", [
    (lambda: (torch.randn(4, 8), torch.randn(8, 3)), "float16 and bfloat16"),
    (lambda: (rnd(4, 8), rnd(8, 3, dtype=torch.bfloat16)), "same dtype"),
    (lambda: (rnd(4, 8), rnd(7, 3)), "last dim"),
    (lambda: (rnd(8), rnd(8, 3)), "2-D or more"),
    (lambda: (rnd(4, 8), rnd(2, 8, 3)), "batched b"),
    (lambda: (rnd(4, 8), [[1.0]]), "torch.Tensor"),
])
def test_bad_input_gets_a_clear_error(lib, bad, match):
    lib()
    a, b = bad()
    with pytest.raises(dispatch.DispatchError, match=match):
        gemmrl.mm(a, b)


def test_bad_out_is_refused_and_left_untouched(lib):
    lib()
    a, b = rnd(4, 8), rnd(8, 3)
    out = torch.zeros(3, 4, dtype=torch.float16)
    with pytest.raises(dispatch.DispatchError, match="out must be"):
        gemmrl.mm(a, b, out=out)
    assert not out.any()
    with pytest.raises(dispatch.DispatchError, match="inference"):
        gemmrl.mm(a.requires_grad_(), b, out=torch.empty(4, 3, dtype=torch.float16))


@pytest.mark.interpreter
def test_custom_op_registration_and_autograd(lib):
    lib(entry(8, 16, 32), entry(8, 32, 16, layout="nn"))
    a = rnd(8, 32).requires_grad_()
    w = rnd(16, 32, seed=4).requires_grad_()
    torch.library.opcheck(torch.ops.gemmrl.mm.default, (a, w.t()))
    y = gemmrl.linear(a, w)
    assert y.grad_fn is not None
    g = rnd(8, 16, seed=5)
    y.backward(g)
    a2, w2 = a.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    (a2 @ w2.t()).backward(g.double())
    assert (a.grad.double() - a2.grad).abs().max() <= tol(16)
    assert (w.grad.double() - w2.grad).abs().max() <= tol(8)
    # the gradient of b = w.t() comes back as the view of an [N, K] tensor: w's gradient needs no transpose copy
    assert type(y.grad_fn).__name__ == "_MMFunctionBackward"  # eager autograd: no custom-op dispatcher hops
    b, seen = w.t(), []
    b.register_hook(lambda gb: seen.append(gb.stride()))
    gemmrl.mm(a, b).backward(g)
    assert seen == [(1, 32)]  # [K, N] = [32, 16] as the transpose of a row-major [N, K]


@pytest.mark.interpreter
def test_torch_compile_dynamic_m(lib):
    lib(entry(8, 16, 32, m_lo=4, m_hi=12, members=("4_16_32", "12_16_32")))
    w = rnd(16, 32)
    f = torch.compile(lambda x: gemmrl.linear(x, w), dynamic=True, fullgraph=True)
    for M in (5, 9, 12):
        x = rnd(M, 32, seed=M)
        with torch.no_grad():
            y = f(x)
        assert y.shape == (M, 16)
        assert (y.float() - ref(x, w.t())).abs().max() <= tol(32)


def _mlp(dtype=torch.float16):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 16, bias=True), torch.nn.ReLU(), torch.nn.Linear(16, 8, bias=False))
    return m.to(dtype)


@pytest.mark.interpreter
def test_patch_forward_training_and_unpatch(lib):
    lib(entry(4, 16, 32), entry(4, 8, 16))
    model, stock = _mlp(), _mlp()
    x = rnd(4, 32, seed=7)
    rep = gemmrl.patch(model)
    assert rep.patched == ("0", "2") and not rep.skipped
    assert gemmrl.patch(model).patched == ()  # idempotent
    assert gemmrl.served_by(x, model[0].weight.t())["eager"].startswith("triton")
    y, y0 = model(x), stock(x)
    assert (y.float() - y0.float()).abs().max() <= 2 * tol(32)
    y.float().sum().backward()
    y0.float().sum().backward()
    for p, p0 in zip(model.parameters(), stock.parameters()):
        assert p.grad is not None and (p.grad.float() - p0.grad.float()).abs().max() <= 4 * tol(32)
    assert gemmrl.unpatch(model) == 2
    assert "forward" not in model[0].__dict__ and model[0].forward.__func__ is torch.nn.Linear.forward


def test_patch_skips_fp32_layers_and_rejects_non_modules(lib):
    lib()
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8).half())
    rep = gemmrl.patch(m)
    assert rep.patched == ("1",) and rep.skipped[0][0] == "0" and "float32" in rep.skipped[0][1]
    with pytest.raises(TypeError, match="nn.Module"):
        gemmrl.patch(object())
    y = m[1](rnd(2, 8))  # patched, served by torch.matmul without an entry
    assert y.shape == (2, 8)


@pytest.mark.interpreter
def test_warmup_reports_what_serves(lib):
    lib(entry(4, 16, 32))
    recs = gemmrl.warmup(["4_16_32", (5, 16, 32)], layouts=("tn", "nn"))
    got = {(r["mnk"], r["layout"]): r["eager"].split(":")[0].split(" ")[0] for r in recs}
    assert got == {("4_16_32", "tn"): "triton", ("4_16_32", "nn"): "torch.matmul",
                   ("5_16_32", "tn"): "torch.matmul", ("5_16_32", "nn"): "torch.matmul"}
    with pytest.raises(dispatch.DispatchError, match="layout"):
        gemmrl.warmup([(4, 16, 32)], layouts=("tt",))


def test_import_gemmrl_does_not_import_torch_dispatch():
    import subprocess
    import sys

    code = "import sys, gemmrl; print('gemmrl.serve.dispatch' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


@pytest.mark.parametrize("impl", ["cublaslt_autotuned_tn", "cublaslt_heuristic_nn"])
def test_a_pinned_vendor_algorithm_is_found_by_its_description_and_reported(impl):
    """A vendor entry pins its cuBLASLt algorithm by description; served_by (and a bench row's algo) say whether
    this cuBLASLt offered it: a measure pass that finds gemmrl slower than a fresh autotune on a vendor-served shape
    must tell a pin not honoured from the autotune changing its mind (two such shapes in the H100 measure pass)."""
    import dataclasses

    pinned = "id=66 tile=176x64 cluster=4x1x1 waves=0.712"
    e = dataclasses.replace(entry(64, 16384, 128, family="vendor", impl=impl), algo=pinned)
    descs = ["id=66 tile=128x64 cluster=2x1x1 waves=0.970", pinned, "id=66 tile=144x64 cluster=4x1x1 waves=0.864"]
    assert launchers.pin_algorithm(e, descs) == (1, " [pinned: heuristic #1 of 3]")
    idx, note = launchers.pin_algorithm(e, descs[:1] + descs[2:])
    what = "tuned here" if "autotuned" in impl else "the heuristic's first"
    assert idx is None and note == f" [pinned algorithm not among this cuBLASLt's 2: {what}]"
    # the match is exact: a description that differs anywhere (here its wave count) is not the pinned one
    assert launchers.pin_algorithm(e, [pinned.replace("0.712", "0.713")])[0] is None


class _FakeLt:
    """CtypesCandidate's surface as the vendor launcher uses it, on the CPU: which mode it was made in, and a plan
    whose heuristic results are ``DESCS`` (the pin is looked up among them)."""

    DESCS = ["id=66 tile=128x64", "id=66 tile=144x64 cluster=4x1x1", "id=66 tile=96x64"]
    made: list = []
    align_mask = 15

    def __init__(self, name, layout, acc, mode):
        self.mode, self.selected = mode, None
        _FakeLt.made.append(self)

    def prepare(self, problem, bufs, protocol, timer):
        self.prepared = (protocol, timer)

    def algorithms(self):
        return list(self.DESCS)

    def select_algorithm(self, i):
        self.selected = i

    def hot_plan(self):
        return 0, 1

    def plan_error(self, st):
        return RuntimeError(st)

    def info(self):
        return {"algo": self.DESCS[2] if self.mode == "autotuned" else self.DESCS[0]}


@pytest.mark.parametrize("tune", ["pin", "here", None])
@pytest.mark.parametrize("impl", ["cublaslt_autotuned_tn", "cublaslt_heuristic_tn", "cublas_tn"])
def test_vendor_tune_here_autotunes_only_autotuned_entries(monkeypatch, tune, impl):
    """GEMMRL_VENDOR_TUNE=here: a cuBLASLt-autotuned entry is tuned on this machine (its pin unused, the choice in
    the note); pin (the default) selects the library's algorithm; heuristic and cuBLAS entries are never retuned."""
    import dataclasses

    from gemmrl.candidate import make_buffers
    from gemmrl.kernels import vendor

    if tune is None:
        monkeypatch.delenv(launchers.VENDOR_TUNE_ENV, raising=False)
    else:
        monkeypatch.setenv(launchers.VENDOR_TUNE_ENV, tune)
    monkeypatch.setattr(vendor, "CtypesCandidate", _FakeLt)
    _FakeLt.made = []
    e = dataclasses.replace(entry(64, 16384, 128, family="vendor", impl=impl), algo=_FakeLt.DESCS[1])
    p = GemmProblem(64, 16384, 128, layout="tn")
    got = launchers.launch(e, p, make_buffers(p, "cpu", seed=0))
    (cand,) = _FakeLt.made
    assert got.candidate.cand is cand and got.spec[0] == 2  # served through the plan's C entry
    if tune == "here" and "autotuned" in impl:
        assert cand.mode == "autotuned" and cand.selected is None
        assert got.note == " [GEMMRL_VENDOR_TUNE=here: id=66 tile=96x64]"
    elif impl.startswith("cublaslt"):
        assert cand.mode == "heuristic" and cand.selected == 1
        assert got.note == " [pinned: heuristic #1 of 3]"
    else:
        assert cand.mode == "cublas" and got.note == ""
    assert cand.prepared == (e.protocol, None)


def test_a_bad_vendor_tune_setting_is_refused_with_the_choices(monkeypatch):
    monkeypatch.setenv(launchers.VENDOR_TUNE_ENV, "always")
    with pytest.raises(dispatch.DispatchError, match="'pin'.*'here'"):
        launchers.vendor_tune()
    monkeypatch.setenv(launchers.VENDOR_TUNE_ENV, " HERE ")
    assert launchers.vendor_tune() == "here"


# -- GPU tier ---------------------------------------------------------------------------------------------
def _gpu_name():
    return torch.cuda.get_device_properties(torch.cuda.current_device()).name


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["tn", "nn"])
def test_capture_seen_and_unseen_shapes_gpu(lib, layout, monkeypatch):
    monkeypatch.setenv("GEMMRL_LAUNCH_BOUND", "0")  # the race's contender here is the library's config alone
    gpu = _gpu_name()
    cfg = "tiled(BM=64,BN=64,BK=64,warps=4,stages=3,group_m=8)"
    lib(entry(64, 256, 512, gpu=gpu, layout=layout, protocol="graph", impl=cfg),
        entry(64, 256, 512, gpu=gpu, layout=layout, protocol="offline", family="vendor",
              impl=f"cublaslt_heuristic_{layout}"))
    dev = torch.device("cuda")
    a = torch.randn(64, 512, device=dev).half()
    b = torch.randn(512, 256, device=dev).half() if layout == "nn" else torch.randn(256, 512, device=dev).half().t()
    gemmrl.warmup([(64, 256, 512)], layouts=(layout,))
    got = gemmrl.served_by(a, b)
    assert got["graph"].startswith("triton") and got["eager"].startswith("vendor:cublaslt_heuristic")
    a2 = torch.randn(48, 512, device=dev).half()   # never seen: torch.matmul inside the capture
    out, out2 = torch.empty(64, 256, device=dev, dtype=torch.half), torch.empty(48, 256, device=dev, dtype=torch.half)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gemmrl.mm(a, b, out=out)  # warm on the capture stream
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gemmrl.mm(a, b, out=out)
        gemmrl.mm(a2, b, out=out2)
    out.fill_(float("nan"))
    out2.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert (out.float() - a.float() @ b.float()).abs().max() <= tol(512)
    assert (out2.float() - a2.float() @ b.float()).abs().max() <= tol(512)
    # built eagerly now: the fallback race (the vendor plans against the Triton config measured at M=64)
    assert gemmrl.served_by(a2, b)["eager"].startswith(("vendor: ", f"triton:{cfg} [raced at M=48"))
    e = gemmrl.mm(a, b)
    assert (e.float() - a.float() @ b.float()).abs().max() <= tol(512)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["tn", "nn"])
def test_an_unseen_shape_is_served_by_the_raced_vendor_plan_gpu(lib, layout, tmp_path, monkeypatch):
    """No entry: warmup races the vendor plans for the bucket of M and caches the winner in the user cache; the shape
    is served by it (eagerly and in a graph) with torch's result; another M of the bucket takes the same choice
    without a race; a shape first seen inside a capture is served by torch.matmul there, by the vendor plan after."""
    from gemmrl.serve import vendor_choice

    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GEMMRL_LAUNCH_BOUND", "0")  # the vendor plans alone (the table's tiles: the next test)
    raced = []
    real = vendor_choice.race
    monkeypatch.setattr(vendor_choice, "race", lambda *a, **k: (raced.append(1), real(*a, **k))[1])
    lib()
    dev = torch.device("cuda")
    N, K = 1000, 776

    def operands(M):
        a = torch.randn(M, K, device=dev).half()
        return a, (torch.randn(K, N, device=dev).half() if layout == "nn" else torch.randn(N, K, device=dev).half().t())

    rec = gemmrl.warmup([(37, N, K)], layouts=(layout,))
    assert rec[0]["eager"].startswith("vendor: ") and "raced at M=37" in rec[0]["eager"] and raced == [1, 1], rec
    files = list((tmp_path / "vendor-choice").glob("*.json"))
    assert len(files) == 1 and f"{layout}|N={N}|K={K}|M=32-63\"" in files[0].read_text()  # graph replays
    assert f"{layout}|N={N}|K={K}|M=32-63|cold+host+eager\"" in files[0].read_text()  # eager calls: raced with L2 flushed
    cold = json.loads(files[0].read_text())["choices"][f"fp16|{layout}|N={N}|K={K}|M=32-63|cold+host+eager"]
    host = dict(map(tuple, cold["host_us"]))  # the eager race charged torch.matmul and cublasGemmEx their host time
    assert set(host) == {"torch", "cublas"} and all(0.0 <= v < 1e4 for v in host.values()), cold
    a, b = operands(37)
    assert (gemmrl.mm(a, b).float() - a.float() @ b.float()).abs().max() <= tol(K)
    a50, _ = operands(50)
    assert "raced at M=37" in gemmrl.served_by(a50, b)["eager"] and raced == [1, 1]  # the bucket's choice, no race
    a9, _ = operands(9)
    out9, out = torch.empty(9, N, device=dev, dtype=torch.half), torch.empty(37, N, device=dev, dtype=torch.half)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gemmrl.mm(a, b, out=out)
        gemmrl.mm(a9, b, out=out9)  # first seen here: torch.matmul, nothing raced or built in the capture
    out.fill_(float("nan"))
    out9.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert (out.float() - a.float() @ b.float()).abs().max() <= tol(K)
    assert (out9.float() - a9.float() @ b.float()).abs().max() <= tol(K) and raced == [1, 1]
    assert gemmrl.served_by(a9, b)["eager"].startswith("vendor: ") and raced == [1] * 4  # raced at its next eager call
    a40, _ = operands(40)  # first seen inside a capture, its bucket (32..63) raced: the cached plan serves there
    out40 = torch.empty(40, N, device=dev, dtype=torch.half)
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2):
        gemmrl.mm(a40, b, out=out40)
    out40.fill_(float("nan"))
    g2.replay()
    torch.cuda.synchronize()
    assert (out40.float() - a40.float() @ b.float()).abs().max() <= tol(K) and raced == [1] * 4
    assert any(x.graph_desc.endswith("(cached choice, first seen inside capture)") and "raced at M=37" in x.graph_desc
               for x in dispatch._S.in_capture.values())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["tn", "nn"])
@pytest.mark.parametrize("M, N, K", [(4, 14, 2), (8, 48, 16), (1016, 32, 64), (3, 2, 56), (37, 29, 13)])
def test_a_launch_bound_shape_races_the_table_and_whatever_wins_computes_right_eager_and_in_a_graph_gpu(
        lib, layout, dtype, M, N, K, tmp_path, monkeypatch):
    """An unseen launch-bound shape (odd, unaligned sizes too): the race's contenders are the launch-bound table's
    Triton tiles and, at M <= 8, the GEMV rows (its cache key names them), and what serves (a tile or a row after the
    battery, or a vendor plan) gives the fp32 product's answer eagerly and in a captured graph."""
    from gemmrl.serve import gemv_rows, launch_bound, vendor_choice

    a, b, rec, p, raced = _unseen_and_warmed(lib, M, N, K, layout, dtype, tmp_path, monkeypatch)
    tiles = _names(launch_bound.here(p, _gpu_name()))
    rows = _names(gemv_rows.here(p, _gpu_name()))
    assert len(tiles) == launch_bound.COUNT and raced == tiles | rows and bool(rows) == (M <= 8)
    key = vendor_choice.choice_key(p, tuple(sorted(raced)), "cold")
    assert key in next((tmp_path / "vendor-choice").glob("*.json")).read_text(), rec
    for where in ("eager", "graph"):
        assert rec[0][where].startswith(("vendor: ", "triton:tiled(", "triton:smallm(")), rec
    ref = a.float() @ b.float()
    out = gemmrl.mm(a, b)
    assert (out.float() - ref).abs().max() <= tol(K, dtype)
    g_out = torch.empty(M, N, device=a.device, dtype=dtype)
    replayed(lambda: gemmrl.mm(a, b, out=g_out), g_out)
    assert (g_out.float() - ref).abs().max() <= tol(K, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["tn", "nn"])
@pytest.mark.parametrize("M, N, K", [(1, 4096, 4096), (3, 2048, 1408), (8, 1024, 4096), (5, 1000, 777)])
def test_a_decode_shape_races_the_gemv_rows_and_whatever_wins_computes_right_gpu(
        lib, layout, dtype, M, N, K, tmp_path, monkeypatch):
    """An unseen decode shape (M <= 8): the race's contenders include the GEMV rows (its cache key names them), and
    what serves (a row after the battery, or a vendor plan) gives the fp32 product's answer eagerly and in a graph."""
    from gemmrl.serve import gemv_rows, vendor_choice

    a, b, rec, p, raced = _unseen_and_warmed(lib, M, N, K, layout, dtype, tmp_path, monkeypatch)
    rows = _names(gemv_rows.here(p, _gpu_name()))
    assert rows and rows <= raced
    assert vendor_choice.choice_key(p, tuple(sorted(raced)), "cold") in \
        next((tmp_path / "vendor-choice").glob("*.json")).read_text(), rec
    ref = a.float() @ b.float()
    assert (gemmrl.mm(a, b).float() - ref).abs().max() <= tol(K, dtype), rec
    out = torch.empty(M, N, device=a.device, dtype=dtype)
    replayed(lambda: gemmrl.mm(a, b, out=out), out)
    assert (out.float() - ref).abs().max() <= tol(K, dtype), rec


@pytest.mark.gpu
@pytest.mark.skipif(not toolchain.find_nvcc(), reason="needs nvcc")
@pytest.mark.parametrize("M, N, K, dtype", [(8, 4096, 4096, torch.float16), (1, 3584, 18944, torch.bfloat16)])
def test_a_decode_shape_races_the_decode_rows_deferred_on_a_capped_first_sight_gpu(lib, M, N, K, dtype, tmp_path,
                                                                                    monkeypatch):
    """An unseen decode shape in layout tn: a first sight under the build cap, with the decode family not built in
    this cache, races without its rows (they wait for warmup, no nvcc run in the call); warmup builds them and races
    them (its cache key names them); what serves is the fp32 product's answer eagerly and in a graph."""
    from gemmrl.kernels import decode_gemm
    from gemmrl.serve import decode_rows

    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GEMMRL_DECODE_ROWS", "1")  # the lib fixture turned them off
    monkeypatch.setenv(dispatch.FIRST_CALL_BUILD_ENV, "2")
    monkeypatch.setattr(decode_gemm._FAMILY, "built", {})  # nothing built in this process: the fresh cache decides
    lib()
    dev = torch.device("cuda")
    a = torch.randn(M, K, device=dev).to(dtype)
    b = torch.randn(N, K, device=dev).to(dtype).t()
    ref = a.float() @ b.float()
    p = GemmProblem(M, N, K, dtype={torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype], acc="fp32", layout="tn")
    rows = _names(decode_rows.here(p, _gpu_name()))
    assert len(rows) == decode_rows.COUNT
    t0 = time.perf_counter()
    assert (gemmrl.mm(a, b).float() - ref).abs().max() <= tol(K, dtype)
    assert time.perf_counter() - t0 < 20, "a first sight waited on the decode family's nvcc build"
    assert all(r not in gemmrl.served_by(a, b)["eager"] for r in rows)
    rec = gemmrl.warmup([(M, N, K)], dtype=dtype, layouts=("tn",))
    raced = _names(dispatch._contenders(dispatch.library(), _gpu_name(), p))
    assert rows <= raced
    text = "".join(f.read_text() for f in (tmp_path / "vendor-choice").glob("*.json"))
    assert any(r.split(":", 1)[1] in text for r in rows), rec
    assert (gemmrl.mm(a, b).float() - ref).abs().max() <= tol(K, dtype), rec
    out = torch.empty(M, N, device=dev, dtype=dtype)
    replayed(lambda: gemmrl.mm(a, b, out=out), out)
    assert (out.float() - ref).abs().max() <= tol(K, dtype), rec


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["tn", "nn"])
def test_a_first_call_with_no_build_budget_races_the_vendor_plans_and_warmup_races_the_rest_gpu(
        lib, layout, tmp_path, monkeypatch):
    """GEMMRL_FIRST_CALL_BUILD_S=0: a launch-bound shape's first call builds no generated contender (a vendor plan
    serves, with the fp32 product's answer; served_by says what was left out, its choice is cached under no
    contender); warmup builds and races the table's tiles (its cache key names them) and what serves after it is
    right eagerly and in a captured graph."""
    from gemmrl.serve import launch_bound, vendor_choice

    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(dispatch.FIRST_CALL_BUILD_ENV, "0")
    for env in ("GEMMRL_LAUNCH_BOUND", "GEMMRL_GEMV_ROWS"):
        monkeypatch.delenv(env, raising=False)
    lib()
    M, N, K = 37, 29, 13
    dev = torch.device("cuda")
    a = torch.randn(M, K, device=dev).half()
    b = torch.randn(K, N, device=dev).half() if layout == "nn" else torch.randn(N, K, device=dev).half().t()
    ref = a.float() @ b.float()
    assert (gemmrl.mm(a, b).float() - ref).abs().max() <= tol(K)
    p = GemmProblem(M, N, K, dtype="fp16", acc="fp32", layout=layout)
    tiles = _names(launch_bound.here(p, _gpu_name()))
    s = dispatch._TABLE[(a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, 0, 0)]
    assert set(s.deferred) == tiles and s.eager_desc.startswith("vendor: ") and "gemmrl.warmup races them" in \
        s.eager_desc
    text = next((tmp_path / "vendor-choice").glob("*.json")).read_text()
    assert vendor_choice.choice_key(p, (), "cold") in text
    assert vendor_choice.choice_key(p, tuple(sorted(tiles)), "cold") not in text
    rec = gemmrl.warmup([(M, N, K)], layouts=(layout,))
    text = next((tmp_path / "vendor-choice").glob("*.json")).read_text()
    assert vendor_choice.choice_key(p, tuple(sorted(tiles)), "cold") in text, rec
    assert "not built within" not in rec[0]["eager"] and "not built within" not in rec[0]["graph"]
    assert (gemmrl.mm(a, b).float() - ref).abs().max() <= tol(K)
    out = torch.empty(M, N, device=dev, dtype=torch.half)
    replayed(lambda: gemmrl.mm(a, b, out=out), out)
    assert (out.float() - ref).abs().max() <= tol(K)


def _names(entries) -> set[str]:
    return {f"{e.family}:{e.impl}" for e in entries}


def _unseen_and_warmed(lib, M, N, K, layout, dtype, tmp_path, monkeypatch):
    """An empty library, the user cache in ``tmp_path``, both tables on: operands of (M, N, K) in ``layout``, the
    shape warmed up (raced); (a, b, warmup's record, the problem, the race's contenders by name)."""
    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path))
    for env in ("GEMMRL_LAUNCH_BOUND", "GEMMRL_GEMV_ROWS"):
        monkeypatch.delenv(env, raising=False)
    lib()
    dev = torch.device("cuda")
    a = torch.randn(M, K, device=dev).to(dtype)
    b = torch.randn(K, N, device=dev).to(dtype) if layout == "nn" else torch.randn(N, K, device=dev).to(dtype).t()
    rec = gemmrl.warmup([(M, N, K)], dtype=dtype, layouts=(layout,))
    p = GemmProblem(M, N, K, dtype={torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype], acc="fp32", layout=layout)
    return a, b, rec, p, _names(dispatch._contenders(dispatch.library(), _gpu_name(), p))


def replayed(call, out) -> None:
    """``call`` warmed on a side stream, captured in a CUDA graph, ``out`` set to NaN, the graph replayed once."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call()
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["tn", "nn"])
def test_an_unseen_shape_at_large_m_confirms_its_buckets_plan_at_its_own_m_gpu(lib, layout, tmp_path, monkeypatch):
    """From CONFIRM_M rows up, another M of a raced bucket races the bucket's vendor plan against the three defaults
    at its own M (graph and cold), keeps the winner for that M alone and serves it with torch's result; the next call
    at that M, and a capture of it, race nothing."""
    from gemmrl.serve import vendor_choice

    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path))
    raced = []
    real = vendor_choice.race
    monkeypatch.setattr(vendor_choice, "race",
                        lambda plans, *a, **k: (raced.append(len(plans)), real(plans, *a, **k))[1])
    lib()
    dev = torch.device("cuda")
    N, K = 1000, 776
    M0, M1 = 1100, 1900  # one bucket (1024..2047), both >= CONFIRM_M
    assert vendor_choice.m_bucket(M0) == vendor_choice.m_bucket(M1) and M0 >= vendor_choice.CONFIRM_M
    gemmrl.warmup([(M0, N, K)], layouts=(layout,))
    assert len(raced) == 2 and min(raced) > 4, raced  # the full race, graph and cold
    a = torch.randn(M1, K, device=dev).half()
    b = torch.randn(K, N, device=dev).half() if layout == "nn" else torch.randn(N, K, device=dev).half().t()
    got = gemmrl.served_by(a, b)
    assert len(raced) == 4 and max(raced[2:]) <= 4, raced  # the confirms: the defaults and the bucket's plan
    assert f"raced at M={M1}" in got["eager"] and f"raced at M={M1}" in got["graph"], got
    text = next((tmp_path / "vendor-choice").glob("*.json")).read_text()
    assert f"|at={M1}" in text and f"|at={M0}" not in text
    assert (gemmrl.mm(a, b).float() - a.float() @ b.float()).abs().max() <= tol(K)
    out = torch.empty(M1, N, device=dev, dtype=torch.half)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gemmrl.mm(a, b, out=out)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert (out.float() - a.float() @ b.float()).abs().max() <= tol(K) and len(raced) == 4


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["tn", "nn"])
def test_an_m_between_tuned_shapes_races_their_kernels_against_the_vendor_plans_gpu(lib, layout, tmp_path,
                                                                                    monkeypatch):
    """Triton entries measured here at M=16 and M=64: M=37 races both configs against the vendor plans (one race for
    the bucket 32..63 in graph and one in cold, their keys naming the contenders); whatever wins serves with torch's result, a Triton winner
    only after the battery; the race's timer captures each plan in a CUDA graph."""
    from gemmrl.serve import vendor_choice

    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path))
    gpu, N, K = _gpu_name(), 1000, 776
    cfg_a = "tiled(BM=64,BN=64,BK=64,warps=4,stages=3,group_m=8)"
    cfg_b = "tiled(BM=32,BN=64,BK=32,warps=4,stages=3,group_m=8)"
    lib(entry(16, N, K, gpu=gpu, layout=layout, protocol="graph", impl=cfg_a),
        entry(64, N, K, gpu=gpu, layout=layout, protocol="graph", impl=cfg_b))
    timed = []
    real = vendor_choice.race
    monkeypatch.setattr(vendor_choice, "race", lambda plans, *a, **k: (timed.append(sorted(plans)), real(plans, *a,
                                                                                                          **k))[1])
    rec = gemmrl.warmup([(37, N, K)], layouts=(layout,))
    assert len(timed) == 2 and {f"gen#triton:{cfg_a}", f"gen#triton:{cfg_b}", "torch", "cublas"} <= set(timed[0])
    assert timed[0] == timed[1]  # the eager race (cold) and the graph race: the same plans
    assert rec[0]["graph"].startswith(("vendor: ", "triton:")) and "raced at M=37" in rec[0]["graph"], rec
    text = next((tmp_path / "vendor-choice").glob("*.json")).read_text()
    assert f"{layout}|N={N}|K={K}|M=32-63|gen=" in text
    dev = torch.device("cuda")
    a = torch.randn(37, K, device=dev).half()
    b = torch.randn(K, N, device=dev).half() if layout == "nn" else torch.randn(N, K, device=dev).half().t()
    assert (gemmrl.mm(a, b).float() - a.float() @ b.float()).abs().max() <= tol(K)
    assert len(timed) == 2
    fn = lambda: torch.matmul(a, b)  # noqa: E731
    warm, cold = vendor_choice.event_timer(fn), vendor_choice.cold_timer(fn)
    assert 0 < warm < 1.0 and 0 < cold < 1.0  # ms per call (warm: a captured graph; cold: eager calls, each after a
    #                                             flush, the flushes' time taken out)


@pytest.mark.gpu
@pytest.mark.parametrize("tune", ["pin", "here"])
def test_vendor_tune_serves_a_correct_cublaslt_choice_gpu(lib, monkeypatch, tune):
    """A cuBLASLt-autotuned entry pinned to an algorithm this cuBLASLt offers runs its pin by default; with
    GEMMRL_VENDOR_TUNE=here it is autotuned on this GPU instead, and served_by says what was chosen. Both are right."""
    import dataclasses

    from gemmrl.candidate import make_buffers
    from gemmrl.kernels import vendor

    monkeypatch.setenv(launchers.VENDOR_TUNE_ENV, tune)
    gpu, (M, N, K) = _gpu_name(), (128, 1024, 512)
    lt = vendor.CtypesCandidate("probe", "tn", "fp32", "heuristic")
    p = GemmProblem(M, N, K, layout="tn")
    lt.prepare(p, make_buffers(p, "cuda"), "offline", None)
    first = lt.info()["algo"]  # the heuristic's first: a pin this cuBLASLt offers
    lib(dataclasses.replace(entry(M, N, K, gpu=gpu, protocol="offline", family="vendor", impl="cublaslt_autotuned_tn"),
                            algo=first))
    a = torch.randn(M, K, device="cuda").half()
    b = torch.randn(N, K, device="cuda").half().t()
    served = gemmrl.served_by(a, b)["eager"]
    assert ("GEMMRL_VENDOR_TUNE=here: id=" in served) == (tune == "here"), served
    assert ("[pinned: heuristic #0 of" in served) == (tune == "pin"), served
    assert (gemmrl.mm(a, b).float() - a.float() @ b.float()).abs().max() <= tol(K)


@pytest.mark.gpu
def test_capture_serves_the_graph_entry_gpu(lib, hot_path, monkeypatch):
    """Eagerly the offline entry serves (torch.matmul here, counted), inside capture the graph entry (Triton): the
    capture question is answered right on every hot path (the torch-built one asks the driver)."""
    from gemmrl.serve import fastpath

    if hot_path == "torch":
        assert fastpath.load_kind("torch").driver_capture_query()
    calls = []

    def counted(a, b, out):
        calls.append(1)
        torch.matmul(a, b, out=out)

    monkeypatch.setattr(launchers, "torch_mm", counted)
    gpu = _gpu_name()
    lib(entry(64, 256, 512, gpu=gpu, protocol="graph", impl="tiled(BM=64,BN=64,BK=64,warps=4,stages=3,group_m=8)"),
        entry(64, 256, 512, gpu=gpu, protocol="offline", family="vendor", impl="torch"))
    a = torch.randn(64, 512, device="cuda").half()
    b = torch.randn(256, 512, device="cuda").half().t()
    gemmrl.warmup([(64, 256, 512)], layouts=("tn",))
    assert gemmrl.served_by(a, b)["graph"].startswith("triton")
    out = torch.empty(64, 256, device="cuda", dtype=torch.half)
    s = torch.cuda.Stream()  # eager on a side stream too: the capture question is asked there, and says no
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        n0 = len(calls)
        gemmrl.mm(a, b, out=out)
        assert len(calls) == n0 + 1
    torch.cuda.current_stream().wait_stream(s)
    n0 = len(calls)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gemmrl.mm(a, b, out=out)
    assert len(calls) == n0  # the graph entry (Triton) was captured, not the eager one
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert (out.float() - a.float() @ b.float()).abs().max() <= tol(512)


@pytest.mark.gpu
@pytest.mark.skipif(not have_cutlass_toolchain(), reason="needs nvcc and the nvidia-cutlass headers")
@pytest.mark.parametrize("shape, impl, torch_v", [
    ((256, 512, 128), CUT, ""),
    # an odd M, N and K not multiples of the tile: checked through the full battery (an entry of other software)
    ((100, 264, 136), "pingpong_64x16x128_c1x1_persistent_tn_fp16_swap:s1_rh_dheuristic_k1", "0.0.0"),
    ((100, 264, 136), "coop_128x128x64_c1x1_streamk_nn_fp16:s1_rh_dstreamk_k1", ""),
])
def test_cutlass_entry_serves_gpu(lib, hot_path, shape, impl, torch_v, monkeypatch):
    """A CUTLASS entry serves eagerly and inside a CUDA-graph capture, with torch's result; a call whose pointers
    are not 16-byte aligned goes to torch.matmul and is right too. Through a compiled hot path the calls after the
    first run the plan's C entry: the Python launcher is not called again."""
    from gemmrl.kernels.cutlass_sm90 import CutlassCandidate

    py_calls = []
    real_call = CutlassCandidate.__call__
    monkeypatch.setattr(CutlassCandidate, "__call__", lambda self, *a: (py_calls.append(1), real_call(self, *a)))
    M, N, K = shape
    layout = "nn" if "_nn_" in impl else "tn"
    gpu = _gpu_name()
    lib(entry(M, N, K, gpu=gpu, layout=layout, family="cutlass", impl=impl, torch_v=torch_v))  # offline: both modes
    dev = torch.device("cuda")
    a = torch.randn(M, K, device=dev).half()
    b = torch.randn(K, N, device=dev).half() if layout == "nn" else torch.randn(N, K, device=dev).half().t()
    got = gemmrl.served_by(a, b)
    assert all(d.startswith(f"cutlass:{impl} (offline entry {M}_{N}_{K}") for d in got.values()), got
    want = a.float() @ b.float()
    assert (gemmrl.mm(a, b).float() - want).abs().max() <= tol(K)  # builds (a reference check calls the launcher)
    built_calls = len(py_calls)
    for _ in range(2):
        assert (gemmrl.mm(a, b).float() - want).abs().max() <= tol(K)
    assert len(py_calls) == built_calls + (2 if hot_path == "python" else 0), (hot_path, len(py_calls), built_calls)
    served = dispatch._S.built[(M, N, K, a.dtype, layout, a.device.index)]
    assert served.eager_spec[0] == 2 and served.eager_spec[-1].name.startswith("gemmrl:cutlass:")  # plan, C entry
    out = torch.full((M, N), float("nan"), device=dev, dtype=torch.half)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gemmrl.mm(a, b, out=out)
    g.replay()
    torch.cuda.synchronize()
    assert (out.float() - want).abs().max() <= tol(K)
    shifted = torch.empty(M * K + 1, device=dev, dtype=torch.half)[1:].view(M, K)  # 2 bytes past an aligned start
    shifted.copy_(a)
    assert shifted.data_ptr() % 16 and gemmrl.served_by(shifted, b)["eager"].startswith("cutlass:")
    assert (gemmrl.mm(shifted, b).float() - want).abs().max() <= tol(K)


@pytest.mark.gpu
@pytest.mark.skipif(not toolchain.find_nvcc(), reason="needs nvcc")
@pytest.mark.parametrize("fam, shape, impl, dtype", [
    ("tiny", (64, 64, 1024), "32x32_s8_st4_fp16", torch.float16),
    ("tiny", (100, 72, 2056), "16x64_s16_st4_bf16", torch.bfloat16),
    ("decode", (1, 4100, 4104), "r1_w1x8_u4_st4_s1_fp16", torch.float16),
    ("decode", (12, 70, 1000), "r1_w1x8_st12_s1_bf16", torch.bfloat16)])
def test_plan_family_entry_serves_gpu(lib, hot_path, fam, shape, impl, dtype, monkeypatch):
    """A tiny- or decode-family entry serves eagerly and inside a CUDA-graph capture, with torch's result; through a
    compiled hot path the calls after the first run the plan's C entry; an unaligned call goes to torch.matmul."""
    from gemmrl.kernels.decode_gemm import DecodeCandidate
    from gemmrl.kernels.tiny_gemm import TinyCandidate

    cls = {"tiny": TinyCandidate, "decode": DecodeCandidate}[fam]
    py_calls = []
    real_call = cls.__call__
    monkeypatch.setattr(cls, "__call__", lambda self, *a: (py_calls.append(1), real_call(self, *a)))
    M, N, K = shape
    dt = "bf16" if dtype == torch.bfloat16 else "fp16"
    lib(entry(M, N, K, gpu=_gpu_name(), layout="tn", family=fam, impl=impl, dtype=dt, torch_v="0.0.0"))
    dev = torch.device("cuda")
    a = torch.randn(M, K, device=dev).to(dtype)
    b = torch.randn(N, K, device=dev).to(dtype).t()
    got = gemmrl.served_by(a, b)
    assert all(d.startswith(f"{fam}:{impl} (offline entry {M}_{N}_{K}") for d in got.values()), got
    want = a.float() @ b.float()
    assert (gemmrl.mm(a, b).float() - want).abs().max() <= tol(K, dtype)  # built through the full battery
    built_calls = len(py_calls)
    for _ in range(2):
        assert (gemmrl.mm(a, b).float() - want).abs().max() <= tol(K, dtype)
    assert len(py_calls) == built_calls + (2 if hot_path == "python" else 0), (hot_path, len(py_calls), built_calls)
    served = dispatch._S.built[(M, N, K, a.dtype, "tn", a.device.index)]
    assert served.eager_spec[0] == 2 and served.eager_spec[-1].name.startswith(f"gemmrl:{fam}:")
    out = torch.full((M, N), float("nan"), device=dev, dtype=dtype)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gemmrl.mm(a, b, out=out)
    g.replay()
    torch.cuda.synchronize()
    assert (out.float() - want).abs().max() <= tol(K, dtype)
    shifted = torch.empty(M * K + 1, device=dev, dtype=dtype)[1:].view(M, K)  # 2 bytes past an aligned start
    shifted.copy_(a)
    assert (gemmrl.mm(shifted, b).float() - want).abs().max() <= tol(K, dtype)


@pytest.mark.gpu
def test_torch_compile_gpu(lib, monkeypatch):
    monkeypatch.setenv("GEMMRL_VENDOR_FALLBACK", "off")  # the bucket entry serves its unmeasured M unraced
    gpu = _gpu_name()
    cfg = "smallm(BM=16,BN=64,BK=128,warps=4,stages=4,split=1,reduction=none,tma=False)"
    lib(entry(16, 1024, 512, gpu=gpu, protocol="offline", impl=cfg, m_lo=1, m_hi=32,
              members=("1_1024_512", "32_1024_512")))
    w = torch.randn(1024, 512, device="cuda").half()
    f = torch.compile(lambda x: gemmrl.linear(x, w), dynamic=True)
    for M in (3, 9, 16):  # smallm BM=16 is valid for M <= 16 (the validity predicate refuses 17..32: vendor)
        x = torch.randn(M, 512, device="cuda").half()
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            y = f(x)
            served = gemmrl.served_by(x, w.t())
        err = (y.float() - x.float() @ w.float().t()).abs().max().item()
        assert err <= tol(512), (M, err, served)
        assert served["eager"].startswith("triton"), (M, served, [str(c.message)[:300] for c in caught])


@pytest.mark.gpu
def test_lookup_host_cost_gpu(lib, hot_path, record_property):
    """gemmrl.mm's host time once the shape is seen, against the served launcher's own and against the full path
    (what every call would cost without the hot path). The hot path must be cheaper than the full path, and
    gemmrl.mm may add at most the hot path's bound over the launcher (figures: dispatch_host_cost.csv; with the
    torch-built path gemmrl.mm costs less than the launcher's own Python call)."""
    lib(entry(16, 1024, 512, gpu=_gpu_name(), protocol="offline",
              impl="smallm(BM=16,BN=64,BK=128,warps=4,stages=4,split=1,reduction=none,tma=False)"))
    a = torch.randn(16, 512, device="cuda").half()
    w = torch.randn(1024, 512, device="cuda").half()
    out = torch.empty(16, 1024, device="cuda", dtype=torch.half)
    b = w.t()
    s = dispatch._mm_served(a, b)
    assert s.eager_desc.startswith("triton"), s.eager_desc
    from gemmrl.clocks import max_sm_mhz

    hot = dispatch._hot  # the hot path alone against the full path (each without gemmrl.mm's wrapper)
    fns = {"direct": lambda: s.eager(a, b, out), "through": lambda: gemmrl.mm(a, b, out=out),
           "hot": lambda: hot(a, b, out), "full": lambda: dispatch._mm(a, b, out)}
    n = 200  # host time alone: each batch queues behind a device sleep that outlasts it; rounds interleaved
    cycles = int(n * 60e-6 * max_sm_mhz(torch.cuda.current_device()) * 1e6)
    got = {k: [] for k in fns}
    for _ in range(15):
        for k, f in fns.items():
            torch.cuda.synchronize()
            torch.cuda._sleep(cycles)
            t = time.perf_counter()
            for _ in range(n):
                f()
            got[k].append((time.perf_counter() - t) / n * 1e6)
    torch.cuda.synchronize()
    med = {k: sorted(v)[len(v) // 2] for k, v in got.items()}
    record_property("lookup_us", med["through"] - med["direct"])
    if hot_path != "python":  # (the Python hot path does about what the full path does: it is the no-compiler fallback)
        assert med["hot"] < med["full"], (dispatch.hot_path(), med)
    # the serving bar's target (< 0.5 us added by the lookup) holds for the torch-built path, the one served wherever it
    # builds; the CPython-only and Python fallbacks cost more (H100: about +1 us and +6 us)
    bound = {"torch": 0.5, "c": 2.5, "python": 8.0}[hot_path]
    assert med["through"] - med["direct"] < bound, (dispatch.hot_path(), med)


@pytest.mark.interpreter
def test_bench_times_gemmrl_through_the_library(lib, tmp_path):
    from gemmrl.measure.bench import BenchSpec, run_bench
    from gemmrl.serve.bench_candidate import gemmrl_candidates
    from gemmrl.problem import GemmProblem
    from gemmrl.results import read_rows
    from gemmrl.timing import TimingConfig

    lib(entry(5, 24, 16, layout="nn"))
    spec = BenchSpec(problems=(GemmProblem(5, 24, 16), GemmProblem(3, 8, 16)), protocols=("offline",),
                     out=tmp_path / "r.csv", cfg=TimingConfig(warmup_s=0.0, benchmark_s=0.05), vendor=False,
                     extra=(gemmrl_candidates,), labels=(("5_24_16", "toy layer"),))
    rows = read_rows([run_bench(spec, progress=False, on_cpu=True, verifier=lambda c, p: (True, ""))])
    got = {r["mnk"]: r for r in rows if r["candidate"] == "gemmrl"}
    assert set(got) == {"5_24_16", "3_8_16"}
    assert got["5_24_16"]["layout"] == "nn" and "eager=triton:" in got["5_24_16"]["algo"]
    assert got["5_24_16"]["label"] == "toy layer" and got["3_8_16"]["label"] == ""
    assert "eager=torch.matmul" in got["3_8_16"]["algo"] and float(got["3_8_16"]["time_ms"]) > 0


def test_example_block_patched_matches_stock_on_cpu(lib):
    import importlib.util
    from pathlib import Path

    lib()
    path = Path(__file__).resolve().parents[2] / "examples" / "transformer_block.py"
    spec = importlib.util.spec_from_file_location("transformer_block", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    stock = mod.Block(hidden=64, heads=4, kv_heads=2, head_dim=16, inter=96).to(torch.bfloat16)
    ours = mod.Block(hidden=64, heads=4, kv_heads=2, head_dim=16, inter=96).to(torch.bfloat16)
    ours.load_state_dict(stock.state_dict())
    assert len(gemmrl.patch(ours).patched) == 5
    x = rnd(2, 3, 64, dtype=torch.bfloat16)
    y, y0 = ours(x), stock(x)
    assert (y.float() - y0.float()).abs().max() <= 0.1 * y0.float().abs().max()
    assert [s for s in ours.gemm_shapes(6)] == [(6, 128, 64), (6, 64, 64), (6, 96, 64), (6, 64, 96)]


def test_public_names_resolve_once():
    """gemmrl.mm is looked up through the package's lazy __getattr__ once, then is a plain attribute (every call
    through the hook cost ~2.5 us on the H100)."""
    for name in ("mm", "linear", "warmup"):
        assert getattr(gemmrl, name) is getattr(dispatch, name)
        assert vars(gemmrl)[name] is getattr(dispatch, name)


@pytest.mark.parametrize("shape,how", [((7, 16), "transposed"), ((3, 5, 16), "transposed"), ((1, 16), "sliced"),
                                       ((2, 3, 16), "sliced")])
def test_a_not_row_major_is_served_by_the_hot_path(hot_path, shape, how):
    """An a that is not row-major (backward's weight gradient reads the activation's gradient transposed) is only
    ever served by torch.matmul: the torch-built hot path keeps its signature and serves it with ATen's matmul_out,
    without the Python lookup; the same values as torch.matmul on every hot path, and a row-major a of the same
    shape is a signature of its own."""
    dispatch.use_library(Library())
    try:
        if how == "transposed":  # the same shape with its strides reversed
            a = rnd(*reversed(shape), seed=2).permute(*reversed(range(len(shape))))
        else:  # every other element of a wider row
            a = rnd(*shape[:-1], 2 * shape[-1], seed=2)[..., ::2]
        w = rnd(24, 16, seed=4)
        assert a.shape == shape and not a.is_contiguous()
        first = gemmrl.mm(a, w.t())
        if hot_path == "torch":
            stored = dispatch._S.ctorch.size()
            assert stored == 1
        for _ in range(2):
            out = torch.full((*shape[:-1], 24), float("nan"), dtype=torch.float16)
            assert gemmrl.mm(a, w.t(), out=out) is out
            assert torch.equal(out, torch.matmul(a, w.t())) and torch.equal(first, out)
        assert gemmrl.served_by(a, w.t())["eager"] == "torch.matmul"
        row = a.contiguous()
        assert torch.equal(gemmrl.mm(row, w.t()), first)
        if hot_path == "torch":
            assert dispatch._S.ctorch.size() == stored + 1  # a row-major a: another key
    finally:
        dispatch.use_library(Library())


def test_no_entry_spec_is_torch_matmul_kind(hot_path):
    """Where torch.matmul serves, the compiled paths get spec kind 3 (the torch-built one calls ATen's matmul_out
    without Python; the C one calls the launcher): same result as torch.matmul on every hot path."""
    dispatch.use_library(Library())
    try:
        for shape in ((3, 16), (2, 5, 16)):  # leading batch dims too
            a, w = rnd(*shape, seed=3), rnd(24, 16, seed=4)
            out = torch.full((*shape[:-1], 24), float("nan"), dtype=torch.float16)
            assert gemmrl.mm(a, w.t(), out=out) is out
            assert gemmrl.mm(a, w.t(), out=out) is out  # the second call is the hot path's
            assert torch.equal(out, torch.matmul(a, w.t()))
            assert torch.equal(gemmrl.mm(a, w.t()), out)
        if hot_path == "c":
            assert {e[4][0] for e in dispatch._CFAST.values()} == {3}
    finally:
        dispatch.use_library(Library())


def test_a_corrupt_user_library_is_skipped_with_one_warning(tmp_path, monkeypatch):
    """An unreadable library in the user cache must not stop every gemmrl.mm call: serving goes on without it and
    says so once; a library named in GEMMRL_LIBRARY is the user's explicit choice and still raises."""
    from gemmrl import library as L

    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("GEMMRL_LIBRARY", raising=False)
    L.user_library_path().write_text("{corrupt")
    try:
        with pytest.warns(RuntimeWarning, match="user library .* is not usable, serving without it"):
            served = dispatch.use_library(None)
        assert served.entries == L.packaged().entries
        a, w = rnd(5, 24), rnd(8, 24, seed=1)
        assert (gemmrl.mm(a, w.t()).float() - ref(a, w.t())).abs().max() <= tol(24)
        assert L.user_library_path().read_text() == "{corrupt"  # nothing overwritten
        with pytest.raises(L.LibraryError):
            L.load_default()  # the CLI's lib commands refuse it, with what to do
        monkeypatch.setenv("GEMMRL_LIBRARY", str(L.user_library_path()))
        with pytest.raises(L.LibraryError):
            dispatch.use_library(None)
    finally:
        dispatch.use_library(Library())


def test_building_the_hot_path_says_so_once(tmp_path, monkeypatch, capfd):
    """The first call of a new install waits for the hot path's compile: it says so (on stderr), and only then."""
    from gemmrl.serve import fastpath

    if fastpath._compiler() is None:
        pytest.skip("no C compiler here")
    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path))
    fastpath.build()
    assert "building gemmrl.mm's compiled hot path (c)" in capfd.readouterr().err
    fastpath.build()  # found in the cache: not a word
    assert "building" not in capfd.readouterr().err
