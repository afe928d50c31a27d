"""``patch(model)``: route a model's ``nn.Linear`` layers through ``gemmrl.linear``; ``unpatch(model)`` undoes it.

A patched layer keeps its parameters (training updates the same tensors; gradients flow through the custom op's
backward) and only gets an instance ``forward``. Its weight is made contiguous once, in place, so that
``weight.t()`` is the ``tn`` operand the kernels read without a copy. Layers whose weight is not fp16/bf16 are
left alone and listed in the report, as are modules that are not ``nn.Linear`` but hold stacked (3-D or more)
expert weights (MoE experts) or a 2-D weight of their own (an MoE router, GPT-2's Conv1D): they stay on their own
path. Embeddings (a lookup, not a product) are neither patched nor listed. A call whose input dtype differs from the weight's
(autocast, mixed use) takes the layer's own forward.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch

from .dispatch import linear

_SERVED = (torch.float16, torch.bfloat16)
_MARK = "_gemmrl_patched"


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
    if x.dtype != self.weight.dtype:
        return getattr(self, _MARK)(x)
    return linear(x, self.weight, self.bias)


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
        if not isinstance(m, torch.nn.Linear) or _MARK in m.__dict__:
            continue
        if m.weight.dtype not in _SERVED:
            skipped.append((name or "<model>", f"weight is {m.weight.dtype}; gemmrl serves float16 and bfloat16"))
            continue
        if not m.weight.is_contiguous():
            with torch.no_grad():
                m.weight.data = m.weight.data.contiguous()
        own = m.__dict__.get("forward")
        m.__dict__[_MARK] = own if own is not None else types.MethodType(type(m).forward, m)
        m.__dict__["_gemmrl_own_forward"] = own
        m.forward = types.MethodType(_forward, m)
        patched.append(name or "<model>")
    return PatchReport(tuple(patched), tuple(skipped))


def unpatch(model: torch.nn.Module) -> int:
    """Restore every patched layer's own forward; returns how many were restored."""
    n = 0
    for m in model.modules():
        if _MARK in m.__dict__:
            own = m.__dict__.pop("_gemmrl_own_forward", None)
            del m.__dict__[_MARK]
            if own is not None:
                m.forward = own
            else:
                m.__dict__.pop("forward", None)
            n += 1
    return n
