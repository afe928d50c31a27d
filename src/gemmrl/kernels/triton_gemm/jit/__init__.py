"""Triton source of the GEMM family. These modules import triton at their top, so nothing imports them
directly: ``runtime.kernels(interpret)`` loads each file twice under private names, once with the Triton
interpreter on (CPU tensors) and once compiled (CUDA tensors), the way planted.py builds its kernel per mode.
Helpers are shared through relative imports (``from .common import ...``), which resolve to the same mode's copy.
The kernels use only builtins of triton.language, none of its ``@jit`` library functions (``tl.cdiv``,
``tl.zeros``, ``tl.zeros_like``...): those are decorated once, in whatever mode the process imported triton in
(interpreted under TRITON_INTERPRET=1), so the other mode could not call them.
"""
