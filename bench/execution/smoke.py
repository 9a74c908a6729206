"""The smoke run of ``run_bench.py MATRIX --smoke`` (:func:`run_smoke`): each smoke cell of a matrix
(the engine's ``smoke_cells``: the cell's own launch on this CPU with a tiny model) run once
for real, one after another, with what each cell's run showed in ``smoke.json``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.core.engine_registry import get_engine
from bench.core.files import atomic_write_json
from bench.execution.executors import LocalExecutor
from bench.execution.runner import execute_spec
from bench.measure.patch_reports import patch_evidence
from bench.spec.matrix import Matrix
from bench.spec.plan import Plan


def run_smoke(matrix: Matrix, plan: Plan, results_root: Path, *, steps: int = 2, executor: Any = None,
              on_cell: Any = None) -> tuple[Path, list[dict[str, Any]]]:
    """Run every smoke cell; returns the smoke folder and one result per cell.

    Each result: ``{"cell": label, "cell_id", "status": "ran" | "failed", "steps": n, "step_time_s",
    "reason": first verl error line, "failure_kind", "left_out": [...], "inert_env": [...],
    "patches": {patch: "applied in N; refused in M: why"}, "evidence": {factor: verdict}}``.
    ``evidence`` holds only the factors whose evidence is missing or contradicted, among those the CPU
    target can exercise (the engine's ``not_exercised`` lists the others). ``smoke.json`` in the folder holds the list.
    """
    engine = get_engine(plan.engine)
    cells = engine.smoke_cells(matrix, plan, steps)
    inert_factors = engine.not_exercised(plan, matrix)
    folder = Path(results_root) / f"{matrix.name}-smoke" / time.strftime("%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    executor = executor or LocalExecutor()
    results = []
    for i, cell in enumerate(cells, 1):
        if on_cell:
            on_cell("start", i, len(cells), cell, None)
        rdir = folder / cell.spec.cell_id
        rec = execute_spec(cell.spec, rdir, 0, executor, warmup_steps=0)
        st = (rec.get("summary") or {}).get("step_time_median_s")
        res = {
            "cell": cell.source_label, "cell_id": cell.spec.cell_id,
            "status": "ran" if rec["status"] == "ok" else "failed",
            "steps": len(rec.get("steps") or {}), "step_time_s": st,
            "failure_kind": rec.get("failure_kind"), "reason": rec.get("reason", ""),
            "left_out": cell.left_out, "inert_env": cell.inert, "patches": patch_evidence(rdir),
            "evidence": {k: v for k, v in (rec.get("evidence") or {}).items()
                         if k in (rec.get("evidence_flagged") or []) and k not in inert_factors},
            "run_dir": str(rdir),
        }
        results.append(res)
        atomic_write_json(folder / "smoke.json", {"matrix": matrix.source, "steps": steps, "cells": results})
        if on_cell:
            on_cell("done", i, len(cells), cell, res)
    return folder, results


__all__ = ["run_smoke"]
