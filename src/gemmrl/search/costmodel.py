"""Analytic cost model of the Triton family: ranks configs for a shape and prunes the space before timing.

For a config on a GPU (``Arch``: 132 SMs, 989 TFLOP/s, 3.35 TB/s on an H100) the predicted device time is

    launches * t_launch  +  fill  +  max(mainloop, hbm)  +  reduction

* mainloop: the SM with the most programs (wave quantization: ceil(programs / SMs), for a persistent kernel
  ceil(tiles / programs)) runs its K steps one after another; a step takes the longer of its MMA time
  (2*BM*BN*BK at the SM's share of peak times an instruction efficiency: wgmma needs a 64-row MMA dimension and
  whole warpgroups, else mma.sync at about half the rate) and its L2 time ((BM+BN)*BK*2 bytes at the SM's share
  of L2 bandwidth), and no less than the load latency divided by the loads in flight (stages-1 per program,
  times the programs resident on the SM; one with rows Triton cannot prove 16-element aligned, whose scalar
  loads are neither pipelined nor wide): the pipeline-depth term, Little's law per SM, which is what limits
  a memory-bound kernel with too few programs or too shallow a pipeline. Padded tiles count as work (tile
  efficiency).
* hbm: bytes that must cross HBM (A, B, C once, plus split-K partials written and read) at peak bandwidth.
  With ``warm_l2`` (the graph protocol) operands that fit in L2 cost nothing here.
* fill: one load latency plus the epilogue per wave (per program for a persistent kernel, whose later tiles
  overlap their loads with the previous epilogue). A CUTLASS ping-pong kernel's two consumer warpgroups take turns:
  one stores its C tile while the other runs its main loop, so all but the last tile's epilogue leave the fill and
  bound the call beside the main loop and HBM instead (``pingpong_overlap``).
* reduction: two-pass split-K adds a second launch (queued behind the first, so cheaper than a call's first) and a
  pass over the fp32 workspace; fused adds the last program's read of the partials and its counter atomic; atomic,
  the atomics' traffic.
* tma: a Triton program builds its tensor descriptors on the device before its first load (per wave of one-tile
  programs; once for a persistent program, however many tiles it runs).
* masked K: a pointer-load kernel whose K is not a multiple of BK masks every K step's loads (``EVEN_K`` false;
  TMA descriptors zero-fill out of bounds for free). Measured on H100 screens of K = 64 shapes, BK = 128 against
  BK = 64 with every other field the same: +0.29-0.37 us a call in graph, +0.19-0.38 us in cold (one-step loops;
  docs/measurements.md, The grid library: the host-order library run), counted once per wave (per tile in turn for a persistent kernel).
* pdl (programmatic dependent launch): with ``warm_l2`` (calls back to back in a graph) part of each launch's
  latency overlaps the previous call; a single call after a flush (cold) gains nothing.

The constants are rough (datasheet peaks, latencies from microbenchmark lore); the model's job is the
ranking. ``prune(problem, k)`` keeps the k configs predicted fastest, with a few slots reserved for each
variant so that timing can correct the model where it is wrong. Nothing here imports torch or triton.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from typing import Iterable

from ..kernels.cutlass_sm90 import parse_name
from ..kernels.triton_gemm.configs import (H100, Arch, Config, PersistentConfig, SplitKConfig, acc_regs,
                                           aligned_operands, parse_config, smem_bytes)
from ..problem import GemmProblem
from .space import VARIANTS, enumerate_space


@dataclass(frozen=True)
class CostParams:
    """The model's constants. The first guesses (datasheet peaks, latencies from microbenchmark lore) were
    refitted against measured H100 times: ``benchmarks/acceptance/costmodel_fit.py --fit 400 --all`` on the screen of 38 shapes
    (``h100_probe38_triton-select-top24-explore24_2026-11-22.csv.gz``, 48 configs each, graph and cold), maximizing
    the mean Spearman minus the log of the top-4 regret, each constant kept within x3 of its first guess. With
    the first guesses: median Spearman 0.853 cold / 0.871 graph, top-4 regret (best measured of the model's 4
    best / best measured) 1.099 / 1.100; fitted on half the shapes and scored on the other half, regret
    1.01-1.03 cold and 1.07-1.09 graph. The fitted values are rankers, not physics: mma.sync far below wgmma,
    warp specialization strongly preferred where the MMA dominates (as the H100 showed at 4096-wide shapes).
    The runs from the small-tile re-screen to the ring-depth fix (``docs/measurements.md``, Cost model): a ring deeper than a program's K steps holds no
    more loads, and the slot the consumer holds is out of flight once the ring cycles (``ring_slack``); the fill
    latency (a program's first load) is apart from the steady state's, which blends HBM and L2 by the share of loads
    that miss in L2 (cold) and rises with the programs' demand against that level's peak; programs resident together
    add sub-linearly to the loads in flight (``resident_overlap``); ``step_us`` (a K step's fixed cost) and the
    exposed last MMA set block-K at short K; a row-major tile order pays ``raster_penalty`` at many waves. The
    latencies and ``kmask_us`` were refitted (``costmodel_fit.py --fit 120 --all --fixed <the rest>
    --exclude-shapes benchmarks/shapes/held50_grid_seed2.txt``) on five screens without the held-out 50 shapes:
    top-4 regret 1.021 cold / 1.041 graph there, 1.028 / 1.029 on held50s2.
    The traffic probe: ``launch2_us`` (the second kernel of a two-pass call had cost a whole ``launch_us``), ``tma_setup_us``
    and ``atomic_us`` refitted (``--fit 60 --all``, the rest fixed) on those screens plus the traffic probe's (wide
    split-K tiles and decode tiles the model had ranked low: two-pass and pointer loads measured fastest): top-4
    regret 1.018 cold / 1.032 graph (was 1.022 / 1.043), the probe's 1.023 / 1.040 (1.031 / 1.106), held50s2 1.030 /
    1.022 (1.028 / 1.029). ``LEGACY_PARAMS`` below holds the ring-depth fix's constants (what the shipped policy was trained on).
    The CUTLASS vendor-cells run: ``pingpong_overlap`` (CUTLASS ping-pong, 0 before): on 426 (shape, protocol) cells of six committed
    CUTLASS screens (``benchmarks/acceptance/costmodel_cutlass_ranking.py``) the best measured config among the model's top 4 moved
    from 1.142 to 1.078 of the best measured (geomean regret), median Spearman 0.674 -> 0.703; any value 0.25-1
    scores within 0.002 of that, and 1 (the whole epilogue hidden) is what the schedule is built to do. Then
    ``streamk_us`` and ``streamk_split_us``: over every committed CUTLASS screen, a stream-K config ran 0.7-1.7 us
    (median, shapes under 30 us) slower than the persistent config of the same tile without a split, and with its
    split-K decomposition 4.4-5.2 us at 2 splits, ~9 at 4, ~11.5 at 8; the model had priced the split configs below the
    persistent ones (the whole estimate divided by ``ws_bonus ** 0.5``). At 1 and 2 us: top-4 regret 1.078 -> 1.038 on
    the six screens, 1.076 -> 1.040 on held50s2's CUTLASS screen (not used to set them), Spearman 0.703 -> 0.795."""

    launch_us: float = 3.7          # one kernel in a CUDA graph: launch to first instruction, and teardown
    launch2_us: float = 1.8         # the second kernel of a two-pass split-K call, queued behind the first
    latency_us: float = 0.98        # a load's round trip from HBM under load (the steady state's loads in flight)
    l2_latency_us: float = 0.40     # ... from L2
    fill_latency_us: float = 0.82   # the first load's round trip from HBM (pipeline fill, a program's first K step)
    fill_l2_latency_us: float = 0.29  # ... from L2
    wgmma_eff: float = 0.45         # fraction of peak a fed wgmma mainloop sustains
    mma_eff: float = 0.15           # mma.sync (tiles under 64 rows or partial warpgroups)
    tma_bonus: float = 1.07         # descriptor loads: fewer address instructions and registers
    tma_setup_us: float = 0.9       # a program's device-side descriptors (tl.make_tensor_descriptor: written to global
                                    # scratch, fenced, then fetched) before its first load (once per program)
    ws_bonus: float = 3.09          # warp specialization: producer and consumers overlap
    atomic_us: float = 2.25         # one counter atomic and its fence
    pdl_us: float = 0.9             # launch latency PDL hides behind the previous kernel, per launch, in a graph
                                    # (first guess: the H100's empty kernel node, 0.95 us, the wgmma global-split run's pace probe)
    scalar_load_eff: float = 0.30   # share of load bandwidth left with 2-byte scalar loads (unaligned rows)
    kmask_us: float = 0.27          # K % BK != 0 with pointer loads: masked loads in every K step, per wave
    step_us: float = 0.03           # one K step's fixed cost in a program: barrier, waits, address updates
    ring_slack: float = 0.5         # ring slots not in flight in the steady state (the one the consumer holds)
    raster_penalty: float = 0.06    # a row-major tile order's L2 misses at many waves (group_m < 4), in main-loop time
    resident_overlap: float = 0.5   # how far programs resident together add to the loads in flight (1: fully)
    fma_eff: float = 0.05           # a GEMV's fp32 multiply-adds on the CUDA cores, as a fraction of the tensor peak
                                    # (the H100's fp32 peak is 0.068 of it; the widening of each element costs more)
    pingpong_overlap: float = 1.0   # share of a CUTLASS ping-pong tile's epilogue hidden under the other consumer
                                    # warpgroup's main loop (0: serialized as in every other persistent kernel)
    streamk_us: float = 1.0         # a CUTLASS stream-K call's fixed extra: its workspace barriers zeroed and the
                                    # host-side initialize on every call
    streamk_split_us: float = 2.0   # ... and per split of a tile beyond the first (its partial through the
                                    # workspace, the fix-up's wait on the barrier)


DEFAULT = CostParams()
# the constants only CUTLASS configs read (estimate_cutlass): a fit on Triton screens cannot see them
CUTLASS_ONLY = frozenset({"pingpong_overlap", "streamk_us", "streamk_split_us"})
# The constants of git 667d8e3 (the ring-depth fix): the RL policies saved before a policy recorded its prior's constants
# were trained on features computed with these (search/policy.py reads such a file with them).
LEGACY_PARAMS = replace(DEFAULT, launch2_us=DEFAULT.launch_us, tma_setup_us=0.0, atomic_us=1.5, pingpong_overlap=0.0,
                        streamk_us=0.0, streamk_split_us=0.0)


@dataclass(frozen=True)
class Estimate:
    seconds: float
    mainloop: float
    hbm: float
    fill: float
    launch: float
    reduction: float
    programs: int

    @property
    def us(self) -> float:
        return self.seconds * 1e6


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _occupancy(cfg: Config, problem: GemmProblem, arch: Arch) -> int:
    """Programs resident per SM: shared memory, registers and the 64-warp limit."""
    if cfg.variant == "persistent":
        return cfg.ctas_per_sm
    smem = smem_bytes(cfg, problem)
    regs = cfg.warps * 32 * min(arch.max_regs_per_thread, acc_regs(cfg, problem) + 64)
    return max(1, min(arch.smem_per_sm // smem, arch.regs_per_sm // regs, 64 // cfg.warps, 32))


def estimate(cfg: Config, problem: GemmProblem, arch: Arch = H100, warm_l2: bool = False,
             params: CostParams = DEFAULT, epi_overlap: float = 0.0) -> Estimate:
    """Predicted device time of one call (seconds) and its parts; assumes ``cfg`` is valid. ``epi_overlap``: the
    share of a persistent program's per-tile epilogues that runs under its main loop (two consumers taking turns, as
    CUTLASS's ping-pong does): that share leaves the fill and bounds the call beside the main loop and HBM instead."""
    M, N, K = problem.M, problem.N, problem.K
    sms = arch.num_sms
    split = getattr(cfg, "split", 1)
    k_steps = _cdiv(_cdiv(K, cfg.BK), split)          # per program
    tiles = _cdiv(M, cfg.BM) * _cdiv(N, cfg.BN)
    occ = _occupancy(cfg, problem, arch)
    if cfg.variant == "persistent":
        programs = min(tiles, sms * cfg.ctas_per_sm)
        per_sm = _cdiv(tiles, programs) * _cdiv(programs, sms)   # tiles the busiest SM runs, in turn
        waves = 1
    else:
        programs = tiles * split
        per_sm = _cdiv(programs, sms)
        waves = _cdiv(programs, sms * occ)
    # MMA shape: swap-AB puts N in the MMA's M dimension; a GEMV (smallm, mma=False) multiplies on the CUDA cores
    gemv = not getattr(cfg, "mma", True)
    mma_m = cfg.BN if cfg.variant == "smallm" else cfg.BM
    wgmma = mma_m >= 64 and cfg.warps % 4 == 0 and arch.cc >= 90
    eff = params.fma_eff if gemv else params.wgmma_eff if wgmma else params.mma_eff
    if getattr(cfg, "tma", False):
        eff *= params.tma_bonus
    if getattr(cfg, "ws", False):
        eff *= params.ws_bonus
    p_sm = arch.peak_tflops * 1e12 / sms
    l2_sm = arch.l2_tbps * 1e12 / sms
    step_flops = 2.0 * cfg.BM * cfg.BN * cfg.BK
    step_bytes = (cfg.BM + cfg.BN) * cfg.BK * 2.0
    resident = max(1, min(occ, per_sm))
    # Rows Triton cannot prove 16-element aligned (configs.aligned_operands): scalar loads, no cp.async pipeline.
    scalar = not getattr(cfg, "tma", False) and not all(aligned_operands(problem))
    stages = 1 if scalar else cfg.stages
    # K steps whose loads are under way on the SM: a ring deeper than the program's K steps holds no more
    # (the slot the consumer holds is out of flight only once the ring cycles: a program with no more K steps than
    # slots issues all its loads up front)
    slots = min(stages - 1, k_steps)
    in_flight = max(1, slots) - (params.ring_slack if k_steps > slots else 0.0)
    if gemv:  # no ring: a step's loads all go out together, straight into registers
        in_flight = 1.0
    in_flight *= resident ** params.resident_overlap
    load_bw = l2_sm * (params.scalar_load_eff if scalar else 1.0)
    t_mma = step_flops / (p_sm * eff)
    # Where a load is served from and how long its round trip takes. Cold, the share of the programs' loads that
    # miss in L2 is the operands' bytes over all the bytes the programs load (each tile re-reads its row and column
    # panels); warm, every load hits. The round trip grows with the memory system's load: the unloaded (fill)
    # latency where the programs' demand is far under the peak of the level serving them, the loaded one at it.
    operand_bytes = 2.0 * (M * K + K * N)
    hbm_share = 0.0 if warm_l2 else min(1.0, operand_bytes / max(1.0, programs * k_steps * step_bytes))
    lat_loaded = (hbm_share * params.latency_us + (1 - hbm_share) * params.l2_latency_us) * 1e-6
    lat_unloaded = (hbm_share * params.fill_latency_us + (1 - hbm_share) * params.fill_l2_latency_us) * 1e-6
    fill_lat = params.fill_l2_latency_us * 1e-6 if warm_l2 else params.fill_latency_us * 1e-6
    demand = min(sms, programs) * step_bytes / max(t_mma, step_bytes / load_bw)
    peak = hbm_share * arch.hbm_tbps * 1e12 + (1 - hbm_share) * arch.l2_tbps * 1e12
    lat = lat_unloaded + (lat_loaded - lat_unloaded) * min(1.0, demand / peak)
    t_step = max(t_mma, step_bytes / load_bw, lat / in_flight)
    # the fixed cost of each K step, paid once for the programs resident together; the last step's MMA runs after
    # its load has landed, with nothing left to overlap (so at equal latency, more and smaller K steps drain sooner)
    mainloop = per_sm * k_steps * t_step + _cdiv(per_sm, resident) * k_steps * params.step_us * 1e-6 + t_mma
    # tile order: with more tiles than run at once, a row-major order (group_m 1) spreads the running tiles over
    # more operand panels than a grouped one, and fewer of their loads hit in L2 (measured over the screens: group_m
    # 8 against 1, 4-9% faster above 1024 tiles, ~1% at one wave or less)
    if getattr(cfg, "group_m", 4) < 4 and tiles > sms * occ:
        mainloop *= 1 + params.raster_penalty * min(1.0, math.log2(tiles / (sms * occ)) / 3)
    # HBM traffic
    out_bytes = 2.0 * M * N
    red = getattr(cfg, "reduction", "none") if split > 1 else "none"
    ws_bytes = 0.0
    if red in ("two_pass", "fused"):
        ws_bytes = 2 * 4.0 * split * M * N              # written, then read back
    elif red == "atomic":
        ws_bytes = 4.0 * split * M * N + 8.0 * M * N
    fits = operand_bytes + out_bytes + ws_bytes <= 0.8 * arch.l2_bytes
    hbm_bytes = out_bytes + ws_bytes + (0.0 if (warm_l2 and fits) else operand_bytes)
    hbm = hbm_bytes / (arch.hbm_tbps * 1e12)
    # fill and epilogue
    epi = cfg.BM * cfg.BN * 2.0 / l2_sm
    masked = 0.0 if getattr(cfg, "tma", False) or K % cfg.BK == 0 else params.kmask_us * 1e-6
    setup = params.tma_setup_us * 1e-6 if getattr(cfg, "tma", False) else 0.0  # once per program
    hidden = 0.0  # epilogue time that overlaps the main loop (ping-pong), all but the last tile's
    if cfg.variant == "persistent":
        hidden = epi_overlap * epi * (max(1, per_sm) - 1)
        fill = fill_lat + setup + (epi + masked) * max(1, per_sm) - hidden
    else:
        fill = waves * (fill_lat + epi + masked + setup)
    launches = 2 if red == "two_pass" else 1
    reduction = 0.0
    if red == "two_pass":
        reduction = 4.0 * split * M * N / (arch.hbm_tbps * 1e12) + fill_lat
    elif red == "fused":
        reduction = split * cfg.BM * cfg.BN * 4.0 / l2_sm + params.atomic_us * 1e-6
    elif red == "atomic":
        reduction = cfg.BM * cfg.BN * 4.0 / l2_sm + params.atomic_us * 1e-6
    launch = (params.launch_us + (launches - 1) * params.launch2_us) * 1e-6
    if warm_l2 and getattr(cfg, "pdl", False):  # back to back (graph): the launch overlaps the previous call
        launch = max(0.0, launch - launches * params.pdl_us * 1e-6)
    total = launch + fill + max(mainloop, hbm, hidden) + reduction
    return Estimate(total, mainloop, hbm, fill, launch, reduction, programs)


def rank(problem: GemmProblem, configs: Iterable[Config], arch: Arch = H100, warm_l2: bool = False,
         params: CostParams = DEFAULT) -> list[tuple[float, Config]]:
    """(predicted seconds, config), fastest first (ties broken by the config's string, so the order is stable)."""
    scored = [(estimate(c, problem, arch, warm_l2, params).seconds, str(c), c) for c in configs]
    scored.sort(key=lambda t: (t[0], t[1]))
    return [(s, c) for s, _, c in scored]


def prune(problem: GemmProblem, k: int, arch: Arch = H100, warm_l2: bool = False, min_per_variant: int = 2,
          params: CostParams = DEFAULT, variants: Iterable[str] | None = None) -> list[Config]:
    """The ``k`` configs predicted fastest for ``problem``: first the ``min_per_variant`` best of every variant
    that has valid configs (where k leaves room), then the best of the rest; sorted fastest first. ``variants``:
    only those (all when None)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    by_variant: dict[str, list] = {v: [] for v in VARIANTS}
    for cfg in enumerate_space(problem, arch, variants):
        t = estimate(cfg, problem, arch, warm_l2, params).seconds
        heapq.heappush(by_variant[cfg.variant], (t, str(cfg), cfg))
    live = [v for v in VARIANTS if by_variant[v]]
    reserve = min_per_variant if k >= min_per_variant * len(live) else 0
    picked = []
    for v in live:
        for _ in range(min(reserve, len(by_variant[v]))):
            picked.append(heapq.heappop(by_variant[v]))
    rest = heapq.merge(*(sorted(by_variant[v]) for v in live))
    for item in rest:
        if len(picked) >= k:
            break
        picked.append(item)
    picked.sort(key=lambda t: (t[0], t[1]))
    return [c for _, _, c in picked[:k]]


def shape_group(cfg: Config) -> tuple:
    """What makes two configs different kernels in kind rather than in tuning: the variant, the tile and the
    split (for ``prune_diverse``); block K, warps, stages, TMA and the rest are tuning within a group."""
    return (cfg.variant, cfg.BM, cfg.BN, getattr(cfg, "split", 1), getattr(cfg, "reduction", "none"))


def prune_diverse(problem: GemmProblem, k: int, arch: Arch = H100, warm_l2: bool = False,
                  params: CostParams = DEFAULT, variants: Iterable[str] | None = None) -> list[Config]:
    """The model's best config of each ``shape_group`` (variant, tile, split, reduction), the ``k`` best groups,
    fastest first. ``prune`` fills its k with near twins of one kernel where the model's margins are thin (at
    64_64_16384 its 12 best split-K configs are 2 tiles x splits 16 and 32, in TMA and stage twins); a screen of k
    configs spread over tiles and splits lets the timing correct the model's choice of the kernel's shape."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    best: dict[tuple, tuple[float, str, Config]] = {}
    for cfg in enumerate_space(problem, arch, variants):
        item = (estimate(cfg, problem, arch, warm_l2, params).seconds, str(cfg), cfg)
        g = shape_group(cfg)
        if g not in best or item[:2] < best[g][:2]:
            best[g] = item
    return [c for _, _, c in heapq.nsmallest(k, best.values(), key=lambda t: t[:2])]


def floor_seconds(problem: GemmProblem, arch: Arch = H100) -> float:
    """Roofline floor at the datasheet peaks (problem.floor_s with this arch's numbers)."""
    return max(problem.flops / (arch.peak_tflops * 1e12), problem.bytes / (arch.hbm_tbps * 1e12))


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman rank correlation (average ranks for ties): predicted vs measured times."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError("spearman needs two sequences of equal length >= 2")

    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for t in range(i, j + 1):
                r[order[t]] = (i + j) / 2.0
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy) if sx and sy else 0.0


def estimate_cutlass(cfg, knobs, problem: GemmProblem, arch: Arch = H100, warm_l2: bool = False,
                     params: CostParams = DEFAULT) -> Estimate:
    """A CUTLASS SM90 config (``kernels.cutlass_sm90``) under the same model: a TMA warp-specialized kernel of its
    tile, as deep a pipeline as shared memory allows (capped at the Triton family's 4 stages), persistent over the
    tiles; with the stream-K scheduler's split-K decomposition, ``splits`` programs per tile reduced in place."""
    if cfg.swap:  # C^T = B^T A^T: the kernel's tile runs BM along N
        problem = problem.with_(M=problem.N, N=problem.M)
    stages = max(2, min(4, cfg.stages))
    warps = 12 if cfg.schedule == "coop" else 8
    # stream-K zeroes its workspace barriers and initializes on every call; each split goes through the workspace
    extra = (params.streamk_us + params.streamk_split_us * max(0, knobs.splits - 1)) * 1e-6 \
        if cfg.scheduler == "streamk" else 0.0
    if cfg.scheduler == "streamk" and knobs.splits > 1:
        tc = SplitKConfig(BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, warps=8, stages=stages, split=knobs.splits,
                          reduction="fused", tma=True)
        e = estimate(tc, problem, arch, warm_l2, params)
        return replace(e, seconds=e.seconds / params.ws_bonus ** 0.5 + extra)
    tc = PersistentConfig(BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, warps=min(8, warps), stages=stages, tma=True, ws=True,
                          ctas_per_sm=1)
    # ping-pong: one consumer warpgroup's epilogue (its C tile stored through TMA) runs while the other's main loop
    # does; the cooperative schedule's two warpgroups share a tile and store it between main loops
    overlap = params.pingpong_overlap if cfg.schedule == "pingpong" else 0.0
    e = estimate(tc, problem, arch, warm_l2, params, epi_overlap=overlap)
    return replace(e, seconds=e.seconds + extra)


def _estimate_triton(payload: str, problem: GemmProblem, arch: Arch, warm_l2: bool, params: CostParams) -> float:
    return estimate(parse_config(payload), problem, arch, warm_l2, params).seconds


def _estimate_cutlass(payload: str, problem: GemmProblem, arch: Arch, warm_l2: bool, params: CostParams) -> float:
    cfg, knobs = parse_name(payload)
    return estimate_cutlass(cfg, knobs, problem, arch, warm_l2, params).seconds


ESTIMATES = {"triton": _estimate_triton, "cutlass": _estimate_cutlass}  # the families the model predicts


def estimate_spec(spec, problem: GemmProblem, arch: Arch = H100, warm_l2: bool = False,
                  params: CostParams = DEFAULT) -> float:
    """Predicted seconds of a ``evaluate.CandidateSpec`` of the ``triton`` (config string) or ``cutlass``
    (``"<config>:<knobs>"``) family at ``problem`` (in the spec's layout). ValueError for anything else."""
    if spec.family not in ESTIMATES:
        raise ValueError(f"the cost model estimates Triton and CUTLASS configs, not {spec.family!r} candidates")
    return ESTIMATES[spec.family](str(spec.payload), problem.with_(layout=spec.layout), arch, warm_l2, params)
