"""The small base every subcommand of ``run_bench.py`` derives from (as asv's ``Command``): a subclass in a
module of :mod:`bench.commands` is a subcommand; :func:`bench.commands.commands` finds it, no list to edit."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import ClassVar


class Command:
    """One subcommand.

    Class attributes, given as class keywords (``class Gate(Command, name="gate", help="...", order=20)``):
    ``name`` (the word on the command line), ``help`` (one line for ``--help``), ``order`` (position in the
    help's list; ``run``, the default subcommand, first).

    Subclasses implement :meth:`setup_arguments` and :meth:`run`; the shared options (``--results``,
    ``--tracking-uri``) and the error boundary are :mod:`bench.cli`'s.
    """

    name: ClassVar[str] = ""
    help: ClassVar[str] = ""
    order: ClassVar[int] = 100

    def __init_subclass__(cls, name: str = "", help: str = "", order: int = 100, **kw) -> None:
        super().__init_subclass__(**kw)
        cls.name, cls.help, cls.order = name or cls.name, help or cls.help, order

    @staticmethod
    def setup_arguments(parser: argparse.ArgumentParser) -> None:
        """Add this subcommand's arguments to ``parser``."""
        raise NotImplementedError

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        """Do the subcommand with the parsed ``args``; returns the exit code (see :mod:`bench.cli`).

        Raises:
            bench.core.errors.BenchError: bad input (printed as one line by :func:`bench.cli.main`).
        """
        raise NotImplementedError


def add_execution_arguments(parser: argparse.ArgumentParser, unit: str) -> None:
    """``--spawn`` and ``--ray-address``: how the runs of a command that runs a matrix (``run``, ``tune``) are
    started; ``unit``: what one Ray job runs (``cell``, ``trial``)."""
    parser.add_argument("--spawn", action="store_true",
                        help="start every run in a fresh interpreter (default on CPU for the embedded engine: fork "
                             "each run from a warm server that has imported torch/transformers/verl once)")
    parser.add_argument("--ray-address", default=None, metavar="ADDR",
                        help=f"run each {unit} as a job on this existing Ray cluster (e.g. http://127.0.0.1:8265)")


def given(text: str) -> str:
    """The argparse type of a value the user names (a sweep, a baseline, a matrix): given but empty (``report ''``,
    ``sync ''``) is refused by the argument's name, never read as the current folder or as "not given".

    Raises:
        argparse.ArgumentTypeError: an empty or blank value (argparse names the argument; exit 2, one line).
    """
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is empty (give a value, or leave the argument out where it is "
                                         "optional)")
    return text


def given_path(text: str) -> Path:
    """:func:`given` as a path (``--out ''`` was ``Path('')``, the current folder, and the report was written there).

    Raises:
        argparse.ArgumentTypeError: an empty or blank value.
    """
    return Path(given(text))
