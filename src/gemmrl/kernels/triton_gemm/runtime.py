"""Runtime glue: the Triton source loaded per mode, the TMA scratch allocator, and the direct launch path.

``kernels(interpret)`` loads the files of ``jit/`` (once per mode, cached) as private modules, with
``triton.knobs.runtime.interpret`` set as asked while their ``@triton.jit`` decorators run: interpreted
functions for CPU tensors, compiled ones for CUDA tensors, on the same machine (planted.py does the same).

Launch paths (CUDA). ``jit``: ``kernel[grid](*args)``, Triton's own path: it binds the arguments, computes the
specialization key, looks the kernel up and calls its launcher, which asks the allocator set with
``triton.set_allocator`` for the descriptors' global scratch (a ContextVar, so it is set before each such call).
``direct`` (default; ``GEMMRL_TRITON_LAUNCH=jit`` turns it off): the first call goes through ``jit`` and
returns the compiled kernel; later calls go straight to its C launcher (``CompiledKernel.run.launch``) with
the grid, the function handle, the packed metadata and every argument bound once, pointers passed as plain
ints (which the launcher takes as device addresses without asking the driver), the global scratch a buffer
made once, no launch hooks. What it skips: argument binding, the cache key, the allocator call and
``cuPointerGetAttribute`` per pointer. It relies on Triton 3.6's launcher signature
(``launch(gridX, gridY, gridZ, stream, function, cooperative, pdl, global_scratch, profile_scratch,
packed_metadata, launch_metadata, enter_hook, exit_hook, *args)``); ``DirectLaunch.build`` checks what it
needs and returns None when anything differs, and the candidate then stays on ``jit``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any

_JIT_DIR = Path(__file__).with_name("jit")
_JIT_FILES = ("common", "tiled", "persistent", "splitk", "gemv", "touch")


@functools.lru_cache(maxsize=None)
def kernels(interpret: bool) -> types.SimpleNamespace:
    """The jit modules for one mode: ``.tiled.tiled_kernel``, ``.persistent.persistent_kernel``,
    ``.splitk.splitk_kernel``, ``.splitk.reduce_kernel``, ``.gemv.gemv_kernel`` and the speed-of-light probe
    ``.touch.touch_kernel``."""
    import triton  # optional dependency (the triton extra), loaded on first use

    pkg = f"{__package__}.jit._{'interp' if interpret else 'cuda'}"
    mods = {}
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = interpret
        for name in _JIT_FILES:
            spec = importlib.util.spec_from_file_location(f"{pkg}.{name}", _JIT_DIR / f"{name}.py")
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod  # relative imports between jit files find this mode's copy
            spec.loader.exec_module(mod)
            mods[name] = mod
    return types.SimpleNamespace(**mods)


def launch_mode() -> str:
    mode = os.environ.get("GEMMRL_TRITON_LAUNCH", "direct")
    if mode not in ("direct", "jit"):
        raise ValueError(f"GEMMRL_TRITON_LAUNCH={mode!r}: use 'direct' or 'jit'")
    return mode


def _alloc(size: int, alignment: int, stream: Any):
    import torch  # start-up cost: torch loads on first use, not on import

    return torch.empty(size, dtype=torch.int8, device=torch.device("cuda", torch.cuda.current_device()))


def set_tma_allocator() -> None:
    """Global scratch for device-side tensor descriptors on the ``jit`` path (no-op cost: a ContextVar set)."""
    import triton  # optional dependency (the triton extra), loaded on first use

    triton.set_allocator(_alloc)


class DirectLaunch:
    """One compiled kernel, called through its C launcher with everything but the operand pointers bound.

    ``args`` holds every kernel parameter in signature order (constexprs included: the launcher's format has a
    slot for each and ignores them); ``slots`` are (position, operand) pairs, operand 0/1/2 for A/B/C, whose
    pointers are filled in per call."""

    __slots__ = ("launch", "head", "tail_args", "slots", "keep")

    def __init__(self, launch, head, args, slots, keep):
        self.launch, self.head, self.tail_args, self.slots, self.keep = launch, head, list(args), slots, keep

    @staticmethod
    def build(compiled, grid, args, slots, device) -> "DirectLaunch | None":
        import torch  # start-up cost: torch loads on first use, not on import

        run = getattr(compiled, "run", None)
        launch = getattr(run, "launch", None)
        need = ("global_scratch_size", "profile_scratch_size", "launch_cooperative_grid", "launch_pdl", "num_ctas")
        if launch is None or not all(hasattr(run, n) for n in need):
            return None
        if run.profile_scratch_size:
            return None  # a profiler's scratch: leave it to Triton's own path
        gx, gy, gz = grid
        keep = []
        scratch = None
        if run.global_scratch_size:
            n = gx * gy * gz * run.num_ctas * run.global_scratch_size
            buf = torch.empty(n + run.global_scratch_align, dtype=torch.uint8, device=device)
            keep.append(buf)
            p = buf.data_ptr()
            scratch = p + (-p) % run.global_scratch_align
        bound = []
        for x in args:
            if isinstance(x, torch.Tensor):
                keep.append(x)
                bound.append(x.data_ptr())
            else:
                bound.append(x)
        head = (gx, gy, gz, None, compiled.function, run.launch_cooperative_grid, run.launch_pdl, scratch, None,
                compiled.packed_metadata, None, None, None)
        return DirectLaunch(launch, head, bound, slots, keep)

    def __call__(self, stream: int, ptrs: tuple[int, int, int]) -> None:
        args = self.tail_args
        for pos, which in self.slots:
            args[pos] = ptrs[which]
        h = self.head
        self.launch(h[0], h[1], h[2], stream, *h[4:], *args)
