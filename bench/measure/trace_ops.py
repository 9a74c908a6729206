"""The top operators of each profiled step by self time, from the same single pass over a trace that gives its
Free ratio: the scan (:mod:`bench.measure.trace_scan`, either reader) keeps the ``cpu_op`` and device events'
start, duration and name in an :class:`OpStore` (columns, 20 bytes an event; device events spilled to a temporary
file block by block), and :func:`top_table` turns it
into per-step tables, stored with the trace's :class:`~bench.measure.torch_trace.TraceFree` (and so in the
parsed-profile cache: MLflow's ``profile_summary.json`` reads them from there, never from the trace again).

Self time is what ``torch.profiler``'s key averages call ``self_cpu_time_total`` / ``self_device_time_total``:
an operator's duration minus the durations of the operators it calls. For ``cpu_op`` events the calls are the
``cpu_op`` events nested in it on the same thread (sorted by start, longer first; an event's caller is the
innermost earlier event of the thread still open at its start — a stack); device events (``kernel``,
``gpu_memcpy``, ``gpu_memset``) do not nest, so their self time is their duration. Events are attributed to a
step window by their start (inclusive ends; the first window in step order when windows overlap). Times in the
trace are microseconds; tables are in milliseconds.
"""

from __future__ import annotations

import tempfile
from array import array
from typing import Any

import numpy as np

from bench.measure.chrome_trace import hashable

#: operators listed per kind (cpu, device) and step
TOP_N = 10
#: windows x names up to which the sums are kept in one dense counter per pair (else the keys are sorted)
DENSE_KEYS = 1 << 22
#: device events per block spilled to the temporary file (and summed at a time)
SPILL = 1 << 18


class OpStore:
    """``cpu_op`` events per thread and device events, as columns (start us, duration us, name id: int32).

    Device events (usually the most numerous, and never sorted) are spilled to a temporary file in blocks of
    exactly :data:`SPILL` events as they come (so the blocks are the same however the events arrived), and read
    back one block at a time by :func:`top_table`: they cost no memory beyond one block."""

    __slots__ = ("names", "cpu", "dev", "spill", "blocks")

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.cpu: dict[tuple, tuple[array, array, array]] = {}
        self.dev: tuple[array, array, array] = (array("d"), array("d"), array("i"))
        self.spill = None  # the temporary file of the device blocks written so far
        self.blocks = 0

    def _cols(self, thread: tuple) -> tuple[array, array, array]:
        try:
            cols = self.cpu.get(thread)
        except TypeError:  # a pid/tid that is a list or an object
            thread = (hashable(thread[0]), hashable(thread[1]))
            cols = self.cpu.get(thread)
        if cols is None:
            cols = self.cpu[thread] = (array("d"), array("d"), array("i"))
        return cols

    def _spill(self) -> None:
        """Move the first :data:`SPILL` pending device events to the temporary file."""
        if self.spill is None:
            self.spill = tempfile.TemporaryFile(prefix="bench-ops-")
        for col in self.dev:
            self.spill.write(memoryview(col)[:SPILL].tobytes())
            del col[:SPILL]
        self.blocks += 1

    def add(self, thread: tuple | None, ts: float, dur: float, name: object) -> None:
        """One event (``thread`` ``None``: a device event); names that are not strings are skipped."""
        if type(name) is not str:
            return
        cols = self.dev if thread is None else self._cols(thread)
        cols[0].append(ts)
        cols[1].append(dur)
        cols[2].append(self.names.setdefault(name, len(self.names)))
        if thread is None and len(cols[0]) >= SPILL:
            self._spill()

    def extend(self, thread: tuple | None, ts: np.ndarray, dur: np.ndarray, names: list) -> None:
        """Many events at once (float64 arrays and their names); the same as :meth:`add` for each."""
        if not names:
            return
        table = self.names
        try:
            ids = list(map(table.__getitem__, names))  # known names (the usual case): one C-level lookup each
        except (KeyError, TypeError):
            if set(map(type, names)) != {str}:
                keep = [i for i, n in enumerate(names) if type(n) is str]
                ts, dur, names = ts[keep], dur[keep], [names[i] for i in keep]
            ids = [table.setdefault(n, len(table)) for n in names]
        cols = self.dev if thread is None else self._cols(thread)
        cols[0].frombytes(np.ascontiguousarray(ts, dtype=np.float64).tobytes())
        cols[1].frombytes(np.ascontiguousarray(dur, dtype=np.float64).tobytes())
        cols[2].extend(ids)
        while thread is None and len(cols[0]) >= SPILL:
            self._spill()

    def device_blocks(self):
        """The device events, block by block: ``(ts, dur, ids)`` arrays (float64, float64, int64), file order.
        Closes the temporary file at the end."""
        if self.spill is not None:
            self.spill.seek(0)
            for _ in range(self.blocks):
                ts = np.frombuffer(self.spill.read(8 * SPILL), dtype=np.float64)
                dur = np.frombuffer(self.spill.read(8 * SPILL), dtype=np.float64)
                ids = np.frombuffer(self.spill.read(4 * SPILL), dtype=np.int32).astype(np.int64)
                yield ts, dur, ids
            self.spill.close()
            self.spill = None
        yield _col(self.dev[0]), _col(self.dev[1]), _col(self.dev[2])


def self_times(ts: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """Self time of each ``cpu_op`` event of one thread: ``(order, own)`` where ``order`` sorts the events by
    start (longer first at equal starts, else file order; ``None`` when they are in that order already: every
    start later than the one before) and ``own[i]`` is the self time (us) of event ``order[i]``: its duration
    minus the durations of the events whose caller it is (see the module docstring).

    Events that nest nothing and lie in nothing (a start at or after the end of every earlier event) are
    done on columns; only nested runs go through the stack, one event at a time. Memory: a few arrays of the
    thread's event count, freed as soon as they are used."""
    order = None if ts.size < 2 or bool(np.all(ts[1:] > ts[:-1])) else np.lexsort((-dur, ts))
    s, d = (ts, dur) if order is None else (ts[order], dur[order])
    own = d.copy()
    if s.size < 2:
        return order, own
    reach = s + d
    np.maximum.accumulate(reach, out=reach)
    new = np.empty(s.size, dtype=bool)  # a new run: every earlier event ended
    new[0] = True
    np.greater_equal(s[1:], reach[:-1], out=new[1:])
    del reach
    firsts = np.flatnonzero(new)
    del new
    sizes = np.diff(firsts, append=s.size)
    multi = sizes > 1
    for a, size in zip(firsts[multi].tolist(), sizes[multi].tolist()):
        starts, durs = s[a:a + size].tolist(), d[a:a + size].tolist()
        mine = own[a:a + size].tolist()
        stack: list[int] = []
        ends: list[float] = []
        for i, (t0, dt) in enumerate(zip(starts, durs)):
            while stack and t0 >= ends[-1]:
                stack.pop()
                ends.pop()
            if stack:
                mine[stack[-1]] -= dt
            stack.append(i)
            ends.append(t0 + dt)
        own[a:a + size] = mine
    return order, own


def _window_of(ts: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Index of the window each start falls in (``-1``: none); the first window when several hold it."""
    if not starts.size:
        return np.full(ts.size, -1, dtype=np.int64)
    if np.all(ends[:-1] < starts[1:]):  # sorted and disjoint (the usual case): one binary search each
        k = np.searchsorted(starts, ts, side="right") - 1
        ok = (k >= 0) & (ts <= ends[np.maximum(k, 0)])
        return np.where(ok, k, -1)
    out = np.full(ts.size, -1, dtype=np.int64)
    for k in range(starts.size):
        out[(out < 0) & (ts >= starts[k]) & (ts <= ends[k])] = k
    return out


def _at(ts: np.ndarray, starts: np.ndarray, ends: np.ndarray, one: bool) -> np.ndarray:
    """The window of each start (``one``: a trace without windows, every event in the one entry)."""
    return np.zeros(ts.size, dtype=np.int64) if one else _window_of(ts, starts, ends)


class _Sums:
    """Calls and summed self time per (window, name), added a block at a time (the same blocks give the same
    sums, to the last bit): one dense counter per pair up to :data:`DENSE_KEYS` pairs, else sorted keys."""

    def __init__(self, windows: int, names: int) -> None:
        self.names = max(1, names)
        self.dense = windows * self.names <= DENSE_KEYS
        size = windows * self.names if self.dense else 0
        self.calls = np.zeros(size, dtype=np.int64)
        self.total = np.zeros(size, dtype=np.float64)
        self.sparse: dict[int, list] = {}

    def add(self, window: np.ndarray, ids: np.ndarray, own: np.ndarray) -> None:
        keep = window >= 0
        key = window[keep] * self.names + ids[keep]
        if self.dense:
            self.calls += np.bincount(key, minlength=self.calls.size)
            self.total += np.bincount(key, weights=own[keep], minlength=self.total.size)
            return
        uniq, inv = np.unique(key, return_inverse=True)
        calls = np.bincount(inv, minlength=uniq.size)
        total = np.bincount(inv, weights=own[keep], minlength=uniq.size)
        for u, c, t in zip(uniq.tolist(), calls.tolist(), total.tolist()):
            slot = self.sparse.setdefault(u, [0, 0.0])
            slot[0] += c
            slot[1] += t

    def by_window(self, names: list[str]) -> dict[int, list[tuple[str, int, float]]]:
        """``{window index: [(name, calls, total us)]}``."""
        if self.dense:
            uniq = np.flatnonzero(self.calls)
            pairs = zip(uniq.tolist(), self.calls[uniq].tolist(), self.total[uniq].tolist())
        else:
            pairs = ((u, c, t) for u, (c, t) in sorted(self.sparse.items()))
        out: dict[int, list[tuple[str, int, float]]] = {}
        for u, c, t in pairs:
            w, i = divmod(u, self.names)
            out.setdefault(w, []).append((names[i], c, t))
        return out


def _col(values: array) -> np.ndarray:
    return np.frombuffer(values, dtype=np.float64) if values.typecode == "d" else np.asarray(values, dtype=np.int64)


def top_table(store: OpStore, spans: list[tuple[int | None, float, float]] | None,
              n: int = TOP_N) -> list[dict[str, Any]]:
    """Per step, the top ``n`` operators of each kind by self time.

    Args:
        store: the events of one trace.
        spans: the step windows ``(step, start us, duration us)`` in step order (the Free ratio's windows);
            ``None``: the trace has no windows, every event counts in one entry (``step`` and ``window_ms``
            ``None``).
        n: operators per kind.

    Returns:
        ``[{"step", "window_ms", "cpu": [...], "device": [...], "ops": {"cpu": [...], "device": [...]}}]``, one
        per window; each top operator ``{"name", "calls", "self_ms", "share"}``; ``ops``: every operator of the
        window as ``[name, calls, self us]``, same order (``share``: self time / window, ``None`` without one),
        sorted by self time (then name).
    """
    rows = spans if spans is not None else [(None, 0.0, None)]
    starts = np.array([s for _, s, _ in rows], dtype=np.float64)
    ends = starts + np.array([0.0 if w is None else w for _, _, w in rows], dtype=np.float64)
    names = list(store.names)
    tables = {}
    for kind in ("cpu", "device"):
        sums = _Sums(len(rows), len(names))
        if kind == "cpu":
            for ts_a, dur_a, id_a in store.cpu.values():
                ts, dur, ids = _col(ts_a), _col(dur_a), np.frombuffer(id_a, dtype=np.int32)
                order, own = self_times(ts, dur)
                np.maximum(own, 0.0, out=own)
                for a in range(0, own.size, SPILL):
                    part = slice(a, a + SPILL) if order is None else order[a:a + SPILL]
                    sums.add(_at(ts[part], starts, ends, spans is None), ids[part].astype(np.int64),
                             own[a:a + SPILL])
        else:
            for ts, dur, ids in store.device_blocks():
                sums.add(_at(ts, starts, ends, spans is None), ids, dur)
        tables[kind] = sums.by_window(names)

    out = []
    for w, (step, _, window) in enumerate(rows):
        entry: dict[str, Any] = {"step": step, "window_ms": None if window is None else round(window / 1e3, 3)}
        for kind in ("cpu", "device"):
            ops = sorted(tables[kind].get(w, []), key=lambda o: (-o[2], o[0]))
            entry[kind] = op_rows(ops[:n], window)
            # every operator (name, calls, self us): the run's operator and category times (bench.measure.run_ops)
            entry.setdefault("ops", {})[kind] = [[name, c, round(t, 3)] for name, c, t in ops]
        out.append(entry)
    return out


def op_rows(ops: list, window_us: float | None) -> list[dict[str, Any]]:
    """Operators ``(name, calls, total self time us)`` as rows of a top-operators table: ``{"name", "calls",
    "self_ms", "share"}`` (``share`` = time / ``window_us``, ``None`` without a window)."""
    return [{"name": name, "calls": c, "self_ms": round(t / 1e3, 3),
             "share": round(t / window_us, 4) if window_us else None} for name, c, t in ops]


def step_entry(entries: list[dict], step: int | None) -> dict | None:
    """The entry of ``step`` among per-step entries (each with a ``"step"`` key); a list whose only entry has no
    step (a file without steps) answers for any step; ``None`` when there is none."""
    hit = next((e for e in entries if e.get("step") == step), None)
    if hit is None and len(entries) == 1 and entries[0].get("step") is None:
        hit = entries[0]
    return hit
