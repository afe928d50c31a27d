"""The tuning loop: propose -> build, verify, time (in the executor's sandboxed workers) -> reward -> update.

Per shape, ``rounds`` groups of ``group`` proposals. A group runs as one job (``evaluate.evaluate_group``: every
candidate built, verified by the battery and checked for CUDA-graph safety, then the survivors timed in graph and
cold, interleaved with the vendor baselines on the same inputs); reward = mean over the protocols of
log(t_vendor_best / t_candidate), i.e. the log of the geometric mean of the graph and cold speedups. The group's
outcomes go to the trials store the moment it finishes (one transaction: outcomes and result rows), then to the
proposer's ``update`` (a policy-gradient step for the RL policy, the JSONL log for the LLM), and the policy file is
saved. Shapes run concurrently, one group per executor slot (GPU); a shape's next group is proposed when its
previous one is back, so every proposal sees every earlier outcome of its shape.

Resume: the trials store holds every outcome; a rerun skips what a shape already had (its outcomes are the
proposer's ``Context.own``, and the rounds already done at a shape are counted from its stored groups), so a
killed run loses at most the groups in flight. Budgets: device seconds (the sum of the groups' worker wall time,
this run and earlier runs of the same ``run`` id) and wall-clock seconds of this invocation. A group starts only
if it is expected to end within the wall budget: expected, the longest group this invocation ran at the same N, K
and dtype with no larger M (``group_estimate_s``; a shape with no such group is not held back). Checked only when a
group starts, an LM-head group (N = 128256) begun seconds before the budget ran 40 s past it on an H200, and the
command was killed by its caller's timeout before it wrote its library.

The library: ``winners(store, gpu)`` builds library entries from every stored row of the GPU (the fastest verified
candidate per shape, layout and protocol, against ``vendor_best`` measured beside it). These are selection-run
numbers; the library's figures come from ``gemmrl bench --library`` in a separate run.
"""

from __future__ import annotations

import csv
import json
import math
import random
import time
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import asdict, dataclass, is_dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from ..kernels.cuda_source import CudaSource, ShapeRange
from ..kernels.registry import family
from ..kernels.triton_source import TritonSource
from ..library import build_entries
from ..measure.evaluate import CandidateSpec, environment_failures
from ..problem import GemmProblem
from .proposer import Context, Hardware, Outcome, Proposal, Proposer


@dataclass(frozen=True)
class TuneSpec:
    problems: tuple[GemmProblem, ...]
    group: int = 4                      # proposals per group (the GRPO group)
    rounds: int = 2                     # groups per shape
    budget_gpu_s: float = math.inf
    budget_wall_s: float = math.inf
    run: str = "tune"                   # names the run in the trials store
    gpu: str = ""                       # the GPU model outcomes are stored under ("" -> the executor's rows' gpu)
    neighbours: int = 6                 # outcomes of the nearest tuned shapes shown to the proposer
    seed: int = 0
    more_below: float = math.inf        # a shape's groups after its first only while its best speedup is below this

    def __post_init__(self) -> None:
        if self.group < 1 or self.rounds < 1:
            raise ValueError(f"group and rounds must be >= 1 (got {self.group}, {self.rounds})")
        if not self.problems:
            raise ValueError("no shapes to tune: give --mnk, --shapes, --grid or --model")


@dataclass(frozen=True)
class TuneReport:
    groups: int
    evaluated: int
    failures: dict
    gpu_s: float
    wall_s: float
    best: dict                          # shape_key -> best speedup (exp reward) over vendor_best, this GPU, all runs
    stopped: str                        # "done" | "gpu budget" | "wall budget"


def group_estimate_s(problem: GemmProblem, took: Sequence[tuple[GemmProblem, float]]) -> float:
    """The wall time a group at ``problem`` is expected to take: the longest of ``took`` ((problem, seconds) of
    finished groups) at the same N, K, dtype and accumulator with M no larger (the same weight: a larger M costs no
    less), else 0 (nothing known: not held back)."""
    same = [s for q, s in took if (q.N, q.K, q.dtype, q.acc) == (problem.N, problem.K, problem.dtype, problem.acc)
            and q.M <= problem.M]
    return max(same, default=0.0)


def shape_key(p: GemmProblem) -> str:
    """How the loop names a problem: M_N_K, with the dtype and accumulator where they are not fp16 / fp32, so a
    run over several dtypes (``gemmrl tune --model X --dtypes fp16,bf16``) tunes, resumes and reports each apart."""
    return p.mnk if (p.dtype, p.acc) == ("fp16", "fp32") else f"{p.mnk}:{p.dtype}:{p.acc}"


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- payloads in and out of the store ------------------------------------------------------------------------
def payload_text(spec: CandidateSpec) -> str:
    p = spec.payload
    if is_dataclass(p):
        return json.dumps({"type": type(p).__name__, **asdict(p), "shapes": str(p.shapes)}, default=list)
    return str(p)


def payload_from(name: str, text: str) -> Any:
    """A stored payload back: a config string as it is, a source (a family that declares its shapes) from its
    JSON (``payload_text``), of the type it was stored as."""
    if not family(name).declared:
        return text
    d = json.loads(text)
    kind = d.pop("type", "")
    d["shapes"] = ShapeRange.parse(d["shapes"]) if d.get("shapes") not in (None, "", "*") else ShapeRange()
    if kind == "TritonSource" or name == "triton_source":
        return TritonSource(**d)
    for k in ("flags", "includes"):
        if k in d:
            d[k] = tuple(d[k])
    return CudaSource(**d)


def outcome_of(problem: GemmProblem, proposal: Proposal, record: dict) -> Outcome:
    failure = record.get("failure") or ""
    reward = record.get("reward")
    reward = float(reward) if reward is not None else math.nan
    return Outcome(problem, proposal, failure or "ok", reward if not failure else math.nan,
                   str(record.get("reason", ""))[:400], dict(record.get("speedup") or {}),
                   dict(record.get("build") or {}), dict(record.get("profile") or {}))


def stored_outcome(row: dict, problem: GemmProblem) -> Outcome:
    rec = json.loads(row["record"] or "{}")
    spec = CandidateSpec(row["family"], payload_from(row["family"], row["payload"]), row["name"] or "", row["layout"])
    return outcome_of(problem, Proposal(spec, row["proposer"] or ""), {**rec, "reward": row["reward"]})


# -- the loop ------------------------------------------------------------------------------------------------
class Tuner:
    def __init__(self, spec: TuneSpec, proposers: Sequence[Proposer], executor: Any, store: Any,
                 hardware: Hardware = Hardware(), on_group: Callable[[str, list[Outcome]], None] | None = None,
                 save_policy: Callable[[], None] | None = None, progress: bool = True):
        if not proposers:
            raise ValueError("no proposer: use rl, llm or both")
        self.spec, self.proposers, self.executor, self.store = spec, list(proposers), executor, store
        self.hardware, self.on_group, self.save_policy, self.progress = hardware, on_group, save_policy, progress
        self.gpu = spec.gpu or hardware.name
        self.rng = random.Random(spec.seed)
        self.own: dict[str, list[Outcome]] = {}
        self.groups_done: dict[str, int] = {}
        self.gpu_s_before = 0.0
        self.clock: Callable[[], float] = time.monotonic  # the wall clock of the budget (tests: a stand-in)
        self._load()

    def pending(self) -> list[GemmProblem]:
        """The shapes this run still has groups to do for (all of them in a new run; fewer when resumed)."""
        return [p for p in self.spec.problems
                if self.groups_done.get(shape_key(p), 0) < self.spec.rounds and self._more(shape_key(p))]

    def _more(self, key: str) -> bool:
        """Whether a shape gets a(nother) group: its first always; later ones while no verified candidate reaches
        ``spec.more_below`` (a speedup; the best outcome stored for this GPU, any run)."""
        if not self.groups_done.get(key, 0):
            return True
        best = self._best_of(key)
        return best is None or best < self.spec.more_below

    def _load(self) -> None:
        by = {(p.mnk, p.dtype, p.acc): p for p in self.spec.problems}
        groups: dict[str, set] = {}
        for row in self.store.outcomes(gpu=self.gpu):
            p = by.get((row["mnk"], row["dtype"], row["acc"]))
            if p is not None:
                self.own.setdefault(shape_key(p), []).append(stored_outcome(row, p))
                if row["run"] == self.spec.run:
                    groups.setdefault(shape_key(p), set()).add(json.loads(row["record"] or "{}").get("group", ""))
            if row["run"] == self.spec.run:
                self.gpu_s_before += float(row["gpu_s"] or 0.0)
        self.groups_done = {m: len(g) for m, g in groups.items()}

    def context(self, problem: GemmProblem) -> Context:
        near = []
        lp = [math.log2(x) for x in (problem.M, problem.N, problem.K)]
        me = shape_key(problem)
        for key, outs in self.own.items():
            if key == me or not outs:
                continue
            q = outs[0].problem
            if (q.dtype, q.acc) != (problem.dtype, problem.acc):  # neighbours of the same data type and accumulator
                continue
            d = sum((a - math.log2(b)) ** 2 for a, b in zip(lp, (q.M, q.N, q.K)))
            near.append((d, key))
        near.sort()
        neighbours = tuple(o for _, m in near[:self.spec.neighbours] for o in self.own[m])
        return Context(problem, self.hardware, tuple(self.own.get(me, ())), neighbours)

    def _proposals(self, problem: GemmProblem) -> list[tuple[Proposer, Proposal]]:
        """This group's proposals: the group is shared out among the proposers in turn."""
        ctx = self.context(problem)
        k = self.spec.group
        shares = [k // len(self.proposers) + (1 if i < k % len(self.proposers) else 0) for i in range(len(self.proposers))]
        out, seen = [], ctx.tried()
        for prop, n in zip(self.proposers, shares):
            if n == 0:
                continue
            for pr in prop.propose(ctx, n, self.rng):
                if pr.key not in seen:
                    seen.add(pr.key)
                    out.append((prop, pr))
        return out

    def run(self) -> TuneReport:
        t0 = self.clock()
        todo = {shape_key(p): max(0, self.spec.rounds - self.groups_done.get(shape_key(p), 0))
                if self._more(shape_key(p)) else 0 for p in self.spec.problems}
        queue = [p for p in self.spec.problems if todo[shape_key(p)]]
        inflight: dict = {}
        gpu_s, evaluated, groups, failures = 0.0, 0, 0, {}
        stopped = "done"
        bar = self._bar(sum(todo.values()))
        exhausted: set[str] = set()
        took: list[tuple[GemmProblem, float]] = []  # (problem, wall s) of each finished group
        held = 0  # groups not started: expected to end past the wall budget
        while queue or inflight:
            while queue and len(inflight) < max(1, self.executor.slots):
                if self.gpu_s_before + gpu_s >= self.spec.budget_gpu_s:
                    stopped = "gpu budget"
                    break
                now = self.clock() - t0
                if now >= self.spec.budget_wall_s:
                    stopped = "wall budget"
                    break
                p = queue.pop(0)
                if now + group_estimate_s(p, took) > self.spec.budget_wall_s:  # would end past the budget
                    held += todo[shape_key(p)]
                    if bar:
                        bar.update(todo[shape_key(p)])
                    continue
                props = self._proposals(p)
                if not props:
                    exhausted.add(shape_key(p))
                    if bar:
                        bar.update(todo[shape_key(p)])
                    continue
                gid = f"{self.spec.run}:{shape_key(p)}:{self.groups_done.get(shape_key(p), 0)}:{_now()}"
                began = self.clock()
                fut = self.executor.submit(p, [pr.spec for _, pr in props])
                inflight[fut] = (p, props, gid, began)
            if stopped != "done":
                queue.clear()
            if not inflight:
                break
            done, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
            for fut in done:
                p, props, gid, began = inflight.pop(fut)
                res = fut.result()
                took.append((p, self.clock() - began))
                bad = environment_failures(res.rows)
                if bad:
                    name, why = next(iter(bad.items()))
                    raise RuntimeError(
                        f"baseline {name} could not run at {p.mnk} ({res.worker}): {why}; every reward would be "
                        f"measured against the other baselines only, not vendor_best, so the tune stops with nothing "
                        f"of this group stored ({len(bad)} baseline(s) failed: {', '.join(bad)}); fix the cause, then "
                        "run again with --resume")
                outs = self._record(p, props, res, gid)
                gpu_s += res.gpu_s
                groups += 1
                evaluated += len(outs)
                for o in outs:
                    if o.verdict != "ok":
                        failures[o.verdict] = failures.get(o.verdict, 0) + 1
                ctx = self.context(p)
                for prop in self.proposers:
                    mine = [o for (pp, _), o in zip(props, outs) if pp is prop]
                    if mine:
                        prop.update(ctx, mine)
                if self.save_policy:
                    self.save_policy()
                key = shape_key(p)
                if self.on_group:
                    self.on_group(key, outs)
                self.groups_done[key] = self.groups_done.get(key, 0) + 1
                todo[key] -= 1
                if todo[key] > 0 and self._more(key):
                    queue.append(p)
                elif todo[key] > 0:  # found what it was searched for: its other rounds are not needed
                    if bar:
                        bar.update(todo[key])
                    todo[key] = 0
                if bar:
                    bar.update(1)
                    bar.set_postfix_str(self._postfix(key))
        if bar:
            bar.close()
        if held and stopped == "done":
            stopped = "wall budget"
        return TuneReport(groups, evaluated, failures, self.gpu_s_before + gpu_s, self.clock() - t0,
                          self.best(), stopped)

    def _record(self, problem: GemmProblem, props: list, res: Any, gid: str) -> list[Outcome]:
        outs, rows = [], []
        ts = _now()
        share = res.gpu_s / max(1, len(props))
        for (prop, pr), rec in zip(props, res.evaluations):
            o = outcome_of(problem, pr, rec)
            outs.append(o)
            keep = {k: v for k, v in rec.items() if k not in ("rows",)}
            keep["group"] = gid
            keep["source"] = pr.source
            keep["info"] = pr.info
            rows.append(dict(gpu=self.gpu, mnk=problem.mnk, dtype=problem.dtype, acc=problem.acc, key=pr.key,
                             run=self.spec.run, proposer=prop.name, family=pr.spec.family, layout=pr.spec.layout,
                             payload=payload_text(pr.spec), name=pr.spec.label(), verdict=o.verdict,
                             reward=o.reward if math.isfinite(o.reward) else None,
                             record=json.dumps(_denan(keep), default=str), gpu_s=share, worker=res.worker, ts=ts))
        self.store.add_outcomes(rows, res.rows, f"tune:{self.spec.run}")
        self.own.setdefault(shape_key(problem), []).extend(outs)
        return outs

    def best(self) -> dict:
        """Per shape with a verified outcome: its best speedup (exp of the best reward)."""
        return {key: b for key in self.own if (b := self._best_of(key)) is not None}

    def _best_of(self, key: str) -> float | None:
        r = [o.reward for o in self.own.get(key, ()) if o.ok]
        return math.exp(max(r)) if r else None

    def _postfix(self, key: str) -> str:
        b = self.best()
        here = b.get(key)
        geo = math.exp(sum(math.log(max(1.0, v)) for v in b.values()) / len(b)) if b else float("nan")
        return (f"{key} best {here:.3f}x" if here else f"{key} no win") + f" | best-so-far geomean {geo:.3f}x"

    def _bar(self, total: int):
        if not self.progress:
            return None
        try:
            from tqdm import tqdm  # optional: progress bars where installed
        except ImportError:
            return None
        return tqdm(total=total, desc="tune", unit="group", dynamic_ncols=True)


def _denan(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _denan(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_denan(x) for x in v]
    return v


def winners(store: Any, gpu: str | None = None) -> list:
    """Library entries from every verified row the trials store holds for ``gpu`` (selection-run numbers)."""
    return build_entries(store.rows(gpu=gpu))


def summary_rows(store: Any, gpu: str, run: str | None = None) -> list[dict]:
    """One row per stored outcome: mnk, proposer, candidate, verdict, reward, speedups, gpu_s (for CSVs)."""
    out = []
    for r in store.outcomes(gpu=gpu, run=run):
        rec = json.loads(r["record"] or "{}")
        sp = rec.get("speedup") or {}
        out.append({"mnk": r["mnk"], "dtype": r["dtype"], "acc": r["acc"], "run": r["run"], "proposer": r["proposer"],
                    "candidate": r["name"], "layout": r["layout"], "verdict": r["verdict"],
                    "reward": "" if r["reward"] is None else r["reward"],
                    "speedup_graph": sp.get("graph", ""), "speedup_cold": sp.get("cold", ""),
                    "reason": (rec.get("reason") or "")[:200], "gpu_s": r["gpu_s"], "group": rec.get("group", ""),
                    "gpu": r["gpu"], "ts": r["ts"]})
    return out


def run_rows(store: Any, gpu: str, run: str) -> list[dict]:
    """Every result row a run measured (a results CSV's rows: what `gemmrl tune --rows-out` writes)."""
    return [{k: v for k, v in r.items() if k != "source"} for r in store.rows(gpu=gpu, sources=[f"tune:{run}"])]


def write_summary(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["mnk"])
        w.writeheader()
        w.writerows(rows)
    return path
