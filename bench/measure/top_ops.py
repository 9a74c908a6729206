"""The top operators of a profiled step by self time, for MLflow's ``profile_summary.json``: read from the
parsed-profile cache of the run folder (:mod:`bench.measure.trace_cache`), which the measurement of the run
filled in the same pass that gave its Free ratio — the trace is never parsed again to log them (a cache that
was deleted is refilled by one parse that gives everything).

Sources, as the run record names them (``free_ratio_detail[step].sources``), each asked of the reader of its
format (its ``kind``: :meth:`bench.measure.formats.Reader.top_ops`; a plugin format's default is its
:meth:`~bench.measure.formats.Reader.step_ops` rows):

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
from bench.measure.formats import reader_named
from bench.measure.trace_ops import TOP_N
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


def step_top_ops(rdir: str | os.PathLike, step: int | str, sources: list[dict], memo: dict | None = None,
                 n: int = TOP_N) -> dict | None:
    """Top ``n`` operators by self time of one profiled step, from its first source that has them.

    Args:
        rdir: the run folder.
        step: the step.
        sources: the step's Free-ratio sources in the run record (``{"kind": reader name, "source"}``).
        memo: a dict kept across the steps of one run (files already looked up).
        n: operators per kind (at most :data:`TOP_N`).

    Returns ``{"source", "window_ms", "cpu": [...], "device": [...]}`` (each operator ``{"name", "calls",
    "self_ms", "share"}``), or ``None`` when no source has the step (no trace, an unreadable file)."""
    rdir = Path(rdir)
    memo = {} if memo is None else memo
    for src in sources:
        reader = reader_named(str(src.get("kind")))
        if reader is None:
            continue
        hit = reader.top_ops(rdir, int(step), str(src.get("source", "")), memo, n)
        if hit:
            return hit
    return None
