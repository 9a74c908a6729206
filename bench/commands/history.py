"""``run_bench.py history NAME``: the change points of a stored baseline's history (:mod:`bench.gate.history`).

Prints, per series (one metric of one cell on one machine and stack, over the baseline's saved sweeps), its change
points with the shift, its interval and the save (commit, date, sweep) where the new level starts. ``--out DIR``
writes a PNG per series and ``history.json``; with a tracking store given (``--tracking-uri`` or
``$MLFLOW_TRACKING_URI``) the series are logged to MLflow too. ``--fail-on-new N`` exits 1 when a change point lies
in the last N saves of a series (a nightly job). Exit codes: 0 done, 1 a new change point (with ``--fail-on-new``),
2 bad input (unknown baseline, too few saves, one series asked for over several machines or stacks).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.commands.base import Command, cli_message, given, given_path
from bench.core.errors import BenchError, InputError
from bench.core.files import atomic_write_json
from bench.gate.baseline import load_baseline
from bench.gate.history import METRICS, analyse, describe_point, display_values, log_mlflow
from bench.records.results import check_baseline_slot, check_output_folder
from bench.stats.estimators import DEFAULT_ALPHA

#: the file ``--out`` gets besides the PNGs
HISTORY_FILE = "history.json"


@dataclass(frozen=True)
class HistoryOptions:
    """The typed options of ``history``: the baseline ``name`` (or file), ``metrics``, ``alpha`` (over all the
    series of the call), ``cell``/``machine``/``stack`` filters, ``fail_on_new`` (``None``: off), ``out`` (``None``:
    no files), ``results`` and the MLflow ``tracking_uri`` (``None``: not logged)."""

    name: str
    metrics: tuple[str, ...]
    alpha: float
    cell: str | None
    machine: str | None
    stack: str | None
    fail_on_new: int | None
    out: Path | None
    results: Path
    tracking_uri: str | None


def options(args: argparse.Namespace) -> HistoryOptions:
    """The parsed arguments as :class:`HistoryOptions` (``--metric all`` = every metric; MLflow only when a store was
    given).

    Raises:
        BenchError: ``--fail-on-new`` below 1, an empty filter.
    """
    if args.fail_on_new is not None and args.fail_on_new < 1:
        raise BenchError(f"--fail-on-new {args.fail_on_new}: allowed 1 or more (the number of last saves to check)")
    for flag in ("cell", "machine", "stack"):
        v = getattr(args, flag)
        if v is not None and not v.strip():
            raise BenchError(f"--{flag} {v!r}: empty (leave the option out for all)")
    metrics = tuple(dict.fromkeys(m for x in args.metric or ["step_time"] for m in (METRICS if x == "all" else [x])))
    given = bool(getattr(args, "tracking_uri_given", False) or os.environ.get("MLFLOW_TRACKING_URI"))
    return HistoryOptions(name=args.name, metrics=metrics, alpha=args.alpha, cell=args.cell, machine=args.machine,
                          stack=args.stack, fail_on_new=args.fail_on_new, out=args.out, results=args.results,
                          tracking_uri=args.tracking_uri if given and args.tracking_uri else None)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``history``."""
    p.add_argument("name", metavar="NAME", type=given,
                   help="the baseline: a name under <results>/baselines/ or its file")
    p.add_argument("--metric", action="append", choices=[*METRICS, "all"], default=None,
                   help="the metric of the series (repeatable; default step_time; all = every one)")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                   help=f"the chance of any false change point over all the series of this call (default "
                        f"{DEFAULT_ALPHA}; each series is tested at alpha / number of series)")
    p.add_argument("--cell", default=None, help="only this cell (its label or key)")
    p.add_argument("--machine", default=None, help="only the saves of this machine (as printed, or its hostname)")
    p.add_argument("--stack", default=None, help="only the saves of this stack (as printed; 'unknown' for none)")
    p.add_argument("--fail-on-new", type=int, default=None, metavar="N",
                   help="exit 1 when a change point lies in the last N saves of a series (for a nightly job)")
    p.add_argument("--out", type=given_path, default=None, metavar="DIR",
                   help="write a PNG per series and history.json here")


def _slug(text: str) -> str:
    """A file name from a series name."""
    return re.sub(r"[^A-Za-z0-9_.=+-]+", "_", text).strip("_")[:120] or "series"


def main(args: argparse.Namespace) -> int:
    """Analyse and print; write ``--out`` and log to MLflow only after every check passed. Returns 0, or 1 with
    ``--fail-on-new`` and a new change point.

    Raises:
        BenchError: bad input (exit 2; nothing written).
    """
    o = options(args)
    check_baseline_slot(o.name, o.results)
    try:
        base = load_baseline(o.name, o.results)
    except BenchError as exc:  # the name is this command's NAME, not the gate's --baseline
        text = str(exc)
        named = isinstance(exc, InputError) and exc.what == "baseline"
        raise BenchError(f"history {text[len(exc.what) + 1:]}" if named else cli_message(exc)) from None
    if o.out is not None:
        check_output_folder(o.out, (HISTORY_FILE,), given=True)
    res = analyse(base, list(o.metrics), o.alpha, cell=o.cell, machine=o.machine, stack=o.stack,
                  fail_on_new=o.fail_on_new)
    if res["note"]:
        print(res["note"])
    print(f"history {res['name']}: {len(res['series'])} series judged, alpha {res['alpha']:g} over {res['family']} "
          f"series ({res['alpha_series']:.3g} each, {res['permutations']} permutations per test; a series needs "
          f"{res['min_saves']} saves)")
    if res["group"]:
        g = res["group"]
        print(f"  matrix {g['matrix'] or 'unknown'}, machine {g['machine'] or 'unknown'}, "
              f"stack {g['stack'] or 'unknown'}")
    for s in res["short"]:
        print(f"  {s['series']}: {s['saves']} saves, too few to judge (needs {res['min_saves']})")
    files: dict[str, Path] = {}
    for row in res["series"]:
        print(f"{row['name']}: {len(row['values'])} saves, "
              f"{len(row['points']) or 'no'} change point{'s' if len(row['points']) != 1 else ''}")
        for p in row["points"]:
            print(f"  {describe_point(row, p)}")
    if o.out is not None:
        from bench.report.plots import plot_history  # deferred: matplotlib only when plots are asked for

        o.out.mkdir(parents=True, exist_ok=True)
        for i, row in enumerate(res["series"]):
            path = o.out / f"{i:02d}-{_slug(row['name'])}.png"
            unit = {"step_time": "step time (s)", "step_time_normalized": "step time / speed probe",
                    "throughput": "throughput (tokens/s)"}.get(row["metric"], f"{row['metric']} (%)")
            plot_history(display_values(row), [s["position"] for s in row["saves"]], row["points"], path,
                         title=row["name"], ylabel=unit,
                         labels=[(s.get("git_commit") or "?")[:7] for s in row["saves"]])
            files[row["name"]] = path
        atomic_write_json(o.out / HISTORY_FILE, res)
        print(f"wrote {len(files)} plot(s) and {HISTORY_FILE} to {o.out}")
    if o.tracking_uri:
        warn = log_mlflow(res, o.tracking_uri, files)
        print(f"warning: {warn}" if warn else f"MLflow: {len(res['series'])} series logged to {o.tracking_uri}",
              file=sys.stderr if warn else sys.stdout)
    if res["new"]:
        print(f"history {res['name']}: {len(res['new'])} change point(s) in the last {o.fail_on_new} saves: "
              + "; ".join(f"{n['series']} at save {n['position']} ({n['change']:+.1f})" for n in res["new"]))
        return 1
    return 0


class History(Command, name="history"):
    """``history``: :func:`add_arguments`, :func:`main`."""

    setup_arguments, run = staticmethod(add_arguments), staticmethod(main)
