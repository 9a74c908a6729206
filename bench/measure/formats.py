"""The profiler and metrics formats a run folder may hold, behind one small interface.

Each format is a :class:`Reader` in its own module (:mod:`bench.measure.jsonl` for verl's file-logger
JSONL, :mod:`bench.measure.torch_reader` for torch chrome traces, :mod:`bench.measure.ascend` for the
Ascend profiler's ``step_trace_time.csv`` / ``analysis.db`` / ``kernel_details``); :func:`bench.measure.collect`
asks every reader of :func:`readers` in order whether it finds its files (``detect``) and merges what
it reads (``read``). Readers are found by lookup: the entry points of the group ``grpo_bench.readers``
(:mod:`bench.core.plugins`; the built-ins in ``pyproject.toml``, in the order of their warnings), loaded on the
first lookup. Adding a format: one module with a ``Reader`` subclass and one entry point line (see
``CONTRIBUTING.md``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bench.core.plugins import Registry
from bench.measure._common import MeasureError
from bench.measure.op_categories import CATEGORIES, categorize

GROUP = "grpo_bench.readers"


@dataclass
class ReadOptions:
    """What :func:`bench.measure.collect` passes to every reader.

    Attributes:
        expected_ranks: world size for missing-rank checks (``None``: ranks 0..max seen).
        analyse: readers may prepare raw data in place first (Ascend's offline ``analyse``).
    """

    expected_ranks: int | None = None
    analyse: bool = False


class MetricsIssues(BaseModel):
    """What reading verl's metrics JSONL ran into (:meth:`bench.measure.jsonl.MetricsLog.issues`)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    truncated_last_line: bool
    bad_lines: list[list[Any]]
    skipped_values: list[list[Any]]


class ReaderFields(BaseModel):
    """The keys of :func:`bench.measure.collect`'s result a reader may set (:attr:`Measurements.fields`), typed:
    what a reader returns is checked against this model before it is merged (strict types, no other key).

    Attributes:
        metrics_file: the metrics file, relative to the run folder.
        metrics: ``{step: {metric: value}}``.
        metrics_issues: problems met reading the metrics file.
        traces: per trace file, its Free-ratio details (:meth:`bench.measure.torch_trace.TraceFree.to_dict`).
        ascend: the Ascend profiler's details (:meth:`bench.measure.ascend.AscendFree.to_dict`).
    """

    model_config = ConfigDict(extra="forbid", strict=True)
    metrics_file: str | None = None
    metrics: dict[int, dict[str, float]] = Field(default_factory=dict)
    metrics_issues: MetricsIssues | None = None
    traces: list[dict[str, Any]] = Field(default_factory=list)
    ascend: dict[str, Any] | None = None


def checked_fields(reader: str, fields: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``fields`` of the reader called ``reader`` without the keys :class:`ReaderFields` refuses, and one warning
    per refused key (``reader X: field K: <why>; left out``): a reader's mistake is shown, never merged."""
    try:
        ReaderFields.model_validate(fields)
        return dict(fields), []
    except ValidationError as exc:
        why: dict[str, str] = {}
        for err in exc.errors():
            loc = [str(p) for p in err["loc"]]
            why.setdefault(loc[0] if loc else "(fields)", f"{'.'.join(loc) or '(fields)'}: {err['msg']}")
        warnings = [f"reader {reader}: field {msg}; left out" for msg in why.values()]
        return {k: v for k, v in fields.items() if k not in why}, warnings


@dataclass
class Measurements:
    """What one reader found in a run folder.

    Attributes:
        fields: keys of :func:`bench.measure.collect`'s result this reader sets, typed by :class:`ReaderFields`
            (``metrics``, ``metrics_file``, ``metrics_issues``, ``traces``, ``ascend``), paths relative to the
            run folder; a key that does not fit is left out with a warning (:func:`checked_fields`).
        free: Free-ratio sources: ``(step or None, {"kind", "source", "free_ratio", "basis"})``; one entry
            per source and step (``None``: the window has no step).
        missing_ranks: per step, the ranks without profiler output.
        warnings: one line each, in the order found.
    """

    fields: dict[str, Any] = field(default_factory=dict)
    free: list[tuple[int | None, dict[str, Any]]] = field(default_factory=list)
    missing_ranks: dict[int, list[int]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass
class StepOps:
    """The operators of one profiled step in one source of a format (what "where it acts" and the top operators
    read).

    Attributes:
        source: the file the rows come from, relative to the run folder (its path names the phase:
            :func:`bench.measure.op_categories.phase_of`; none: the whole step).
        basis: ``"device"`` (kernel durations) or ``"cpu"`` (operator self times).
        ops: ``(name, calls, self time in microseconds)`` per operator.
        window_ms: the step's window (ms; ``None``: unknown), the denominator of a top operator's ``share``.
        cpu: the CPU operators as :attr:`ops` when the source has both (``None``: :attr:`ops` is all it has).
    """

    source: str
    basis: str
    ops: list[tuple[str, int, float]]
    window_ms: float | None = None
    cpu: list[tuple[str, int, float]] | None = None


@dataclass
class CategorySource:
    """One file's time per operator category and step (:func:`bench.measure.run_categories.run_categories`).

    Attributes:
        path: the file, relative to the run folder.
        kind: what the file is (``trace``, ``kernel_details``, ``op_statistic``, a format's own name).
        rank: the rank it belongs to (``None``: unknown).
        role: the label its phase is read from (a verl role folder, the trace's path).
        steps: ``[{"step": int | None, "category_us": {category: us}}]``.
    """

    path: str
    kind: str
    rank: int | None
    role: str
    steps: list[dict[str, Any]]


@dataclass
class RankTimes:
    """Per step and rank, a format's time breakdown for :func:`bench.measure.run_categories.run_rank_breakdown`.

    Attributes:
        source: what it was read from (``ascend_step_trace``, ``cluster_step_trace``, ``torch_trace``, ...).
        steps: ``{step: {rank: {"computing_us", "communication_not_overlapped_us", ...}}}`` (the keys of
            :func:`bench.measure.rank_overlap.run_ranks`).
    """

    source: str
    steps: dict[Any, dict[Any, dict[str, float | None]]]


def _op_dicts(rows: list[tuple[str, int, float]], window_ms: float | None, n: int) -> list[dict[str, Any]]:
    """The top ``n`` of ``rows`` by self time as ``{"name", "calls", "self_ms", "share"}`` (``share``: of the
    window, ``None`` when unknown)."""
    top = sorted(rows, key=lambda r: (-r[2], r[0]))[:n]
    return [{"name": name, "calls": int(calls), "self_ms": round(us / 1e3, 3),
             "share": round(us / 1e3 / window_ms, 4) if window_ms else None} for name, calls, us in top]


class Reader:
    """One format, whole: its Free ratio and steps (:meth:`read`), operator rows per step (:meth:`step_ops`,
    :meth:`top_ops`), operator categories (:meth:`categories`) and ranks (:meth:`ranks`). Subclasses set
    ``name`` and implement :meth:`detect` and :meth:`read`; :meth:`step_ops` makes the format's operators part of
    the report's "where it acts", the top operators and the categories (their defaults derive from it);
    :meth:`ranks` gives the slow-rank breakdown.

    The steps of a format are those of :attr:`Measurements.free`; the sources of a step are the ``source`` of
    its entries there (``kind`` = :attr:`name`), which the run record keeps and the other methods take.

    Attributes:
        name: short name of the format (``jsonl``, ``torch``, ``ascend``).
        when_absent: a warning :func:`bench.measure.collect` adds when :meth:`detect` finds nothing
            (``None``: the format is optional).
    """

    name: str = ""
    when_absent: str | None = None

    def prepare(self, run_dir: Path, options: ReadOptions) -> None:
        """Work on the folder before detection (default: nothing; Ascend runs ``analyse`` when asked).

        Raises:
            MeasureError: raw data that cannot be prepared.
        """

    def detect(self, run_dir: Path) -> bool:
        """Whether the run folder holds files of this format."""
        raise NotImplementedError

    def read(self, run_dir: Path, options: ReadOptions) -> Measurements:
        """What the files of this format say (unreadable files become warnings, never exceptions)."""
        raise NotImplementedError

    def step_ops(self, run_dir: Path, step: int, source: str, memo: dict) -> StepOps | None:
        """The operators of ``step`` in ``source`` (a Free-ratio source this reader named), or ``None`` (default:
        the format has no operator rows, or the source lacks the step).

        ``memo``: a dict kept across the steps and sources of one run (files already read; key it by your name).

        Raises:
            MeasureError: the file cannot be read (the caller turns it into a warning).
        """
        return None

    def top_ops(self, run_dir: Path, step: int, source: str, memo: dict, n: int) -> dict[str, Any] | None:
        """The top ``n`` operators of ``step`` in ``source``: ``{"source", "window_ms", "cpu": [...], "device":
        [...]}``, each operator ``{"name", "calls", "self_ms", "share"}`` (``share``: self time / window).
        Default: :meth:`step_ops`, its rows under their basis."""
        got = self.step_ops(run_dir, step, source, memo)
        if got is None:
            return None
        cpu = got.cpu if got.cpu is not None else (got.ops if got.basis == "cpu" else [])
        device = got.ops if got.basis == "device" else []
        return {"source": got.source, "window_ms": got.window_ms, "cpu": _op_dicts(cpu, got.window_ms, n),
                "device": _op_dicts(device, got.window_ms, n)}

    def categories(self, run_dir: Path) -> tuple[list[CategorySource], list[str]]:
        """Every file of this format in ``run_dir`` with its time per category and step, and warnings. Default:
        the operators of each Free-ratio step (:meth:`read`, :meth:`step_ops`) by
        :func:`bench.measure.op_categories.categorize` of their names.
        """
        m = self.read(run_dir, ReadOptions())
        memo: dict = {}
        per_source: dict[str, CategorySource] = {}
        warnings = list(m.warnings)
        for step, entry in m.free:
            if step is None:
                continue
            try:
                got = self.step_ops(run_dir, step, str(entry.get("source", "")), memo)
            except (MeasureError, OSError, ValueError) as exc:  # an unreadable file is a warning, never an error
                warnings.append(f"{entry.get('source')}: {exc}")
                continue
            if got is None:
                continue
            cats = dict.fromkeys(CATEGORIES, 0.0)
            for name, _calls, us in got.ops:
                cats[categorize(name)] += us
            src = per_source.setdefault(got.source, CategorySource(got.source, self.name, None, got.source, []))
            src.steps.append({"step": step, "category_us": cats})
        return list(per_source.values()), warnings

    def ranks(self, run_dir: Path, expected_ranks: int | None = None) -> tuple[RankTimes | None, list[str]]:
        """Per step and rank, the time breakdown of this format, and warnings (default: ``None``, no ranks)."""
        return None, []


#: the readers by name, on :class:`bench.core.plugins.Registry` (entry-point classes are instantiated)
REGISTRY: Registry[Reader] = Registry(GROUP, "reader", lambda r: r.name)


def readers() -> list[Reader]:
    """The readers, in the order :func:`bench.measure.collect` asks them (their warnings appear in this
    order): entry points first (built-ins, then plugins), then :func:`register_reader` calls."""
    return list(REGISTRY.items().values())


def reader_named(name: str) -> Reader | None:
    """The reader called ``name`` (a Free-ratio source's ``kind``), or ``None``."""
    return REGISTRY.items().get(name)


def register_reader(reader: Reader) -> Reader:
    """Add ``reader`` after the others (a reader of the same class replaces its namesake in place); returns it.

    Raises:
        ValueError: the reader has no name, or another reader holds the name.
    """
    return REGISTRY.register(reader)


def unregister_reader(name: str) -> None:
    """Remove the reader called ``name`` (tests that register a toy format undo it with this)."""
    REGISTRY.unregister(name)


class _ReadersView(Sequence[Reader]):
    """:data:`READERS`: a live read-only sequence over :func:`readers`."""

    def __getitem__(self, i):  # type: ignore[override]
        return readers()[i]

    def __len__(self) -> int:
        return len(readers())

    def __iter__(self) -> Iterator[Reader]:
        return iter(readers())


#: the readers, live (kept for ``from bench.measure import READERS``; :func:`readers` is the lookup)
READERS: Sequence[Reader] = _ReadersView()
