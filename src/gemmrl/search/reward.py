"""The LLM reward: one number per completion, for training kernel-writing LLMs.

This module holds scoring (:func:`score_completion`, :func:`score_many`: :func:`~gemmrl.search.llm.extract` plus
one evaluation on an executor, :func:`outcome_from_record`), and its wrappers for training frameworks:
:func:`make_trl_reward` (a TRL reward function), :func:`compute_score` (verl's custom reward, scored on
:func:`default_executor`, which :func:`set_default_executor` replaces) and :func:`dataset_rows` (training rows for
both). The same scoring over HTTP is ``reward_server.py``.

The reward rule itself (:func:`training_reward`, ``FAIL_REWARD``, ``MIN_OK_REWARD``, ``NO_BASELINE_REWARD``: one
number per completion, never NaN) lives in ``reward_rule.py`` and is re-exported here.

Tests: ``pytest tests/search/test_llm.py`` (Triton interpreter on CPU). Nothing runs at import time: the default
executor is made on first use.
"""

from __future__ import annotations

import json
import math
import threading
from typing import Any, Callable, Mapping, Sequence

from ..problem import GemmProblem, parse_mnk
from .executor import SandboxExecutor
from .llm import ExtractError, build_prompt, extract
from .proposer import Context, Hardware, Outcome, Proposal
from .reward_rule import FAIL_REWARD, MIN_OK_REWARD, NO_BASELINE_REWARD, training_reward


def outcome_from_record(problem: GemmProblem, proposal: Proposal, ev: Mapping[str, Any]) -> Outcome:
    """An :class:`Outcome` from one evaluation record of a ``GroupResult``."""
    r = ev.get("reward")
    return Outcome(problem, proposal, ev.get("failure") or "ok", math.nan if r is None else float(r),
                   str(ev.get("reason") or ""), dict(ev.get("speedup") or {}), dict(ev.get("build") or {}),
                   dict(ev.get("profile") or {}))


def score_many(completions: Sequence[str], problems: Sequence[GemmProblem], executor: Any,
               timeout_s: float | None = None) -> list[tuple[float, str, str]]:
    """(training reward, verdict, reason) per completion: extracted, then evaluated on ``executor`` (all submitted
    before any is awaited, so a pool runs them side by side). Executor failures (not the candidate's) raise."""
    out: list[Any] = []
    for text, problem in zip(completions, problems, strict=True):
        try:
            spec = extract(text, problem)
        except ExtractError as e:
            out.append((FAIL_REWARD, "extract", str(e)))
            continue
        out.append(executor.submit(problem, [spec]))
    got = []
    for item in out:
        if isinstance(item, tuple):
            got.append(item)
            continue
        ev = item.result(timeout=timeout_s).evaluations[0]
        verdict = ev.get("failure") or "ok"
        r = ev.get("reward")
        got.append((training_reward(verdict, math.nan if r is None else float(r)), verdict,
                    str(ev.get("reason") or "")))
    return got


def score_completion(completion: str, problem: GemmProblem, executor: Any,
                     timeout_s: float | None = None) -> tuple[float, str, str]:
    """(training reward, verdict, reason) of one completion at ``problem`` (``verdict``: ok, extract, build,
    shape, rejected, oom, error, crash, timeout, cuda_fault)."""
    return score_many([completion], [problem], executor, timeout_s)[0]


def completion_text(completion: Any) -> str:
    """The answer's text from a string, a message dict or a conversation (TRL's conversational format: the
    last assistant message)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return str(completion.get("content") or "")
    if isinstance(completion, Sequence):
        msgs = [m for m in completion if isinstance(m, Mapping)]
        mine = [m for m in msgs if m.get("role", "assistant") == "assistant"] or msgs
        return str(mine[-1].get("content") or "") if mine else ""
    raise TypeError(f"cannot read a completion from a {type(completion).__name__}")


def problem_from(fields: Mapping[str, Any]) -> GemmProblem:
    """A problem from ``mnk`` (or ``M``, ``N``, ``K``) and optional ``dtype``, ``acc``, ``layout``."""
    kw = {k: str(fields[k]) for k in ("dtype", "acc", "layout") if fields.get(k)}
    if fields.get("mnk"):
        return parse_mnk(str(fields["mnk"]), **kw)
    if all(k in fields for k in "MNK"):
        return GemmProblem(int(fields["M"]), int(fields["N"]), int(fields["K"]), **kw)
    raise ValueError(f"no problem in {sorted(fields)}: give mnk='M_N_K' (and dtype, acc, layout if not fp16/fp32/tn)")


def make_trl_reward(executor: Any, problems_by_key: Mapping[str, GemmProblem] | None = None,
                    column: str = "mnk") -> Callable[..., list[float]]:
    """A TRL reward function ``reward_fn(prompts, completions, **kwargs) -> list[float]``: each completion's
    problem is ``problems_by_key[kwargs[column][i]]`` or, without that map, read from the dataset's ``mnk``,
    ``dtype``, ``acc`` and ``layout`` columns."""

    def gemmrl_reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        if column not in kwargs:
            raise ValueError(f"the dataset needs a {column!r} column naming each prompt's problem (M_N_K); "
                             f"got columns {sorted(kwargs)}")
        problems = []
        for i, key in enumerate(kwargs[column]):
            if problems_by_key is not None and key in problems_by_key:
                problems.append(problems_by_key[key])
            else:
                problems.append(problem_from({"mnk": key, **{c: kwargs[c][i] for c in ("dtype", "acc", "layout")
                                                              if c in kwargs and kwargs[c] is not None}}))
        return [s[0] for s in score_many([completion_text(c) for c in completions], problems, executor)]

    return gemmrl_reward


_DEFAULT_EXECUTOR: list[Any] = []
_DEFAULT_LOCK = threading.Lock()


def set_default_executor(executor: Any) -> None:
    """The executor :func:`compute_score` evaluates on (default, or after ``None``: a ``SandboxExecutor`` on the
    local GPUs, made on first use)."""
    _DEFAULT_EXECUTOR[:] = [] if executor is None else [executor]


def default_executor() -> Any:
    with _DEFAULT_LOCK:
        if not _DEFAULT_EXECUTOR:
            _DEFAULT_EXECUTOR.append(SandboxExecutor())
        return _DEFAULT_EXECUTOR[0]


def compute_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Mapping | None = None,
                  **kwargs: Any) -> float:
    """verl's custom reward function: ``ground_truth`` is ``"M_N_K"``, a JSON object or a dict with ``mnk``
    (and ``dtype``, ``acc``, ``layout``); ``extra_info`` may carry the same keys; other keyword arguments of
    newer verl versions are ignored. Scored on the default executor (:func:`set_default_executor`)."""
    fields: dict[str, Any] = dict(extra_info or {})
    gt = ground_truth
    if isinstance(gt, str):
        gt = json.loads(gt) if gt.strip().startswith("{") else {"mnk": gt.strip()}
    if isinstance(gt, Mapping):
        fields.update({k: v for k, v in gt.items() if v is not None})
    return score_completion(completion_text(solution_str), problem_from(fields), default_executor())[0]


def dataset_rows(problems: Sequence[GemmProblem], hardware: Hardware = Hardware()) -> list[dict]:
    """One training row per problem, for TRL (``prompt`` + problem columns) and verl (``data_source``,
    ``reward_model.ground_truth``) alike."""
    rows = []
    for p in problems:
        gt = {"mnk": p.mnk, "dtype": p.dtype, "acc": p.acc, "layout": p.layout}
        rows.append({"prompt": build_prompt(Context(p, hardware)), **gt, "data_source": "gemmrl",
                     "reward_model": {"style": "rule", "ground_truth": json.dumps(gt)}})
    return rows


__all__ = ["training_reward", "outcome_from_record", "score_completion", "score_many", "make_trl_reward",
           "compute_score", "set_default_executor", "default_executor", "dataset_rows", "FAIL_REWARD",
           "MIN_OK_REWARD", "NO_BASELINE_REWARD"]
