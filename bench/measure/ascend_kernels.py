"""Ascend profiler CSVs of one rank read in one pass with their content hash, for the parsed-profile cache
(:mod:`bench.measure.trace_pool` runs them over the cores): ``kernel_details.csv`` (the device kernels of each
step, :func:`parse_kernel_details_hashed`) and ``step_trace_time.csv`` (:func:`parse_step_trace_hashed`, the
rows of :func:`bench.measure.ascend_step_trace.read_step_trace_csv`).

``kernel_details.csv`` (torch_npu ``ASCEND_PROFILER_OUTPUT/``, one row per device task; ``csv.writer``): columns
``Step Id`` (only with a profiler ``schedule``), ``Device_id`` (newer releases), ``Model ID``, ``Task ID``,
``Stream ID``, ``Name``, ``Type``, ``Accelerator Core``, ``Start Time(us)`` (written with a trailing tab),
``Duration(us)``, ``Wait Time(us)``, ``Block Dim`` ... (torch_npu ``CsvHeaders.OP_SUMMARY_KERNEL_BASE_HEADERS``).
Needed here: ``Name`` and ``Duration(us)``; a kernel's self time is its duration (device tasks do not nest),
summed per step and name, as the device half of the top operators.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.measure._common import MeasureError, rel_path
from bench.measure.ascend_step_trace import OUTPUT_DIR, int_or_none, read_step_trace_csv
from bench.measure.trace_cache import CACHE_DIR, content_hash, open_hashed
from bench.measure.trace_ops import op_rows, step_entry
from bench.measure.trace_pool import parse_files

KERNEL_DETAILS_CSV = "kernel_details.csv"
TRACE_VIEW_JSON = "trace_view.json"
_REQUIRED = ("Name", "Duration(us)")


def _number(text: str | None) -> float | None:
    try:
        f = float((text or "").strip())
    except ValueError:
        return None
    return f if math.isfinite(f) else None


def _hashed_text(path: str | os.PathLike):
    """``(binary file, hashing reader, text stream)`` of a CSV (``utf-8-sig``: a byte-order mark is dropped)."""
    fh, raw = open_hashed(path)
    return fh, raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")  # type: ignore[arg-type]


def parse_kernel_details_hashed(path: str | os.PathLike, engine: str | None = None) -> tuple[dict[str, Any], str]:
    """The kernels of one ``kernel_details.csv`` per step and name, and the file's content hash (same read).

    ``engine`` is ignored (the signature of :data:`bench.measure.trace_pool.PARSERS`).

    Returns ``({"path", "rows", "bad_rows", "steps": [{"step": int | None, "kernels": n, "busy_us": sum of
    durations, "ops": [[name, calls, total duration us], ...] by total duration, then name]}]}, hash)``; steps
    in order (``None``: no ``Step Id`` column or cell, last). Rows without a name or a finite duration
    ``>= 0`` are counted in ``bad_rows``. Raises :class:`MeasureError` when the file cannot be read or lacks
    ``Name`` / ``Duration(us)``.
    """
    p = Path(path)
    fh, raw, text = _hashed_text(p)
    acc: dict[int | None, dict[str, list[float]]] = {}
    rows = bad = 0
    try:
        with fh:
            reader = csv.reader(text)
            header = [h.strip() for h in next(reader, [])]
            missing = [c for c in _REQUIRED if c not in header]
            if missing:
                raise MeasureError(f"{p}: not a kernel_details.csv: missing column(s) {missing}; header is "
                                   f"{header[:12]}")
            i_name, i_dur = header.index("Name"), header.index("Duration(us)")
            i_step = header.index("Step Id") if "Step Id" in header else None
            width = max(i_name, i_dur, -1 if i_step is None else i_step)
            for rec in reader:
                if not rec:
                    continue
                rows += 1
                dur = _number(rec[i_dur]) if len(rec) > width else None
                name = rec[i_name] if len(rec) > width else ""
                if dur is None or dur < 0 or not name:
                    bad += 1
                    continue
                step = int_or_none(rec[i_step]) if i_step is not None else None
                slot = acc.setdefault(step, {}).get(name)
                if slot is None:
                    acc[step][name] = [1, dur]
                else:
                    slot[0] += 1
                    slot[1] += dur
            text.detach()
            digest = raw.digest()
    except (UnicodeDecodeError, csv.Error) as exc:
        raise MeasureError(f"{p}: not a kernel_details.csv: {exc}") from exc
    except OSError as exc:
        raise MeasureError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    keys = sorted(k for k in acc if k is not None) + ([None] if None in acc else [])
    steps = []
    for k in keys:
        ops = sorted(([n, int(c), t] for n, (c, t) in acc[k].items()), key=lambda o: (-o[2], o[0]))
        steps.append({"step": k, "kernels": sum(o[1] for o in ops), "busy_us": sum(o[2] for o in ops), "ops": ops})
    return {"path": str(p), "rows": rows, "bad_rows": bad, "steps": steps}, digest


def parse_step_trace_hashed(path: str | os.PathLike, engine: str | None = None) -> tuple[dict[str, Any], str]:
    """The rows of one ``step_trace_time.csv`` (:func:`~bench.measure.ascend_step_trace.read_step_trace_csv`,
    rank unset) as ``{"rows": [StepTraceRow fields]}``, and the file's content hash. The file is a few rows per
    step: it is read twice (hash, rows), which costs nothing beside the parse of a trace."""
    rows = read_step_trace_csv(path)
    try:
        digest = content_hash(path)
    except OSError as exc:
        raise MeasureError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return {"rows": [asdict(r) for r in rows]}, digest


def kernel_top(details: dict[str, Any], step: int | None, window_us: float | None, n: int) -> list[dict] | None:
    """The top ``n`` kernels of ``step`` in a :func:`parse_kernel_details_hashed` result, as the device half of
    a top-operators table (``{"name", "calls", "self_ms", "share"}``; ``share`` = time / ``window_us``);
    ``None`` when the file has no such step (a file without steps answers for any step)."""
    hit = step_entry(details.get("steps") or [], step)
    return None if hit is None else op_rows(hit["ops"][:n], window_us)


def profile_files(profile) -> dict[str, str]:
    """The per-rank files of one profile folder that are parsed for the top operators: ``kernel_details`` (the
    ``kernel_details.csv``) and ``trace`` (the ``trace_view.json``), where present."""
    out = Path(profile.path) / OUTPUT_DIR
    found = {"kernel_details": out / KERNEL_DETAILS_CSV, "trace": out / TRACE_VIEW_JSON}
    return {k: str(p) for k, p in found.items() if p.is_file()}


def rank_files(profiles: list, run_dir: Path) -> tuple[list[dict], list[dict], list[str]]:
    """Every rank's ``kernel_details.csv`` and ``trace_view.json`` (``profiles``: the
    :class:`~bench.measure.ascend.AscendProfile` list) parsed at once, over the cores and through the cache:
    per file its rank, relative path and per-step summary (kernels and their time; the trace's Free ratio per
    window), and the errors as warnings."""
    jobs = [(kind, path, prof) for prof in profiles for kind, path in profile_files(prof).items()]
    got = parse_files([(kind, path) for kind, path, _ in jobs], cache_dir=run_dir / CACHE_DIR)
    kernels: list[dict] = []
    traces: list[dict] = []
    errors: list[str] = []
    for (kind, path, prof), g in zip(jobs, got):
        if isinstance(g, MeasureError):
            errors.append(str(g))
            continue
        head = {"rank": prof.rank, "path": rel_path(path, run_dir)}
        if kind == "kernel_details":
            kernels.append({**head, "rows": g["rows"], "bad_rows": g["bad_rows"],
                            "steps": [{k: s[k] for k in ("step", "kernels", "busy_us")} for s in g["steps"]]})
        else:
            traces.append({**head, "basis": g["basis"], "events": g["events"], "steps": g["steps"],
                           "aggregate": g["aggregate"]})
    return kernels, traces, errors
