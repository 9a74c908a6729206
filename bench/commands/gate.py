"""``run_bench.py gate``: argument parsing and printing (:func:`main`); what the gate does is
:func:`bench.gate.stored.run_gate`, its comparison :mod:`bench.gate.verdicts`. ``compare`` shares the comparison's
options (:func:`add_comparison_arguments`) and the printing (:func:`print_result`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bench.commands.base import Command, given, given_path
from bench.commands.run_planning import parse_duration
from bench.core.errors import BenchError, say
from bench.gate.interleaved import run_interleaved_gate
from bench.gate.markdown import append_step_summary, render_interleaved, render_markdown
from bench.gate.stored import run_gate
from bench.gate.verdicts import CANNOT_JUDGE, EXIT_CANNOT_JUDGE, EXIT_CODES
from bench.records.results import check_baseline_slot, check_output_folder, find_sweep
from bench.spec.metrics import METRICS
from bench.stats.estimators import DEFAULT_ALPHA, DEFAULT_THRESHOLD, N_BOOT

#: the files a gate writes into its output folder (``gate``, ``compare``)
GATE_FILES = ("gate.md", "gate.json")
#: most blocks ``gate --interleave --blocks`` plans (each block runs every cell twice)
MAX_BLOCKS = 1000


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``gate``; the exit codes (:data:`EXIT_CODES`) are the help's epilog."""
    p.epilog = EXIT_CODES
    p.add_argument("--baseline", type=given, default=None, metavar="NAME_OR_FILE_OR_SWEEP",
                   help="baseline name (<results>/baselines/NAME.json), a baseline file, or a sweep to compare "
                        "with directly (a sweep folder, a matrix name = its latest sweep, or <matrix>/<sweep id>; "
                        "a name that is both is the baseline)")
    p.add_argument("--candidate", type=given, default=None, metavar="SWEEP",
                   help="the sweep to judge: a sweep folder, a matrix name (its latest sweep) or <matrix>/<sweep id>")
    p.add_argument("--interleave", default=None, metavar="REV_OR_DIR",
                   help="interleaved gate (recommended for CI): run MATRIX with the baseline's code (a git revision, "
                        "checked out into a temporary worktree, or a folder with another checkout) and this working "
                        "tree's code in one blocked sweep, both versions of every cell in every block, and compare "
                        "them paired by block, runs as the unit (needs --matrix)")
    p.add_argument("--stacks", nargs=2, default=None, metavar=("BASE", "CAND"),
                   help="interleaved gate between two stacks declared under the matrix's stacks: (docs/stacks.md): "
                        "this working tree's harness on both sides, each side's runs in its own stack (interpreter, "
                        "source trees, variables; one fork server per stack), judged as --interleave (needs --matrix; "
                        "for an A/A check declare one stack twice under two names)")
    p.add_argument("--matrix", type=Path, default=None, metavar="MATRIX.yaml",
                   help="the matrix of --interleave or --stacks")
    p.add_argument("--set", action="append", default=[], metavar="base.KEY=VALUE", dest="overrides",
                   help="override a base setting of --matrix (repeatable)")
    p.add_argument("--blocks", type=int, default=None, metavar="N",
                   help="--interleave: blocks to plan at most (default: the matrix's repeats, at least 8); the sweep "
                        "stops earlier once every cell is pass or regression")
    p.add_argument("--budget", default=None, metavar="DURATION",
                   help="--interleave: wall time the gate may take (e.g. 90s, 10m, 1h); it stops before a block that "
                        "would likely end past it and says 'cannot judge' with the blocks that would do")
    p.add_argument("--force", action="store_true", help="--interleave: start a new gate sweep instead of resuming")
    p.add_argument("--side-by-side", action="store_true",
                   help="--interleave: run the baseline's and the candidate's run of a cell at the same time, each "
                        "pinned to a CPU of its own (swapped between blocks), so machine drift hits both alike; "
                        "needs 2 CPUs (docs/gate.md)")
    p.add_argument("--spawn", action="store_true", help="--interleave: a fresh process per run (no fork servers)")
    p.add_argument("--order-seed", type=int, default=None, metavar="N", help="--interleave: shuffle seed of the blocks")
    p.add_argument("--no-expect", action="store_true", help="do not check the matrix `expect` block")
    add_comparison_arguments(p)
    p.add_argument("--out", type=given_path, default=None, metavar="DIR",
                   help="folder for gate.md and gate.json (default: <candidate sweep>/gate/)")


def add_comparison_arguments(p: argparse.ArgumentParser) -> None:
    """The options of the comparison itself, shared by ``gate`` and ``compare``."""
    p.add_argument(
        "--metric",
        action="append",
        default=None,
        metavar="NAME",
        help=f"metric(s) to compare, repeatable or comma-separated ({', '.join(METRICS)}; default step_time)",
    )
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help="smallest relative change that counts (default 0.05 = 5 %%)")
    p.add_argument(
        "--alpha",
        type=float,
        default=DEFAULT_ALPHA,
        help="family-wise significance level of the gate: each of its m rows (cells x metrics) and `expect` claims "
        "is tested at alpha/m (Bonferroni), its CI at 1-alpha/m (default 0.01)",
    )
    p.add_argument("--bootstrap", type=int, default=N_BOOT, metavar="N", help=f"bootstrap resamples (default {N_BOOT})")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--max-mde", type=float, default=None, metavar="FRACTION",
                   help="judge a cell only when its samples would reveal a change of this size with 80 %% power; "
                        "noisier comparisons are 'noisy' (cannot judge, exit 3). Default: twice the threshold")
    p.add_argument("--pairing", choices=("auto", "off"), default="off",
                   help="off (default): unpaired (Mann-Whitney U on the samples of all repeats); auto: compare step by "
                        "step when both sides ran the same steps on the same work (same seed; equal response/prompt "
                        "lengths per step; Wilcoxon signed-rank), which helps with 1-2 repeats")
    p.add_argument(
        "--test",
        default=None,
        metavar="NAME",
        help="the two-sample test by name (bench.stats.stat_tests.TESTS; a paired one only where the steps pair "
        "up). Default: Mann-Whitney U, or Wilcoxon signed-rank where --pairing auto pairs the steps",
    )
    p.add_argument("--normalize", choices=("auto", "off"), default="auto",
                   help="auto (default): divide step times (multiply throughput) by the machine-speed probe timed "
                        "around each step when both sides have the same probe (embedded engine on CPU); "
                        "off: compare raw samples")


def main(args: argparse.Namespace) -> int:
    """Run the gate; prints the markdown table and a summary line ``gate: <verdict> (exit N)``.

    Returns 0 pass, 1 regression, 3 cannot judge (the reasons on stderr, each in full).

    Raises:
        BenchError: bad input (exit 2 through the error boundary of :func:`bench.cli.main`).
    """
    metrics = metric_list(args)
    if getattr(args, "interleave", None) is not None or getattr(args, "stacks", None) is not None:
        return interleaved_main(args, metrics)
    if args.candidate is None:
        raise BenchError("gate: give --candidate SWEEP (against --baseline), or --interleave REV --matrix MATRIX.yaml")
    if args.matrix is not None:
        raise BenchError(f"--matrix {args.matrix}: only with --interleave (a gate of --candidate judges that sweep "
                         "with its own matrix; alone it would be ignored)")
    try:
        check_baseline_slot(args.baseline, args.results)
        out = args.out if args.out is not None else find_sweep(args.candidate, args.results) / "gate"
        check_output_folder(out, GATE_FILES, given=args.out is not None)  # before the comparison: nothing half-written
        result = run_gate(baseline_ref=args.baseline, candidate_ref=args.candidate, results=args.results,
                          tracking_uri=args.tracking_uri, metrics=metrics, threshold=args.threshold,
                          alpha=args.alpha, out=out, n_boot=args.bootstrap, seed=args.seed,
                          check_expect=not args.no_expect, pairing=args.pairing == "auto", max_mde=args.max_mde,
                          normalize=args.normalize == "auto", test=getattr(args, "test", None))
    except BenchError as exc:
        append_step_summary(f"## Gate ERROR\n\n{exc}\n\n")
        raise
    return print_result(result, "gate")


def metric_list(args: argparse.Namespace) -> list[str]:
    """The ``--metric`` values (repeatable, comma-separated; default ``step_time``)."""
    return [m.strip() for arg in (args.metric or ["step_time"]) for m in arg.split(",") if m.strip()]


def print_result(result: dict[str, Any], prog: str) -> int:
    """Print the markdown, warnings, the summary line ``PROG: <verdict> (exit N); files: ...`` and, for
    "cannot judge", every reason in full on stderr; returns the exit code."""
    print(render_markdown(result))
    for w in result.get("warnings", []):
        say(f"warning: {w}")
    print(f"{prog}: {result['verdict']} (exit {result['exit_code']}); files: {', '.join(result['files'])}")
    if result["exit_code"] == EXIT_CANNOT_JUDGE:
        reasons = [f"{r['cell']}/{r['metric']}: {r['reason']}" for r in result["rows"]
                   if r["verdict"] in (CANNOT_JUDGE, "noisy")]
        reasons += [
            f"{e['claim']}: {e['reason']}" for e in result.get("expectations", []) if e["result"] == CANNOT_JUDGE
        ]
        print(f"{prog}: cannot judge: " + " | ".join(reasons), file=sys.stderr)
    return int(result["exit_code"])


def interleaved_main(args: argparse.Namespace, metrics: list[str]) -> int:
    """``gate --interleave REV --matrix M`` (or ``gate --stacks BASE CAND --matrix M``, :mod:`bench.gate.stacks`): run
    and judge the interleaved gate sweep (:mod:`bench.gate.interleaved`); prints its markdown and
    ``gate: <verdict> (exit N)``; returns the exit code.

    Raises:
        BenchError: no --matrix, a metric other than step_time, a baseline/candidate given as well, both
            --interleave and --stacks, bad input.
    """
    stacks = getattr(args, "stacks", None)
    if stacks is not None and args.interleave is not None:
        raise BenchError(f"gate --interleave {args.interleave} --stacks {' '.join(stacks)}: give one of them (a "
                         "revision of the harness, or two stacks of the matrix)")
    if args.matrix is None:
        raise BenchError(f"gate {'--stacks' if stacks is not None else '--interleave'}: give --matrix MATRIX.yaml "
                         "(the matrix both sides run)")
    if args.baseline is not None or args.candidate is not None:
        raise BenchError("gate --interleave: runs its own sweep of both versions; drop --baseline/--candidate")
    if metrics != ["step_time"]:
        raise BenchError(f"gate --interleave: --metric {','.join(metrics)}: only step_time is compared")
    if args.blocks is not None and not 2 <= args.blocks <= MAX_BLOCKS:
        raise BenchError(f"--blocks {args.blocks}: allowed 2..{MAX_BLOCKS} (a paired comparison needs 2 or more "
                         "blocks; the gate stops early once every cell is judged)")
    budget_s = None
    if getattr(args, "budget", None) is not None:
        budget_s = parse_duration(args.budget)

    def on_event(kind: str, data: dict[str, Any]) -> None:
        if kind == "done":
            rec = data["record"]
            med = (rec.get("summary") or {}).get("step_time_median_s")
            print(f"  block {data['repeat']} {data['spec'].code_version:9s} {data['spec'].label}: {rec['status']}"
                  + (f", median step {med:.3f} s" if isinstance(med, (int, float)) else ""), flush=True)
        elif kind == "warn":
            say(f"warning: {data.get('message')}")
        elif kind == "look":
            print(f"  {data.get('line')}", flush=True)

    try:
        result = run_interleaved_gate(matrix_path=args.matrix, baseline_ref=args.interleave, results=args.results,
                                      tracking_uri=args.tracking_uri, overrides=args.overrides, blocks=args.blocks,
                                      threshold=args.threshold, alpha=args.alpha, max_mde=args.max_mde,
                                      normalize=args.normalize == "auto", force=args.force, spawn=args.spawn,
                                      order_seed=args.order_seed, out=args.out, on_event=on_event,
                                      budget_s=budget_s, side_by_side=getattr(args, "side_by_side", False),
                                      stacks=tuple(stacks) if stacks is not None else None)
    except BenchError as exc:
        append_step_summary(f"## Gate ERROR\n\n{exc}\n\n")
        raise
    print(render_interleaved(result))
    print(f"gate: {result['verdict']} (exit {result['exit_code']}); wall {result['wall_s']:.0f} s; "
          f"files: {', '.join(result['files'])}")
    if result["exit_code"] == EXIT_CANNOT_JUDGE:
        print("gate: cannot judge: " + " | ".join(f"{r['cell']}: {r['reason']}" for r in result["rows"]
                                                  if r["verdict"] in (CANNOT_JUDGE, "noisy")), file=sys.stderr)
    return int(result["exit_code"])


class Gate(Command, name="gate"):
    """``gate``: :func:`add_arguments`, :func:`main`."""

    setup_arguments, run = staticmethod(add_arguments), staticmethod(main)
