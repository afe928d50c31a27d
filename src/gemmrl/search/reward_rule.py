"""The training reward rule: one number per completion, for training kernel-writing LLMs.

:func:`training_reward`, one number per completion, never NaN:
  * a failure of any kind (unreadable answer ``extract``, ``build``, ``rejected`` by the battery, ``crash``...)
    scores ``FAIL_REWARD`` = -1.0;
  * a verified kernel scores its measured reward ``log(t_vendor_best / t_candidate)`` (0 = as fast as the vendor
    libraries), floored at ``MIN_OK_REWARD`` = -0.9 so that every verified kernel, however slow, beats every
    failure;
  * a verified kernel with no vendor time to compare with (``baselines=()``, the CPU tier) scores
    ``NO_BASELINE_REWARD`` = 0.0 with verdict ``ok``: correct, speed unknown.

Used by the LLM proposer's trajectory log (``llm.py``) and by the scoring wrappers for training frameworks
(``reward.py``, which re-exports these names).
"""

from __future__ import annotations

import math

FAIL_REWARD = -1.0
MIN_OK_REWARD = -0.9
NO_BASELINE_REWARD = 0.0


def training_reward(verdict: str, reward: float) -> float:
    """The one number a completion earns (module docstring): finite always."""
    if verdict != "ok":
        return FAIL_REWARD
    if reward is None or not math.isfinite(reward):
        return NO_BASELINE_REWARD
    return max(float(reward), MIN_OK_REWARD)


__all__ = ["training_reward", "FAIL_REWARD", "MIN_OK_REWARD", "NO_BASELINE_REWARD"]
