"""The profiler and metrics formats a run folder may hold, behind one small interface.

Each format is a :class:`Reader` in its own module (:mod:`bench.measure.jsonl` for verl's file-logger
JSONL, :mod:`bench.measure.torch_reader` for torch chrome traces, :mod:`bench.measure.ascend` for the
Ascend profiler's ``step_trace_time.csv`` / ``analysis.db`` / ``kernel_details``); :func:`bench.measure.collect`
asks every reader of :data:`READERS` in order whether it finds its files (``detect``) and merges what
it reads (``read``). Adding a format: one module with a ``Reader`` subclass and one ``register_reader``
line (see ``CONTRIBUTING.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ReadOptions:
    """What :func:`bench.measure.collect` passes to every reader.

    Attributes:
        expected_ranks: world size for missing-rank checks (``None``: ranks 0..max seen).
        analyse: readers may prepare raw data in place first (Ascend's offline ``analyse``).
    """

    expected_ranks: int | None = None
    analyse: bool = False


@dataclass
class Measurements:
    """What one reader found in a run folder.

    Attributes:
        fields: keys of :func:`bench.measure.collect`'s result this reader sets (``metrics``,
            ``metrics_file``, ``metrics_issues``, ``traces``, ``ascend`` ...), paths relative to the run folder.
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


#: the readers, in the order collect() asks them (their warnings appear in this order)
READERS: list[Reader] = []


def register_reader(reader: Reader) -> Reader:
    """Append ``reader`` to :data:`READERS` (replacing one of the same name in place); returns it.

    Raises:
        ValueError: the reader has no name.
    """
    if not reader.name:
        raise ValueError(f"{type(reader).__name__} has no name")
    for i, held in enumerate(READERS):
        if held.name == reader.name:
            READERS[i] = reader
            return reader
    READERS.append(reader)
    return reader


def unregister_reader(name: str) -> None:
    """Remove the reader called ``name`` (tests that register a toy format undo it with this)."""
    READERS[:] = [r for r in READERS if r.name != name]
