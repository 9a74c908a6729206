"""Measurements of one run: what a run folder holds, read without side effects, and its summary.

* :func:`collect` finds the metrics JSONL, the torch chrome traces and the Ascend profiler folders
  in a run folder and returns per-step metrics and the per-step Free ratio.
* :func:`summarize` turns per-step metrics (+ Free ratio) into the run's statistics over the
  measured (non-warm-up) steps.

Formats: one :class:`~bench.measure.formats.Reader` each, asked in the order of
:func:`~bench.measure.formats.readers` (entry points ``grpo_bench.readers``): :mod:`bench.measure.jsonl`
(verl file-logger JSONL),
:mod:`bench.measure.torch_reader` (Free ratio from the torch chrome traces, parsed in parallel and
cached), :mod:`bench.measure.ascend`
(``step_trace_time.csv`` / ``analysis.db`` of torch_npu).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.measure._common import MeasureError, finite, iqr, mean, median
from bench.measure.ascend import (
    AscendFree,
    analyse_raw,
    ensure_analysed,
    find_ascend_profiles,
    read_ascend_free,
)
from bench.measure.ascend_step_trace import read_step_trace_csv, read_step_trace_db
from bench.measure.formats import (
    READERS,
    Measurements,
    Reader,
    ReadOptions,
    readers,
    register_reader,
    unregister_reader,
)
from bench.measure.jsonl import (
    MetricsLog,
    StepMetrics,
    find_metrics_file,
    read_metrics_jsonl,
)
from bench.measure.torch_reader import TRACE_DIRS, find_torch_traces, step_from_path
from bench.measure.torch_trace import StepFree, TraceFree, parse_trace_free
from bench.measure.trace_pool import parse_traces

__all__ = [
    "PHASES",
    "AscendFree",
    "MeasureError",
    "Measurements",
    "MetricsLog",
    "READERS",
    "ReadOptions",
    "Reader",
    "TRACE_DIRS",
    "StepFree",
    "StepMetrics",
    "TraceFree",
    "analyse_raw",
    "collect",
    "ensure_analysed",
    "find_ascend_profiles",
    "find_metrics_file",
    "find_torch_traces",
    "parse_trace_free",
    "parse_traces",
    "read_ascend_free",
    "read_metrics_jsonl",
    "read_step_trace_csv",
    "read_step_trace_db",
    "readers",
    "register_reader",
    "step_from_path",
    "summarize",
    "unregister_reader",
]

#: phase key -> verl metric (seconds); ``other`` = ``timing_s/step`` minus the phases present
PHASES = {
    "gen": "timing_s/gen",
    "reward": "timing_s/reward",
    "old_log_prob": "timing_s/old_log_prob",
    "ref": "timing_s/ref",
    "adv": "timing_s/adv",
    "update_actor": "timing_s/update_actor",
}
STEP_TIME = "timing_s/step"


def collect(run_dir: str | os.PathLike, expected_ranks: int | None = None, analyse: bool = False) -> dict:
    """Everything measurable in one run folder.

    Step mapping: the embedded engine numbers its ``ProfilerStep#N`` so that ``N`` equals the
    training step, so a torch trace window ``ProfilerStep#N`` is taken as training step ``N``
    (nothing else is checked). An Ascend row's step is its ``Step`` cell, else the all-digits folder
    in its path (verl 0.6.x ``<save_path>/<step>/<role>/``). Windows with no step (a trace without
    ``ProfilerStep`` events, a ``step_trace_time.csv`` with an empty Step and no step folder) are
    reported in ``unstepped_free`` and not keyed by step.

    Torch traces: every file of the run parsed at once over the cores, each through the parsed-trace
    cache (:func:`bench.measure.trace_pool.parse_traces`).

    Per-step Free ratio: the mean over the sources covering that step, where each torch trace file
    is one source and each Ascend rank is one source (a rank's rows in one step combined time
    weighted; see :mod:`bench.measure.ascend`).

    Args:
        run_dir: the run folder.
        expected_ranks: world size for the Ascend missing-rank check (default: ranks 0..max seen).
        analyse: first run torch_npu's offline ``analyse`` on raw-only Ascend folders (writes into
            them); off by default so that ``collect`` writes nothing but its parsed-trace cache
            (``<run_dir>/.trace_cache/``, :mod:`bench.measure.trace_cache`; ``BENCH_TRACE_CACHE=off``: none).

    Returns:
        ``{"run_dir": str, "metrics_file": relative path | None, "metrics": {step: {metric: float}},
        "metrics_issues": {"truncated_last_line": bool, "bad_lines": [[line, reason]],
        "skipped_values": [[step, metric, reason]]}, "free_ratio": {step: float},
        "free_ratio_detail": {step: {"sources": [{"kind": "torch"|"ascend", "source": str,
        "free_ratio": float, "basis": str}], "min": float, "max": float, "spread": float,
        "missing_ranks": [int]}}, "profiled_steps": [int], "unstepped_free": [{"kind", "source",
        "free_ratio", "basis"}], "traces": [TraceFree.to_dict() with a relative path],
        "ascend": AscendFree.to_dict() | None, "warnings": [str]}``. Step keys are ``int``; all
        paths are relative to ``run_dir``. Raises :class:`MeasureError` if ``run_dir`` is not a
        folder, or (only with ``analyse=True``) if raw Ascend data cannot be parsed.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise MeasureError(f"{root}: not a run folder")
    warnings: list[str] = []
    out: dict = {
        "run_dir": str(root),
        "metrics_file": None,
        "metrics": {},
        "metrics_issues": {"truncated_last_line": False, "bad_lines": [], "skipped_values": []},
        "free_ratio": {},
        "free_ratio_detail": {},
        "profiled_steps": [],
        "unstepped_free": [],
        "traces": [],
        "ascend": None,
        "warnings": warnings,
    }

    per_step: dict[int, list[dict]] = {}
    missing_by_step: dict[int, list[int]] = {}
    options = ReadOptions(expected_ranks=expected_ranks, analyse=analyse)
    for reader in readers():
        reader.prepare(root, options)
        if not reader.detect(root):
            if reader.when_absent:
                warnings.append(reader.when_absent)
            continue
        got = reader.read(root, options)
        out.update(got.fields)
        warnings.extend(got.warnings)
        for step, entry in got.free:
            if step is None:
                out["unstepped_free"].append(entry)
            else:
                per_step.setdefault(step, []).append(entry)
        missing_by_step.update(got.missing_ranks)

    for step in sorted(per_step):
        vals = [e["free_ratio"] for e in per_step[step]]
        out["free_ratio"][step] = float(np.mean(vals))
        out["free_ratio_detail"][step] = {
            "sources": per_step[step],
            "min": min(vals),
            "max": max(vals),
            "spread": max(vals) - min(vals),
            "missing_ranks": missing_by_step.get(step, []),
        }
    out["profiled_steps"] = sorted(per_step)
    return out


def _as_step_dict(steps) -> dict[int, Mapping[str, float]]:
    if isinstance(steps, MetricsLog):
        return steps.by_step()
    if isinstance(steps, Mapping):
        return {int(k): v for k, v in steps.items()}
    result = {}
    for item in steps:
        if isinstance(item, StepMetrics):
            result[item.step] = item.metrics
        else:
            raise TypeError(f"summarize: cannot read a step from {type(item).__name__}")
    return result


def _with_prefixes(rows: Sequence[Mapping[str, Any]], key: str) -> list[Any]:
    """Values of ``key`` and of ``<role>/key`` (e.g. ``actor/perf/max_memory_allocated_gb``) over the
    given step rows, in row order (all roles of a row, unprefixed first)."""
    suffix = "/" + key
    return [v for r in rows for k, v in r.items() if k == key or k.endswith(suffix)]


def summarize(
    steps,
    warmup_steps: int,
    free_ratio: Mapping[int, float] | None = None,
    profiled_steps: Iterable[int] | None = None,
) -> dict:
    """Statistics of a run over its measured (non-warm-up) steps.

    Args:
        steps: the per-step metrics: ``{step: {metric: value}}``, a :class:`MetricsLog`, a list of
            :class:`StepMetrics`, or the whole :func:`collect` result (then ``free_ratio`` and
            ``profiled_steps`` default to its own).
        warmup_steps: how many leading training steps (in step order, whatever the first step
            number) are warm-up and excluded. Training steps are the steps that logged
            ``timing_s/step`` (verl's step-0 validation record is not one); all steps if none did.
        free_ratio: ``{step: free ratio}`` (e.g. ``collect(...)["free_ratio"]``).
        profiled_steps: steps run under the profiler (default: the keys of ``free_ratio``).

    Returns a dict (``None`` for a statistic without data; seconds, GiB, tokens as in verl):

    * ``n_steps`` (training steps), ``warmup_steps``; ``measured_steps`` (timed, used for every statistic);
      ``profiled_steps``; ``profiled_measured_steps`` (measured steps whose timing the profiler
      perturbed).
    * ``step_time_median_s``, ``step_time_iqr_s`` (q75 - q25, numpy linear), ``step_time_mean_s``
      of ``timing_s/step``.
    * ``phase_median_s``: ``{gen, reward, old_log_prob, ref, adv, update_actor, other}``, each the
      median over steps of ``timing_s/<phase>``; ``other`` = median over steps of
      ``timing_s/step - sum(phases logged in that step)``.
    * ``rollout_share_median``: median over steps of ``timing_s/gen / timing_s/step``.
    * ``throughput_median``: median of ``perf/throughput`` (tokens/s per device).
    * ``peak_memory_gb`` and ``peak_memory_source``: max of ``perf/max_memory_allocated_gb`` when
      any value is > 0, else max of ``perf/cpu_memory_used_gb``; each key also under a role prefix
      (verl >= 0.7 logs the actor's as ``actor/perf/max_memory_allocated_gb``:
      ``verl/workers/engine_workers.py`` + the trainer's ``actor/`` prefix; verl 0.6.1 unprefixed).
    * ``response_length_mean``, ``response_length_max``, ``response_length_min``,
      ``response_clip_ratio``: means over steps of ``response_length/{mean,max,min,clip_ratio}``.
    * ``long_tail_waste_median``: median over steps of ``1 - response_length/mean /
      response_length/max`` (the share of the longest response's decode time the average sample
      does not use).
    * ``free_ratio_median``: median of ``free_ratio`` over the profiled measured steps.
    """
    if isinstance(steps, Mapping) and "metrics" in steps and "free_ratio" in steps:
        if free_ratio is None:
            free_ratio = steps["free_ratio"]
        if profiled_steps is None:
            profiled_steps = steps.get("profiled_steps")
        steps = steps["metrics"]
    by_step = _as_step_dict(steps)
    # training steps are those that logged timing_s/step (verl logs the validation before training
    # as a step-0 record without it); if none did, every step counts
    order = sorted(s for s, m in by_step.items() if STEP_TIME in m) or sorted(by_step)
    warm = max(0, int(warmup_steps))
    measured = order[warm:]
    rows = [by_step[s] for s in measured]
    free_ratio = {int(k): v for k, v in (free_ratio or {}).items()}
    profiled = sorted(int(s) for s in (profiled_steps if profiled_steps is not None else free_ratio))
    profiled_measured = [s for s in measured if s in set(profiled)]

    def col(name: str) -> list[float | None]:
        return [r.get(name) for r in rows]

    step_times = col(STEP_TIME)
    phase_median = {key: median(col(metric)) for key, metric in PHASES.items()}
    others = []
    shares = []
    waste = []
    for r in rows:
        st = r.get(STEP_TIME)
        if st is None or not math.isfinite(st):
            continue
        present = finite(r.get(m) for m in PHASES.values())
        others.append(st - sum(present))
        gen = r.get(PHASES["gen"])
        if gen is not None and math.isfinite(gen) and st > 0:
            shares.append(gen / st)
    for r in rows:
        mx, mn = r.get("response_length/max"), r.get("response_length/mean")
        if mx is not None and mn is not None and math.isfinite(mx) and math.isfinite(mn) and mx > 0:
            waste.append(1.0 - mn / mx)
    phase_median["other"] = median(others)

    dev_mem = finite(_with_prefixes(rows, "perf/max_memory_allocated_gb"))
    cpu_mem = finite(_with_prefixes(rows, "perf/cpu_memory_used_gb"))
    if dev_mem and max(dev_mem) > 0:
        peak, peak_src = max(dev_mem), "perf/max_memory_allocated_gb"
    elif cpu_mem:
        peak, peak_src = max(cpu_mem), "perf/cpu_memory_used_gb"
    elif dev_mem:
        peak, peak_src = max(dev_mem), "perf/max_memory_allocated_gb"
    else:
        peak, peak_src = None, None

    return {
        "n_steps": len(order),
        "warmup_steps": warm,
        "measured_steps": measured,
        "profiled_steps": profiled,
        "profiled_measured_steps": profiled_measured,
        "step_time_median_s": median(step_times),
        "step_time_iqr_s": iqr(step_times),
        "step_time_mean_s": mean(step_times),
        "phase_median_s": phase_median,
        "rollout_share_median": median(shares),
        "throughput_median": median(col("perf/throughput")),
        "peak_memory_gb": peak,
        "peak_memory_source": peak_src,
        "response_length_mean": mean(col("response_length/mean")),
        "response_length_max": mean(col("response_length/max")),
        "response_length_min": mean(col("response_length/min")),
        "response_clip_ratio": mean(col("response_length/clip_ratio")),
        "long_tail_waste_median": median(waste),
        "free_ratio_median": median(free_ratio.get(s) for s in profiled_measured),
    }
