"""Effects of the factors and contrasts between cells, fitted on per-run values (report).

Effects: :func:`fit_effects`
    OLS (statsmodels) of one value per *run* (the report passes the log of the run's median timed step) on
    +-1 coded two-level factors (dummy coded for factors with more levels) with every estimable two-factor
    interaction, plus the time block as a fixed factor when the sweep ran in blocks and the node a run ran
    on as a second blocking factor when the runs ran on more than one node (``--parallel`` on a Ray cluster:
    a faster node must not pose as an effect); a term's effect is ``2 x coefficient`` (the change of log
    step time from the low to the high level). The run is the unit of replication: steps of one run share
    its start-up, placement and machine state (pseudo-replicates, Hurlbert 1984, *Ecol. Monogr.* 54:187), so
    they are summarized into the run's value before any test, and intervals and p values carry the
    run-to-run variance with ``runs - parameters`` degrees of freedom. This is the standard analysis of a
    randomized complete block design (Montgomery, *Design and Analysis of Experiments*, 9th ed., ch. 4 and
    5) on run summaries; for balanced data it gives the same fixed-effect tests as a mixed model with a
    random intercept per run fitted to the steps (Searle, Casella & McCulloch 1992, sec. 4.3), without the
    convergence trouble of a mixed model on 2-3 runs per cell. p values are also given Holm-adjusted over
    the model's terms (``p_adjusted``; a term is significant when it is below alpha). Columns that are
    linearly dependent on earlier ones (aliased in a fractional design, or not estimable in a one-at-a-time
    design, or confounded with a block) are dropped and reported with what they are aliased with. With one
    run per cell (``replicated=False``) no run-to-run variance can be estimated: the terms keep their
    estimates, without interval or p value.

Cell comparisons (report): :func:`cell_means_residual`, :func:`run_contrast`
    The residual SD of the cell-means model (one mean per cell, plus the block) of the run values,
    and the t interval and p value of the difference between two cells' mean log run values with it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np
from scipy import stats as sps


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
    (0: no block factor), ``n_nodes`` nodes in the model (0: no node factor; ``node_columns`` of them
    were estimable beside the blocks); ``replicated``: whether run-to-run variance could be estimated (else no
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
    n_nodes: int = 0
    node_columns: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"terms": [t.to_dict() for t in self.terms], "not_estimable": self.not_estimable,
                "residual_sd": self.residual_sd, "df_resid": self.df_resid, "n_obs": self.n_obs,
                "n_cells": self.n_cells, "level": self.level, "coding": self.coding, "unit": self.unit,
                "n_blocks": self.n_blocks, "replicated": self.replicated, "note": self.note,
                "n_nodes": self.n_nodes, "node_columns": self.node_columns}


def model_columns(levels_of_obs: list[dict[str, Any]], factors: list[str], interactions: bool
                  ) -> tuple[list[str], list[list[str]], list[str], np.ndarray, dict[str, str]]:
    """Candidate model columns of the effects model, in order: main effects, then (with ``interactions``) the
    two-factor interactions. ``levels_of_obs`` holds one ``{factor: level}`` per observation (n of them).
    Returns (column names, the factors of each column, each column's kind, the n x k design matrix, the coding
    of each factor); the planning's allocation (:mod:`bench.planning.allocation`) builds its design from it."""
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
            coding[f] = (
                f"dummy vs level {vals[0]} ({', '.join(map(str, vals[1:]))}); effect = coefficient; no interactions"
            )
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


def _block_columns(blocks: Sequence[Any], prefix: str = "block") -> tuple[list[str], np.ndarray]:
    """Dummy columns of a block factor (first block = reference)."""
    vals = sorted(set(blocks), key=str)
    b = list(blocks)
    cols = [np.array([1.0 if x == v else 0.0 for x in b]) for v in vals[1:]]
    return [f"{prefix}={v}" for v in vals[1:]], (np.column_stack(cols) if cols else np.zeros((len(b), 0)))


def nuisance_columns(n: int, blocks: Sequence[Any] | None, nodes: Sequence[Any] | None
                     ) -> tuple[np.ndarray, int, int, int]:
    """Intercept, time-block dummies and node dummies (a node column is kept only when it raises the rank:
    a node that coincides with a block adds nothing). Returns (matrix, blocks, nodes, node columns kept)."""
    base = np.ones((n, 1))
    n_blocks = n_nodes = kept = 0
    if blocks is not None and len(set(blocks)) > 1:
        base = np.column_stack([base, _block_columns(blocks)[1]])
        n_blocks = len(set(blocks))
    if nodes is not None and len({x for x in nodes}) > 1:
        n_nodes = len(set(nodes))
        rank = np.linalg.matrix_rank(base)
        for col in _block_columns(nodes, "node")[1].T:
            trial = np.column_stack([base, col])
            if np.linalg.matrix_rank(trial) > rank:
                base, rank, kept = trial, rank + 1, kept + 1
    return base, n_blocks, n_nodes, kept


def _expm1(x: float) -> float:
    """``exp(x) - 1``, the relative change of a log-scale effect; ``inf`` where it overflows (a fit on another scale,
    e.g. the where section's milliseconds, has no relative change and ignores it)."""
    try:
        return math.expm1(x)
    except OverflowError:
        return math.inf


def fit_effects(levels_of_obs: list[dict[str, Any]], y: Sequence[float], factors: list[str], *,
                alpha: float = 0.05, interactions: bool = True, blocks: Sequence[Any] | None = None,
                unit: str = "run", replicated: bool = True, nodes: Sequence[Any] | None = None,
                adjust: bool = True) -> EffectsFit:
    """OLS of ``y`` (one value per unit of replication, e.g. a run's log median step time) on the factors,
    their two-factor interactions and, when given, the block factor (see the module text for the method).

    Args:
        levels_of_obs: per observation, the factor levels of its cell.
        y: per observation, the response (log scale: effects are changes of log step time).
        factors: the varied factors (at least two distinct levels each among the observations).
        alpha: the intervals are at ``1 - alpha``; a term is significant when its Holm-adjusted p < alpha.
        interactions: include two-factor interactions of the two-level factors.
        blocks: per observation, its block (the time block of a blocked sweep); ``None`` = no block factor.
        nodes: per observation, the node it ran on (Ray node id); a fixed blocking factor when more than one
            node appears (dummy coded; a node column that a time block already spans is left out).
        unit: what one observation is (stated in the report).
        replicated: ``False`` when each cell has one observation: the residual is then not a run-to-run
            variance, so no interval and no p value are given.
        adjust: Holm-adjust the p values (``False``: ``p_adjusted`` stays ``None``; the sequential stop rule,
            which controls its error rate with its own intervals, skips it).

    Columns are added greedily (intercept, blocks, nodes, main effects, interactions); one that does not raise
    the rank of the design is *not estimable*: its alias (a kept column equal to +-it) is named when
    there is one.

    Raises:
        ValueError: fewer observations than model terms.
    """
    import statsmodels.api as sm
    from statsmodels.stats.multitest import multipletests

    y = np.asarray(y, dtype=float)
    names, fl, kinds, mat, coding = model_columns(levels_of_obs, factors, interactions)
    keep: list[int] = []
    not_est: dict[str, str] = {}
    alias_of: dict[int, list[str]] = {}
    base, n_blocks, n_nodes, node_cols = nuisance_columns(len(y), blocks, nodes)
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
        elif (n_blocks or n_nodes) and (np.linalg.matrix_rank(np.column_stack([base, mat[:, j]]))
                                        == np.linalg.matrix_rank(base)):
            not_est[names[j]] = "confounded with the " + " and the ".join(
                w for w, n in (("time blocks", n_blocks), ("nodes", n_nodes)) if n)
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
                              p_value=p, change=_expm1(eff), change_ci_low=_expm1(lo),
                              change_ci_high=_expm1(hi), aliases=alias_of.get(k, [])))
        else:
            terms.append(Term(name=names[k], factors=fl[k], kind=kinds[k], effect=eff, se=None, ci_low=None,
                              ci_high=None, p_value=None, change=_expm1(eff), change_ci_low=None,
                              change_ci_high=None, aliases=alias_of.get(k, [])))
    ps = [t.p_value for t in terms if t.p_value is not None and math.isfinite(t.p_value)]
    if ps and adjust:
        adj = iter(multipletests(ps, alpha=alpha, method="holm")[1])
        for t in terms:
            if t.p_value is not None and math.isfinite(t.p_value):
                t.p_adjusted = float(next(adj))
                t.significant = t.p_adjusted < alpha
    sd = float(math.sqrt(res.scale)) if replicated and df_resid > 0 else None
    return EffectsFit(terms=terms, not_estimable=not_est, residual_sd=sd, df_resid=df_resid,
                      n_obs=len(y), n_cells=n_cells, level=1 - alpha, coding=coding, unit=unit, n_blocks=n_blocks,
                      replicated=replicated, note=note, n_nodes=n_nodes, node_columns=node_cols)


def cell_means_residual(cells: Sequence[Sequence[tuple[Any, float]]], *, blocked: bool,
                        nodes: Sequence[Sequence[Any]] | None = None) -> tuple[float | None, int]:
    """Residual SD and degrees of freedom of the cell-means model of per-run values.

    ``cells``: per cell, its runs as ``(block, value)`` (value on the analysis scale, e.g. log seconds).
    Model: one mean per cell, plus a fixed block effect when ``blocked`` (randomized complete block
    design; Montgomery 9th ed., sec. 4.1) and a fixed node effect when ``nodes`` (per cell, the node of
    each of its runs, aligned with ``cells``) names more than one node. Returns ``(None, 0)`` when no
    degree of freedom is left (one run per cell).
    """
    y = np.array([v for c in cells for _, v in c], dtype=float)
    if len(y) == 0:
        return None, 0
    cols = [np.array([1.0 if i == j else 0.0 for j, c in enumerate(cells) for _ in c]) for i in range(len(cells))]
    X = np.column_stack([c for c in cols if c.any()])
    if blocked:
        _, bcols = _block_columns([b for c in cells for b, _ in c])
        X = np.column_stack([X, bcols])
    flat = [x for c in (nodes or []) for x in c]
    if nodes is not None and len(flat) == len(y) and len(set(flat)) > 1:
        X = np.column_stack([X, _block_columns(flat, "node")[1]])  # rank (not columns) sets the df below
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
