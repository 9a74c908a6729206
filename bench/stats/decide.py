"""The one place that decides: a comparison's verdict (:func:`decide_change`), a claim's result
(:func:`judge_claim`) and a gate's outcome (:func:`gate_outcome`).

Every path that calls a change a regression comes here with typed inputs; they differ only in how they gather the
runs and form the estimate and interval:

- the interleaved gate (:func:`bench.gate.runs.judge_ratios`: paired block log ratios, optional repeated interval);
- the stored gate and ``compare`` (:func:`bench.gate.stored_runs.compare_runs`: Welch on the runs' log values plus
  the sweep offset), and their per-step diagnostic (:func:`bench.stats.stat_tests.verdict`: p-value rule);
- the sweep report's claims (:func:`bench.report.tables.claims_on_runs`), which the gate also judges its ``expect``
  block by.

**Rules** (:func:`decide_change`, on the compared scale, a positive change worse): the gate *sees* the change that
must not go unseen when its smallest detectable change ``mde <= max_mde`` (no power rule where ``max_mde`` is
``None``); **regression** when it sees it, the interval lies above 0 (without an interval: ``p < alpha`` and the
estimate above 0) and the estimate is beyond the threshold, and a robust check, where one is given, agrees;
**improvement** likewise below; **unchanged** when it sees ``max_mde`` and the interval's upper end is below it
(without a power rule: whatever is not called); else **noisy** (cannot judge). Kalibera & Jones 2020 (runs as the
unit, the ratio on the log scale); the power rule is :func:`bench.stats.power.gate_mde`'s figure.

Pure: no files, no I/O, numbers in, a frozen dataclass out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

#: verdict of a gate (and of a row or claim) that could not be judged: too noisy, too few samples ...
CANNOT_JUDGE = "cannot judge"
#: the gate's exit codes (also in ``gate --help`` and the README)
EXIT_PASS, EXIT_REGRESSION, EXIT_BAD_INPUT, EXIT_CANNOT_JUDGE = 0, 1, 2, 3
#: row verdicts counted by :func:`gate_outcome`, in the order reports list them
ROW_VERDICTS = ("regression", "failed", "improvement", "unchanged", "noisy", CANNOT_JUDGE)
#: the verdicts :func:`decide_change` gives
ChangeVerdict = Literal["regression", "improvement", "unchanged", "noisy"]


@dataclass(frozen=True)
class Robust:
    """A robust view of the same comparison (:func:`bench.gate.runs.robust_check`): whether it, too, calls a
    slowdown (``slower``) or a speedup (``faster``) beyond the threshold."""

    slower: bool
    faster: bool


@dataclass(frozen=True)
class Evidence:
    """What one comparison measured, the inputs of :func:`decide_change`.

    Attributes:
        estimate: the change on ``scale``, oriented so that a positive value is worse (a slower step, a lower
            throughput): ``log(cand / base)`` on ``"log"``, a relative change on ``"relative"``.
        lo, hi: the interval's ends on the same scale (``-inf``/``inf`` for an unbounded one); ``None``: no
            interval, the significance is ``p_value < alpha``.
        threshold: the relative change that matters (0.05 = 5 %); on ``"log"`` compared as ``log1p(threshold)``.
        alpha: this comparison's level (its share of the family's error rate).
        p_value: the test's two-sided p-value (used only without an interval).
        scale: ``"log"`` or ``"relative"``.
        mde: the smallest relative change the comparison would see (:func:`bench.stats.power.gate_mde`);
        max_mde: the largest relative change that must not go unseen (the gate's ``--max-mde``); ``None``: no power
            rule (the per-step diagnostic).
        robust: a robust check that must agree before a change is called (``None``: none).
    """

    estimate: float
    threshold: float
    alpha: float
    lo: float | None = None
    hi: float | None = None
    p_value: float | None = None
    scale: Literal["log", "relative"] = "log"
    mde: float | None = None
    max_mde: float | None = None
    robust: Robust | None = None


@dataclass(frozen=True)
class Decision:
    """The verdict of :func:`decide_change`.

    Attributes:
        verdict: ``regression`` | ``improvement`` | ``unchanged`` | ``noisy``.
        sees: the comparison sees ``max_mde`` (always ``True`` without a power rule).
        slower, faster: the interval and estimate call a change beyond the threshold (before the robust check):
            a ``noisy`` verdict with ``slower`` set is one the robust check vetoed.
    """

    verdict: ChangeVerdict
    sees: bool
    slower: bool
    faster: bool


def decide_change(ev: Evidence) -> Decision:
    """The verdict on one comparison (module text: the rules). Pure.

    Raises:
        ValueError: ``scale`` is not ``log`` or ``relative``.
    """
    if ev.scale not in ("log", "relative"):
        raise ValueError(f"scale {ev.scale!r}: must be 'log' or 'relative'")
    to = math.log1p if ev.scale == "log" else float
    thr = to(ev.threshold)
    significant = ev.p_value is not None and ev.p_value < ev.alpha
    above = ev.lo > 0 if ev.lo is not None else significant and ev.estimate > 0
    below = ev.hi < 0 if ev.hi is not None else significant and ev.estimate < 0
    sees = ev.max_mde is None or (ev.mde is not None and ev.mde <= ev.max_mde)
    slower = sees and above and ev.estimate > thr
    faster = sees and below and ev.estimate < -thr
    if slower and (ev.robust is None or ev.robust.slower):
        verdict: ChangeVerdict = "regression"
    elif faster and (ev.robust is None or ev.robust.faster):
        verdict = "improvement"
    elif ev.max_mde is None:
        verdict = "unchanged"
    elif sees and ev.hi is not None and ev.hi < to(ev.max_mde) and not slower:
        verdict = "unchanged"
    else:
        verdict = "noisy"
    return Decision(verdict=verdict, sees=sees, slower=slower, faster=faster)


def judge_claim(at_least: float | None, at_most: float | None, ci: list[float | None] | tuple, *,
                level: float) -> tuple[str, str]:
    """``(result, reason)`` of one ``expect`` claim from the ``level`` (e.g. 0.99) interval ``ci = [lo, hi]`` of its
    improvement (fractions; ``None`` ends: no interval): **met** when the whole interval satisfies the bounds
    (``lo >= at_least``, ``hi <= at_most``), **not met** when it excludes them (``hi < at_least`` or
    ``lo > at_most``), else **cannot judge** (the interval holds a bound: more runs would tell). The test of each
    bound is the interval's one-sided test at ``(1 - level) / 2``; the report and the gate both judge by it."""
    lo, hi = (list(ci) + [None, None])[:2]
    if lo is None or hi is None:
        return CANNOT_JUDGE, ("no interval: one run per cell gives no run-to-run variance to judge the claim "
                              "against (add repeats)")
    span = f"{level:.0%} interval [{lo:+.1%}, {hi:+.1%}]"
    if (at_least is not None and hi < at_least) or (at_most is not None and lo > at_most):
        return "not met", f"the {span} lies outside the claim"
    if (at_least is None or lo >= at_least) and (at_most is None or hi <= at_most):
        return "met", ""
    bounds = " and ".join(f"{w} {b:+.0%}" for w, b in (("at least", at_least), ("at most", at_most)) if b is not None)
    return CANNOT_JUDGE, f"the {span} holds the claim's bound ({bounds}): more runs (repeats) would tell"


@dataclass(frozen=True)
class Outcome:
    """A gate's outcome (:func:`gate_outcome`): ``counts`` per row verdict (:data:`ROW_VERDICTS`), ``verdict``
    (``regression`` | ``cannot judge`` | ``pass``) and its ``exit_code``."""

    counts: dict[str, int]
    verdict: str
    exit_code: int


def gate_outcome(rows: Iterable[str], claims: Iterable[str] = (), *, empty: str = "pass") -> Outcome:
    """A gate's verdict from its rows' verdicts and its claims' results: a regression or a failed row, or a claim
    not met, fails it (exit 1); else a row that cannot be judged or is too noisy, or a claim that cannot be judged,
    makes it "cannot judge" (exit 3); else it passes (exit 0). ``empty``: the verdict without any row or claim
    (``pass`` for a gate of claims alone, ``cannot judge`` for the interleaved gate, whose cells are its family)."""
    rows, claims = list(rows), list(claims)
    counts = {v: sum(r == v for r in rows) for v in ROW_VERDICTS}
    if counts["regression"] or counts["failed"] or "not met" in claims:
        return Outcome(counts, "regression", EXIT_REGRESSION)
    if counts[CANNOT_JUDGE] or counts["noisy"] or CANNOT_JUDGE in claims or (not rows and not claims
                                                                           and empty == CANNOT_JUDGE):
        return Outcome(counts, CANNOT_JUDGE, EXIT_CANNOT_JUDGE)
    return Outcome(counts, "pass", EXIT_PASS)
