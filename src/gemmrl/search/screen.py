"""Screening: time many configs of one kernel family per shape quickly, to select one per shape and protocol.

Families (``ScreenSpec.family``): ``triton`` (below), ``cutlass`` (every config of ``cutlass_sm90.family()``
with the scheduler knobs ``knobs_for`` picks at the shape, built beforehand by ``build_family``; candidates
``cutlass:<config>:<knobs>``, re-measured with ``gemmrl bench --cutlass-from``) and ``wgmma`` (every config
``wgmma_gemm.screen_configs`` picks at the shape, layout tn, one build per dtype; candidates ``wgmma:<config>``,
re-measured with ``gemmrl bench --wgmma-from``). For Triton:

The Triton-family bar's protocol selects each shape's config by timing the pruned space in one run and re-measures the
selection against the vendor paths in a separate run (``gemmrl bench --triton-from``), which is the number
reported. This module is the first run. Per shape it times:

* the cost model's ``top`` configs (``costmodel.prune``, every live variant represented), and
* ``explore`` more drawn at random from a pool shared by all shapes (``pool``), so the selection can find
  what the model ranks low and the model's rank correlation can be measured over more than its own top;
* configs given by name (``configs``, source ``given``) and, with ``retrieve``, the configs that won earlier
  screens on the nearest shapes (``search.retrieve``, source ``retrieved``), where valid;
* the cuBLASLt heuristic and cuBLAS paths (both layouts) in every chunk, as references.

Every config gets a quick check before it is timed: C pre-filled with NaN, one call, the Frobenius error
against an fp32 reference no more than ``QUICK_R`` times that of the correctly rounded fp32 result, and no
NaN left. The full battery runs on the selected configs in the re-measure run. Timing uses the graph and
cold protocols with short settings (``SCREEN_TIMING``: graphs of >= 1 ms of work, 5 replays; 7 cold calls), in
chunks of ``chunk`` configs interleaved with the references (split-K workspaces of a chunk live together).
Kernels are compiled beforehand in parallel processes (``precompile``).

Rows go to a results CSV as they are made (one batch per shape; a killed run resumes at the next shape):
candidate ``triton:<config>``,
``info`` = ``screen;source=top|explore|given|retrieved;rank=<model rank>;pred_us=...;chunk=i``;
``verified`` is the quick check's verdict and ``reason`` says it was only the quick check.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable, Iterable, Sequence

from ..candidate import make_buffers
from ..kernels import cutlass_sm90, decode_gemm, tiny_gemm, wgmma_gemm
from ..kernels.toolchain import arch_for
from ..kernels.registry import family
from ..kernels.triton_gemm import TritonGemm
from ..kernels.triton_gemm.configs import Arch, Config, ConfigError, parse_config, valid
from ..kernels.triton_gemm.precompile import precompile
from ..kernels.vendor import vendor_candidates
from ..measure.bench import _progress, require_cuda
from ..measure.core import base_row
from ..problem import GemmProblem
from ..results import ResultsWriter, collect_meta, now, read_rows, sm_clock_mhz
from ..timing import TimingConfig, below_floor, floor_ms, l2_bytes, make_timer, measure, without_grad
from .costmodel import estimate, prune, prune_diverse
from .retrieve import expand, nearest, read_winners
from .space import VARIANTS, _combos

QUICK_R = 1.5
SCREEN_TIMING = TimingConfig(graph_min_work_ms=1.0, graph_replays=5, graph_min_timed_ms=0.0, cold_calls=7,
                             settle_ms=30.0, settle_max_ms=30.0)
REFERENCES = ("cublas_tn", "cublas_nn", "cublaslt_heuristic_tn", "cublaslt_heuristic_nn")
PDL_CHOICES = {"off": (False,), "on": (True,), "both": (False, True)}  # --pdl: the Triton configs' pdl values screened
QUICK_REASON = "screen: quick check only (one input vs fp32), the battery runs when the selection is re-measured"


@dataclass(frozen=True)
class ScreenSpec:
    problems: tuple[GemmProblem, ...]
    out: Path
    top: int = 16
    explore: int = 8
    pool: int = 64             # configs drawn per variant into the shared exploration pool (few: shared kernels)
    chunk: int = 16
    layouts: tuple[str, ...] = ("tn", "nn")  # top + explore configs in each (the buffers hold B and B^T)
    protocols: tuple[str, ...] = ("graph", "cold")
    seed: int = 0
    device: int = 0
    workers: int | None = None
    timing: TimingConfig = SCREEN_TIMING
    family: str = "triton"     # or "cutlass" (its configs x knobs), "wgmma", "tiny" (their own configs): top/explore unused
    pdl: str = "off"           # Triton: each config screened without PDL ("off"), with it ("on"), or both, side by side
    configs: tuple[str, ...] = ()  # CUTLASS: the configs to screen instead of the family ("family" stands for it);
                                   # Triton: configs screened beside top + explore (source "given"), where valid
    all_knobs: bool = False        # CUTLASS: every swizzle x raster setting (and stream-K's), not knobs_for's few
    variants: tuple[str, ...] = ()  # Triton: screen only these variants (e.g. ("splitk",)); () = every variant
    diverse: bool = False           # Triton: the top configs one per (variant, tile, split) (costmodel.prune_diverse)
    retrieve: tuple[str, ...] = ()  # Triton: screen CSVs (or globs) whose winners on the nearest shapes are screened
    retrieve_shapes: int = 2        # ... on this many nearest screened shapes
    retrieve_per_shape: int = 2     # ... this many fastest distinct configs per shape and protocol
    retrieve_any_gpu: bool = False  # ... measured on any GPU (default: only rows of the GPU screened on)

    def __post_init__(self) -> None:
        if self.family not in SCREENS:
            raise ValueError(f"unknown family {self.family!r}; use one of {', '.join(SCREENS)}")
        empty = self.top + self.explore == 0 and not self.configs and not self.retrieve
        if self.top < 0 or self.explore < 0 or empty:
            raise ValueError(f"screen needs top + explore >= 1 configs per shape, or a config list or --retrieve "
                             f"(top={self.top}, explore={self.explore})")
        if not self.layouts or set(self.layouts) - {"tn", "nn"}:
            raise ValueError(f"layouts {self.layouts}: use tn, nn or both")
        if self.chunk < 1:
            raise ValueError("chunk must be >= 1")
        if self.pdl not in PDL_CHOICES:
            raise ValueError(f"pdl={self.pdl!r}: use {', '.join(PDL_CHOICES)}")
        bad = [p for p in self.protocols if p not in ("graph", "cold")]
        if bad:
            raise ValueError(f"screening times the device protocols graph and cold, not {bad}")
        screen = SCREENS[self.family]
        for name, (is_set, why) in OPTIONS.items():  # an option another family's screen takes is refused
            if is_set(self) and name not in screen.options:
                raise ValueError(f"{why.format(spec=self, variants=', '.join(VARIANTS))}; the {self.family} family "
                                 f"{'screens its own' if name in ('configs', 'diverse', 'retrieve') else 'has none'}")
        if self.configs:  # every name read and checked before the GPU is asked for
            screen.read_configs(self.configs)
        if self.variants:
            unknown = [v for v in self.variants if v not in VARIANTS]
            if unknown:
                raise ValueError(f"unknown Triton variant(s) {', '.join(unknown)}; use any of {', '.join(VARIANTS)}")
        if self.retrieve:
            if self.retrieve_shapes < 1 or self.retrieve_per_shape < 1:
                raise ValueError(f"retrieve needs >= 1 shape and >= 1 config per shape (got {self.retrieve_shapes} "
                                 f"and {self.retrieve_per_shape})")
            expand(self.retrieve)  # a missing file is refused before the GPU is asked for


def cutlass_configs(names: Iterable[str], layout: str | None = None, dtype: str | None = None) -> list:
    """The CUTLASS configs a list of names stands for (``family`` expands to ``cutlass_sm90.family``), in the given
    layout and dtype when those are set; ValueError naming the first unreadable or invalid one."""
    cs = cutlass_sm90
    out = []
    for name in names:
        if name == "family":
            out += cs.family(layout or "tn", dtype or "fp16")
            continue
        try:
            cfg = cs.CutlassConfig.parse(name)
        except cs.CutlassConfigError as e:
            raise ValueError(str(e)) from None
        ok, why = cs.valid_config(cfg)
        if not ok:
            raise ValueError(f"{cfg}: {why}")
        if layout and dtype:
            cfg = replace(cfg, layout=layout, dtype=dtype)
        out.append(cfg)
    return list(dict.fromkeys(out))


def triton_configs(names: Iterable[str]) -> list[Config]:
    """The Triton configs a list of names stands for (``str(cfg)``, e.g. ``tiled(BM=16,BN=32,BK=64,warps=2,
    stages=5,group_m=1)``), duplicates dropped; ValueError naming the first unreadable one. Whether a config is
    valid depends on the shape: ``configs_for`` keeps, per shape, the ones ``valid`` accepts."""
    out = []
    for name in names:
        try:
            out.append(parse_config(name))
        except (ConfigError, TypeError, ValueError) as e:
            raise ValueError(f"Triton config {name!r}: {e}") from None
    return list(dict.fromkeys(out))


def exploration_pool(seed: int, per_variant: int, variants: Iterable[str] = ()) -> list[Config]:
    """``per_variant`` configs drawn (without replacement, seeded) from each variant's raw space (of ``variants``,
    all when empty): shared by all shapes, so the kernels to compile stay few however many shapes are screened.
    A variant draws the same configs whichever others are asked for (every variant is drawn, in order, from one
    generator; those not asked for are left out after)."""
    rng = random.Random(seed)
    out: list[Config] = []
    for v in VARIANTS:
        every = [c for c in _combos(v) if not getattr(c, "nondeterministic", False)]
        drawn = rng.sample(every, min(per_variant, len(every)))
        if not variants or v in variants:
            out += drawn
    return out


def configs_for(problem: GemmProblem, arch: Arch, top: int, explore: int, pool: list[Config],
                seed: int = 0, variants: Iterable[str] = (), diverse: bool = False,
                given: Iterable[Config] = (), retrieved: Iterable[Config] = ()) -> list[tuple[Config, str, int]]:
    """(config, source, model rank within the list) for one shape: the model's ``top`` then ``explore`` valid
    configs of ``pool`` not among them (seeded per shape); of ``variants`` only, when given; with ``diverse`` the
    top ones are the model's best of as many (variant, tile, split) groups (``costmodel.prune_diverse``); then the
    ``given`` configs valid at this shape and not already picked (source ``given``, any variant); then the
    ``retrieved`` ones (earlier screens' winners on the nearest shapes, ``search.retrieve``) likewise."""
    live = tuple(variants) or VARIANTS
    if not top:
        picked = []
    elif diverse:
        picked = prune_diverse(problem, top, arch, variants=live)
    else:
        picked = prune(problem, top, arch, min_per_variant=max(1, top // len(live)), variants=live)
    seen = {str(c) for c in picked}
    rng = random.Random(f"{seed}:{problem.mnk}:{problem.layout}")
    ok = [c for c in pool if str(c) not in seen and c.variant in live and valid(c, problem, arch)[0]]
    extra = rng.sample(ok, min(explore, len(ok)))
    seen |= {str(c) for c in extra}

    def fresh(cands: Iterable[Config]) -> list[Config]:  # each config once, across the lists and within one
        new = []
        for c in cands:
            if str(c) not in seen and valid(c, problem, arch)[0]:
                seen.add(str(c))
                new.append(c)
        return new

    mine, back = fresh(given), fresh(retrieved)
    out = ([(c, "top") for c in picked] + [(c, "explore") for c in extra] + [(c, "given") for c in mine]
           + [(c, "retrieved") for c in back])
    order = sorted(range(len(out)), key=lambda i: estimate(out[i][0], problem, arch).seconds)
    ranks = {i: r for r, i in enumerate(order)}
    return [(c, src, ranks[i]) for i, (c, src) in enumerate(out)]


class QuickCheck:
    """The fp32 reference of one shape's buffers and the error of its correctly rounded result."""

    def __init__(self, bufs):
        import torch  # start-up cost: the search package imports no torch at its top

        a, b = bufs.a.float(), bufs.b.float()
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            self.ref = a @ b
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
        del a, b
        self.e0 = float((self.ref.to(bufs.c.dtype).float() - self.ref).square().sum().sqrt())
        self.bufs = bufs

    def __call__(self, fn) -> tuple[bool, str]:
        import torch  # start-up cost: the search package imports no torch at its top

        c = self.bufs.c
        c.fill_(float("nan"))
        fn()
        torch.cuda.synchronize(c.device)
        nan = int(torch.isnan(c).sum())
        if nan:
            return False, f"quick check: {nan} of {c.numel()} elements of C left NaN"
        err = float((c.float() - self.ref).square().sum().sqrt())
        r = err / self.e0 if self.e0 else (0.0 if err == 0 else math.inf)
        if not r <= QUICK_R:
            return False, f"quick check: error {r:.3g}x that of the correctly rounded result (limit {QUICK_R})"
        return True, ""


def _rows_for(problem: GemmProblem, base: dict, name: str, layout: str, t, info: str, verified: bool,
              reason: str, algo: str = "", floor: float = math.nan) -> dict:
    row = {**base, "candidate": name, "layout": layout, "algo": algo, "verified": verified, "reason": reason,
           "info": info, "timestamp": now()}
    if t is not None:
        row.update(time_ms=t.time_ms, tflops=t.tflops, n=t.n, p20_ms=t.p20_ms, p80_ms=t.p80_ms, floor_ms=floor,
                   floor_ok=not below_floor(t.time_ms, floor))
        if t.reason:
            row["reason"] = "; ".join(x for x in (reason, t.reason) if x)
        if not row["floor_ok"]:
            row["reason"] = f"below the roofline floor ({t.time_ms:.4g} ms < 0.95 x {floor:.4g} ms): measurement error"
    return row


@dataclass(frozen=True)
class ScreenEntry:
    """One config to screen at one shape: its candidate name, the layout it reads, the family's config object (what
    is compiled), how to make the candidate, the row's ``info`` and ``algo`` (the string a selection is
    re-measured from)."""

    name: str
    layout: str
    config: object
    make: Callable[[], object]
    info: str
    algo: str


def entries_for(problem: GemmProblem, spec: ScreenSpec, arch: Arch, pool: list[Config],
                given: Iterable[Config] = (), table: Sequence = ()) -> list[ScreenEntry]:
    """The Triton family's entries for every layout of ``spec``: the model's top configs, explored ones, the
    ``given`` ones (``triton_configs(spec.configs)``, read once by the caller) where valid, and the winners of
    ``table`` (``retrieve.read_winners``, read once) on the nearest shapes, each in the layout it won in (in every
    layout of ``spec`` when that one is not screened)."""
    near = nearest(problem, table, spec.retrieve_shapes) if table else []
    out = []
    for layout in spec.layouts:
        pl = problem.with_(layout=layout)
        mine = [c for c, lay in near if lay == layout or lay not in spec.layouts]
        for c0, src, rank in configs_for(pl, arch, spec.top, spec.explore, pool, spec.seed, spec.variants,
                                         spec.diverse, given, mine):
            for c in (replace(c0, pdl=v) for v in PDL_CHOICES[spec.pdl]):  # twins side by side, in one chunk
                if not valid(c, pl, arch)[0]:
                    continue
                name = f"triton:{c}:{pl.layout}"
                info = (f"screen;source={src};rank={rank};pred_us={estimate(c, pl, arch).seconds * 1e6:.4g};"
                        f"pred_warm_us={estimate(c, pl, arch, warm_l2=True).seconds * 1e6:.4g}")
                out.append(ScreenEntry(name, pl.layout, c, partial(TritonGemm, c, layout=pl.layout, acc=problem.acc,
                                                                   name=name), info, str(c)))
    return out


def cutlass_entries(problem: GemmProblem, spec: ScreenSpec, arch: Arch) -> list[ScreenEntry]:
    """The CUTLASS family's entries for every layout of ``spec``: each config of the family with the knob
    settings ``knobs_for`` screens at this shape."""
    cs = cutlass_sm90
    out = []
    for layout in spec.layouts:
        pl = problem.with_(layout=layout)
        cfgs = cutlass_configs(spec.configs, layout, problem.dtype) if spec.configs else cs.family(layout, problem.dtype)
        for cfg, knobs in cs.screen_entries(pl, cfgs, arch.num_sms, all_knob_settings=spec.all_knobs):
            name = f"{cs.PREFIX}{cfg}:{knobs}"
            out.append(ScreenEntry(name, layout, cfg, partial(cs.CutlassCandidate, cfg, knobs, name=name), "screen;source=family",
                                   f"{cfg}:{knobs}"))
    return out


def own_entries(problem: GemmProblem, spec: ScreenSpec, arch: Arch,
                screen_configs: Callable[[GemmProblem, int], list]) -> list[ScreenEntry]:
    """The entries of a family that picks its own configs (its ``screen_configs``; layout tn only, none if ``spec``
    screens nn alone): wgmma, tiny."""
    if "tn" not in spec.layouts:
        return []
    fam, pt = family(spec.family), problem.with_(layout="tn")
    out = []
    for cfg in screen_configs(pt, arch.num_sms):
        name = f"{fam.prefix}{cfg}"
        out.append(ScreenEntry(name, "tn", cfg, partial(fam.candidate, cfg, pt, name), "screen;source=family",
                               str(cfg)))
    return out


def screen_problem(problem: GemmProblem, entries: list[ScreenEntry], spec: ScreenSpec, base: dict,
                   arch: Arch) -> list[dict]:
    """Quick-check and time one shape's configs (and the references), chunk by chunk; result rows."""
    import torch  # start-up cost: the search package imports no torch at its top

    floors = {p: floor_ms(problem, base["gpu"], p, l2_bytes(spec.device)) for p in spec.protocols}
    bufs = make_buffers(problem, "cuda", seed=spec.seed)
    check = QuickCheck(bufs)
    a, b, bt, c = bufs.args()
    refs = {}
    for v in vendor_candidates(problem):
        if v.name in REFERENCES:
            v.prepare(problem, bufs, "cold", make_timer(bufs, "cold", spec.timing))
            refs[v.name] = v
    rows: list[dict] = []
    for ci in range(0, len(entries), spec.chunk):
        chunk = entries[ci:ci + spec.chunk]
        live, meta = {}, {}
        for e in chunk:
            name, info = e.name, f"{e.info};chunk={ci // spec.chunk}"
            pl = problem.with_(layout=e.layout)
            try:
                cand = e.make()
                cand.prepare(pl, bufs, "graph", None)
                ok, why = check(lambda f=cand: f(a, b, bt, c))
            except Exception as exc:  # noqa: BLE001 - a config that fails is a row
                torch.cuda.synchronize()
                ok, why = False, f"prepare/call failed: {type(exc).__name__}: {exc}"[:300]
            if not ok:
                for p in spec.protocols:
                    rows.append(_rows_for(problem, {**base, "protocol": p}, name, e.layout, None, info, False,
                                          why, e.algo))
                continue
            live[name] = lambda f=cand: f(a, b, bt, c)
            meta[name] = (info, e.algo, e.layout)
        for rn, v in refs.items():
            live[rn] = lambda f=v: f(a, b, bt, c)
            meta[rn] = (f"screen_ref;chunk={ci // spec.chunk}", str(v.info().get("algo", "")), v.layout)
        for p in spec.protocols:
            cfg_t = replace(spec.timing, seed=None)  # fresh, so no kernel can know the inputs it is timed on
            ts = measure(live, bufs, p, cfg_t, layouts={k: v[2] for k, v in meta.items()})
            for name, t in ts.items():
                info, algo, layout = meta[name]
                reason = QUICK_REASON if name not in refs else ""
                rows.append(_rows_for(problem, {**base, "protocol": p}, name, layout, t, info, t.ok, reason, algo,
                                      floors[p]))
        del live
        torch.cuda.synchronize()
    del bufs, check
    torch.cuda.empty_cache()
    return rows


@without_grad
def run_screen(spec: ScreenSpec, progress: bool = True) -> Path:
    """Screen every shape of ``spec`` into ``spec.out`` (resuming at the first shape without rows)."""
    import torch  # start-up cost: the search package imports no torch at its top

    require_cuda(spec.device)
    torch.cuda.set_device(spec.device)
    arch = Arch.from_device(spec.device)
    meta_row = collect_meta(spec.device).row()
    done = {r["mnk"] for r in read_rows([spec.out])} if Path(spec.out).is_file() else set()
    todo = [p for p in spec.problems if p.mnk not in done]
    plan = SCREENS[spec.family].plan(todo, spec, arch, meta_row["gpu"], progress)
    writer = ResultsWriter(spec.out)
    bar = _progress(len(todo), "screen") if progress else None
    for p in todo:
        base = base_row(p, "graph", meta_row, 0, spec.timing)
        base["sm_clock_mhz"] = sm_clock_mhz(spec.device)
        rows = screen_problem(p, plan[p], spec, base, arch)
        writer.write_batch(rows)
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    return spec.out


# -- how each family is screened: what it draws at a shape and what it builds before any timing --------------
Plan = dict[GemmProblem, list[ScreenEntry]]


def _plan_triton(todo: list[GemmProblem], spec: ScreenSpec, arch: Arch, gpu: str, progress: bool) -> Plan:
    """The cost model's top configs, the exploration pool, given and retrieved ones; compiled in parallel first."""
    pool = exploration_pool(spec.seed, spec.pool, spec.variants)
    given = triton_configs(spec.configs)
    table = read_winners(spec.retrieve, spec.retrieve_per_shape,
                         None if spec.retrieve_any_gpu else gpu) if spec.retrieve and todo else []
    plan = {p: entries_for(p, spec, arch, pool, given, table) for p in todo}
    if todo:
        failed = precompile([(e.config, problem.with_(layout=e.layout))
                             for problem, es in plan.items() for e in es], arch, spec.workers, progress)
        if failed:
            print(f"screen: {len(failed)} kernel(s) failed to compile; they are recorded as failed rows")
    return plan


def _plan_cutlass(todo: list[GemmProblem], spec: ScreenSpec, arch: Arch, gpu: str, progress: bool) -> Plan:
    """Every config of the family (or the given ones) with its knobs; every config compiled (or found in the
    cache) in parallel before any timing."""
    plan = {p: cutlass_entries(p, spec, arch) for p in todo}
    if todo:
        cfgs = {e.config for es in plan.values() for e in es}
        built = cutlass_sm90.build_family(cfgs, arch_for(), progress=progress)
        bad = {str(c): str(b.error) for c, b in built.items() if not b.ok}
        if bad:
            print(f"screen: {len(bad)} CUTLASS config(s) failed to build; they are recorded as failed rows: {bad}")
    return plan


def _plan_own(screen_configs: Callable, build_dtype: Callable, todo: list[GemmProblem], spec: ScreenSpec,
              arch: Arch, gpu: str, progress: bool) -> Plan:
    """A family that picks its own configs, from one build per dtype (a failure stops here with its log)."""
    plan = {p: own_entries(p, spec, arch, screen_configs) for p in todo}
    for dtype in sorted({p.dtype for p in todo}):  # one nvcc run per dtype, before any timing
        build_dtype(dtype)
    return plan


@dataclass(frozen=True)
class FamilyScreen:
    """How ``gemmrl select --family F`` screens F: ``plan(todo, spec, arch, gpu, progress)`` draws each shape's
    entries and builds them, ``options`` are the ScreenSpec options it takes, ``read_configs`` reads ``--configs``."""

    plan: Callable[..., Plan]
    options: frozenset = frozenset()
    read_configs: Callable[[Iterable[str]], list] | None = None


SCREENS = {
    "triton": FamilyScreen(_plan_triton, frozenset({"pdl", "configs", "variants", "diverse", "retrieve"}),
                           triton_configs),
    "cutlass": FamilyScreen(_plan_cutlass, frozenset({"configs", "all_knobs"}), cutlass_configs),
    "tiny": FamilyScreen(partial(_plan_own, tiny_gemm.screen_configs, tiny_gemm.build_dtype)),
    "wgmma": FamilyScreen(partial(_plan_own, wgmma_gemm.screen_configs, wgmma_gemm.build_dtype)),
    "decode": FamilyScreen(partial(_plan_own, decode_gemm.screen_configs, decode_gemm.build_dtype)),
}
# ScreenSpec options that only some families' screens take: (is it set, what it is for)
OPTIONS: dict[str, tuple[Callable[[ScreenSpec], bool], str]] = {
    "pdl": (lambda s: s.pdl != "off", "pdl={spec.pdl!r} is a Triton launch option"),
    "configs": (lambda s: bool(s.configs), "a config list is for the cutlass or triton family"),
    "variants": (lambda s: bool(s.variants), "variants are the Triton family's ({variants})"),
    "diverse": (lambda s: s.diverse, "diverse picks the Triton family's top configs"),
    "retrieve": (lambda s: bool(s.retrieve), "retrieve adds earlier Triton winners"),
    "all_knobs": (lambda s: s.all_knobs, "all_knobs is for the cutlass family's scheduler knobs"),
}


def selection_table(rows: Iterable[dict], keep: Callable[[str], bool] | None = None) -> list[dict]:
    """Per (mnk, protocol): the fastest quick-checked config and the fastest reference, with their ratio.
    ``keep(algo)``, if given, limits the configs to those it accepts (a subset of the screened family: what the
    screen would have picked without the others); the references are unaffected."""
    best: dict[tuple, dict] = {}
    ref: dict[tuple, dict] = {}
    for r in rows:
        if str(r.get("verified")).lower() != "true" or not str(r.get("info", "")).startswith("screen"):
            continue
        t = float(r["time_ms"])
        key = (r["mnk"], r["protocol"])
        ours = r["candidate"].startswith(tuple(family(f).prefix for f in SCREENS))
        if ours and keep is not None and not keep(r.get("algo") or r["candidate"].split(":", 1)[-1]):
            continue
        d = best if ours else ref
        if key not in d or t < float(d[key]["time_ms"]):
            d[key] = r
    out = []
    for key in sorted(best, key=lambda k: (k[1], k[0])):
        b, v = best[key], ref.get(key)
        out.append({"mnk": key[0], "protocol": key[1], "config": b["algo"], "best_ms": float(b["time_ms"]),
                    "ref": v["candidate"] if v else "", "ref_ms": float(v["time_ms"]) if v else math.nan,
                    "ratio": float(v["time_ms"]) / float(b["time_ms"]) if v else math.nan})
    return out
