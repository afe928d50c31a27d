"""Timing protocols (DESIGN.md), each named in every result row.

- ``graph``   device time per call, warm L2: ``n`` back-to-back calls captured in one CUDA graph
              (enough for >= 10 ms of work by default, DESIGN.md's minimum is 1 ms; at most 1000 calls), >= 10 replays timed with CUDA events;
              statistic: median per-call time over replays; p20/p80 kept.
- ``cold``    device time of one call after writing a buffer of 2x the device's L2 size, events,
              >= 25 calls, median.
  In both, the candidates first run round-robin for ``settle_ms`` of wall time, untimed, so the GPU's
  clocks reach the state they hold under sustained load (a cold H100 boosts for tens of ms, then its
  power limit lowers the clock: the same 4096^3 graph measured 4.7% apart before and after that).
  And the GPU is kept busy (~60 us) before every start event, so the events bracket device work only:
  on an idle GPU the start event is stamped at once and the host's launch latency would be counted (seen
  on the H100: the same graph of 75 calls measured up to 3.7x slower in one of three re-measurements).
  Each sample checks it: if the start event had fired before the end event was enqueued, the host fell
  behind the window and the sample is taken again with a 4x, then 16x longer one (rows say
  ``late_retaken`` / ``late_kept`` in info when any was).
- ``offline`` CUDA-L2's offline mode: each iteration writes fresh random inputs and NaN into C outside
              the timed region, shuffles the candidates of the loop, and times each with the host clock around
              one call + synchronize. ``time_ms`` = mean per-call time, ``tflops`` = mean of per-call TFLOPS.
              The two forms of B are written in a random order each iteration (``candidate.refill``): the
              form written last sits dirty in L2, so writing bt last every time (as before) handed ``tn``
              candidates a head start whenever they ran first after the refill.
- ``server``  as offline, with an exponential sleep of mean 1/QPS between iterations.
  Which candidates share a loop (``TimingConfig.host_loop``, rows say ``host_loop=``): ``pairs`` (the default), as
  CUDA-L2's harness, which runs its kernel and one baseline per process: one loop per baseline, holding ours (every
  candidate the caller names in ``ours``) and that baseline, each loop with the full warm-up and benchmark time; ours
  are reported from the loop of the baseline with the highest mean TFLOPS (``paired_with=``), so ours against
  vendor_best is a ratio within one loop. ``all``: one loop of every candidate. In a crowd of eight vendor paths that
  share one call path, a unique path's host code is cold every iteration: on the H200 gemmrl.mm served the same
  cuBLASLt plan as ``cublaslt_heuristic_tn`` and measured ~8 us slower per call in ``server``, and tied or led with
  two candidates in the loop.

Every timed call sees new inputs, and what it wrote is checked (a kernel that remembers an output and replays it
when its inputs look unchanged is right in every battery check and fast in any loop that reuses inputs):
- ``graph``: each captured call is preceded by a device-side refill of A and of the form of B the path reads
  (``fill.Refill``: a counter on the device, advanced by every call and replay), the same for every path of a layout; the refill's own
  time is measured in fill-only graphs timed in the same rounds and subtracted round by round (row info ``fill_us``);
- ``cold``: A and both forms of B refilled before each call, in the untimed hook, before the L2 flush;
- ``offline``/``server``: refilled every iteration (CUDA-L2's loop).
After timed calls, outside the timed window, random rows of C are compared with an fp64 recompute of that call's
inputs (outputs.py; ``output_checks`` calls per path, drawn at random, and the first replay of every graph): a path
that fails is rejected with a reason starting ``timed_output:``, never timed. The seed of inputs, order and checked
rows is drawn fresh for every measurement unless one is given, and recorded (row info ``timing_seed``).

Every protocol interleaves the candidates of a loop (in offline/server one loop per baseline, see above) in a fresh
random order on every round, on identical inputs. A candidate that fails (raises, cannot be captured) gets ``inf``
and a reason; it never stops the others. Floors: ``floor_ok`` flags a time under 0.95 x T_floor (a measurement or
correctness error, never a result).
"""

from __future__ import annotations

import functools
import math
import os
import random
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Collection, Mapping

from .candidate import Buffers, refill
from .clocks import max_sm_mhz
from .fill import Refill
from .outputs import check_output
from .problem import GemmProblem

PROTOCOLS = ("graph", "cold", "offline", "server")
DEVICE_PROTOCOLS = ("graph", "cold")
HOST_PROTOCOLS = ("offline", "server")
HOST_LOOPS = ("pairs", "all")  # TimingConfig.host_loop
PAIR_SEED_STEP = 1009  # loop i of a paired measurement times with seed + PAIR_SEED_STEP * i
FLOOR_SLACK = 0.95
SELECT_SETTLE_MS = 50.0
SETTLE_MAX_MS = 3000.0
SETTLE_POLL_MS = 50.0
SETTLE_STABLE = 0.015  # the last SETTLE_READINGS clock readings within 1.5% of each other
SETTLE_READINGS = 8  # 350 ms of readings 50 ms apart: a power-capped H100 oscillates on that scale


class TimingError(RuntimeError):
    pass


@dataclass(frozen=True)
class TimingConfig:
    # >= 1 ms per DESIGN.md; 10 ms so each replay averages over a power-capped clock's swings (at
    # 2048_16384_4096 the H100 moved between 1260 and 1545 MHz and 1 ms replays split into two modes)
    graph_min_work_ms: float = 10.0
    graph_max_calls: int = 1000
    graph_replays: int = 20
    graph_min_timed_ms: float = 500.0  # more rounds until the timed replays span this much device time
    cold_calls: int = 25
    settle_ms: float = 200.0
    settle_max_ms: float = SETTLE_MAX_MS
    warmup_s: float = 5.0
    benchmark_s: float = 10.0
    qps: float = 100.0
    # None: drawn fresh for every measurement (os.urandom) and recorded in its rows: inputs a kernel cannot predict
    seed: int | None = None
    # every timed call sees new inputs (see the module docstring). False only to measure what that costs and the bias
    # it leaves (benchmarks/acceptance/fresh_inputs_cost.py); rows say fresh_inputs=0 then
    fresh_inputs: bool = True
    output_checks: int = 3  # timed calls per path whose C is checked (outputs.py), drawn at random
    # offline/server: hold the timing thread on one CPU for the loop (its rows say pinned_cpu=N): after a server
    # sleep the thread otherwise wakes wherever the scheduler puts it, with that core's caches cold for every path
    pin_cpu: bool = False
    # offline/server: "pairs" times one loop per baseline (ours + that baseline, CUDA-L2's harness), "all" one loop of
    # every candidate (see the module docstring); applies where the caller of measure() names ours
    host_loop: str = "pairs"

    def __post_init__(self) -> None:
        if self.host_loop not in HOST_LOOPS:
            raise TimingError(f"host_loop must be one of {', '.join(HOST_LOOPS)}, got {self.host_loop!r}")

    def for_sweep(self) -> "TimingConfig":
        """Short host-protocol durations for sweeps (recorded in the rows)."""
        return replace(self, warmup_s=0.25, benchmark_s=1.0)

    def quick(self) -> "TimingConfig":
        """Shorter device-time statistics for runs over hundreds of shapes (``gemmrl headroom --quick``, ``gemmrl
        bench --timing quick``): a 50 ms settle (at most 200), graphs of >= 2 ms of work, >= 10 replays spanning
        >= 100 ms, about a fifth of the default's device time per path. Still DESIGN.md's graph protocol (>= 1 ms of
        work, >= 10 replays); what it gives up is averaging over a power-capped clock's slow swings on the largest
        shapes, so a bar decided there is re-measured with the defaults."""
        return replace(self, settle_ms=50.0, settle_max_ms=min(self.settle_max_ms, 200.0), graph_min_work_ms=2.0,
                       graph_min_timed_ms=100.0, graph_replays=10)


@dataclass(frozen=True)
class Timing:
    protocol: str
    time_ms: float
    tflops: float
    n: int
    p20_ms: float
    p80_ms: float
    qps: float | None = None
    reason: str = ""
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def ok(self) -> bool:
        return math.isfinite(self.time_ms) and not self.reason


def failed(protocol: str, reason: str, extra: dict | None = None) -> Timing:
    return Timing(protocol, math.inf, 0.0, 0, math.inf, math.inf, None, reason, dict(extra or {}))


def wrong_output(protocol: str, reason: str, seed: int) -> Timing:
    """A path whose C after a timed call was not the product of that call's inputs: rejected, not slow."""
    return failed(protocol, reason, {"output_wrong": True, "seed": seed})


def fresh_seed() -> int:
    """A timing seed no kernel can know in advance."""
    return int.from_bytes(os.urandom(4), "little") >> 1


def resolve_seed(cfg: "TimingConfig") -> int:
    return fresh_seed() if cfg.seed is None else cfg.seed


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    pos = q * (len(s) - 1)
    lo, hi = int(math.floor(pos)), int(math.ceil(pos))
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _summary(protocol: str, per_call_ms: list[float], flops: int, *, mean: bool, qps=None, extra=None) -> Timing:
    extra = dict(extra or {})
    if mean:  # host protocols: CUDA-L2's statistics (the median is kept for algorithm selection)
        t = statistics.fmean(per_call_ms)
        tf = statistics.fmean(flops / (x * 1e-3) / 1e12 for x in per_call_ms)
        extra["median_ms"] = statistics.median(per_call_ms)
    else:
        t = statistics.median(per_call_ms)
        tf = flops / (t * 1e-3) / 1e12
    return Timing(protocol, t, tf, len(per_call_ms), _quantile(per_call_ms, 0.2), _quantile(per_call_ms, 0.8),
                  qps, "", extra)


def _order(names: list[str], rng: random.Random) -> list[str]:
    out = list(names)
    rng.shuffle(out)
    return out


# -- device-time protocols ---------------------------------------------------------------------

def _estimate_ms(fn: Callable[[], None], reps: int = 3) -> float:
    import torch  # start-up cost: torch loads on first use, not on import

    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / reps


BUSY_US = 60.0


def _busy(us: float = BUSY_US) -> None:
    """Keep the GPU busy for at least ``us`` before a timed region, so the host has enqueued the start event
    and the work behind it by the time the start event is stamped: events then measure device time, not
    the host's launch latency (on an idle GPU the start event fires at once and the gap until the launch
    is counted)."""
    import torch  # start-up cost: torch loads on first use, not on import

    torch.cuda._sleep(int(us * max_sm_mhz(torch.cuda.current_device())))


def _sm_clock_reader() -> Callable[[], float] | None:
    """The current SM clock in MHz (NVML, read-only), or None where NVML is absent (CPU tier)."""
    try:
        import pynvml  # optional dependency: NVML where installed
        import torch  # start-up cost: torch loads on first use, not on import

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return lambda: float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
    except Exception:  # noqa: BLE001
        return None


def _settle(fns: list[Callable[[], None]], ms: float, max_ms: float = SETTLE_MAX_MS,
            clock: Callable[[], float] | None = None) -> dict:
    """Run ``fns`` round-robin, untimed, for at least ``ms`` of wall time (at least one round), then on until
    the SM clock holds still (the last 8 readings 50 ms apart within 1.5%) or ``max_ms`` have passed. Under a
    sustained large GEMM an H100 boosts, then its power limit pulls the clock down over a few hundred ms
    (1980 -> 1425 -> 1305 MHz seen at 2048_16384_4096): timing before that point measures the boost."""
    import torch  # start-up cost: torch loads on first use, not on import

    info = {"settle_ms": 0.0, "mhz": None}
    if not fns:
        return info
    t0 = time.perf_counter()
    readings: list[float] = []
    last_poll = -math.inf
    while True:
        for f in fns:
            f()
        torch.cuda.synchronize()
        el = (time.perf_counter() - t0) * 1e3
        if clock is not None and el - last_poll >= SETTLE_POLL_MS:
            readings.append(clock())
            last_poll = el
        if el >= ms:
            tail = readings[-SETTLE_READINGS:]
            stable = clock is None or (len(tail) == SETTLE_READINGS and max(tail) <= min(tail) * (1 + SETTLE_STABLE))
            if stable or el >= max_ms:
                info.update(settle_ms=el, mhz=readings[-1] if readings else None)
                return info


def capture_stream():
    """The one side stream per device that timing graphs are warmed and captured on. torch keeps a cuBLAS workspace
    (32 MiB on sm_90) for every stream that ever ran a cuBLAS call, for the life of the process: a new stream per
    capture cycled through torch's pool of 32 and left up to 1 GiB of workspaces behind (+0.93 GiB peak in a patched
    Llama-3-8B forward on an H200, where the serving race captured on a new stream each time)."""
    import torch  # start-up cost: torch loads on first use, not on import

    d = torch.cuda.current_device()
    if d not in _CAPTURE_STREAM:
        _CAPTURE_STREAM[d] = torch.cuda.Stream()
    return _CAPTURE_STREAM[d]


_CAPTURE_STREAM: dict[int, Any] = {}


def _capture(fn: Callable[[], None], n: int):
    import torch  # start-up cost: torch loads on first use, not on import

    side = capture_stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch recommends before capture
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    torch.cuda.synchronize()
    return g


LATE_RETRIES = 2   # a late sample is taken again with a 4x, then 16x longer busy window


def _event_sample(fn: Callable[[], None], busy_us: float = BUSY_US) -> tuple[float, bool]:
    """(device ms of ``fn``'s work between two events, late): the GPU kept busy for ``busy_us`` before the start
    event; ``late`` when the start event had already fired by the time the end event was enqueued, i.e. the GPU
    may have waited for the host's launch inside the timed region (a slow or contended host: the busy window was
    too short)."""
    import torch  # start-up cost: torch loads on first use, not on import

    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    _busy(busy_us)
    s.record()
    fn()
    e.record()
    late = s.query()
    e.synchronize()
    return s.elapsed_time(e), late


def _event_ms(fn: Callable[[], None], late: list[int] | None = None,
              before: Callable[[], None] | None = None) -> float:
    """Device time of ``fn``'s work between two events (``_event_sample``), ``before`` run ahead of each attempt
    (cold: the L2 flush). A late sample is taken again with a longer busy window, up to ``LATE_RETRIES`` times;
    ``late`` (when given) counts [samples retaken, samples still late and kept]."""
    busy = BUSY_US
    for attempt in range(LATE_RETRIES + 1):
        if before is not None:
            before()
        ms, was_late = _event_sample(fn, busy)
        if not was_late:
            return ms
        if late is not None and attempt == 0:
            late[0] += 1
        busy *= 4
    if late is not None:
        late[1] += 1
    return ms


def _late_info(late: list[int]) -> dict:
    """Row info for a path's late samples (none: nothing added)."""
    return {"late_retaken": late[0], "late_kept": late[1]} if late[0] else {}


def _replay_ms(g) -> float:
    """Device time of one replay of ``g`` (after an untimed one)."""
    import torch  # start-up cost: torch loads on first use, not on import

    g.replay()
    torch.cuda.synchronize()
    return _event_ms(g.replay)


def _unwritten_by_replay(g, c) -> int:
    import torch  # start-up cost: torch loads on first use, not on import

    c.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return int(torch.isnan(c).sum())


# -- fresh inputs and checked outputs ---------------------------------------------------------------

def _fill(bufs: Buffers, layout: str | None, refill: Refill) -> Callable[[], None]:
    """A device-side refill of the inputs a ``layout`` candidate reads (A and ``b`` for nn, A and ``bt`` for tn; both
    forms, consistent, when the layout is not known): ``fill.Refill``, whose counter advances on the device, so each
    captured call and each replay writes numbers no other call saw."""
    s = bufs.problem.K ** -0.25
    a, b, bt = bufs.a, bufs.b, bufs.bt

    def fill() -> None:
        refill.bump()
        refill.normal(a, 0, s)
        if layout == "tn":
            refill.normal(bt, 1, s)
        else:
            refill.normal(b, 1, s)
            if layout != "nn":
                bt.copy_(b.t())
    return fill


def _fill_key(layouts: Mapping[str, str] | None, name: str) -> str | None:
    lay = (layouts or {}).get(name)
    return lay if lay in ("nn", "tn") else None


class _Checks:
    """Which timed calls of each path get their C checked (``n`` per path, at random among ``calls``) and the
    verdicts: the first wrong output of a path is its reason."""

    def __init__(self, names, n: int, calls: int, rng: random.Random):
        self.at = {k: set(rng.sample(range(calls), min(n, calls))) for k in names}
        self.rng = rng
        self.wrong: dict[str, str] = {}
        self.done = {k: 0 for k in names}

    def due(self, name: str, i: int) -> bool:
        return i in self.at.get(name, ()) and name not in self.wrong

    def run(self, name: str, bufs: Buffers, layout: str | None, where: str) -> None:
        why = check_output(bufs, layout, self.rng, where)
        self.done[name] += 1
        if why:
            self.wrong[name] = why


def time_graph(fns: Mapping[str, Callable[[], None]], bufs: Buffers, cfg: TimingConfig,
               replays: int | None = None, layouts: Mapping[str, str] | None = None) -> dict[str, Timing]:
    """Graph protocol. Every captured call is preceded by a device-side refill of the inputs (``_fill``: the same for
    every path of one layout, ``layouts`` naming each path's), so no two timed calls see the same inputs; the refill's
    own cost is timed in fill-only graphs of the same refill, interleaved with the paths, and subtracted round by
    round. Each captured graph must write all of C when replayed (work launched outside torch's current stream runs
    during the capture instead and leaves an empty graph), and C is checked against an fp64 recompute after the
    first replay and after ``cfg.output_checks`` random timed replays (outputs.py)."""
    import torch  # start-up cost: torch loads on first use, not on import

    problem, c = bufs.problem, bufs.c
    seed = resolve_seed(cfg)
    rng = random.Random(seed)
    fresh = cfg.fresh_inputs
    refill = Refill(c.device, seed) if fresh else None
    out: dict[str, Timing] = {}
    graphs: dict[str, tuple[object, int]] = {}
    fill_graphs: dict[str | None, tuple[object, int]] = {}
    checks = _Checks(fns, 0, 1, random.Random(rng.getrandbits(32)))
    try:
        def with_fill(fn, key):
            if not fresh:
                return fn
            fill = _fill(bufs, key, refill)
            return lambda: (fill(), fn())

        def sized(fn):
            est = max(_estimate_ms(fn), 1e-4)
            n = int(min(cfg.graph_max_calls, max(1, math.ceil(cfg.graph_min_work_ms / est))))
            g = _capture(fn, n)
            for _ in range(2):  # the estimate can be inflated by host launch gaps: size by a measured replay
                t = _replay_ms(g)
                if t >= 0.9 * cfg.graph_min_work_ms or n >= cfg.graph_max_calls:
                    break
                n = int(min(cfg.graph_max_calls, math.ceil(n * 1.1 * cfg.graph_min_work_ms / max(t, 1e-4))))
                del g
                g = _capture(fn, n)
            return g, n

        for name, fn in fns.items():
            key = _fill_key(layouts, name)
            try:
                g, n = sized(with_fill(fn, key))
                left = _unwritten_by_replay(g, c)
                if left:
                    out[name] = failed("graph", f"a replay of the captured graph left {left} of {c.numel()} elements "
                                                f"of C unwritten: the work was not captured (launched outside torch's "
                                                f"current stream?)")
                    continue
                if fresh:  # the replay above: its last call's inputs and output are in bufs
                    checks.run(name, bufs, key, "graph, first replay")
                    if name in checks.wrong:
                        out[name] = wrong_output("graph", checks.wrong[name], seed)
                        continue
                graphs[name] = (g, n)
                if fresh and key not in fill_graphs:
                    fill_graphs[key] = sized(_fill(bufs, key, refill))
            except Exception as e:  # noqa: BLE001 - a candidate that cannot be captured is recorded, not fatal
                torch.cuda.synchronize()
                out[name] = failed("graph", f"not capturable in a CUDA graph: {type(e).__name__}: {e}"[:300])
        every = [g.replay for g, _ in graphs.values()] + [g.replay for g, _ in fill_graphs.values()]
        # untimed replays: first-replay upload costs stay out, and the clocks settle under sustained load
        settled = _settle(every, cfg.settle_ms, cfg.settle_max_ms, _sm_clock_reader())
        nrep = max(cfg.graph_replays, replays or 0)
        # a power-capped GPU's clock moves on a scale of 100s of ms: the timed rounds span at least
        # graph_min_timed_ms of device time so the median is not one phase of that oscillation (at most 200 rounds)
        round_ms = sum(_replay_ms(g) for g, _ in (*graphs.values(), *fill_graphs.values()))
        nrep = max(nrep, min(200, math.ceil(cfg.graph_min_timed_ms / max(round_ms, 1e-3))))
        checks = _Checks(graphs, cfg.output_checks if fresh else 0, nrep, checks.rng)
        samples: dict[str, list[float]] = {k: [] for k in graphs}
        fill_ms: dict[str | None, list[float]] = {k: [] for k in fill_graphs}
        late = {k: [0, 0] for k in graphs}
        tags = [("path", k) for k in graphs] + [("fill", k) for k in fill_graphs]
        for i in range(nrep):
            this_round: dict[str, float] = {}
            for kind, name in _order(tags, rng):
                if kind == "fill":
                    g, n = fill_graphs[name]
                    fill_ms[name].append(_event_ms(g.replay) / n)
                    continue
                g, n = graphs[name]
                this_round[name] = _event_ms(g.replay, late[name]) / n
                if checks.due(name, i):
                    checks.run(name, bufs, _fill_key(layouts, name), f"graph, timed replay {i + 1} of {nrep}")
            for name, t in this_round.items():
                key = _fill_key(layouts, name)
                samples[name].append(t - (fill_ms[key][-1] if fresh else 0.0))
        for name, xs in samples.items():
            if name in checks.wrong:
                out[name] = wrong_output("graph", checks.wrong[name], seed)
                continue
            key = _fill_key(layouts, name)
            fresh_info = ({"fill_ms": statistics.median(fill_ms[key]), "output_checks": checks.done[name] + 1}
                          if fresh else {"fresh_inputs": 0})
            out[name] = _summary("graph", xs, problem.flops, mean=False,
                                 extra={"calls_per_graph": graphs[name][1], "settle_ms": round(settled["settle_ms"]),
                                        "settle_mhz": settled["mhz"], "seed": seed, **fresh_info,
                                        **_late_info(late[name])})
    finally:
        del graphs, fill_graphs
        if fresh:
            torch.cuda.synchronize()
            bufs.bt.copy_(bufs.b.t())  # the layout fills leave the two forms of B apart
            bufs.c.fill_(float("nan"))
    return out


_FLUSH: dict[int, object] = {}


def l2_bytes(device: int | None = None) -> int:
    import torch  # start-up cost: torch loads on first use, not on import

    d = torch.cuda.current_device() if device is None else device
    return int(getattr(torch.cuda.get_device_properties(d), "L2_cache_size", 50 * 2**20))


def _flush_buffer():
    import torch  # start-up cost: torch loads on first use, not on import

    d = torch.cuda.current_device()
    if d not in _FLUSH:
        _FLUSH[d] = torch.empty(2 * l2_bytes(d) // 4, dtype=torch.int32, device="cuda")
    return _FLUSH[d]


def _runnable(fns: Mapping[str, Callable[[], None]], protocol: str) -> tuple[dict, dict[str, Timing]]:
    """({name: fn} of the callables that ran one call, {name: failed Timing} of those that raised)."""
    import torch  # start-up cost: torch loads on first use, not on import

    live, out = {}, {}
    for name, fn in fns.items():
        try:
            fn()
            torch.cuda.synchronize()
            live[name] = fn
        except Exception as e:  # noqa: BLE001
            out[name] = failed(protocol, f"{type(e).__name__}: {e}"[:300])
    return live, out


def time_cold(fns: Mapping[str, Callable[[], None]], bufs: Buffers, cfg: TimingConfig,
              calls: int | None = None) -> dict[str, Timing]:
    """Cold protocol. Before every timed call (untimed): new random inputs written into A and both forms of B, NaN
    into C, then 2x L2 written, so the call reads operands no earlier call saw from device memory; C is checked
    after ``cfg.output_checks`` random timed calls per path."""
    seed = resolve_seed(cfg)
    rng = random.Random(seed + 1)
    fresh = cfg.fresh_inputs
    fill = _fill(bufs, None, Refill(bufs.a.device, seed)) if fresh else None
    flush = _flush_buffer()
    live, out = _runnable(fns, "cold")
    settled = _settle(list(live.values()), cfg.settle_ms, cfg.settle_max_ms, _sm_clock_reader())
    ncalls = max(cfg.cold_calls, calls or 0)
    checks = _Checks(live, cfg.output_checks if fresh else 0, ncalls, random.Random(rng.getrandbits(32)))
    samples: dict[str, list[float]] = {k: [] for k in live}
    late = {k: [0, 0] for k in live}

    def before(i: int) -> None:
        if fill is not None:
            fill()
            bufs.c.fill_(float("nan"))
        # write 2x L2 before each attempt: evicts the operands (and leaves dirty lines, as real work does)
        flush.fill_(i)

    for i in range(ncalls):
        for name in _order(list(live), rng):
            samples[name].append(_event_ms(live[name], late[name], before=lambda i=i: before(i)))
            if checks.due(name, i):
                checks.run(name, bufs, None, f"cold, timed call {i + 1} of {ncalls}")
    for name, xs in samples.items():
        if name in checks.wrong:
            out[name] = wrong_output("cold", checks.wrong[name], seed)
            continue
        out[name] = _summary("cold", xs, bufs.problem.flops, mean=False,
                             extra={"settle_ms": round(settled["settle_ms"]), "settle_mhz": settled["mhz"],
                                    "seed": seed, **({"output_checks": checks.done[name]} if fresh
                                                     else {"fresh_inputs": 0}), **_late_info(late[name])})
    return out


REFILLED = "refilled"  # not a protocol of the results: the device-time analog of the host protocols' inputs


def time_refilled(fns: Mapping[str, Callable[[], None]], bufs: Buffers, cfg: TimingConfig,
                  calls: int | None = None) -> dict[str, Timing]:
    """Device time of one call on the inputs a host-timed protocol's call sees (for choices made for those protocols
    where the host clock is too coarse): before every timed call (untimed) the host loop's own refill (``refill``: A
    and both forms of B written, the form written last drawn at random, NaN into C), no L2 flush; then the call
    between CUDA events as in cold (``_event_ms``). Medians of at least ``cfg.cold_calls`` calls per callable,
    interleaved. Rows never carry it: it serves selection (``make_timer(bufs, REFILLED)``)."""
    import torch  # start-up cost: torch loads on first use, not on import

    seed = resolve_seed(cfg)
    rng = random.Random(seed + 5)
    gen = torch.Generator(device=bufs.a.device).manual_seed(seed)
    live, out = _runnable(fns, REFILLED)
    _settle(list(live.values()), cfg.settle_ms, cfg.settle_max_ms, _sm_clock_reader())
    ncalls = max(cfg.cold_calls, calls or 0)
    samples: dict[str, list[float]] = {k: [] for k in live}
    for _ in range(ncalls):
        for name in _order(list(live), rng):
            samples[name].append(_event_ms(live[name], before=lambda: refill(bufs, gen, last=rng.choice(("tn", "nn")))))
    for name, xs in samples.items():
        out[name] = _summary(REFILLED, xs, bufs.problem.flops, mean=False, extra={"seed": seed})
    return out


# -- host-time protocols (CUDA-L2's offline / server) -------------------------------------------

def time_host(fns: Mapping[str, Callable[[], None]], bufs: Buffers, cfg: TimingConfig, protocol: str,
              min_calls: int = 0) -> dict[str, Timing]:
    """One CUDA-L2 offline/server loop over every callable in ``fns``, shuffled each iteration (``time_host_pairs``
    splits a measurement into one such loop per baseline). Inputs are refreshed in place each iteration, so the
    zero-arg callables (bound to ``bufs``) see fresh data; C is NaN-filled before every call. C is checked after the
    first timed call of each path and then at random times (on average ``cfg.output_checks`` more over the timed
    phase), right after the call, outside its timed window."""
    import torch  # start-up cost: torch loads on first use, not on import

    if protocol not in HOST_PROTOCOLS:
        raise TimingError(f"time_host runs {HOST_PROTOCOLS}, not {protocol!r}")
    seed = resolve_seed(cfg)
    rng = random.Random(seed + 2)
    exp = random.Random(seed + 3)
    gen = torch.Generator(device=bufs.a.device).manual_seed(seed)
    chk_rng = random.Random(seed + 4)
    out: dict[str, Timing] = {}
    live = dict(fns)
    samples: dict[str, list[float]] = {k: [] for k in live}
    sync = torch.cuda.synchronize if bufs.a.is_cuda else (lambda: None)  # CPU tensors: the test tier
    clock = time.perf_counter
    checks = _Checks(live, 0, 1, chk_rng)
    mean_gap = max(cfg.benchmark_s, 1e-3) / max(cfg.output_checks, 1)
    next_check = {k: -math.inf for k in live}  # the first timed call of each path is checked

    def one_iteration(record: bool) -> None:
        refill(bufs, gen, last=rng.choice(("tn", "nn")))  # neither layout's B is always the one left in L2
        for name in _order(list(live), rng):
            bufs.c.fill_(float("nan"))
            sync()
            t0 = clock()
            try:
                live[name]()
                sync()
            except Exception as e:  # noqa: BLE001
                out[name] = failed(protocol, f"{type(e).__name__}: {e}"[:300])
                del live[name]
                samples.pop(name, None)
                continue
            t1 = clock()
            if record:
                samples[name].append((t1 - t0) * 1e3)
                if cfg.output_checks and t1 >= next_check[name] and name not in checks.wrong:
                    checks.run(name, bufs, None, f"{protocol}, timed call {len(samples[name])}")
                    next_check[name] = clock() + chk_rng.expovariate(1.0 / mean_gap)

    held = pin_one_cpu() if cfg.pin_cpu else None
    try:
        for phase, dur in (("warmup", cfg.warmup_s), ("bench", cfg.benchmark_s)):
            start = clock()
            count = 0
            while live and (clock() - start < dur or (phase == "bench" and count < max(min_calls, 1))):
                if protocol == "server":
                    time.sleep(exp.expovariate(cfg.qps))
                one_iteration(record=phase == "bench")
                count += 1
    finally:
        if held is not None:
            os.sched_setaffinity(0, held[0])
    qps = cfg.qps if protocol == "server" else None
    pinned = {"pinned_cpu": held[1]} if held is not None else {}
    for name, xs in samples.items():
        if name in checks.wrong:
            out[name] = wrong_output(protocol, checks.wrong[name], seed)
            continue
        out[name] = _summary(protocol, xs, bufs.problem.flops, mean=True, qps=qps,
                             extra={"warmup_s": cfg.warmup_s, "benchmark_s": cfg.benchmark_s, "seed": seed,
                                    "output_checks": checks.done[name], **pinned})
    return out


def time_host_pairs(fns: Mapping[str, Callable[[], None]], ours: Collection[str], bufs: Buffers, cfg: TimingConfig,
                    protocol: str, min_calls: int = 0) -> dict[str, Timing]:
    """CUDA-L2's harness: one ``time_host`` loop per baseline (every callable not named in ``ours``), holding ours and
    that baseline, each with the full ``cfg.warmup_s`` and ``cfg.benchmark_s``, the loops in a shuffled order, loop i
    with seed ``cfg.seed + PAIR_SEED_STEP * i`` (fresh ones when ``cfg.seed`` is None). Each baseline's Timing comes
    from its own loop; each of ours' from the loop of the baseline with the highest mean TFLOPS (the one vendor_best
    picks), with ``paired_with`` = that baseline in its extra. One of ours that fails in a loop (raises, or a wrong
    output) is failed overall, reported with its first failure, and left out of the loops after it. Without ours or
    without baselines: the single loop of ``time_host``. Every Timing's extra says ``host_loop``."""
    mine = [k for k in fns if k in ours]
    bases = [k for k in fns if k not in ours]
    if not mine or not bases:
        return _with_loop(time_host(fns, bufs, cfg, protocol, min_calls), "all")
    order = _order(bases, random.Random(resolve_seed(cfg) + 5))
    loops: dict[str, dict[str, Timing]] = {}
    bad: dict[str, Timing] = {}  # ours -> its first failure
    for i, base in enumerate(order, start=1):
        cfg_i = replace(cfg, seed=None if cfg.seed is None else cfg.seed + PAIR_SEED_STEP * i)
        group = {**{k: fns[k] for k in mine if k not in bad}, base: fns[base]}
        loops[base] = time_host(group, bufs, cfg_i, protocol, min_calls)
        for k in group:
            if k != base and not loops[base][k].ok:
                bad[k] = loops[base][k]
    best = max(order, key=lambda b: (loops[b][b].ok, loops[b][b].tflops))  # ties: the loop that ran first
    out = {b: loops[b][b] for b in bases}
    for k in mine:
        out[k] = bad[k] if k in bad else replace(loops[best][k], extra={**loops[best][k].extra, "paired_with": best})
    return _with_loop({k: out[k] for k in fns}, "pairs")


def _with_loop(res: dict[str, Timing], loop: str) -> dict[str, Timing]:
    """``res`` with ``host_loop`` (which candidates shared the loop: ``HOST_LOOPS``) in every Timing's extra."""
    return {k: replace(t, extra={**t.extra, "host_loop": loop}) for k, t in res.items()}


def pin_one_cpu() -> tuple[set[int], int] | None:
    """Hold the calling thread on one CPU it may run on (the highest: CPU 0 takes most interrupts); (the CPUs it
    held before, the CPU now), or None where the OS offers no affinity (the loop runs unpinned, its rows say so by
    leaving pinned_cpu out)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    before = os.sched_getaffinity(0)
    cpu = max(before)
    os.sched_setaffinity(0, {cpu})
    return before, cpu


def measure(fns: Mapping[str, Callable[[], None]], bufs: Buffers, protocol: str,
            cfg: TimingConfig | None = None, layouts: Mapping[str, str] | None = None,
            ours: Collection[str] | None = None) -> dict[str, Timing]:
    """Time zero-arg callables (bound to ``bufs``) interleaved, in one protocol. ``layouts`` ({name: 'nn'|'tn'}) says
    which form of B each reads, so the graph protocol refills only that form before its calls (a path not named gets
    both forms refilled). ``ours`` names the candidates measured against the rest (the baselines): in offline/server
    with ``cfg.host_loop`` "pairs" they are timed in one loop per baseline (``time_host_pairs``, CUDA-L2's harness);
    None, or host_loop "all": one loop of every callable. Host-protocol Timings say ``host_loop`` in their extra."""
    cfg = cfg or TimingConfig()
    if protocol == "graph":
        return time_graph(fns, bufs, cfg, layouts=layouts)
    if protocol == "cold":
        return time_cold(fns, bufs, cfg)
    if protocol in HOST_PROTOCOLS:
        if ours is not None and cfg.host_loop == "pairs":
            return time_host_pairs(fns, ours, bufs, cfg, protocol)
        return _with_loop(time_host(fns, bufs, cfg, protocol), "all")
    raise TimingError(f"unknown protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")


SELECT_OUTPUT_CHECKS = 1  # algorithm selection: one checked call per alternative and round


def make_timer(bufs: Buffers, protocol: str, cfg: TimingConfig | None = None,
               layouts: Mapping[str, str] | None = None):
    """A ``Timer`` (see candidate.py) for algorithm selection inside ``protocol``: each callable gets at
    least ``min_calls`` interleaved calls in that protocol; returns {name: median time_ms} (inf on failure, and for
    an alternative whose output was wrong). Every call draws a fresh seed, so repeated calls are independent rounds.
    ``layouts`` ({name: 'nn'|'tn'}) says which form of B each callable reads, so a graph sample refills only that
    form, as the bench does for a path of one layout (without it both forms are written and the copy between them
    stays in the sample's L2)."""
    cfg = cfg or TimingConfig()

    rounds = iter(range(1, 1 << 30))

    def timer(fns: Mapping[str, Callable[[], None]], min_calls: int = 20) -> dict[str, float]:
        # algorithm selection interleaves its candidates, so they share the clock state: a short settle does
        k = next(rounds)
        cfg_r = replace(cfg, seed=None if cfg.seed is None else cfg.seed + 7919 * k,
                        settle_ms=min(cfg.settle_ms, SELECT_SETTLE_MS),
                        settle_max_ms=min(cfg.settle_max_ms, SELECT_SETTLE_MS), graph_min_timed_ms=0.0,
                        graph_min_work_ms=min(cfg.graph_min_work_ms, 1.0),
                        output_checks=min(cfg.output_checks, SELECT_OUTPUT_CHECKS))
        if protocol == "graph":
            # min_calls replays of graphs of >= 1 call each: every callable runs >= min_calls times.
            res = time_graph(fns, bufs, cfg_r, replays=min_calls, layouts=layouts)
        elif protocol == "cold":
            res = time_cold(fns, bufs, cfg_r, calls=min_calls)
        elif protocol == REFILLED:
            res = time_refilled(fns, bufs, cfg_r, calls=min_calls)
        else:
            short = replace(cfg_r, warmup_s=0.0, benchmark_s=0.0)
            res = time_host(fns, bufs, short, protocol, min_calls=min_calls)
        # selection statistic: the median per call in every protocol (a host-timed mean of 20 calls is
        # swayed by one preempted call)
        return {k: (v.extra.get("median_ms", v.time_ms) if v.ok else math.inf) for k, v in res.items()}

    timer.for_layouts = lambda lay: make_timer(bufs, protocol, cfg, lay)  # the same timer, told each path's form
    return timer


# -- floors --------------------------------------------------------------------------------------

def floor_ms(problem: GemmProblem, gpu: str, protocol: str, l2: int | None = None) -> float:
    """T_floor in ms; in ``graph`` operands that fit in L2 drop the bytes term."""
    in_l2 = protocol == "graph" and l2 is not None and problem.bytes <= l2
    return problem.floor_s(gpu, in_l2=in_l2) * 1e3


def without_grad(fn: Callable) -> Callable:
    """``fn`` run under ``torch.no_grad()``: measuring never records autograd history, and the caller's grad mode
    is left as it was (a global ``set_grad_enabled(False)`` leaked into whatever ran next in the process)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        import torch  # start-up cost: torch loads on first use, not on import

        with torch.no_grad():
            return fn(*args, **kwargs)

    return run


def below_floor(t_ms: float, floor: float) -> bool:
    return math.isfinite(t_ms) and t_ms < FLOOR_SLACK * floor
