"""Rows of the Ascend profiler's step trace: ``step_trace_time.csv`` and the ``StepTraceTime`` table of
``analysis.db`` (:func:`read_step_trace_csv`, :func:`read_step_trace_db`), and the rank of a profile
folder (:func:`rank_of`). The Free ratio built on them is :mod:`bench.measure.ascend`.

``step_trace_time.csv`` (torch_npu ``TraceStepTimeParser``; ``csv.writer``, values in us): header
``Device_id,Step,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,Bubble,
Communication(Not Overlapped and Exclude Receive),Preparing``; releases before mid-2025 lack the
leading ``Device_id``. ``Step`` is empty when the profiler had no ``schedule`` (one row per device).
The Db variant has the same values (us) in table ``StepTraceTime`` with columns ``deviceId, step,
computing, communication_not_overlapped, overlapped, communication, free, stage, bubble,
communication_not_overlapped_and_exclude_receive, preparing``.

Rank: from the file name ``profiler_info_<rank>.json`` (torch_npu writes it from ``$RANK`` or
``torch.distributed.get_rank()``), else the ``rank_id`` field inside it, else unknown (single card:
``profiler_info.json``).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from bench.measure._common import MeasureError, to_float

OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
STEP_TRACE_CSV = "step_trace_time.csv"
ANALYSIS_DB = "analysis.db"
STEP_TRACE_TABLE = "StepTraceTime"

#: CSV column -> field of :class:`StepTraceRow`
CSV_COLUMNS = {
    "Computing": "computing_us",
    "Communication(Not Overlapped)": "communication_not_overlapped_us",
    "Overlapped": "overlapped_us",
    "Communication": "communication_us",
    "Free": "free_us",
    "Stage": "stage_us",
    "Bubble": "bubble_us",
    "Communication(Not Overlapped and Exclude Receive)": "communication_not_overlapped_exclude_receive_us",
    "Preparing": "preparing_us",
}
#: analysis.db StepTraceTime column -> field of :class:`StepTraceRow`
DB_COLUMNS = {
    "computing": "computing_us",
    "communication_not_overlapped": "communication_not_overlapped_us",
    "overlapped": "overlapped_us",
    "communication": "communication_us",
    "free": "free_us",
    "stage": "stage_us",
    "bubble": "bubble_us",
    "communication_not_overlapped_and_exclude_receive": "communication_not_overlapped_exclude_receive_us",
    "preparing": "preparing_us",
}
_REQUIRED = ("Step", "Computing", "Communication(Not Overlapped)", "Free")
_INFO_RE = re.compile(r"^profiler_info_(\d+)\.json$")


@dataclass(frozen=True)
class StepTraceRow:
    """One row of ``step_trace_time.csv`` (or of the ``StepTraceTime`` table). Times in us.

    ``step`` is the integer step (``None`` when the Step cell is empty or not an integer; the raw
    text is kept in ``step_label``). ``device_id`` is ``None`` for the old header without it.
    """

    source: str
    rank: int | None
    device_id: int | None
    step: int | None
    step_label: str
    computing_us: float
    communication_not_overlapped_us: float
    overlapped_us: float
    communication_us: float
    free_us: float
    stage_us: float
    bubble_us: float
    communication_not_overlapped_exclude_receive_us: float
    preparing_us: float

    @property
    def step_time_us(self) -> float:
        """``Computing + Communication(Not Overlapped) + Free`` (msprof-analyze's step time)."""
        return self.computing_us + self.communication_not_overlapped_us + self.free_us

    @property
    def free_ratio(self) -> float:
        """``Free / step_time_us`` (NaN when the step time is 0)."""
        total = self.step_time_us
        return self.free_us / total if total > 0 else math.nan


def int_or_none(text: object) -> int | None:
    """An integer-valued cell (``"3"``, ``"3.0"``, ``3``) as ``int``; ``None`` when empty, not a number, not
    finite or not whole (a step label, a device or rank id)."""
    if text is None:
        return None
    s = str(text).strip()
    if not s:
        return None
    try:
        f = float(s)
    except ValueError:
        return None
    return int(f) if math.isfinite(f) and f == int(f) else None


def _num(value: object) -> float:
    f = to_float(value)
    return 0.0 if f is None or math.isnan(f) else f


def read_step_trace_csv(path: str | os.PathLike, rank: int | None = None) -> list[StepTraceRow]:
    """Rows of one ``step_trace_time.csv`` (either header variant).

    Raises :class:`~bench.measure._common.MeasureError` if the file cannot be read or lacks one of
    the columns ``Step, Computing, Communication(Not Overlapped), Free``. Missing optional columns
    read as 0; an unparsable number reads as 0 (msprof-analyze's ``StepTraceTimeBean`` does the same).
    """
    p = Path(path)
    try:
        with open(p, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            header = [h.strip() for h in (reader.fieldnames or [])]
            missing = [c for c in _REQUIRED if c not in header]
            if missing:
                raise MeasureError(f"{p}: not a step_trace_time.csv: missing column(s) {missing}; header is {header}")
            reader.fieldnames = header
            rows = []
            for rec in reader:
                if not any((v or "").strip() for v in rec.values() if isinstance(v, str)):
                    continue
                values = {fld: _num(rec.get(col)) for col, fld in CSV_COLUMNS.items()}
                label = (rec.get("Step") or "").strip()
                rows.append(
                    StepTraceRow(
                        source=str(p),
                        rank=rank,
                        device_id=int_or_none(rec.get("Device_id")),
                        step=int_or_none(label),
                        step_label=label,
                        **values,
                    )
                )
            return rows
    except OSError as exc:
        raise MeasureError(f"{p}: cannot read: {exc.strerror or exc}") from exc


def read_step_trace_db(path: str | os.PathLike, rank: int | None = None) -> list[StepTraceRow]:
    """Rows of table ``StepTraceTime`` in ``ASCEND_PROFILER_OUTPUT/analysis.db`` (export_type Db).

    Returns ``[]`` when the database has no such table (single-card runs without communication may
    not write it). Raises :class:`~bench.measure._common.MeasureError` if it is not a database.
    """
    p = Path(path)
    try:
        con = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise MeasureError(f"{p}: cannot open database: {exc}") from exc
    try:
        try:
            cur = con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name=?", (STEP_TRACE_TABLE,))
        except sqlite3.DatabaseError as exc:
            raise MeasureError(f"{p}: not an SQLite database: {exc}") from exc
        if cur.fetchone() is None:
            return []
        cur = con.execute(f"SELECT * FROM {STEP_TRACE_TABLE}")
        names = [d[0] for d in cur.description]
        rows = []
        for tup in cur.fetchall():
            rec = dict(zip(names, tup))
            raw_step = rec.get("step")
            label = "" if raw_step is None else str(raw_step).strip()
            rows.append(
                StepTraceRow(
                    source=str(p),
                    rank=rank,
                    device_id=int_or_none(rec.get("deviceId")),
                    step=int_or_none(label),
                    step_label=label,
                    **{fld: _num(rec.get(col)) for col, fld in DB_COLUMNS.items()},
                )
            )
        return rows
    finally:
        con.close()


def rank_of(ascend_pt_dir: str | os.PathLike) -> int | None:
    """Rank of one ``*_ascend_pt`` folder from ``profiler_info_<rank>.json`` (name, else ``rank_id``).

    ``None`` when there is only ``profiler_info.json`` without a ``rank_id`` (single card) or no
    info file at all (collection did not finish).
    """
    d = Path(ascend_pt_dir)
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return None
    for name in names:
        m = _INFO_RE.match(name)
        if m:
            return int(m.group(1))
    for name in names:
        if name == "profiler_info.json" or name.startswith("profiler_info"):
            try:
                info = json.loads((d / name).read_text(encoding="utf-8") or "{}")
            except (OSError, ValueError):
                continue
            if isinstance(info, dict):
                r = int_or_none(info.get("rank_id"))
                if r is not None and r >= 0:
                    return r
    return None
