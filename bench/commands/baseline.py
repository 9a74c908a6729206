"""``run_bench.py baseline save|list|show|delete``: the arguments and the action are
:func:`bench.gate.baseline.add_arguments` and :func:`bench.gate.baseline.main` (with the baseline files they manage)."""

from __future__ import annotations

from bench.commands.base import Command
from bench.gate.baseline import add_arguments, main


class Baseline(Command, name="baseline", order=50,
               help="store a sweep as a named baseline for the gate"):
    """``baseline``: :func:`bench.gate.baseline.add_arguments`, :func:`bench.gate.baseline.main`."""

    setup_arguments, run = staticmethod(add_arguments), staticmethod(main)
