"""Group-sequential boundaries: O'Brien-Fleming alpha spending and its repeated-interval multipliers.

* :func:`obf_spending`, :func:`obf_boundaries`: the Lan-DeMets O'Brien-Fleming spending function and its two-sided
  z boundaries at equally spaced looks (known variance; recursive numerical integration).
* :func:`critical_value`: the multiplier ``q`` of the standard error at a look when the variance is **estimated**
  at each look on few residual degrees of freedom, as a sweep's or a gate's run-level fit does.

Why not the z boundary's nominal level read off Student's t (the "significance level" translation of Jennison &
Turnbull 2000, sec. 11.4)? At few degrees of freedom it is liberal: with 1-2 observations per look and 10 looks
the chance of crossing at some look is 5.6-5.8 % at a nominal 5 % (issue 30;
``tests/planning/test_sequential_promise.py``).
:func:`critical_value` therefore calibrates the t boundaries for the degrees of freedom actually available: it
simulates the joint law of the repeated t statistics of a mean with ``df + 1`` observations at each look (the
estimate and its variance estimate share the data: the residual sum of squares grows by each new group's own
spread plus its distance from the running mean, so the two are dependent across looks, as in the real fits) and
solves, look after look, ``P(no crossing before j, |T_j| >= b_j) = alpha(t_j) - alpha(t_{j-1})``
on :data:`T_PATHS` paths with a fixed seed (common random numbers: the boundaries are smooth in ``df``).
Unequal information (runs that failed) enters through ``info``.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

import numpy as np
from scipy import optimize
from scipy import stats as sps

#: simulated paths of the repeated t statistics per calibration (2^18: a look's share of the alpha, 0.0025, is
#: met to about +-4 % of itself)
T_PATHS = 1 << 18
#: the seed of those paths (fixed: the same boundaries on every machine and every call)
T_SEED = 20261204
#: with at least this many residual degrees of freedom and equal information the z boundary's t translation is
#: used as it is (its excess over alpha is then below 0.1 % of alpha)
T_EXACT_DF = 200
#: a look whose share of the alpha is hit by fewer simulated paths than this gets the conservative single-look
#: bound ``t_{df}(1 - share / 2)`` (O'Brien-Fleming's first looks spend almost nothing)
MIN_CROSSINGS = 30


def obf_spending(t: float, alpha: float) -> float:
    """Alpha spent by information fraction ``t`` (0..1): Lan-DeMets O'Brien-Fleming type,
    ``2 - 2 Phi(z_{1-alpha/2} / sqrt(t))`` (two-sided)."""
    if t <= 0:
        return 0.0
    return float(2.0 - 2.0 * sps.norm.cdf(sps.norm.ppf(1 - alpha / 2) / math.sqrt(min(t, 1.0))))


@lru_cache(maxsize=256)
def obf_boundaries(alpha: float, max_looks: int, grid: int = 401, final_look: int | None = None) -> tuple[float, ...]:
    """Two-sided z boundaries ``c_1 .. c_K`` of equally spaced looks (``t_k = k / K``) spending ``alpha``
    by :func:`obf_spending`.

    Recursive numerical integration on the score scale ``S_k = Z_k sqrt(t_k)`` (independent normal
    increments; Armitage, McPherson & Rowe 1969, *JRSS A* 132:235; Jennison & Turnbull 2000, ch. 19):
    the density of ``S_k`` on the continuation region is carried from look to look on a grid of
    ``grid`` points and ``c_k`` solves ``P(continue to k-1, |S_k| >= c_k sqrt(t_k)) = alpha(t_k) -
    alpha(t_{k-1})``. Accurate to about 1e-4 in ``c_k``.

    ``final_look = k``: the budget ends the sweep at look ``k``, its final analysis, which spends **all the alpha
    left** (``alpha - alpha(t_{k-1})``, information ``t_k = k / K``); returns ``c_1 .. c_k`` (Lan & DeMets 1983;
    Jennison & Turnbull 2000, sec. 7.2.2, the last analysis takes the rest of the spending function).

    Raises:
        ValueError: ``max_looks < 1``, ``alpha`` not in (0, 1), or ``final_look`` not in 1..``max_looks``.
    """
    if max_looks < 1 or not 0 < alpha < 1:
        raise ValueError(f"obf_boundaries: need max_looks >= 1 and 0 < alpha < 1 (got {max_looks}, {alpha})")
    last = max_looks if final_look is None else int(final_look)
    if not 1 <= last <= max_looks:
        raise ValueError(f"obf_boundaries: final_look {final_look} not in 1..{max_looks}")
    ts = [k / max_looks for k in range(1, max_looks + 1)]
    spent = lambda k: alpha if k == last - 1 else obf_spending(ts[k], alpha)  # noqa: E731 (by look k + 1)

    c1 = float(sps.norm.ppf(1 - spent(0) / 2))
    bounds = [min(c1, 40.0)]
    b = bounds[0] * math.sqrt(ts[0])
    s = np.linspace(-b, b, grid)
    dens = sps.norm.pdf(s, scale=math.sqrt(ts[0]))
    for k in range(1, last):
        sd = math.sqrt(ts[k] - ts[k - 1])
        w = np.full(grid, s[1] - s[0])
        w[[0, -1]] *= 0.5
        mass = dens * w
        target = spent(k) - spent(k - 1)

        def cross(c: float, mass=mass, sd=sd, tk=ts[k]) -> float:
            bb = c * math.sqrt(tk)
            tail = sps.norm.sf((bb - s) / sd) + sps.norm.cdf((-bb - s) / sd)
            return float(mass @ tail) - target

        if target <= 1e-15:
            c = 40.0
        else:
            c = float(optimize.brentq(cross, 0.5, 40.0, xtol=1e-7))
        bounds.append(c)
        bb = c * math.sqrt(ts[k])
        u = np.linspace(-bb, bb, grid)
        dens = (sps.norm.pdf((u[:, None] - s[None, :]) / sd) / sd) @ mass
        s = u
    return tuple(bounds)


def info_fractions(look: int, max_looks: int, info: Sequence[float] | None = None) -> tuple[float, ...]:
    """Information fractions ``t_1 .. t_look`` in (0, 1]: ``info`` as given (checked) or ``j / max_looks``.

    Raises:
        ValueError: ``info`` not of length ``look``, not increasing, or outside (0, 1].
    """
    if info is None:
        return tuple(min(j / max_looks, 1.0) for j in range(1, look + 1))
    ts = tuple(float(x) for x in info)
    if len(ts) != look or any(not 0 < x <= 1 for x in ts) or any(b < a for a, b in zip(ts, ts[1:])):
        raise ValueError(f"info {info!r}: need {look} increasing information fractions in (0, 1]")
    return ts


@lru_cache(maxsize=4096)
def t_boundaries(alpha: float, dfs: tuple[int, ...], ts: tuple[float, ...], final: bool) -> tuple[float, ...]:
    """Two-sided t boundaries ``b_1 .. b_k`` for looks with residual degrees of freedom ``dfs`` and information
    fractions ``ts`` (both of length ``k``), spending ``alpha`` by :func:`obf_spending` (all of what is left at
    look ``k`` when ``final``). A look with no degree of freedom gets ``inf`` (no interval there). Simulated as
    the module text says (:data:`T_PATHS`, :data:`T_SEED`, :data:`MIN_CROSSINGS`)."""
    k = len(ts)
    rng = np.random.default_rng(T_SEED)
    n = T_PATHS
    s = np.zeros(n)  # sum of the observations so far (variance 1 each)
    q = np.zeros(n)  # sum of their squares
    alive = np.ones(n, dtype=bool)
    out: list[float] = []
    prev_obs, prev_spent = 0, 0.0
    for j in range(k):
        spent = alpha if (final and j == k - 1) else obf_spending(ts[j], alpha)
        share = max(spent - prev_spent, 0.0)
        prev_spent = max(spent, prev_spent)
        df = int(dfs[j])
        obs = df + 1
        if obs > prev_obs:  # the new observations: their sum and their spread around their own mean
            m = obs - prev_obs
            inc = rng.standard_normal(n) * math.sqrt(m)
            within = 2 * rng.standard_gamma((m - 1) / 2, n) if m > 1 else 0.0
            s += inc
            q += within + inc * inc / m
            prev_obs = obs
        if df < 1 or share <= 0:
            out.append(math.inf)
            continue
        if share * n < MIN_CROSSINGS:
            b = float(sps.t.isf(share / 2, df))
        else:
            rss = np.maximum(q - s * s / obs, 1e-300)
            tt = np.abs(s / obs) / np.sqrt(rss / df / obs)
            live = tt[alive]
            c = int(round(share * n))
            if c >= live.size:
                b = 0.0
            else:  # c paths still alive cross: b between the c-th and (c+1)-th largest |T|
                part = np.partition(live, live.size - c - 1)
                hi = part[live.size - c:].min()
                lo = part[live.size - c - 1]
                b = float((hi + lo) / 2)
            alive &= tt < b
        out.append(b)
    return tuple(out)


@lru_cache(maxsize=65536)
def critical_value(df: float, *, alpha: float, look: int, max_looks: int, final: bool = False,
                   info: tuple[float, ...] | None = None, runs: int | None = None) -> float | None:
    """Multiplier ``q`` of the standard error for the repeated interval at ``look`` of ``max_looks``
    (``estimate +- q se``), on ``df`` residual degrees of freedom. ``None`` without degrees of freedom.

    The boundary is calibrated for the degrees of freedom available (:func:`t_boundaries`) with the information
    fractions ``info`` of looks ``1 .. look`` (``None``: equal blocks, ``j / max_looks``). Earlier looks are
    taken to have had the runs in proportion to their information and the same parameters, so look ``j`` had
    ``df - runs (1 - t_j / t_look)`` degrees of freedom; ``runs``: the observations of the fit now (``None``:
    ``df + 1``, a one-sample or paired mean). With equal information and at least
    :data:`T_EXACT_DF` degrees of freedom it is the t quantile at the z boundary's nominal level
    (:func:`obf_boundaries`). A look beyond ``max_looks`` uses the last boundary (the plan is spent); a ``final``
    one, and the last planned look, spend all the alpha left (``final_look``).

    Raises:
        ValueError: a malformed ``info`` (:func:`info_fractions`).
    """
    if df is None or df < 1:
        return None
    kmax = max(int(max_looks), 1)
    k = min(max(int(look), 1), kmax)
    if info is None and df >= T_EXACT_DF:
        c = obf_boundaries(float(alpha), kmax, final_look=k if final else None)[k - 1]
        p = float(sps.norm.sf(c))
        return float("inf") if p <= 1e-300 else float(sps.t.isf(p, df))
    ts = info_fractions(k, kmax, None if info is None else tuple(info)[:k])
    d = max(int(round(df)), 1)
    n = d + 1 if runs is None else max(int(runs), d + 1)
    dfs = tuple(max(int(round(d - n * (1 - t / ts[-1]))), 0) for t in ts[:-1]) + (d,)
    return t_boundaries(float(alpha), dfs, ts, bool(final or k >= kmax))[-1]
