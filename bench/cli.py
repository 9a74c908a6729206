"""Command line: ``python run_bench.py [run] MATRIX.yaml`` and the ``tune``, ``gate``, ``report``,
``baseline`` subcommands.

Exit codes: 0 success; 1 a sweep with failed cells, or a gate regression; 2 bad input (one line on
stderr naming file, key and allowed values; nothing written); 130 interrupted.
Each subcommand other than ``run`` lives in its own module exposing ``add_arguments(parser)`` and
``main(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from bench.errors import BenchError

SUBCOMMANDS = {
    "run": ("bench.cli_run", "run the sweep of a matrix file (default subcommand)"),
    "tune": ("bench.tune", "Optuna search of the dynamic-bsz token limits (matrix 'tune' block)"),
    "gate": ("bench.gate", "compare a sweep against a baseline; exit 1 on a real slowdown"),
    "report": ("bench.report", "effects, interactions, confidence intervals and plots of a sweep"),
    "baseline": ("bench.baseline", "store a sweep as a named baseline for the gate"),
}


def default_results() -> Path:
    """``results/`` in the current folder."""
    return Path("results")


def default_tracking_uri(results: Path) -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<results>/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(results).as_posix()}/mlflow.db"


def add_common(p: argparse.ArgumentParser) -> None:
    """``--results`` and ``--tracking-uri``, shared by every subcommand."""
    p.add_argument("--results", type=Path, default=default_results(), metavar="DIR",
                   help="results folder (default: results/)")
    p.add_argument("--tracking-uri", default=None, metavar="URI",
                   help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///<results>/mlflow.db)")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per available subcommand."""
    parser = argparse.ArgumentParser(
        prog="run_bench.py",
        description="Ablation benchmark harness for GRPO post-training performance (verl; embedded engine "
        "on machines without an accelerator). `run_bench.py MATRIX.yaml` = `run_bench.py run MATRIX.yaml`.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, (module, help_text) in SUBCOMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_common(p)
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the subcommand; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in SUBCOMMANDS and not argv[0].startswith("-"):
        argv.insert(0, "run")
    parser = build_parser()
    if not argv:
        parser.print_help()
        return 2
    args = parser.parse_args(argv)
    if args.tracking_uri is None:
        args.tracking_uri = default_tracking_uri(args.results)
    try:
        return int(args._module.main(args) or 0)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted: finished runs are kept; rerun the same command to resume", file=sys.stderr)
        return 130
