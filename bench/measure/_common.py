"""Small helpers shared by the measurement readers (no side effects)."""

from __future__ import annotations

import csv
import math
import os
import statistics
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from bench.core.errors import BenchError


class MeasureError(BenchError):
    """A measurement input cannot be read at all (missing file, unusable profiler output).

    Recoverable oddities (a truncated last line, a missing rank) are *reported* in the readers'
    results instead of raised.
    """


def to_float(value: object) -> float | None:
    """Coerce a logged value to ``float``.

    Accepts ints, floats, bools, numeric strings (``"1.5"``, ``"NaN"``, ``"inf"``) and ``None``
    (orjson writes NaN as ``null``; it is read back as NaN). Returns ``None`` when the value is
    not a number (a list, a dict, a non-numeric string).
    """
    if value is None:
        return math.nan
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def finite(values: Iterable[float | None]) -> list[float]:
    """The finite floats of ``values`` (``None`` and NaN/inf dropped)."""
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def median(values: Iterable[float | None]) -> float | None:
    """Median of the finite values, ``None`` when there is none (the mean of the two middle values of an even
    count, as ``numpy.median``; ``statistics.median`` is the same value and much faster for the short lists of
    one run's steps)."""
    vals = finite(values)
    return float(statistics.median(vals)) if vals else None


def mean(values: Iterable[float | None]) -> float | None:
    """Arithmetic mean of the finite values, ``None`` when there is none."""
    vals = finite(values)
    return float(np.mean(vals)) if vals else None


def iqr(values: Iterable[float | None]) -> float | None:
    """Interquartile range ``q75 - q25`` (numpy's default linear interpolation), ``None`` if empty."""
    vals = finite(values)
    if not vals:
        return None
    q25, q75 = np.percentile(vals, [25.0, 75.0])
    return float(q75 - q25)


def union_length_in(starts: np.ndarray, ends: np.ndarray, lo: float, hi: float) -> float:
    """Length of ``[lo, hi]`` covered by sorted, disjoint segments ``[starts[i], ends[i]]``."""
    if hi <= lo or starts.size == 0:
        return 0.0
    i0 = int(np.searchsorted(ends, lo, side="right"))
    i1 = int(np.searchsorted(starts, hi, side="left"))
    if i1 <= i0:
        return 0.0
    s = np.maximum(starts[i0:i1], lo)
    e = np.minimum(ends[i0:i1], hi)
    return float(np.sum(np.clip(e - s, 0.0, None)))


def merge_segments(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals ``[starts[i], ends[i]]`` as sorted, disjoint segments.

    Touching intervals (one ends where the next starts) are merged. O(n log n).
    """
    if starts.size == 0:
        return starts.astype(float), ends.astype(float)
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    e = ends[order]
    run_max = np.maximum.accumulate(e)
    # a new segment begins where the start lies beyond every end seen so far
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_max[:-1]
    idx = np.flatnonzero(new)
    seg_starts = s[idx]
    # the end of segment k is the running max just before segment k+1 begins
    last = np.append(idx[1:] - 1, s.size - 1)
    seg_ends = run_max[last]
    return seg_starts, seg_ends


def rel_path(path: str | os.PathLike, root: Path) -> str:
    """``path`` relative to ``root`` in POSIX form (as given when it is not below ``root``)."""
    try:
        return Path(path).relative_to(root).as_posix()
    except ValueError:
        return Path(path).as_posix()


def walk_files(root: Path) -> Iterable[Path]:
    """Files below ``root`` in sorted order, not descending into ``*_ascend_pt`` folders."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.endswith("_ascend_pt"))
        for name in sorted(filenames):
            yield Path(dirpath) / name


def read_csv_rows(path: Path, required: tuple[str, ...], what: str) -> tuple[list[str], list[list[str]]]:
    """``(header, rows)`` of a profiler CSV (``utf-8-sig``; header cells stripped; empty rows dropped), ``what``
    naming the format in errors. Raises :class:`MeasureError` when the file cannot be read, is not CSV text or
    lacks one of the ``required`` columns."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            header = [h.strip() for h in next(reader, [])]
            missing = [c for c in required if c not in header]
            if missing:
                raise MeasureError(f"{path}: not a {what}: missing column(s) {missing}; header is {header[:12]}")
            return header, [r for r in reader if r]
    except (UnicodeDecodeError, csv.Error) as exc:
        raise MeasureError(f"{path}: not a {what}: {exc}") from exc
    except OSError as exc:
        raise MeasureError(f"{path}: cannot read: {exc.strerror or exc}") from exc
