"""``run_bench.py baseline save|list|show|delete``: the arguments and the action are
:func:`bench.baseline.add_arguments` and :func:`bench.baseline.main` (with the baseline files they manage)."""

from __future__ import annotations

from bench.baseline import add_arguments, main
from bench.commands.base import Command


class Baseline(Command, name="baseline", order=50,
               help="store a sweep as a named baseline for the gate"):
    """``baseline``: :func:`bench.baseline.add_arguments`, :func:`bench.baseline.main`."""

    setup_arguments, run = staticmethod(add_arguments), staticmethod(main)
