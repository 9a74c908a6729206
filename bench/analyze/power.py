"""Noise of step time and the minimal detectable effect.

Noise and minimal detectable effect: :func:`noise_components`, :func:`mde_from_se`
    Within-run and between-run spread of log step time (one-way ANOVA per cell); the smallest true
    change found with the given power at the given alpha from a standard error (normal approximation
    on the log scale), optionally under the gate's threshold as well.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np
from scipy import stats as sps

from bench.analyze.estimators import finite_array


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
