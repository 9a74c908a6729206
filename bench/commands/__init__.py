"""The subcommands of ``run_bench.py``: one module per subcommand, each with one
:class:`~bench.commands.base.Command` subclass (argument parsing and printing; the work they start lives in the
modules they call). :func:`commands` finds them by scanning this package: adding a subcommand is adding a
module here."""

from __future__ import annotations

import importlib
import pkgutil

from bench.commands.base import Command


def commands() -> dict[str, type]:
    """``{name: Command subclass}`` of every module of this package, in help order (``order``, then name).

    Raises:
        ValueError: two subcommands with one name.
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
        found[cls.name] = cls
    return dict(sorted(found.items(), key=lambda kv: (kv[1].order, kv[0])))
