"""The plan of timed steps per run x repeats per cell that the noise and cost model of a target implies.

The model (:class:`~bench.planning.model.NoiseCost`, :func:`~bench.planning.model.estimate_model`):
run to run, step index shared by the runs, run x step interaction, block; costs of a run
(:mod:`bench.planning.model`, Kalibera & Jones, ISMM 2013).

Plan (:func:`plan_allocation`): for ``n`` timed steps and ``R`` repeats (= blocks) of the plan's cells,
the standard error of each main effect is ``sqrt(V(n)) * m * sqrt([(X'X)^-1]_jj)`` for the design
matrix ``X`` of the run-level model (:func:`bench.stats.effects.fit_effects`: intercept, blocks,
nodes with ``--parallel``, mains, interactions; ``m = 2`` for +-1 coded terms) and ``V(n)`` of
:meth:`~bench.planning.model.NoiseCost.run_var`; the predicted precision is the half-width of
the decision interval at the last planned look (:func:`bench.planning.sequential.critical_value`,
alpha shared over the main effects). The wall time is ``R x ceil(cells / slots) x (startup + harness +
warm-up and profiled steps + n x step_s)``. ``--precision`` picks the cheapest ``(n, R)`` reaching it,
``--budget`` the most precise within it (grid search; the cost-optimal ``n`` is close to Kalibera &
Jones' ``n* = sqrt(kappa sd_step^2 C_run / (sd_run^2 c_step))``,
:func:`bench.planning.model.kj_optimal_steps`): dear
start-up and cheap steps give more steps per run, large run-to-run spread more runs, and only the run x
step interaction (not the step pattern the runs share) is averaged out by more steps.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from bench.planning.model import NoiseCost, estimate_model
from bench.records.results import load_records

#: bounds of the grid search: timed steps per run and repeats (blocks) per cell
STEPS_RANGE = (2, 200)
REPEATS_RANGE = (2, 30)


def steps_range_for(own_timed: int) -> tuple[int, int]:
    """Timed steps per run that a plan may choose for a matrix that times ``own_timed`` steps: from the matrix's
    own count up (every run replays the same batches, so an effect can depend on which steps are timed:
    dynamic_bsz on full.yaml's embedded target is +16 % over steps 2-9, +6 % over steps 2-3; timing fewer
    steps would measure another quantity) to :data:`STEPS_RANGE`'s end."""
    own = max(1, int(own_timed))
    return max(STEPS_RANGE[0], own), max(STEPS_RANGE[1], own)


def design_factors(cells: Sequence[dict[str, Any]], factors: Sequence[str], repeats: int, *,
                   interactions: bool = True, slots: int = 1) -> tuple[dict[str, float], int]:
    """Per main-effect term, ``m sqrt([(X'X)^-1]_jj)`` (its standard error per unit run SD), and the residual
    degrees of freedom, for ``repeats`` blocks of ``cells`` (factor levels per cell, in the order of their cell
    ids) in the run-level model of :func:`bench.stats.effects.fit_effects`. With ``slots > 1`` (``--parallel``)
    the cell of rank ``i`` runs on node ``(i + k) mod slots`` in block ``k``
    (:meth:`bench.execution.ray_parallel.RayNodesExecutor.assign`) and the node is a second blocking factor, as in the
    report's model. Terms that are not estimable are left out."""
    from bench.stats.effects import model_columns, nuisance_columns  # deferred: bench.stats.effects loads scipy

    obs = [{f: c.get(f) for f in factors} for _ in range(repeats) for c in cells]
    blocks = [k for k in range(repeats) for _ in cells]
    nodes = [(i + k) % slots for k in range(repeats) for i in range(len(cells))] if slots > 1 else None
    names, _, kinds, mat, _ = model_columns(obs, list(factors), interactions)
    cur = nuisance_columns(len(obs), blocks if repeats > 1 else None, nodes)[0]
    keep = []
    for j in range(mat.shape[1]):
        trial = np.column_stack([cur, mat[:, j]])
        if np.linalg.matrix_rank(trial) > np.linalg.matrix_rank(cur):
            cur = trial
            keep.append(j)
    df = len(obs) - cur.shape[1]
    inv = np.linalg.pinv(cur.T @ cur)
    first = cur.shape[1] - len(keep)
    out = {}
    for pos, j in enumerate(keep, start=first):
        if kinds[j] in ("main", "level"):
            out[names[j]] = (2.0 if kinds[j] == "main" else 1.0) * math.sqrt(float(inv[pos, pos]))
    return out, int(df)


@dataclass
class Allocation:
    """A plan: ``timed_steps`` per run, ``repeats`` per cell (the planned maximum number of blocks), ``runs``,
    ``wall_s`` (all blocks), ``half_width`` (log scale, widest main effect, decision interval at the last
    look), ``per_term`` half-widths, ``df``, ``slots`` (runs at once, ``--parallel``)."""

    timed_steps: int
    repeats: int
    runs: int
    wall_s: float
    half_width: float
    df: int
    per_term: dict[str, float]
    slots: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def block_wall_s(model: NoiseCost, n_cells: int, n: int, *, warmup: int, profiled: int, slots: int = 1) -> float:
    """Seconds one block of ``n_cells`` runs takes: its runs one after another, or with ``slots`` runs at once
    (``--parallel``: each node runs its ``ceil(cells / slots)`` share in turn, the block ends with the last)."""
    return math.ceil(n_cells / max(slots, 1)) * model.run_cost(n, warmup, profiled)


def evaluate(model: NoiseCost, cells: Sequence[dict[str, Any]], factors: Sequence[str], n: int, repeats: int, *,
             alpha: float, warmup: int, profiled: int, design: tuple[dict[str, float], int, float] | None = None,
             slots: int = 1) -> Allocation | None:
    """The predicted wall time and precision of ``n`` timed steps x ``repeats`` blocks (``None``: no main effect
    estimable with a residual degree of freedom). ``design``: :func:`design_quantile` of ``repeats``, if known;
    ``slots``: runs at once (:func:`block_wall_s`)."""
    facs, df, q = design or design_quantile(cells, factors, repeats, alpha, slots=slots)
    if not facs or df < 1:
        return None
    sd = math.sqrt(model.run_var(n))
    per = {k: q * sd * v for k, v in facs.items()}
    runs = repeats * len(cells)
    wall = repeats * block_wall_s(model, len(cells), n, warmup=warmup, profiled=profiled, slots=slots)
    return Allocation(timed_steps=n, repeats=repeats, runs=runs, wall_s=wall, half_width=max(per.values()), df=df,
                      per_term=per, slots=slots)


def design_quantile(cells: Sequence[dict[str, Any]], factors: Sequence[str], repeats: int, alpha: float, *,
                    slots: int = 1) -> tuple[dict[str, float], int, float]:
    """:func:`design_factors` of ``repeats`` blocks plus the decision interval's quantile at the last look
    (:func:`bench.planning.sequential.critical_value`, ``alpha`` shared by the main effects; ``inf`` without df)."""
    from bench.planning.sequential import critical_value  # deferred: bench.planning.sequential loads scipy

    facs, df = design_factors(cells, factors, repeats, slots=slots)
    q = critical_value(df, alpha=alpha / max(len(facs), 1), look=repeats, max_looks=repeats) if facs else None
    return facs, df, (q if q is not None else math.inf)


def plan_allocation(model: NoiseCost, cells: Sequence[dict[str, Any]], factors: Sequence[str], *,
                    precision: float | None = None, budget_s: float | None = None, alpha: float = 0.05,
                    warmup: int = 1, profiled: int = 0, steps_range: tuple[int, int] = STEPS_RANGE,
                    repeats_range: tuple[int, int] = REPEATS_RANGE, slots: int = 1) -> tuple[Allocation, bool]:
    """The cheapest allocation whose half-width is at most ``log(1 + precision)``, or the most precise one within
    ``budget_s`` seconds; returns it and whether the goal is reached (else: the closest one, the most precise
    of the grid for ``precision``, the cheapest for ``budget_s``). ``slots``: runs of a block at once on
    distinct nodes (``--parallel N``): a block takes ``ceil(cells / N)`` run times and the node is a blocking
    factor of the model (:func:`design_factors`).

    Raises:
        ValueError: neither or both of ``precision`` and ``budget_s``, or no main effect estimable.
    """
    if (precision is None) == (budget_s is None):
        raise ValueError("plan_allocation: give precision or budget_s")
    best: Allocation | None = None
    fallback: Allocation | None = None
    target = math.log1p(precision) if precision is not None else None
    for r in range(repeats_range[0], repeats_range[1] + 1):
        des = design_quantile(cells, factors, r, alpha, slots=slots)
        for n in range(steps_range[0], steps_range[1] + 1):
            a = evaluate(model, cells, factors, n, r, alpha=alpha, warmup=warmup, profiled=profiled, design=des,
                         slots=slots)
            if a is None or not math.isfinite(a.half_width):
                continue
            if target is not None:
                if a.half_width <= target and (best is None or a.wall_s < best.wall_s):
                    best = a
                if fallback is None or a.half_width < fallback.half_width:
                    fallback = a
            else:
                if a.wall_s <= budget_s and (best is None or a.half_width < best.half_width):
                    best = a
                if fallback is None or a.wall_s < fallback.wall_s:
                    fallback = a
    if best is None and fallback is None:
        raise ValueError("plan_allocation: no main effect can be estimated in this design")
    return (best, True) if best is not None else (fallback, False)


def plan_lines(planning: dict[str, Any]) -> list[str]:
    """Human lines of a planning record (:func:`bench.planning.apply.replan`): the plan, its predicted wall time
    and precision, and why (components, costs)."""
    if not planning.get("model"):
        return [planning.get("note") or "no noise and cost model for this target"]
    m, a = planning["model"], planning["allocation"]
    goal = planning["goal"]
    lines = [
        f"goal: {goal}; {'reached' if planning['reached'] else 'NOT reachable within the search grid: closest plan'}",
        f"plan: {a['timed_steps']} timed step(s) per run x {a['repeats']} repeat(s) (planned blocks) of "
        f"{a['runs'] // max(a['repeats'], 1)} cell(s) = {a['runs']} runs at most; predicted wall time "
        f"{a['wall_s'] / 60:.1f} min at most"
        + (f" with {a.get('slots')} runs of a block at once on distinct Ray nodes" if a.get("slots", 1) > 1 else "")
        + " (sequential stopping ends earlier when every main effect is decided)",
        f"predicted precision: +-{math.expm1(a['half_width']):.2%} half-width of the widest main effect's decision "
        f"interval at the last block ({a['df']} residual df); "
        + ", ".join(f"{k} +-{math.expm1(v):.2%}" for k, v in a["per_term"].items()),
        f"why: noise (log SD) run x step {m['sd_step']:.4f}, step pattern shared by the runs "
        f"{m.get('sd_stepidx', 0.0):.4f}, run {m['sd_run']:.4f}, block {m['sd_block']:.4f}; "
        f"cost start-up {m['startup_s']:.1f} s, timed step {m['step_s']:.2f} s, "
        f"warm-up step {m['warmup_step_s']:.2f} s, "
        f"profiled step {m['profiled_step_s']:.2f} s, harness {m['harness_s']:.1f} s per run",
        f"Kalibera-Jones optimal steps per run: {planning['kj_steps']}; model from {m['runs']} run(s) of "
        f"{len(m['sweeps'])} finished sweep(s): {', '.join(m['sweeps'])}",
    ]
    if planning.get("min_timed_steps"):
        lines.append(f"timed steps searched from the matrix's own {planning['min_timed_steps']} up: every run replays "
                     "the same batches, so timing fewer steps would measure the effects on other batches")
    return lines


def report_section(sweep: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """The report's data on noise and cost (``noise_cost``: :func:`estimate_model` of this sweep's records), the
    sweep's plan (``planning``, from ``sweep.json``) and its sequential looks (``sequential``)."""
    model = estimate_model([(str(meta.get("sweep_id") or sweep), load_records(sweep))])
    return {"noise_cost": model.to_dict() if model else None, "planning": meta.get("planning"),
            "sequential": meta.get("sequential")}


def report_lines(data: dict[str, Any]) -> list[str]:
    """The report's markdown section "Noise, cost and stopping" (empty when the data has none of them)."""
    m, plan, seq = data.get("noise_cost"), data.get("planning"), data.get("sequential")
    if not (m or plan or seq):
        return []
    out = ["", "## Noise, cost and stopping", ""]
    if m:
        out += [f"- noise of log step time (this sweep, {m['runs']} runs): run x step (averages out with more steps) "
                f"{m['sd_step']:.4f}, step pattern shared by every run (same batches; cancels in comparisons) "
                f"{m.get('sd_stepidx', 0.0):.4f}, run to run within a cell {m['sd_run']:.4f}, block to block "
                f"{m['sd_block']:.4f}",
                f"- cost per run: start-up {m['startup_s']:.1f} s, timed step {m['step_s']:.2f} s, warm-up step "
                f"{m['warmup_step_s']:.2f} s, profiled step {m['profiled_step_s']:.2f} s, harness between runs "
                f"{m['harness_s']:.1f} s (`run_bench.py run MATRIX --precision P` plans from these)"]
    if plan:
        out += [f"- plan: {line}" for line in plan_lines(plan)]
    if seq and seq.get("looks"):
        last = seq["looks"][-1]
        out += [f"- sequential stopping ({seq['method']}): {len(seq['looks'])} of {seq['max_looks']} planned "
                f"block(s); {last['reason']}", f"- last look: {last['line']}"]
    return out + [""]
