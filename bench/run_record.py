"""Reading run records: the single entry point through which every reader gets a ``record.json``.

:func:`read_record` reads one file (bounded: :func:`bench.inputs.read_bytes`) and checks the shape every
reader relies on (:func:`record_problem`); a file that is not JSON, truncated, of the wrong types, with a
non-finite or negative time, or that contradicts its folder raises :class:`RecordError` naming the file and
what is wrong. ``report``, ``gate``, ``compare`` and ``baseline save`` stop on it (exit 2); ``sync`` uploads
the rest, then names it (exit 2, the queue kept); a resumed sweep names it and runs that repeat again.

(Issue 20 plans a typed pydantic run record; it replaces :func:`record_problem` behind :func:`read_record`.)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bench.errors import BenchError
from bench.inputs import read_bytes

RECORD = "record.json"
#: largest record file read (a record holds per-step metrics and a log tail)
MAX_RECORD_BYTES = 64 << 20
#: statuses a record may have
STATUSES = ("ok", "failed")
#: per-step metric prefixes whose numbers must be finite and not negative (times, sizes, throughput)
_TIMED_PREFIXES = ("timing_s/", "perf/", "response_length/", "prompt_length/")
#: summary keys holding lists of step numbers
_STEP_LISTS = ("timed_steps", "measured_steps", "profiled_steps", "profiled_measured_steps")


class RecordError(BenchError):
    """A ``record.json`` that exists but cannot be used: the message names the file and what is wrong."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _bad_number(value: Any, where: str, *, allow_negative: bool = False) -> str | None:
    """A problem text when ``value`` (None allowed) is not a finite number (>= 0 unless allowed)."""
    if value is None:
        return None
    if not _is_num(value):
        return f"{where}: expected a number, got {type(value).__name__} {str(value)[:40]!r}"
    if not math.isfinite(value):
        return f"{where}: {value} is not a finite number"
    if value < 0 and not allow_negative:
        return f"{where}: {value} is negative"
    return None


def record_problem(rec: Any, folder: Path | None = None) -> str | None:
    """What is wrong with a parsed record, or ``None`` when every reader can use it.

    Checked: a JSON object; ``cell_id`` a non-empty string and ``repeat`` a non-negative integer (matching the
    ``<cell id>/r<k>`` folder when ``folder`` is given); ``status`` ``ok`` or ``failed``; ``summary``, ``steps``,
    ``free_ratio`` objects; every number of ``summary`` finite (times not negative); step lists of integers;
    ``step_time_samples_s`` finite non-negative numbers; per-step times, throughput and lengths finite and not
    negative; an ``ok`` record's ``summary.step_time_median_s``, when present, is positive (one without it is
    reported by the readers as a cell "without step-time samples").
    """
    if not isinstance(rec, dict):
        return f"expected a JSON object, got {type(rec).__name__}"
    if not isinstance(rec.get("cell_id"), str) or not rec["cell_id"]:
        return "cell_id: missing or not a string"
    if not _is_int(rec.get("repeat")) or rec["repeat"] < 0:
        return f"repeat: expected a non-negative integer, got {rec.get('repeat')!r}"
    if rec.get("status") not in STATUSES:
        return f"status: {rec.get('status')!r} (allowed: {', '.join(STATUSES)})"
    if folder is not None:
        version = rec.get("code_version")  # an interleaved gate's baseline run: r<k>-baseline (results.run_dir)
        suffix = f"-{version}" if isinstance(version, str) and version and version != "candidate" else ""
        if folder.name != f"r{rec['repeat']}{suffix}" or folder.parent.name != rec["cell_id"]:
            return (f"cell_id {rec['cell_id']!r} repeat {rec['repeat']} does not match its folder "
                    f"{folder.parent.name}/{folder.name}")
    for key in ("summary", "steps", "free_ratio"):
        if not isinstance(rec.get(key, {}), dict):
            return f"{key}: expected an object, got {type(rec[key]).__name__}"
    summary = rec.get("summary") or {}
    for key, value in summary.items():
        if key in _STEP_LISTS:
            if not isinstance(value, list) or not all(_is_int(s) for s in value):
                return f"summary.{key}: expected a list of step numbers"
        elif key == "step_time_samples_s":
            if not isinstance(value, list):
                return f"summary.{key}: expected a list of seconds"
            for i, v in enumerate(value):
                bad = _bad_number(v, f"summary.{key}[{i}]") if v is not None else None
                if bad:
                    return bad
        elif _is_num(value) or isinstance(value, float):
            bad = _bad_number(value, f"summary.{key}", allow_negative=not key.endswith("_s"))
            if bad:
                return bad
        elif isinstance(value, dict):
            for k, v in value.items():
                bad = _bad_number(v, f"summary.{key}.{k}", allow_negative=True) if _is_num(v) else None
                if bad:
                    return bad
    for step, metrics in (rec.get("steps") or {}).items():
        if not isinstance(metrics, dict):
            return f"steps.{step}: expected an object of metrics"
        for key, value in metrics.items():
            if key.startswith(_TIMED_PREFIXES):
                bad = _bad_number(value, f"steps.{step}.{key}")
                if bad:
                    return bad
    for step, value in (rec.get("free_ratio") or {}).items():
        bad = _bad_number(value, f"free_ratio.{step}")
        if bad:
            return bad
    median = summary.get("step_time_median_s")
    if rec["status"] == "ok" and median is not None and median <= 0:  # absent: readers say "without samples"
        return f"status ok but summary.step_time_median_s is {median!r} (a positive number of seconds expected)"
    return None


def read_record(path: str | Path) -> dict[str, Any] | None:
    """The record at ``path`` (a ``record.json``), or ``None`` when there is none.

    Raises:
        RecordError: the file exists but is unreadable, not JSON (e.g. truncated), or fails
            :func:`record_problem` (message: ``<path>: not a usable run record: <what>``).
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return None
    try:
        data = read_bytes(path, MAX_RECORD_BYTES, "run record")
    except BenchError as exc:
        raise RecordError(str(exc)) from None
    try:
        rec = json.loads(data)
    except (ValueError, RecursionError) as exc:
        what = "empty file" if not data.strip() else f"not JSON ({getattr(exc, 'msg', 'nested too deeply')}" + \
            (f" at line {exc.lineno}, truncated?)" if getattr(exc, "lineno", None) else ")")
        raise RecordError(f"{path}: not a usable run record: {what}") from None
    problem = record_problem(rec, path.parent)
    if problem:
        raise RecordError(f"{path}: not a usable run record: {problem}")
    return rec


def load_records(sweep: str | Path) -> list[dict[str, Any]]:
    """Every run record of a sweep (``<cell id>/r<k>/record.json``), ordered by cell id then repeat, each with
    ``_dir`` (its run folder).

    Raises:
        RecordError: the first record that cannot be used (naming it and what is wrong).
    """
    out = []
    for path in sorted(Path(sweep).glob(f"*/r*/{RECORD}")):
        rec = read_record(path)
        if rec is not None:
            rec["_dir"] = str(path.parent)
            out.append(rec)
    return out


def corrupt_records(sweep: str | Path) -> list[str]:
    """One line per unusable record of a sweep (empty when every record can be used)."""
    out = []
    for path in sorted(Path(sweep).glob(f"*/r*/{RECORD}")):
        try:
            read_record(path)
        except RecordError as exc:
            out.append(str(exc))
    return out
