"""A stand-in executor whose machine drifts: step times grow with the run's position in wall-clock order.

The timing model (:func:`run_step_times`) is one function of the run's levels, its position in the
execution order and a seeded generator:

``log t = log base + drift * position / (runs - 1) + sum_f effect_f * [level_f on] + run_noise + step_noise``

so a sweep whose cells run one after another (``--order sequential``) sees the drift as an effect of
whichever factor changes with the position, while a blocked, shuffled order spreads it evenly.
:class:`DriftExecutor` writes what a real run writes (``metrics.jsonl`` in verl format, with the
speed-probe metric off) from that model, so the real planner, sweep, records and report run on it;
:func:`drift_snapshot` builds the same sweep's snapshot in memory for the many-sweeps tests.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.core.process import ExecResult
from bench.engines.builtins.speed_probe import spec as probe_kernel
from bench.execution.executors import ResolvedLaunch
from bench.records.snapshot import levels_key
from bench.records.speed import PROBE_METRIC
from bench.spec.plan import RunOrder

#: timing model defaults: 2 s steps, +15 % drift over the sweep (log scale), 1 % run-to-run, 2 % step-to-step
BASE_S, DRIFT, RUN_SD, STEP_SD = 2.0, math.log(1.15), 0.01, 0.02


def run_step_times(levels: dict[str, Any], position: int, n_runs: int, steps: int, rng: np.random.Generator, *,
                   drift: float = DRIFT, effects: dict[str, float] | None = None, run_sd: float = RUN_SD,
                   step_sd: float = STEP_SD) -> list[float]:
    """Per-step times (s) of the run at ``position`` (0-based) of ``n_runs``; ``effects``: factor -> log-effect
    of its on level (``math.log(1.10)`` = 10 % slower)."""
    mu = math.log(BASE_S) + drift * position / max(n_runs - 1, 1)
    mu += sum(e for k, e in (effects or {}).items() if levels.get(k))
    off = rng.normal(0, run_sd)
    return [math.exp(mu + off + rng.normal(0, step_sd)) for _ in range(steps)]


class DriftExecutor:
    """Executes runs in call order with the drifting timing model (reads the run's ``spec.json`` levels
    and ``run_config.yaml`` step count as the real engine would)."""

    name = "drift-fake"

    def __init__(self, n_runs: int, seed: int = 0, stop_after: int | None = None, probe: bool = False, **model: Any):
        """``probe``: log a speed probe at each step that follows the drift (``0.03 s x exp(drift x position)``)
        and name its kernel in ``evidence.json``, as the embedded engine does on CPU."""
        self.n_runs, self.model, self.probe = n_runs, model, probe
        self.rng = np.random.default_rng(seed)
        self.calls: list[tuple[str, int]] = []
        self.stop_after = stop_after

    def execute(self, launch: ResolvedLaunch) -> ExecResult:
        if self.stop_after is not None and len(self.calls) >= self.stop_after:
            raise KeyboardInterrupt  # the harness is killed before this run
        rd = Path(launch.run_dir)
        spec = json.loads((rd.parent / "spec.json").read_text())
        cfg = yaml.safe_load((rd / "run_config.yaml").read_text())
        self.calls.append((spec["cell_id"], int(rd.name[1:])))
        times = run_step_times(spec["levels"], len(self.calls) - 1, self.n_runs, int(cfg["steps"]), self.rng,
                               **self.model)
        slow = math.exp(self.model.get("drift", DRIFT) * (len(self.calls) - 1) / max(self.n_runs - 1, 1))
        if self.probe:
            (rd / "evidence.json").write_text(json.dumps({"speed_probe": {"enabled": True, "spec": probe_kernel()}}))
        with open(rd / "metrics.jsonl", "w") as fh:
            for step, t in enumerate(times, start=1):
                data = {"timing_s/step": t, "timing_s/gen": t / 2, "timing_s/update_actor": t / 4,
                        "perf/throughput": 1000.0 / t, "perf/total_num_tokens": 1000}
                if self.probe:
                    data[PROBE_METRIC] = 0.03 * slow
                fh.write(json.dumps({"step": step, "data": data}) + "\n")
        (rd / "run.log").write_text("ok\n")
        return ExecResult(0, False, 0.01, "")


def drift_snapshot(cells: list[dict[str, Any]], order: RunOrder, *, steps: int = 8, seed: int = 0,
                   **model: Any) -> dict[str, Any]:
    """The snapshot (:func:`bench.records.snapshot.snapshot` shape) of a sweep of ``cells`` (cell id -> levels in
    ``cells[i]['levels']``, ``cells[i]['cell_id']``) run in ``order`` on the drifting machine."""
    rng = np.random.default_rng(seed)
    by_id = {c["cell_id"]: c for c in cells}
    reps: dict[str, list[dict[str, Any]]] = {c["cell_id"]: [] for c in cells}
    for pos, (cid, k) in enumerate(order.runs):
        times = run_step_times(by_id[cid]["levels"], pos, len(order.runs), steps, rng, **model)
        reps[cid].append({"repeat": k, "status": "ok", "samples": {"step_time": times}, "steps": list(range(steps)),
                          "summary": {}})
    repeats = 1 + max(k for _, k in order.runs)
    return {
        "format": "grpo-bench-baseline",
        "format_version": 1,
        "engine": "embedded",
        "platform": "cpu",
        "source": {"matrix": "drift", "sweep_id": f"drift-{seed}", "sweep": "drift"},
        "repeats": repeats,
        "order": {"kind": order.kind, "seed": order.seed},
        "design": {"type": "full"},
        "cells": [
            {
                "key": levels_key(c["levels"]),
                "cell_id": c["cell_id"],
                "label": c["label"],
                "levels": c["levels"],
                "all_off": c["all_off"],
                "status": "ok",
                "failures": [],
                "missing_repeats": [],
                "repeats": sorted(reps[c["cell_id"]], key=lambda r: r["repeat"]),
            }
            for c in cells
        ],
    }
