"""Rule-based outcome reward, as verl's reward manager computes it (``reward_model.style == "rule"``).

Known verl data sources (gsm8k, MATH, geo3k, ...) are scored by verl's own
``verl.utils.reward_score.default_compute_score``; the builtin sets (``bench/*``) and data sources verl
does not know use :func:`last_number_score`.
"""

from __future__ import annotations

import re
from typing import Any

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number_score(response: str, ground_truth: str) -> float:
    """1.0 if the last number in ``response`` equals ``ground_truth`` (numerically), else 0.0."""
    found = _NUMBER.findall(response.replace(",", ""))
    if not found:
        return 0.0
    try:
        return float(abs(float(found[-1]) - float(ground_truth)) < 1e-6)
    except ValueError:
        return float(found[-1] == ground_truth.strip())


def score(data_source: str, response: str, ground_truth: str, extra_info: dict[str, Any] | None = None) -> float:
    """Scalar outcome reward of one decoded response.

    Raises nothing for unknown data sources: they fall back to :func:`last_number_score`.
    """
    if not data_source.startswith("bench/"):
        try:
            from verl.utils.reward_score import default_compute_score

            out = default_compute_score(data_source, response, ground_truth, extra_info)
            return float(out["score"] if isinstance(out, dict) else out)
        except NotImplementedError:
            pass
    return last_number_score(response, ground_truth)
