"""Measurements of one run: what a run folder holds, read without side effects, and its summary.

* :func:`collect` finds the metrics JSONL, the torch chrome traces and the Ascend profiler folders
  in a run folder and returns per-step metrics and the per-step Free ratio.
* :func:`summarize` (:mod:`bench.measure.run_summary`) turns per-step metrics (+ Free ratio) into the run's
  statistics over its timed steps (:func:`step_samples`: the per-step samples of the same figures).

Formats: one :class:`~bench.measure.formats.Reader` each, asked in the order of
:func:`~bench.measure.formats.readers` (entry points ``grpo_bench.readers``): :mod:`bench.measure.jsonl`
(verl file-logger JSONL),
:mod:`bench.measure.torch_reader` (Free ratio from the torch chrome traces, parsed in parallel and
cached), :mod:`bench.measure.ascend`
(``step_trace_time.csv`` / ``analysis.db`` of torch_npu).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from bench.measure._common import MeasureError
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
    checked_fields,
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
from bench.measure.run_summary import PHASES, STEP_TIME, step_samples, summarize, timed_steps
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
    "step_samples",
    "timed_steps",
    "STEP_TIME",
    "unregister_reader",
]



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
        fields, refused = checked_fields(reader.name, got.fields)
        out.update(fields)
        warnings.extend(got.warnings + refused)
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
