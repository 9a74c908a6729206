"""Free ratio per ``ProfilerStep#N`` window of a PyTorch (Kineto) chrome trace.

The file format: :mod:`bench.measure.chrome_trace`; how its events are read (msgspec batches, or
ijson as the reference path): :mod:`bench.measure.trace_scan`.

Windows: the events named ``ProfilerStep#N`` of category ``user_annotation`` (torch >= 1.13) or
``cpu_op`` (older torch). torch only emits them when the profiler has a ``schedule=``; their
``N`` is ``profile.step_num``. The thread carrying them (``pid``, ``tid``) is the *main thread*.
A trace without them yields one window with ``step = None`` spanning the basis events (see below).

Busy time, per window ``[ts, ts + dur]`` (HolisticTraceAnalysis's idle-time definition,
``idle = window - union of device intervals``):

* ``device`` basis (the trace holds any event of category ``kernel``, ``gpu_memcpy`` or
  ``gpu_memset``): busy = length of the union of all device intervals (every stream, every
  device) clipped to the window.
* ``cpu`` basis (no device event, a CPU-only trace): busy = length of the union of the ``cpu_op``
  intervals on the main thread clipped to the window (the ``ProfilerStep#N`` events themselves
  excluded).

Then ``free = window - busy`` and ``free_ratio = free / window``. The aggregate over a trace is
time weighted: ``sum(free) / sum(window)``; the median of the per-step ratios is given too.

The same pass gives the top operators of each window by self time (:mod:`bench.measure.trace_ops`,
``TraceFree.top_ops``).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from bench.measure._common import MeasureError
from bench.measure.chrome_trace import Intervals
from bench.measure.trace_cache import open_hashed
from bench.measure.trace_ops import top_table
from bench.measure.trace_scan import scan_trace


@dataclass(frozen=True)
class StepFree:
    """Free time of one profiler step window. Times in microseconds.

    Attributes:
        step: ``N`` of ``ProfilerStep#N`` (``None``: the trace has no step events; the window then
            spans the basis events).
        start_us / end_us: the window.
        window_us: ``end_us - start_us``.
        busy_us: union of the basis intervals inside the window.
        free_us: ``window_us - busy_us``.
        free_ratio: ``free_us / window_us`` (NaN for an empty window).
        basis: ``"device"`` or ``"cpu"``.
    """

    step: int | None
    start_us: float
    end_us: float
    window_us: float
    busy_us: float
    free_us: float
    free_ratio: float
    basis: str


@dataclass
class TraceFree:
    """Result of :func:`parse_trace_free` for one trace file.

    Attributes:
        path: the trace.
        basis: ``"device"``, ``"cpu"``, or ``"none"`` (no usable event at all).
        steps: one :class:`StepFree` per window, sorted by step.
        main_thread: ``(pid, tid)`` carrying the ``ProfilerStep`` events (``None`` if none).
        events: trace events read (all phases).
        device_events: device intervals seen (``kernel``/``gpu_memcpy``/``gpu_memset``).
        cpu_ops: ``cpu_op`` intervals seen on any thread.
        warnings: oddities (duplicate step numbers, steps on several threads ...).
        top_ops: per window the top operators by self time
            (:func:`bench.measure.trace_ops.top_table`: ``[{"step", "window_ms", "cpu", "device"}]``).
    """

    path: str
    basis: str
    steps: list[StepFree] = field(default_factory=list)
    main_thread: tuple | None = None
    events: int = 0
    device_events: int = 0
    cpu_ops: int = 0
    warnings: list[str] = field(default_factory=list)
    top_ops: list[dict] = field(default_factory=list)

    def aggregate(self) -> dict:
        """Time-weighted free ratio over the windows, plus the median of the per-step ratios.

        Returns ``{"steps": n, "window_us": sum, "busy_us": sum, "free_us": sum,
        "free_ratio": sum(free)/sum(window) or None, "median_free_ratio": ... or None}``.
        """
        win = sum(s.window_us for s in self.steps)
        busy = sum(s.busy_us for s in self.steps)
        ratios = [s.free_ratio for s in self.steps if not math.isnan(s.free_ratio)]
        return {
            "steps": len(self.steps),
            "window_us": win,
            "busy_us": busy,
            "free_us": win - busy,
            "free_ratio": (win - busy) / win if win > 0 else None,
            "median_free_ratio": float(np.median(ratios)) if ratios else None,
        }

    @classmethod
    def from_dict(cls, d: dict) -> TraceFree:
        """The inverse of :meth:`to_dict` (``aggregate`` is recomputed, not read)."""
        main = d.get("main_thread")
        return cls(
            path=d["path"],
            basis=d["basis"],
            steps=[StepFree(**s) for s in d.get("steps") or []],
            main_thread=tuple(main) if main else None,
            events=d.get("events", 0),
            device_events=d.get("device_events", 0),
            cpu_ops=d.get("cpu_ops", 0),
            warnings=list(d.get("warnings") or []),
            top_ops=list(d.get("top_ops") or []),
        )

    def to_dict(self) -> dict:
        """JSON-friendly form (``steps`` as dicts, ``aggregate`` included)."""
        return {
            "path": self.path,
            "basis": self.basis,
            "main_thread": list(self.main_thread) if self.main_thread else None,
            "events": self.events,
            "device_events": self.device_events,
            "cpu_ops": self.cpu_ops,
            "steps": [asdict(s) for s in self.steps],
            "aggregate": self.aggregate(),
            "warnings": list(self.warnings),
            "top_ops": list(self.top_ops),
        }


def parse_trace_hashed(path: str | os.PathLike, engine: str | None = None) -> tuple[TraceFree, str]:
    """:func:`parse_trace_free` and the content hash of the file (:func:`bench.measure.trace_cache.content_hash`)
    from the same read: every byte is hashed as the parser reads it. Raises as :func:`parse_trace_free`."""
    p = Path(path)
    fh, raw = open_hashed(p, "trace")
    with fh:
        result = parse_trace_free(p, engine=engine, raw=raw)
        try:
            return result, raw.digest()
        except OSError as exc:
            raise MeasureError(f"{p}: cannot read trace: {exc.strerror or exc}") from exc


def parse_trace_hashed_dict(path: str | os.PathLike, engine: str | None = None) -> tuple[dict, str]:
    """:func:`parse_trace_hashed` with the result as :meth:`TraceFree.to_dict` (what the cache stores)."""
    result, digest = parse_trace_hashed(path, engine)
    return result.to_dict(), digest


def parse_trace_free(path: str | os.PathLike, block: int = 1 << 17, engine: str | None = None,
                     raw=None) -> TraceFree:
    """Free ratio per ``ProfilerStep#N`` window of one chrome trace (see the module docstring).

    ``block``: intervals buffered before they are merged into a block of disjoint segments (bounds
    the transient memory; the result does not depend on it). ``engine``: which reader scans the events
    (:func:`bench.measure.trace_scan.scan_trace`: ``"auto"``, ``"fast"`` or ``"ijson"``; default
    ``$BENCH_TRACE_ENGINE`` or ``"auto"``; the result does not depend on it). ``raw``: the file already open
    (see :func:`bench.measure.trace_scan.scan_trace`).

    Raises :class:`~bench.measure._common.MeasureError` when the file cannot be opened or is not
    a JSON trace at all. A trace cut short (a run killed while writing it) is read up to the cut
    and a warning is added.
    """
    p = Path(path)
    result = TraceFree(path=str(p), basis="none")
    scan = scan_trace(p, block=block, engine=engine, raw=raw)
    if scan.cut_short:
        result.warnings.append(f"trace cut short after {scan.events} events; read what was there")
    device, cpu_by_thread, windows = scan.device, scan.cpu_by_thread, scan.windows
    result.events = scan.events
    result.device_events = device.total
    result.cpu_ops = scan.cpu_ops

    # main thread: the one with the most ProfilerStep events
    main = None
    if windows:
        main = max(windows, key=lambda t: len(windows[t]))
        others = [t for t in windows if t != main]
        if others:
            result.warnings.append(f"ProfilerStep events on several threads {[main, *others]}; using {main}")
    result.main_thread = main

    store: Intervals | None
    if device.total:
        basis = "device"
        store = device
    else:
        if main is not None:
            store = cpu_by_thread.get(main)
        elif cpu_by_thread:
            # no step events: the thread whose cpu_ops cover the most time stands for the main one
            store = max(cpu_by_thread.values(), key=lambda st: st.busy_in(*st.extent()))
        else:
            store = None
        if store is None and main is None:
            result.top_ops = top_table(scan.ops, None) if scan.ops.names else []
            return result
        basis = "cpu"
    lo, hi = store.extent() if store is not None else (math.inf, -math.inf)
    result.basis = basis

    if main is None:
        spans = [(None, lo, hi - lo)] if hi >= lo else []
        result.top_ops = top_table(scan.ops, None) if scan.ops.names else []
    else:
        seen: dict[int, tuple[int | None, float, float]] = {}
        for step, start, dur in windows[main]:
            if step in seen:
                result.warnings.append(f"ProfilerStep#{step} appears more than once; kept the first")
                continue
            seen[step] = (step, start, dur)
        spans = [seen[k] for k in sorted(seen)]
        result.top_ops = top_table(scan.ops, spans)

    for step, start, window in spans:
        end = start + window
        busy = min(store.busy_in(start, end), window) if store is not None else 0.0
        free = window - busy
        result.steps.append(
            StepFree(
                step=step,
                start_us=start,
                end_us=end,
                window_us=window,
                busy_us=busy,
                free_us=free,
                free_ratio=free / window if window > 0 else math.nan,
                basis=basis,
            )
        )
    return result
