"""fill.Refill, the timing protocols' device-side input refill (Triton interpreter on CPU tensors here; compiled in
the GPU tier's graph and cold protocol tests): normal numbers at the asked scale, new ones after every bump, the
operands of one call on different streams, every element written (odd sizes, several launch chunks)."""

from __future__ import annotations

import pytest
import torch

from gemmrl import fill

pytestmark = pytest.mark.interpreter
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # compiled where there is a GPU, interpreted elsewhere


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 1000, 4097])
def test_every_element_written_with_the_scale(dtype, n):
    t = torch.full((n,), float("nan"), dtype=dtype, device=DEV)
    r = fill.Refill(DEV, seed=3)
    r.normal(t, 0, 0.5)
    assert not torch.isnan(t).any()
    if n >= 1000:
        assert abs(float(t.float().std()) - 0.5) < 0.05 and abs(float(t.float().mean())) < 0.05


def test_new_numbers_after_every_bump_and_per_operand():
    r = fill.Refill(DEV, seed=7)
    a, b = (torch.empty(64, 33, dtype=torch.float16, device=DEV) for _ in range(2))
    seen = []
    for _ in range(3):
        r.bump()
        r.normal(a, 0, 1.0)
        r.normal(b, 1, 1.0)
        assert not torch.equal(a, b)  # the two operands of a call differ
        seen.append(a.clone())
    assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])
    again = fill.Refill(DEV, seed=7)
    again.bump()
    again.normal(b, 0, 1.0)
    assert torch.equal(b, seen[0])  # the same seed and counter: the same numbers (reproducible from the row's seed)


def test_chunks_get_their_own_streams(monkeypatch):
    monkeypatch.setattr(fill, "CHUNK", 256)
    t = torch.empty(1024, dtype=torch.float16, device=DEV)
    fill.Refill(DEV, seed=1).normal(t, 0, 1.0)
    parts = t.view(4, 256)
    assert not torch.equal(parts[0], parts[1]) and not torch.equal(parts[2], parts[3])


@pytest.mark.gpu
def test_every_replay_of_a_captured_refill_draws_new_numbers():
    """Captured in a CUDA graph (as the graph protocol does), the counter advances on the device: each captured call
    and each replay writes numbers no other wrote."""
    a = torch.empty(4096, 512, dtype=torch.float16, device="cuda")
    r = fill.Refill("cuda", seed=11)

    def call():
        r.bump()
        r.normal(a, 0, 1.0)

    call()  # compiled before the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    seen = []
    with torch.cuda.graph(g):
        call()
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        seen.append(a.clone())
    assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])
    assert abs(float(seen[2].float().std()) - 1.0) < 0.02
