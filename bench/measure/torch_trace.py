"""Free ratio per ``ProfilerStep#N`` window of a PyTorch (Kineto) chrome trace, streamed with ijson.

Input: the file written by ``torch.profiler.profile(...).export_chrome_trace(path)`` —
``{"schemaVersion": 1, ..., "traceEvents": [...], "traceName": ...}`` — plain (``.json``) or gzip
(``.json.gz``, detected by its magic bytes, not by the name). A bare JSON array of events (the
layout of Ascend's ``trace_view.json``) is read too. Times are microseconds: ``ts`` (start) and
``dur`` (duration) of complete events (``"ph": "X"``); numbers or numeric strings (Ascend writes
strings) are both accepted. Only ``ph == "X"`` events with a duration are used.

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

Memory: events are streamed (``ijson.items``, C backend when available); only the start/end of the
basis intervals are kept (16 bytes each, in ``array('d')``), merged into disjoint segments every
``compact_every`` intervals, so memory grows with the number of disjoint busy segments, never
with the file size. Timestamps are float64; absolute epoch-based microsecond timestamps
(~1.7e15) keep about 0.25 us resolution, far below any step window.
"""

from __future__ import annotations

import gzip
import math
import os
import re
from array import array
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import ijson
import numpy as np

from bench.measure._common import MeasureError, merge_segments, union_length_in

DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
STEP_CATEGORIES = frozenset({"user_annotation", "cpu_op"})
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


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
    """

    path: str
    basis: str
    steps: list[StepFree] = field(default_factory=list)
    main_thread: tuple | None = None
    events: int = 0
    device_events: int = 0
    cpu_ops: int = 0
    warnings: list[str] = field(default_factory=list)

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
        }


class _Intervals:
    """Append-only interval store, compacted into disjoint segments as it grows."""

    __slots__ = ("starts", "ends", "seg_s", "seg_e", "compact_every", "lo", "hi", "count")

    def __init__(self, compact_every: int) -> None:
        self.starts = array("d")
        self.ends = array("d")
        self.seg_s = np.empty(0)
        self.seg_e = np.empty(0)
        self.compact_every = compact_every
        self.lo = math.inf
        self.hi = -math.inf
        self.count = 0

    def add(self, start: float, end: float) -> None:
        self.starts.append(start)
        self.ends.append(end)
        self.count += 1
        if start < self.lo:
            self.lo = start
        if end > self.hi:
            self.hi = end
        if len(self.starts) >= self.compact_every:
            self.compact()

    def compact(self) -> None:
        if not self.starts:
            return
        s = np.concatenate([self.seg_s, np.frombuffer(self.starts, dtype=float)])
        e = np.concatenate([self.seg_e, np.frombuffer(self.ends, dtype=float)])
        self.seg_s, self.seg_e = merge_segments(s, e)
        self.starts = array("d")
        self.ends = array("d")
        # if merging hardly shrinks the data, compact less often (keeps the total cost n log n)
        self.compact_every = max(self.compact_every, 2 * self.seg_s.size)

    def segments(self) -> tuple[np.ndarray, np.ndarray]:
        self.compact()
        return self.seg_s, self.seg_e


def _open_binary(path: Path):
    fh = open(path, "rb")
    magic = fh.read(2)
    fh.seek(0)
    if magic == b"\x1f\x8b":
        fh.close()
        return gzip.open(path, "rb")
    return fh


def _events_prefix(fh) -> str:
    """``"traceEvents.item"`` for a ``{...}`` trace, ``"item"`` for a bare array (Ascend)."""
    head = fh.read(4096)
    fh.seek(0)
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] == b"[":
        return "item"
    if text[:1] == b"{":
        return "traceEvents.item"
    raise ValueError("not a JSON object or array")


def iter_trace_events(path: str | os.PathLike) -> Iterator[dict]:
    """Stream the events of a chrome trace (``.json`` / ``.json.gz``, object or bare array)."""
    p = Path(path)
    with _open_binary(p) as fh:
        prefix = _events_prefix(fh)
        yield from ijson.items(fh, prefix, use_float=True)


def _num(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _hashable(value: object) -> object:
    return value if isinstance(value, (int, float, str)) or value is None else str(value)


def parse_trace_free(path: str | os.PathLike, compact_every: int = 1 << 20) -> TraceFree:
    """Free ratio per ``ProfilerStep#N`` window of one chrome trace (see the module docstring).

    Raises :class:`~bench.measure._common.MeasureError` when the file cannot be opened or is not
    a JSON trace at all. A trace cut short (a run killed while writing it) is read up to the cut
    and a warning is added.
    """
    p = Path(path)
    result = TraceFree(path=str(p), basis="none")
    device = _Intervals(compact_every)
    cpu_by_thread: dict[tuple, _Intervals] = {}
    windows: dict[tuple, list[tuple[int, float, float]]] = {}

    try:
        events = iter_trace_events(p)
        n = 0
        for ev in events:
            n += 1
            if not isinstance(ev, dict) or ev.get("ph") != "X":
                continue
            cat = ev.get("cat")
            if cat in DEVICE_CATEGORIES:
                ts = _num(ev.get("ts"))
                dur = _num(ev.get("dur"))
                if ts is None or dur is None or dur < 0:
                    continue
                device.add(ts, ts + dur)
            elif cat in STEP_CATEGORIES:
                ts = _num(ev.get("ts"))
                dur = _num(ev.get("dur"))
                if ts is None or dur is None or dur < 0:
                    continue
                thread = (_hashable(ev.get("pid")), _hashable(ev.get("tid")))
                name = ev.get("name")
                m = _STEP_RE.match(name) if isinstance(name, str) else None
                if m:
                    windows.setdefault(thread, []).append((int(m.group(1)), ts, dur))
                elif cat == "cpu_op":
                    store = cpu_by_thread.get(thread)
                    if store is None:
                        store = cpu_by_thread[thread] = _Intervals(compact_every)
                    store.add(ts, ts + dur)
    except OSError as exc:
        raise MeasureError(f"{p}: cannot read trace: {exc.strerror or exc}") from exc
    except (ijson.common.IncompleteJSONError, ijson.common.JSONError, EOFError, ValueError) as exc:
        if n == 0:
            raise MeasureError(f"{p}: not a chrome trace ({exc})") from exc
        result.warnings.append(f"trace cut short after {n} events ({exc}); read what was there")
    result.events = n
    result.device_events = device.count
    result.cpu_ops = sum(s.count for s in cpu_by_thread.values())

    # main thread: the one with the most ProfilerStep events
    main = None
    if windows:
        main = max(windows, key=lambda t: len(windows[t]))
        others = [t for t in windows if t != main]
        if others:
            result.warnings.append(
                f"ProfilerStep events on several threads {[main, *others]}; using {main}"
            )
    result.main_thread = main

    if device.count:
        basis = "device"
        seg_s, seg_e = device.segments()
        lo, hi = device.lo, device.hi
    else:
        if main is not None:
            store = cpu_by_thread.get(main)
        elif cpu_by_thread:
            # no step events: the thread whose cpu_ops cover the most time stands for the main one
            def covered(st: _Intervals) -> float:
                s, e = st.segments()
                return float(np.sum(e - s))

            store = max(cpu_by_thread.values(), key=covered)
        else:
            store = None
        if store is None and main is None:
            return result
        basis = "cpu"
        if store is None:
            seg_s, seg_e, lo, hi = np.empty(0), np.empty(0), math.inf, -math.inf
        else:
            seg_s, seg_e = store.segments()
            lo, hi = store.lo, store.hi
    result.basis = basis

    if main is None:
        spans = [(None, lo, hi - lo)] if hi >= lo else []
    else:
        seen: dict[int, tuple[int | None, float, float]] = {}
        for step, start, dur in windows[main]:
            if step in seen:
                result.warnings.append(f"ProfilerStep#{step} appears more than once; kept the first")
                continue
            seen[step] = (step, start, dur)
        spans = [seen[k] for k in sorted(seen)]

    for step, start, window in spans:
        end = start + window
        busy = min(union_length_in(seg_s, seg_e, start, end), window)
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


def looks_like_chrome_trace(path: str | os.PathLike, peek: int = 1 << 16) -> bool:
    """Cheap check (first ``peek`` bytes, decompressed) that a file is a chrome trace."""
    try:
        with _open_binary(Path(path)) as fh:
            head = fh.read(peek)
    except (OSError, EOFError):
        return False
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] == b"{":
        return b'"traceEvents"' in head or b'"schemaVersion"' in head
    if text[:1] == b"[":
        return b'"ph"' in head
    return False
