"""Statistics shared by the gate and the report: pure functions on numbers, no files, no MLflow.

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
      spread); with fewer than 4 repeats also the steps within each drawn repeat (:func:`_boot_draw`).
    * :func:`verdict`: regression / improvement only when the change passes the threshold AND p < alpha.

Effects (report): :func:`fit_effects`
    OLS (statsmodels) of one value per *run* (the report passes the log of the run's median timed
    step) on +-1 coded two-level factors (dummy coded for factors with more levels) with every
    estimable two-factor interaction, plus the time block as a fixed factor when the sweep ran in
    blocks; a term's effect is ``2 x coefficient`` (the change of log step time from the low to the
    high level). The run is the unit of replication: steps of one run share its start-up, placement
    and machine state (pseudo-replicates, Hurlbert 1984, *Ecol. Monogr.* 54:187), so they are
    summarized into the run's value before any test, and intervals and p values carry the run-to-run
    variance with ``runs - parameters`` degrees of freedom. This is the standard analysis of a
    randomized complete block design (Montgomery, *Design and Analysis of Experiments*, 9th ed., ch. 4
    and 5) on run summaries; for balanced data it gives the same fixed-effect tests as a mixed model
    with a random intercept per run fitted to the steps (Searle, Casella & McCulloch 1992, sec. 4.3),
    without the convergence trouble of a mixed model on 2-3 runs per cell. p values are also given
    Holm-adjusted over the model's terms (``p_adjusted``; a term is significant when it is below alpha).
    Columns that are linearly dependent on earlier ones (aliased in a fractional design, or not
    estimable in a one-at-a-time design, or confounded with a block) are dropped and reported with
    what they are aliased with. With one run per cell (``replicated=False``) no run-to-run variance
    can be estimated: the terms keep their estimates, without interval or p value.

Cell comparisons (report): :func:`cell_means_residual`, :func:`run_contrast`
    The residual SD of the cell-means model (one mean per cell, plus the block) of the run values,
    and the t interval and p value of the difference between two cells' mean log run values with it.

Noise and minimal detectable effect: :func:`noise_components`, :func:`mde_from_se`
    Within-run and between-run spread of log step time (one-way ANOVA per cell); the smallest true
    change found with the given power at the given alpha from a standard error (normal approximation
    on the log scale), optionally under the gate's threshold as well.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np
from scipy import stats as sps

#: default bootstrap resamples for confidence intervals
N_BOOT = 2000
#: default significance level of the gate and the report (intervals at ``1 - alpha``)
DEFAULT_ALPHA = 0.01


def _arr(values: Sequence[float]) -> np.ndarray:
    a = np.asarray([float(v) for v in values if v is not None], dtype=float)
    return a[np.isfinite(a)]


def hl_shift(base: np.ndarray, cand: np.ndarray) -> float:
    """Hodges-Lehmann two-sample shift: median of all pairwise differences ``cand_j - base_i``."""
    return float(np.median(np.subtract.outer(cand, base)))


def mannwhitney_p(base: np.ndarray, cand: np.ndarray) -> float:
    """Two-sided Mann-Whitney U p value (1.0 when a side has no sample or all values are equal).

    Exact distribution when there are no ties (and at most 400 samples), else the normal
    approximation with tie correction.
    """
    if len(base) == 0 or len(cand) == 0:
        return 1.0
    if np.ptp(np.concatenate([base, cand])) == 0:
        return 1.0
    both = np.concatenate([base, cand])
    exact = len(np.unique(both)) == len(both) and len(both) <= 400
    return float(sps.mannwhitneyu(cand, base, alternative="two-sided", method="exact" if exact else "asymptotic").pvalue)


def min_attainable_p(n: int, m: int) -> float:
    """Smallest two-sided exact Mann-Whitney p value with ``n`` and ``m`` samples: ``2 / C(n+m, n)``.

    When it is not below alpha the test can never be significant, whatever the data.
    """
    if n <= 0 or m <= 0:
        return 1.0
    return min(1.0, 2.0 / math.comb(n + m, n))


def min_samples_for(alpha: float) -> int:
    """Smallest equal sample count ``k`` per side for which ``min_attainable_p(k, k) < alpha``."""
    k = 1
    while min_attainable_p(k, k) >= alpha and k < 1000:
        k += 1
    return k


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


def _groups(groups: Sequence[Sequence[float]]) -> list[np.ndarray]:
    return [g for g in (_arr(x) for x in groups) if len(g)]


#: from this many repeats on, the bootstrap resamples repeats only (their steps kept as measured)
CLUSTER_BOOT_MIN = 4


def _boot_draw(groups: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """One bootstrap draw of grouped samples: repeats with replacement; with fewer than
    :data:`CLUSTER_BOOT_MIN` repeats also the steps within each drawn repeat.

    Resampling both levels counts the step noise twice (it is already in the spread of the repeats'
    means), which overstates the variance; with few repeats that conservative draw is kept because
    resampling 2-3 repeats alone gives too few distinct draws (Davison & Hinkley 1997, sec. 3.8).
    """
    picks = rng.integers(0, len(groups), size=len(groups))
    if len(groups) >= CLUSTER_BOOT_MIN:
        return np.concatenate([groups[i] for i in picks])
    return np.concatenate([g[rng.integers(0, len(g), size=len(g))] for g in (groups[i] for i in picks)])


def walsh_hl(d: np.ndarray) -> float:
    """One-sample Hodges-Lehmann estimate: median of the Walsh averages ``(d_i + d_j) / 2``, ``i <= j``."""
    i, j = np.triu_indices(len(d))
    return float(np.median((d[i] + d[j]) / 2.0))


def wilcoxon_p(d: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p value of paired differences (1.0 when all are 0)."""
    d = d[d != 0]
    if len(d) == 0:
        return 1.0
    exact = len(np.unique(np.abs(d))) == len(d) and len(d) <= 50
    return float(sps.wilcoxon(d, alternative="two-sided", method="exact" if exact else "approx").pvalue)


class StatTest:
    """A two-sample test of the gate: its ``name``, a ``describe()`` text, the ``estimate`` of the relative
    change, its ``p`` value, the smallest attainable p, a standard error and bootstrap draws.

    Inputs are the per-repeat sample groups of each side (non-empty float arrays), the ``scale``
    (``log``: strictly positive values, change = ``exp(shift of logs) - 1``; ``linear``: shift / baseline
    median) and ``med_b``, the median of all baseline samples. Register a new test with
    :func:`register_test`; the gate looks tests up by name (:func:`get_test`).

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
        """``n_boot`` bootstrap draws of :meth:`estimate` (repeats resampled, :func:`_boot_draw`)."""
        return np.array([self.estimate([_boot_draw(bg, rng)], [_boot_draw(cg, rng)], scale, med_b)
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
            return 1.05 * math.sqrt(float(np.var(np.log(b), ddof=1)) / len(b) + float(np.var(np.log(c), ddof=1)) / len(c))
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
        return np.array([self._stat(_boot_draw(diffs, rng), scale) for _ in range(n_boot)])


#: the registry of two-sample tests, by name
TESTS: dict[str, StatTest] = {}


def register_test(test: StatTest) -> StatTest:
    """Add ``test`` to :data:`TESTS` under ``test.name`` (returns it).

    Raises:
        ValueError: empty name, or the name is taken by another test.
    """
    if not test.name:
        raise ValueError(f"{type(test).__name__} has no name")
    held = TESTS.get(test.name)
    if held is not None and type(held) is not type(test):
        raise ValueError(f"test name {test.name!r} is already registered by {type(held).__name__}")
    TESTS[test.name] = test
    return test


def unregister_test(name: str) -> None:
    """Remove the test called ``name`` (tests that register a toy test undo it with this)."""
    TESTS.pop(name, None)


def get_test(name: str) -> StatTest:
    """The test registered as ``name``.

    Raises:
        KeyError: unknown name.
    """
    return TESTS[name]


UNPAIRED = register_test(MannWhitneyTest()).name
PAIRED = register_test(WilcoxonPairedTest()).name


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
    bg, cg = _groups(base_groups), _groups(cand_groups)
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
    """``regression`` / ``improvement`` when ``|change| > threshold`` in that direction AND ``p < alpha``; else ``unchanged``."""
    if change is None or not p_value < alpha:
        return "unchanged"
    worse = change > threshold if not higher_is_better else change < -threshold
    better = change < -threshold if not higher_is_better else change > threshold
    return "regression" if worse else ("improvement" if better else "unchanged")


# -- effects ------------------------------------------------------------------------------------

@dataclass
class Term:
    """One model term: a main effect or a two-factor interaction, on log step time.

    ``effect`` = 2 x coefficient for +-1 coded terms (1 x coefficient for a dummy-coded level);
    ``change`` = ``exp(effect) - 1``, the relative change of step time from the low to the high level
    (negative = faster); ``ci_*`` at the fit's level.
    """

    name: str
    factors: list[str]
    kind: str  # main | interaction | level
    effect: float
    se: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    change: float
    change_ci_low: float | None
    change_ci_high: float | None
    aliases: list[str] = field(default_factory=list)
    p_adjusted: float | None = None
    significant: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class EffectsFit:
    """Result of :func:`fit_effects`. ``unit``: the unit of replication of one observation (``run``);
    ``n_obs`` observations, ``df_resid`` residual degrees of freedom, ``n_blocks`` blocks in the model
    (0: no block factor); ``replicated``: whether run-to-run variance could be estimated (else no
    interval and no p value); ``note``: why not."""

    terms: list[Term]
    not_estimable: dict[str, str]
    residual_sd: float | None
    df_resid: float
    n_obs: int
    n_cells: int
    level: float
    coding: dict[str, str]
    unit: str = "run"
    n_blocks: int = 0
    replicated: bool = True
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"terms": [t.to_dict() for t in self.terms], "not_estimable": self.not_estimable,
                "residual_sd": self.residual_sd, "df_resid": self.df_resid, "n_obs": self.n_obs,
                "n_cells": self.n_cells, "level": self.level, "coding": self.coding, "unit": self.unit,
                "n_blocks": self.n_blocks, "replicated": self.replicated, "note": self.note}


def _columns(levels_of_obs: list[dict[str, Any]], factors: list[str], interactions: bool
             ) -> tuple[list[str], list[list[str]], list[str], np.ndarray, dict[str, str]]:
    """Candidate model columns (names, factor lists, kinds, matrix) in order: mains, then interactions."""
    names: list[str] = []
    fl: list[list[str]] = []
    kinds: list[str] = []
    cols: list[np.ndarray] = []
    coding: dict[str, str] = {}
    two_level: list[str] = []
    for f in factors:
        vals = sorted({o[f] for o in levels_of_obs})
        x = np.array([o[f] for o in levels_of_obs], dtype=float)
        if len(vals) == 2:
            lo, hi = vals
            names.append(f)
            fl.append([f])
            kinds.append("main")
            cols.append(np.where(x == hi, 1.0, -1.0))
            coding[f] = f"+-1 ({lo} -> -1, {hi} -> +1); effect = 2 x coefficient"
            two_level.append(f)
        else:
            coding[f] = f"dummy vs level {vals[0]} ({', '.join(map(str, vals[1:]))}); effect = coefficient; no interactions"
            for v in vals[1:]:
                names.append(f"{f}={v}")
                fl.append([f])
                kinds.append("level")
                cols.append((x == v).astype(float))
    if interactions:
        for a, b in itertools.combinations(two_level, 2):
            ia, ib = names.index(a), names.index(b)
            names.append(f"{a}:{b}")
            fl.append([a, b])
            kinds.append("interaction")
            cols.append(cols[ia] * cols[ib])
    mat = np.column_stack(cols) if cols else np.zeros((len(levels_of_obs), 0))
    return names, fl, kinds, mat, coding


def _block_columns(blocks: Sequence[Any]) -> tuple[list[str], np.ndarray]:
    """Dummy columns of a block factor (first block = reference)."""
    vals = sorted(set(blocks), key=str)
    b = list(blocks)
    cols = [np.array([1.0 if x == v else 0.0 for x in b]) for v in vals[1:]]
    return [f"block={v}" for v in vals[1:]], (np.column_stack(cols) if cols else np.zeros((len(b), 0)))


def fit_effects(levels_of_obs: list[dict[str, Any]], y: Sequence[float], factors: list[str], *,
                alpha: float = 0.05, interactions: bool = True, blocks: Sequence[Any] | None = None,
                unit: str = "run", replicated: bool = True) -> EffectsFit:
    """OLS of ``y`` (one value per unit of replication, e.g. a run's log median step time) on the factors,
    their two-factor interactions and, when given, the block factor (see the module text for the method).

    Args:
        levels_of_obs: per observation, the factor levels of its cell.
        y: per observation, the response (log scale: effects are changes of log step time).
        factors: the varied factors (at least two distinct levels each among the observations).
        alpha: the intervals are at ``1 - alpha``; a term is significant when its Holm-adjusted p < alpha.
        interactions: include two-factor interactions of the two-level factors.
        blocks: per observation, its block (the time block of a blocked sweep); ``None`` = no block factor.
        unit: what one observation is (stated in the report).
        replicated: ``False`` when each cell has one observation: the residual is then not a run-to-run
            variance, so no interval and no p value are given.

    Columns are added greedily (intercept, blocks, main effects, interactions); one that does not raise
    the rank of the design is *not estimable*: its alias (a kept column equal to +-it) is named when
    there is one.

    Raises:
        ValueError: fewer observations than model terms.
    """
    import statsmodels.api as sm
    from statsmodels.stats.multitest import multipletests

    y = np.asarray(y, dtype=float)
    names, fl, kinds, mat, coding = _columns(levels_of_obs, factors, interactions)
    keep: list[int] = []
    not_est: dict[str, str] = {}
    alias_of: dict[int, list[str]] = {}
    base = np.ones((len(y), 1))
    n_blocks = 0
    if blocks is not None and len(set(blocks)) > 1:
        _, bcols = _block_columns(blocks)
        base = np.column_stack([base, bcols])
        n_blocks = len(set(blocks))
    cur = base
    rank = np.linalg.matrix_rank(base)
    for j in range(mat.shape[1]):
        trial = np.column_stack([cur, mat[:, j]])
        r = np.linalg.matrix_rank(trial)
        if r > rank:
            keep.append(j)
            cur, rank = trial, r
            continue
        twin = next((k for k in keep if np.allclose(mat[:, k], mat[:, j]) or np.allclose(mat[:, k], -mat[:, j])), None)
        if twin is not None:
            sign = "" if np.allclose(mat[:, twin], mat[:, j]) else "-"
            not_est[names[j]] = f"aliased with {sign}{names[twin]}"
            alias_of.setdefault(twin, []).append(f"{sign}{names[j]}")
        elif np.allclose(mat[:, j], mat[:, j][0]):
            not_est[names[j]] = "constant in this design (aliased with the intercept)"
        elif n_blocks and np.linalg.matrix_rank(np.column_stack([base, mat[:, j]])) == np.linalg.matrix_rank(base):
            not_est[names[j]] = "confounded with the time blocks"
        else:
            not_est[names[j]] = "not estimable: a linear combination of the terms already in the model"
    X = np.column_stack([base] + [mat[:, k] for k in keep]) if keep else base
    n_cells = len({tuple(sorted(o.items(), key=lambda kv: kv[0])) for o in levels_of_obs})
    if len(y) < X.shape[1] or (replicated and len(y) == X.shape[1]):
        raise ValueError(f"{len(y)} observations ({unit}s) for {X.shape[1]} model parameters: add repeats")
    if replicated:
        res = sm.OLS(y, X).fit()
        ci = np.asarray(res.conf_int(alpha))
        params, df_resid = res.params, float(res.df_resid)
    else:  # estimates only (a saturated model has no residual)
        params = np.linalg.lstsq(X, y, rcond=None)[0]
        df_resid = float(len(y) - np.linalg.matrix_rank(X))
    first = base.shape[1]
    note = ""
    if not replicated:
        note = (f"one {unit} per cell: no {unit}-to-{unit} variance can be estimated, so the effects below have no "
                "interval and no p value (add repeats to judge them)")
    terms = []
    for pos, k in enumerate(keep, start=first):
        mult = 2.0 if kinds[k] in ("main", "interaction") else 1.0
        eff = mult * float(params[pos])
        if replicated:
            se, lo, hi = mult * float(res.bse[pos]), mult * float(ci[pos, 0]), mult * float(ci[pos, 1])
            p = float(res.pvalues[pos])
            terms.append(Term(name=names[k], factors=fl[k], kind=kinds[k], effect=eff, se=se, ci_low=lo, ci_high=hi,
                              p_value=p, change=math.expm1(eff), change_ci_low=math.expm1(lo),
                              change_ci_high=math.expm1(hi), aliases=alias_of.get(k, [])))
        else:
            terms.append(Term(name=names[k], factors=fl[k], kind=kinds[k], effect=eff, se=None, ci_low=None,
                              ci_high=None, p_value=None, change=math.expm1(eff), change_ci_low=None,
                              change_ci_high=None, aliases=alias_of.get(k, [])))
    ps = [t.p_value for t in terms if t.p_value is not None and math.isfinite(t.p_value)]
    if ps:
        adj = iter(multipletests(ps, alpha=alpha, method="holm")[1])
        for t in terms:
            if t.p_value is not None and math.isfinite(t.p_value):
                t.p_adjusted = float(next(adj))
                t.significant = t.p_adjusted < alpha
    sd = float(math.sqrt(res.scale)) if replicated and df_resid > 0 else None
    return EffectsFit(terms=terms, not_estimable=not_est, residual_sd=sd, df_resid=df_resid,
                      n_obs=len(y), n_cells=n_cells, level=1 - alpha, coding=coding, unit=unit, n_blocks=n_blocks,
                      replicated=replicated, note=note)


def cell_means_residual(cells: Sequence[Sequence[tuple[Any, float]]], *, blocked: bool) -> tuple[float | None, int]:
    """Residual SD and degrees of freedom of the cell-means model of per-run values.

    ``cells``: per cell, its runs as ``(block, value)`` (value on the analysis scale, e.g. log seconds).
    Model: one mean per cell, plus a fixed block effect when ``blocked`` (randomized complete block
    design; Montgomery 9th ed., sec. 4.1). Returns ``(None, 0)`` when no degree of freedom is left
    (one run per cell).
    """
    y = np.array([v for c in cells for _, v in c], dtype=float)
    if len(y) == 0:
        return None, 0
    cols = [np.array([1.0 if i == j else 0.0 for j, c in enumerate(cells) for _ in c]) for i in range(len(cells))]
    X = np.column_stack([c for c in cols if c.any()])
    if blocked:
        _, bcols = _block_columns([b for c in cells for b, _ in c])
        X = np.column_stack([X, bcols])
    rank = np.linalg.matrix_rank(X)
    df = len(y) - rank
    if df <= 0:
        return None, 0
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ beta
    return float(math.sqrt(float(resid @ resid) / df)), int(df)


@dataclass
class Contrast:
    """Difference of two cells' mean run values (cell - reference, analysis scale) with its t interval."""

    diff: float
    se: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    df: int
    n_ref: int
    n_cell: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_contrast(ref: Sequence[float], cell: Sequence[float], resid_sd: float | None, df: int, *,
                 alpha: float = 0.05) -> Contrast:
    """``mean(cell) - mean(ref)`` of per-run values with a two-sided t interval and p value from the
    pooled residual SD of the cell-means model (:func:`cell_means_residual`): ``se = sd * sqrt(1/n_ref +
    1/n_cell)`` on ``df`` degrees of freedom (Montgomery 9th ed., sec. 3.5). No interval and no p value
    when ``resid_sd`` is ``None`` (no run-to-run variance estimated).

    Raises:
        ValueError: a side without runs.
    """
    r, c = np.asarray(ref, float), np.asarray(cell, float)
    if not len(r) or not len(c):
        raise ValueError("run_contrast needs at least one run per side")
    diff = float(c.mean() - r.mean())
    if resid_sd is None or df <= 0:
        return Contrast(diff, None, None, None, None, df, len(r), len(c))
    se = resid_sd * math.sqrt(1.0 / len(r) + 1.0 / len(c))
    tq = float(sps.t.ppf(1 - alpha / 2, df))
    p = float(2 * sps.t.sf(abs(diff) / se, df)) if se > 0 else (1.0 if diff == 0 else 0.0)
    return Contrast(diff, se, diff - tq * se, diff + tq * se, p, df, len(r), len(c))


# -- minimal detectable effect ----------------------------------------------------------------

def mde_from_se(se: float, *, alpha: float, power: float = 0.8, threshold: float = 0.0) -> float:
    """Smallest true relative change detected with probability ``power`` given the log-scale SE.

    Two-sided test at ``alpha`` (normal approximation); with a ``threshold`` the estimate must also
    exceed it (the gate's rule).
    """
    zp = sps.norm.ppf(power)
    d = (sps.norm.ppf(1 - alpha / 2) + zp) * se
    if threshold:
        d = max(d, math.log1p(threshold) + zp * se)
    return math.expm1(d)


@dataclass
class Noise:
    """Noise of log step time: ``sd_step`` within a run, ``sd_run`` between runs of one cell (beyond
    what ``sd_step`` explains), ``steps_per_run`` (mean), ``runs_per_cell`` (mean)."""

    sd_step: float | None
    sd_run: float | None
    steps_per_run: float
    runs_per_cell: float

    def run_mean_sd(self) -> float | None:
        """SD of one run's mean log step time: ``sqrt(sd_run^2 + sd_step^2 / steps_per_run)``."""
        if self.sd_step is None:
            return None
        return math.sqrt((self.sd_run or 0.0) ** 2 + self.sd_step ** 2 / max(self.steps_per_run, 1.0))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "run_mean_sd": self.run_mean_sd()}


def noise_components(cells: Sequence[Sequence[Sequence[float]]]) -> Noise:
    """Split the noise of log step time into within-run and between-run parts (one-way ANOVA per cell).

    ``cells``: per cell, per run, the step samples (seconds). ``sd_run`` is estimated from cells with
    at least two runs: variance of run means minus ``sd_step^2 / k`` (floored at 0).
    """
    ss_w, df_w = 0.0, 0
    between: list[float] = []
    ks: list[int] = []
    rs: list[int] = []
    for runs in cells:
        logs = [np.log(a[a > 0]) for a in (_arr(r) for r in runs)]
        logs = [x for x in logs if len(x)]
        if not logs:
            continue
        rs.append(len(logs))
        for x in logs:
            ks.append(len(x))
            if len(x) > 1:
                ss_w += float(np.sum((x - x.mean()) ** 2))
                df_w += len(x) - 1
        if len(logs) > 1:
            means = np.array([x.mean() for x in logs])
            between.append(float(np.var(means, ddof=1)))
    sd_step = math.sqrt(ss_w / df_w) if df_w else None
    k = float(np.mean(ks)) if ks else 1.0
    sd_run = None
    if between and sd_step is not None:
        sd_run = math.sqrt(max(0.0, float(np.mean(between)) - sd_step ** 2 / k))
    return Noise(sd_step=sd_step, sd_run=sd_run, steps_per_run=k, runs_per_cell=float(np.mean(rs)) if rs else 0.0)
