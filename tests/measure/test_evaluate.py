"""evaluate(): one candidate at one problem -- made, checked against its declaration, verified, timed beside the
baselines -- on the CPU tier (Triton interpreter, host protocol, no baselines) and, on a GPU, with the vendor
paths and the CUDA-graph serving check."""

from __future__ import annotations

import math

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
