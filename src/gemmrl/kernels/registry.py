"""The one table of kernel families: name -> config parser, validity predicate, candidate builder.

Search, bench, the library and serving ask this table instead of switching on a family's name, so adding a family
is its module plus one line in ``FAMILIES``. A family's rows are named ``<name>:<config>`` (its ``prefix``) and a
re-measured selection ``<name>-sel:<protocols>`` (its ``selected``).

    fam = family("cutlass")
    cfg = fam.parse("pingpong_128x128x64_c1x1_persistent_tn_fp16:s1_rh_dheuristic_k1")
    ok, why = fam.valid(cfg, problem)          # the family's one validity predicate
    cand = fam.candidate(cfg, problem, "cutlass:...")   # built (compiled) in its prepare, as every candidate
    cand, record = fam.build(payload, problem, name)    # built now: the tuner's path, failures in the record

Config families (``triton``, ``cutlass``, ``tiny``, ``wgmma``, ``decode``) take a config string; ``vendor`` takes a
baseline name; source families (``cuda``, ``triton_source``) take a source object that declares the shapes it handles;
``planted_triton`` takes the mode of a deliberately wrong kernel (the adversarial suite).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from ..adversarial.planted import planted_candidates
from ..problem import GemmProblem
from ..summary import BASELINES
from . import cuda_source, cutlass_sm90, decode_gemm, tiny_gemm, triton_source, vendor, wgmma_gemm
from .toolchain import arch_for
from .triton_gemm import TritonGemm
from .triton_gemm import configs as triton_configs


class FamilyError(ValueError):
    pass


Record = dict[str, Any]


def _always(cfg, problem) -> tuple[bool, str]:
    return True, ""


@dataclass(frozen=True)
class Family:
    """One kernel family. ``parse(text)`` reads a config (a row's ``algo``, a library entry's ``impl``, a tuning
    spec's payload) and raises ValueError naming what is wrong; ``valid(config, problem)`` is the family's validity
    predicate on an H100/H200-class GPU; ``candidate(config, problem, name)`` makes the candidate (nothing is built
    before its ``prepare``); ``build(payload, problem, name)`` makes it built now, ``(candidate or None, build
    record)``; ``prebuild(payload, arch)`` compiles it ahead into the build cache, where the family compiles with
    nvcc (a tuner runs it in threads while the GPU works); ``ready(config)``, where building costs an nvcc run,
    whether it is built already (a first call's race defers an unbuilt one to warmup). ``fixed(config)`` is the (layout, dtype) a config is
    compiled for, None where it serves any.
    ``served``: a library entry may name it; ``buckets``: one config that won at neighbouring measured M of an (N, K)
    may serve the M between them (its launch takes any M); ``selectable``: ``gemmrl select --family`` screens it and ``gemmrl
    bench --<name>-from`` re-measures its selection; ``declared``: its payload declares the shapes it handles."""

    name: str
    parse: Callable[[str], Any]
    candidate: Callable[[Any, GemmProblem, str | None], Any]
    valid: Callable[[Any, GemmProblem], tuple[bool, str]] = _always
    fixed: Callable[[Any], tuple[str, str]] | None = None
    builder: Callable[[Any, GemmProblem, str | None], tuple[Any, Record]] | None = None
    prebuild: Callable[[Any, str], Any] | None = None
    ready: Callable[[Any], bool] | None = None
    served: bool = False
    buckets: bool = False
    selectable: bool = False
    declared: bool = False

    @property
    def prefix(self) -> str:
        return f"{self.name}:"

    @property
    def selected(self) -> str:
        return f"{self.name}-sel:"

    def config(self, payload: Any) -> Any:
        return self.parse(payload) if isinstance(payload, str) else payload

    def build(self, payload: Any, problem: GemmProblem, name: str | None = None) -> tuple[Any, Record]:
        """The candidate for ``payload`` at ``problem``, built now where the family builds ahead of ``prepare``:
        ``(candidate or None, build record)``; a build that fails comes back in the record, never raised. A
        source outside the shapes it declares is refused here (stage ``shape``)."""
        if self.declared and not payload.admits(problem):
            return None, {"ok": False, "error": {"stage": "shape", "message":
                          f"{problem.mnk} {problem.dtype}/{problem.acc} is outside the declared "
                          f"{payload.dtype}/{payload.acc} shapes {payload.shapes}"}}
        if self.builder is not None:
            return self.builder(payload, problem, name)
        return self.candidate(self.config(payload), problem, name), {"ok": True}

    def mismatch(self, config: Any, layout: str, dtype: str) -> str:
        """Why ``config`` cannot serve a ``layout``/``dtype`` problem ('' when it can): the layout and dtype a
        config is compiled for."""
        if self.fixed is None:
            return ""
        lay, dt = self.fixed(config)
        return "" if (lay, dt) == (layout, dtype) else f"a {lay}/{dt} config for a {layout}/{dtype} problem"


# -- the config families ---------------------------------------------------------------------------------
def _triton_candidate(cfg, problem: GemmProblem, name: str | None):
    return TritonGemm(cfg, layout=problem.layout, acc=problem.acc, name=name or f"triton:{cfg}")


def _triton_valid(cfg, problem: GemmProblem) -> tuple[bool, str]:
    return triton_configs.valid(cfg, problem)


def _cutlass_parse(text: str):
    return cutlass_sm90.parse_name(text)


def _cutlass_candidate(cfg, problem: GemmProblem, name: str | None):
    config, knobs = cfg
    return cutlass_sm90.CutlassCandidate(config, knobs, name=name)


def _cutlass_valid(cfg, problem: GemmProblem) -> tuple[bool, str]:
    return cutlass_sm90.valid(cfg[0], cfg[1], problem)


def _cutlass_ready(cfg) -> bool:
    """Whether the config's object is in the build cache (a CUTLASS build is an nvcc run of tens of seconds)."""
    return cuda_source.cached(cfg[0].source())


def _cutlass_fixed(cfg) -> tuple[str, str]:
    return cfg[0].layout, cfg[0].dtype


def _cutlass_build(payload, problem: GemmProblem, name: str | None) -> tuple[Any, Record]:
    """Compiled before the candidate exists (cached by source, flags, arch and toolkit), so a failure is a record."""
    config, knobs = cutlass_sm90.parse_name(payload) if isinstance(payload, str) else payload
    built = cutlass_sm90.build_config(config, arch_for())
    if not built.ok:
        return None, built.record()
    return cutlass_sm90.CutlassCandidate(config, knobs, built, name=name or None), built.record()


def _cutlass_prebuild(payload, arch: str):
    return cutlass_sm90.build_config(cutlass_sm90.parse_name(str(payload))[0], arch)


def _fixed_config(cfg) -> tuple[str, str]:
    return cfg.layout, cfg.dtype


def _tiny_candidate(cfg, problem: GemmProblem, name: str | None):
    return tiny_gemm.TinyCandidate(cfg, name=name)


def _wgmma_candidate(cfg, problem: GemmProblem, name: str | None):
    return wgmma_gemm.WgmmaCandidate(cfg, name=name)


def _decode_candidate(cfg, problem: GemmProblem, name: str | None):
    return decode_gemm.DecodeCandidate(cfg, name=name)


# -- vendor paths, sources, planted kernels -------------------------------------------------------------
def _vendor_parse(text: str) -> str:
    if text not in BASELINES:
        raise FamilyError(f"unknown vendor path {text!r}; use one of {', '.join(BASELINES)}")
    return text


def _vendor_candidate(path: str, problem: GemmProblem, name: str | None):
    cand = next((c for c in vendor.vendor_candidates(problem) if c.name == path), None)
    if cand is None:
        raise FamilyError(f"vendor path {path!r} has no {problem.acc}-accumulating form")
    if name:
        cand.name = name
    return cand


def _source(text: str):
    raise FamilyError("a source family takes its source object (CudaSource / TritonSource), not a config string")


def _source_family(load: Callable[[Any], tuple[Any, Record]]):
    """(builder, candidate) of a source family whose ``load(source)`` gives ``(candidate or None, build record)``."""
    def build(payload, problem: GemmProblem, name: str | None) -> tuple[Any, Record]:
        return load(payload)

    def candidate(payload, problem: GemmProblem, name: str | None):
        cand, record = load(payload)
        if cand is None:
            raise FamilyError(f"{payload.name}: did not build or load: {record.get('error')}")
        return cand
    return build, candidate


_cuda_build, _cuda_candidate = _source_family(cuda_source.load_candidate)
_triton_source_build, _triton_source_candidate = _source_family(triton_source.load_candidate)


def _cuda_prebuild(payload, arch: str):
    # a CUDA-L2-ABI source is built by its importer in the worker (one shape, its own binding)
    return cuda_source.build(payload, arch) if payload.abi == "gemmrl" else None


def _planted_candidate(mode: str, problem: GemmProblem, name: str | None):
    by = {c.mode: c for c in planted_candidates()}
    if mode not in by:
        raise ValueError(f"unknown planted Triton mode {mode!r}; one of {', '.join(by)}")
    return replace(by[mode])


def _planted_parse(mode: str) -> str:
    return mode


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("triton", triton_configs.parse_config, _triton_candidate, _triton_valid, served=True, buckets=True,
           selectable=True),
    Family("cutlass", _cutlass_parse, _cutlass_candidate, _cutlass_valid, _cutlass_fixed, _cutlass_build,
           _cutlass_prebuild, _cutlass_ready, served=True, selectable=True),
    Family("tiny", tiny_gemm.TinyConfig.parse, _tiny_candidate, tiny_gemm.valid, _fixed_config, served=True,
           selectable=True),
    Family("wgmma", wgmma_gemm.WgmmaConfig.parse, _wgmma_candidate, wgmma_gemm.valid, _fixed_config,
           selectable=True),
    Family("decode", decode_gemm.DecodeConfig.parse, _decode_candidate, decode_gemm.valid, _fixed_config,
           prebuild=decode_gemm.prebuild, ready=decode_gemm.ready, served=True, selectable=True),
    Family("vendor", _vendor_parse, _vendor_candidate, served=True),
    Family("cuda", _source, _cuda_candidate, builder=_cuda_build, prebuild=_cuda_prebuild, declared=True),
    Family("triton_source", _source, _triton_source_candidate, builder=_triton_source_build, declared=True),
    Family("planted_triton", _planted_parse, _planted_candidate),
)}
SERVED = tuple(n for n, f in FAMILIES.items() if f.served)          # what a library entry may name
SELECTABLE = tuple(n for n, f in FAMILIES.items() if f.selectable)  # what gemmrl select screens


def family(name: str) -> Family:
    """The family named ``name``; FamilyError naming the known ones otherwise."""
    f = FAMILIES.get(name)
    if f is None:
        raise FamilyError(f"unknown kernel family {name!r}; use one of {', '.join(FAMILIES)}")
    return f


def of_candidate(candidate: str) -> Family | None:
    """The family whose rows a candidate name belongs to (``triton:<config>``, ``cutlass-sel:graph``, ...)."""
    head = candidate.split(":", 1)[0]
    return FAMILIES.get(head[:-4] if head.endswith("-sel") else head)
