"""``run_bench.py baseline save|list|show``: the arguments and the action are
:func:`bench.gate.baseline.add_arguments` and :func:`bench.gate.baseline.main` (with the baseline files they manage);
:func:`main` first refuses the options an action would ignore and a baseline file that is not a file."""

from __future__ import annotations

import argparse

from bench.commands.base import Command
from bench.core.errors import BenchError
from bench.gate.baseline import add_arguments
from bench.gate.baseline import main as baseline_main
from bench.records.results import check_baseline_slot

#: options only ``baseline save`` reads (argparse dest -> (option, value when not given))
SAVE_ONLY = {"name": ("--name", None), "note": ("--note", ""), "force": ("--force", False), "alpha": ("--alpha", None)}


def main(args: argparse.Namespace) -> int:
    """``baseline ACTION``: refuse an option of ``save`` given to ``list`` or ``show`` (alone it would be ignored)
    and a ``baselines/<name>.json`` that is a folder, then :func:`bench.gate.baseline.main`.

    Raises:
        BenchError: naming the option or the file (exit 2).
    """
    if args.action != "save":
        for dest, (opt, unset) in SAVE_ONLY.items():
            if getattr(args, dest, unset) != unset:
                raise BenchError(f"baseline {args.action}: {opt} is an option of `baseline save` only "
                                 "(here it would be ignored)")
    check_baseline_slot(args.name if args.action == "save" else args.target, args.results)
    return baseline_main(args)


class Baseline(Command, name="baseline", order=50,
               help="store a sweep as a named baseline for the gate"):
    """``baseline``: :func:`bench.gate.baseline.add_arguments`, :func:`main`."""

    setup_arguments, run = staticmethod(add_arguments), staticmethod(main)
