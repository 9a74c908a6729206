"""``run_bench.py baseline save|list|show|delete``: the arguments and the action are
:func:`bench.baseline.add_arguments` and :func:`bench.baseline.main` (with the baseline files they manage)."""

from __future__ import annotations

from bench.baseline import add_arguments, main
from bench.commands.base import Command


class Baseline(Command):
    """``baseline``: :func:`bench.baseline.add_arguments`, :func:`bench.baseline.main`."""

    name = "baseline"
    help = "store a sweep as a named baseline for the gate"
    order = 50
    setup_arguments = staticmethod(add_arguments)
    run = staticmethod(main)
