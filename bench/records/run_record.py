"""The run record (``record.json``): its typed, versioned model and the single loader every reader goes through.

:class:`RunRecord` (pydantic) is what :mod:`bench.records.record` writes (validated before it is written) and what
:func:`read_record` reads back (bounded: :func:`bench.core.inputs.read_bytes`; validated on load). A file that is not
JSON, truncated, of the wrong types, with a non-finite or negative time, of an unknown ``schema_version``, or
that contradicts its folder raises :class:`RecordError` naming the file and what is wrong, on one line.
``report``, ``gate``, ``compare`` and ``baseline save`` stop on it (exit 2); ``sync`` uploads the rest, then
names it (exit 2, the queue kept); a resumed sweep names it and runs that repeat again.

Versions (:data:`SCHEMA_VERSION`; docs/results.md): every version this project has written is loaded,
converted to the current one by :data:`MIGRATIONS`:

* 1 (and a record without ``schema_version``, as tests write them): the hand-built dict of the first
  harness. Its step-time figures are over the timed steps, but its other time figures (rollout share,
  throughput, phases, response lengths) were over every measured step, the profiled ones included; the
  loader recomputes the summary from the record's own per-step metrics (:func:`bench.measure.summarize`),
  so a v1 run shows the same figures as a v2 run.
* 2: the typed record; every time figure over the timed steps (:mod:`bench.measure.run_summary`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Callable

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

from bench.core.errors import BenchError
from bench.core.inputs import read_bytes
from bench.measure.run_summary import summarize
from bench.spec.loading import format_validation_error

RECORD = "record.json"
#: the version :mod:`bench.records.record` writes
SCHEMA_VERSION = 2
#: largest record file read (a record holds per-step metrics and a log tail)
MAX_RECORD_BYTES = 64 << 20
#: statuses a record may have
STATUSES = ("ok", "failed")
#: per-step metric prefixes whose numbers must be finite and not negative (times, sizes, throughput)
_TIMED_PREFIXES = ("timing_s/", "perf/", "response_length/", "prompt_length/")


class RecordError(BenchError):
    """A ``record.json`` that exists but cannot be used: the message names the file and what is wrong."""


def _finite(v: float) -> float:
    if not math.isfinite(v):
        raise ValueError(f"{v} is not a finite number")
    return v


def _not_negative(v: float) -> float:
    if v < 0:
        raise ValueError(f"{v} is negative")
    return v


def _fraction(v: float) -> float:
    if not 0 <= v <= 1 + 1e-6:  # a share of one step (rounding of the parts may reach 1 + a few ulp)
        raise ValueError(f"{v} is not a fraction in [0, 1]")
    return v


#: a finite number (any sign); a finite number >= 0 (seconds, GiB, tokens/s)
Finite = Annotated[float, AfterValidator(_finite)]
Seconds = Annotated[float, AfterValidator(_finite), AfterValidator(_not_negative)]
#: a share of a step (the Free ratio, the rollout share): finite, in [0, 1]
Fraction = Annotated[float, AfterValidator(_finite), AfterValidator(_fraction)]
#: a count or index read back (a step, a level, a repeat): an integer >= 0, never a boolean
Count = Annotated[StrictInt, Field(ge=0)]
Steps = list[Count]


class RunSummary(BaseModel):
    """A run's statistics (:func:`bench.measure.summarize`): seconds, GiB and tokens/s as verl logs them; time
    figures over ``timed_steps``, the Free ratio over ``profiled_measured_steps``; ``None`` = not measured.
    Further keys (an engine's own) are kept; their numbers must be finite (``*_s`` keys not negative)."""

    model_config = ConfigDict(extra="allow", strict=True)
    n_steps: Count | None = None
    warmup_steps: Count | None = None
    measured_steps: Steps = Field(default_factory=list)
    profiled_steps: Steps = Field(default_factory=list)
    profiled_measured_steps: Steps | None = None
    timed_steps: Steps = Field(default_factory=list)
    step_time_samples_s: list[Seconds] = Field(default_factory=list)
    step_time_median_s: Seconds | None = None
    step_time_iqr_s: Seconds | None = None
    step_time_mean_s: Seconds | None = None
    #: process CPU seconds per timed step (``timing_s/step_cpu``; engines that log it) and their median
    cpu_time_samples_s: list[Seconds] = Field(default_factory=list)
    cpu_time_median_s: Seconds | None = None
    rollout_share_median: Fraction | None = None
    throughput_median: Seconds | None = None
    phase_median_s: dict[str, Finite | None] = Field(default_factory=dict)  # ``other`` (step less parts) may be < 0
    peak_memory_gb: Seconds | None = None
    peak_memory_source: str | None = None
    free_ratio_median: Fraction | None = None
    long_tail_waste_median: Fraction | None = None

    @model_validator(mode="after")
    def _extras_finite(self) -> RunSummary:
        for key, value in (self.model_extra or {}).items():
            values = value.items() if isinstance(value, dict) else [("", value)]
            for sub, v in values:
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    where = f"{key}.{sub}" if sub else key
                    if not math.isfinite(v):
                        raise ValueError(f"{where}: {v} is not a finite number")
                    if v < 0:  # every figure a run summary holds is a time, a size, a count or a share
                        raise ValueError(f"{where}: {v} is negative")
        return self


def _step_keys(steps: dict[str, Any]) -> dict[str, Any]:
    for step in steps:
        if not (step.isdigit() and step.isascii() and int(step) <= 10_000_000):  # verl logs validation at step 0
            raise ValueError(f"step {step[:20]!r}: not a step number (0, 1, 2, ...)")
    return steps


def _check_steps(steps: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    _step_keys(steps)
    for step, metrics in steps.items():
        for key, value in metrics.items():
            if key.startswith(_TIMED_PREFIXES) and value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"{step}.{key}: expected a number, got {type(value).__name__}")
                if not math.isfinite(value) or value < 0:
                    raise ValueError(f"{step}.{key}: {value} is not a finite number >= 0")
    return steps


class RunRecord(BaseModel):
    """One run of one cell (``<sweep>/<cell id>/r<repeat>/record.json``), schema :data:`SCHEMA_VERSION`.

    ``status`` ``ok``/``failed`` (then ``failure_kind`` and a one-line ``reason``, ``log_tail``); ``steps``:
    per step (key: the step number as text) the verl metrics it logged; ``free_ratio``: per profiled step;
    ``summary``: :class:`RunSummary`; ``wall_s``, ``started_at``/``finished_at`` (epoch seconds); ``node``: the
    Ray node (``None`` locally); ``evidence``: per factor, whether it took effect. Further keys an engine or
    the harness adds (``timing``, ``host_load``, ``code_version``...) are kept as they are.
    """

    model_config = ConfigDict(extra="allow", strict=True)
    schema_version: StrictInt = SCHEMA_VERSION
    cell_id: str
    repeat: Annotated[StrictInt, Field(ge=0)]
    status: str
    levels: dict[str, Count | None] = Field(default_factory=dict)
    engine: str | None = None
    platform: str | None = None
    started_at: Seconds | None = None
    finished_at: Seconds | None = None
    wall_s: Seconds | None = None
    returncode: int | None = None
    failure_kind: str | None = None
    reason: str = ""
    log_tail: str = ""
    steps: Annotated[dict[str, dict[str, Any]], AfterValidator(_check_steps)] = Field(default_factory=dict)
    free_ratio: Annotated[dict[str, Fraction | None], AfterValidator(_step_keys)] = Field(default_factory=dict)
    summary: RunSummary = Field(default_factory=RunSummary)
    warnings: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _status(self) -> RunRecord:
        if not self.cell_id:
            raise ValueError("cell_id: empty (the cell's id expected)")
        if self.status not in STATUSES:
            raise ValueError(f"status: {self.status!r} (allowed: {', '.join(STATUSES)})")
        median = self.summary.step_time_median_s
        if self.status == "ok" and median is not None and median <= 0:
            raise ValueError(f"status ok but summary.step_time_median_s is {median!r} (a positive number of seconds "
                             "expected)")
        return self


def _migrate_v1(rec: dict[str, Any]) -> dict[str, Any]:
    """Version 1 -> 2: the summary recomputed over the timed steps from the record's per-step metrics."""
    old = rec.get("summary")
    steps = rec.get("steps")
    if isinstance(old, dict) and old and isinstance(steps, dict) and steps and \
            all(isinstance(v, dict) for v in steps.values()) and isinstance(old.get("warmup_steps"), int):
        try:
            new = summarize({int(k): v for k, v in steps.items()}, old["warmup_steps"],
                            {int(k): v for k, v in (rec.get("free_ratio") or {}).items()},
                            old.get("profiled_steps"))
        except (TypeError, ValueError):
            new = None  # not convertible: validated as it is (and named if wrong)
        if new is not None:
            rec["summary"] = {**old, **new}
    rec["schema_version"] = 2
    return rec


#: schema version -> conversion to the next version
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _migrate_v1}


def _one_line(exc: ValidationError) -> str:
    """``key: what is wrong`` of the first error, in the harness's words
    (:func:`bench.spec.loading.format_validation_error`)."""
    return format_validation_error(RECORD, exc, model=RunRecord).removeprefix(f"{RECORD}: ")


def parse_record(rec: Any, folder: Path | None = None) -> RunRecord:
    """The typed record of a parsed ``record.json`` of any known version (converted to :data:`SCHEMA_VERSION`).

    Raises:
        ValueError: one line naming the key and what is wrong (an unknown version included); ``folder``
            given, also when ``cell_id``/``repeat`` do not match the ``<cell id>/r<k>`` folder.
    """
    if not isinstance(rec, dict):
        raise ValueError(f"expected a JSON object, got {type(rec).__name__}")
    version = rec.get("schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or not (1 <= version <= SCHEMA_VERSION):
        known = ", ".join(str(v) for v in range(1, SCHEMA_VERSION + 1))
        raise ValueError(f"schema_version {version!r} is not one this harness knows ({known}); written by a newer "
                         "version of the harness?")
    try:
        model = RunRecord.model_validate(rec)  # every version so far has this shape: what it holds is checked
        while version < SCHEMA_VERSION:
            rec = MIGRATIONS[version](dict(rec))
            version = rec["schema_version"]
            model = RunRecord.model_validate(rec)
    except ValidationError as exc:
        raise ValueError(_one_line(exc)) from None
    if folder is not None:
        code = model.model_extra.get("code_version") if model.model_extra else None
        suffix = f"-{code}" if isinstance(code, str) and code and code != "candidate" else ""  # r<k>-baseline
        if folder.name != f"r{model.repeat}{suffix}" or folder.parent.name != model.cell_id:
            raise ValueError(f"cell_id {model.cell_id!r} repeat {model.repeat} does not match its folder "
                             f"{folder.parent.name}/{folder.name}")
    return model


def record_problem(rec: Any, folder: Path | None = None) -> str | None:
    """What is wrong with a parsed record (:func:`parse_record`), or ``None`` when every reader can use it."""
    try:
        parse_record(rec, folder)
    except ValueError as exc:
        return str(exc)
    return None


def load_run_record(path: str | Path) -> RunRecord | None:
    """The typed record at ``path`` (a ``record.json``), or ``None`` when there is none.

    Raises:
        RecordError: the file exists but is unreadable, not JSON (e.g. truncated), of an unknown version or
            not valid (message: ``<path>: not a usable run record: <what>``).
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return None
    try:
        data = read_bytes(path, MAX_RECORD_BYTES, "run record")
    except BenchError as exc:
        raise RecordError(str(exc)) from None
    try:
        rec = json.loads(data)
    except (ValueError, RecursionError) as exc:
        what = "empty file" if not data.strip() else f"not JSON ({getattr(exc, 'msg', 'nested too deeply')}" + \
            (f" at line {exc.lineno}, truncated?)" if getattr(exc, "lineno", None) else ")")
        raise RecordError(f"{path}: not a usable run record: {what}") from None
    try:
        return parse_record(rec, path.parent)
    except ValueError as exc:
        raise RecordError(f"{path}: not a usable run record: {exc}") from None


def read_record(path: str | Path) -> dict[str, Any] | None:
    """The record at ``path`` as a dict (:func:`load_run_record`, dumped: the current version's keys, the
    file's extra keys kept), or ``None`` when there is none.

    Raises:
        RecordError: as :func:`load_run_record`.
    """
    model = load_run_record(path)
    return None if model is None else model.model_dump(exclude_unset=True) | {"schema_version": SCHEMA_VERSION}


def load_records(sweep: str | Path, cache: dict[Path, Any] | None = None) -> list[dict[str, Any]]:
    """Every run record of a sweep (``<cell id>/r<k>/record.json``), ordered by cell id then repeat, each with
    ``_dir`` (its run folder).

    ``cache``: a dict kept by the caller across calls on the same sweep (a sequential sweep looks after every
    block): a record whose file is unchanged since it was read (same inode, size and ``st_mtime_ns``; records are
    written whole by ``os.replace``) is taken from it, as a fresh dict, instead of being read and validated again.

    Raises:
        RecordError: the first record that cannot be used (naming it and what is wrong).
    """
    out = []
    for path in sorted(Path(sweep).glob(f"*/r*/{RECORD}")):
        if cache is None:
            rec = read_record(path)
        else:
            try:
                st = path.stat()
                key: tuple | None = (st.st_ino, st.st_size, st.st_mtime_ns)
            except OSError:
                key = None  # read_record says what is wrong
            hit = cache.get(path)
            if key is not None and hit is not None and hit[0] == key:
                rec = None if hit[1] is None else dict(hit[1])
            else:
                rec = read_record(path)
                if key is not None:
                    cache[path] = (key, dict(rec) if rec is not None else None)
        if rec is not None:
            rec["_dir"] = str(path.parent)
            out.append(rec)
    return out


def corrupt_records(sweep: str | Path) -> list[str]:
    """One line per unusable record of a sweep (empty when every record can be used)."""
    out = []
    for path in sorted(Path(sweep).glob(f"*/r*/{RECORD}")):
        try:
            read_record(path)
        except RecordError as exc:
            out.append(str(exc))
    return out
