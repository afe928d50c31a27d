"""evaluate(): one candidate at one problem -- made, checked against its declaration, verified, timed beside the
baselines -- on the CPU tier (Triton interpreter, host protocol, no baselines) and, on a GPU, with the vendor
paths and the CUDA-graph serving check."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from gemmrl.measure.evaluate import CandidateSpec, EvalRequest, evaluate, outcome
from gemmrl.kernels.cuda_source import CudaSource, ShapeRange
from gemmrl.adversarial.planted_cuda import planted_source
from gemmrl.problem import GemmProblem
from gemmrl.timing import TimingConfig

CPU_TIMING = TimingConfig(warmup_s=0.0, benchmark_s=0.05)


def _cpu(problem, spec):
    return evaluate(EvalRequest(problem, spec, protocols=("offline",), baselines=(), timing=CPU_TIMING,
                                graph_check=False, device="cpu"))


@pytest.mark.interpreter
@pytest.mark.parametrize("shape", [(1, 7, 13), (33, 65, 40)])
def test_correct_planted_earns_rows(shape):
    ev = _cpu(GemmProblem(*shape, layout="nn"), CandidateSpec("planted_triton", "correct", layout="nn"))
    assert ev["failure"] == "", ev["reason"]
    mine = [r for r in ev["rows"] if r["candidate"] == ev["candidate"]]
    assert mine and mine[0]["verified"] is True and mine[0]["time_ms"] > 0
    assert math.isnan(ev["reward"])  # no baseline was timed, so no speedup and no reward


@pytest.mark.interpreter
@pytest.mark.parametrize("mode,check", [("fp16_acc", "accuracy"), ("skip_last_k", "exact"), ("partial_write", "not written")])
def test_wrong_planted_rejected_with_reason(mode, check):
    ev = _cpu(GemmProblem(33, 65, 129, layout="nn"), CandidateSpec("planted_triton", mode, layout="nn"))
    assert ev["failure"] == "rejected"
    assert ev["rows"] == ()
    assert ev["reason"]


def test_outside_declaration_is_never_built():
    src = CudaSource("this does not even compile", shapes=ShapeRange.parse("64_64_64"), name="cuda:only64")
    ev = _cpu(GemmProblem(64, 64, 128), CandidateSpec("cuda", src))
    assert ev["failure"] == "shape" and "64_64_64" in ev["reason"] and ev["candidate"] == "cuda:only64"


def test_unknown_family():
    with pytest.raises(ValueError, match="family"):
        CandidateSpec("pytorch", "x")


def test_outcome_prefers_the_sandbox_status():
    class R:
        def __init__(self, status, value):
            self.status, self.value = status, value

    assert outcome(R("timeout", None)) == "timeout"
    assert outcome(R("ok", {"failure": "rejected"})) == "rejected"
    assert outcome(R("ok", {"failure": ""})) == "ok"


@pytest.mark.gpu
def test_gpu_evaluation_with_baselines():
    ev = evaluate(EvalRequest(GemmProblem(128, 256, 64), CandidateSpec("cuda", planted_source("correct")),
                              baselines=("cublaslt_heuristic_tn", "cublas_tn")))
    assert ev["failure"] == "", ev["reason"]
    assert ev["graph_safe"] is True
    assert set(ev["speedup"]) == {"graph", "cold"} and all(s > 0 for s in ev["speedup"].values())
    assert math.isfinite(ev["reward"])
    assert {r["candidate"] for r in ev["rows"]} >= {"cuda:planted-correct", "cublaslt_heuristic_tn", "vendor_best"}


@pytest.mark.interpreter
def test_evaluation_comes_back_through_the_sandbox(tmp_path):
    """The reply of a worker must be plain data (the pool refuses anything else): torch's version string, numpy
    scalars and the like are converted by evaluate()."""
    from gemmrl.sandbox import Job, SandboxPool

    req = EvalRequest(GemmProblem(33, 65, 40, layout="nn"), CandidateSpec("planted_triton", "correct", layout="nn"),
                      protocols=("offline",), baselines=(), timing=CPU_TIMING, graph_check=False, device="cpu")
    with SandboxPool(n_workers=1, scratch_root=tmp_path, env={"TRITON_INTERPRET": "1"}) as pool:
        r = pool.run([Job("ok", "gemmrl.measure.evaluate:evaluate_job", req, timeout_s=120)])[0]
    assert r.status == "ok", r.error
    assert outcome(r) == "ok" and r.value["rows"][0]["torch"]


# A Triton source kernel right at every shape but long K: it reads only the first 4096 of K (a buffer sized for
# the shapes it was tried at). Declared for any shape, it passes the battery at a small shape; the far corner of
# its declaration (the largest K, with M and N small, cheap on the interpreter) catches it.
SHORT_K_KERNEL = '''# gemmrl: layout=nn shapes=any
import triton
import triton.language as tl


@triton.jit
def _mm(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    KK = tl.minimum(K, 4096)
    for k0 in range(0, KK, BK):
        kk = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * s_am + kk[None, :] * s_ak, mask=(rm[:, None] < M) & (kk[None, :] < KK),
                    other=0.0)
        b = tl.load(b_ptr + kk[:, None] * s_bk + rn[None, :] * s_bn, mask=(kk[:, None] < KK) & (rn[None, :] < N),
                    other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def gemm(a, b, c):
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
    _mm[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
              BM=16, BN=16, BK=256)
'''


@pytest.mark.interpreter
def test_source_wrong_only_at_long_k_is_rejected_at_the_far_corner_of_its_declaration():
    from gemmrl.kernels.triton_source import TritonSource

    src = TritonSource(SHORT_K_KERNEL, layout="nn", shapes=ShapeRange.parse("any"), name="triton_source:short_k")
    ev = _cpu(GemmProblem(16, 16, 4096, layout="nn"), CandidateSpec("triton_source", src, layout="nn"))
    assert ev["failure"] == "rejected", ev
    assert ev["reason"].startswith("declared_range:") and "1_1_16384" in ev["reason"], ev["reason"]
    # the two probes that came before the far corners (one multiple smaller, about half) stay inside K <= 4096,
    # where it is right: declared for those Ks only, it is verified (and timed), long-K probe and all
    assert all(k <= 4096 for _, _, k in src.shapes.probes(16, 16, 4096, n=2))
    honest = replace(src, shapes=ShapeRange.parse("K=1..4096"), name="triton_source:short_k_declared")
    ev = _cpu(GemmProblem(16, 16, 4096, layout="nn"), CandidateSpec("triton_source", honest, layout="nn"))
    assert ev["failure"] == "", ev["reason"]
