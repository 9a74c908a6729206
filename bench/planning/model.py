"""Noise and cost model of a target (:class:`NoiseCost`, :func:`estimate_model`), the input of the planner
(:mod:`bench.planning.allocation`).

Model: the log of timed step ``s`` of run ``r`` of cell ``c`` in block ``b`` is
``mu_c + beta_b + u_r + w_s + e_rs`` with

- ``u_r ~ N(0, sd_run^2)``: run to run within a cell (start-up, placement, machine state);
- ``w_s ~ N(0, sd_stepidx^2)``: the step index, **shared by every run** of the target. Every run replays
  the same sequence of batches (same data seed; on the embedded engine the rollouts too: the token counts of
  step ``s`` are the same in every run and every cell), so step ``s`` costs about the same in every run.
  This is the crossed design of Kalibera & Jones, "Rigorous Benchmarking in Reasonable Time" (ISMM 2013),
  where a level shared by the repetitions of the level above is a fixed pattern, not noise that averages out:
  it shifts every run value of the same steps alike and cancels in every comparison;
- ``e_rs ~ N(0, sd_step^2)``: the run x step interaction, the only step noise that differs between runs;
- ``beta_b``: drift between time blocks, spread ``sd_block``.

A run's value is the median of its ``n`` timed steps (:func:`bench.records.figures.run_value`). Between runs of the same
steps its variance is ``sd_run^2 + kappa(n, rho) sd_step^2 / n`` (:meth:`NoiseCost.run_var`), with
``rho = sd_stepidx / sd_step`` and (:func:`kappa`) ``1`` for ``n <= 2`` (a mean: ``w`` cancels) and for
``n >= 3`` the asymptotic variance of the median of independent, not identically distributed normals
``N(w_s, sd_step^2)`` (Bahadur representation, Serfling, *Approximation Theorems of Mathematical Statistics*,
1980, sec. 2.5: ``var = sum F_s (1 - F_s) / (sum f_s)^2`` at the median), averaged over ``w ~ N(0, sd_stepidx^2)``:
``kappa = (1 + rho^2) (pi/2 - arcsin(rho^2 / (1 + rho^2)))``. ``rho = 0`` gives the familiar ``pi / 2``; a large
shared pattern (``rho >> 1``) gives ``sqrt(2) rho``: the median is pinned to the steps near the middle of the
pattern, whose own noise does not average out as fast. Ignoring ``w`` (taking the whole within-run spread as
independent step noise) overstates the step part, finds ``sd_run = 0`` and makes the planner ask for many
more steps per run than help.

Estimates, from the run records of finished sweeps of the target (log step times speed-normalized as in the
report when every run has the probe): for the runs of one cell that timed the same steps, a two-way table
runs x steps: ``sd_step`` from the interaction residuals (scaled MAD, robust to the odd stalled step, pooled
over cells by degrees of freedom), ``sd_stepidx`` from the step mean square (ANOVA estimator, floored at 0);
cells with one run contribute their within-run spread (which then holds ``w`` too). The residual variance of
the run values after cell and block effects (two-way ANOVA per sweep, pooled over sweeps) minus the step
part gives ``sd_run``; when the step part alone exceeds it, ``sd_run = 0`` and ``sd_step`` is calibrated to
the observed run-value variance. The block mean square gives ``sd_block``. Costs, seconds: ``startup_s`` = a
run's wall time outside its GRPO steps, ``step_s`` / ``warmup_step_s`` / ``profiled_step_s`` = median step
time of each kind, ``harness_s`` = median gap between one run's end and the next run's start. Medians over
runs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np


def kappa(n: int, rho: float = 0.0) -> float:
    """Variance of the median of ``n`` steps in units of ``sd_step^2 / n``: 1 for ``n <= 2`` (a mean), else
    ``(1 + rho^2) (pi/2 - arcsin(rho^2 / (1 + rho^2)))`` with ``rho = sd_stepidx / sd_step`` (module text;
    ``pi / 2`` at ``rho = 0``)."""
    if n <= 2:
        return 1.0
    r2 = rho * rho
    return (1 + r2) * (math.pi / 2 - math.asin(r2 / (1 + r2)))


@dataclass
class NoiseCost:
    """Noise (log scale) and cost (seconds) of one target; see the module text for each field.

    ``sd_step`` is the run x step interaction (step noise that differs between runs), ``sd_stepidx`` the step
    index's pattern shared by the runs (0: steps independent, the model of the previous version)."""

    sd_step: float
    sd_run: float
    sd_block: float
    startup_s: float
    step_s: float
    warmup_step_s: float
    profiled_step_s: float
    harness_s: float
    runs: int = 0
    sweeps: list[str] = field(default_factory=list)
    timed_steps: float = 0.0
    sd_stepidx: float = 0.0

    @property
    def rho(self) -> float:
        """``sd_stepidx / sd_step`` (0 when ``sd_step`` is 0)."""
        return self.sd_stepidx / self.sd_step if self.sd_step > 0 else 0.0

    def run_var(self, n: int) -> float:
        """Variance of one run's value (log of its median of ``n`` timed steps) between runs of the same steps."""
        return self.sd_run ** 2 + kappa(n, self.rho) * self.sd_step ** 2 / max(n, 1)

    def run_cost(self, n: int, warmup: int, profiled: int) -> float:
        """Seconds one run costs in the sweep: start-up, harness, warm-up, profiled and ``n`` timed steps."""
        return (self.startup_s + self.harness_s + warmup * self.warmup_step_s + profiled * self.profiled_step_s
                + n * self.step_s)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def kj_optimal_steps(model: NoiseCost, warmup: int, profiled: int) -> float:
    """Kalibera & Jones (2013) cost-optimal steps per run, ``sqrt(kappa sd_step^2 C / (sd_run^2 c))`` with ``C``
    the fixed cost of a run (:meth:`NoiseCost.run_cost` at 0 steps), ``c`` one timed step and ``kappa`` of
    :func:`kappa` for ``n >= 3``; ``inf`` when ``sd_run = 0``."""
    if model.sd_run <= 0:
        return math.inf
    fixed = model.run_cost(0, warmup, profiled)
    return math.sqrt(kappa(3, model.rho) * model.sd_step ** 2 * fixed / (model.sd_run ** 2 * model.step_s))


def _robust_sd(x: np.ndarray) -> float:
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def _steps_of(rec: dict[str, Any], which: Sequence[int]) -> list[float]:
    steps = rec.get("steps") or {}
    out = [float((steps.get(str(s)) or {}).get("timing_s/step", float("nan"))) for s in which]
    return [t for t in out if t == t and t > 0]


def step_components(groups: Sequence[Sequence[Sequence[float]]]) -> tuple[float, float, float, float]:
    """Pooled ``(ss_int, df_int, ss_idx, df_idx)`` over groups; a group = the log step times (runs x steps, equal
    lengths) of the runs of one cell that timed the same steps. Interaction: scaled MAD of the two-way residuals,
    squared, times their degrees of freedom ``(R - 1)(S - 1)`` (a group of one run: its within-run spread with
    ``S - 1`` df); step index: ``max(0, MS_steps - MS_int) / R`` times ``S - 1``."""
    ss_i = df_i = ss_w = df_w = 0.0
    for g in groups:
        y = np.asarray(g, float)
        if y.ndim != 2 or y.shape[1] < 3:
            continue
        r, s = y.shape
        if r == 1:
            ss_i += _robust_sd(y[0]) ** 2 * (s - 1)
            df_i += s - 1
            continue
        cm = y.mean(axis=0)
        resid = y - y.mean(axis=1, keepdims=True) - cm + y.mean()
        df = (r - 1) * (s - 1)
        ms_int = _robust_sd(resid.ravel()) ** 2 * resid.size / df  # residuals are shrunk by df / size
        ss_i += ms_int * df
        df_i += df
        ms_idx = r * float(np.sum((cm - cm.mean()) ** 2)) / (s - 1)
        ss_w += max(0.0, ms_idx - ms_int) / r * (s - 1)
        df_w += s - 1
    return ss_i, df_i, ss_w, df_w


def _calibrated_sd_step(resid_var: float, n: int, sd_stepidx: float) -> float:
    """``sd_step`` whose median-of-``n`` variance ``kappa(n, sd_stepidx / sd_step) sd_step^2 / n`` equals
    ``resid_var`` (increasing in ``sd_step``: bisection)."""
    lo, hi = 0.0, max(math.sqrt(resid_var * n), 1e-12)
    while kappa(n, sd_stepidx / hi) * hi * hi / n < resid_var:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        if mid > 0 and kappa(n, sd_stepidx / mid) * mid * mid / n < resid_var:
            lo = mid
        else:
            hi = mid
    return hi


def estimate_model(sweeps: Sequence[tuple[str, Sequence[dict[str, Any]]]]) -> NoiseCost | None:
    """The noise and cost model from ``(name, run records)`` of finished sweeps of one target (module text);
    ``None`` without two ok runs of one cell in some sweep (no run-to-run spread to estimate)."""
    resid_ss = resid_df = 0.0
    block_terms: list[tuple[float, int]] = []
    groups: dict[tuple[str, str, tuple[int, ...]], list[list[float]]] = {}
    ns, startup, step, warm, prof, gaps = [], [], [], [], [], []
    from bench.planning.sequential import log_step_samples, probed  # deferred: bench.planning.sequential loads scipy

    names, runs = [], 0
    for name, recs in sweeps:
        ok = [r for r in recs if r.get("status") == "ok" and (r.get("summary") or {}).get("step_time_samples_s")]
        if not ok:
            continue
        norm = probed(ok)
        names.append(name)
        runs += len(ok)
        cells, blocks, y = [], [], []
        for r in ok:
            s = r["summary"]
            x = [float(v) for v in log_step_samples(r, norm)]
            if len(x) >= 3:
                timed = tuple(int(t) for t in s.get("timed_steps") or range(len(x)))
                groups.setdefault((name, r["cell_id"], timed if len(timed) == len(x) else ()), []).append(x)
            ns.append(len(x))
            y.append(float(np.median(x)))
            cells.append(r["cell_id"])
            blocks.append(int(r.get("repeat", 0)))
            timing = r.get("timing") or {}
            all_steps = sorted(int(k) for k in (r.get("steps") or {}))
            measured = set(s.get("measured_steps") or all_steps)
            step += [t for t in s["step_time_samples_s"] if t and t > 0]
            warm += _steps_of(r, [k for k in all_steps if k not in measured])
            prof += _steps_of(r, s.get("profiled_steps") or [])
            in_steps = sum(_steps_of(r, all_steps))
            startup.append(timing.get("startup_s", max(0.0, float(r.get("wall_s") or 0.0) - in_steps)))
        order = sorted(ok, key=lambda r: r.get("started_at") or 0)
        for a, b in zip(order, order[1:]):
            if a.get("started_at") and b.get("started_at") and a.get("wall_s") is not None:
                gaps.append(max(0.0, b["started_at"] - a["started_at"] - float(a["wall_s"])))
        # two-way ANOVA (cell + block) of the run values: residual and block mean squares
        uc, ub = sorted(set(cells)), sorted(set(blocks))
        X = np.column_stack([np.ones(len(y))] + [[1.0 * (c == u) for c in cells] for u in uc[1:]]
                            + [[1.0 * (b == u) for b in blocks] for u in ub[1:]])
        Xc = X[:, :len(uc)]
        yv = np.asarray(y)
        rss = float(np.sum((yv - X @ np.linalg.lstsq(X, yv, rcond=None)[0]) ** 2))
        df = len(y) - np.linalg.matrix_rank(X)
        if df > 0:
            resid_ss += rss
            resid_df += df
            if len(ub) > 1:
                rss_c = float(np.sum((yv - Xc @ np.linalg.lstsq(Xc, yv, rcond=None)[0]) ** 2))
                block_terms.append(((rss_c - rss) / (len(ub) - 1), len(uc)))
    if resid_df <= 0 or not step:
        return None
    tables: list[list[list[float]]] = []
    for key, g in groups.items():  # runs without a step list of their length: each on its own
        tables += [g] if key[2] else [[row] for row in g]
    ss_i, df_i, ss_w, df_w = step_components(tables)
    sd_step = math.sqrt(ss_i / df_i) if df_i else 0.0
    sd_stepidx = math.sqrt(ss_w / df_w) if df_w else 0.0
    n_bar = float(np.mean(ns))
    n_r = max(round(n_bar), 1)
    resid_var = resid_ss / resid_df
    step_part = kappa(n_r, sd_stepidx / sd_step if sd_step else 0.0) * sd_step ** 2 / n_bar
    sd_run = math.sqrt(max(0.0, resid_var - step_part))
    if step_part > resid_var:  # run medians vary less than the steps' noise would make them: calibrate to them
        sd_step = _calibrated_sd_step(resid_var, n_r, sd_stepidx)
    sd_block = 0.0
    if block_terms:
        sd_block = math.sqrt(float(np.mean([max(0.0, (ms - resid_var) / c) for ms, c in block_terms])))
    med = lambda v, d=0.0: float(np.median(v)) if len(v) else d  # noqa: E731
    step_s = med(step)
    return NoiseCost(sd_step=sd_step, sd_run=sd_run, sd_block=sd_block, startup_s=med(startup), step_s=step_s,
                     warmup_step_s=med(warm, step_s), profiled_step_s=med(prof, step_s), harness_s=med(gaps),
                     runs=runs, sweeps=names, timed_steps=n_bar, sd_stepidx=sd_stepidx)
