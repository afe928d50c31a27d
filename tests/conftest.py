"""Test tiers: CPU by default; `gpu` tests skip with a reason when no CUDA GPU is visible.

Without a GPU, Triton kernels run under the interpreter on CPU tensors: TRITON_INTERPRET=1 is set
here, before any test module imports triton.
"""

import os

import pytest


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
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False); runs in scripts/gpu_round.sh")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# -- gemmrl.mm's hot paths ----------------------------------------------------------------------------------
HOT_PATHS = ["torch", "c", "python"]
_NO_TOOLCHAIN = ("RuntimeError: no Python.h", "RuntimeError: no C compiler", "RuntimeError: no C++ compiler",
                 "RuntimeError: no torch headers")


@pytest.fixture(params=HOT_PATHS)
def hot_path(request):
    """Serve through each hot path of gemmrl.mm in turn: built against torch's headers, CPython-only C, Python.
    Skips a compiled one only where its toolchain is missing (a toolchain that fails to build it is a bug)."""
    from gemmrl import dispatch, fastpath

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
