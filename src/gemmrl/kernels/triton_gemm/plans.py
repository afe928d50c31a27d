"""Launch plans: (config, problem, device) -> the kernels to launch, their grids, every argument bound, and the
workspaces they need. The launcher's order is check -> allocate -> grid -> launch; this module does the first
three, once per (candidate, problem), so a call only fills in the three operand pointers.

Operands are row-major and contiguous (the candidate convention): A [M,K], B [K,N] (``nn``) or B^T [N,K]
(``tn``), C [M,N]; their strides are bound here from the shape, not read per call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...problem import GemmProblem
from . import runtime
from .configs import Arch, Config, check

REDUCE_BLOCK = 1024
_MODES = {"none": 0, "two_pass": 1, "fused": 2, "atomic": 3}


class Operand(int):
    """Placeholder for a per-call operand in a bound argument list: 0 = A, 1 = B (as the layout reads it), 2 = C."""


A, B, C = Operand(0), Operand(1), Operand(2)


@dataclass
class Launch:
    kernel: Any                 # the jit function (compiled or interpreted)
    grid: tuple[int, int, int]
    args: list                  # every parameter in signature order; A, B, C where the call's operands go
    num_warps: int
    num_stages: int
    pdl: bool = False           # launched with programmatic stream serialization (the kernel's PDL constexpr)

    def options(self) -> dict:
        """The compile/launch options Triton takes beside the arguments (``launch_pdl`` only where set, so a plan
        without PDL compiles to the same cache entry as before the option existed)."""
        opts = dict(num_warps=self.num_warps, num_stages=self.num_stages)
        if self.pdl:
            opts["launch_pdl"] = True
        return opts

    def slots(self) -> tuple[tuple[int, int], ...]:
        return tuple((i, int(x)) for i, x in enumerate(self.args) if isinstance(x, Operand))


@dataclass
class Plan:
    cfg: Config
    problem: GemmProblem
    launches: list[Launch]
    tma: bool
    upcast: bool                # interpreter + bf16: C is passed as an int16 view (see jit/common.py)
    torch_dtype: Any = None     # of the operands
    keep: list = field(default_factory=list)  # workspaces and counters, alive as long as the plan


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


RED_REGS = 96  # registers a thread gives to the loads of one group of partials in a split-K sum


def red_group(elements: int, warps: int, split: int) -> int:
    """Partials a split-K sum loads together (jit/splitk.py: RED_GROUP): as many as fit RED_REGS registers a thread
    (``elements`` fp32 values of a tile or block spread over ``warps`` warps), at least 1, at most split - 1."""
    per_thread = max(1, elements // (32 * warps))
    return max(1, min(split - 1, RED_REGS // per_thread))


def _bind(kernel, values: dict) -> list:
    missing = [n for n in kernel.arg_names if n not in values]
    if missing:
        raise TypeError(f"{kernel.__name__}: no value bound for {missing}")
    return [values[n] for n in kernel.arg_names]


def _strides(p: GemmProblem) -> dict:
    s_bk, s_bn = (p.N, 1) if p.layout == "nn" else (1, p.K)
    return dict(M=p.M, N=p.N, K=p.K, s_am=p.K, s_ak=1, s_bk=s_bk, s_bn=s_bn, s_cm=p.N, s_cn=1)


def build(cfg: Config, problem: GemmProblem, device, arch: Arch) -> Plan:
    """Check ``cfg`` (ConfigError if invalid), allocate its workspaces on ``device`` and bind its launches."""
    import torch  # start-up cost: torch loads on first use, not on import

    check(cfg, problem, arch)
    interpret = device.type == "cpu"
    ks = runtime.kernels(interpret)
    p = problem
    upcast = interpret and p.dtype == "bf16"
    pdl = cfg.pdl and not interpret  # the interpreter has no grids to overlap (nor griddepcontrol)
    common = dict(a_ptr=A, b_ptr=B, c_ptr=C, **_strides(p), BM=cfg.BM, BN=cfg.BN, BK=cfg.BK,
                  EVEN_K=p.K % cfg.BK == 0, ACC_FP16=p.acc == "fp16", UPCAST=upcast, PDL=pdl)
    tiles = _cdiv(p.M, cfg.BM) * _cdiv(p.N, cfg.BN)
    keep: list = []
    launches: list[Launch] = []
    tma = bool(getattr(cfg, "tma", False))
    if cfg.variant == "tiled":
        k = ks.tiled.tiled_kernel
        launches.append(Launch(k, (tiles, 1, 1), _bind(k, {**common, "GROUP_M": cfg.group_m}), cfg.warps, cfg.stages,
                               pdl))
    elif cfg.variant == "persistent":
        k = ks.persistent.persistent_kernel
        programs = min(tiles, arch.num_sms * cfg.ctas_per_sm)
        vals = {**common, "GROUP": cfg.group_m, "N_MAJOR": cfg.order == "n", "TMA": cfg.tma,
                "B_NN": p.layout == "nn", "FLATTEN": cfg.flatten, "WS": cfg.ws, "SUBTILE": cfg.subtile}
        launches.append(Launch(k, (programs, 1, 1), _bind(k, vals), cfg.warps, cfg.stages, pdl))
    else:  # splitk, smallm: one kernel, SWAP_AB for smallm (gemv_kernel for smallm with mma=False)
        k = ks.splitk.splitk_kernel
        split = cfg.split
        mode = 0 if split == 1 else _MODES[cfg.reduction]
        k_per_split = _cdiv(_cdiv(p.K, cfg.BK), split) * cfg.BK
        f32 = dict(dtype=torch.float32, device=device)
        if mode in (1, 2):
            ws = torch.empty(split * p.M * p.N, **f32)
        elif mode == 3:
            ws = torch.zeros(p.M * p.N, **f32)
        else:
            ws = torch.empty(1, **f32)
        cnt = torch.zeros(tiles if mode in (2, 3) else 1, dtype=torch.int32, device=device)
        keep += [ws, cnt]
        vals = {**common, "ws_ptr": ws, "cnt_ptr": cnt, "k_per_split": k_per_split,
                "GROUP_M": getattr(cfg, "group_m", 1), "SPLIT": split, "MODE": mode,
                "SWAP_AB": cfg.variant == "smallm", "TMA": cfg.tma, "B_NN": p.layout == "nn",
                "RED_GROUP": red_group(cfg.BM * cfg.BN, cfg.warps, split)}
        if not getattr(cfg, "mma", True):  # smallm on the CUDA cores (GEMV): one tile of BM rows, N tiles
            k = ks.gemv.gemv_kernel
            vals = {n: v for n, v in vals.items() if n in k.arg_names}
        launches.append(Launch(k, (tiles, split, 1), _bind(k, vals), cfg.warps, cfg.stages, pdl))
        if mode == 1:
            r = ks.splitk.reduce_kernel
            rvals = dict(ws_ptr=ws, c_ptr=C, M=p.M, N=p.N, s_cm=p.N, s_cn=1, SPLIT=split, BLOCK=REDUCE_BLOCK,
                         UPCAST=upcast, PDL=pdl, RED_GROUP=red_group(REDUCE_BLOCK, 4, split))
            launches.append(Launch(r, (_cdiv(p.M * p.N, REDUCE_BLOCK), 1, 1), _bind(r, rvals), 4, 1, pdl))
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[p.dtype]
    return Plan(cfg, problem, launches, tma, upcast, dt, keep)


def resolve(args: list, ops: tuple) -> list:
    """Replace the A, B, C placeholders with the call's tensors."""
    return [ops[int(x)] if isinstance(x, Operand) else x for x in args]
