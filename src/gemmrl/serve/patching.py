"""``patch(model)``: route a model's ``nn.Linear`` layers through ``gemmrl.linear``; ``unpatch(model)`` undoes it.

A patched layer keeps its parameters (training updates the same tensors; gradients flow through the custom op's
backward) and only gets an instance ``forward``. Its weight is made contiguous once, in place, so that
``weight.t()`` is the ``tn`` operand the kernels read without a copy. Layers whose weight is not fp16/bf16 are
left alone and listed in the report, as are modules that are not ``nn.Linear`` but hold stacked (3-D or more)
expert weights (MoE experts): they stay on their own path. A call whose input dtype differs from the weight's
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


def patch(model: torch.nn.Module) -> PatchReport:
    """Patch every ``nn.Linear`` in ``model`` (itself included); already patched layers are left as they are."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"gemmrl.patch takes a torch.nn.Module, got {type(model).__name__}")
    patched, skipped = [], []
    for name, m in model.named_modules():
        if not isinstance(m, torch.nn.Linear) and any(
                p.is_floating_point() and p.ndim >= 3 for p in m.parameters(recurse=False)):
            skipped.append((name or "<model>", f"not nn.Linear ({type(m).__name__} holds 3-D or larger weights, e.g. "
                                               "stacked MoE experts): stays on its own path"))
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
