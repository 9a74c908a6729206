"""Reading a chrome trace file as a stream of events (:func:`iter_trace_events`), a cheap check that a
file is one (:func:`looks_like_chrome_trace`), and the bounded-memory interval store the Free ratio of
:mod:`bench.measure.torch_trace` is computed with (:class:`Intervals`).

Input: the file written by ``torch.profiler.profile(...).export_chrome_trace(path)`` —
``{"schemaVersion": 1, ..., "traceEvents": [...], "traceName": ...}`` — plain (``.json``) or gzip
(``.json.gz``, detected by its magic bytes, not by the name). A bare JSON array of events (the
layout of Ascend's ``trace_view.json``) is read too. Times are microseconds: ``ts`` (start) and
``dur`` (duration) of complete events (``"ph": "X"``); numbers or numeric strings (Ascend writes
strings) are both accepted. Only ``ph == "X"`` events with a duration are used.

Memory: events are streamed, never loaded whole (:func:`iter_trace_events` here is the reference
reader, ``ijson.items`` with its C backend when available; the fast reader is
:mod:`bench.measure.trace_fast`, and :mod:`bench.measure.trace_scan` chooses). Only
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
from pathlib import Path

import ijson
import numpy as np

from bench.measure._common import merge_segments, union_length_in

#: the torch profiler's step window: an event named ``ProfilerStep#<N>`` (category ``user_annotation`` or
#: ``cpu_op``) spans step ``N``; the one definition every trace parser matches
STEP_PREFIX = "ProfilerStep#"
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
#: chrome-trace categories of device activity (kernels, memcpy, memset)
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


class Intervals:
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

    def extend(self, starts: np.ndarray, ends: np.ndarray) -> None:
        """Append many intervals at once (float64 arrays of equal length); same result as :meth:`add`."""
        self.starts.frombytes(np.ascontiguousarray(starts, dtype=np.float64).tobytes())
        self.ends.frombytes(np.ascontiguousarray(ends, dtype=np.float64).tobytes())
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


class GzipToTheCut:
    """A gzip stream read up to where it was cut: ``read(n)`` gathers ``read1`` pieces, so that a stream
    that ends early (a killed run) gives every byte before the cut and then ``b""`` (a plain ``read(n)``
    raises ``EOFError`` and drops what it had gathered in that call)."""

    def __init__(self, path: Path, raw=None) -> None:
        self._fh = gzip.open(path, "rb") if raw is None else gzip.GzipFile(fileobj=raw, mode="rb")
        self._cut = False

    def read(self, n: int = -1) -> bytes:
        if self._cut or n == 0:
            return b""
        parts, got = [], 0
        while n < 0 or got < n:
            try:
                part = self._fh.read1(n - got if n > 0 else 1 << 20)
            except EOFError:
                self._cut = True
                break
            if not part:
                break
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def seek(self, pos: int) -> int:
        """Back to ``pos`` of the decompressed stream (gzip decompresses again from the start)."""
        self._cut = False
        return self._fh.seek(pos)

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> GzipToTheCut:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_binary(path: Path, raw=None):
    """The file opened for binary reading, gunzipped when it starts with the gzip magic bytes (a gzip stream
    cut short reads up to the cut, :class:`GzipToTheCut`).

    ``raw``: the file already open (a :class:`~bench.measure.trace_cache.HashingReader`, which hashes what is
    read and is not closed here); it is read from its start."""
    fh = open(path, "rb") if raw is None else raw
    fh.seek(0)
    magic = fh.read(2)
    fh.seek(0)
    if magic == b"\x1f\x8b":
        if raw is None:
            fh.close()
        return GzipToTheCut(path, raw)
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


def iter_trace_events(path: str | os.PathLike, raw=None) -> Iterator[dict]:
    """Stream the events of a chrome trace (``.json`` / ``.json.gz``, object or bare array); ``raw``: see
    :func:`open_binary`."""
    p = Path(path)
    with open_binary(p, raw) as fh:
        prefix = _events_prefix(fh)
        yield from ijson.items(fh, prefix, use_float=True)


def event_number(value: object) -> float | None:
    """A trace field as float: numbers and numeric strings (Ascend writes strings); else ``None``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def hashable(value: object) -> object:
    """A ``pid``/``tid`` value usable as a dict key (``str`` of anything not a number or string)."""
    return value if isinstance(value, (int, float, str)) or value is None else str(value)

def looks_like_chrome_trace(path: str | os.PathLike, peek: int = 1 << 16) -> bool:
    """Cheap check (first ``peek`` bytes, decompressed) that a file is a chrome trace."""
    try:
        with open_binary(Path(path)) as fh:
            head = fh.read(peek)
    except (OSError, EOFError):
        return False
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text[:1] == b"{":
        return b'"traceEvents"' in head or b'"schemaVersion"' in head
    if text[:1] == b"[":
        return b'"ph"' in head
    return False
