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


class Reader:
    """One format. Subclasses set ``name`` and implement :meth:`detect` and :meth:`read`.

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


#: the readers by name, on :class:`bench.core.plugins.Registry` (entry-point classes are instantiated)
REGISTRY: Registry[Reader] = Registry(GROUP, "reader", lambda r: r.name)


def readers() -> list[Reader]:
    """The readers, in the order :func:`bench.measure.collect` asks them (their warnings appear in this
    order): entry points first (built-ins, then plugins), then :func:`register_reader` calls."""
    return list(REGISTRY.items().values())


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
