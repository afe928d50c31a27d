"""gemmrl.patch / gemmrl.unpatch on Hugging Face transformers models (CPU tier).

Tiny Llama, Qwen2 and Mixtral models (random weights from a fixed seed, nothing downloaded), in fp16 and bf16:
patched logits match stock, the report names every nn.Linear (and, for Mixtral, the stacked expert weights left on
their own path), unpatch restores the model exactly, patching copies no weight, and torch.compile traces the
patched model through the custom op ``torch.ops.gemmrl.mm``.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from transformers import (LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)

import gemmrl
from gemmrl.library import Library
from gemmrl.serve import dispatch, patching

LAYERS = 2
SIZES = dict(num_hidden_layers=LAYERS, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=128)
MODELS = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "mixtral": (MixtralConfig, MixtralForCausalLM, dict(num_local_experts=4, num_experts_per_tok=2)),
}
DTYPES = [torch.float16, torch.bfloat16]
def stacked(cls: str) -> str:
    return f"not nn.Linear ({cls} holds 3-D or larger weights, e.g. stacked MoE experts): stays on its own path"


def own_2d(cls: str) -> str:
    return f"not nn.Linear ({cls} holds a 2-D weight its own forward uses, e.g. an MoE router): stays on its own path"


model_and_dtype = pytest.mark.parametrize(
    "kind, dtype", [(k, d) for k in MODELS for d in DTYPES],
    ids=[f"{k}-{str(d).removeprefix('torch.')}" for k in MODELS for d in DTYPES])


@pytest.fixture(autouse=True)
def empty_library():
    """Serve from an empty library: on CPU tensors every call is then torch.matmul, whatever libraries exist here."""
    dispatch.use_library(Library())
    yield
    dispatch.use_library(None)


def build(kind: str, dtype):
    cfg_cls, model_cls, extra = MODELS[kind]
    torch.manual_seed(0)
    model = model_cls(cfg_cls(**SIZES, **extra))
    for m in model.modules():  # transformers starts biases (Qwen2's q/k/v) at zero: give them values to carry
        if isinstance(m, torch.nn.Linear) and m.bias is not None:
            torch.nn.init.normal_(m.bias, std=0.5)
    return model.to(dtype).eval()


def token_ids():
    return torch.randint(0, SIZES["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(1))


def logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def expected_linears(kind: str) -> list[str]:
    """Every nn.Linear of the model by name: attention and dense MLP projections, and lm_head (Mixtral's experts
    are stacked 3-D parameters and its router a bare 2-D weight: neither is an nn.Linear, both are reported)."""
    names = ["lm_head"]
    for i in range(LAYERS):
        names += [f"model.layers.{i}.self_attn.{p}_proj" for p in "qkvo"]
        if kind != "mixtral":
            names += [f"model.layers.{i}.mlp.{p}_proj" for p in ("gate", "up", "down")]
    return names


def expected_skipped(kind: str) -> list[tuple[str, str]]:
    return sorted([(f"model.layers.{i}.mlp.experts", stacked("MixtralExperts")) for i in range(LAYERS)]
                  + [(f"model.layers.{i}.mlp.gate", own_2d("MixtralTopKRouter")) for i in range(LAYERS)]) \
        if kind == "mixtral" else []


def assert_close_logits(got, want):
    """On CPU gemmrl.linear computes x @ W.T with torch.matmul (fp32 accumulation) and adds the bias in a separate
    kernel, where stock nn.Linear calls addmm: a layer's output may then differ by half an ulp of fp16/bf16 (the
    product is stored in the dtype before the bias is added), which the later layers carry to the logits. Four ulps
    of the dtype at the logits' scale bound that for two layers (Qwen2 with random biases reaches a quarter of it
    in bf16); a wrong weight, layout or bias moves the logits by about their own size."""
    tol = 4 * torch.finfo(want.dtype).eps * want.abs().max().item()
    torch.testing.assert_close(got, want, atol=tol, rtol=0)


@model_and_dtype
def test_patched_logits_match_stock_and_the_report_names_every_linear(kind, dtype, monkeypatch):
    model = build(kind, dtype)
    ids = token_ids()
    stock = logits(model, ids)
    served = []

    def spy(x, weight, bias=None):
        served.append(weight)
        return dispatch.linear(x, weight, bias)

    monkeypatch.setattr(patching, "linear", spy)
    rep = gemmrl.patch(model)
    assert sorted(rep.patched) == sorted(expected_linears(kind))
    assert sorted(rep.skipped) == expected_skipped(kind)
    patched = logits(model, ids)
    assert patched.dtype == dtype
    assert_close_logits(patched, stock)
    # one forward runs each patched layer once, each through gemmrl.linear
    linears = {n: m.weight for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert sorted(id(w) for w in served) == sorted(id(w) for w in linears.values())


@model_and_dtype
def test_unpatch_restores_the_same_modules_and_bit_identical_logits(kind, dtype):
    model = build(kind, dtype)
    ids = token_ids()
    stock = logits(model, ids)
    before = dict(model.named_modules())
    n = len(gemmrl.patch(model).patched)
    assert gemmrl.unpatch(model) == n
    after = dict(model.named_modules())
    assert after.keys() == before.keys()
    assert all(after[k] is m for k, m in before.items())
    left = [k for k, m in after.items() if "forward" in m.__dict__ or any(a.startswith("_gemmrl") for a in m.__dict__)]
    assert left == []
    assert torch.equal(logits(model, ids), stock)


@model_and_dtype
def test_patch_keeps_the_state_dict_and_copies_no_weight(kind, dtype):
    model = build(kind, dtype)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ptrs = {k: p.data_ptr() for k, p in model.named_parameters()}
    # HF Linear weights are contiguous already, so patch's in-place .contiguous() step leaves every one as it is
    assert all(m.weight.is_contiguous() for m in model.modules() if isinstance(m, torch.nn.Linear))
    gemmrl.patch(model)
    after = model.state_dict()
    assert after.keys() == state.keys()
    assert all(torch.equal(after[k], v) for k, v in state.items())
    assert {k: p.data_ptr() for k, p in model.named_parameters()} == ptrs


@model_and_dtype
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a .functools.lru_cache:UserWarning")
def test_compiled_patched_model_traces_the_custom_op_and_matches_eager(kind, dtype):
    model = build(kind, dtype)
    ids = token_ids()
    n = len(gemmrl.patch(model).patched)
    eager = logits(model, ids)
    torch._dynamo.reset()
    backend = CompileCounterWithBackend("aot_eager")
    try:
        compiled = logits(torch.compile(model, backend=backend), ids)
    finally:
        torch._dynamo.reset()
    ops = [node for g in backend.graphs for node in g.graph.nodes
           if node.op == "call_function" and str(node.target).startswith("gemmrl.mm")]
    assert len(ops) == n  # one gemmrl::mm per patched layer, none left to a graph break
    assert_close_logits(compiled, eager)


class Experts(torch.nn.Module):
    """Stacked expert weights [E, N, K], as transformers' MoE experts hold them."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 16, 8))

    def forward(self, x, e: int):
        return x @ self.weight[e].t()


class Router(torch.nn.Module):
    """A bare 2-D weight (not an nn.Linear; reported, left on its own path) and a 3-D buffer (not a weight)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 8))
        self.register_buffer("table", torch.randn(2, 2, 2))


@pytest.mark.parametrize("dtype", DTYPES, ids=["float16", "bfloat16"])
def test_stacked_expert_weights_are_reported_and_left_on_their_own_path(dtype):
    torch.manual_seed(0)
    moe = torch.nn.ModuleDict({"experts": Experts(), "shared": torch.nn.Linear(8, 16)})
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(5, 8), "moe": moe, "router": Router(),
                                 "proj": torch.nn.Linear(16, 8)}).to(dtype)
    x = torch.randn(3, 8, dtype=dtype)
    stock = moe["experts"](x, 2)
    rep = gemmrl.patch(model)
    assert rep.patched == ("moe.shared", "proj")
    # the module owning the 3-D weight (not its parent) and the router's 2-D weight; the embedding is a lookup
    assert rep.skipped == (("moe.experts", stacked("Experts")), ("router", own_2d("Router")))
    assert "moe.experts: not nn.Linear (" in str(rep) and "stacked MoE experts" in str(rep)
    assert "forward" not in moe["experts"].__dict__
    assert torch.equal(moe["experts"](x, 2), stock)
