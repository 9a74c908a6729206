"""The small base every subcommand of ``run_bench.py`` derives from (as asv's ``Command``): a subclass in the
module ``bench.commands.<name>``, listed with its one-line help in :data:`bench.commands.COMMANDS`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import ClassVar

from bench.core.errors import InputError
from bench.records.results import RESULTS_FOLDER
from bench.spec.plan import RUN_ORDER
from bench.tracking.store import TRACKING_URI

#: the library's names of inputs (an :class:`~bench.core.errors.InputError`'s ``what``) -> the flag the commands
#: take for each: the one place where a library's words become command-line flags
FLAGS = {TRACKING_URI: "--tracking-uri", RESULTS_FOLDER: "--results", RUN_ORDER: "--order",
         # bisect's inputs (bench.gate.bisect)
         "good revision": "--good", "bad revision": "--bad", "repository": "--repo", "threshold": "--threshold",
         "alpha": "--alpha", "budget": "--budget", "blocks": "--blocks", "stack": "--stack",
         # gate (bench.gate: stacks, interleaved, stored, side_by_side, versions), history, baseline
         "stacks": "--stacks", "metric": "--metric", "test": "--test", "cell": "--cell",
         "saves to check": "--fail-on-new", "baseline": "--baseline", "baseline name": "--name",
         "baseline revision": "--interleave", "side by side": "--side-by-side"}


def cli_message(exc: BaseException) -> str:
    """``exc``'s message as a command prints it: an :class:`~bench.core.errors.InputError` whose input has a flag
    (:data:`FLAGS`) starts with that flag instead of the library's name for it; any other message is unchanged."""
    text = str(exc)
    if isinstance(exc, InputError) and exc.what in FLAGS:
        return FLAGS[exc.what] + text[len(exc.what):]
    return text


class Command:
    """One subcommand.

    Class attribute, given as a class keyword (``class Gate(Command, name="gate")``): ``name``, the word on the
    command line. Its one-line help and its place in ``--help`` are its line in :data:`bench.commands.COMMANDS`
    (read without importing any command module).

    Subclasses implement :meth:`setup_arguments` and :meth:`run`; the shared options (``--results``,
    ``--tracking-uri``) and the error boundary are :mod:`bench.cli`'s.
    """

    name: ClassVar[str] = ""

    def __init_subclass__(cls, name: str = "", **kw) -> None:
        if "help" in kw or "order" in kw:
            raise TypeError(f"{cls.__module__}.{cls.__qualname__}: a subcommand's help and order are its line in "
                            "bench.commands.COMMANDS, not class keywords")
        super().__init_subclass__(**kw)
        cls.name = name or cls.name

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
