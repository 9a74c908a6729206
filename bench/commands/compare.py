"""``run_bench.py compare SWEEP_A SWEEP_B``: compare two sweeps directly, no saved baseline needed.

The same comparison, verdicts, outputs and exit codes as ``gate --baseline SWEEP_A --candidate SWEEP_B``
(:func:`bench.gate.stored.run_gate`; ``asv compare A B``): A is the reference, B is judged against it, cells are
matched by factor levels. A is read like ``baseline save`` reads a sweep (failed, unfinished or sample-less
cells are refused) but nothing is stored under ``baselines/``. The matrix ``expect`` block is not checked
(that is ``gate``'s job). Either side may also be a saved baseline's name or file; a name that is both a
matrix and a baseline is read as the matrix's latest sweep.

Outputs ``gate.md`` and ``gate.json`` in ``--out`` (default ``<sweep B>/compare/``) and an MLflow gate run.
Exit codes: 0 pass, 1 regression, 2 bad input, 3 cannot judge (:data:`bench.gate.verdicts.EXIT_CODES`).
"""

from __future__ import annotations

import argparse

from bench.commands.base import Command, given, given_path
from bench.commands.gate import GATE_FILES, add_comparison_arguments, metric_list, print_result
from bench.gate.stored import run_gate
from bench.gate.verdicts import EXIT_CODES
from bench.records.results import check_baseline_slot, check_output_folder, find_sweep


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``compare``; the exit codes are the help's epilog."""
    p.epilog = EXIT_CODES
    p.add_argument("sweep_a", type=given, metavar="SWEEP_A",
                   help="the reference: a sweep folder, a matrix name (its latest sweep), <matrix>/<sweep id>, "
                        "or a saved baseline")
    p.add_argument("sweep_b", type=given, metavar="SWEEP_B", help="the sweep judged against SWEEP_A (same forms)")
    add_comparison_arguments(p)
    p.add_argument("--out", type=given_path, default=None, metavar="DIR",
                   help="folder for gate.md and gate.json (default: <SWEEP_B>/compare/)")


def main(args: argparse.Namespace) -> int:
    """Compare SWEEP_B against SWEEP_A; prints the table and ``compare: <verdict> (exit N)``.

    Returns 0 pass, 1 regression, 3 cannot judge.

    Raises:
        BenchError: bad input (unknown sweep, another engine or platform, no matching cells, bad flags): exit 2.
    """
    for ref in (args.sweep_a, args.sweep_b):
        check_baseline_slot(ref, args.results)
    out = args.out if args.out is not None else find_sweep(args.sweep_b, args.results) / "compare"
    check_output_folder(out, GATE_FILES, given=args.out is not None)
    result = run_gate(baseline_ref=args.sweep_a, candidate_ref=args.sweep_b, results=args.results,
                      tracking_uri=args.tracking_uri, metrics=metric_list(args), threshold=args.threshold,
                      alpha=args.alpha, out=out, n_boot=args.bootstrap, seed=args.seed, check_expect=False,
                      pairing=args.pairing == "auto", max_mde=args.max_mde, normalize=args.normalize == "auto",
                      prefer="sweep", test=getattr(args, "test", None))
    return print_result(result, "compare")


__all__ = ["add_arguments", "main"]


class Compare(Command, name="compare"):
    """``compare``: :func:`add_arguments`, :func:`main`."""

    setup_arguments, run = staticmethod(add_arguments), staticmethod(main)
