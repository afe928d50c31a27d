"""The learned proposer: a policy over the structured kernel space, shared across shapes, trained by policy
gradient with group-relative advantages (GRPO without a critic).

Actions are candidates of the two config families -- Triton configs (``search/space.py``, 16k valid at 4096^3)
and CUTLASS SM90 (config, knobs) pairs (``kernels/cutlass_sm90.py``, 41k points) -- as ``CandidateSpec``. For a
shape the policy scores a candidate set (``candidate_set``: the cost model's top configs per layout, a shared
exploration pool and the CUTLASS family with its knobs) with a linear softmax policy

    pi(a | s) = softmax_a( theta . phi(s, a) / 1 ),    phi = [prior(s, a), tile/wave features, family x shape]

``phi`` crosses the shape (log M, N, K) with the action (family, tile sizes, warps, stages, split, layout) and
with what they imply together (tile count, wave efficiency, padding waste, K steps), and carries the cost
model's prediction as a prior feature: ``-(log t_model(a) - min_a' log t_model(a'))`` in cold and warm L2, with
the model constants the policy was created with (``prior_params``, saved with it: refitting the model must not
change what a trained policy's weights multiply).
Initialized from the cost model: theta is zero but for the prior features, so the untrained policy ranks as the
cost model does (temperature ``init_temp``).

Training (``update``): a group of G proposals for one shape with rewards r_i (log speedup over vendor_best,
failures get ``FAIL_REWARD``); advantages A_i = (r_i - mean r) / (std r + eps); gradient of sum_i A_i log
pi(a_i | s) (= A_i (phi_i - E_pi[phi])), Adam step. Greedy proposals take the policy's top-k not yet tried, with
a slot for every family (``with_family_floor``). Live tuning (``LIVE_LR``, ``LIVE_ADV_EPS``) learns more slowly
than replay training on screens: single live groups of four near-equal configs are mostly noise (median
within-group reward spread 2-4%), and at the replay's lr 0.05 their updates undid what the screens taught.
Replaying the 1000-shape grid's 950 live groups outside the held-out 50 on the shipped policy (the vendor-selection run), the
held-out share of the sweep's log-gain in the first 4 proposals / with 15% of its GPU time went from 0.464 / 0.790
to 0.082 / 0.165 at lr 0.05, 0.280 / 0.689 at lr 0.01, 0.413 / 0.894 at 0.005 and 0.464 / 0.905 at 0.002 (eps 0.02):
Adam's steps are ~lr whatever the gradient's size, so over a thousand groups of mostly-noise the walk is lr-sized.

Saved as JSON (``save``/``load``) beside the library. Nothing here imports torch.
"""

from __future__ import annotations

import json
import math
import os
import random
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, fields, replace
from functools import lru_cache
from multiprocessing import get_context
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..kernels import cutlass_sm90
from ..kernels.cutlass_sm90 import parse_name
from ..kernels.triton_gemm.configs import H100, parse_config
from ..measure.evaluate import CandidateSpec
from ..problem import GemmProblem
from .costmodel import DEFAULT, LEGACY_PARAMS, CostParams, estimate_spec
from .proposer import Context, Outcome, Proposal, spec_key
from .screen import configs_for, exploration_pool

FAIL_REWARD = -1.0          # reward of a proposal that failed (build, verification, crash ...): 0.37x
LIVE_LR = 0.002             # gemmrl tune's learning rate (replay training on screens: 0.05); see the docstring
LIVE_ADV_EPS = 0.02         # gemmrl tune's advantage epsilon: the noise rule's 2% (replay: 1e-3)
VERSION = 1
KINDS = ("triton:tiled", "triton:persistent", "triton:splitk", "triton:smallm", "cutlass:coop:persistent",
         "cutlass:coop:streamk", "cutlass:pingpong:persistent", "cutlass:pingpong:streamk")
SHAPE_BASIS = ("1", "lm", "ln", "lk", "small_m", "small_n")
NUMERIC = ("bm", "bn", "bk", "warps", "stages", "split", "tn", "tma", "ws", "cluster", "group_m", "ctas", "nosmem")
PAIR = ("l_tiles", "wave_eff", "fill", "pad_m", "pad_n", "l_ksteps", "l_ksteps_sq")
PRIOR = ("prior_cold", "prior_warm")


def _triton_action(payload: str, layout: str) -> dict:
    c = parse_config(payload)
    return dict(kind=f"triton:{c.variant}", BM=c.BM, BN=c.BN, BK=c.BK, warps=c.warps, stages=c.stages,
                split=getattr(c, "split", 1), tma=bool(getattr(c, "tma", False)), ws=bool(getattr(c, "ws", False)),
                cluster=1, group_m=getattr(c, "group_m", 8), ctas=getattr(c, "ctas_per_sm", 1),
                swap=c.variant == "smallm" and getattr(c, "mma", True), persistent=c.variant == "persistent",
                tn=layout == "tn", nosmem=False)


def _cutlass_action(payload: str, layout: str) -> dict:
    c, k = parse_name(payload)
    split = k.splits if c.scheduler == "streamk" else 1
    return dict(kind=f"cutlass:{c.schedule}:{c.scheduler}", BM=c.bm, BN=c.bn, BK=c.bk,
                warps=12 if c.schedule == "coop" else 8, stages=max(2, min(8, c.stages)), split=split, tma=True,
                ws=True, cluster=c.cm * c.cn, group_m=k.swizzle, ctas=1, swap=c.swap, persistent=True,
                tn=layout == "tn", nosmem=c.epilogue == "nosmem")


ACTIONS = {"triton": _triton_action, "cutlass": _cutlass_action}  # the families the policy acts on: their features


@lru_cache(maxsize=65536)
def _action(family: str, payload: str, layout: str) -> dict:
    """The action's own attributes (family kind and numeric fields), parsed once."""
    if family not in ACTIONS:
        raise ValueError(f"the policy proposes Triton and CUTLASS configs, not {family!r} candidates")
    return ACTIONS[family](payload, layout)


def _shape(problem: GemmProblem) -> np.ndarray:
    lm, ln, lk = (math.log2(x) / 14.0 for x in (problem.M, problem.N, problem.K))
    return np.array([1.0, lm, ln, lk, float(problem.M <= 64), float(problem.N <= 256)])


def _prior(problem: GemmProblem, specs: Sequence[CandidateSpec], params=None) -> np.ndarray:
    """[n, 2]: -(log t_model - min log t_model) in cold and warm L2 (0 for the model's best), the model's constants
    ``params`` (``costmodel.DEFAULT`` when None)."""

    out = np.zeros((len(specs), 2))
    for i, s in enumerate(specs):
        for j, warm in enumerate((False, True)):
            out[i, j] = math.log(max(estimate_spec(s, problem, warm_l2=warm, params=params or DEFAULT), 1e-9))
    return -(out - out.min(axis=0, keepdims=True)) if len(specs) else out


def features(problem: GemmProblem, specs: Sequence[CandidateSpec], sms: int = 132, params=None) -> np.ndarray:
    """phi(s, a) for every candidate: [n, dim] (``feature_names`` names the columns); the prior columns from the
    cost model with constants ``params`` (the policy's own: see ``RLPolicy.prior_params``)."""
    basis = _shape(problem)
    rows = []
    for s in specs:
        a = _action(s.family, str(s.payload), s.layout)
        kind = np.zeros(len(KINDS))
        kind[KINDS.index(a["kind"])] = 1.0
        num = np.array([math.log2(a["BM"]) / 8, math.log2(a["BN"]) / 8, math.log2(a["BK"]) / 8,
                        math.log2(a["warps"]) / 4, a["stages"] / 8, math.log2(a["split"]) / 5, float(a["tn"]),
                        float(a["tma"]), float(a["ws"]), a["cluster"] / 2, math.log2(max(1, a["group_m"])) / 4,
                        a["ctas"] / 2, float(a["nosmem"])])
        m, n = (problem.N, problem.M) if a["swap"] else (problem.M, problem.N)
        tm, tn_ = math.ceil(m / a["BM"]), math.ceil(n / a["BN"])
        tiles = tm * tn_ * a["split"]
        slots = sms * (a["ctas"] if a["persistent"] else 1)
        waves = math.ceil(tiles / slots)
        ksteps = math.ceil(math.ceil(problem.K / a["BK"]) / a["split"])
        pair = np.array([math.log2(tiles) / 16, tiles / (waves * slots), min(1.0, tiles / slots),
                         m / (tm * a["BM"]), n / (tn_ * a["BN"]), math.log2(ksteps) / 10, (math.log2(ksteps) / 10) ** 2])
        fam = np.array([a["kind"].startswith("triton"), a["kind"].startswith("cutlass")], dtype=float)
        rows.append(np.concatenate([np.outer(kind, basis).ravel(), np.outer(num, basis[:4]).ravel(), pair,
                                    np.outer(fam, pair).ravel()]))
    x = np.array(rows).reshape(len(specs), -1)
    return np.concatenate([_prior(problem, specs, params), x], axis=1)


def feature_names() -> list[str]:
    return (list(PRIOR) + [f"{k}*{b}" for k in KINDS for b in SHAPE_BASIS]
            + [f"{k}*{b}" for k in NUMERIC for b in SHAPE_BASIS[:4]] + list(PAIR)
            + [f"{f}*{p}" for f in ("triton", "cutlass") for p in PAIR])


# -- the candidate set of a shape ------------------------------------------------------------------------------
def candidate_set(problem: GemmProblem, layouts: Iterable[str] = ("tn", "nn"), top: int = 48, explore: int = 16,
                  cutlass: bool = True, seed: int = 0, cutlass_layouts: Iterable[str] = ("tn",)) -> list[CandidateSpec]:
    """What the policy chooses among at ``problem``: per layout the cost model's ``top`` Triton configs (every
    variant represented) and ``explore`` valid ones from the shared exploration pool, and, in ``cutlass_layouts``
    (tn: the layout nn.Linear's weight already has, and the one the family is screened and prebuilt in), every
    config of ``cutlass_sm90.family()`` with the knob settings screened at this shape."""

    pool = _pool(seed)
    out: list[CandidateSpec] = []
    for layout in layouts:
        pl = problem.with_(layout=layout)
        for c, _, _ in configs_for(pl, H100, top, explore, pool, seed):
            out.append(CandidateSpec("triton", str(c), name=f"triton:{c}:{layout}", layout=layout))
        if cutlass and layout in tuple(cutlass_layouts):
            for cfg, knobs in cutlass_sm90.screen_entries(pl, cutlass_sm90.family(layout, problem.dtype)):
                out.append(CandidateSpec("cutlass", f"{cfg}:{knobs}", name=f"cutlass:{cfg}:{knobs}", layout=layout))
    return out


def _shape_key(problem: GemmProblem) -> tuple:
    """What a shape's candidate set depends on (it covers both layouts itself)."""
    return (problem.M, problem.N, problem.K, problem.dtype, problem.acc)


@lru_cache(maxsize=4)
def _pool(seed: int):

    return tuple(exploration_pool(seed, 24))


def with_family_floor(ranked: Sequence[int], family_of, k: int) -> list[int]:
    """``ranked`` reordered so its first ``k`` hold every family that has a candidate in it: a missing family's
    best-ranked candidate takes the place of the last of the top ``k`` whose family has another there (k >= 2).
    A greedy linear policy otherwise stops proposing a family for good (the first grid tune: CUTLASS went from 26% of part
    2's proposals to 5 of 2108 in parts 3-5), and GRPO never compares the families again."""
    order = list(ranked)
    if k < 2:
        return order
    for fam in sorted({family_of(i) for i in order}):
        top = order[:k]
        if any(family_of(i) == fam for i in top):
            continue
        shared = [i for i in top if sum(family_of(j) == family_of(i) for j in top) > 1]
        if not shared:
            continue   # every slot already holds the only candidate of its family
        best, displaced = next(i for i in order if family_of(i) == fam), shared[-1]
        order.remove(best)
        order[order.index(displaced)] = best   # the new one takes the slot; the one it displaced leads the rest
        order.insert(k, displaced)
    return order


# -- the policy ------------------------------------------------------------------------------------------------
@dataclass
class Adam:
    lr: float = 0.05
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    t: int = 0
    m: np.ndarray | None = None
    v: np.ndarray | None = None

    def step(self, theta: np.ndarray, grad: np.ndarray) -> np.ndarray:
        """Gradient *ascent* step."""
        if self.m is None:
            self.m, self.v = np.zeros_like(theta), np.zeros_like(theta)
        self.t += 1
        self.m = self.b1 * self.m + (1 - self.b1) * grad
        self.v = self.b2 * self.v + (1 - self.b2) * grad * grad
        mh = self.m / (1 - self.b1 ** self.t)
        vh = self.v / (1 - self.b2 ** self.t)
        return theta + self.lr * mh / (np.sqrt(vh) + self.eps)


@dataclass
class PolicyState:
    theta: np.ndarray
    init_temp: float = 0.15
    updates: int = 0
    trained_on: list = field(default_factory=list)   # mnk of every shape it took a step on


class RLPolicy:
    """The linear softmax policy above, as a ``Proposer`` (``name = "rl"``)."""

    name = "rl"

    def __init__(self, init_temp: float = 0.15, lr: float = 0.05, greedy: bool = True, l2: float = 1e-3,
                 candidates=candidate_set, family_floor: bool = True, adv_eps: float = 1e-3, prior_params=None):

        # the cost model's constants behind the prior features: fixed for the policy's life and saved with it, so a
        # refitted model (which moves every prediction) does not change what a trained policy's weights multiply
        self.prior_params = prior_params or DEFAULT
        dim = len(feature_names())
        theta = np.zeros(dim)
        theta[:2] = 0.5 / init_temp          # the cost model's cold and warm predictions, equally
        self.state = PolicyState(theta, init_temp)
        self.opt = Adam(lr)
        self.greedy = greedy
        self.family_floor = family_floor
        self.adv_eps = adv_eps   # advantages = (r - mean) / (std + adv_eps): a spread below it is mostly noise
        self.l2 = l2
        self.anchor: np.ndarray | None = None   # the weights l2 pulls toward (None: zero); see anchor_here
        self.candidates = candidates
        self._cache: dict[tuple, tuple[list[CandidateSpec], np.ndarray]] = {}

    # scoring
    def actions(self, problem: GemmProblem) -> tuple[list[CandidateSpec], np.ndarray]:
        key = _shape_key(problem)
        if key not in self._cache:
            specs = list(self.candidates(problem))
            self._cache[key] = (specs, features(problem, specs, params=self.prior_params))
        return self._cache[key]

    def warm(self, problems: Sequence[GemmProblem], jobs: int | None = None, progress: bool = False) -> None:
        """Compute the candidate sets and features of many shapes ahead, in parallel processes (the cost model
        ranks ~16k configs per shape and layout: half a second each)."""
        todo = [p for p in problems if _shape_key(p) not in self._cache]
        jobs = jobs or max(1, (os.cpu_count() or 2) - 1)
        if len(todo) < 4 or jobs == 1:
            for p in todo:
                self.actions(p)
            return
        with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as ex:
            for p, got in zip(todo, ex.map(_actions_of, [self.candidates] * len(todo), todo,
                                           [self.prior_params] * len(todo))):
                self._cache[_shape_key(p)] = got

    def set_actions(self, problem: GemmProblem, specs: Sequence[CandidateSpec]) -> None:
        """Fix the candidate set of a shape (replay training: the configs measured there)."""
        key = _shape_key(problem)
        self._cache[key] = (list(specs), features(problem, specs, params=self.prior_params))

    def logits(self, x: np.ndarray) -> np.ndarray:
        return x @ self.state.theta

    def probs(self, x: np.ndarray) -> np.ndarray:
        z = self.logits(x)
        z = np.exp(z - z.max())
        return z / z.sum()

    def ranked(self, problem: GemmProblem) -> list[CandidateSpec]:
        specs, x = self.actions(problem)
        order = np.argsort(-self.logits(x), kind="stable")
        return [specs[i] for i in order]

    # Proposer protocol
    def propose(self, ctx: Context, k: int, rng: random.Random | None = None) -> list[Proposal]:
        specs, x = self.actions(ctx.problem)
        tried = ctx.tried()
        free = [i for i, s in enumerate(specs) if spec_key(s) not in tried]
        if not free:
            return []
        z = self.logits(x[free])
        if not self.greedy:
            rng = rng or random.Random(0)
            z = z + np.array([-math.log(-math.log(max(rng.random(), 1e-12))) for _ in free])  # Gumbel top-k
        ranked = list(np.argsort(-z, kind="stable"))
        if self.family_floor:
            ranked = with_family_floor(ranked, lambda i: specs[free[i]].family, k)
        return [Proposal(specs[free[i]], "rl", f"rank={r}") for r, i in enumerate(ranked[:k])]

    def update(self, ctx: Context, outcomes: Sequence[Outcome]) -> None:
        specs, x = self.actions(ctx.problem)
        index = {spec_key(s): i for i, s in enumerate(specs)}
        picked = [(index[o.proposal.key], o.reward if o.ok else FAIL_REWARD) for o in outcomes
                  if o.proposal.key in index]
        if len(picked) < 2:
            return
        self.step(x, [i for i, _ in picked], [r for _, r in picked])
        self.state.trained_on.append(ctx.problem.mnk)

    def step(self, x: np.ndarray, chosen: Sequence[int], rewards: Sequence[float]) -> None:
        """One GRPO step on one group: ``chosen`` rows of ``x`` earned ``rewards``."""
        r = np.asarray(rewards, dtype=float)
        adv = (r - r.mean()) / (r.std() + self.adv_eps)
        p = self.probs(x)
        mean_phi = p @ x
        grad = (adv[:, None] * (x[list(chosen)] - mean_phi)).sum(axis=0) / len(chosen)
        grad -= self.l2 * (self.state.theta if self.anchor is None else self.state.theta - self.anchor)
        self.state.theta = self.opt.step(self.state.theta, grad)
        self.state.updates += 1

    def anchor_here(self, l2: float) -> None:
        """From now on l2 (strength ``l2``) pulls the weights toward their present values instead of toward zero:
        GRPO's KL penalty to a reference policy. Tried for live tuning in replay (benchmarks/acceptance/policy_live_replay.py,
        the vendor-selection run): it did no better than the smaller ``LIVE_LR``, so ``gemmrl tune`` does not anchor."""
        self.anchor, self.l2 = self.state.theta.copy(), float(l2)

    # persistence
    def to_dict(self) -> dict:
        d = {"version": VERSION, "kind": "linear-softmax-grpo", "features": feature_names(),
             "theta": [float(v) for v in self.state.theta], "init_temp": self.state.init_temp,
             "updates": self.state.updates, "trained_on": sorted(set(self.state.trained_on)),
             "fail_reward": FAIL_REWARD, "prior_params": asdict(self.prior_params)}
        if self.opt.m is not None:   # the optimizer's state: a reloaded policy goes on with the same step sizes
            d["adam"] = {"t": self.opt.t, "m": [float(v) for v in self.opt.m], "v": [float(v) for v in self.opt.v]}
        return d

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path, **kw) -> "RLPolicy":
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read policy file {path}: {e}; delete it to start from the cost model") from e
        names, saved = feature_names(), list(d.get("features") or ())
        theta = np.asarray(d.get("theta") or (), dtype=float)
        if d.get("version") != VERSION or len(saved) != len(theta) or not set(saved) <= set(names):
            raise ValueError(f"policy file {path} was saved by another version of gemmrl (features differ); "
                             "retrain it (gemmrl tune) or delete it to start from the cost model")
        pol = cls(init_temp=float(d["init_temp"]), prior_params=_prior_params(d.get("prior_params")), **kw)
        # a file from before a feature was added: its weights by name, the new features' at 0 (what they add is
        # learned from the next updates)
        idx = [names.index(n) for n in saved]
        pol.state.theta = np.zeros(len(names))
        pol.state.theta[idx] = theta
        pol.state.updates = int(d.get("updates", 0))
        pol.state.trained_on = list(d.get("trained_on", []))
        adam = d.get("adam")
        if adam and len(adam.get("m") or ()) == len(saved) == len(adam.get("v") or ()):
            # Adam's moments by feature name too (a new feature's at 0); without them a reloaded policy restarts
            # Adam's bias correction, whose first steps move every weight by ~lr whatever its gradient
            m, v = np.zeros(len(names)), np.zeros(len(names))
            m[idx], v[idx] = adam["m"], adam["v"]
            pol.opt.m, pol.opt.v, pol.opt.t = m, v, int(adam.get("t", 0))
        return pol


def _prior_params(saved: dict | None):
    """The cost-model constants a saved policy's prior features used: its ``prior_params`` over the ring-depth fix's
    constants (``costmodel.LEGACY_PARAMS``, what every policy saved before the field existed was trained with). A constant added
    to the model after a file was saved takes its LEGACY_PARAMS value: whoever adds one gives it, in LEGACY_PARAMS, the value that
    reproduces the model without it."""

    if saved is None:
        return LEGACY_PARAMS
    known = {f.name for f in fields(CostParams)}
    unknown = set(saved) - known
    if unknown:
        raise ValueError(f"the policy's prior_params name constants this gemmrl's cost model lacks: {sorted(unknown)};"
                         " it was saved by a newer gemmrl: upgrade, or retrain the policy")
    return replace(LEGACY_PARAMS, **{k: float(v) for k, v in saved.items()})


def _actions_of(candidates, problem: GemmProblem, params=None) -> tuple[list[CandidateSpec], np.ndarray]:
    specs = list(candidates(problem))
    return specs, features(problem, specs, params=params)


class CostModelProposer:
    """The cost model's ranking, best first (the baseline the policy must beat; also the policy at step 0)."""

    name = "costmodel"

    def __init__(self, candidates=candidate_set):
        self.candidates = candidates
        self._cache: dict = {}

    def ranked(self, problem: GemmProblem) -> list[CandidateSpec]:
        key = _shape_key(problem)
        if key not in self._cache:
            specs = list(self.candidates(problem))
            pr = _prior(problem, specs).sum(axis=1)
            self._cache[key] = [specs[i] for i in np.argsort(-pr, kind="stable")]
        return self._cache[key]

    def propose(self, ctx: Context, k: int, rng=None) -> list[Proposal]:
        tried = ctx.tried()
        return [Proposal(s, "costmodel") for s in self.ranked(ctx.problem) if spec_key(s) not in tried][:k]

    def update(self, ctx: Context, outcomes: Sequence[Outcome]) -> None:
        pass


class RandomProposer:
    """Uniform over the candidate set (the search-efficiency baseline)."""

    name = "random"

    def __init__(self, candidates=candidate_set):
        self.candidates = candidates
        self._cache: dict = {}

    def propose(self, ctx: Context, k: int, rng: random.Random | None = None) -> list[Proposal]:
        rng = rng or random.Random(0)
        key = _shape_key(ctx.problem)
        if key not in self._cache:
            self._cache[key] = list(self.candidates(ctx.problem))
        tried = ctx.tried()
        free = [s for s in self._cache[key] if spec_key(s) not in tried]
        return [Proposal(s, "random") for s in rng.sample(free, min(k, len(free)))]

    def update(self, ctx: Context, outcomes: Sequence[Outcome]) -> None:
        pass
