"""The dispatcher runs the full correctness battery (``verify.verify``) before it first serves a library entry at a
shape the entry was not verified at: a bucket entry at an M inside its range that was not measured, or an entry
measured under other software. A failure there is a warning and torch.matmul serves the shape.

CPU tier: that check is taken on a CUDA device only (on the CPU, ``_make`` runs one fp32 reference check instead),
so these tests build through ``dispatch._build`` with a device that says it is CUDA, the GPU identity stubbed and
the entry's Triton kernel prepared on CPU buffers under the interpreter; ``dispatch.verify`` is replaced by a
recorder. The GPU tier's tests of the real battery are in test_dispatch.py (entries of other software).
"""

from __future__ import annotations

import types
import warnings
from dataclasses import replace

import pytest
import torch

from gemmrl.candidate import make_buffers
from gemmrl.library import AS_GPU_SOURCE, Entry, Library
from gemmrl.serve import dispatch, launchers

GPU = "NVIDIA H100 80GB HBM3"
CFG = "tiled(BM=32,BN=32,BK=32,warps=4,stages=2,group_m=1)"
N, K = 40, 24
SW = {"torch": torch.__version__, "triton": "3.6.0", "cuda": "12.8"}


def _bucket(torch_v: str = "") -> Entry:
    return Entry(gpu=GPU, cc="9.0", dtype="fp16", acc="fp32", layout="tn", protocol="offline", M=8, N=N, K=K,
                 family="triton", impl=CFG, algo=CFG, time_ms=0.01, vendor_best_ms=0.02, vendor_best="cublas_tn",
                 m_lo=8, m_hi=32, members=(f"8_{N}_{K}", f"32_{N}_{K}"), verified=True, torch=torch_v)


@pytest.fixture
def on_a_fake_gpu(monkeypatch):
    """``dispatch._build`` on a device of type cuda whose kernels run on CPU buffers; returns the battery's log."""
    calls: list[str] = []
    verdict = {"passed": True, "reason": ""}

    def battery(cand, problem, device):
        assert device == "cuda" and cand is not None
        calls.append(problem.mnk)
        return types.SimpleNamespace(**verdict)

    monkeypatch.setattr(dispatch, "verify", battery)
    monkeypatch.setenv("GEMMRL_VENDOR_FALLBACK", "off")  # the fake device runs no cuBLAS: the fallback is torch.matmul
    monkeypatch.setattr(dispatch, "_identity", lambda device: (GPU, SW))
    monkeypatch.setattr(dispatch, "make_buffers", lambda problem, device, seed=0, **kw: make_buffers(problem, "cpu", seed))
    dev = types.SimpleNamespace(type="cuda", index=0)

    def build(lib: Library, M: int):
        dispatch.use_library(lib)
        return dispatch._build(M, N, K, torch.float16, "tn", dev)

    yield build, calls, verdict
    dispatch.use_library(Library())


@pytest.mark.interpreter
def test_a_bucket_runs_the_battery_at_each_m_it_was_not_measured_at(on_a_fake_gpu):
    build, calls, _ = on_a_fake_gpu
    lib = Library([_bucket()])
    for M in (8, 32):  # measured, same software: the one fp32 reference check, no battery
        s = build(lib, M)
        assert s.eager_desc.startswith(f"triton:{CFG}") and calls == [], (M, s.eager_desc, calls)
    s = build(lib, 20)  # inside the range, never measured: the battery first, at that very shape
    assert s.eager_desc.startswith(f"triton:{CFG}") and "M 8..32" in s.eager_desc
    assert calls == [f"20_{N}_{K}"]  # once for the eager and the graph lookup (the same entry)
    build(lib, 21)
    assert calls == [f"20_{N}_{K}", f"21_{N}_{K}"]


@pytest.mark.interpreter
def test_an_entry_of_other_software_runs_the_battery_even_where_measured(on_a_fake_gpu):
    build, calls, _ = on_a_fake_gpu
    build(Library([_bucket(torch_v="0.0.0")]), 8)
    assert calls == [f"8_{N}_{K}"]


@pytest.mark.interpreter
def test_a_battery_failure_is_a_warning_and_the_fallback_serves(on_a_fake_gpu):
    build, calls, verdict = on_a_fake_gpu
    verdict.update(passed=False, reason="output: max error 3.1 at [5, 7]")
    with pytest.warns(RuntimeWarning, match="failed the correctness battery: output: max error 3.1") as rec:
        s = build(Library([_bucket()]), 20)
    assert calls == [f"20_{N}_{K}"]
    assert s.eager is launchers.torch_mm and s.graph is launchers.torch_mm
    assert s.eager_desc.startswith("torch.matmul (entry triton:") and "not served: RuntimeError" in s.eager_desc
    msg = [str(w.message) for w in rec if issubclass(w.category, RuntimeWarning)]
    assert len(msg) == 1 and f"20_{N}_{K} tn" in msg[0] and "the vendor fallback serves it" in msg[0], msg
    with warnings.catch_warnings():  # a measured M of the same entry is still served by it
        warnings.simplefilter("error", RuntimeWarning)
        assert build(Library([_bucket()]), 8).eager_desc.startswith(f"triton:{CFG}")


@pytest.mark.interpreter
def test_an_entry_relabelled_for_this_gpu_runs_the_battery_even_where_measured(on_a_fake_gpu):
    """`gemmrl lib export --as-gpu` serves one GPU model's picks on another: measured there, not here."""
    build, calls, _ = on_a_fake_gpu
    e = _bucket()
    build(Library([replace(e, source=f"{AS_GPU_SOURCE}NVIDIA H100 80GB HBM3: {e.source}")]), 8)
    assert calls == [f"8_{N}_{K}"]
