"""``run_bench.py bisect --good REV --bad REV --matrix M``: argument parsing and printing; the bisection is
:func:`bench.gate.bisect.run_bisect` (its module text: the probes, the error control, the resume).

Prints each probe as it starts and ends (commit, verdict, change with its interval, blocks, wall seconds), then
every probe again and the outcome: the first slower commit with its change against its parent and the interval,
or "no commit in this range is slower" with the interval of bad against good, or "cannot judge" with the range
still holding the first slower commit. Exit codes: 0 found or none, 2 bad input (nothing written), 3 cannot
judge, 130/143 interrupted (rerun the same command to resume).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bench.commands.base import Command, given
from bench.commands.run_planning import parse_duration
from bench.core.errors import BenchError, say
from bench.gate.bisect import run_bisect
from bench.stats.estimators import DEFAULT_THRESHOLD

#: the whole bisection's default error level (each probe gets alpha / k)
DEFAULT_BISECT_ALPHA = 0.05
#: the exit codes, in --help
EXIT_TEXT = ("exit codes: 0 the first slower commit found, or no commit in the range is slower; 2 bad input (nothing "
             "written); 3 cannot judge (a probe undecided within its budget: the remaining range is named); 130/143 "
             "interrupted (rerun the same command to resume)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``bisect``."""
    p.epilog = EXIT_TEXT
    p.add_argument("--good", required=True, type=given, metavar="REV", help="a revision known not to be slower")
    p.add_argument("--bad", required=True, type=given, metavar="REV",
                   help="a later revision (good must be an ancestor on its first-parent line)")
    p.add_argument("--matrix", required=True, type=Path, metavar="MATRIX.yaml",
                   help="the matrix each probe runs (e.g. matrix/gate.yaml)")
    p.add_argument("--repo", type=given, default=None, metavar="PATH",
                   help="the git repository holding the harness's commits (default: this checkout's)")
    p.add_argument("--stack", type=given, default=None, metavar="NAME",
                   help="bisect the commits of a source tree of this stack of --matrix (its stacks: key; e.g. your "
                        "verl fork) instead of the harness's; --repo then picks the tree when it has several")
    p.add_argument("--set", action="append", default=[], metavar="base.KEY=VALUE", dest="overrides",
                   help="override a base setting of --matrix (repeatable)")
    p.add_argument("--blocks", type=int, default=None, metavar="N",
                   help="blocks each probe plans at most (default: the matrix's repeats, at least 8)")
    p.add_argument("--budget", default=None, metavar="DURATION",
                   help="wall time each probe may take (e.g. 7m); a probe undecided then stops the bisection")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help="smallest relative slowdown that counts (default 0.05 = 5 %%)")
    p.add_argument("--alpha", type=float, default=DEFAULT_BISECT_ALPHA,
                   help="probability that the whole bisection names a wrong commit, at most (default 0.05); each of "
                        "its at most ceil(log2 n)+2 probes is judged at alpha/k")
    p.add_argument("--max-mde", type=float, default=None, metavar="FRACTION",
                   help="a probe says 'not slower' only when it could see a slowdown of this size (default: twice "
                        "the threshold)")
    p.add_argument("--normalize", choices=("auto", "off"), default="auto",
                   help="auto (default): the machine-speed probe as a covariate (as gate --interleave); off: raw")
    p.add_argument("--spawn", action="store_true", help="a fresh process per run (no fork servers)")
    p.add_argument("--order-seed", type=int, default=None, metavar="N", help="shuffle seed of each probe's blocks")


def pct(x: float | None) -> str:
    """``+12.3 %`` (``n/a`` for ``None``)."""
    return "n/a" if x is None else f"{x:+.1%}".replace("%", " %")


def interval(p: dict[str, Any]) -> str:
    """``+10.2 % [+6.0 %, +14.6 %]`` of a probe or result."""
    return f"{pct(p.get('change'))} [{pct(p.get('ci_low'))}, {pct(p.get('ci_high'))}]"


def probe_line(p: dict[str, Any]) -> str:
    """One line of a finished probe: index, role, commit against base, verdict, change, blocks, wall time."""
    return (f"probe {p['index']} ({p['role']}): {p['commit'][:12]} vs {p['base'][:12]}: {p['verdict']}, "
            f"{interval(p)}, {p.get('blocks')} blocks, {p['wall_s']:.0f} s"
            + (" (finished earlier)" if p.get("resumed") else "")
            + (f"; {p['reason']}" if p.get("reason") and p["verdict"] == "cannot judge" else ""))


def main(args: argparse.Namespace) -> int:
    """Run the bisection and print it; returns its exit code (0 found or none, 3 cannot judge).

    Raises:
        BenchError: bad input (exit 2 through :func:`bench.cli.main`), before anything is written.
    """
    budget_s = parse_duration(args.budget) if args.budget is not None else None
    if args.blocks is not None and not 2 <= args.blocks <= 1000:
        raise BenchError(f"--blocks {args.blocks}: allowed 2..1000 (a paired comparison needs 2 or more blocks)")

    def on_probe(stage: str, p: dict[str, Any]) -> None:
        if stage == "start":
            print(f"probe {p['index']} ({p['role']}): {p['commit'][:12]} {p['subject'][:60]!r} against "
                  f"{p['base'][:12]} ...", flush=True)
        else:
            print(probe_line(p), flush=True)

    def on_event(kind: str, data: dict[str, Any]) -> None:
        if kind == "warn":
            say(f"warning: {data.get('message')}")
        elif kind == "look":
            print(f"  {data.get('line')}", flush=True)

    res = run_bisect(matrix_path=args.matrix, good=args.good, bad=args.bad, results=args.results,
                     tracking_uri=args.tracking_uri, repo=args.repo, overrides=args.overrides, blocks=args.blocks,
                     threshold=args.threshold, alpha=args.alpha, max_mde=args.max_mde,
                     normalize=args.normalize == "auto", budget_s=budget_s, spawn=args.spawn,
                     order_seed=args.order_seed, stack=args.stack, on_probe=on_probe, on_event=on_event)
    s = res["settings"]
    tree = f" of stack {res['stack']}'s tree {res['repo']}" if res.get("stack") else ""
    print(f"\nbisect {res['good'][:12]}..{res['bad'][:12]} ({res['commits']} commits{tree}, matrix {s['matrix']}): "
          f"{len(res['probes'])} probes of at most {s['probes_max']}, each at alpha {s['alpha_per_probe']:.4f}; "
          f"P(wrong commit named) <= {s['alpha']}")
    for p in res["probes"]:
        print("  " + probe_line(p))
    wall = f"wall {res['wall_s_total']:.0f} s in all ({res['wall_s']:.0f} s this time); state: {res['state']}"
    if res["outcome"] == "found":
        print(f"bisect: first slower commit {res['first_bad']} {res['subject']!r}: {interval(res)} against its "
              f"parent {res['parent'][:12]}; {wall}")
    elif res["outcome"] == "none":
        print(f"bisect: no commit in this range is slower: bad against good {interval(res)}; {wall}")
    else:
        lo, hi = res["remaining"]
        print(f"bisect: cannot judge: the first slower commit lies in {lo[:12]}..{hi[:12]} (after the first, at or "
              f"before the second); {wall}")
        print(f"bisect: cannot judge: {res.get('reason') or 'undecided'}", file=sys.stderr)
    return int(res["exit_code"])


class Bisect(Command, name="bisect"):
    """``bisect``: :func:`add_arguments`, :func:`main`."""

    setup_arguments, run = staticmethod(add_arguments), staticmethod(main)
