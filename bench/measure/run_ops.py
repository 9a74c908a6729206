"""One run's operator times and category times per profiled step and phase, recorded next to its record.

Read from the parse the run's measurement already did (the run folder's ``.trace_cache``, filled by the single
scan that gave its Free ratio and top operators: :func:`bench.measure.trace_ops.top_table` keeps every operator
of each step window, ``ops``), never from a second parse of the trace; a cache that was deleted (or written by an
older parser version) is refilled by that same one parse.

Sources: the step's Free-ratio sources in the run record (``free_ratio_detail[step].sources``), each read by the
reader of its format (its ``kind``: :meth:`bench.measure.formats.Reader.step_ops`; ``torch``: a torch chrome
trace's device kernels / memcpy / memset by duration when the trace has device events, else the ``cpu_op`` self
times; ``ascend`` (``rank N``): that rank's ``kernel_details.csv``, its kernels' summed durations by name, else
its ``trace_view.json`` like a torch trace; a plugin format: its own rows). Several sources of one step (ranks,
verl roles) add up. The phase of a source is :func:`bench.measure.op_categories.phase_of` of its path (verl's
``<step>/<role>/`` folders); a source whose path names no phase counts under ``"all"`` (the embedded engine's
one trace covers the whole step). Categories: :func:`bench.measure.op_categories.categorize` of each
operator's name, read at every call (rules registered later apply to old runs too). Ascend kernels are keyed by
name only here, so an AI-CPU task counts under its name's category, not ``ai_cpu`` (use
:func:`bench.measure.run_categories.run_categories` for the core).

All times in milliseconds per step.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bench.core.files import atomic_write_json
from bench.measure._common import MeasureError
from bench.measure.formats import reader_named
from bench.measure.op_categories import CATEGORIES, categorize, phase_of

#: the file beside ``record.json`` that holds :func:`run_op_times`
OP_TIMES = "op_times.json"
FORMAT = "grpo-bench-op-times"
FORMAT_VERSION = 1
ALL_PHASES = "all"


def run_op_times(run_dir: str | os.PathLike, record: dict[str, Any]) -> dict[str, Any]:
    """Operator and category times of every profiled step of one run (see the module text).

    Args:
        run_dir: the run folder (holds ``record.json`` and the traces it names).
        record: the run record (``free_ratio_detail``: per step its sources).

    Returns:
        ``{"format", "format_version", "steps": {step (str): {"basis": [...], "phases": {phase: {category: ms}},
        "category_ms": {category: ms}, "ops": {name: ms}, "sources": [path]}}, "warnings": [...]}``; a step none of
        whose sources can be read is left out with a warning.
    """
    rdir = Path(run_dir)
    memo: dict = {}
    out: dict[str, Any] = {"format": FORMAT, "format_version": FORMAT_VERSION, "steps": {}, "warnings": []}
    for step, d in sorted((record.get("free_ratio_detail") or {}).items(), key=lambda kv: int(kv[0])):
        k = int(step)
        slot: dict[str, Any] = {"basis": [], "phases": {}, "category_ms": dict.fromkeys(CATEGORIES, 0.0),
                                "ops": {}, "sources": []}
        for src in d.get("sources") or []:
            kind, name = src.get("kind"), str(src.get("source", ""))
            reader = reader_named(str(kind))
            try:
                got = reader.step_ops(rdir, k, name, memo) if reader is not None else None
            except (MeasureError, ValueError) as exc:
                out["warnings"].append(f"step {step}: {name}: {exc}")
                continue
            if got is None:
                out["warnings"].append(f"step {step}: {name}: no operator table (unreadable or no such step)")
                continue
            basis, ops, label = got.basis, got.ops, got.source
            phase = phase_of(label) or ALL_PHASES
            ph = slot["phases"].setdefault(phase, dict.fromkeys(CATEGORIES, 0.0))
            for op_name, _calls, us in ops:
                ms = us / 1e3
                cat = categorize(op_name)
                ph[cat] += ms
                slot["category_ms"][cat] += ms
                slot["ops"][op_name] = slot["ops"].get(op_name, 0.0) + ms
            slot["basis"] = sorted({*slot["basis"], basis})
            slot["sources"].append(label)
        if slot["sources"]:
            out["steps"][str(step)] = slot
    return out


def ensure_op_times(run_dir: str | os.PathLike, record: dict[str, Any]) -> dict[str, Any]:
    """:func:`run_op_times` of a run, read from its ``op_times.json`` when that file is there and current, else
    computed and written there (atomically; a read-only run folder is computed and not written)."""
    rdir = Path(run_dir)
    path = rdir / OP_TIMES
    try:
        have = json.loads(path.read_text(encoding="utf-8"))
        if have.get("format") == FORMAT and have.get("format_version") == FORMAT_VERSION:
            return have
    except (OSError, ValueError, AttributeError):
        pass
    data = run_op_times(rdir, record)
    try:
        atomic_write_json(path, data)
    except OSError:
        pass
    return data
