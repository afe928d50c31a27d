"""gemmrl: half-precision GEMM kernels found by search, verified against a high-precision reference,
timed against the vendor libraries, and served to PyTorch.

    import gemmrl
    gemmrl.warmup(["16_4096_4096"])     # build ahead of time (optional; nothing builds inside a graph capture)
    y = gemmrl.mm(a, b)                 # a [..., K] @ b [K, N], fp16/bf16, the library's kernel or cuBLAS
    report = gemmrl.patch(model)        # nn.Linear layers through gemmrl.linear; gemmrl.unpatch(model) undoes it

Importing gemmrl does no CUDA work and compiles nothing (torch is imported on first use of the serving API).
"""

import importlib

__version__ = "0.1.0"

_LAZY = {"mm": "serve.dispatch", "linear": "serve.dispatch", "warmup": "serve.dispatch", "served_by": "serve.dispatch",
         "use_library": "serve.dispatch", "DispatchError": "serve.dispatch", "pick_layout": "serve.layout_choice",
         "patch": "serve.patching", "unpatch": "serve.patching", "PatchReport": "serve.patching"}


def __getattr__(name):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'gemmrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value  # resolved once: later `gemmrl.mm` is a plain attribute (this hook cost ~2.5 us a call)
    return value


def __dir__():
    return sorted([*globals(), *_LAZY])
