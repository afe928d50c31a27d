"""The fallback race: what serves a shape the library has not measured here (no entry, an M between tuned shapes, an
entry measured on another GPU model, or one that cannot be built here).

Not ``torch.matmul``, which is not the best vendor path (on an H200 it paid ~2x the lean cuBLASLt call per call in
``server`` at small shapes): the lean cuBLAS / cuBLASLt call of ``kernels/vendor.py`` with the algorithm measured
best on this GPU, or a generated kernel the library measured at a neighbouring M of the same (N, K) where it is
faster here, per (dtype, layout, N, K) and bucket of M (powers of two: 1, 2-3, 4-7, ...).

- **Raced once per bucket and protocol**, on first sight of a shape in it outside CUDA-graph capture (or at
  ``warmup``): torch.matmul, cublasGemmEx, the first ``RACE_ALGOS`` of cuBLASLt's heuristic list and the generated
  contenders (``gen#<family>:<impl>``), at the M first seen. Each sample is a CUDA graph of back-to-back calls (about BATCH_US of work) replayed
  between CUDA events, so neither a call's launch latency nor its host cost decides (timed one call at a time, a 7 us
  algorithm read slower than a 9 us one on an H200); a plan that cannot be captured is timed as a batch of eager
  calls. A first round screens every plan, the KEEP fastest go on in interleaved rounds, the fastest median wins.
  The race stops when ``GEMMRL_VENDOR_RACE_MS`` (default 200 ms of wall time) is spent, after at least
  ``MIN_ROUNDS`` samples: the cap on what a first call costs. A generated winner is run through the correctness
  battery before it serves (dispatch.py); the fastest vendor plan is kept beside it (``Choice.fallback``).
- **Two races, one per way of calling**: what serves inside a CUDA graph is raced as above (``graph``: each call
  after its operands were rewritten with new numbers, the bench's graph protocol, ``fresh_timer``: the operands are
  in L2 as their writer left them); what serves an eager call is raced ``cold``, each call of a sample after 2x L2
  written (the bench's cold protocol; a model's eager call reads weights no earlier call left in L2) and issued
  eagerly, one launch at a time, not from a graph (a plan of several kernels pays the stream's launch gaps, as an
  eager call does; ``GraphTimer``'s ``eager``), the refills' and flushes' own time taken out. The orders differ: a
  plan that ties in warm L2 can lose in cold. An eager call
  also pays its host work before the kernel starts: the cold race charges torch.matmul and cublasGemmEx (which runs
  cuBLAS's heuristic on every call) the host time per call they take beyond the prepared cuBLASLt plan's, measured
  here where a call is short enough for it to matter (``host_extra_us``; on an H200 cublasGemmEx tied cuBLASLt in
  device time and ran 12-14 us slower per call in ``server``, 1-5 us in ``offline``). Its keys say
  ``|cold+host+eager`` (a cache raced before the calls were issued eagerly, ``|cold+host``, is raced again).
- **Cached** in the user cache (``vendor-choice/``), one file per GPU model, driver and cuBLASLt version (with the
  shapes at which a plan passed the correctness battery, so a later process does not run it again): another
  driver or cuBLAS version races again; another set of generated contenders (a library tuned since) is another key.
  A file that cannot be read is set aside with one warning (nothing raises); one that cannot be written costs a race
  per process, not a failure.
- **Configurations the heuristic does not list.** cuBLASLt runs more configurations of its kernels than its heuristic
  returns; where a shape's tiles leave SMs idle (small M x N, long K) the race also times other split-K factors of
  the heuristic's first few kernels (fp32 partial sums; ``GEMMRL_VENDOR_SPLITS=0`` turns this off). The baselines'
  autotune times the heuristic's list only, so these are plans no vendor path runs by itself.
- Another M of a raced bucket takes the bucket's choice: a cuBLASLt configuration is pinned by its description
  without its workspace and wave count (which depend on M), taken from that M's heuristic list or built from the
  description where it runs there, else the heuristic's first. From ``CONFIRM_M`` rows up, where a tile's wave count
  changes inside a bucket, another M first races the bucket's plan against the three defaults at its own M (a few
  ms at such sizes) and keeps the winner for that M (``confirms``).
- ``GEMMRL_VENDOR_FALLBACK``: ``race`` (default), ``heuristic`` (no race: the heuristic's first plan through the lean
  call), ``off`` (torch.matmul, as before this fallback existed).

Inside capture nothing is raced or built (dispatch.py serves a cached vendor choice there, else torch.matmul).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import re
import statistics
import time
import warnings
import weakref
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from ..clocks import max_sm_mhz
from ..paths import cache_dir, write_json_atomic
from ..problem import GemmProblem
from ..timing import _busy, _fill, _flush_buffer, _sm_clock_reader, capture_stream

MODE_ENV = "GEMMRL_VENDOR_FALLBACK"
MODES = ("race", "heuristic", "off")
RACE_MS_ENV = "GEMMRL_VENDOR_RACE_MS"
GRAPH_RACE_ENV = "GEMMRL_GRAPH_RACE"
SPLITS_ENV = "GEMMRL_VENDOR_SPLITS"
GRAPH_RACES = {"warm": "graph", "cold": "cold"}  # setting -> the protocol a call inside a CUDA graph is raced in
RACE_MS = 200.0
RACE_ALGOS = 32    # cuBLASLt heuristic results raced (its first is one of them)
SCREEN_ROUNDS = 2  # screening samples per plan (one in each order), the faster counts
KEEP = 6           # plans kept after screening
SETTLE_MS = (20.0, 200.0)  # replays before the first timed sample, until the SM clock is near its ceiling
DEFAULTS = ("torch", "cublas", "cublaslt#0")  # what a plan must beat by TIE_BAND to be chosen over them
TIE_BAND = 0.01
NEXT_PLANS = 3     # a raced plan that does not compute right here: its race's next fastest, in turn, then DEFAULTS
MIN_ROUNDS = 3     # timed samples per kept plan the race takes whatever its budget
MAX_ROUNDS = 15
BATCH_US = 200.0   # a timed sample is a graph of back-to-back calls this long (its launch amortised)
HOST_CHARGED = ("torch", "cublas")  # eager race: charged their host time per call beyond the cuBLASLt plan's
HOST_CALLS = 15    # calls per plan, interleaved, each after a synchronize, whose host time is measured
HOST_SKIP_MS = 1.0  # a call of cuBLASLt's plan longer than this (synchronized): host time is under 1%, not measured
COLD_BATCH_US = 1000.0  # cold: longer samples (each call also pays the L2 flush, the same for every plan)
PROTOCOLS = ("graph", "cold")  # what serves graph replays, what serves eager calls
MIN_BATCH, MAX_BATCH = 8, 128
LONG_CALL_US = 50.0  # a call at least this long is timed in samples of fewer than MIN_BATCH calls
CONFIRM_M = 1024   # from here up another M of a raced bucket confirms the bucket's vendor plan at its own M
GEN = "gen#"       # the race's name prefix of a generated contender: gen#<family>:<impl>
COLD_KEY = "|cold+host+eager"  # the eager race's key suffix: raced cold, host time charged, calls issued eagerly


class VendorChoiceError(ValueError):
    """A bad setting of the vendor fallback (the caller's error, with what to do)."""


def mode() -> str:
    """``GEMMRL_VENDOR_FALLBACK``, checked."""
    v = os.environ.get(MODE_ENV, "race").strip().lower() or "race"
    if v not in MODES:
        raise VendorChoiceError(f"{MODE_ENV}={v!r}: use 'race' (measure the vendor paths once per bucket of M), "
                                "'heuristic' (cuBLASLt's first plan, no race) or 'off' (torch.matmul)")
    return v


def graph_race() -> str:
    """``GEMMRL_GRAPH_RACE``, checked: the protocol what serves a call inside a CUDA graph is raced in. ``warm``
    (default, the ``graph`` protocol: back-to-back calls of one GEMM, its operands in L2) or ``cold`` (operands from
    device memory, as a layer's weight is inside a whole model's graph, where the other layers evict it; graph
    replays then share the eager calls' race)."""
    v = os.environ.get(GRAPH_RACE_ENV, "warm").strip().lower() or "warm"
    if v not in GRAPH_RACES:
        raise VendorChoiceError(f"{GRAPH_RACE_ENV}={v!r}: use 'warm' (race graph replays with operands in L2) or "
                                "'cold' (with operands from device memory, as in a whole model's graph)")
    return GRAPH_RACES[v]


def race_budget_s() -> float:
    """``GEMMRL_VENDOR_RACE_MS`` in seconds, checked."""
    raw = os.environ.get(RACE_MS_ENV, "").strip()
    try:
        ms = float(raw) if raw else RACE_MS
    except ValueError:
        ms = -1.0
    if not ms > 0 or ms != ms:
        raise VendorChoiceError(f"{RACE_MS_ENV}={raw!r}: give the race's cap in milliseconds, a positive number "
                                f"(default {RACE_MS:g})")
    return ms / 1e3


def m_bucket(M: int) -> tuple[int, int]:
    """The bucket of M a choice is shared by: [2^i, 2^(i+1) - 1] for the largest 2^i <= M."""
    if M < 1:
        raise ValueError(f"M must be >= 1, got {M}")
    lo = 1 << (M.bit_length() - 1)
    return lo, 2 * lo - 1


@dataclass(frozen=True)
class Identity:
    """What a choice is valid for: the GPU model and the driver and cuBLASLt versions."""

    gpu: str
    driver: int
    cublaslt: int

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Choice:
    """What serves a bucket: ``kind`` torch | cublas | cublaslt (a vendor plan; ``algo`` the cuBLASLt algorithm's
    description, '' = the heuristic's first) or gen (a generated kernel; ``algo`` '<family>:<impl>', ``fallback``
    the fastest vendor plan's race name, what serves if the kernel fails its battery here); how it was chosen
    (raced at ``measured_m``, with every plan's median time, or not)."""

    kind: str
    algo: str = ""
    how: str = "heuristic"
    measured_m: int = 0
    times_us: tuple = ()
    fallback: str = ""
    host_us: tuple = ()  # cold race: (name, us) each charged plan's host time per call beyond the cuBLASLt plan's

    def vendor(self) -> "Choice":
        """The vendor plan of this choice: itself, or for a generated winner the fastest vendor plan of its race."""
        if self.kind != "gen":
            return self
        kind, algo = plan_of(self.fallback or "cublaslt")
        return replace(self, kind=kind, algo=algo, fallback="")

    def describe(self) -> str:
        if self.kind == "gen":
            return f"{self.algo} [raced at M={self.measured_m}]"
        what = {"torch": "torch.matmul", "cublas": "cublasGemmEx", "cublaslt": "cuBLASLt"}[self.kind]
        if self.kind == "cublaslt":
            what += f" {self.algo}" if self.algo else " (the heuristic's first)"
        if self.how == "raced":
            return f"{what} [raced at M={self.measured_m}]"
        return f"{what} [{self.how}]"


def in_turn(choice: Choice, most: int = NEXT_PLANS) -> list[Choice]:
    """What serves where ``choice`` (a vendor plan) does not compute right here, in turn: ``choice``, the ``most``
    fastest other vendor plans of its race, then the defaults not among them (torch.matmul, cublasGemmEx, the
    heuristic's first cuBLASLt plan), each with the race's record (ranked as the race ranked them: its medians plus
    the host time it charged)."""
    score = charged(dict(choice.times_us), dict(choice.host_us))
    names = [n for n in sorted(score, key=score.get) if not n.startswith(GEN)]
    out, seen = [choice], {(choice.kind, choice.algo)}
    for name in [*names[:most + 1], *DEFAULTS]:
        kind, algo = plan_of(name)  # the default 'cublaslt#0' is the heuristic's first at this M (algo '')
        if (kind, algo) not in seen and (len(out) <= most or name in DEFAULTS):
            seen.add((kind, algo))
            out.append(replace(choice, kind=kind, algo=algo, fallback=""))
    return out


def checks_battery(choice: Choice, built: bool) -> bool:
    """Whether a vendor plan passes the correctness battery before it serves (a cuBLASLt result is otherwise only
    compared with an fp32 product once): a configuration the heuristic does not list at this shape, or one that
    splits K (on an H200 a split-K configuration raced best at 654_65_957 failed the battery: 1.43x the error of the
    correctly rounded product)."""
    m = re.search(r"\bsplitk=(\d+)", choice.algo)
    return choice.kind == "cublaslt" and (built or (m is not None and int(m.group(1)) > 1))


def plan_of(name: str) -> tuple[str, str]:
    """(kind, algo) of a race name: 'torch', 'cublas', 'cublaslt#<i> <description>', 'gen#<family>:<impl>'."""
    if name.startswith(GEN):
        return "gen", name[len(GEN):]
    kind, _, rest = name.partition("#")
    return kind, (rest.split(" ", 1)[1] if kind == "cublaslt" and " " in rest else "")


def _check_protocol(protocol: str) -> None:
    if protocol not in PROTOCOLS:
        raise VendorChoiceError(f"a vendor choice is raced in {' or '.join(PROTOCOLS)}, not {protocol!r}")


def choice_key(problem: GemmProblem, generated: tuple[str, ...] = (), protocol: str = "graph",
               exact: bool = False) -> str:
    """The cache key: dtype, layout, N, K, the bucket of M, (where generated kernels race) a digest of their names,
    so a library with other contenders races again, and the protocol raced in (``|cold+host+eager``: the eager race,
    host time charged, calls issued eagerly; graph's keys name none).
    ``exact``: the key of a choice confirmed at this M alone (``|at=<M>``, see ``confirms``)."""
    _check_protocol(protocol)
    lo, hi = m_bucket(problem.M)
    key = f"{problem.dtype}|{problem.layout}|N={problem.N}|K={problem.K}|M={lo}-{hi}"
    if generated:
        key += "|gen=" + hashlib.sha256("\n".join(sorted(generated)).encode()).hexdigest()[:12]
    return key + (COLD_KEY if protocol == "cold" else "") + (f"|at={problem.M}" if exact else "")


class ChoiceCache:
    """The raced choices of one identity, in one JSON file of the user cache."""

    def __init__(self, ident: Identity, root: Path | None = None):
        self.ident = ident
        self.path = (root or cache_dir("vendor-choice")) / f"{ident.digest()}.json"
        self.choices: dict[str, Choice] = {}
        self.passed: set[str] = set()  # verdict keys (verdict_key) of plans that passed the battery here
        self._read()

    def _read(self) -> None:
        try:
            text = self.path.read_text()
        except OSError:
            return
        try:
            raw = json.loads(text)
            if raw.get("identity") != asdict(self.ident):
                raise ValueError("written for another GPU, driver or cuBLASLt")
            self.choices = {k: Choice(**{**v, "times_us": tuple(tuple(t) for t in v.get("times_us", ())),
                                         "host_us": tuple(tuple(t) for t in v.get("host_us", ()))})
                            for k, v in raw["choices"].items()}
            self.passed = {str(k) for k in raw.get("passed", [])}
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            aside = self.path.with_name(self.path.name + f".unreadable-{int(time.time())}")
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            warnings.warn(f"gemmrl: the vendor-choice cache {self.path} could not be read ({type(e).__name__}: "
                          f"{e}); set aside as {aside.name}, the vendor paths are raced again", RuntimeWarning,
                          stacklevel=3)
            self.choices, self.passed = {}, set()

    def get(self, problem: GemmProblem, generated: tuple[str, ...] = (), protocol: str = "graph") -> Choice | None:
        """The choice confirmed at this M, else its bucket's."""
        return (self.choices.get(choice_key(problem, generated, protocol, exact=True))
                or self.choices.get(choice_key(problem, generated, protocol)))

    def put(self, problem: GemmProblem, choice: Choice, generated: tuple[str, ...] = (), protocol: str = "graph",
            exact: bool = False) -> bool:
        """Record ``choice`` (for the bucket, or ``exact``: for this M alone) and write the file (merged with what
        another process wrote meanwhile); False where it cannot be written (the choice still serves this process)."""
        self.choices[choice_key(problem, generated, protocol, exact)] = choice
        return self._write()

    def has_passed(self, problem: GemmProblem, choice: Choice) -> bool:
        """Whether the vendor plan ``choice`` passed the correctness battery at exactly this shape on this identity."""
        return verdict_key(problem, choice) in self.passed

    def mark_passed(self, problem: GemmProblem, choice: Choice) -> bool:
        """Record that ``choice`` passed the battery at this shape (the next process skips it); False where the
        file cannot be written."""
        self.passed.add(verdict_key(problem, choice))
        return self._write()

    def _write(self) -> bool:
        try:
            on_disk = ChoiceCache.__new__(ChoiceCache)
            on_disk.ident, on_disk.path, on_disk.choices, on_disk.passed = self.ident, self.path, {}, set()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                on_disk._read()
        except OSError:
            return False
        merged = {**on_disk.choices, **self.choices}
        passed = on_disk.passed | self.passed
        if not write_json_atomic(self.path, {"identity": asdict(self.ident),
                                             "choices": {k: asdict(v) for k, v in sorted(merged.items())},
                                             "passed": sorted(passed)}):
            return False
        self.choices, self.passed = merged, passed
        return True


def verdict_key(problem: GemmProblem, choice: Choice) -> str:
    """The key of a battery verdict: the exact shape (dtype, layout, M, N, K) and the plan (kind and description),
    on the cache's identity (GPU model, driver, cuBLASLt): the same plan computes the same way there."""
    return f"{problem.dtype}|{problem.layout}|{problem.M}_{problem.N}_{problem.K}|{choice.kind}|{choice.algo}"


def race(plans: Mapping[str, Callable[[], None]], timer: Callable[[Callable[[], None]], float], budget_s: float,
         clock: Callable[[], float] = time.perf_counter, settle: Callable[[Callable[[], None]], None] | None = None,
         extra_us: Mapping[str, float] | None = None) -> tuple[str, dict[str, float]]:
    """The fastest of ``plans`` (name -> a call on prepared buffers) by median ``timer`` time (ms) over interleaved
    rounds, at least MIN_ROUNDS, more while ``budget_s`` of wall time lasts (at most MAX_ROUNDS). A plan that
    raises is out. ``settle(fn)`` runs before the first timed sample (the clocks leave idle on the first plan's
    calls: screened at idle clocks, the plans timed first read slow and were dropped). The first SCREEN_ROUNDS rounds
    (one in each order) screen: the KEEP fastest by their faster sample race on. A plan other than the defaults
    (torch.matmul, cublasGemmEx, cuBLASLt's first heuristic result) wins only if it beats the fastest default by
    TIE_BAND (a near-tie is noise). ``extra_us`` ({name: us}) is added to a plan's median before the winner is picked
    (the eager race's host charge, ``host_extra_us``). A timer with a ``many`` method times each round's plans in one
    go (``GraphTimer``). Returns (winner, {name: median us}) (the medians without ``extra_us``)."""
    t0 = clock()
    samples: dict[str, list[float]] = {}
    live = dict(plans)
    for name, fn in list(live.items()):  # one untimed call each: builds, first-launch costs
        try:
            fn()
        except Exception:  # noqa: BLE001 - a plan that cannot run this shape is not a candidate
            del live[name]
    if not live:
        raise RuntimeError("no vendor plan ran this shape")
    if settle is not None:
        settle(next(iter(live.values())))
    many = getattr(timer, "many", None)  # the GPU timers queue a round's samples back to back
    for r in range(MAX_ROUNDS):
        if r >= SCREEN_ROUNDS + MIN_ROUNDS - 1 and clock() - t0 > budget_s:
            break
        order = list(live) if r % 2 == 0 else list(reversed(live))
        got = many([live[n] for n in order]) if many is not None else [timer(live[n]) for n in order]
        for name, t in zip(order, got):
            samples.setdefault(name, []).append(t)
        if r == SCREEN_ROUNDS - 1 and len(live) > KEEP:  # screening: the rest race on
            kept = sorted(live, key=lambda n: min(samples[n]))[:KEEP]
            live = {n: live[n] for n in live if n in kept}
            samples = {n: samples[n] for n in live}
    med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    score = charged(med, extra_us or {})
    best = min(score, key=score.get)
    defaults = [k for k in score if k.split(" ", 1)[0] in DEFAULTS]
    if defaults and best not in defaults:
        d = min(defaults, key=score.get)
        if score[best] * (1 + TIE_BAND) > score[d]:
            best = d
    return best, med


def charged(times_us: Mapping[str, float], extra_us: Mapping[str, float]) -> dict[str, float]:
    """What a race ranks plans by: each median plus the host time charged to it (``host_extra_us``; none in graph)."""
    return {k: v + extra_us.get(k, 0.0) for k, v in times_us.items()}


def host_extra_us(plans: Mapping[str, Callable[[], None]], sync: Callable[[], None] | None = None,
                  clock: Callable[[], float] = time.perf_counter, calls: int = HOST_CALLS) -> dict[str, float]:
    """What an eager call of each HOST_CHARGED plan (torch.matmul, cublasGemmEx) costs on the host beyond the prepared
    cuBLASLt plan's call (the heuristic's first, ``cublaslt#0``), in us, >= 0: the median over ``calls`` interleaved
    calls of the time the call takes to return, each after ``sync()`` (an idle GPU: the call returns once its work
    is queued). The cuBLASLt plans share one call path and generated kernels are launched directly, so only these two
    are charged. {} where cuBLASLt's first plan or every charged plan is missing, a call raises, or one call of
    cuBLASLt's plan, synchronized, takes over HOST_SKIP_MS (a few us of host time are noise there, and 45 such calls
    would lengthen the first call)."""
    ref = next((k for k in plans if k.split(" ", 1)[0] == "cublaslt#0"), None)
    names = [k for k in plans if k.split(" ", 1)[0] in HOST_CHARGED]
    if ref is None or not names:
        return {}
    if sync is None:
        import torch  # start-up cost: loaded on first use

        sync = torch.cuda.synchronize
    took: dict[str, list[float]] = {k: [] for k in (ref, *names)}
    try:
        sync()
        t0 = clock()
        plans[ref]()
        sync()
        if clock() - t0 > HOST_SKIP_MS * 1e-3:
            return {}
        for _ in range(calls):
            for k in took:
                sync()
                t0 = clock()
                plans[k]()
                took[k].append(clock() - t0)
        sync()
    except Exception:  # noqa: BLE001 - a plan that raises here is out of the race anyway: nothing to charge
        return {}
    base = statistics.median(took[ref])
    return {k: max(0.0, statistics.median(took[k]) - base) * 1e6 for k in names}


def settle(fn: Callable[[], None], ms: tuple[float, float] = SETTLE_MS) -> None:
    """Replays of ``fn``'s timing graph for at least ``ms[0]`` of wall time, then on until the SM clock (NVML) is
    within 10% of its ceiling or ``ms[1]`` have passed: the first plan timed at idle clocks read slow (on an H200 a
    4.2 us plan read 7 us, and the ranking of small plans changed with the clock)."""
    import torch  # start-up cost: torch loads on first use, not on import

    g, _n = _graph_of(fn)
    read = _sm_clock_reader()
    ceiling = max_sm_mhz(torch.cuda.current_device())
    t = time.perf_counter()
    while True:
        for _ in range(4):
            if g is not None:
                g.replay()
            else:
                fn()
        torch.cuda.current_stream().synchronize()
        el = (time.perf_counter() - t) * 1e3
        if el >= ms[1] or (el >= ms[0] and read is not None and read() >= 0.9 * ceiling):
            return


_GRAPHS: "weakref.WeakKeyDictionary[Callable, Any]" = weakref.WeakKeyDictionary()  # plan -> (graph or None, calls)


class GraphTimer:
    """Device time per call of a plan (ms): a CUDA graph of back-to-back calls (about ``batch_us`` of work, as many
    calls as ``batch_calls`` says; captured on first use and kept while the plan lives) replayed between CUDA events. A plan
    that cannot be captured is timed as a batch of eager calls (its launch latency amortised, its host cost not hidden
    where a call is shorter than its launch). ``flushed``: each call after 2x L2 written (the bench's cold protocol),
    the flushes' own time taken out. ``eager``: the sample's calls are issued one by one on the stream instead of
    replayed from a graph, as an eager caller issues them: a plan of several kernels (a split-K GEMM and its
    reduction) then pays the gap between stream launches that a graph hides. The cold race times this way: on an
    H200 the graph form ranked cuBLASLt's 32x32 tile with an 8-way split 13% ahead of the same tile unsplit at
    39_21_329, where the bench's cold protocol (each call issued eagerly between events) found them equal. With a
    flush of 2x L2 before each call the host issues a pair well before the GPU has run the previous one, so the
    host's own time does not enter.
    ``timer.many(plans)`` times several plans in one go: their samples are queued back to back on the stream and
    read after one synchronisation, so the GPU does not idle between samples. Timed one sample at a time, with the
    host's round trip between them, the race's samples on an H200 read 4-15% slower than the bench's and ranked two
    near-equal cuBLASLt plans the other way round."""

    def __init__(self, batch_us: float, flushed: bool = False, prelude: Callable[[], None] | None = None,
                 eager: bool = False):
        self.batch_us, self.flushed, self.prelude, self.eager = batch_us, flushed, prelude, eager
        self._forms: "weakref.WeakKeyDictionary[Callable, Callable]" = weakref.WeakKeyDictionary()
        self._prelude_ms: float | None = None

    def __call__(self, fn: Callable[[], None]) -> float:
        return self.many([fn])[0]

    def many(self, fns: list[Callable[[], None]]) -> list[float]:
        forms = [self._form(fn) for fn in fns]
        if self.eager:
            graphs = [(None, _eager_calls(f, self.batch_us)) for f in forms]
        else:
            graphs = [_graph_of(f, self.batch_us) for f in forms]  # captured first: nothing syncs inside the round
        works = [g.replay if g is not None else functools.partial(_calls, f, n) for f, (g, n) in zip(forms, graphs)]
        off = _flush_ms(self.eager) if self.flushed else self._prelude_off()
        got = _elapsed_many(works, lead_us=EAGER_LEAD_US if self.eager else 0.0)
        return [max(ms / n - off, 0.0) for ms, (_, n) in zip(got, graphs)]

    def _form(self, fn: Callable[[], None]) -> Callable[[], None]:
        if self.prelude is not None:
            if fn not in self._forms:
                self._forms[fn] = _after(self.prelude, fn)
            return self._forms[fn]
        if not self.flushed:
            return fn
        if fn not in _COLD:
            _COLD[fn] = _flushed_form(fn)
        return _COLD[fn]

    def _prelude_off(self) -> float:
        """Device time of one ``prelude`` (ms), taken out of every sample: the faster of two samples of a graph of
        MIN_BATCH of them, measured once per timer."""
        if self.prelude is None:
            return 0.0
        if self._prelude_ms is None:
            got = _capture(self.prelude, MIN_BATCH)
            g, n = got if got is not None else (None, MIN_BATCH)
            work = g.replay if g is not None else functools.partial(_calls, self.prelude, n)
            self._prelude_ms = min(_elapsed_many([work, work])) / n
        return self._prelude_ms


def _calls(fn: Callable[[], None], n: int) -> None:
    for _ in range(n):
        fn()


def _flushed_form(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` after a 2x-L2 write."""
    return _after(_flush_l2, fn)


def _flush_l2() -> None:
    _flush_buffer().fill_(1)


def _after(prelude: Callable[[], None], fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` after ``prelude``. It holds ``fn`` weakly: the caches of these forms (and the timing graphs kept with
    them) must not keep a race's plans, and the operands they close over, alive after the race (a strong reference
    kept every cold race's buffers: +12.5 GiB over a Llama-3-8B's generate on an H200)."""
    ref = weakref.ref(fn)

    def both() -> None:
        prelude()
        plan = ref()
        if plan is not None:
            plan()
    return both


def fresh_timer(bufs: Any, layout: str, seed: int = 1) -> GraphTimer:
    """The graph race's timer on the race's buffers: each call after A and the form of B that ``layout`` reads are
    rewritten with new numbers (the bench's graph protocol, whose every call sees fresh inputs: ``timing._fill``),
    the refill's own time taken out. Timed on operands it only re-read, the race ranked plans otherwise than the
    bench: on an H200 it served 39_6144_4096 a plan 8% slower in the bench's graph protocol, and 114_4096_4096 the
    nn order where every nn path ran 4% slower there."""
    from ..fill import Refill  # Triton: loaded on first use

    return GraphTimer(BATCH_US, prelude=_fill(bufs, layout, Refill(bufs.a.device, seed)))


def _flush_ms(eager: bool = False) -> float:
    """Device time of one 2x-L2 write (the part of a cold sample every plan pays), ms: the faster of two samples of
    MIN_BATCH flushes (a graph of them; ``eager``: issued one by one, as the eager timer issues them), measured once
    per process, device and form."""
    import torch  # start-up cost: torch loads on first use, not on import

    d = (torch.cuda.current_device(), eager)
    if d not in _FLUSH_MS:
        flush = functools.partial(_flush_buffer().fill_, 1)
        got = None if eager else _capture(flush, MIN_BATCH)
        g, n = got if got is not None else (None, MIN_BATCH)
        work = g.replay if g is not None else functools.partial(_calls, flush, n)
        _FLUSH_MS[d] = min(_elapsed_many([work, work], lead_us=EAGER_LEAD_US if eager else 0.0)) / n
    return _FLUSH_MS[d]


def _eager_calls(fn: Callable[[], None], batch_us: float) -> int:
    """Calls in an eager timer's sample of ``fn``: ``batch_calls`` of one call's eager device time, measured once per
    plan form (kept while it lives)."""
    if fn not in _EAGER_N:
        _EAGER_N[fn] = batch_calls(_elapsed_many([fn], lead_us=EAGER_LEAD_US)[0] * 1e3, batch_us)
    return _EAGER_N[fn]


_COLD: "weakref.WeakKeyDictionary[Callable, Callable]" = weakref.WeakKeyDictionary()  # plan -> its flushed form
_EAGER_N: "weakref.WeakKeyDictionary[Callable, int]" = weakref.WeakKeyDictionary()  # form -> calls per eager sample
_FLUSH_MS: dict[tuple[int, bool], float] = {}
EAGER_LEAD_US = 60.0  # device sleep queued ahead of an eager sample: the host issues its first calls meanwhile
event_timer = GraphTimer(BATCH_US)  # graph replays: operands warm in L2
cold_timer = GraphTimer(COLD_BATCH_US, flushed=True, eager=True)  # eager calls: operands read from HBM, issued eagerly


def _elapsed_many(works: list[Callable[[], Any]], lead_us: float = 0.0) -> list[float]:
    """Device time of each of ``works``, queued back to back on the current stream between CUDA events (ms);
    ``lead_us`` of device sleep queued first (the first work's launch then does not start on an idle GPU)."""
    import torch  # start-up cost: torch loads on first use, not on import

    ev = [torch.cuda.Event(enable_timing=True) for _ in range(len(works) + 1)]
    if lead_us > 0:
        _busy(lead_us)
    ev[0].record()
    for work, e in zip(works, ev[1:]):
        work()
        e.record()
    ev[-1].synchronize()
    return [a.elapsed_time(b) for a, b in zip(ev, ev[1:])]


def _graph_of(fn: Callable[[], None], batch_us: float = BATCH_US) -> tuple[Any, int]:
    """``fn``'s timing graph and its number of calls: one call first, timed, then recaptured with enough calls for
    ``batch_us`` of work (batch_calls); (None, MIN_BATCH) where ``fn`` cannot be captured (timed as eager calls)."""
    if fn in _GRAPHS:
        return _GRAPHS[fn]
    got = _capture(fn, 1)
    if got is None:
        _GRAPHS[fn] = (None, MIN_BATCH)
        return _GRAPHS[fn]
    want = batch_calls(_elapsed_many([got[0].replay])[0] * 1e3, batch_us)
    if want != 1:
        got = _capture(fn, want) or got
    _GRAPHS[fn] = got
    return got


def batch_calls(per_call_us: float, batch_us: float = BATCH_US) -> int:
    """Calls in a timing sample of a plan that takes ``per_call_us``: enough for ``batch_us`` of work, at least
    MIN_BATCH where a call is shorter than LONG_CALL_US (the graph's own launch amortised), at most MAX_BATCH. A long
    call needs no company: 8 calls of an 8 ms GEMM made each sample 64 ms and a first call's race several seconds."""
    want = math.ceil(batch_us / max(per_call_us, 1e-3))
    return max(1 if per_call_us >= LONG_CALL_US else MIN_BATCH, min(MAX_BATCH, want))


def _capture(fn: Callable[[], None], n: int) -> tuple[Any, int] | None:
    """A CUDA graph of ``n`` calls of ``fn`` (replayed once, untimed), or None where ``fn`` cannot be captured."""
    import torch  # start-up cost: torch loads on first use, not on import

    try:
        g = torch.cuda.CUDAGraph()
        here = torch.cuda.current_stream()
        side = capture_stream()
        side.wait_stream(here)
        with torch.cuda.stream(side):  # capture_begin/end, not torch.cuda.graph: no gc.collect and empty_cache a plan
            fn()  # warm on the capture stream first: lazy set-up (handles, workspaces) stays out of the capture
            g.capture_begin(capture_error_mode="thread_local")
            try:
                for _ in range(n):
                    fn()
            finally:
                g.capture_end()
        here.wait_stream(side)
        g.replay()
        here.synchronize()
        return g, n
    except Exception:  # noqa: BLE001 - a plan that cannot be captured is timed eagerly
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        return None


def gpu_timer(protocol: str) -> Callable[[Callable[[], None]], float]:
    """The timer a race in ``protocol`` takes on the GPU."""
    return event_timer if protocol == "graph" else cold_timer


def choose(problem: GemmProblem, cache: ChoiceCache | None, plans: Callable[[], Mapping[str, Callable[[], None]]],
           timer: Callable | None = None, budget_s: float | None = None, generated: tuple[str, ...] = (),
           protocol: str = "graph", vendor_plans: Callable[[str], Mapping[str, Callable[[], None]]] | None = None,
           host: Callable[[Mapping[str, Callable[[], None]]], dict[str, float]] | None = None,
           stored_as: Callable[[], tuple[str, ...]] | None = None) -> Choice:
    """The bucket's cached choice in ``protocol`` (graph: what serves graph replays; cold: eager calls), else (mode
    'race') a race of ``plans()`` timed in it and recorded in ``cache``, else the heuristic's first cuBLASLt plan.
    Plan names: 'torch', 'cublas', 'cublaslt#<i> <description>' and, for the ``generated`` contenders
    ('<family>:<impl>', part of the cache key), 'gen#<family>:<impl>'. Another M of a bucket raced elsewhere
    confirms the bucket's vendor plan at its own M where ``confirms`` says so, among ``vendor_plans(description)``
    (the vendor plans with that cuBLASLt configuration built at this M where its list lacks it; default ``plans()``:
    the vendor plans alone spare building the generated contenders). The cold race charges each plan ``host(plans)``
    us (default on the GPU: ``host_extra_us``; a stand-in timer charges nothing). A race's choice is recorded under
    ``stored_as()``, asked once ``plans()`` has run (default ``generated``): the contenders that raced, where some
    were left out (a first call's build budget spent), so that a lookup naming them all races again."""
    _check_protocol(protocol)
    m = mode()
    if m == "off":
        return Choice("torch", how="off")
    got = cache.get(problem, generated, protocol) if cache is not None else None
    if got is not None:
        if m == "race" and confirms(got, problem):
            t = timer or gpu_timer(protocol)
            return _confirm(problem, cache, vendor_plans or (lambda _desc: plans()), got, t, budget_s, generated,
                            protocol, _host_charge(protocol, t, host))
        return got
    if m == "heuristic":
        return Choice("cublaslt", how="heuristic")
    t = timer or gpu_timer(protocol)
    ps = plans()
    extra = _host_charge(protocol, t, host)(ps)
    winner, med = race(ps, t, race_budget_s() if budget_s is None else budget_s,
                       settle=settle if isinstance(t, GraphTimer) else None, extra_us=extra)  # stand-ins need none
    kind, algo = plan_of(winner)
    vendors = {k: v for k, v in charged(med, extra).items() if not k.startswith(GEN)}
    fallback = min(vendors, key=vendors.get) if kind == "gen" and vendors else ""
    c = Choice(kind, algo, "raced", problem.M, tuple(sorted((k, round(v, 3)) for k, v in med.items())), fallback,
               tuple(sorted((k, round(v, 3)) for k, v in extra.items())))
    if cache is not None:
        cache.put(problem, c, generated if stored_as is None else stored_as(), protocol)
    return c


def _host_charge(protocol: str, timer: Callable, host: Callable | None) -> Callable[[Mapping], dict[str, float]]:
    """What the race in ``protocol`` charges each plan on the host: nothing in graph (a replay has no host work);
    in cold ``host``, else ``host_extra_us`` where the timer is the GPU's, else nothing (a stand-in timer)."""
    if protocol != "cold":
        return lambda _plans: {}
    if host is not None:
        return host
    return host_extra_us if isinstance(timer, GraphTimer) else (lambda _plans: {})


def confirms(choice: Choice, problem: GemmProblem) -> bool:
    """Whether another M of a raced bucket confirms the bucket's vendor plan at its own M before it serves: from
    CONFIRM_M rows up, where a tile's wave count changes inside a bucket (on an H200, 5401_4096_4096 took the cold
    choice raced at M = 6137, a 256x152 tile at 273 us, where the heuristic's first ran 249 us at 5401). A generated
    winner is not confirmed (its battery ran at the M it serves)."""
    return (choice.how == "raced" and choice.kind != "gen" and choice.measured_m != problem.M
            and problem.M >= CONFIRM_M)


def _confirm(problem: GemmProblem, cache: ChoiceCache | None,
             plans: Callable[[str], Mapping[str, Callable[[], None]]], got: Choice, timer: Callable,
             budget_s: float | None, generated: tuple[str, ...], protocol: str,
             host: Callable[[Mapping], dict[str, float]] = lambda _plans: {}) -> Choice:
    """The bucket's vendor plan ``got`` raced at this M against the three defaults alone (a few ms at such sizes),
    recorded for this M; ``got`` itself where its configuration cannot be built here (``plans(got.algo)`` builds it
    where this M's list lacks it: a split-K factor offered at the bucket's M and not at this one, say)."""
    from ..kernels.vendor import config_key  # the vendor module: loaded on first use

    everything = plans(got.algo if got.kind == "cublaslt" else "")
    keep = {k: f for k, f in everything.items() if k.split(" ", 1)[0] in DEFAULTS}
    if got.kind == "cublaslt" and got.algo:
        mine = [k for k in everything if k.startswith("cublaslt#") and " " in k
                and config_key(k.split(" ", 1)[1]) == config_key(got.algo)]
        if not mine:
            return got
        keep[mine[0]] = everything[mine[0]]
    extra = host(keep)
    winner, med = race(keep, timer, race_budget_s() if budget_s is None else budget_s,
                       settle=settle if isinstance(timer, GraphTimer) else None, extra_us=extra)
    kind, algo = plan_of(winner)
    c = Choice(kind, algo, "raced", problem.M, tuple(sorted((k, round(v, 3)) for k, v in med.items())),
               host_us=tuple(sorted((k, round(v, 3)) for k, v in extra.items())))
    if cache is not None:
        cache.put(problem, c, generated, protocol, exact=True)
    return c


def plans_for(problem: GemmProblem, bufs: Any, include: str = "") -> dict[str, Callable[[], None]]:
    """The vendor plans raced at ``problem`` on the prepared buffers ``bufs`` (CUDA): torch.matmul, cublasGemmEx,
    the first RACE_ALGOS cuBLASLt heuristic results and split-K configurations of their kernels that the heuristic
    does not list (``CtypesCandidate.split_variants``: where the tiles leave the GPU part idle), each a call in the
    problem's layout; and the cuBLASLt configuration described by ``include`` (another M's choice), built here
    where it runs and is not among them."""
    from ..kernels import vendor  # the vendor extension: built or loaded on first use

    a, b, bt, c = bufs.args()
    tn = problem.layout == "tn"
    bv = bt.t() if tn else b
    out: dict[str, Callable[[], Any]] = {"torch": lambda: vendor_torch(a, bv, c)}
    cb = vendor.CtypesCandidate("vendor:cublas", problem.layout, "fp32", "cublas")
    cb.prepare(problem, bufs, "graph", None)
    out["cublas"] = lambda: cb(a, b, bt, c)
    lt = vendor.CtypesCandidate("vendor:cublaslt", problem.layout, "fp32", "heuristic")
    lt.prepare(problem, bufs, "graph", None)
    listed = lt.algorithms()[:RACE_ALGOS]
    extra = lt.split_variants(problem, _sm_count(), range(len(listed))) if split_variants() else []
    pinned = lt.add_config(include) if include else None
    if pinned is not None and (pinned < len(listed) or pinned in extra):
        pinned = None
    descs = lt.algorithms()
    for i in [*range(len(listed)), *extra, *([] if pinned is None else [pinned])]:
        out[f"cublaslt#{i} {descs[i]}"] = (lambda f=lt.algorithm_call(i): f(a, b, bt, c))
    return out


def split_variants() -> bool:
    """``GEMMRL_VENDOR_SPLITS``: whether the race also times split-K configurations of cuBLASLt's kernels that its
    heuristic does not list (default on; ``0`` races the heuristic's list alone)."""
    v = os.environ.get(SPLITS_ENV, "1").strip().lower() or "1"
    if v not in ("0", "1"):
        raise VendorChoiceError(f"{SPLITS_ENV}={v!r}: use 1 (race split-K configurations beside the heuristic's "
                                "list) or 0 (the heuristic's list alone)")
    return v == "1"


def _sm_count() -> int:
    import torch  # start-up cost: torch loads on first use, not on import

    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def vendor_torch(a, b, c) -> None:
    import torch  # start-up cost: torch loads on first use, not on import

    torch.matmul(a, b, out=c)


__all__ = ["GEN", "Choice", "ChoiceCache", "checks_battery", "in_turn", "Identity", "VendorChoiceError", "choice_key", "choose", "graph_race",
           "m_bucket",
           "mode", "split_variants", "fresh_timer", "plan_of", "plans_for", "race", "race_budget_s", "PROTOCOLS", "cold_timer"]
