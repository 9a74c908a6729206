"""Reward function of the ``verl:cpu`` target (loaded by verl from this file's path).

verl calls ``compute_score(data_source, solution_str, ground_truth, extra_info)`` per response
(``reward.custom_reward_function.{path,name}``). A randomly initialised tiny model almost never states
the right number, so a 0/1 exact-match score would give all-zero advantages (GRPO normalises within a
group) and zero gradients: the timing of the update would not be the timing of real training. The score
therefore gives partial credit for the form of an answer: 1.0 for the ground truth as the last number,
0.2 per digit present (up to 0.6), minus a length term, so responses of one group score differently.
Standalone: imported inside verl's reward workers, it needs nothing but the standard library.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d+")


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """Score in [-0.1, 1.0] for one response (see the module docstring)."""
    text = solution_str or ""
    numbers = _NUMBER.findall(text)
    if numbers and numbers[-1] == str(ground_truth).strip():
        return 1.0
    digits = sum(ch.isdigit() for ch in text)
    return min(0.6, 0.2 * digits) - min(0.1, len(text) / 2000.0)
