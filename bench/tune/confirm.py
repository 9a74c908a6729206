"""The confirmation after a tune's trials: how sure the tune is that its best trial beats the rule of thumb.

The best trial is picked from single noisy runs (the winner's curse: the luckiest of N draws looks best).
The confirmation reruns the best trial's limits and the rule of thumb's (the article's 2*(P+R) / 4*(P+R),
snapped into the space: what trial 0 runs with ``start_at_rule_of_thumb``,
:func:`bench.tune.space.rule_of_thumb`) in ``confirm_blocks`` interleaved blocks, each block one run of
each limit set in a seeded random order, executed exactly like a trial's run
(:func:`bench.tune.trial.trial_spec`, :func:`bench.execution.runner.execute_spec`, the tune's executor) into
``<study>/confirm/block-<b>-<best|other>/``. They are not Optuna trials: the sampler never sees them.

Per block the log ratio of the two run values (:func:`bench.records.figures.run_value`: the median timed step of the
objective's metric, not speed-normalized: the interleaving pairs runs minutes apart),
``d = log(v_best / v_other)`` for step time and ``log(v_other / v_best)`` for throughput, so that a negative
change always means the best is faster (step time, or time per token). Over the complete blocks
(:func:`compare`): change ``exp(mean d) - 1`` and the paired t interval
``exp(mean d +- t(1 - alpha/2, n - 1) * sd(d) / sqrt(n)) - 1`` at alpha 0.05; an interval that includes 0
means the two cannot be told apart. A failed run is recorded and its block left out.

When the best trial *is* the rule of thumb, the confirmation compares it with the runner-up trial (the next
best feasible trial with other limits), or is skipped when there is none.
"""

from __future__ import annotations

import math
import random
from typing import Any, Sequence

from bench.tune.report import trial_kind

ALPHA = 0.05
FOLDER = "confirm"
FILE = "confirmation.json"
ROLES = ("best", "other")


def compare(best: Sequence[float | None], other: Sequence[float | None], direction: str = "minimize",
            alpha: float = ALPHA) -> dict[str, Any]:
    """Paired comparison of per-block run values (``best[i]`` and ``other[i]`` ran in block ``i``; ``None`` =
    that run failed: the block is left out).

    Returns ``blocks`` (complete blocks), ``log_ratios``, ``alpha`` and, with 2 or more blocks, ``change``,
    ``ci_low``, ``ci_high`` (fractions: -0.031 = 3.1 % faster) and ``verdict``: ``better`` (interval below 0),
    ``worse`` (above 0) or ``indistinguishable`` (it includes 0); with fewer blocks ``verdict`` is
    ``too_few_blocks`` and the numbers are ``None``.
    """
    from scipy import stats

    sign = 1.0 if direction == "minimize" else -1.0
    d = [sign * math.log(b / o) for b, o in zip(best, other)
         if b is not None and o is not None and b > 0 and o > 0 and math.isfinite(b) and math.isfinite(o)]
    n = len(d)
    out: dict[str, Any] = {"blocks": n, "log_ratios": d, "alpha": alpha, "change": None, "ci_low": None,
                           "ci_high": None, "verdict": "too_few_blocks"}
    if n < 2:
        return out
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    h = float(stats.t.ppf(1 - alpha / 2, n - 1)) * sd / math.sqrt(n)
    out.update(change=math.expm1(mean), ci_low=math.expm1(mean - h), ci_high=math.expm1(mean + h), sd=sd)
    out["verdict"] = "better" if mean + h < 0 else "worse" if mean - h > 0 else "indistinguishable"
    return out


def pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def describe(res: dict[str, Any], lead: str, requested: int) -> str:
    """The confirmation's one line after ``lead`` (e.g. ``best (trial 4) vs rule of thumb``)."""
    n = res["blocks"]
    if res["verdict"] == "too_few_blocks":
        return (f"{lead}: not judged ({n} complete block(s) of {requested}: a paired interval needs 2 or more; "
                "see the confirmation's failed runs)")
    span = f"{pct(res['change'])} [{pct(res['ci_low'])}, {pct(res['ci_high'])}] over {n} blocks"
    if res["verdict"] == "indistinguishable":
        return f"{lead}: cannot tell them apart ({span})"
    return f"{lead}: {span}"


def runner_up(trials: list[Any], best: Any, limits_of_trial: Any, direction: str) -> Any | None:
    """The best feasible trial after ``best`` whose limits differ from ``best``'s, or ``None``."""
    sign = 1 if direction == "minimize" else -1
    lim = limits_of_trial(best)
    rest = [t for t in trials if trial_kind(t) == "feasible" and t.number != best.number
            and limits_of_trial(t) != lim]
    return min(rest, key=lambda t: (sign * t.value, t.number)) if rest else None


def plan(best: Any, trials: list[Any], rot: dict[str, int], limits_of_trial: Any,
         direction: str) -> dict[str, Any]:
    """What to compare: ``best`` (trial, limits), ``other`` (label, trial or ``None``, limits), ``lead`` (the
    line's start); ``skipped`` (with its ``line``) when the best is the rule of thumb and no other trial is
    feasible."""
    blim = limits_of_trial(best)
    out: dict[str, Any] = {"best_trial": best.number, "best_limits": blim}
    if blim != rot:
        return {**out, "against": "rule_of_thumb", "other_trial": None, "other_limits": rot,
                "lead": f"best (trial {best.number}) vs rule of thumb"}
    head = f"the rule of thumb is the best trial (trial {best.number})"
    other = runner_up(trials, best, limits_of_trial, direction)
    if other is None:
        return {**out, "against": None, "other_trial": None, "other_limits": None,
                "skipped": "no other feasible trial", "line": f"{head}; no other feasible trial to compare it with"}
    return {**out, "against": "runner_up", "other_trial": other.number, "other_limits": limits_of_trial(other),
            "lead": f"{head}; vs the runner-up (trial {other.number})"}


def block_orders(blocks: int, seed: int) -> list[tuple[str, str]]:
    """Per block the order of the two runs (seeded: the same tune confirms in the same order)."""
    rng = random.Random(seed)
    return [tuple(rng.sample(ROLES, 2)) for _ in range(blocks)]  # type: ignore[misc]
