"""Compile-only check of a config for a GPU architecture, without a GPU: Triton's own compiler (ttir -> ttgir ->
llir -> ptx -> cubin, ptxas included in the triton wheel) on the launch plan's kernels, specialized as the JIT
would specialize them at run time (16-byte aligned pointers, ints divisible by 16 marked so, ints equal to 1
as constants). Reports the shared memory Triton allocated, the warps launched, the registers, spill stores and
wgmma serialization that ``ptxas -v`` reports, and whether the main loop uses wgmma / TMA.

Used by the CPU tier of the tests (every variant compiles for sm_90; the shared-memory estimate of
``configs.smem_bytes`` holds) and usable before a GPU run to drop configs that fail to compile.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...problem import GemmProblem
from . import plans
from .configs import H100, Arch, Config

_TYPES = {"fp16": "*fp16", "bf16": "*bf16"}


@dataclass(frozen=True)
class KernelReport:
    name: str
    shared: int               # bytes, as Triton's metadata says
    warps: int                # as launched (warp specialization adds warpgroups)
    regs: int                 # -1 where ptxas is not available
    spills: int               # spill-store bytes
    wgmma_serialized: bool    # ptxas C7511: wgmma serialized for lack of registers
    wgmma: bool
    tma: bool
    seconds: float
    pdl: bool = False         # launched with PDL (metadata) and waiting on the previous grid (griddepcontrol.wait)
    ptx: str = field(default="", repr=False, compare=False)  # the PTX itself, for checks of its shape


@dataclass(frozen=True)
class CompileReport:
    cfg: Config
    problem: GemmProblem
    kernels: tuple[KernelReport, ...] = field(default_factory=tuple)

    @property
    def shared(self) -> int:
        return max(k.shared for k in self.kernels)


def _signature(kernel, args: list, dtype: str):
    import torch  # start-up cost: torch loads on first use, not on import

    sig, consts, attrs = {}, {}, {}
    for i, (name, value) in enumerate(zip(kernel.arg_names, args)):
        if kernel.params[i].is_constexpr:
            sig[name], consts[name] = "constexpr", value
        elif isinstance(value, plans.Operand):
            sig[name] = _TYPES[dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, torch.Tensor):
            sig[name] = {torch.float32: "*fp32", torch.int32: "*i32"}[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{kernel.__name__}.{name}: cannot type {value!r}")
        elif value == 1:
            sig[name], consts[name] = "constexpr", 1
        else:
            sig[name] = "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, consts, attrs


def _ptxas_report(ptx: str, cc: int) -> tuple[int, int, bool]:
    """(registers, spill-store bytes, wgmma serialized) from ``ptxas -v`` on the PTX, with the ptxas in the
    triton wheel; (-1, 0, False) where it is missing. C7511 is ptxas saying the wgmma pipeline was serialized for
    lack of registers: no spill, but a slow main loop."""
    import triton  # optional dependency (the triton extra), loaded on first use

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not tool.exists():
        return -1, 0, False
    arch = f"sm_{cc}a" if cc >= 90 else f"sm_{cc}"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        out = subprocess.run([str(tool), "-v", "--gpu-name", arch, f.name, "-o", os.devnull],
                             capture_output=True, text=True).stderr
    regs = re.findall(r"Used (\d+) registers", out)
    spills = re.findall(r"(\d+) bytes spill stores", out)
    return (int(regs[-1]) if regs else -1), sum(int(x) for x in spills), "C7511" in out


def compile_only(cfg: Config, problem: GemmProblem, arch: Arch = H100) -> CompileReport:
    """Compile ``cfg``'s kernels for ``problem`` on ``arch`` (ConfigError if the predicate refuses it)."""
    import torch  # start-up cost: torch loads on first use, not on import
    import triton  # optional dependency (the triton extra), loaded on first use
    from triton.backends.compiler import GPUTarget  # optional dependency (the triton extra), loaded on first use
    from triton.compiler import ASTSource  # optional dependency (the triton extra), loaded on first use

    plan = plans.build(cfg, problem, torch.device("meta"), arch)
    reports = []
    for launch in plan.launches:
        sig, consts, attrs = _signature(launch.kernel, launch.args, problem.dtype)
        t0 = time.perf_counter()
        ck = triton.compile(ASTSource(launch.kernel, sig, consts, attrs), target=GPUTarget("cuda", arch.cc, 32),
                            options=launch.options())
        ptx = ck.asm.get("ptx", "")
        regs, spills, serialized = _ptxas_report(ptx, arch.cc)
        reports.append(KernelReport(launch.kernel.__name__, int(ck.metadata.shared), int(ck.metadata.num_warps),
                                    regs, spills, serialized,
                                    "wgmma" in ptx, "cp.async.bulk.tensor" in ptx,
                                    time.perf_counter() - t0,
                                    bool(getattr(ck.metadata, "launch_pdl", False)) and "griddepcontrol.wait" in ptx,
                                    ptx))
    return CompileReport(cfg, problem, tuple(reports))
