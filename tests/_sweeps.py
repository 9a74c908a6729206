"""Synthetic sweeps for the gate, baseline and report tests (the writer itself is checked by
``tests/records/test_sweep_fixture.py``).

:func:`make_sweep` writes a results folder exactly as :mod:`bench.execution.sweep` does (``sweep.json`` with the
plan, ``<cell>/r<k>/record.json`` measured by :func:`bench.measure.summarize`, ``latest``), with step
times drawn from a function of the cell's levels, so tests know the true effects.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bench.core.files import atomic_write_json
from bench.engines.builtins.speed_probe import spec as probe_kernel
from bench.measure import summarize
from bench.records.results import SWEEP, ResultsDir, run_dir
from bench.records.run_record import SCHEMA_VERSION
from bench.records.speed import PROBE_METRIC
from bench.spec.optimizations import FACTOR_KEYS, REGISTRY

EMBEDDED_NA = ("task_queue", "forward_prefetch", "mc2", "mrope_cache", "graph_mode")


def label_of(levels: dict[str, Any]) -> str:
    on = [f"{k}={v}" if REGISTRY[k].levels != (0, 1) else k for k, v in levels.items() if v]
    return "+".join(on) if on else "all-off"


def full_levels(cell: dict[str, Any], engine: str = "embedded") -> dict[str, Any]:
    """Every registry factor: the cell's level, ``None`` where not applicable, else off."""
    out = {}
    for k in FACTOR_KEYS:
        if engine == "embedded" and k in EMBEDDED_NA:
            out[k] = None
        else:
            out[k] = cell.get(k, REGISTRY[k].off)
    return out


def log_normal_times(base_s: float = 2.0, effects: dict[str, float] | None = None,
                     interactions: dict[tuple[str, str], float] | None = None, sd: float = 0.02,
                     run_sd: float = 0.0, delay_s: float = 0.0, work_sd: float = 0.0) -> Callable:
    """A step-time function: ``log t = log base + sum(effect_f * x_f / 2) + sum(int * x_a x_b / 2) + work + noise``.

    ``effects`` are full effects on log step time (low -> high, x = +-1); ``run_sd``: a per-repeat offset;
    ``work_sd``: spread of a per-step workload term that is the same in every run (same seed).
    """
    work = np.random.default_rng(12345).normal(0, work_sd, 1000) if work_sd else np.zeros(1000)
    effects = effects or {}
    interactions = interactions or {}

    def fn(levels: dict[str, Any], repeat: int, step: int, rng: np.random.Generator, run_offset: float) -> float:
        x = {k: (1.0 if v else -1.0) for k, v in levels.items() if v is not None}
        mu = math.log(base_s)
        mu += sum(e * x.get(k, -1.0) / 2 for k, e in effects.items())
        mu += sum(e * x.get(a, -1.0) * x.get(b, -1.0) / 2 for (a, b), e in interactions.items())
        return math.exp(mu + work[step] + run_offset + rng.normal(0, sd)) + delay_s

    fn.run_sd = run_sd  # type: ignore[attr-defined]
    return fn


def make_sweep(root: Path, name: str, cells: list[dict[str, Any]], *, repeats: int = 2, steps: int = 6,
               warmup: int = 1, engine: str = "embedded", platform: str = "cpu", times: Callable | None = None,
               seed: int = 0, failed: dict[tuple[int, int], str] | None = None, pending: set | None = None,
               expect: list | None = None, design: dict | None = None, aliases: list[str] | None = None,
               resolution: int | None = None, base_extra: dict | None = None, sweep_id: str | None = None,
               parent_run_id: str | None = None, no_samples: set | None = None, same_work: bool = False,
               psi: float | None = None, machine: float | list[float] | None = None, machine_sd: float = 0.0) -> Path:
    """Write a synthetic sweep; returns its folder.

    ``cells``: factor levels per cell (omitted factors off; engine's n/a factors None). ``failed``:
    (cell index, repeat) -> failure kind. ``pending``: (cell index, repeat) never ran. The last step is
    the profiled one; the timed steps are ``warmup+1 .. steps-1``. ``same_work``: every run samples the
    same response lengths step by step (as runs with one seed do), so the gate pairs steps. ``psi``: the
    CPU pressure recorded around each run. ``machine``: the machine's slowness during this sweep
    (1.0 = nominal, 1.08 = 8 % slower): every step time is multiplied by it and each step carries a
    speed-probe time of ``0.03 s * machine`` (+-0.5 %), as the embedded engine logs it (``bench.records.speed``);
    a list gives one factor per cell; None = no probe. ``machine_sd``: each run's machine slowness varies by this
    SD of log around it (steps and probe alike, as a shared VM's speed moves from run to run).
    """
    rng = np.random.default_rng(seed)
    times = times or log_normal_times()
    failed = failed or {}
    pending = pending or set()
    no_samples = no_samples or set()
    rd = ResultsDir(root, name)
    fp = hashlib.sha256(json.dumps([name, cells, seed, base_extra], sort_keys=True, default=str).encode()).hexdigest()[
        :10
    ]
    sweep_id = sweep_id or time.strftime("%Y%m%d-%H%M%S") + f"-{fp}-{seed}"
    sweep = rd.base / sweep_id
    sweep.mkdir(parents=True)
    runs = []
    base = {"steps": steps, "warmup_steps": warmup, "train_batch_size": 8, "n": 4, "embedded": dict(base_extra or {})}
    for i, c in enumerate(cells):
        slow = machine[i] if isinstance(machine, list) else machine
        lv = full_levels(c, engine)
        cid = hashlib.sha256(json.dumps([lv, base, engine], sort_keys=True).encode()).hexdigest()[:12]
        all_off = all(v is None or v == REGISTRY[k].off for k, v in lv.items())
        runs.append(
            {
                "cell_id": cid,
                "label": label_of(lv),
                "levels": lv,
                "cells": [{k: (v or 0) for k, v in lv.items()}],
                "not_applicable": {},
                "all_off": all_off,
            }
        )
        for k in range(repeats):
            if (i, k) in pending:
                continue
            rdir = run_dir(sweep, cid, k)
            rdir.mkdir(parents=True)
            off = rng.normal(0, getattr(times, "run_sd", 0.0))
            run_machine = (slow or 1.0) * (math.exp(rng.normal(0, machine_sd)) if machine_sd else 1.0)
            metrics = {}
            for s in range(1, steps + 1):
                st = times(lv, k, s, rng, off) * run_machine
                gen = 0.55 * st
                resp_max = 64.0
                resp_mean = (
                    20.0 + (s * 7) % 11 if same_work else 30.0 + 10 * (lv.get("dynamic_bsz") or 0) + rng.normal(0, 1)
                )
                metrics[s] = {"timing_s/step": st, "timing_s/gen": gen, "timing_s/reward": 0.02 * st,
                              "timing_s/old_log_prob": 0.1 * st, "timing_s/ref": 0.1 * st, "timing_s/adv": 0.01 * st,
                              "timing_s/update_actor": 0.2 * st, "perf/throughput": 1000.0 / st,
                              "response_length/mean": resp_mean, "response_length/max": resp_max,
                              "response_length/min": 8.0, "perf/cpu_memory_used_gb": 3.0}
                if slow is not None:
                    metrics[s][PROBE_METRIC] = 0.03 * run_machine * math.exp(rng.normal(0, 0.005))
            if (i, k) in no_samples:
                metrics = {s: {kk: vv for kk, vv in m.items() if kk != "timing_s/step"} for s, m in metrics.items()}
            free = {steps: 0.25 + 0.02 * rng.normal()}
            summ = summarize(metrics, warmup, free, [steps])
            status = "failed" if (i, k) in failed else "ok"
            rec = {
                "schema_version": SCHEMA_VERSION,
                "cell_id": cid,
                "repeat": k,
                "engine": engine,
                "platform": platform,
                "levels": lv,
                "cells": runs[-1]["cells"],
                "status": status,
                "failure_kind": failed.get((i, k)),
                "reason": f"synthetic {failed[(i, k)]}" if status == "failed" else "",
                "steps": {str(s): m for s, m in metrics.items()} if status == "ok" else {},
                "free_ratio": {str(s): v for s, v in free.items()} if status == "ok" else {},
                "summary": summ if status == "ok" else {},
                "label": label_of(lv),
                "all_off": all_off,
            }
            if slow is not None:
                rec["evidence"] = {"speed_probe": {"enabled": True, "spec": probe_kernel(), "metric": PROBE_METRIC}}
            if psi is not None:
                rec["host_load"] = {"before": {"cpu_pressure_avg60": psi}, "after": {"cpu_pressure_avg60": psi}}
            atomic_write_json(rdir / "record.json", rec)
    meta = {"sweep_id": sweep_id, "matrix_name": name, "matrix_source": f"matrix/{name}.yaml", "fingerprint": fp,
            "engine": engine, "platform": platform,
            "matrix": {"name": name, "engine": engine, "platform": platform, "base": base,
                       "design": design or {"type": "full"}, "repeats": repeats, "expect": expect or []},
            "plan": {"runs": runs, "dropped": [], "design_cells": len(cells), "varied": [],
                     "aliases": aliases or [], "resolution": resolution, "repeats": repeats},
            "versions": {"torch": "2.14.1"}, "git_commit": "synthetic", "parent_run_id": parent_run_id,
            "status": "complete", "created_at": time.time()}
    atomic_write_json(sweep / SWEEP, meta)
    rd.point_latest(sweep)
    return sweep


EMBEDDED_CELLS = [{}, {"dynamic_bsz": 1}, {"rmsnorm_fused": 1}, {"rmsnorm_fused": 1, "dynamic_bsz": 1}]

