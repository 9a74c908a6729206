"""The subcommands of ``run_bench.py``: one module per subcommand, named after it, each with one
:class:`~bench.commands.base.Command` subclass (argument parsing and printing; the work they start lives in the
modules they call).

:data:`COMMANDS` lists them with their one-line help, so that building the command line (and ``--help``)
imports no command module: :func:`command_class` imports one when it is set up or run. Adding a subcommand is
adding its module here and one line to :data:`COMMANDS`; :func:`commands` refuses a ``Command`` subclass of
this package that the table lacks.
"""

from __future__ import annotations

import importlib
import pkgutil

from bench.commands.base import Command

#: every subcommand in help order (``run``, the default, first): ``{name: one line for --help}``; its
#: ``Command`` subclass lives in the module ``bench.commands.<name>``
COMMANDS: dict[str, str] = {
    "run": "run the sweep of a matrix file (default subcommand)",
    "tune": "Optuna search of the dynamic-bsz token limits (matrix 'tune' block)",
    "gate": "compare a sweep against a baseline; exit 1 on a real slowdown",
    "report": "effects, interactions, confidence intervals and plots of a sweep",
    "compare": "compare two sweeps directly (no saved baseline): gate's verdicts and exit codes",
    "baseline": "store a sweep as a named baseline for the gate",
    "bisect": "find the first commit of good..bad that made a matrix slower (interleaved probes, resumable)",
    "history": "change points of a stored baseline's history (per cell, machine and stack), with plots",
    "sync": "upload to MLflow what an outage of the tracking server left queued (idempotent)",
}


def command_class(name: str) -> type[Command]:
    """The ``Command`` subclass of the subcommand ``name`` (its module ``bench.commands.<name>`` imported now).

    Raises:
        KeyError: ``name`` is not in :data:`COMMANDS`.
        LookupError: its module defines no ``Command`` subclass of that name.
    """
    if name not in COMMANDS:
        raise KeyError(f"unknown subcommand {name!r} (allowed: {', '.join(COMMANDS)})")
    module = importlib.import_module(f"{__name__}.{name}")
    found = [cls for cls in vars(module).values()
             if isinstance(cls, type) and issubclass(cls, Command) and cls.name == name]
    if len(found) != 1:
        raise LookupError(f"{module.__name__}: {len(found)} Command subclasses named {name!r} (expected one)")
    return found[0]


def commands() -> dict[str, type[Command]]:
    """``{name: Command subclass}`` of every subcommand, in help order; imports every module of this package.

    Raises:
        ValueError: two subcommands with one name, or a ``Command`` subclass whose name :data:`COMMANDS` lacks
            (it would never be on the command line).
    """
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    found: dict[str, type[Command]] = {}
    todo = list(Command.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if not cls.name:
            continue
        if cls.name in found and found[cls.name] is not cls:
            raise ValueError(f"two subcommands named {cls.name!r}: {found[cls.name].__module__}, {cls.__module__}")
        if cls.name not in COMMANDS:
            raise ValueError(f"{cls.__module__}: subcommand {cls.name!r} is not listed in bench.commands.COMMANDS "
                             "(add its line: name and one-line help)")
        found[cls.name] = cls
    return {name: command_class(name) for name in COMMANDS}
