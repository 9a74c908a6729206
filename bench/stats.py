"""Statistics shared by the gate and the report: pure functions on numbers, no files, no MLflow.

Two-sample comparison (gate, per-cell speedups of the report)
    ``base`` and ``cand`` are per-step samples grouped by repeat (one array per run).

    * **relative change** ``exp(HL) - 1`` where ``HL`` is the Hodges-Lehmann shift of the log values:
      the median of all pairwise differences ``log(c_j) - log(b_i)`` (the estimator that goes with the
      Mann-Whitney U test; robust to an outlying step). For metrics that can be 0 (ratios such as the
      Free ratio) the shift is taken on the raw values and divided by the baseline median.
    * **p value**: two-sided Mann-Whitney U (``scipy.stats.mannwhitneyu``, exact for small samples
      without ties) on the pooled step samples of all repeats.
    * **confidence interval** of the relative change at level ``1 - alpha``: percentile bootstrap that
      resamples *repeats* first and then steps within each drawn repeat (a two-level bootstrap, so the
      run-to-run spread widens the interval, not only the step-to-step spread).

Effects (report)
    :func:`fit_effects`: OLS (statsmodels) of log step time on +-1 coded two-level factors (dummy
    coded for factors with more levels) with every estimable two-factor interaction; a term's effect
    is ``2 x coefficient`` (the change of log step time from the low to the high level). Columns that
    are linearly dependent on earlier ones (aliased in a fractional design, or not estimable in a
    one-at-a-time design) are dropped and reported with what they are aliased with.

Minimal detectable effect
    :func:`mde_two_sample` and :func:`mde_effect`: the smallest true change detected with the given
    power at the given alpha, from the measured noise (normal approximation on the log scale).
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


def _arr(values: Sequence[float]) -> np.ndarray:
    a = np.asarray([float(v) for v in values if v is not None], dtype=float)
    return a[np.isfinite(a)]


def hl_shift(base: np.ndarray, cand: np.ndarray) -> float:
    """Hodges-Lehmann two-sample shift: median of all pairwise differences ``cand_j - base_i``."""
    return float(np.median(np.subtract.outer(cand, base)))


def mannwhitney_p(base: np.ndarray, cand: np.ndarray) -> float:
    """Two-sided Mann-Whitney U p value (1.0 when a side has no sample or all values are equal)."""
    if len(base) == 0 or len(cand) == 0:
        return 1.0
    if np.ptp(np.concatenate([base, cand])) == 0:
        return 1.0
    return float(sps.mannwhitneyu(cand, base, alternative="two-sided").pvalue)


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
    ``p_value``: two-sided Mann-Whitney U; ``min_p``: the smallest p these sample counts allow.
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
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _groups(groups: Sequence[Sequence[float]]) -> list[np.ndarray]:
    return [g for g in (_arr(x) for x in groups) if len(g)]


def _boot_draw(groups: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """One two-level bootstrap draw: repeats with replacement, then steps within each drawn repeat."""
    picks = rng.integers(0, len(groups), size=len(groups))
    return np.concatenate([g[rng.integers(0, len(g), size=len(g))] for g in (groups[i] for i in picks)])


def compare(base_groups: Sequence[Sequence[float]], cand_groups: Sequence[Sequence[float]], *,
            alpha: float = 0.01, n_boot: int = N_BOOT, seed: int = 0, scale: str = "log",
            ci: bool = True) -> Comparison:
    """Compare candidate samples with baseline samples (each grouped by repeat).

    Args:
        base_groups / cand_groups: per repeat, the per-step samples of the metric.
        alpha: significance level; the interval is at ``1 - alpha``.
        n_boot: bootstrap resamples (0 or ``ci=False``: no interval).
        seed: bootstrap seed (results are reproducible).
        scale: ``log`` (strictly positive metrics: shift of logs) or ``linear`` (shift / baseline median).
    """
    bg, cg = _groups(base_groups), _groups(cand_groups)
    b = np.concatenate(bg) if bg else np.array([])
    c = np.concatenate(cg) if cg else np.array([])
    out = Comparison(n_base=len(b), n_cand=len(c), runs_base=len(bg), runs_cand=len(cg),
                     base_median=float(np.median(b)) if len(b) else None,
                     cand_median=float(np.median(c)) if len(c) else None,
                     change=None, ci_low=None, ci_high=None, level=1 - alpha,
                     p_value=mannwhitney_p(b, c), min_p=min_attainable_p(len(b), len(c)), scale=scale)
    if not len(b) or not len(c):
        return out
    if scale == "log" and (np.any(b <= 0) or np.any(c <= 0)):
        scale = out.scale = "linear"
        out.notes.append("non-positive values: relative change taken on the linear scale")

    def stat(bb: np.ndarray, cc: np.ndarray) -> float:
        if scale == "log":
            return math.expm1(hl_shift(np.log(bb), np.log(cc)))
        med = float(np.median(bb))
        return hl_shift(bb, cc) / med if med != 0 else math.nan

    out.change = stat(b, c)
    if out.change is not None and not math.isfinite(out.change):
        out.change = None
        out.notes.append("baseline median is 0: relative change undefined")
        return out
    if ci and n_boot > 0:
        rng = np.random.default_rng(seed)
        draws = np.array([stat(_boot_draw(bg, rng), _boot_draw(cg, rng)) for _ in range(n_boot)])
        draws = draws[np.isfinite(draws)]
        if len(draws):
            lo, hi = np.percentile(draws, [100 * alpha / 2, 100 * (1 - alpha / 2)])
            out.ci_low, out.ci_high = float(lo), float(hi)
    return out


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
    se: float
    ci_low: float
    ci_high: float
    p_value: float
    change: float
    change_ci_low: float
    change_ci_high: float
    aliases: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class EffectsFit:
    """Result of :func:`fit_effects`."""

    terms: list[Term]
    not_estimable: dict[str, str]
    residual_sd: float | None
    df_resid: float
    n_obs: int
    n_cells: int
    level: float
    coding: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {"terms": [t.to_dict() for t in self.terms], "not_estimable": self.not_estimable,
                "residual_sd": self.residual_sd, "df_resid": self.df_resid, "n_obs": self.n_obs,
                "n_cells": self.n_cells, "level": self.level, "coding": self.coding}


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


def fit_effects(levels_of_obs: list[dict[str, Any]], y: Sequence[float], factors: list[str], *,
                alpha: float = 0.05, interactions: bool = True) -> EffectsFit:
    """OLS of ``y`` (log step time per step sample) on the factors and their two-factor interactions.

    Args:
        levels_of_obs: per observation, the factor levels of its cell.
        y: per observation, the response (log step time).
        factors: the varied factors (at least two distinct levels each among the observations).
        alpha: the intervals are at ``1 - alpha``.
        interactions: include two-factor interactions of the two-level factors.

    Columns are added greedily (intercept, main effects, interactions); one that does not raise the
    rank of the design is *not estimable*: its alias (a kept column equal to +-it) is named when there
    is one.
    """
    import statsmodels.api as sm

    y = np.asarray(y, dtype=float)
    names, fl, kinds, mat, coding = _columns(levels_of_obs, factors, interactions)
    keep: list[int] = []
    not_est: dict[str, str] = {}
    alias_of: dict[int, list[str]] = {}
    base = np.ones((len(y), 1))
    cur = base
    rank = 1
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
        else:
            not_est[names[j]] = "not estimable: a linear combination of the terms already in the model"
    X = np.column_stack([base] + [mat[:, k] for k in keep]) if keep else base
    n_cells = len({tuple(sorted(o.items(), key=lambda kv: kv[0])) for o in levels_of_obs})
    if len(y) <= X.shape[1]:
        raise ValueError(f"{len(y)} observations for {X.shape[1]} model terms: add repeats or steps")
    res = sm.OLS(y, X).fit()
    ci = np.asarray(res.conf_int(alpha))
    terms = []
    for pos, k in enumerate(keep, start=1):
        mult = 2.0 if kinds[k] in ("main", "interaction") else 1.0
        eff, se = mult * float(res.params[pos]), mult * float(res.bse[pos])
        lo, hi = mult * float(ci[pos, 0]), mult * float(ci[pos, 1])
        terms.append(Term(name=names[k], factors=fl[k], kind=kinds[k], effect=eff, se=se, ci_low=lo, ci_high=hi,
                          p_value=float(res.pvalues[pos]), change=math.expm1(eff), change_ci_low=math.expm1(lo),
                          change_ci_high=math.expm1(hi), aliases=alias_of.get(k, [])))
    sd = float(math.sqrt(res.scale)) if res.df_resid > 0 else None
    return EffectsFit(terms=terms, not_estimable=not_est, residual_sd=sd, df_resid=float(res.df_resid),
                      n_obs=len(y), n_cells=n_cells, level=1 - alpha, coding=coding)


# -- minimal detectable effect ----------------------------------------------------------------

def pooled_log_sd(groups_by_cell: Sequence[Sequence[float]]) -> float | None:
    """Pooled within-cell standard deviation of log values (cells with one sample add nothing)."""
    ss, df = 0.0, 0
    for g in groups_by_cell:
        a = _arr(g)
        a = a[a > 0]
        if len(a) > 1:
            la = np.log(a)
            ss += float(np.sum((la - la.mean()) ** 2))
            df += len(a) - 1
    return math.sqrt(ss / df) if df else None


def mde_two_sample(sd_log: float, n: int, m: int, *, alpha: float, power: float = 0.8,
                   threshold: float = 0.0) -> float:
    """Smallest true relative change found with probability ``power`` by a two-sided test at ``alpha``.

    Normal approximation on the log scale, ``se = sd_log * sqrt(1/n + 1/m)`` (x 1.05 for the
    Mann-Whitney test's efficiency); with a ``threshold`` the estimate must also exceed it, so the
    MDE is at least ``threshold`` plus ``z_power`` standard errors.
    """
    se = 1.05 * sd_log * math.sqrt(1.0 / n + 1.0 / m)
    zp = sps.norm.ppf(power)
    d = max((sps.norm.ppf(1 - alpha / 2) + zp) * se, math.log1p(threshold) + zp * se if threshold else 0.0)
    return math.expm1(d)


def mde_effect(se_effect: float, df: float, *, alpha: float, power: float = 0.8) -> float:
    """Smallest true effect (relative change of step time) an OLS effect with this SE detects."""
    t_a = sps.t.ppf(1 - alpha / 2, df) if df > 0 else math.inf
    t_b = sps.t.ppf(power, df) if df > 0 else math.inf
    return math.expm1((t_a + t_b) * se_effect)
