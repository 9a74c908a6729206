"""Change points in a series of saved sweeps (one value per save, in save order): :func:`detect`.

Method: E-Divisive's hierarchical procedure (Matteson & James 2014, *J. Amer. Statist. Assoc.* 109:334; as
MongoDB's and Apache Otava / Hunter's change-point detection use it, Daly et al., ICPE 2020) with
``ruptures``' binary segmentation (``ruptures.Binseg``, cost ``l2``: the sum of squared deviations from the
segment mean; Truong, Oudre & Vayatis 2020) finding each candidate, and a **permutation test** deciding it:

1. Among the segments between the points accepted so far (at first the whole series) take the split with the
   largest gain ``G = C(a, b) - C(a, t) - C(t, b)`` (``C``: ruptures' l2 cost; ``Binseg.single_bkp``), each side
   at least :data:`MIN_SIZE` saves.
2. Its significance: shuffle the values of that segment ``P`` times (:func:`permutations_for`) and take, for each
   shuffle, the largest gain over every split (:func:`split_gains`, the same l2 gain in closed form:
   ``G_t = S_t^2 / t + (S - S_t)^2 / (m - t) - S^2 / m`` with ``S_t`` the sum of the first ``t`` values);
   ``p = (1 + #{shuffled max >= G}) / (P + 1)``.
3. ``p < alpha``: accept the point and go to 1; else stop (E-Divisive stops at the first candidate that is not
   significant, so a series without a change shows a false point with probability at most ``alpha``).

No penalty constant and no threshold is set by hand: ``alpha`` (fixed before the data) is the only one. A point's
**shift** is the difference of the means of the segments on either side (between its neighbouring accepted points),
its **interval** the pooled two-sample t interval at ``1 - alpha`` (it does not account for the point having been
chosen where the split is largest: near the detection limit it is optimistic).

:func:`min_saves`: a permutation test on ``n`` values cannot reach ``p`` below about ``2 / C(n, n // 2)`` (only the
arrangements that reproduce the observed split, or its mirror, are as extreme), so a series shorter than that cannot
show a change point at ``alpha`` whatever its values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

#: the fewest saves on either side of a change point: one save alone is not told from an outlier
MIN_SIZE = 2
#: shuffles per test are at least this, and at least :data:`PERMUTATION_FACTOR` / alpha
MIN_PERMUTATIONS = 999
PERMUTATION_FACTOR = 20


@dataclass(frozen=True)
class ChangePoint:
    """One accepted change point.

    ``index``: position in the series of the first value of the new level (0-based); ``shift``: mean of the values
    after minus mean before (the series' own scale: log seconds for a time); ``low``/``high``: its interval at
    ``1 - alpha``; ``p``: the permutation test's p value; ``before``/``after``: how many values on each side the
    shift is measured on.
    """

    index: int
    shift: float
    low: float
    high: float
    p: float
    before: int
    after: int


@dataclass
class Detection:
    """The result of :func:`detect` on one series of ``n`` values: the accepted ``points`` (by index), every
    ``tested`` candidate as ``(index, p)`` in test order (the last one not significant, unless the segments ran
    out), ``alpha`` and the number of ``permutations`` per test."""

    n: int
    alpha: float
    permutations: int
    points: list[ChangePoint] = field(default_factory=list)
    tested: list[tuple[int, float]] = field(default_factory=list)


def min_saves(alpha: float, min_size: int = MIN_SIZE) -> int:
    """The fewest values a series needs before a change point can be significant at ``alpha``: the smallest
    ``n >= 2 * min_size`` with ``2 / C(n, n // 2) < alpha`` (see the module's docstring).

    Raises:
        ValueError: ``alpha`` not in (0, 1).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha {alpha!r}: allowed (0, 1)")
    n = 2 * min_size
    while 2 / math.comb(n, n // 2) >= alpha:
        n += 1
    return n


def permutations_for(alpha: float) -> int:
    """Shuffles per test: ``max(MIN_PERMUTATIONS, ceil(PERMUTATION_FACTOR / alpha))``, so that about 20 shuffles
    reach the critical value (the Monte Carlo p value's relative error there is about 1 / sqrt(20))."""
    return max(MIN_PERMUTATIONS, math.ceil(PERMUTATION_FACTOR / alpha))


def split_gains(y: np.ndarray, min_size: int = MIN_SIZE) -> np.ndarray:
    """The l2 gain of every split of each row of ``y`` (shape ``(k, m)``): shape ``(k, m - 2 * min_size + 1)``,
    column ``j`` the split before position ``min_size + j`` (ruptures' ``CostL2`` gain, in closed form)."""
    y = np.asarray(y, dtype=float)
    y = y - y.mean(axis=1, keepdims=True)  # gains are shift-invariant; centring keeps the sums exact
    m = y.shape[1]
    t = np.arange(min_size, m - min_size + 1)
    s = np.cumsum(y, axis=1)[:, t - 1]
    total = y.sum(axis=1, keepdims=True)
    return s ** 2 / t + (total - s) ** 2 / (m - t) - total ** 2 / m


def permutation_p(y: np.ndarray, gain: float, permutations: int, rng: np.random.Generator,
                  min_size: int = MIN_SIZE) -> float:
    """p value of the largest split gain ``gain`` of the segment ``y``: ``(1 + #{shuffles whose largest gain >=
    gain}) / (permutations + 1)`` (shuffles drawn from ``rng``, in chunks)."""
    y = np.asarray(y, dtype=float)
    tol = 1e-9 * max(abs(gain), float(np.sum((y - y.mean()) ** 2)), 1e-300)
    hits, done = 0, 0
    while done < permutations:
        k = min(max(1, 2_000_000 // len(y)), permutations - done)  # at most about 2 million values (16 MB) at once
        shuffled = rng.permuted(np.broadcast_to(y, (k, len(y))), axis=1)
        hits += int(np.count_nonzero(split_gains(shuffled, min_size).max(axis=1) >= gain - tol))
        done += k
    return (1 + hits) / (permutations + 1)


def _shift(x: np.ndarray, a: int, t: int, b: int, alpha: float) -> tuple[float, float, float]:
    """Mean of ``x[t:b]`` minus mean of ``x[a:t]`` and its pooled two-sample t interval at ``1 - alpha``."""
    from scipy import stats as sps

    left, right = x[a:t], x[t:b]
    n1, n2 = len(left), len(right)
    d = float(right.mean() - left.mean())
    df = n1 + n2 - 2
    var = (float(np.sum((left - left.mean()) ** 2)) + float(np.sum((right - right.mean()) ** 2))) / df
    half = float(sps.t.ppf(1 - alpha / 2, df)) * math.sqrt(var * (1 / n1 + 1 / n2))
    return d, d - half, d + half


def detect(x: list[float] | np.ndarray, alpha: float, *, seed: int = 0, min_size: int = MIN_SIZE) -> Detection:
    """Change points of the series ``x`` (values in save order) at significance ``alpha`` (see the module).

    ``seed`` seeds the shuffles (the result is a function of the data, ``alpha`` and ``seed``).

    Raises:
        ValueError: fewer values than :func:`min_saves` (``alpha``), or a value that is not finite.
    """
    import ruptures as rpt

    x = np.asarray(x, dtype=float)
    n = len(x)
    need = min_saves(alpha, min_size)
    if n < need:
        raise ValueError(f"{n} values: a change point at alpha {alpha:.3g} needs at least {need}")
    if not np.all(np.isfinite(x)):
        raise ValueError("a value is not finite")
    out = Detection(n=n, alpha=alpha, permutations=permutations_for(alpha))
    algo = rpt.Binseg(model="rank", min_size=min_size, jump=1).fit(x)
    ranks = np.asarray(algo.cost.ranks, dtype=float).ravel()  # ruptures' centred ranks of x (ties: mid-ranks)
    rng = np.random.default_rng(seed)
    accepted: list[int] = []
    while True:
        bounds = [0, *sorted(accepted), n]
        cands = []
        for a, b in zip(bounds, bounds[1:]):
            t, gain = algo.single_bkp(a, b)
            if t is not None and gain > 0:
                cands.append((gain, t, a, b))
        if not cands:
            break
        _, t, a, b = max(cands)
        seg = ranks[a:b]
        observed = float(split_gains(seg[None, :], min_size)[0, t - a - min_size])
        p = permutation_p(seg, observed, out.permutations, rng, min_size)
        out.tested.append((int(t), p))
        if p >= alpha:
            break
        accepted.append(int(t))
    bounds = [0, *sorted(accepted), n]
    p_of = dict(out.tested)
    for i, t in enumerate(sorted(accepted), start=1):
        a, b = bounds[i - 1], bounds[i + 1]
        d, lo, hi = _shift(x, a, t, b, alpha)
        out.points.append(ChangePoint(index=t, shift=d, low=lo, high=hi, p=p_of[t], before=t - a, after=b - t))
    return out
