"""Estimators and p values of the two-sample tests, and the bootstrap draw: pure functions on arrays.

Hodges-Lehmann shifts (two-sample and one-sample), Mann-Whitney U and Wilcoxon signed-rank p values,
the smallest attainable exact p, and one bootstrap draw of samples grouped by repeat. The tests built
on them are in :mod:`bench.stats.stat_tests`.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import stats as sps

#: default bootstrap resamples for confidence intervals
N_BOOT = 2000
#: default significance level of the gate and the report (intervals at ``1 - alpha``)
DEFAULT_ALPHA = 0.01
#: default threshold of the gate: a change beyond it (and seen by its interval) is a regression or an improvement
DEFAULT_THRESHOLD = 0.05


def finite_array(values: Sequence[float]) -> np.ndarray:
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
    return float(
        sps.mannwhitneyu(cand, base, alternative="two-sided", method="exact" if exact else "asymptotic").pvalue
    )


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

def sample_groups(groups: Sequence[Sequence[float]]) -> list[np.ndarray]:
    return [g for g in (finite_array(x) for x in groups) if len(g)]


#: from this many repeats on, the bootstrap resamples repeats only (their steps kept as measured)
CLUSTER_BOOT_MIN = 4


def boot_draw(groups: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
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
