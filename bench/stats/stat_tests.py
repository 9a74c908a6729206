"""The two-sample tests of the gate as registered objects, and the comparison built on them.

Two-sample comparison (gate, per-cell speedups of the report): :func:`compare`
    ``base`` and ``cand`` are per-step samples grouped by repeat (one array per run).

    * **unpaired** (default): relative change ``exp(HL) - 1`` where ``HL`` is the Hodges-Lehmann
      shift of the log values, the median of all pairwise differences ``log(c_j) - log(b_i)`` (the
      estimator that goes with the Mann-Whitney U test; robust to an outlying step); p value: two-sided
      Mann-Whitney U (``scipy.stats.mannwhitneyu``, exact distribution when there are no ties) on
      the pooled step samples of all repeats.
    * **paired** (``paired=True``: the groups align sample by sample, i.e. the same steps did the same
      work on both sides): the per-step log ratios ``d``; change ``exp(HL1(d)) - 1`` with ``HL1`` the
      one-sample Hodges-Lehmann estimate (median of the Walsh averages); p value: two-sided Wilcoxon
      signed-rank (``scipy.stats.wilcoxon``).
    * For metrics that can be 0 (ratios such as the Free ratio) the shift is taken on the raw values
      and divided by the baseline median.
    * **confidence interval** of the relative change at level ``1 - alpha``: percentile bootstrap that
      resamples *repeats* (so the run-to-run spread widens the interval, not only the step-to-step
      spread); with fewer than 4 repeats also the steps within each drawn repeat (:func:`boot_draw`).
    * :func:`verdict`: regression / improvement only when the change passes the threshold AND p < alpha.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from bench.core.plugins import Registry
from bench.stats.decide import Evidence, decide_change
from bench.stats.estimators import (
    N_BOOT,
    boot_draw,
    hl_shift,
    mannwhitney_p,
    min_attainable_p,
    sample_groups,
    walsh_hl,
    wilcoxon_p,
)


@dataclass
class Comparison:
    """Candidate vs baseline for one metric. ``change`` = relative change of the candidate (+0.1 = 10 % higher).

    ``ci_low``/``ci_high``: bootstrap interval of ``change`` at ``level`` (``None`` when not computed);
    ``p_value``: two-sided Mann-Whitney U (or Wilcoxon signed-rank when paired, see ``test``);
    ``min_p``: the smallest p these sample counts allow; ``se``: standard error of the log shift from
    the step samples (normal approximation x 1.05 for the rank tests' efficiency; log scale only);
    ``se_boot``: the same read off the bootstrap distribution (SD of the log change over the
    resamples), which also carries the spread between repeats when there are two or more.
    """

    n_base: int
    n_cand: int
    runs_base: int
    runs_cand: int
    base_median: float | None
    cand_median: float | None
    change: float | None
    ci_low: float | None
    ci_high: float | None
    level: float
    p_value: float
    min_p: float
    scale: str = "log"
    test: str = "mann-whitney u"
    se: float | None = None
    se_boot: float | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

class StatTest:
    """A two-sample test of the gate: its ``name``, a ``describe()`` text, the ``estimate`` of the relative
    change, its ``p`` value, the smallest attainable p, a standard error and bootstrap draws.

    Inputs are the per-repeat sample groups of each side (non-empty float arrays), the ``scale``
    (``log``: strictly positive values, change = ``exp(shift of logs) - 1``; ``linear``: shift / baseline
    median) and ``med_b``, the median of all baseline samples. A new test is one module with a
    subclass and one entry point line (``grpo_bench.stat_tests``); the gate looks tests up by name (:func:`get_test`).

    Attributes:
        name: the registry key, written into every comparison (``Comparison.test``).
        label: short name for summaries (``mann-whitney u``).
        paired: the test needs groups aligned sample by sample (same repeats, same steps); with unaligned
            groups :func:`compare` falls back to :data:`UNPAIRED`.
    """

    name: str = ""
    label: str = ""
    paired: bool = False

    def describe(self) -> str:
        """One line for reports: the test and its sidedness, e.g. ``mann-whitney u (two-sided)``."""
        return f"{self.label} (two-sided)"

    def estimate(self, bg: list[np.ndarray], cg: list[np.ndarray], scale: str, med_b: float) -> float:
        """Relative change of the candidate (+0.1 = 10 % higher); NaN when undefined."""
        raise NotImplementedError

    def p(self, bg: list[np.ndarray], cg: list[np.ndarray], scale: str, med_b: float) -> float:
        """Two-sided p value of "no change"."""
        raise NotImplementedError

    def min_p(self, bg: list[np.ndarray], cg: list[np.ndarray]) -> float:
        """The smallest p these sample counts allow (when not below alpha the test can never be significant)."""
        return min_attainable_p(sum(map(len, bg)), sum(map(len, cg)))

    def se(self, bg: list[np.ndarray], cg: list[np.ndarray], scale: str, med_b: float) -> float | None:
        """Standard error of the log shift (log scale only), or ``None``."""
        return None

    def bootstrap(self, bg: list[np.ndarray], cg: list[np.ndarray], scale: str, med_b: float,
                  rng: np.random.Generator, n_boot: int) -> np.ndarray:
        """``n_boot`` bootstrap draws of :meth:`estimate` (repeats resampled, :func:`boot_draw`)."""
        return np.array([self.estimate([boot_draw(bg, rng)], [boot_draw(cg, rng)], scale, med_b)
                         for _ in range(n_boot)])


class MannWhitneyTest(StatTest):
    """Unpaired: Hodges-Lehmann two-sample shift of the (log) samples; two-sided Mann-Whitney U on the
    pooled samples of all repeats (exact without ties)."""

    name = label = "mann-whitney u"

    def estimate(self, bg, cg, scale, med_b):
        bb, cc = np.concatenate(bg), np.concatenate(cg)
        if scale == "log":
            return math.expm1(hl_shift(np.log(bb), np.log(cc)))
        med = float(np.median(bb))
        return hl_shift(bb, cc) / med if med != 0 else math.nan

    def p(self, bg, cg, scale, med_b):
        return mannwhitney_p(np.concatenate(bg), np.concatenate(cg))

    def se(self, bg, cg, scale, med_b):
        b, c = np.concatenate(bg), np.concatenate(cg)
        if scale == "log" and len(b) > 1 and len(c) > 1:
            return 1.05 * math.sqrt(
                float(np.var(np.log(b), ddof=1)) / len(b) + float(np.var(np.log(c), ddof=1)) / len(c)
            )
        return None


class WilcoxonPairedTest(StatTest):
    """Paired by repeat and step: one-sample Hodges-Lehmann (median of the Walsh averages) of the per-step
    (log) differences; two-sided Wilcoxon signed-rank; the bootstrap resamples repeats of the differences."""

    name = "wilcoxon signed-rank (paired by repeat and step)"
    label = "wilcoxon signed-rank"
    paired = True

    @staticmethod
    def _diffs(bg, cg, scale, med_b) -> list[np.ndarray]:
        return [np.log(y) - np.log(x) if scale == "log" else (y - x) / (med_b or math.nan) for x, y in zip(bg, cg)]

    @staticmethod
    def _stat(d: np.ndarray, scale: str) -> float:
        return math.expm1(walsh_hl(d)) if scale == "log" else walsh_hl(d)

    def estimate(self, bg, cg, scale, med_b):
        return self._stat(np.concatenate(self._diffs(bg, cg, scale, med_b)), scale)

    def p(self, bg, cg, scale, med_b):
        return wilcoxon_p(np.concatenate(self._diffs(bg, cg, scale, med_b)))

    def min_p(self, bg, cg):
        return min(1.0, 2.0 / 2.0 ** sum(map(len, bg)))

    def se(self, bg, cg, scale, med_b):
        d = np.concatenate(self._diffs(bg, cg, scale, med_b))
        return 1.05 * float(np.std(d, ddof=1)) / math.sqrt(len(d)) if scale == "log" and len(d) > 1 else None

    def bootstrap(self, bg, cg, scale, med_b, rng, n_boot):
        diffs = self._diffs(bg, cg, scale, med_b)
        return np.array([self._stat(boot_draw(diffs, rng), scale) for _ in range(n_boot)])


GROUP = "grpo_bench.stat_tests"
#: the two-sample tests by name, on :class:`bench.core.plugins.Registry` (entry-point classes are instantiated)
REGISTRY: Registry[StatTest] = Registry(GROUP, "test", lambda t: t.name)


def tests() -> dict[str, StatTest]:
    """The registered two-sample tests by name: entry points first (``grpo_bench.stat_tests``,
    :mod:`bench.core.plugins`: the built-ins, then plugins), then :func:`register_test` calls. Read it, do not change
    it."""
    return REGISTRY.items()


def register_test(test: StatTest) -> StatTest:
    """Add ``test`` under ``test.name`` (returns it); seen by every later lookup whenever it is called.

    Raises:
        ValueError: empty name, or the name is taken by another test.
    """
    return REGISTRY.register(test)


def unregister_test(name: str) -> None:
    """Remove the test called ``name`` (tests that register a toy test undo it with this)."""
    REGISTRY.unregister(name)


def get_test(name: str) -> StatTest:
    """The test registered as ``name``.

    Raises:
        KeyError: unknown name.
    """
    return REGISTRY.get(name)


#: the registry of two-sample tests by name, live (kept for ``from ... import TESTS``; :func:`tests` is the lookup)
TESTS: Mapping[str, StatTest] = REGISTRY.view("TESTS")
UNPAIRED = MannWhitneyTest.name
PAIRED = WilcoxonPairedTest.name


def compare(base_groups: Sequence[Sequence[float]], cand_groups: Sequence[Sequence[float]], *,
            alpha: float = 0.01, n_boot: int = N_BOOT, seed: int = 0, scale: str = "log",
            ci: bool = True, paired: bool = False, test: str | None = None) -> Comparison:
    """Compare candidate samples with baseline samples (each grouped by repeat).

    Args:
        base_groups / cand_groups: per repeat, the per-step samples of the metric.
        alpha: significance level; the interval is at ``1 - alpha``.
        n_boot: bootstrap resamples (0 or ``ci=False``: no interval).
        seed: bootstrap seed (results are reproducible).
        scale: ``log`` (strictly positive metrics: shift of logs) or ``linear`` (shift / baseline median).
        paired: the groups are aligned sample by sample (same repeats, same steps, same work in each
            step): compare the per-step differences (one-sample Hodges-Lehmann, Wilcoxon signed-rank,
            bootstrap over repeats of the differences). Unaligned groups fall back to unpaired.
        test: name of a registered test (:data:`TESTS`) to use instead of the default one; a paired test
            is used only when the groups align, else :data:`UNPAIRED`.

    Raises:
        KeyError: ``test`` is not registered.
    """
    bg, cg = sample_groups(base_groups), sample_groups(cand_groups)
    chosen = get_test(test) if test is not None else get_test(PAIRED if paired else UNPAIRED)
    if chosen.paired and (len(bg) != len(cg) or any(len(x) != len(y) for x, y in zip(bg, cg)) or not bg):
        chosen = get_test(UNPAIRED)
    b = np.concatenate(bg) if bg else np.array([])
    c = np.concatenate(cg) if cg else np.array([])
    out = Comparison(n_base=len(b), n_cand=len(c), runs_base=len(bg), runs_cand=len(cg),
                     base_median=float(np.median(b)) if len(b) else None,
                     cand_median=float(np.median(c)) if len(c) else None,
                     change=None, ci_low=None, ci_high=None, level=1 - alpha,
                     p_value=1.0, min_p=min_attainable_p(len(b), len(c)), scale=scale)
    if not len(b) or not len(c):
        return out
    if len(b) < 2 or len(c) < 2:
        ci = False  # a bootstrap of one sample says nothing
    if scale == "log" and (np.any(b <= 0) or np.any(c <= 0)):
        scale = out.scale = "linear"
        out.notes.append("non-positive values: relative change taken on the linear scale")
    med_b = float(np.median(b))
    draws = np.array([])
    out.test = chosen.name
    out.p_value = chosen.p(bg, cg, scale, med_b)
    out.min_p = chosen.min_p(bg, cg)
    out.change = chosen.estimate(bg, cg, scale, med_b)
    out.se = chosen.se(bg, cg, scale, med_b)
    if ci and n_boot > 0 and math.isfinite(out.change):
        draws = chosen.bootstrap(bg, cg, scale, med_b, np.random.default_rng(seed), n_boot)
        draws = draws[np.isfinite(draws)]
        if len(draws):
            lo, hi = np.percentile(draws, [100 * alpha / 2, 100 * (1 - alpha / 2)])
            out.ci_low, out.ci_high = float(lo), float(hi)
    if not math.isfinite(out.change):
        out.change = None
        out.notes.append("baseline median is 0: relative change undefined")
    elif scale == "log" and out.ci_low is not None and len(draws) > 1 and np.all(draws > -1):
        # SD of the bootstrap distribution of the log change: with two or more repeats it carries the
        # run-to-run spread (steadier than the 1-alpha percentile width, which rests on a few tail draws)
        out.se_boot = float(np.std(np.log1p(draws), ddof=1))
    return out


def describe_tests(pairing: bool, test: str | None = None) -> str:
    """The test(s) a comparison uses, in one line: the named ``test``, or with ``pairing`` the paired test
    where the steps pair up and the unpaired one elsewhere.

    Raises:
        KeyError: ``test`` is not registered.
    """
    if test is not None:
        return get_test(test).describe()
    if pairing:
        return f"{get_test(PAIRED).label} when the steps pair up, else {get_test(UNPAIRED).describe()}"
    return get_test(UNPAIRED).describe()


def verdict(change: float | None, p_value: float, *, threshold: float, alpha: float,
            higher_is_better: bool = False) -> str:
    """``regression`` / ``improvement`` when ``|change| > threshold`` in that direction AND ``p < alpha``;
    else ``unchanged`` (the per-step diagnostic's rule: :func:`bench.stats.decide.decide_change` without an interval
    or a power rule; ``change`` relative)."""
    if change is None:
        return "unchanged"
    worse = -change if higher_is_better else change
    return decide_change(Evidence(estimate=worse, threshold=threshold, alpha=alpha, p_value=p_value,
                                  scale="relative")).verdict
