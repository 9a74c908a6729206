"""The typed result model shared by sweep, report, gate, baseline, speed normalization and tune.

Data flows one way: a run's ``record.json`` (:mod:`bench.records.record`) -> a :class:`Snapshot` of the sweep
(:func:`bench.records.snapshot.snapshot`; a baseline file is a saved snapshot) -> statistics. The pydantic models
below name and type what flows between those stages; every stage reads the snapshot through them.

Each statistic is computed in exactly one function here, so that the console table, ``summary.md``,
``report.md``, MLflow and the tune outputs agree by construction:

* :func:`run_value`: one run's value of a metric = the median of its per-step samples over the timed
  steps (measured, not warm-up, not profiled); seconds for ``step_time``. When the snapshot was
  speed-normalized (:func:`bench.records.speed.normalize_snapshot`) the samples are already normalized, and so
  is this value.
* :func:`cell_value`: a cell's value = the geometric mean of its ok runs' values (the run is the unit
  of replication; the geometric mean is the back-transformed mean of the log values the report's model
  uses, so speedups and model effects describe the same quantity).
* :func:`speedup`: reference cell value / cell value (> 1 = faster); the reference is the all-off cell.

Units and names of the gate/report metrics are in :data:`bench.spec.metrics.METRICS`; the record-summary keys in
:data:`SUMMARY_STEP_TIME` and friends.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from bench.measure._common import median

#: record summary keys (``record["summary"]``), spelled once
SUMMARY_STEP_TIME = "step_time_median_s"
SUMMARY_STEP_IQR = "step_time_iqr_s"
SUMMARY_CPU_TIME = "cpu_time_median_s"
SUMMARY_ROLLOUT = "rollout_share_median"
SUMMARY_FREE = "free_ratio_median"
SUMMARY_THROUGHPUT = "throughput_median"
SUMMARY_PEAK_MEM = "peak_memory_gb"


class Samples(BaseModel):
    """Per-step samples of one run (timed steps; Free ratio: profiled steps). ``*_raw``: before speed
    normalization (present once :func:`bench.records.speed.normalize_snapshot` ran)."""

    model_config = ConfigDict(extra="allow")
    step_time: list[float] = Field(default_factory=list)
    #: process CPU seconds per timed step (user + sys, all threads; ``timing_s/step_cpu``), where the engine logs it
    cpu_time: list[float] = Field(default_factory=list)
    throughput: list[float] = Field(default_factory=list)
    rollout_share: list[float] = Field(default_factory=list)
    free_ratio: list[float] = Field(default_factory=list)
    speed_probe: list[float] = Field(default_factory=list)


class RunResult(BaseModel):
    """One repeat of a cell as the snapshot holds it (from its ``record.json``)."""

    model_config = ConfigDict(extra="allow")
    repeat: int
    status: str
    samples: Samples = Field(default_factory=Samples)
    steps: list[int] = Field(default_factory=list)
    workload: list[list[float | None]] = Field(default_factory=list)
    host_load: dict[str, Any] | None = None
    probe_spec: str | None = None
    summary: dict[str, Any] = Field(default_factory=dict)
    #: the Ray node the run ran on (its id; ``None`` for a local run): a blocking factor of the report's model
    node: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the run finished with status ``ok``."""
        return self.status == "ok"


class CellResult(BaseModel):
    """One run spec (cell) of a sweep with its repeats.

    ``status``: ``ok`` (every repeat ok), ``failed`` (a repeat failed) or ``pending`` (a repeat never ran).
    """

    model_config = ConfigDict(extra="allow")
    key: str
    cell_id: str
    label: str
    levels: dict[str, int | None]
    merged_cells: int = 1
    all_off: bool = False
    status: str
    failures: list[dict[str, Any]] = Field(default_factory=list)
    missing_repeats: list[int] = Field(default_factory=list)
    repeats: list[RunResult] = Field(default_factory=list)

    def ok_repeats(self) -> list[RunResult]:
        """The repeats that finished ok, in repeat order."""
        return [r for r in self.repeats if r.ok]

    def groups(self, metric: str) -> list[list[float]]:
        """Per ok repeat, the per-step samples of ``metric`` (repeats without samples left out)."""
        return [list(getattr(r.samples, metric, None) or []) for r in self.ok_repeats()
                if getattr(r.samples, metric, None)]


class Snapshot(BaseModel):
    """What the gate and the report read of a sweep (:func:`bench.records.snapshot.snapshot`); a baseline file
    (format ``grpo-bench-baseline``) is a saved snapshot plus ``name``, ``machine`` and ``created_at``."""

    model_config = ConfigDict(extra="allow")
    format: str
    format_version: int
    engine: str | None
    platform: str | None
    versions: dict[str, Any] = Field(default_factory=dict)
    git_commit: str | None = None
    source: dict[str, Any] = Field(default_factory=dict)
    base: dict[str, Any] = Field(default_factory=dict)
    design: dict[str, Any] = Field(default_factory=dict)
    repeats: int = 1
    varied: list[str] = Field(default_factory=list)
    aliases: list[str] = Field(default_factory=list)
    expect: list[Any] = Field(default_factory=list)
    order: dict[str, Any] | None = None
    cells: list[CellResult]

    def blocked(self) -> bool:
        """Whether the sweep ran in the blocked order (repeat k of every cell in time block k)."""
        return bool(self.order) and self.order.get("kind") == "blocked"


# -- the statistics, one function each -------------------------------------------------------------

def run_value(samples: Sequence[float] | None) -> float | None:
    """One run's value of a metric: the median of its timed-step samples (``None`` without samples).

    Units: those of the samples (seconds for step time).
    """
    if not samples:
        return None
    return median(list(samples))


def cell_value(values: Sequence[float | None]) -> float | None:
    """A cell's value: geometric mean of its runs' values (:func:`run_value`); ``None`` values skipped.

    Falls back to the arithmetic mean when a value is not strictly positive (linear metrics that can be 0).
    """
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not v:
        return None
    if min(v) > 0:
        return float(math.exp(np.mean(np.log(v))))
    return float(np.mean(v))


def speedup(reference: float | None, value: float | None) -> float | None:
    """``reference / value`` of two step-time values (> 1 = faster than the reference); ``None`` when undefined."""
    if reference is None or value is None or value <= 0:
        return None
    return reference / value


def run_values(cell: CellResult, metric: str = "step_time") -> list[tuple[int, float]]:
    """``(repeat, run value)`` of each ok repeat of ``cell`` that has samples of ``metric``."""
    out = []
    for r in cell.ok_repeats():
        v = run_value(getattr(r.samples, metric, None))
        if v is not None:
            out.append((r.repeat, v))
    return out


def reference_cell(cells: Sequence[CellResult]) -> CellResult | None:
    """The all-off cell among ``cells`` (or, without one, the cell with every factor at its lowest level)."""
    ref = next((c for c in cells if c.all_off), None)
    if ref is None and cells:
        lows = {k: min(c.levels[k] for c in cells) for k, v in cells[0].levels.items() if v is not None}
        ref = next((c for c in cells if all(c.levels[k] == v for k, v in lows.items())), None)
    return ref


def cell_stats(snap: Snapshot, metric: str = "step_time") -> dict[str, dict[str, Any]]:
    """Per cell id: ``value`` (:func:`cell_value` of ``metric``), ``runs`` (its run values) and, for
    ``step_time``, ``speedup`` vs the reference cell (:func:`reference_cell` among the finished cells).

    Cells that are not ``ok`` get ``value``/``speedup`` ``None``.
    """
    out: dict[str, dict[str, Any]] = {}
    ok = [c for c in snap.cells if c.status == "ok" and run_values(c, metric)]
    for c in snap.cells:
        runs = run_values(c, metric) if c.status == "ok" else []
        out[c.cell_id] = {"value": cell_value([v for _, v in runs]), "runs": runs, "speedup": None}
    if metric == "step_time":
        ref = reference_cell(ok)
        if ref is not None:
            for c in snap.cells:
                out[c.cell_id]["speedup"] = speedup(out[ref.cell_id]["value"], out[c.cell_id]["value"])
    return out
