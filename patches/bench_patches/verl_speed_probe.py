"""Measurement plumbing for verl runs on a CPU (not an optimization): the machine-speed probe timed between steps.

The embedded engine times a fixed reference kernel next to every step (``bench/speed_probe_s``,
:mod:`bench.engines.builtins.speed_probe`), and the analysis divides step times by it where it tracks them. A
real verl run's steps run in other processes (Ray workers, vLLM's engine), but its driver logs every step's
metrics through verl's ``FileLogger`` (``trainer.logger=[...,file]``) after the step ended and before the next one
starts, when the workers wait for it. This patch times the same kernel there, :data:`REPS` times (median, seconds)
and adds it to that step's metrics as :data:`METRIC`, the speed probe's own metric
(``bench.records.speed.PROBE_METRIC``):
the report, the stop rule and the gate divide step times by it as they do the embedded engine's (the gate only where
it tracks). Measured before it was applied (``benchmarks/bench_verdict.py --bracket-probe``, "in-run probe",
docs/planning.md): over 10 runs its run median tracked the run's median step, r = +0.96, and the run-to-run spread
fell from 14.8 % to 5.0 %. The patch record names the kernel (``probe``), which the run record's evidence takes as
``speed_probe`` (:func:`bench.records.speed.probe_from_patches`).

The kernel and its identity come from the harness (``bench.engines.builtins.speed_probe``; the repository is on
``PYTHONPATH`` of every run process); the step's own timing (``timing_s/step``) ended before the probe runs, so the
probe adds wall time to the run (about ``REPS`` x 30 ms per step) but none to a measured step.
"""

from __future__ import annotations

import statistics
from types import ModuleType
from typing import Any

from bench_patches import PatchRecord, PatchRefused, when_imported

NAME = "verl_speed_probe"
TARGET_MODULE = "verl.utils.tracking"
#: the per-step metric this patch adds (seconds of the reference kernel, median of REPS; lower = faster machine):
#: ``bench.records.speed.PROBE_METRIC`` (this module runs in verl's environment and imports the harness only lazily)
METRIC = "bench/speed_probe_s"
#: kernel repetitions per step
REPS = 3
#: where and how the probe is timed, as the run record's evidence says it
PLACEMENT = f"verl driver, FileLogger.log, after each step, before its metrics are written; median of {REPS}"
_STATE: dict[str, Any] = {"record": None, "probe": None}


def _probe_time() -> float | None:
    """Median seconds of :data:`REPS` runs of the reference kernel in this process (``None`` when it cannot run)."""
    try:
        if _STATE["probe"] is None:
            from bench.engines.builtins.speed_probe import SpeedProbe

            _STATE["probe"] = SpeedProbe()
        probe = _STATE["probe"]
        return float(statistics.median(probe.measure() for _ in range(REPS)))
    except Exception:  # noqa: BLE001 - a probe that cannot run must never cost a step
        return None


def _install(module: ModuleType) -> None:
    cls = getattr(module, "FileLogger", None)
    rec: PatchRecord | None = _STATE["record"]
    if cls is None:
        if rec is not None:
            rec.status("error", f"{module.__name__} has no FileLogger")
        return
    current = cls.__dict__.get("log")
    if current is None or getattr(current, "__bench_probe__", False):
        return

    def log(self, data, step):
        if isinstance(data, dict):
            t = _probe_time()
            if t is not None:
                data = {**data, METRIC: t}
        return current(self, data, step)

    log.__bench_probe__ = True
    log.__bench_patch__ = getattr(current, "__bench_patch__", None)  # the file-logger patch sees itself applied
    log.__wrapped__ = current
    cls.log = log
    if rec is not None:
        from bench.engines.builtins.speed_probe import spec

        rec["probe"] = {"spec": spec(), "metric": METRIC, "placement": PLACEMENT}
        rec.action(f"{module.__name__}.FileLogger.log: the speed-probe kernel {rec['probe']['spec']} timed {REPS} "
                   f"times before each step's metrics are written, median as {METRIC}")


def apply(mode: str | None, record: PatchRecord) -> None:
    """Arm the hook on ``verl.utils.tracking`` (mode ``on``, the default, or ``off``)."""
    mode = (mode or "on").lower()
    if mode not in ("on", "off"):
        raise PatchRefused(f"unknown mode {mode!r} (allowed: on, off)")
    if mode == "off":
        record.status("armed", "off: no probe between steps")
        return
    _STATE["record"] = record
    when_imported(TARGET_MODULE, _install)
    if record["status"] == "pending":
        record.status("armed")
