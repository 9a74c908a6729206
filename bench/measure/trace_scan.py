"""One pass over a chrome trace's events that keeps what the Free ratio needs (:class:`Scan`): the
device intervals, the ``cpu_op`` intervals per thread (only while no device event was seen), the
``ProfilerStep#N`` windows per thread, and counts. :mod:`bench.measure.torch_trace` turns a scan into
Free ratios.

Two readers give the same scan (tests/test_trace_paths.py checks it on every fixture, plain, gzip and
cut short):

* ``fast``: :mod:`bench.measure.trace_fast` (msgspec, batches of events) with the per-batch work done
  on columns (list comprehensions and numpy); used when msgspec is installed.
* ``ijson``: the reference path, one event at a time from ``ijson.items`` (its C backend ``yajl2_c`` when
  present, else pure Python); used when msgspec is missing and whenever the fast reader reports a file it
  cannot read with certainty (:class:`~bench.measure.trace_fast.Unsupported`).

Rules applied to every event (both paths): only ``ph == "X"``; ``ts``/``dur`` numbers or numeric strings
(else the event is skipped), ``dur >= 0``; device = category ``kernel``/``gpu_memcpy``/``gpu_memset``;
``ProfilerStep#N`` events of category ``user_annotation`` or ``cpu_op`` are windows (never busy time);
other ``cpu_op`` events are counted, and kept per ``(pid, tid)`` until the first device event.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import ijson
import numpy as np

import bench.measure.trace_fast as trace_fast
from bench.measure._common import MeasureError
from bench.measure.chrome_trace import (
    DEVICE_CATEGORIES,
    STEP_PREFIX,
    STEP_RE,
    Intervals,
    event_number,
    hashable,
    iter_trace_events,
)
from bench.measure.trace_ops import OpStore

STEP_CATEGORIES = frozenset({"user_annotation", "cpu_op"})
#: the readers :func:`scan_trace` accepts
ENGINES = ("auto", "fast", "ijson")


@dataclass
class Scan:
    """What one pass over a trace keeps (times in microseconds).

    Attributes:
        device: union store of the device intervals.
        cpu_by_thread: ``(pid, tid)`` -> store of its ``cpu_op`` intervals (emptied at the first device event).
        windows: ``(pid, tid)`` -> ``[(N, ts, dur)]`` of its ``ProfilerStep#N`` events, in file order.
        events: events read (all phases); cpu_ops: ``cpu_op`` intervals seen on any thread.
        cut_short: the file ended before its JSON did; engine: ``"fast"`` or ``"ijson"``.
        ops: the ``cpu_op`` (every thread, the whole trace) and device events with a string name, for the
            top operators (:mod:`bench.measure.trace_ops`).
    """

    device: Intervals
    block: int
    cpu_by_thread: dict = field(default_factory=dict)
    windows: dict = field(default_factory=dict)
    events: int = 0
    cpu_ops: int = 0
    cut_short: bool = False
    engine: str = "ijson"
    ops: OpStore = field(default_factory=OpStore)


def scan_trace(path: str | os.PathLike, block: int = 1 << 17, engine: str | None = None, raw=None) -> Scan:
    """Scan one trace (``.json`` / ``.json.gz``, object or bare array) with the chosen reader.

    ``engine``: ``"auto"`` (fast when msgspec is installed and the file is one it reads with certainty,
    else ijson), ``"fast"`` (the same, named for tests), ``"ijson"`` (the reference path); ``None``: the
    environment variable ``BENCH_TRACE_ENGINE``, else ``"auto"``. ``block``:
    intervals buffered before a merge (memory bound; the result does not depend on it). ``raw``: the file
    already open (a :class:`~bench.measure.trace_cache.HashingReader`: the parse hashes what it reads), read
    again from its start by the reference path when the fast one hands the file over.

    Raises :class:`MeasureError` when the file cannot be opened or holds no JSON trace at all.
    """
    engine = resolve_engine(engine)
    p = Path(path)
    if engine != "ijson" and trace_fast.AVAILABLE:
        try:
            return _scan_fast(p, block, raw)
        except trace_fast.Unsupported:
            pass
        except (OSError, EOFError, zlib.error):
            pass  # let the reference path say what it makes of it (a corrupt gzip stream: read up to it)
    return _scan_ijson(p, block, raw)


def resolve_engine(engine: str | None) -> str:
    """``engine``, else ``$BENCH_TRACE_ENGINE``, else ``"auto"``; :class:`MeasureError` if not in :data:`ENGINES`."""
    engine = engine or os.environ.get("BENCH_TRACE_ENGINE") or "auto"
    if engine not in ENGINES:
        raise MeasureError(f"trace engine (BENCH_TRACE_ENGINE) must be one of {', '.join(ENGINES)}, not {engine!r}")
    return engine


def _scan_ijson(p: Path, block: int, raw=None) -> Scan:
    """The reference path: one event at a time (see the module docstring)."""
    device = Intervals(block)
    scan = Scan(device=device, block=block)
    cpu_by_thread = scan.cpu_by_thread
    windows = scan.windows
    n = n_cpu = 0
    dev_s_append = device.starts.append
    dev_e_append = device.ends.append
    dev_pending = device.starts
    limit = device.block
    keep_cpu = True  # cpu_op intervals matter only while no device event has been seen
    add_op = scan.ops.add
    try:
        for ev in iter_trace_events(p, raw):
            n += 1
            if type(ev) is not dict or ev.get("ph") != "X":
                continue
            cat = ev.get("cat")
            if cat not in DEVICE_CATEGORIES and cat not in STEP_CATEGORIES:
                continue
            times = _valid_times(ev.get("ts"), ev.get("dur"))
            if times is None:
                continue
            ts, dur = times
            if cat in DEVICE_CATEGORIES:
                add_op(None, ts, dur, ev.get("name"))
                dev_s_append(ts)
                dev_e_append(ts + dur)
                if len(dev_pending) >= limit:
                    device.flush()
                if keep_cpu:
                    keep_cpu = False
                    cpu_by_thread.clear()  # device basis from now on: free the CPU intervals
            else:  # a step category
                thread = (ev.get("pid"), ev.get("tid"))
                name = ev.get("name")
                if type(name) is str and name.startswith(STEP_PREFIX):
                    m = STEP_RE.match(name)
                    if m:
                        thread = (hashable(thread[0]), hashable(thread[1]))
                        windows.setdefault(thread, []).append((int(m.group(1)), ts, dur))
                        continue
                if cat == "cpu_op":
                    n_cpu += 1
                    add_op(thread, ts, dur, name)
                    if not keep_cpu:
                        continue
                    _cpu_store(cpu_by_thread, thread, block).add(ts, ts + dur)
    except OSError as exc:
        raise MeasureError(f"{p}: cannot read trace: {exc.strerror or exc}") from exc
    except (ijson.common.IncompleteJSONError, ijson.common.JSONError, EOFError, ValueError, zlib.error) as exc:
        if n == 0:
            raise MeasureError(f"{p}: not a chrome trace ({exc})") from exc
        scan.cut_short = True
    scan.events = n
    scan.cpu_ops = n_cpu
    return scan


def _valid_times(ts: object, dur: object) -> tuple[float, float] | None:
    """``(ts, dur)`` of an event as floats (numbers or numeric strings, :func:`event_number`), or ``None``
    when one is not a number or ``dur < 0`` (a NaN duration is kept): the rule of both paths."""
    if type(ts) is not float or type(dur) is not float:
        ts, dur = event_number(ts), event_number(dur)
        if ts is None or dur is None:
            return None
    return None if dur < 0 else (ts, dur)

def _cpu_store(cpu_by_thread: dict, thread: tuple, block: int) -> Intervals:
    try:
        store = cpu_by_thread.get(thread)
    except TypeError:  # a pid/tid that is a list or an object
        thread = (hashable(thread[0]), hashable(thread[1]))
        store = cpu_by_thread.get(thread)
    if store is None:
        store = cpu_by_thread[thread] = Intervals(block)
    return store


def _floats(values: list) -> list | None:
    """``values`` as floats when every one is an int, float or numeric string (``event_number``'s rule
    for these types is ``float(v)``); ``None`` when one is not (a bool, ``None``, a non-numeric string)."""
    kinds = set(map(type, values))
    if kinds <= {float}:
        return values
    if kinds <= {float, int, str}:
        try:
            return list(map(float, values))
        except ValueError:
            return None
    return None


def _times(evs: list) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """``ts``, ``dur`` (float64) of the events with valid times and ``dur >= 0``, and their indexes.

    NaN durations are kept, as by the reference path's ``dur < 0`` test."""
    ts = _floats([e.ts for e in evs])
    dur = _floats([e.dur for e in evs])
    if ts is not None and dur is not None:
        t = np.array(ts, dtype=np.float64)
        d = np.array(dur, dtype=np.float64)
        neg = d < 0
        if not neg.any():
            return t, d, list(range(d.size))
        keep = np.flatnonzero(~neg)
        return t[keep], d[keep], keep.tolist()
    idx, tv, dv = [], [], []
    for i, e in enumerate(evs):
        times = _valid_times(e.ts, e.dur)
        if times is not None:
            idx.append(i)
            tv.append(times[0])
            dv.append(times[1])
    return np.array(tv, dtype=np.float64), np.array(dv, dtype=np.float64), idx


def _complete(evs: list) -> list:
    """The complete events (``ph == "X"``) of ``evs``; one C-level count when they all are (the usual case)."""
    phs = [e.ph for e in evs]
    return evs if phs.count("X") == len(phs) else [e for e, ph in zip(evs, phs) if ph == "X"]


def _scan_fast(p: Path, block: int, raw=None) -> Scan:
    """The fast path: batches from :class:`~bench.measure.trace_fast.BatchReader`, columns per batch."""
    device = Intervals(block)
    scan = Scan(device=device, block=block, engine="fast")
    reader = trace_fast.BatchReader(p, raw=raw)
    keep_cpu = True
    dev_cats, step_cats = DEVICE_CATEGORIES, STEP_CATEGORIES
    for batch in reader:
        try:
            dev = _complete([e for e in batch if e.cat in dev_cats])
            steps = _complete([e for e in batch if e.cat in step_cats])
        except TypeError as exc:  # an unhashable category: the reference path says what it makes of it
            raise trace_fast.Unsupported(str(exc)) from exc
        if dev:
            t, d, rows = _times(dev)
            scan.ops.extend(None, t, d, [dev[i].name for i in rows])
            if t.size:
                device.extend(t, t + d)
                if keep_cpu:
                    keep_cpu = False
                    scan.cpu_by_thread.clear()
        if steps:
            _steps_batch(scan, steps, keep_cpu)
    scan.events = reader.events
    scan.cut_short = reader.cut_short
    if scan.events == 0 and reader.cut_short:
        raise trace_fast.Unsupported("no whole event: the reference path decides")
    return scan


def _window_rows(names: list) -> list[int] | None:
    """Indexes of the names that start with ``ProfilerStep#`` (``None``: a name that is not a plain string).

    One C-level join and find over the batch instead of a Python test per event (a window is rare)."""
    try:
        joined = "\x00".join(names)
    except TypeError:
        return None
    pos = joined.find(STEP_PREFIX)
    if pos < 0:
        return []
    if joined.count("\x00") != len(names) - 1:
        return None  # a name holding the separator: the indexes below would be off
    rows, row, last = [], 0, 0
    while pos >= 0:
        row += joined.count("\x00", last, pos)
        last = pos
        if names[row].startswith(STEP_PREFIX) and (not rows or rows[-1] != row):
            rows.append(row)
        pos = joined.find(STEP_PREFIX, pos + 1)
    return rows


def _steps_batch(scan: Scan, steps: list, keep_cpu: bool) -> None:
    """The ``user_annotation``/``cpu_op`` events of one batch: windows, the cpu_op count and intervals."""
    t, d, idx = _times(steps)
    valid = steps if len(idx) == len(steps) else [steps[i] for i in idx]
    names = [e.name for e in valid]
    cand = _window_rows(names)
    if cand is None:
        cand = [j for j, name in enumerate(names) if type(name) is str and name.startswith(STEP_PREFIX)]
    wins = set()
    for j in cand:
        m = STEP_RE.match(names[j])
        if m:
            e = valid[j]
            thread = (hashable(e.pid), hashable(e.tid))
            scan.windows.setdefault(thread, []).append((int(m.group(1)), float(t[j]), float(d[j])))
            wins.add(j)
    cats = [e.cat for e in valid]
    if not wins and cats.count("cpu_op") == len(cats):
        cpu = valid
        rows: list[int] | slice = slice(None)
    else:
        rows = [j for j, c in enumerate(cats) if c == "cpu_op" and j not in wins]
        cpu = [valid[j] for j in rows]
    scan.cpu_ops += len(cpu)
    if cpu:
        _add_cpu(scan, cpu, t[rows], d[rows], keep_cpu)


def _add_cpu(scan: Scan, evs: list, t: np.ndarray, d: np.ndarray, keep_cpu: bool) -> None:
    """``cpu_op`` events of one batch into their thread's operator columns and (while ``keep_cpu``) interval
    store, threads in order of appearance."""
    threads = [(e.pid, e.tid) for e in evs]
    first = threads[0]
    try:
        if threads.count(first) == len(threads):
            scan.ops.extend(first, t, d, [e.name for e in evs])
            if keep_cpu:
                _cpu_store(scan.cpu_by_thread, first, scan.block).extend(t, t + d)
            return
    except TypeError:
        pass
    groups: dict = {}
    for i, th in enumerate(threads):
        try:
            groups.setdefault(th, []).append(i)
        except TypeError:  # a pid/tid that is a list or an object: keyed as the reference path keys it
            groups.setdefault((hashable(th[0]), hashable(th[1])), []).append(i)
    for th, rows in groups.items():
        scan.ops.extend(th, t[rows], d[rows], [evs[i].name for i in rows])
        if keep_cpu:
            _cpu_store(scan.cpu_by_thread, th, scan.block).extend(t[rows], t[rows] + d[rows])
