"""The false-rejection sweep on a GPU: every vendor path and configs of every family of ours (Triton, CUTLASS,
tiny, wgmma) through the correctness battery over many seeds on 30 shapes (benchmarks/shapes/false_rejection30.txt).
Every candidate is correct, so every failure is a false rejection; the target is 0. See
gemmrl.adversarial.false_rejections for what one seed checks (full battery for the first seed, then per seed an
accuracy and an exact-integer call through the guarded harness, references shared by all candidates).

    python benchmarks/acceptance/false_rejections.py --out DIR [--seeds 100] [--shapes FILE] [--max-seconds 150] [--no-cutlass]
        [--build]
    python benchmarks/acceptance/false_rejections.py --out DIR --device cpu --seeds 2 --shapes FILE   # smoke run, no GPU

Candidates per shape: the 7 vendor paths (vendor_candidates); the Triton family, one config per variant (tiled,
persistent, splitk, and smallm where M <= 63), the first of a short preference list that the family's predicate
accepts there (few distinct configs, so few compiles; they are compiled first, in parallel); CUTLASS (layout tn,
the shape's dtype, where K and N are multiples of 8): three configs of ``family`` with the last of their
``knobs_for`` settings (none with --no-cutlass); tiny (``tiny_configs``: the unsplit BMx64 tile M needs, and its
deepest cluster split valid there, else its staged-epilogue twin) and wgmma (``wgmma_configs``: the deepest cluster
split of 64x128 valid there, else unsplit, and the deepest global split, else the unsplit 128x128), both layout tn
where K % 8 == 0 (their predicates accept any M). The nvcc families (CUTLASS, tiny, wgmma) take only what is in the
build cache unless --build (--cutlass-build is the older name): a CUTLASS config builds in ~90 s, tiny's and wgmma's
one shared object per dtype in ~35 s / ~10 s; a warning line (one for CUTLASS, one for tiny and wgmma) says what was
left out and why (not cached, no nvcc, not sm_90a, a failed build). The shapes file's labels start with the dtype
(fp16 or bf16; read_shapes itself has no dtype column).

Prints the estimated time first (cost model below: FLOPs of the fp64 references and the candidates' GEMMs, the
host-bound guarded calls, battery runs, compiles), then a line per shape (measured vs modelled seconds); stops
adding shapes when --max-seconds is near (it says how many were done); writes
``<gpu>_false-rejections-<n>shapes-<m>seeds_<date>.csv`` (one row per shape and candidate, rewritten after every
shape) and ``..._summary_<date>.csv`` (per family) under --out, and prints the per-family table last. Exit status
0 when there are no false rejections, 1 when there are (or a shape broke), 2 without a GPU.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from datetime import date
from pathlib import Path

T_START = time.perf_counter()
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gemmrl.adversarial import false_rejections as S
from gemmrl.kernels import cutlass_sm90 as CS  # noqa: E402
from gemmrl.kernels import tiny_gemm, wgmma_gemm  # noqa: E402
from gemmrl.kernels.tiny_gemm import TinyCandidate, TinyConfig  # noqa: E402
from gemmrl.kernels.wgmma_gemm import WgmmaCandidate, WgmmaConfig  # noqa: E402
from gemmrl.kernels.triton_gemm import (H100, PersistentConfig, SmallMConfig, SplitKConfig, TiledConfig,  # noqa: E402
                                        TritonGemm, valid)
from gemmrl.kernels.triton_gemm.configs import next_pow2  # noqa: E402
from gemmrl.problem import GemmProblem, read_shape_labels, read_shapes  # noqa: E402

SHAPES = ROOT / "benchmarks" / "shapes" / "false_rejection30.txt"

# ---------------------------------------------------------------------------------------------------------
# Cost model (H100): what one shape costs, for the estimate printed at the start and for --max-seconds.
# Host-bound: one guarded call (verify._call) makes 12 synchronizing bitwise compares (C, 8 guard bands, 3 inputs),
# a NaN scan, output capture and thread checks; the judge (verify._measure) 4 more syncs and ~20 fp64 passes.
# Counted on the CPU (TorchDispatchMode): ~220 aten ops, ~30 of them synchronizing, per candidate and seed; the
# same work costs 2.1 ms of CPU time there (no GPU: no launch or sync latency, a slower host).
# ---------------------------------------------------------------------------------------------------------
FP64_FLOPS = 50e12       # cuBLAS DGEMM on an H100, roughly
GEMM_FLOPS = 300e12      # a candidate's fp16/bf16 GEMM, averaged over vendor and our (untuned) configs
BYTES_PER_S = 2.0e12     # fp64 element-wise passes of the judge and the reference (memory bound)
PAIR_S = 1.5e-3          # fixed cost of one seed for one candidate: 2 guarded calls, judge, integer compare
SEED_S = 1.5e-3          # fixed cost of one seed's inputs and references (shared by all candidates)
BATTERY_S = 0.045        # one full battery run (stream_order's 20 ms device sleep + 2 ms probe, 5 harnesses, 7 calls)
PREPARE_S = 0.3          # per shape: prepare every candidate (cuBLASLt autotuning, 2 layouts; Triton cache loads)
COMPILE_S = 3.0          # one Triton specialization compiled in a worker process (they run in parallel)
COMPILE_START_S = 6.0    # the compile workers' start (spawned processes import torch and triton)
STARTUP_S = 10.0         # python, torch, CUDA context, vendor library, CUTLASS cache lookup


def shape_seconds(p: GemmProblem, n_cands: int, seeds: int, full: int = 1) -> float:
    """Estimated seconds for one shape: per seed 4 fp64 GEMMs (reference and sigma, the integer inputs' bound and
    product) and ~30 fp64 passes over C; per candidate and seed two fp16/bf16 GEMMs, ``PAIR_S``, ~25 fp64 passes
    over C (the judge) and the input compares; ``full`` battery runs per candidate (with their own fp64
    references); prepare."""
    mnk, mn = p.M * p.N * p.K, p.M * p.N
    per_seed = SEED_S + 4 * 2 * mnk / FP64_FLOPS + 30 * 8 * mn / BYTES_PER_S
    inputs = p.M * p.K + p.K * p.N
    per_pair = PAIR_S + 2 * 2 * mnk / GEMM_FLOPS + 25 * 8 * mn / BYTES_PER_S + 6 * 2 * inputs / BYTES_PER_S
    battery = BATTERY_S + 10 * 2 * mnk / FP64_FLOPS  # its checks' own references: 10 fp64 GEMMs
    return PREPARE_S + seeds * (per_seed + n_cands * per_pair) + n_cands * full * battery


# ---------------------------------------------------------------------------------------------------------
# Shapes and candidates
# ---------------------------------------------------------------------------------------------------------
def load_shapes(path: str | Path) -> list[GemmProblem]:
    """read_shapes (fp16, layout tn), with the dtype from the label's first word where it is 'bf16'."""
    labels = read_shape_labels(str(path))
    out = []
    for p in read_shapes(str(path)):
        words = labels.get(p.mnk, "").split()
        out.append(p.with_(dtype="bf16") if words and words[0] == "bf16" else p)
    return out


def triton_configs(p: GemmProblem) -> list[tuple[object, str]]:
    """(config, layout): per variant the first of a short preference list its predicate accepts at ``p`` (H100)."""
    bm = next_pow2(max(p.M, 16))
    prefs = {
        "tiled": ("tn", [TiledConfig(BM=128, BN=128, BK=64, warps=8, stages=3, group_m=8),
                         TiledConfig(BM=64, BN=64, BK=32, warps=4, stages=3, group_m=8)]),
        "persistent": ("tn", [PersistentConfig(BM=128, BN=128, BK=64, warps=8, stages=3, tma=True),
                              PersistentConfig(BM=64, BN=64, BK=32, warps=4, stages=3, tma=False)]),
        "splitk": ("nn", [SplitKConfig(BM=64, BN=64, BK=64, warps=4, stages=4, split=4, reduction="fused", tma=True),
                          SplitKConfig(BM=64, BN=64, BK=32, warps=4, stages=3, split=2, reduction="two_pass"),
                          SplitKConfig(BM=32, BN=32, BK=16, warps=4, stages=2, split=2, reduction="two_pass")]),
        "smallm": ("tn", [SmallMConfig(BM=bm, BN=128, BK=128, warps=4, stages=4),
                          SmallMConfig(BM=bm, BN=64, BK=64, warps=4, stages=3, split=2, reduction="two_pass"),
                          SmallMConfig(BM=bm, BN=32, BK=32, warps=4, stages=2)]),
    }
    out = []
    for variant, (layout, cfgs) in prefs.items():
        if variant == "smallm" and p.M > 63:
            continue
        q = p.with_(layout=layout)
        cfg = next((c for c in cfgs if valid(c, q, H100)[0]), None)
        if cfg is not None:
            out.append((cfg, layout))
    return out


CUTLASS_SPECS = (("coop", 128, 128, 64, "persistent"), ("pingpong", 64, 128, 64, "persistent"),
                 ("coop", 128, 128, 64, "streamk"))


def cutlass_configs(dtype: str) -> list:
    want = {(s, bm, bn, bk, sched) for s, bm, bn, bk, sched in CUTLASS_SPECS}
    return [c for c in CS.family("tn", dtype) if (c.schedule, c.bm, c.bn, c.bk, c.scheduler) in want
            and (c.cm, c.cn) == (1, 1)]


def cutlass_entries(p: GemmProblem, builds: dict) -> list[tuple[object, object]]:
    """(config, knobs) for ``p``: the configs built for its dtype that ``valid`` accepts, each with the last of its
    ``knobs_for`` settings (swizzle 8 on large grids; split-K or stream-K decomposition for stream-K configs)."""
    out = []
    for cfg in cutlass_configs(p.dtype):
        if cfg not in builds or (p.layout, p.dtype) != (cfg.layout, cfg.dtype):
            continue
        knobs = CS.knobs_for(cfg, p)
        if knobs:
            out.append((cfg, knobs[-1]))
    return out


def source_cached(src, arch: str) -> bool:
    """Whether the shared object of CUDA source ``src`` built for ``arch`` is in the build cache, where
    ``cuda_source.build`` would find it (``$GEMMRL_CACHE_DIR``/build/cuda/<key>; the key covers the source, flags,
    arch, nvcc version and headers). Nothing is compiled or created."""
    from gemmrl.kernels import cuda_source as CU
    from gemmrl.kernels import toolchain
    from gemmrl.paths import cache_dir

    nvcc = toolchain.find_nvcc()
    if not nvcc:
        return False
    key = CU.build_key(src, arch, nvcc, toolchain.include_dirs(src.includes))
    d = cache_dir("build", "cuda") / key
    return (d / "build.json").is_file() and (d / "candidate.so").is_file()


def cutlass_cached(cfg, arch: str) -> bool:
    """Whether ``cfg``'s shared object is in the build cache (nothing is compiled)."""
    return source_cached(cfg.source(), arch)


def cutlass_builds(problems: list[GemmProblem], allow_build: bool) -> dict:
    """{config: Build} for the CUTLASS configs the shapes need that are (or, with ``allow_build``, can be) built;
    prints a warning for what is left out and why. Never raises."""
    need = list(dict.fromkeys(c for d in dict.fromkeys(p.dtype for p in problems) for c in cutlass_configs(d)))
    try:
        from gemmrl.kernels import toolchain

        arch = toolchain.arch_for()
        if not arch.startswith("90"):
            print(f"WARNING: CUTLASS family skipped: it needs sm_90a, this GPU is sm_{arch}")
            return {}
        if not toolchain.find_nvcc():
            print("WARNING: CUTLASS family skipped: nvcc not found (set CUDA_HOME or GEMMRL_NVCC)")
            return {}
        cached = [c for c in need if cutlass_cached(c, arch)]
        missing = [c for c in need if c not in cached]
        if missing and not allow_build:
            print(f"WARNING: {len(missing)} CUTLASS config(s) not in the build cache, skipped (--build builds "
                  f"them, ~90 s each): {', '.join(map(str, missing))}")
        todo = need if allow_build else cached
        built = CS.build_family(todo, arch) if todo else {}
    except Exception as e:  # noqa: BLE001 - headers missing, toolchain broken: the family is skipped, not the run
        print(f"WARNING: CUTLASS family skipped: {type(e).__name__}: {e}")
        return {}
    bad = {c: b for c, b in built.items() if not b.ok}
    for c, b in bad.items():
        print(f"WARNING: CUTLASS {c} skipped: did not build: {b.error}")
    return {c: b for c, b in built.items() if b.ok}


# The tiny and wgmma families: every config of a dtype is in one shared object (tiny_splitk.cu, wgmma_splitk.cu built
# with -DGEMMRL_BF16=0|1), so what is built or cached is a (family, dtype); layout tn, fp32 accumulation, K % 8 == 0.
OWN = {"tiny": tiny_gemm, "wgmma": wgmma_gemm}
OWN_BUILD_S = {"tiny": 35, "wgmma": 10}  # one nvcc run per dtype, roughly
SMS = 132  # H100/H200 SXM, what the predicates assume; main passes the device's count (a split needs few tiles per SM)


def _first(cands: list, ok) -> list:
    c = next((c for c in cands if ok(c)), None)
    return [] if c is None else [c]


def tiny_configs(p: GemmProblem, sms: int = SMS) -> list[TinyConfig]:
    """Up to two tiny configs that ``tiny_gemm.valid`` accepts at ``p`` (layout tn): the unsplit BMx64 tile, BM the
    rows M needs (16, 32, else 64: the family's small-M tiles), ring depth 4; then the first of the same tile's
    cluster splits 8, 4, 2 valid there (the DSMEM reduction; split needs few tiles and enough K steps), else its
    staged-epilogue twin (``_es``, C through shared memory). None where K % 8 != 0."""
    q, d = p.with_(layout="tn"), p.dtype
    if d not in tiny_gemm.DTYPES:
        return []
    bm = 16 if p.M <= 16 else 32 if p.M <= 32 else 64
    ok = lambda c: tiny_gemm.valid(c, q, sms)[0]  # noqa: E731
    out = _first([TinyConfig(bm, 64, 1, 4, d)], ok)
    if out:
        out += _first([TinyConfig(bm, 64, s, 4, d) for s in (8, 4, 2)] + [TinyConfig(bm, 64, 1, 4, d, staged=True)], ok)
    return out


def wgmma_configs(p: GemmProblem, sms: int = SMS) -> list[WgmmaConfig]:
    """Up to two wgmma configs that ``wgmma_gemm.valid`` accepts at ``p`` (layout tn), ring depth 4: the first of
    64x128 with cluster splits 8, 4, 2, else unsplit (the family's default); and the first of 64x128 with global
    splits g8, g4, g2 (a workspace and a grid-wide wait; only few-tile shapes), else the unsplit 128x128 (two
    consumer warpgroups). None where K % 8 != 0."""
    q, d = p.with_(layout="tn"), p.dtype
    if d not in wgmma_gemm.DTYPES:
        return []
    ok = lambda c: wgmma_gemm.valid(c, q, sms)[0]  # noqa: E731
    out = _first([WgmmaConfig(1, 128, s, 4, d) for s in (8, 4, 2, 1)], ok)
    if out:
        out += _first([WgmmaConfig(1, 128, 1, 4, d, g) for g in (8, 4, 2)] + [WgmmaConfig(2, 128, 1, 4, d)], ok)
    return list(dict.fromkeys(out))


OWN_CONFIGS = {"tiny": tiny_configs, "wgmma": wgmma_configs}


def own_cached(fam: str, dtype: str, arch: str) -> bool:
    """Whether family ``fam``'s (tiny, wgmma) shared object of ``dtype`` is in the build cache (nothing is compiled)."""
    return source_cached(OWN[fam].source(dtype), arch)


def own_builds(problems: list[GemmProblem], allow_build: bool, families=tuple(OWN), sms: int = SMS
               ) -> set[tuple[str, str]]:
    """{(family, dtype)} of the tiny and wgmma shared objects the shapes need that are (or, with ``allow_build``,
    can be) built, loaded into this process's build table (the candidates' ``prepare`` finds them there); prints a
    warning line for what is left out and why. Never raises."""
    need = list(dict.fromkeys((f, p.dtype) for f in families for p in problems if OWN_CONFIGS[f](p, sms)))
    if not need:
        return set()
    fams = "/".join(dict.fromkeys(f for f, _ in need))
    try:
        from gemmrl.kernels import toolchain

        arch = toolchain.arch_for()
        if not arch.startswith("90"):
            print(f"WARNING: {fams} family skipped: it needs sm_90a (clusters, DSMEM, TMA), this GPU is sm_{arch}")
            return set()
        if not toolchain.find_nvcc():
            print(f"WARNING: {fams} family skipped: nvcc not found (set CUDA_HOME or GEMMRL_NVCC)")
            return set()
        cached = [k for k in need if own_cached(*k, arch)]
    except Exception as e:  # noqa: BLE001 - no arch, a broken toolchain: the families are skipped, not the run
        print(f"WARNING: {fams} family skipped: {type(e).__name__}: {e}")
        return set()
    missing = [k for k in need if k not in cached]
    if missing and not allow_build:
        secs = ", ".join(f"{f} ~{OWN_BUILD_S[f]} s" for f in dict.fromkeys(f for f, _ in missing))
        print(f"WARNING: {len(missing)} tiny/wgmma build(s) (one shared object per family and dtype) not in the build "
              f"cache, skipped (--build builds them, {secs} each): {', '.join(f'{f} {d}' for f, d in missing)}")
    todo = missing if allow_build else []
    try:  # the missing ones compile in parallel (one nvcc each), as CUTLASS's build_family does
        from gemmrl.kernels import cuda_source as CU

        fresh = dict(zip(todo, CU.build_many([OWN[f].source(d) for f, d in todo], arch))) if todo else {}
    except Exception as e:  # noqa: BLE001 - as above
        print(f"WARNING: {fams} family: building {len(todo)} missing build(s) failed: {type(e).__name__}: {e}")
        fresh = {k: None for k in todo}
    ok = set()
    for f, d in cached + todo:
        b = fresh.get((f, d))
        if (f, d) in fresh and (b is None or not b.ok):
            if b is not None:
                print(f"WARNING: {f} {d} skipped: did not build: {b.error.stage}: {b.error.message}")
            continue
        try:
            OWN[f].build_dtype(d, arch)  # from the cache now: into this process's table, for the candidates' prepare
            ok.add((f, d))
        except Exception as e:  # noqa: BLE001 - one dtype's build must not lose the rest
            print(f"WARNING: {f} {d} skipped: did not build: {type(e).__name__}: {e}")
    return ok


def own_entries(p: GemmProblem, own, sms: int = SMS) -> list:
    """The tiny and wgmma configs of ``p`` whose (family, dtype) is in ``own``."""
    return [c for f in OWN_CONFIGS if (f, p.dtype) in own for c in OWN_CONFIGS[f](p, sms)]


def _own_candidate(cfg):
    """A tiny or wgmma candidate, labelled with its family (``family_of`` reads a ``family`` attribute first; from the
    module alone it would say 'tiny_gemm' / 'wgmma_gemm')."""
    if isinstance(cfg, TinyConfig):
        cand = TinyCandidate(cfg)
        cand.family = "tiny"
    else:
        cand = WgmmaCandidate(cfg)
        cand.family = "wgmma"
    return cand


def make_factory(builds: dict, vendor: bool = True, own=frozenset(), sms: int = SMS):
    """Candidates per problem: vendor paths, Triton configs, CUTLASS configs in ``builds``, tiny and wgmma configs
    whose (family, dtype) is in ``own`` (what ``own_builds`` gives)."""
    from gemmrl.kernels.vendor import vendor_candidates

    def factory(p: GemmProblem) -> list:
        cands = list(vendor_candidates(p)) if vendor else []
        cands += [TritonGemm(cfg, layout, p.acc) for cfg, layout in triton_configs(p)]
        cands += [CS.CutlassCandidate(cfg, knobs, builds[cfg]) for cfg, knobs in cutlass_entries(p, builds)]
        cands += [_own_candidate(cfg) for cfg in own_entries(p, own, sms)]
        return cands

    return factory


def count_candidates(p: GemmProblem, builds: dict, vendor: bool = True, own=frozenset(), sms: int = SMS) -> int:
    return 7 * vendor + len(triton_configs(p)) + len(cutlass_entries(p, builds)) + len(own_entries(p, own, sms))


# ---------------------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------------------
def write_csv(path: Path, rows: list[dict], meta: dict) -> None:
    if not rows:
        return
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]) + list(meta))
        w.writeheader()
        w.writerows({**r, **meta} for r in rows)


def table(summ: list[dict]) -> str:
    lines = [f"{'family':10} {'candidates':>10} {'not run':>8} {'shapes':>6} {'calls':>8} {'false rejections':>17} "
             f"{'max R/limit':>11} {'max elem':>8}"]
    for g in summ:
        lines.append(f"{g['family']:10} {g['candidates']:10d} {g['not_run']:8d} {g['shapes']:6d} {g['calls']:8d} "
                     f"{g['false_rejections']:17d} {g['r_over_limit_max']:11.3f} {g['elem_ratio_max']:8.3f}")
    return "\n".join(lines)


def timed_table(timed: list[dict]) -> str:
    """The timed-output check per family and protocol: candidate-seeds run, outputs checked, false rejections."""
    groups: dict[tuple[str, str], list[int]] = {}
    for r in timed:
        if r["status"] == "not_run":
            continue
        for key in ((r["family"], r["protocol"]), ("all", r["protocol"])):
            g = groups.setdefault(key, [0, 0, 0, 0])
            g[0] += 1
            g[1] += int(r["seeds"])
            g[2] += int(r["output_checks"])
            g[3] += int(r["failures"])
    lines = ["| family | protocol | candidates | candidate-seeds | outputs checked | false rejections |",
             "|---|---|---|---|---|---|"]
    for (fam, proto), g in sorted(groups.items(), key=lambda kv: (kv[0][0] == "all", kv[0])):
        lines.append(f"| {fam} | {proto} | {g[0]} | {g[1]} | {g[2]} | {g[3]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for the rows and summary CSVs")
    ap.add_argument("--seeds", type=int, default=100, help="seeds per shape (default 100)")
    ap.add_argument("--seed-base", type=int, default=0, help="first seed (seeds are base..base+n-1)")
    ap.add_argument("--shapes", default=str(SHAPES), help="shapes file (M_N_K per line; label's first word = dtype)")
    ap.add_argument("--max-seconds", type=float, default=150.0,
                    help="stop adding shapes when the next one would end past this many seconds since start")
    ap.add_argument("--full-battery-seeds", type=int, default=1, help="full battery runs per candidate and shape")
    ap.add_argument("--timed-seeds", type=int, default=5,
                    help="seeds per shape for the timed-output check (every candidate timed in graph, cold and "
                         "offline per seed, its C checked after timed calls); 0: none")
    ap.add_argument("--no-cutlass", action="store_true", help="leave the CUTLASS family out")
    ap.add_argument("--build", "--cutlass-build", dest="build", action="store_true",
                    help="build what the nvcc families (CUTLASS configs, tiny and wgmma per dtype) miss in the build "
                         "cache (without it they are skipped with a warning)")
    ap.add_argument("--workers", type=int, default=None, help="Triton compile processes (default CPUs - 1)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a smoke run of this script under the Triton interpreter (Triton family only)")
    args = ap.parse_args(argv)

    import torch

    cpu = args.device == "cpu"
    if cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        gpu = "cpu"
    elif not torch.cuda.is_available():
        print("needs a CUDA GPU (--device cpu for a smoke run; the CPU tier is tests/adversarial/test_false_rejections.py)")
        return 2
    else:
        name = torch.cuda.get_device_name().lower()
        gpu = next((k for k in ("h200", "h100", "a100") if k in name), "gpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    problems = load_shapes(args.shapes)
    seeds = list(range(args.seed_base, args.seed_base + args.seeds))

    if cpu:
        print("WARNING: --device cpu: vendor paths, CUTLASS, tiny and wgmma need a GPU; Triton family only, under the "
              "interpreter")
    builds = {} if args.no_cutlass or cpu else cutlass_builds(problems, args.build)
    sms = SMS if cpu else torch.cuda.get_device_properties(0).multi_processor_count
    own = set() if cpu else own_builds(problems, args.build, sms=sms)
    pairs = [(cfg, p.with_(layout=layout)) for p in problems for cfg, layout in triton_configs(p)]
    from gemmrl.kernels.triton_gemm import precompile as PC
    from gemmrl.kernels.triton_gemm.configs import Arch

    arch = H100 if cpu else Arch.from_device(0)
    reps, _ = PC.groups(pairs, arch)
    workers = max(1, min(args.workers or (os.cpu_count() or 2) - 1, len(reps) or 1))
    n_cands = [count_candidates(p, builds, vendor=not cpu, own=own, sms=sms) for p in problems]
    est_shapes = [shape_seconds(p, n, len(seeds), args.full_battery_seeds) for p, n in zip(problems, n_cands)]
    est_compile = 0.0 if cpu else COMPILE_S * math.ceil(len(reps) / workers) + COMPILE_START_S
    est = STARTUP_S + est_compile + sum(est_shapes)
    pairs_n = sum(n_cands) * len(seeds)
    est_fixed = pairs_n * PAIR_S + sum(n_cands) * args.full_battery_seeds * BATTERY_S
    print(f"{len(problems)} shapes x {len(seeds)} seeds, {sum(n_cands)} candidates ({min(n_cands)}-{max(n_cands)} per "
          f"shape; CUTLASS configs: {len(builds)}; tiny/wgmma builds: "
          f"{', '.join(f'{f} {d}' for f, d in sorted(own)) or 'none'}), {len(reps)} Triton specializations to compile "
          f"on {workers} workers")
    gemm_flops = sum(2 * 2 * p.M * p.N * p.K * n for p, n in zip(problems, n_cands)) * len(seeds)
    fp64_flops = sum(4 * 2 * p.M * p.N * p.K for p in problems) * len(seeds)
    print(f"FLOPs: candidates' GEMMs {gemm_flops / 1e12:.1f} TFLOP (2 calls per candidate and seed), fp64 references "
          f"{fp64_flops / 1e12:.1f} TFLOP (4 GEMMs per shape and seed: {fp64_flops / FP64_FLOPS:.1f} s at "
          f"{FP64_FLOPS / 1e12:.0f} TFLOP/s)")
    print(f"estimated time on an H100: {est:.0f} s = startup {STARTUP_S:.0f} + compile {est_compile:.0f} + shapes "
          f"{sum(est_shapes):.0f} (of which {pairs_n} candidate-seeds x {PAIR_S * 1e3:.1f} ms and {sum(n_cands)} "
          f"battery runs x {BATTERY_S * 1e3:.0f} ms: {est_fixed:.0f} s; largest shape {max(est_shapes):.1f} s); "
          f"--max-seconds {args.max_seconds:g}", flush=True)

    if not cpu:
        t0 = time.perf_counter()
        failed = PC.precompile(pairs, arch, workers=workers, progress=False)
        print(f"compiled {len(reps)} Triton specializations in {time.perf_counter() - t0:.1f} s"
              + (f"; {len(failed)} failed (they will fail prepare): {list(failed.items())[:3]}" if failed else ""),
              flush=True)

    bar = None
    try:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(problems) * len(seeds), desc="shape x seed", unit="seed", dynamic_ncols=True,
                   mininterval=2.0)
    except ImportError:
        pass
    factory = make_factory(builds, vendor=not cpu, own=own, sms=sms)
    from gemmrl.results import collect_meta, git_sha, now

    meta = {**({"gpu": "cpu", "git_sha": git_sha()} if cpu else collect_meta().row()), "timestamp": now(),
            "seed_base": args.seed_base, "full_battery_seeds": args.full_battery_seeds}
    day = date.today().isoformat()
    stem = f"{gpu}_false-rejections-{len(problems)}shapes-{len(seeds)}seeds"
    rows_csv, summary_csv = out / f"{stem}_{day}.csv", out / f"{stem}_summary_{day}.csv"
    say = bar.write if bar is not None else print
    rows: list[dict] = []
    timed: list[dict] = []
    timed_csv = out / f"{stem}_timed-output-{args.timed_seeds}seeds_{day}.csv"
    errors: list[str] = []
    done, scale = 0, 1.0
    spent_model = spent_real = 0.0
    for i, p in enumerate(problems):
        elapsed = time.perf_counter() - T_START
        if elapsed + est_shapes[i] * scale > args.max_seconds:
            say(f"stopping at the time budget: {elapsed:.0f} s spent, shape {p.mnk} would take ~"
                f"{est_shapes[i] * scale:.0f} s more than --max-seconds {args.max_seconds:g} allows")
            break
        t1 = time.perf_counter()
        try:
            new = S.false_rejection_rows([p], factory, seeds, args.device, args.full_battery_seeds, progress=bar)
        except Exception as e:  # noqa: BLE001 - one broken shape (its inputs, a factory) must not lose the others
            errors.append(f"{p.mnk} {p.dtype}: {type(e).__name__}: {e}")
            say(f"ERROR: shape {errors[-1]}")
            new = []
        rows += new
        if args.timed_seeds:
            try:
                timed += S.timed_output_rows([p], factory, seeds[:args.timed_seeds], args.device)
            except Exception as e:  # noqa: BLE001 - as above: the other shapes go on
                errors.append(f"{p.mnk} {p.dtype} (timed-output check): {type(e).__name__}: {e}")
                say(f"ERROR: shape {errors[-1]}")
            write_csv(timed_csv, timed, meta)
        dt = time.perf_counter() - t1
        spent_real += dt
        spent_model += est_shapes[i]
        scale = max(1.0, spent_real / spent_model)  # the model's error so far; it only ever raises the estimate
        done += 1
        say(f"[{done}/{len(problems)} {time.perf_counter() - T_START:5.0f} s] {p.mnk} {p.dtype}: {len(new)} "
            f"candidates, {dt:.1f} s (model {est_shapes[i]:.1f} s), {sum(r['failures'] for r in new)} false rejections")
        write_csv(rows_csv, rows, meta)  # partial results survive a kill
    if bar is not None:
        bar.close()

    summ = S.summary(rows)
    write_csv(rows_csv, rows, meta)
    write_csv(summary_csv, summ, {**meta, "shapes_done": done, "shapes_planned": len(problems),
                                  "shape_errors": len(errors)})
    total = time.perf_counter() - T_START
    pairs_done = sum(r["seeds"] for r in rows)
    print(f"\n{done} of {len(problems)} shapes done in {total:.0f} s (estimated {est:.0f} s; shapes {spent_real:.0f} s "
          f"measured vs {spent_model:.0f} s modelled, {pairs_done} candidate-seeds); rows in {rows_csv}")
    for e in errors:
        print(f"  ERROR {e}")
    for r in rows:
        if r["status"] != "passed":
            print(f"  {r['status']:8} {r['mnk']} {r['dtype']} {r['candidate']}: {r['reason'][:200]}")
    print(table(summ))
    bad_timed = [r for r in timed if r["status"] == "rejected"]
    if args.timed_seeds:
        write_csv(timed_csv, timed, meta)
        for r in bad_timed:
            print(f"  timed-output {r['protocol']} {r['mnk']} {r['dtype']} {r['candidate']}: {r['reason'][:200]}")
        print(timed_table(timed))
    return 0 if not errors and not bad_timed and all(g["false_rejections"] == 0 for g in summ) else 1


if __name__ == "__main__":
    sys.exit(main())
