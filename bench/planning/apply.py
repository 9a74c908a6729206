"""Re-plan a matrix for ``--precision``/``--budget``: the noise and cost model of its target from the finished sweeps
in the results folder (:func:`target_sweeps`, :func:`bench.planning.model.estimate_model`), the allocation of
timed steps per run and repeats (:func:`bench.planning.allocation.plan_allocation`), and the matrix and plan
that run it (:func:`replan`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.core.errors import BenchError
from bench.core.files import read_json
from bench.planning.allocation import plan_allocation, steps_range_for
from bench.planning.model import estimate_model, kj_optimal_steps
from bench.records.results import SWEEP, load_records
from bench.spec.matrix import Matrix
from bench.spec.plan import make_plan

#: base settings that planning changes or that do not change what a step costs: left out when matching a target
PLANNED_KEYS = ("steps", "warmup_steps", "profile_steps", "timeout_s", "seed")


def target_key(engine: str, platform: str, base: dict[str, Any]) -> str:
    """The target a sweep measured: engine, platform and the base settings planning does not change."""
    import json

    return json.dumps({"engine": engine, "platform": platform,
                       "base": {k: v for k, v in sorted(base.items()) if k not in PLANNED_KEYS}}, sort_keys=True,
                      default=str)


def target_sweeps(results_root: Path, key: str) -> list[tuple[str, list[dict[str, Any]]]]:
    """``(matrix/sweep id, run records)`` of every finished (status ``complete``) sweep of the target ``key``."""
    out = []
    for path in sorted(Path(results_root).glob(f"*/*/{SWEEP}")):
        if path.parent.is_symlink():  # results/<matrix>/latest
            continue
        meta = read_json(path) or {}
        if meta.get("status") != "complete":
            continue
        base = (meta.get("matrix") or {}).get("base") or {}
        if target_key(meta.get("engine", ""), meta.get("platform", ""), base) != key:
            continue
        out.append((f"{meta.get('matrix_name')}/{meta.get('sweep_id')}", load_records(path.parent)))
    return out


def replan(matrix: Any, plan: Any, results_root: Path, *, precision: float | None, budget_s: float | None,
           alpha: float, threshold: float, slots: int = 1) -> tuple[Any, Any, dict[str, Any]]:
    """The matrix and plan with planned ``base.steps`` (warm-up + timed + profiled, the profiled steps last) and
    ``repeats``, and the planning record (``sweep.json`` key ``planning``, MLflow ``plan.*``).

    Without a finished sweep of the target the matrix is kept (this sweep is the pilot) and the record says so.
    ``slots``: runs of a block at once (``--parallel``), which shortens a block's wall time for ``--budget``.

    Raises:
        BenchError: no factor varies among the plan's runs (nothing to plan for).
    """
    goal = f"precision +-{precision:.2%}" if precision is not None else f"budget {budget_s / 60:.1f} min"
    base = matrix.base
    key = target_key(plan.engine, plan.platform, base.model_dump(mode="json"))
    sweeps = target_sweeps(results_root, key)
    model = estimate_model(sweeps)
    record: dict[str, Any] = {"goal": goal, "precision": precision, "budget_s": budget_s, "alpha": alpha,
                              "threshold": threshold, "model": None, "allocation": None, "reached": False,
                              "parallel": slots}
    if model is None:
        record["note"] = (f"no finished sweep of this target in {results_root} (engine {plan.engine}, platform "
                          f"{plan.platform}, same base settings): this sweep is the pilot, with the matrix's own "
                          f"{base.steps} steps x {matrix.repeats} repeats and sequential stopping")
        return matrix, plan, record
    factors = [f for f in plan.varied if len({r.levels.get(f) for r in plan.runs if r.levels.get(f) is not None}) > 1]
    if not factors:
        raise BenchError(f"{matrix.source}: --precision/--budget: no factor varies among the runs (nothing to plan)")
    cells = [{f: r.levels.get(f) for f in factors} for r in sorted(plan.runs, key=lambda r: r.cell_id)]
    prof = len(base.profile_steps or [])
    own_timed = max(1, base.steps - base.warmup_steps - prof)
    steps_range = steps_range_for(own_timed)  # never fewer timed steps than the matrix (same batches)
    alloc, reached = plan_allocation(model, cells, factors, precision=precision, budget_s=budget_s, alpha=alpha,
                                     warmup=base.warmup_steps, profiled=prof, slots=slots, steps_range=steps_range)
    steps = base.warmup_steps + alloc.timed_steps + prof
    new_base = {**base.model_dump(mode="json"), "steps": steps,
                "profile_steps": list(range(steps - prof + 1, steps + 1)) if base.profile_steps else None}
    data = {**matrix.model_dump(mode="json"), "base": new_base, "repeats": alloc.repeats}
    new = Matrix.model_validate(data)
    new.source, new.selected_cells = matrix.source, matrix.selected_cells
    levels = [r.levels for r in plan.runs]
    new_plan = make_plan(new, plan.platform, strict=True)
    new_plan = new_plan.model_copy(update={"runs": [r for r in new_plan.runs if r.levels in levels]})
    if matrix.selected_cells:
        new.selected_cells = sorted(r.cell_id for r in new_plan.runs)
    kj = kj_optimal_steps(model, base.warmup_steps, prof)
    record.update(model=model.to_dict(), allocation=alloc.to_dict(), reached=reached, timed_steps=alloc.timed_steps,
                  repeats=alloc.repeats, predicted_wall_s=alloc.wall_s,
                  predicted_half_width=math.expm1(alloc.half_width), model_from=",".join(model.sweeps)[:400],
                  min_timed_steps=own_timed,
                  kj_steps="unbounded (no run-to-run spread beyond the steps')" if math.isinf(kj) else f"{kj:.1f}")
    return new, new_plan, record
