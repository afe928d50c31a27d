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
              the timed region, shuffles the candidates, and times each with the host clock around one
              call + synchronize. ``time_ms`` = mean per-call time, ``tflops`` = mean of per-call TFLOPS.
              The two forms of B are written in a random order each iteration (``candidate.refill``): the
              form written last sits dirty in L2, so writing bt last every time (as before) handed ``tn``
              candidates a head start whenever they ran first after the refill.
- ``server``  as offline, with an exponential sleep of mean 1/QPS between iterations.

Every protocol interleaves the candidates in a fresh random order on every round, on identical
inputs. A candidate that fails (raises, cannot be captured) gets ``inf`` and a reason; it never stops
the others. Floors: ``floor_ok`` flags a time under 0.95 x T_floor (a measurement or correctness
error, never a result).
"""

from __future__ import annotations

import functools
import math
import random
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

from .candidate import Buffers, refill
from .clocks import max_sm_mhz
from .problem import GemmProblem

PROTOCOLS = ("graph", "cold", "offline", "server")
DEVICE_PROTOCOLS = ("graph", "cold")
HOST_PROTOCOLS = ("offline", "server")
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
    seed: int = 0

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


def failed(protocol: str, reason: str) -> Timing:
    return Timing(protocol, math.inf, 0.0, 0, math.inf, math.inf, None, reason)


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


def _capture(fn: Callable[[], None], n: int):
    import torch  # start-up cost: torch loads on first use, not on import

    side = torch.cuda.Stream()
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


def time_graph(fns: Mapping[str, Callable[[], None]], problem: GemmProblem, cfg: TimingConfig,
               replays: int | None = None, c=None) -> dict[str, Timing]:
    """``c``: the output every callable writes. Each captured graph must write all of it when replayed: work
    launched outside torch's current stream runs during the capture instead and leaves an empty graph,
    whose replays would time nothing."""
    import torch  # start-up cost: torch loads on first use, not on import

    rng = random.Random(cfg.seed)
    out: dict[str, Timing] = {}
    graphs: dict[str, tuple[object, int]] = {}
    for name, fn in fns.items():
        try:
            est = max(_estimate_ms(fn), 1e-4)
            n = int(min(cfg.graph_max_calls, max(1, math.ceil(cfg.graph_min_work_ms / est))))
            g = _capture(fn, n)
            for _ in range(2):  # the estimate above can be inflated by host launch gaps: size by a measured replay
                t = _replay_ms(g)
                if t >= 0.9 * cfg.graph_min_work_ms or n >= cfg.graph_max_calls:
                    break
                n = int(min(cfg.graph_max_calls, math.ceil(n * 1.1 * cfg.graph_min_work_ms / max(t, 1e-4))))
                del g
                g = _capture(fn, n)
            left = _unwritten_by_replay(g, c) if c is not None else 0
            if left:
                out[name] = failed("graph", f"a replay of the captured graph left {left} of {c.numel()} elements of C "
                                            f"unwritten: the work was not captured (launched outside torch's "
                                            f"current stream?)")
                continue
            graphs[name] = (g, n)
        except Exception as e:  # noqa: BLE001 - a candidate that cannot be captured is recorded, not fatal
            torch.cuda.synchronize()
            out[name] = failed("graph", f"not capturable in a CUDA graph: {type(e).__name__}: {e}"[:300])
    # untimed replays: first-replay upload costs stay out, and the clocks settle under sustained load
    settled = _settle([g.replay for g, _ in graphs.values()], cfg.settle_ms, cfg.settle_max_ms, _sm_clock_reader())
    samples: dict[str, list[float]] = {k: [] for k in graphs}
    nrep = max(cfg.graph_replays, replays or 0)
    # a power-capped GPU's clock moves on a scale of 100s of ms: the timed rounds span at least
    # graph_min_timed_ms of device time so the median is not one phase of that oscillation (at most 200 rounds)
    round_ms = sum(_replay_ms(g) for g, _ in graphs.values())
    nrep = max(nrep, min(200, math.ceil(cfg.graph_min_timed_ms / max(round_ms, 1e-3))))
    late = {k: [0, 0] for k in graphs}
    for _ in range(nrep):
        for name in _order(list(graphs), rng):
            g, n = graphs[name]
            samples[name].append(_event_ms(g.replay, late[name]) / n)
    for name, xs in samples.items():
        out[name] = _summary("graph", xs, problem.flops, mean=False,
                             extra={"calls_per_graph": graphs[name][1], "settle_ms": round(settled["settle_ms"]),
                                    "settle_mhz": settled["mhz"], **_late_info(late[name])})
    del graphs
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


def time_cold(fns: Mapping[str, Callable[[], None]], problem: GemmProblem, cfg: TimingConfig,
              calls: int | None = None) -> dict[str, Timing]:
    import torch  # start-up cost: torch loads on first use, not on import

    rng = random.Random(cfg.seed + 1)
    flush = _flush_buffer()
    out: dict[str, Timing] = {}
    live = {}
    for name, fn in fns.items():
        try:
            fn()
            torch.cuda.synchronize()
            live[name] = fn
        except Exception as e:  # noqa: BLE001
            out[name] = failed("cold", f"{type(e).__name__}: {e}"[:300])
    settled = _settle(list(live.values()), cfg.settle_ms, cfg.settle_max_ms, _sm_clock_reader())
    samples: dict[str, list[float]] = {k: [] for k in live}
    late = {k: [0, 0] for k in live}
    for i in range(max(cfg.cold_calls, calls or 0)):
        for name in _order(list(live), rng):
            # write 2x L2 before each attempt: evicts the operands (and leaves dirty lines, as real work does)
            samples[name].append(_event_ms(live[name], late[name], before=lambda i=i: flush.fill_(i)))
    for name, xs in samples.items():
        out[name] = _summary("cold", xs, problem.flops, mean=False,
                             extra={"settle_ms": round(settled["settle_ms"]), "settle_mhz": settled["mhz"],
                                    **_late_info(late[name])})
    return out


# -- host-time protocols (CUDA-L2's offline / server) -------------------------------------------

def time_host(fns: Mapping[str, Callable[[], None]], bufs: Buffers, cfg: TimingConfig, protocol: str,
              min_calls: int = 0) -> dict[str, Timing]:
    """CUDA-L2's offline/server loop. Inputs are refreshed in place each iteration, so the zero-arg
    callables (bound to ``bufs``) see fresh data; C is NaN-filled before every call."""
    import torch  # start-up cost: torch loads on first use, not on import

    if protocol not in HOST_PROTOCOLS:
        raise TimingError(f"time_host runs {HOST_PROTOCOLS}, not {protocol!r}")
    rng = random.Random(cfg.seed + 2)
    exp = random.Random(cfg.seed + 3)
    gen = torch.Generator(device=bufs.a.device).manual_seed(cfg.seed)
    out: dict[str, Timing] = {}
    live = dict(fns)
    samples: dict[str, list[float]] = {k: [] for k in live}
    sync = torch.cuda.synchronize if bufs.a.is_cuda else (lambda: None)  # CPU tensors: the test tier
    clock = time.perf_counter

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

    for phase, dur in (("warmup", cfg.warmup_s), ("bench", cfg.benchmark_s)):
        start = clock()
        count = 0
        while live and (clock() - start < dur or (phase == "bench" and count < max(min_calls, 1))):
            if protocol == "server":
                time.sleep(exp.expovariate(cfg.qps))
            one_iteration(record=phase == "bench")
            count += 1
    qps = cfg.qps if protocol == "server" else None
    for name, xs in samples.items():
        out[name] = _summary(protocol, xs, bufs.problem.flops, mean=True, qps=qps,
                             extra={"warmup_s": cfg.warmup_s, "benchmark_s": cfg.benchmark_s})
    return out


def measure(fns: Mapping[str, Callable[[], None]], bufs: Buffers, protocol: str,
            cfg: TimingConfig | None = None) -> dict[str, Timing]:
    """Time zero-arg callables (bound to ``bufs``) interleaved, in one protocol."""
    cfg = cfg or TimingConfig()
    if protocol == "graph":
        return time_graph(fns, bufs.problem, cfg, c=bufs.c)
    if protocol == "cold":
        return time_cold(fns, bufs.problem, cfg)
    if protocol in HOST_PROTOCOLS:
        return time_host(fns, bufs, cfg, protocol)
    raise TimingError(f"unknown protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")


def make_timer(bufs: Buffers, protocol: str, cfg: TimingConfig | None = None):
    """A ``Timer`` (see candidate.py) for algorithm selection inside ``protocol``: each callable gets at
    least ``min_calls`` interleaved calls in that protocol; returns {name: median time_ms} (inf on failure).
    Every call draws a fresh seed for the interleaving order, so repeated calls are independent rounds."""
    cfg = cfg or TimingConfig()

    rounds = iter(range(1, 1 << 30))

    def timer(fns: Mapping[str, Callable[[], None]], min_calls: int = 20) -> dict[str, float]:
        # algorithm selection interleaves its candidates, so they share the clock state: a short settle does
        cfg_r = replace(cfg, seed=cfg.seed + 7919 * next(rounds), settle_ms=min(cfg.settle_ms, SELECT_SETTLE_MS),
                        settle_max_ms=min(cfg.settle_max_ms, SELECT_SETTLE_MS), graph_min_timed_ms=0.0,
                        graph_min_work_ms=min(cfg.graph_min_work_ms, 1.0))
        if protocol == "graph":
            # min_calls replays of graphs of >= 1 call each: every callable runs >= min_calls times.
            res = time_graph(fns, bufs.problem, cfg_r, replays=min_calls, c=bufs.c)
        elif protocol == "cold":
            res = time_cold(fns, bufs.problem, cfg_r, calls=min_calls)
        else:
            short = replace(cfg_r, warmup_s=0.0, benchmark_s=0.0)
            res = time_host(fns, bufs, short, protocol, min_calls=min_calls)
        # selection statistic: the median per call in every protocol (a host-timed mean of 20 calls is
        # swayed by one preempted call)
        return {k: (v.extra.get("median_ms", v.time_ms) if v.ok else math.inf) for k, v in res.items()}

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
