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
