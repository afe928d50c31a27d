"""Test tiers: CPU by default; `gpu` tests skip with a reason when no CUDA GPU is visible.

Without a GPU, Triton kernels run under the interpreter on CPU tensors: TRITON_INTERPRET=1 is set
here, before any test module imports triton.
"""

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def script_module(name: str):
    """``benchmarks/acceptance/<name>.py`` loaded as a module (the acceptance runs are not a package; a fresh copy
    each call)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "acceptance" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


HAS_CUDA = _cuda()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False); runs in benchmarks/acceptance/gpu_run.sh")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def have_cutlass_toolchain() -> bool:
    """nvcc and the nvidia-cutlass headers: what building a CUTLASS config needs (tests that build one skip
    without them; a GPU machine's build cache alone does not make a fresh build possible)."""
    from gemmrl.kernels.toolchain import CutlassNotFound, cutlass_include_dirs, find_nvcc

    if not find_nvcc():
        return False
    try:
        cutlass_include_dirs()
        return True
    except CutlassNotFound:
        return False


@pytest.fixture
def sm90_build(tmp_path, monkeypatch):
    """nvcc builds for sm_90a into a fresh cache under tmp_path (skips where nvcc is missing): the probe scripts'
    build tests compile host entry points only, so no GPU is needed."""
    from gemmrl.kernels.toolchain import find_nvcc

    if not find_nvcc():
        pytest.skip("needs nvcc")
    monkeypatch.setenv("GEMMRL_CUDA_ARCH", "90a")
    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path))
    return tmp_path


# -- gemmrl.mm's hot paths ----------------------------------------------------------------------------------
HOT_PATHS = ["torch", "c", "python"]
_NO_TOOLCHAIN = ("RuntimeError: no Python.h", "RuntimeError: no C compiler", "RuntimeError: no C++ compiler",
                 "RuntimeError: no torch headers")


@pytest.fixture(params=HOT_PATHS)
def hot_path(request):
    """Serve through each hot path of gemmrl.mm in turn: built against torch's headers, CPython-only C, Python.
    Skips a compiled one only where its toolchain is missing (a toolchain that fails to build it is a bug)."""
    from gemmrl.serve import dispatch
    from gemmrl.serve import fastpath

    kind = request.param
    try:
        dispatch.use_hot_path(kind)
    except RuntimeError:
        if fastpath.why(kind).startswith(_NO_TOOLCHAIN):
            pytest.skip(f"the {kind} hot path cannot be built here: {fastpath.why(kind)}")
        raise
    yield kind
    with dispatch._S.lock:  # back to the process default (GEMMRL_FASTPATH), chosen again at the next new shape
        dispatch.reset()
        dispatch._install(None)
        dispatch._S.fastpath_tried = False


def assert_serves(src, problem) -> None:
    """A CUDA source (kernels/cuda_source.CudaSource) loads, passes the battery on ``problem`` and survives CUDA-graph
    capture (GPU tests of test_cuda_source.py and test_cluster_splitk.py)."""
    import torch

    from gemmrl.candidate import make_buffers
    from gemmrl.kernels import cuda_source as cs
    from gemmrl.verify import verify

    cand, rec = cs.load_candidate(src)
    assert cand is not None, rec
    bufs = make_buffers(problem, "cuda")
    cand.prepare(problem, bufs, "graph", None)
    v = verify(cand, problem, "cuda")
    assert v.passed, v.reason
    ok, why = cs.graph_safety(cand, bufs)
    assert ok, why
    torch.cuda.synchronize()
