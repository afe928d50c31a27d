"""``patch(model)``: route a model's ``nn.Linear`` layers through ``gemmrl.linear``; ``unpatch(model)`` undoes it.

A patched layer keeps its object, its parameters (training updates the same tensors; gradients flow through the
custom op's backward) and its state_dict; only its class changes, to a subclass of its own (same name, cached per
class) whose ``forward`` calls ``gemmrl.linear``. A class-level forward is what torch.compile guards cheapest: dynamo
checks the layer's type as it does for a stock one, where a per-instance bound ``forward`` costs a Python guard per
layer on every call of the compiled model (225 of them in a Llama-3-8B decode step). A layer that already has a
``forward`` of its own in its instance dict (a hook library's wrapper) keeps it as the fallback and gets an instance
``forward`` instead. Patched models deepcopy and pickle as patched ones (loading needs gemmrl installed).

Its weight is made contiguous once, in place, so that ``weight.t()`` is the ``tn`` operand the kernels read without a
copy. Layers whose weight is not fp16/bf16 are left alone and listed in the report, as are modules that are not
``nn.Linear`` but hold stacked (3-D or more) expert weights (MoE experts) or a 2-D weight of their own (an MoE
router, GPT-2's Conv1D): they stay on their own path. Embeddings (a lookup, not a product) are neither patched nor
listed. A call whose input dtype differs from the weight's (autocast, mixed use) takes the layer's own forward.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch

from .dispatch import linear

_SERVED = (torch.float16, torch.bfloat16)
_MARK = "_gemmrl_patched"
# under dynamo (one Python frame where is_compiling takes two), as dispatch.mm asks
_is_compiling = getattr(torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling)


@dataclass(frozen=True)
class PatchReport:
    patched: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]   # (module name, why)

    def __str__(self) -> str:
        s = f"gemmrl.patch: {len(self.patched)} Linear layer(s) routed through gemmrl.linear"
        if self.skipped:
            s += f"; {len(self.skipped)} left alone (" + "; ".join(f"{n}: {w}" for n, w in self.skipped[:4]) + \
                 (" ..." if len(self.skipped) > 4 else "") + ")"
        return s


def _forward(self, x):
    """The instance forward of a layer that had its own (kept under _MARK as the fallback)."""
    if x.dtype != self.weight.dtype:
        return getattr(self, _MARK)(x)
    return linear(x, self.weight, self.bias)


def _class_forward(self, x):
    """The patched class's forward: gemmrl.linear, or the base class's forward for another input dtype. Eager, the
    weight and bias come from the parameter dict (each ``self.weight`` goes through Module.__getattr__, ~0.4 us a
    call), or by attribute where a parametrization made them properties; under dynamo by attribute, which it guards
    as it guards a stock layer (the dict's lookups would add guards to every layer)."""
    if _is_compiling():
        w, b = self.weight, self.bias
    else:
        p = self._parameters
        w = p["weight"] if "weight" in p else self.weight
        b = p["bias"] if "bias" in p else self.bias
    if x.dtype != w.dtype:
        return self._gemmrl_base.forward(self, x)
    return linear(x, w, b)


def _new_patched(base: type):
    """Unpickling and deepcopy of a patched layer: an empty instance of base's patched class (state set after)."""
    cls = _patched_class(base)
    return cls.__new__(cls)


def _reduce_ex(self, protocol):
    # by a module-level constructor, not by the class's name: the patched class is made at patch time
    return _new_patched, (self._gemmrl_base,), self.__getstate__()


_CLASSES: dict[type, type] = {}


def _patched_class(base: type) -> type:
    """The subclass of ``base`` a patched layer takes: same name and module (reprs and printed models unchanged),
    forward through gemmrl.linear. Made once per base class."""
    cls = _CLASSES.get(base)
    if cls is None:
        cls = type(base.__name__, (base,), {"forward": _class_forward, "_gemmrl_base": base,
                                            "__reduce_ex__": _reduce_ex, "__module__": base.__module__,
                                            "__qualname__": base.__qualname__})
        _CLASSES[base] = cls
    return cls


def is_patched(m: torch.nn.Module) -> bool:
    """Whether ``patch`` routed this module through gemmrl.linear (and ``unpatch`` has not undone it)."""
    return _MARK in m.__dict__ or "_gemmrl_base" in type(m).__dict__


def _own_path(m: torch.nn.Module) -> str:
    """Why a module that is not nn.Linear but holds GEMM weights stays on its own path ('' for one that holds none:
    norms, embeddings (a lookup, not a product), containers)."""
    dims = {p.ndim for p in m.parameters(recurse=False) if p.is_floating_point()}
    cls = type(m).__name__
    if any(d >= 3 for d in dims):
        return f"not nn.Linear ({cls} holds 3-D or larger weights, e.g. stacked MoE experts): stays on its own path"
    if 2 in dims and not isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
        return (f"not nn.Linear ({cls} holds a 2-D weight its own forward uses, e.g. an MoE router): stays on its "
                "own path")
    return ""


def patch(model: torch.nn.Module) -> PatchReport:
    """Patch every ``nn.Linear`` in ``model`` (itself included); already patched layers are left as they are."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"gemmrl.patch takes a torch.nn.Module, got {type(model).__name__}")
    patched, skipped = [], []
    for name, m in model.named_modules():
        why = "" if isinstance(m, torch.nn.Linear) else _own_path(m)
        if why:
            skipped.append((name or "<model>", why))
            continue
        if not isinstance(m, torch.nn.Linear) or is_patched(m):
            continue
        if m.weight.dtype not in _SERVED:
            skipped.append((name or "<model>", f"weight is {m.weight.dtype}; gemmrl serves float16 and bfloat16"))
            continue
        if not m.weight.is_contiguous():
            with torch.no_grad():
                m.weight.data = m.weight.data.contiguous()
        own = m.__dict__.get("forward")
        if own is None:
            m.__class__ = _patched_class(type(m))
        else:  # its own instance forward would shadow a class one: wrap it instead
            m.__dict__[_MARK] = own
            m.forward = types.MethodType(_forward, m)
        patched.append(name or "<model>")
    return PatchReport(tuple(patched), tuple(skipped))


def unpatch(model: torch.nn.Module) -> int:
    """Restore every patched layer's own forward; returns how many were restored."""
    n = 0
    for m in model.modules():
        if "_gemmrl_base" in type(m).__dict__:
            m.__class__ = type(m)._gemmrl_base
            n += 1
        elif _MARK in m.__dict__:
            m.forward = m.__dict__.pop(_MARK)
            n += 1
    return n
