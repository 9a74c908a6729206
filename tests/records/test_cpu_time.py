"""CPU time per step (issue 45): the embedded engine logs ``timing_s/step_cpu`` (process CPU seconds of the step,
user + sys of every thread) beside ``timing_s/step``; it flows through the same functions as the step time, from the
run's steps to its summary (:func:`bench.measure.summarize`), the snapshot's samples
(:func:`bench.records.snapshot.record_samples`), MLflow's run values and the stored gate (``--metric cpu_time``), with
its own sweep-to-sweep offset, never scaled by the wall-clock speed probe. The real engine's values are checked in
``tests/test_embedded_run.py``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.gate.baseline import history_entry, sweep_to_sweep
from bench.gate.verdicts import compare_snapshots
from bench.measure import summarize
from bench.records.figures import run_value
from bench.records.snapshot import record_samples
from bench.spec.metrics import METRICS


def _record(wall: list[float], cpu: list[float], probe: float = 0.03) -> dict:
    """A run record as the runner writes it: per-step verl metrics of 1 warm-up step and the timed steps."""
    steps = {str(i + 1): {"timing_s/step": w, "timing_s/step_cpu": c, "bench/speed_probe_s": probe}
             for i, (w, c) in enumerate(zip(wall, cpu))}
    summ = summarize({int(k): v for k, v in steps.items()}, warmup_steps=1)
    return {"status": "ok", "steps": steps, "summary": summ}


def test_cpu_time_goes_where_step_time_goes():
    rec = _record([3.0, 2.0, 2.2, 2.1], [2.5, 1.5, 1.7, 1.6])
    summ = rec["summary"]
    assert summ["timed_steps"] == [2, 3, 4]
    assert summ["cpu_time_samples_s"] == [1.5, 1.7, 1.6] and summ["cpu_time_median_s"] == 1.6
    smp = record_samples(rec)
    assert smp["cpu_time"] == [1.5, 1.7, 1.6] and smp["step_time"] == [2.0, 2.2, 2.1]
    assert run_value(smp["cpu_time"]) == summ["cpu_time_median_s"]
    assert METRICS["cpu_time"].scale == "log" and not METRICS["cpu_time"].higher_is_better
    # an engine that does not log it: no samples, no value (missing, never 0)
    old = {"status": "ok", "steps": {"1": {"timing_s/step": 2.0}, "2": {"timing_s/step": 2.0}}}
    old["summary"] = summarize({1: old["steps"]["1"], 2: old["steps"]["2"]}, warmup_steps=1)
    assert record_samples(old)["cpu_time"] == [] and old["summary"]["cpu_time_median_s"] is None


def _cell(i: int, runs: list[tuple[float, float]]) -> dict:
    """A snapshot cell whose runs have these (wall, CPU) seconds at each of 3 timed steps."""
    reps = []
    for k, (w, c) in enumerate(runs):
        smp = record_samples(_record([w] * 4, [c] * 4))
        reps.append({"repeat": k, "status": "ok", "samples": smp, "probe_spec": "kernel"})
    return {"key": f"cell={i}", "cell_id": f"c{i}", "label": f"cell{i}", "levels": {}, "status": "ok",
            "failures": [], "missing_repeats": [], "repeats": reps}


def _snap(rng: np.random.Generator, wall: float, cpu: float) -> dict:
    cells = [_cell(i, [(wall * math.exp(rng.normal(0, 0.05)), cpu * math.exp(rng.normal(0, 0.005)))
                       for _ in range(5)]) for i in range(2)]
    return {"engine": "embedded", "platform": "cpu", "source": {"sweep": "s"}, "cells": cells, "base": {},
            "versions": {}, "name": "b", "_kind": "baseline"}


def test_the_stored_gate_judges_cpu_time_with_its_own_sweep_offset():
    """Wall time that moves 5 % from run to run while CPU time moves 0.5 % (a contended machine): the gate on CPU time
    decides where the one on step time cannot; a 10 % CPU-time slowdown is a regression; without a measured CPU-time
    offset (one save) it is not decided."""
    rng = np.random.default_rng(45)
    saves = [_snap(rng, 2.0, 1.6) for _ in range(4)]
    s2s = sweep_to_sweep([history_entry(s) for s in saves])
    assert s2s["cpu_time"]["df"] == 3 and s2s["cpu_time"]["sd_log"] < 0.01 < s2s["sd_log"]

    def gate(cand: dict, fig: dict | None = s2s) -> dict:
        return compare_snapshots(saves[-1], cand, metrics=["step_time", "cpu_time"], threshold=0.05, alpha=0.01,
                                 n_boot=0, s2s=fig)

    g = gate(_snap(rng, 2.0, 1.6))
    rows = {r["metric"]: [x for x in g["rows"] if x["metric"] == r["metric"]] for r in g["rows"]}
    assert {r["verdict"] for r in rows["cpu_time"]} == {"unchanged"}, rows["cpu_time"]
    assert {r["verdict"] for r in rows["step_time"]} == {"noisy"}
    assert all(not r["normalized"] and "not scaled by the wall-clock probe" in r["normalize_reason"]
               for r in rows["cpu_time"])
    assert all(r["sweep_offset_sd"] == pytest.approx(math.sqrt(max(0.0, s2s["cpu_time"]["sd_log"] ** 2
                                                                     - np.var([math.log(x["samples"]["cpu_time"][0])
                                                                               for x in c["repeats"]], ddof=1) / 5)))
               for r, c in zip(rows["cpu_time"], saves[-1]["cells"]))
    slow = gate(_snap(rng, 2.0, 1.6 * 1.10))
    assert {r["verdict"] for r in slow["rows"] if r["metric"] == "cpu_time"} == {"regression"}
    once = sweep_to_sweep([history_entry(saves[0])])
    assert once["cpu_time"] is None
    cpu_once = [r for r in gate(_snap(rng, 2.0, 1.6), once)["rows"] if r["metric"] == "cpu_time"]
    assert all(r["verdict"] == "cannot judge" and r["judged_verdict"] == "unchanged"
               and "no measured sweep-to-sweep offset" in r["reason"] for r in cpu_once), cpu_once
