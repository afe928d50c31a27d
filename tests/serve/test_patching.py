"""patch(model) / unpatch(model): the class a patched layer takes, layers with a forward of their own, copies and
pickles of patched models, and what torch.compile guards on a patched model (CPU tier)."""

from __future__ import annotations

import copy
import io
import math
import types

import pytest
import torch

import gemmrl
from gemmrl.library import Library
from gemmrl.serve import dispatch
from gemmrl.serve.patching import is_patched

DTYPES = [torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def empty_library():
    dispatch.use_library(Library())  # every GEMM through the vendor fallback: the patch is what is tested
    yield
    dispatch.use_library(Library())


class Scaled(torch.nn.Linear):
    """A Linear subclass with state of its own (patched layers keep their class's behaviour for other dtypes)."""

    def __init__(self, *a, scale: float = 2.0, **kw):
        super().__init__(*a, **kw)
        self.scale = scale

    def forward(self, x):
        return super().forward(x) * self.scale


def mlp(dtype, hidden=24):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.SiLU(), torch.nn.Linear(hidden, 8, bias=False),
                               torch.nn.Linear(8, 5)).to(dtype)


def x_of(rows, k, dtype, seed=1):
    return torch.randn(rows, k, generator=torch.Generator().manual_seed(seed)).to(dtype)


def close(a, b, k, dtype):
    eps = 2 ** -10 if dtype == torch.float16 else 2 ** -7
    return (a.float() - b.float()).abs().max().item() <= 8 * eps * math.sqrt(k) + 1e-3


@pytest.mark.parametrize("dtype", DTYPES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_a_patched_layer_keeps_its_object_and_name_and_unpatch_restores_its_exact_class(dtype, rows):
    model, stock = mlp(dtype), mlp(dtype)
    layers = list(model)
    x = x_of(rows, 16, dtype)
    rep = gemmrl.patch(model)
    assert rep.patched == ("0", "2", "3")
    assert list(model) == layers and all(a is b for a, b in zip(model, layers))
    for i in (0, 2, 3):
        assert type(model[i]) is not torch.nn.Linear and isinstance(model[i], torch.nn.Linear)
        assert type(model[i]).__name__ == "Linear" and "forward" not in model[i].__dict__ and is_patched(model[i])
    assert repr(model) == repr(stock)  # printed models unchanged
    assert close(model(x), stock(x), 24, dtype)
    assert gemmrl.unpatch(model) == 3
    assert all(type(m) is torch.nn.Linear and not is_patched(m) for m in (model[0], model[2], model[3]))
    assert torch.equal(model(x), stock(x))


def test_a_subclass_keeps_its_own_behaviour_for_another_dtype_and_gets_its_own_patched_class():
    torch.manual_seed(0)
    layer = Scaled(8, 4, scale=3.0).half()
    plain = torch.nn.Linear(8, 4).half()
    gemmrl.patch(torch.nn.ModuleList([layer, plain]))
    assert isinstance(layer, Scaled) and type(layer) is not Scaled and type(layer) is not type(plain)
    x = x_of(2, 8, torch.float16)
    # fp16 input: gemmrl.linear (the patched class's forward replaces the subclass's, as for any Linear)
    assert close(layer(x), x.float() @ layer.weight.float().t() + layer.bias.float(), 8, torch.float16)
    # another dtype: the class's own forward, scale included
    with pytest.raises(RuntimeError):
        layer(x.float())  # Scaled's own forward, as stock: F.linear refuses float32 input with a float16 weight
    gemmrl.unpatch(layer)
    assert type(layer) is Scaled and layer.scale == 3.0


def test_a_layer_with_its_own_instance_forward_is_wrapped_and_gets_it_back():
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 4).half()
    calls = []

    def hooked(self, x):  # what a hook library leaves in a module's instance dict
        calls.append(x.dtype)
        return torch.nn.Linear.forward(self, x)

    own = types.MethodType(hooked, layer)
    layer.forward = own
    assert gemmrl.patch(layer).patched == ("<model>",)
    assert type(layer) is torch.nn.Linear and is_patched(layer)
    x = x_of(3, 8, torch.float16)
    layer(x)
    assert calls == []  # served by gemmrl.linear
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(x.float())  # input dtype differs from the weight's: the layer's own forward
    assert calls == [torch.float32]
    assert gemmrl.unpatch(layer) == 1
    assert layer.__dict__["forward"] is own and not is_patched(layer)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float16", "bfloat16"])
def test_deepcopy_and_pickle_of_a_patched_model_stay_patched_with_equal_outputs(dtype):
    model = mlp(dtype)
    gemmrl.patch(model)
    x = x_of(5, 16, dtype)
    want = model(x)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for other in (copy.deepcopy(model), loaded):
        assert all(is_patched(other[i]) for i in (0, 2, 3))
        assert other[0].weight.data_ptr() != model[0].weight.data_ptr()
        assert torch.equal(other(x), want)
        assert gemmrl.unpatch(other) == 3 and type(other[0]) is torch.nn.Linear
    assert all(is_patched(model[i]) for i in (0, 2, 3))  # the original is untouched


def _guard_lines(fn, x) -> int:
    """Lines of the guard tree torch.compile installed for fn's one compiled frame."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    entries = _debug_get_cache_entry_list(fn.__code__)
    assert len(entries) == 1
    return str(entries[0].guard_manager).count("\n")


def test_a_compiled_patched_model_carries_no_more_guards_than_stock():
    """A class-level forward: dynamo guards a patched layer as it guards a stock one. With a bound forward in each
    layer's instance dict, a guard tree grew by ~28% (a Python lambda guard per layer, run on every call)."""
    depth = 12
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(depth)]).to(torch.bfloat16)
    x = x_of(4, 16, torch.bfloat16)

    def step(x):
        return model(x)

    lines = {}
    with torch.no_grad():
        for mode in ("stock", "patched"):
            gemmrl.unpatch(model)
            if mode == "patched":
                gemmrl.patch(model)
            torch._dynamo.reset()
            try:
                f = torch.compile(step, backend="eager")
                f(x)
                f(x)
                lines[mode] = _guard_lines(step, x)
            finally:
                torch._dynamo.reset()
    gemmrl.unpatch(model)
    # the patched graph guards the few globals of gemmrl.linear's path once, not anything per layer
    assert lines["patched"] <= lines["stock"] + 40, lines


class Doubled(torch.nn.Module):
    def forward(self, w):
        return 2 * w


@pytest.mark.parametrize("bias", [True, False])
def test_a_parametrized_weight_is_read_through_its_property(bias):
    """torch.nn.utils.parametrize turns ``weight`` into a property (the parameter moves under ``parametrizations``):
    the patched forward reads it by attribute then, and serves the parametrized weight."""
    from torch.nn.utils import parametrize

    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 6, bias=bias).half()
    parametrize.register_parametrization(layer, "weight", Doubled())
    x = x_of(3, 8, torch.float16)
    want = layer(x)
    rep = gemmrl.patch(layer)
    assert "<model>" in rep.patched and is_patched(layer)
    assert "weight" not in layer._parameters
    got = layer(x)
    assert close(got, want, 8, torch.float16)
    ref = x.float() @ (2 * layer.parametrizations.weight.original.float()).t()
    assert close(got, ref + (layer.bias.float() if bias else 0), 8, torch.float16)
    gemmrl.unpatch(layer)
    assert torch.equal(layer(x), want)
