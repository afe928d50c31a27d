"""``TritonGemm``: one (variant, config) of the Triton family as a gemmrl candidate (``cand(a, b, bt, c)``).

``prepare`` checks the config against the problem and the GPU (``configs.valid``; ConfigError names the
reason), allocates workspaces, binds every launch argument and, on CUDA, compiles with one call on the
harness's buffers and switches to the direct launch path (runtime.py), checking once that a direct call gives
the same bits as Triton's own path. A call then costs three ``data_ptr()``, an alignment and shape check, the
raw current stream and one C launcher call per kernel (two for a two-pass split-K). Any call that does not
match the prepared problem (other shapes, pointers not 16-byte aligned) takes Triton's own path, re-planned
for what it was given (and refused with ConfigError if the config is invalid there). Work runs on torch's
current stream. One instance per stream: split-K workspaces and counters belong to the instance.
Under the Triton interpreter (CPU tensors) every call takes Triton's own path.
"""

from __future__ import annotations

from typing import Any

from ...problem import GemmProblem
from . import plans, runtime
from .configs import INTERPRETER, Arch, Config, ConfigError


class TritonGemm:
    """A Triton GEMM candidate for one config. ``layout``: 'tn' reads bt, 'nn' reads b; ``acc``: the problem's."""

    def __init__(self, cfg: Config, layout: str = "tn", acc: str = "fp32", name: str | None = None):
        if layout not in ("nn", "tn"):
            raise ConfigError(f"layout {layout!r}: use 'nn' or 'tn'")
        self.cfg, self.layout, self.acc = cfg, layout, acc
        self.name = name or f"triton:{cfg}:{layout}"
        self.launch_path = ""     # 'direct', 'jit' or 'interpreter', once a call has been planned
        self.launch_note = ""     # why not 'direct', where it is not
        self._plan: plans.Plan | None = None
        self._direct: list | None = None
        self._shapes: tuple | None = None
        self._stream = None
        self._arch: dict[Any, Arch] = {}

    # -- protocol ------------------------------------------------------------------------------------
    def prepare(self, problem: GemmProblem, bufs, protocol: str, timer) -> None:
        if problem.acc != self.acc:
            raise ConfigError(f"{self.name} accumulates in {self.acc}; the problem asks for acc {problem.acc}")
        problem = problem.with_(layout=self.layout)  # the buffers hold B and B^T: the candidate reads its own
        a, b, bt, c = bufs.args()
        self._replan(problem, a.device)
        self._slow(a, b, bt, c)  # compiles; on CUDA also builds the direct launchers
        if self._direct:
            self._self_check(a, b, bt, c)

    def __call__(self, a, b, bt, c) -> None:
        direct = self._direct
        if direct is not None:
            pa, pb, pc = a.data_ptr(), (bt if self.layout == "tn" else b).data_ptr(), c.data_ptr()
            if not (pa | pb | pc) & 15 and (a.shape, c.shape) == self._shapes:
                stream = self._stream()
                for launch in direct:
                    launch(stream, (pa, pb, pc))
                return
        self._slow(a, b, bt, c)

    def launch_ptrs(self, pa: int, pb: int, pc: int) -> bool:
        """Launch on torch's current stream with raw pointers to A, B (as the layout reads it) and C of the prepared
        shape (any leading dims, contiguous); False, launching nothing, without a direct path or 16-byte alignment."""
        direct = self._direct
        if direct is None or (pa | pb | pc) & 15:
            return False
        stream = self._stream()
        for launch in direct:
            launch(stream, (pa, pb, pc))
        return True

    def direct_launches(self) -> tuple:
        """What the compiled hot path launches per call, one ``(launch, head, tail_args, slots)`` per kernel of the
        plan (runtime.DirectLaunch); () where there is no direct path (the interpreter, Triton's own launcher)."""
        if self.launch_path != "direct" or not self._direct:
            return ()
        return tuple((d.launch, tuple(d.head), tuple(d.tail_args), tuple(tuple(x) for x in d.slots))
                     for d in self._direct)

    def info(self) -> dict[str, Any]:
        return {"config": str(self.cfg), "algo": str(self.cfg), "variant": self.cfg.variant, "launch": self.launch_path,
                **({"launch_note": self.launch_note} if self.launch_note else {})}

    # -- planning and Triton's own path --------------------------------------------------------------
    def _arch_for(self, device) -> Arch:
        if device.type == "cpu":
            return INTERPRETER
        if device not in self._arch:
            self._arch[device] = Arch.from_device(device)
        return self._arch[device]

    def _replan(self, problem: GemmProblem, device) -> None:
        self._plan = plans.build(self.cfg, problem, device, self._arch_for(device))
        self._direct = None
        self._shapes = ((problem.M, problem.K), (problem.M, problem.N))
        if device.type == "cpu":
            self.launch_path, self.launch_note = "interpreter", ""
        elif runtime.launch_mode() == "jit":
            self.launch_path, self.launch_note = "jit", "GEMMRL_TRITON_LAUNCH=jit"
        else:
            self.launch_path, self.launch_note = "jit", ""

    def _problem_of(self, a, c) -> GemmProblem:
        import torch  # start-up cost: torch loads on first use, not on import

        dtype = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(a.dtype)
        if dtype is None:
            raise ConfigError(f"{self.name}: A has dtype {a.dtype}; use float16 or bfloat16")
        return GemmProblem(int(a.shape[0]), int(c.shape[1]), int(a.shape[1]), dtype=dtype, acc=self.acc,
                           layout=self.layout)

    def _slow(self, a, b, bt, c) -> None:
        import torch  # start-up cost: torch loads on first use, not on import

        bm = bt if self.layout == "tn" else b
        plan = self._plan
        if plan is None or (a.shape, c.shape) != self._shapes or a.dtype != plan.torch_dtype:
            self._replan(self._problem_of(a, c), a.device)
            plan = self._plan
        for t, what in ((a, "A"), (bm, "B" if self.layout == "nn" else "B^T"), (c, "C")):
            if not t.is_contiguous():
                raise ConfigError(f"{self.name}: {what} must be row-major contiguous")
            if plan.tma and t.data_ptr() % 16:
                raise ConfigError(f"{self.cfg} uses TMA descriptors, which need 16-byte aligned base pointers; "
                                  f"{what} is at {t.data_ptr():#x}: use tma=False")
        ops = (a, bm, c.view(torch.int16) if plan.upcast else c)
        cuda = a.device.type == "cuda"
        if cuda and plan.tma:
            runtime.set_tma_allocator()
        compiled = []
        for L in plan.launches:
            compiled.append(L.kernel[L.grid](*plans.resolve(L.args, ops), **L.options()))
        if cuda and self._direct is None and runtime.launch_mode() == "direct" and not self.launch_note:
            aligned = not (a.data_ptr() | bm.data_ptr() | c.data_ptr()) & 15
            if aligned:
                self._build_direct(plan, compiled, a.device)

    def _build_direct(self, plan: plans.Plan, compiled: list, device) -> None:
        import torch  # start-up cost: torch loads on first use, not on import

        direct = []
        for L, ck in zip(plan.launches, compiled):
            d = runtime.DirectLaunch.build(ck, L.grid, L.args, L.slots(), device)
            if d is None:
                self.launch_note = "this Triton's launcher differs from 3.6's; Triton's own path is used"
                return
            direct.append(d)
        index = device.index if device.index is not None else torch.cuda.current_device()
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._stream = (lambda: raw(index)) if raw else (lambda: torch.cuda.current_stream(index).cuda_stream)
        self._direct = direct
        self.launch_path = "direct"

    def _self_check(self, a, b, bt, c) -> None:
        """One direct call on the prepare buffers must reproduce Triton's own path bit for bit (same kernel,
        same arguments); else the direct path is dropped, with the reason in ``info()``."""
        import torch  # start-up cost: torch loads on first use, not on import

        torch.cuda.synchronize(c.device)
        want = c.clone()
        c.fill_(float("nan"))
        self(a, b, bt, c)
        torch.cuda.synchronize(c.device)
        same = torch.equal(c.view(torch.int16), want.view(torch.int16))
        if getattr(self.cfg, "reduction", "") == "atomic":  # arrival order may change the last bits
            same = bool(torch.isfinite(c).all()) and torch.allclose(c.float(), want.float(), rtol=1e-2, atol=1e-2)
        if not same:
            self._direct = None
            self.launch_path, self.launch_note = "jit", "direct launch disagreed with Triton's path at prepare"
            c.copy_(want)
