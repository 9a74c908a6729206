"""The top operators of a profiled step by self time, for MLflow's ``profile_summary.json``: read from the
parsed-profile cache of the run folder (:mod:`bench.measure.trace_cache`), which the measurement of the run
filled in the same pass that gave its Free ratio — the trace is never parsed again to log them (a cache that
was deleted is refilled by one parse that gives everything).

Sources, as the run record names them (``free_ratio_detail[step].sources``):

* ``torch``: the trace's own tables (:mod:`bench.measure.trace_ops`: ``cpu_op`` self times, device kernels);
* ``ascend`` (``rank N``): that rank's ``kernel_details.csv`` (device kernels: their durations summed per name,
  :mod:`bench.measure.ascend_kernels`) and its ``trace_view.json`` (CPU operators, and the device half when
  there is no ``kernel_details.csv``); the share is of the step's window (the trace's ``ProfilerStep`` window,
  else msprof's step time ``Computing + Communication(Not Overlapped) + Free`` of the rank).

Times in milliseconds; ``share`` = self time / step window.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench.measure._common import MeasureError
from bench.measure.ascend import find_ascend_profiles
from bench.measure.ascend_kernels import kernel_top, profile_files
from bench.measure.ascend_step_trace import StepTraceRow
from bench.measure.trace_cache import CACHE_DIR
from bench.measure.trace_ops import TOP_N, step_entry
from bench.measure.trace_pool import parse_files

__all__ = ["TOP_N", "step_top_ops", "top_ops"]


def top_ops(path: str | os.PathLike, step: int | None = None, n: int = TOP_N) -> dict[str, Any]:
    """Top ``n`` operators by self time per window of one torch chrome trace, parsed here (no cache):
    ``{step (str): {"window_ms", "cpu": [...], "device": [...]}}`` (a trace without ``ProfilerStep`` windows is
    one entry, keyed ``step`` or ``0``); ``{}`` for a file that is not a trace. ``n`` is at most
    :data:`TOP_N` (the tables the parser keeps)."""
    try:
        tables = parse_files([("trace", path)])[0]
    except MeasureError:
        return {}
    if isinstance(tables, MeasureError):
        return {}
    out = {}
    for t in tables["top_ops"]:
        key = str(t["step"] if t["step"] is not None else (step or 0))
        out[key] = {"window_ms": t["window_ms"], "cpu": t["cpu"][:n], "device": t["device"][:n]}
    return out


def _window_us(rows: list[dict], step: int) -> float | None:
    """msprof's step time of ``step`` (``Computing + Communication(Not Overlapped) + Free``, us) in a rank's rows."""
    total = sum(StepTraceRow(**r).step_time_us for r in rows
                if r.get("step") == step or (r.get("step") is None and len(rows) == 1))
    return total or None


def _ascend_top(rdir: Path, rank: int | None, step: int, memo: dict, n: int) -> dict | None:
    """Top operators of ``step`` from one Ascend rank's files, through the cache."""
    if "profiles" not in memo:  # once per run folder, not once per step
        memo["profiles"] = find_ascend_profiles(rdir)
    for prof in memo["profiles"]:
        if prof.rank != rank:
            continue
        if ("ascend", prof.path) not in memo:  # a rank's files are looked up (hashed) once, not once per step
            files = profile_files(prof)
            jobs = list(files.items())
            if prof.output and prof.output.endswith(".csv"):
                jobs.append(("step_trace", prof.output))
            memo["ascend", prof.path] = files, dict(zip([k for k, _ in jobs],
                                                        parse_files(jobs, cache_dir=rdir / CACHE_DIR)))
        files, got = memo["ascend", prof.path]
        trace = got.get("trace") if isinstance(got.get("trace"), dict) else None
        table = step_entry(trace["top_ops"], step) if trace else None
        window = table["window_ms"] * 1e3 if table and table.get("window_ms") else None
        if window is None and isinstance(got.get("step_trace"), dict):
            window = _window_us(got["step_trace"]["rows"], step)
        device = None
        if isinstance(got.get("kernel_details"), dict):
            device = kernel_top(got["kernel_details"], step, window, n)
        if device is None and table:
            device = table["device"][:n]
        if device is None and table is None:
            continue
        source = files.get("kernel_details") or files.get("trace")
        return {"source": os.path.relpath(source, rdir),
                "window_ms": None if window is None else round(window / 1e3, 3),
                "cpu": table["cpu"][:n] if table else [], "device": device or []}
    return None


def step_top_ops(rdir: str | os.PathLike, step: int | str, sources: list[dict], memo: dict | None = None,
                 n: int = TOP_N) -> dict | None:
    """Top ``n`` operators by self time of one profiled step, from its first source that has them.

    Args:
        rdir: the run folder.
        step: the step.
        sources: the step's Free-ratio sources in the run record (``{"kind": "torch"|"ascend", "source"}``).
        memo: a dict kept across the steps of one run (files already looked up).
        n: operators per kind (at most :data:`TOP_N`).

    Returns ``{"source", "window_ms", "cpu": [...], "device": [...]}`` (each operator ``{"name", "calls",
    "self_ms", "share"}``), or ``None`` when no source has the step (no trace, an unreadable file)."""
    rdir = Path(rdir)
    memo = {} if memo is None else memo
    k = int(step)
    for src in sources:
        kind, name = src.get("kind"), str(src.get("source", ""))
        if kind == "torch":
            path = rdir / name
            if not path.is_file():
                continue
            if path not in memo:
                memo[path] = parse_files([("trace", path)], cache_dir=rdir / CACHE_DIR)[0]
            got = memo[path]
            hit = step_entry(got["top_ops"], k) if isinstance(got, dict) else None
            if hit:
                return {"source": name, "window_ms": hit["window_ms"], "cpu": hit["cpu"][:n],
                        "device": hit["device"][:n]}
        elif kind == "ascend" and name.startswith("rank "):
            try:
                rank = int(name.split()[1])
            except ValueError:
                continue
            hit = _ascend_top(rdir, rank, k, memo, n)
            if hit:
                return hit
    return None
