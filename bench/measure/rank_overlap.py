"""Per run and rank: Computing, Communication (not overlapped), Overlapped, Free and Bubble of each step, and the
slow-rank flag.

Where they come from:

* Ascend step trace (``step_trace_time.csv`` / ``analysis.db`` of every rank, read by
  :func:`bench.measure.ascend.read_ascend_free`): the columns as written (:func:`ascend_rank_breakdown`);
  step time = ``Computing + Communication(Not Overlapped) + Free`` (msprof-analyze's). Several rows of one rank
  in one step (several roles) are summed.
* msprof-analyze's ``cluster_step_trace_time.csv`` (:func:`read_cluster_step_trace`): its ``rank`` rows.
* torch/Kineto GPU trace (:func:`trace_overlap`): derived per ``ProfilerStep#N`` window from the device
  events (``kernel``, ``gpu_memcpy``, ``gpu_memset``). Communication = the events
  :func:`~bench.measure.op_categories.categorize` calls
  ``communication`` (NCCL kernels, on their own stream), compute = every other device event. With ``U(x)`` the
  length of the union of intervals ``x`` clipped to the window: computing = ``U(compute)``, communication =
  ``U(comm)``, overlapped = ``|union(comm) intersected with union(compute)|``, communication not overlapped =
  communication - overlapped, free = window - ``U(all device events)``; so computing + communication not
  overlapped + free = window. Bubble (pipeline stages) is not derivable from one trace: ``None``.

Slow rank (:func:`slow_ranks`): per step, over the ranks' step times and computing times, spread = max - min;
the step is flagged when the spread exceeds ``threshold`` (default 0.05, the msprof-analyze guide's 5 %) of the
step (the largest step time among the ranks: the step lasts as long as its slowest rank). The ranks named slow
are those more than ``threshold`` of the step above the fastest. With synchronous collectives the ranks' step
times stay equal and the slow rank shows as more computing (the others wait in communication): both measures are
checked and reported.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from bench.measure._common import merge_segments, read_csv_rows, to_float, union_length_in
from bench.measure.ascend_step_trace import CSV_COLUMNS, int_or_none
from bench.measure.op_categories import categorizer, read_trace_events

SLOW_RANK_THRESHOLD = 0.05
FIELDS = ("computing_us", "communication_not_overlapped_us", "overlapped_us", "communication_us", "free_us",
          "bubble_us")


def _union(pairs: list[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    s = np.array([a for a, _ in pairs], dtype=np.float64)
    e = np.array([b for _, b in pairs], dtype=np.float64)
    return merge_segments(s, e)


def _intersection(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Intersection of two sets of sorted, disjoint segments, as sorted, disjoint segments."""
    out_s, out_e = [], []
    i = j = 0
    (as_, ae), (bs, be) = a, b
    while i < as_.size and j < bs.size:
        lo, hi = max(as_[i], bs[j]), min(ae[i], be[j])
        if hi > lo:
            out_s.append(lo)
            out_e.append(hi)
        if ae[i] < be[j]:
            i += 1
        else:
            j += 1
    return np.array(out_s, dtype=np.float64), np.array(out_e, dtype=np.float64)


def trace_overlap(path: str | os.PathLike, events: dict[str, Any] | None = None) -> dict[str, Any]:
    """Computing / communication / overlap / free of each ``ProfilerStep#N`` window of one GPU chrome trace
    (see the module docstring), in microseconds. ``events``: :func:`~bench.measure.op_categories.read_trace_events`
    of the file, when read already.

    Returns ``{"path", "basis": "device" | "none", "communication_streams": [...], "steps": [{"step",
    "window_us", "step_time_us" (= window), "computing_us", "communication_us", "overlapped_us",
    "communication_not_overlapped_us", "free_us", "bubble_us": None}]}``; a trace without device events gives
    ``basis`` ``"none"`` and no steps; without windows, one entry (``step`` ``None``) spanning the device events.
    """
    ev = read_trace_events(path) if events is None else events
    comm, comp, streams = [], [], set()
    cat_of = categorizer()
    for ts, dur, name, cat, stream in ev["device"]:
        if cat_of(name, cat) == "communication":
            comm.append((ts, ts + dur))
            streams.add(stream)
        else:
            comp.append((ts, ts + dur))
    out: dict[str, Any] = {"path": str(path), "basis": "device" if ev["device"] else "none",
                           "communication_streams": sorted(streams, key=str), "steps": []}
    if not ev["device"]:
        return out
    u_comm, u_comp, u_all = _union(comm), _union(comp), _union(comm + comp)
    u_both = _intersection(u_comm, u_comp)
    windows = ev["windows"] or [(None, float(u_all[0][0]), float(u_all[1][-1]))]
    for step, lo, hi in windows:
        computing = union_length_in(*u_comp, lo, hi)
        communication = union_length_in(*u_comm, lo, hi)
        overlapped = union_length_in(*u_both, lo, hi)
        out["steps"].append({
            "step": step, "window_us": hi - lo, "step_time_us": hi - lo,
            "computing_us": computing, "communication_us": communication, "overlapped_us": overlapped,
            "communication_not_overlapped_us": communication - overlapped,
            "free_us": (hi - lo) - union_length_in(*u_all, lo, hi), "bubble_us": None,
        })
    return out


def ascend_rank_breakdown(rows: list) -> dict[int | None, dict[int, dict[str, float]]]:
    """Per step and rank, the step-trace figures of :class:`~bench.measure.ascend_step_trace.StepTraceRow` rows
    (``AscendFree.rows``: rank and step resolved), summed over the rows of one rank and step (us), with
    ``step_time_us`` = computing + communication not overlapped + free. Returns ``{step: {rank: {field: us}}}``."""
    out: dict[int | None, dict[int, dict[str, float]]] = {}
    for r in rows:
        slot = out.setdefault(r.step, {}).setdefault(r.rank, {f: 0.0 for f in (*FIELDS, "step_time_us")})
        for f in FIELDS:
            slot[f] += getattr(r, f)
        slot["step_time_us"] += r.step_time_us
    return out


def _us(text: object) -> float:
    f = to_float(text)
    return 0.0 if f is None or not np.isfinite(f) else f


def read_cluster_step_trace(path: str | os.PathLike) -> dict[int | None, dict[int, dict[str, float]]]:
    """Per step and rank, the figures of msprof-analyze's ``cluster_step_trace_time.csv`` (header ``Step, Type,
    Index, Computing, Communication(Not Overlapped), Overlapped, Communication, Free, Stage, Bubble,
    Communication(Not Overlapped and Exclude Receive), Preparing`` [``, DP Index, PP Index, TP Index``]; us):
    the rows of ``Type`` ``rank`` (``Index`` = the rank; ``stage`` rows are left out), shaped as
    :func:`ascend_rank_breakdown`'s result. Raises :class:`~bench.measure._common.MeasureError` when the file
    cannot be read or lacks ``Type`` / ``Index`` / ``Computing`` / ``Communication(Not Overlapped)`` / ``Free``."""
    p = Path(path)
    need = ("Type", "Index", "Computing", "Communication(Not Overlapped)", "Free")
    header, rows = read_csv_rows(p, need, "cluster_step_trace_time.csv")
    out: dict[int | None, dict[int, dict[str, float]]] = {}
    for row in rows:
        rec = dict(zip(header, row))
        rank = int_or_none(rec.get("Index"))
        if (rec.get("Type") or "").strip().lower() != "rank" or rank is None:
            continue
        vals = {fld: _us(rec.get(col)) for col, fld in CSV_COLUMNS.items() if fld in FIELDS}
        vals["step_time_us"] = vals["computing_us"] + vals["communication_not_overlapped_us"] + vals["free_us"]
        out.setdefault(int_or_none(rec.get("Step")), {})[rank] = vals
    return out


def slow_ranks(per_rank: dict[Any, dict[str, float]], threshold: float = SLOW_RANK_THRESHOLD) -> dict[str, Any]:
    """The slow-rank flag of one step from its ranks' figures (``{rank: {"step_time_us", "computing_us", ...}}``,
    us), see the module docstring.

    Returns ``{"threshold", "step_us" (the largest step time), "ranks", and per measure "step_time" and
    "computing": {"min_us", "max_us", "spread_us", "spread_share" (spread / step_us), "slow_ranks": [...]}}``,
    and ``"flagged"``: whether either spread share exceeds ``threshold``; ``"slow_ranks"``: the union of both
    lists. Fewer than two ranks: never flagged.
    """
    ranks = sorted(per_rank, key=lambda r: (r is None, r))
    step_us = max((per_rank[r].get("step_time_us") or 0.0 for r in ranks), default=0.0)
    out: dict[str, Any] = {"threshold": threshold, "step_us": step_us, "ranks": ranks}
    slow: set = set()
    flagged = False
    for key, label in (("step_time_us", "step_time"), ("computing_us", "computing")):
        vals = {r: float(per_rank[r].get(key) or 0.0) for r in ranks}
        lo, hi = (min(vals.values()), max(vals.values())) if vals else (0.0, 0.0)
        share = (hi - lo) / step_us if step_us > 0 else 0.0
        hit = len(ranks) > 1 and share > threshold
        names = [r for r in ranks if hit and vals[r] - lo > threshold * step_us]
        out[label] = {"min_us": lo, "max_us": hi, "spread_us": hi - lo, "spread_share": share, "slow_ranks": names}
        flagged = flagged or hit
        slow.update(names)
    out["flagged"] = flagged
    out["slow_ranks"] = sorted(slow, key=lambda r: (r is None, r))
    return out


def run_ranks(per_step: dict[int | None, dict[Any, dict[str, float]]],
              threshold: float = SLOW_RANK_THRESHOLD) -> dict[str, Any]:
    """One run's ranks: per step the figures of each rank (as given) and :func:`slow_ranks`; ``slow_steps``: the
    steps flagged. ``per_step``: :func:`ascend_rank_breakdown`'s result, or ``{step: {rank: trace_overlap step}}``
    built from the ranks' traces."""
    steps = {s: {"ranks": per_step[s], "slow": slow_ranks(per_step[s], threshold)} for s in per_step}
    return {"threshold": threshold, "steps": steps, "slow_steps": [s for s, v in steps.items() if v["slow"]["flagged"]]}
