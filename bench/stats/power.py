"""Noise of step time and the minimal detectable effect.

Noise and minimal detectable effect: :func:`noise_components`, :func:`mde_from_se`, :func:`gate_mde`
    (the smallest change the gate can see: gate and report), :func:`blocks_needed`
    Within-run and between-run spread of log step time (one-way ANOVA per cell); the smallest true
    change found with the given power at the given alpha from a standard error (normal approximation
    on the log scale), optionally under the gate's threshold as well.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any, Sequence

import numpy as np
from scipy import stats as sps

from bench.stats.estimators import finite_array


def mde_from_se(se: float, *, alpha: float, power: float = 0.8, threshold: float = 0.0,
                df: float | None = None) -> float:
    """Smallest true relative change detected with probability ``power`` given the log-scale SE.

    Two-sided test at ``alpha`` (normal approximation; Student t quantiles on ``df`` degrees of freedom
    when given); with a ``threshold`` the estimate must also exceed it (the gate's rule). ``inf`` where the log
    change is beyond what a float holds (a tiny alpha on 1 degree of freedom: ``gate --alpha 1e-6`` at its second
    block raised OverflowError).
    """
    za, zp = _quantiles(alpha, power, df)
    d = (za + zp) * se
    if threshold:
        d = max(d, math.log1p(threshold) + zp * se)
    return math.expm1(d) if d < 700 else math.inf


@lru_cache(maxsize=65536)
def _quantiles(alpha: float, power: float, df: float | None) -> tuple[float, float]:
    """``(q(1 - alpha / 2), q(power))`` of the normal (``df`` None) or Student t distribution (cached: the
    gate's look-by-look simulations and :func:`blocks_needed`'s search call this thousands of times)."""
    if df is None:
        return float(sps.norm.ppf(1 - alpha / 2)), float(sps.norm.ppf(power))
    return float(sps.t.ppf(1 - alpha / 2, df)), float(sps.t.ppf(power, df))


def gate_mde(sd_pair: float | None, blocks: int, *, alpha: float, threshold: float,
             power: float = 0.8) -> float | None:
    """The smallest change the gate can see: the smallest true relative change of one cell that the
    interleaved gate calls with probability ``power`` (two-sided paired t test at ``alpha`` on ``blocks - 1``
    df, estimate beyond ``threshold``), ``sd_pair`` being the SD of one block's log ratio candidate/baseline
    of the cell's run values (Kalibera & Jones 2020: runs as the unit, ratio on the log scale).

    The one noise figure: the gate's "cannot judge" (``mde > max_mde``), the blocks it asks for
    (:func:`blocks_needed`) and the report's "smallest change the gate can see" all come from here. For a
    plain blocked sweep the report predicts it with ``sd_pair = sqrt(2) * sd_run`` (two runs of a block
    differ by twice the residual variance of the blocked model). ``None`` with fewer than 2 blocks.
    """
    if sd_pair is None or blocks < 2 or not math.isfinite(sd_pair):
        return None
    return mde_from_se(sd_pair / math.sqrt(blocks), alpha=alpha, power=power, threshold=threshold, df=blocks - 1)


def blocks_needed(sd_pair: float | None, *, alpha: float, threshold: float, max_mde: float,
                  power: float = 0.8, limit: int = 10_000) -> int | None:
    """Fewest blocks with which :func:`gate_mde` at this ``sd_pair`` is at most ``max_mde``; ``None`` when
    ``sd_pair`` is unknown or even ``limit`` blocks would not do (``max_mde`` at or under the threshold)."""
    if sd_pair is None or not math.isfinite(sd_pair):
        return None
    if sd_pair == 0:
        return 2
    lo, hi = 2, limit
    if (gate_mde(sd_pair, hi, alpha=alpha, threshold=threshold, power=power) or math.inf) > max_mde:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if (gate_mde(sd_pair, mid, alpha=alpha, threshold=threshold, power=power) or math.inf) <= max_mde:
            hi = mid
        else:
            lo = mid + 1
    return lo


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
        logs = [np.log(a[a > 0]) for a in (finite_array(r) for r in runs)]
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
