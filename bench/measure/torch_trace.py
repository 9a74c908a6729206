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

Memory: events are streamed (``ijson.items``, C backend when available), never loaded whole. Only
the start/end of the basis intervals are kept (16 bytes each, ``array('d')``), and every ``block``
of them is merged into disjoint segments, so memory grows with the number of disjoint busy
segments (16 bytes each; about 1.5% of the file for a dense kernel trace), not with the file
size; ``cpu_op`` intervals are dropped as soon as a device event shows that the basis is the
device. ``benchmarks/bench_trace_parse.py`` measures it. Timestamps are float64; absolute
epoch-based microsecond timestamps (~1.7e15) keep about 0.25 us resolution, far below any step
window.
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

from bench.measure._common import MeasureError, merge_segments, rel_path, union_length_in, walk_files
from bench.measure.formats import Measurements, Reader, ReadOptions

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
    """Interval store with bounded working memory.

    Intervals are appended to ``starts``/``ends`` (``array('d')``, 16 bytes each). Every
    ``block`` intervals the pending ones are merged into a *block* of sorted, disjoint segments
    (numpy), so memory holds only the disjoint busy segments plus one pending block; blocks are
    never merged with each other (that would need transient memory proportional to the whole
    trace). A window's busy time gathers the few segments of each block that meet the window and
    merges only those. The pending arrays are cleared in place, so bound ``append`` methods stay
    valid.
    """

    __slots__ = ("starts", "ends", "blocks", "block", "count")

    def __init__(self, block: int) -> None:
        self.starts = array("d")
        self.ends = array("d")
        self.blocks: list[tuple[np.ndarray, np.ndarray]] = []
        self.block = max(1, block)
        self.count = 0  # intervals moved into blocks

    def add(self, start: float, end: float) -> None:
        self.starts.append(start)
        self.ends.append(end)
        if len(self.starts) >= self.block:
            self.flush()

    def flush(self) -> None:
        k = len(self.starts)
        if not k:
            return
        self.count += k
        seg = merge_segments(
            np.frombuffer(self.starts, dtype=float).copy(), np.frombuffer(self.ends, dtype=float).copy()
        )
        del self.starts[:]
        del self.ends[:]
        self.blocks.append(seg)

    @property
    def total(self) -> int:
        return self.count + len(self.starts)

    def extent(self) -> tuple[float, float]:
        """``(first start, last end)`` over all intervals (``(inf, -inf)`` if none)."""
        self.flush()
        if not self.blocks:
            return math.inf, -math.inf
        # block segments are sorted and disjoint: the first start and the last end are the extremes
        return (min(float(b[0][0]) for b in self.blocks), max(float(b[1][-1]) for b in self.blocks))

    def busy_in(self, lo: float, hi: float) -> float:
        """Length of ``[lo, hi]`` covered by the union of all intervals."""
        self.flush()
        if hi <= lo or not self.blocks:
            return 0.0
        if len(self.blocks) == 1:
            return union_length_in(self.blocks[0][0], self.blocks[0][1], lo, hi)
        parts_s, parts_e = [], []
        for seg_s, seg_e in self.blocks:
            i0 = int(np.searchsorted(seg_e, lo, side="right"))
            i1 = int(np.searchsorted(seg_s, hi, side="left"))
            if i1 > i0:
                parts_s.append(np.maximum(seg_s[i0:i1], lo))
                parts_e.append(np.minimum(seg_e[i0:i1], hi))
        if not parts_s:
            return 0.0
        s, e = merge_segments(np.concatenate(parts_s), np.concatenate(parts_e))
        return float(np.sum(e - s))


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


def parse_trace_free(path: str | os.PathLike, block: int = 1 << 17) -> TraceFree:
    """Free ratio per ``ProfilerStep#N`` window of one chrome trace (see the module docstring).

    ``block``: intervals buffered before they are merged into a block of disjoint segments (bounds
    the transient memory; the result does not depend on it).

    Raises :class:`~bench.measure._common.MeasureError` when the file cannot be opened or is not
    a JSON trace at all. A trace cut short (a run killed while writing it) is read up to the cut
    and a warning is added.
    """
    p = Path(path)
    result = TraceFree(path=str(p), basis="none")
    device = _Intervals(block)
    cpu_by_thread: dict[tuple, _Intervals] = {}
    windows: dict[tuple, list[tuple[int, float, float]]] = {}

    n = 0
    n_cpu = 0
    dev_s_append = device.starts.append
    dev_e_append = device.ends.append
    dev_pending = device.starts
    limit = device.block
    keep_cpu = True  # cpu_op intervals matter only while no device event has been seen
    try:
        for ev in iter_trace_events(p):
            n += 1
            if type(ev) is not dict or ev.get("ph") != "X":
                continue
            cat = ev.get("cat")
            if cat in DEVICE_CATEGORIES:
                ts = ev.get("ts")
                dur = ev.get("dur")
                if type(ts) is not float or type(dur) is not float:
                    ts, dur = _num(ts), _num(dur)
                    if ts is None or dur is None:
                        continue
                if dur < 0:
                    continue
                dev_s_append(ts)
                dev_e_append(ts + dur)
                if len(dev_pending) >= limit:
                    device.flush()
                if keep_cpu:
                    keep_cpu = False
                    cpu_by_thread.clear()  # device basis from now on: free the CPU intervals
            elif cat in STEP_CATEGORIES:
                ts = ev.get("ts")
                dur = ev.get("dur")
                if type(ts) is not float or type(dur) is not float:
                    ts, dur = _num(ts), _num(dur)
                    if ts is None or dur is None:
                        continue
                if dur < 0:
                    continue
                thread = (ev.get("pid"), ev.get("tid"))
                name = ev.get("name")
                if type(name) is str and name.startswith("ProfilerStep#"):
                    m = _STEP_RE.match(name)
                    if m:
                        thread = (_hashable(thread[0]), _hashable(thread[1]))
                        windows.setdefault(thread, []).append((int(m.group(1)), ts, dur))
                        continue
                if cat == "cpu_op":
                    n_cpu += 1
                    if not keep_cpu:
                        continue
                    try:
                        store = cpu_by_thread.get(thread)
                    except TypeError:  # a pid/tid that is a list or an object
                        thread = (_hashable(thread[0]), _hashable(thread[1]))
                        store = cpu_by_thread.get(thread)
                    if store is None:
                        store = cpu_by_thread[thread] = _Intervals(block)
                    store.starts.append(ts)
                    store.ends.append(ts + dur)
                    if len(store.starts) >= store.block:
                        store.flush()
    except OSError as exc:
        raise MeasureError(f"{p}: cannot read trace: {exc.strerror or exc}") from exc
    except (ijson.common.IncompleteJSONError, ijson.common.JSONError, EOFError, ValueError) as exc:
        if n == 0:
            raise MeasureError(f"{p}: not a chrome trace ({exc})") from exc
        result.warnings.append(f"trace cut short after {n} events ({exc}); read what was there")
    result.events = n
    result.device_events = device.total
    result.cpu_ops = n_cpu

    # main thread: the one with the most ProfilerStep events
    main = None
    if windows:
        main = max(windows, key=lambda t: len(windows[t]))
        others = [t for t in windows if t != main]
        if others:
            result.warnings.append(f"ProfilerStep events on several threads {[main, *others]}; using {main}")
    result.main_thread = main

    store: _Intervals | None
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
            return result
        basis = "cpu"
    lo, hi = store.extent() if store is not None else (math.inf, -math.inf)
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


#: folders of a run folder that hold torch chrome traces (any depth below them)
TRACE_DIRS = ("trace", "profile")


_PATH_STEP_RE = re.compile(r"(?:^|[_\-/])(?:train_)?step[_\-]?(\d+)(?=[_\-./]|$)")


def step_from_path(rel: str) -> int | None:
    """The training step a trace file's name or folders name (``None`` if none does).

    verl's torch profiler writes one trace per role and profiled step, named like
    ``actor-rollout_train_step2_rank0-of-1_pid123.json.gz`` (verl >= 0.7), or ``<save_path>/<step>/<role>/``
    folders (verl 0.6.x): a trace without ``ProfilerStep#N`` windows is attributed to that step.
    """
    m = _PATH_STEP_RE.search(rel)
    if m:
        return int(m.group(1))
    for part in Path(rel).parts[:-1]:
        if part.isdigit():
            return int(part)
    return None


def find_torch_traces(run_dir: str | os.PathLike) -> list[Path]:
    """Chrome traces under ``<run_dir>/trace/`` and ``<run_dir>/profile/`` (any depth).

    Names ending ``.json`` or ``.json.gz`` (``*.pt.trace.json[.gz]``, verl's ``prof_rank-<r>.json.gz``)
    whose first bytes look like a chrome trace; nothing inside ``*_ascend_pt`` folders.
    """
    root = Path(run_dir)
    found = []
    for sub in TRACE_DIRS:
        base = root / sub
        if not base.is_dir():
            continue
        for p in walk_files(base):
            if (p.name.endswith(".json") or p.name.endswith(".json.gz")) and looks_like_chrome_trace(p):
                found.append(p)
    return found


class TorchTraceReader(Reader):
    """torch profiler chrome traces: the Free ratio per ``ProfilerStep#N`` window (or the step the path names)."""

    name = "torch"

    def detect(self, run_dir: Path) -> bool:
        return bool(find_torch_traces(run_dir))

    def read(self, run_dir: Path, options: ReadOptions) -> Measurements:
        out = Measurements(fields={"traces": []})
        for trace_path in find_torch_traces(run_dir):
            rel = rel_path(trace_path, run_dir)
            try:
                tf = parse_trace_free(trace_path)
            except MeasureError as exc:
                out.warnings.append(str(exc))
                continue
            d = tf.to_dict()
            d["path"] = rel
            out.fields["traces"].append(d)
            out.warnings.extend(f"{rel}: {w}" for w in tf.warnings)
            path_step = step_from_path(rel)
            for s in tf.steps:
                if math.isnan(s.free_ratio):
                    continue
                entry = {"kind": "torch", "source": rel, "free_ratio": s.free_ratio, "basis": s.basis}
                out.free.append((s.step if s.step is not None else path_step, entry))
        return out
