"""``run`` options for a sweep that plans its runs and stops when decided: ``--sequential``, ``--threshold``,
``--precision``, ``--budget`` (:func:`add_planning_arguments`, :func:`prepare`, :func:`print_planning`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from bench.core.errors import BenchError
from bench.core.files import read_json
from bench.execution.ray_parallel import cluster_nodes, parallel_slots, usable_nodes
from bench.planning.allocation import plan_lines
from bench.planning.apply import replan
from bench.records.results import SWEEP, load_records


def add_planning_arguments(p: argparse.ArgumentParser) -> None:
    """The planning and stopping arguments of ``run``."""
    p.add_argument("--sequential", action="store_true",
                   help="stop the sweep as soon as every main effect and step-time expect claim is decided (after "
                        "any complete block; "
                        "repeated confidence intervals with O'Brien-Fleming alpha spending over the planned "
                        "repeats as looks). Implied by --precision and --budget")
    p.add_argument("--threshold", type=float, default=0.05, metavar="FRACTION",
                   help="the relative change that matters (default 0.05 = 5 %%): an effect whose interval lies "
                        "inside +-threshold is decided 'no change'")
    p.add_argument("--alpha", type=float, default=0.05, metavar="A",
                   help="error rate of all decisions of a sequential sweep over all looks (default 0.05)")
    p.add_argument("--precision", type=float, default=None, metavar="P",
                   help="plan timed steps per run and repeats (= maximum blocks) so that the 95 %% interval of each "
                        "main effect has half-width P (fraction, e.g. 0.02) at the least expected wall time, from "
                        "the noise and cost model of earlier sweeps of this target")
    p.add_argument("--budget", default=None, metavar="DURATION",
                   help="plan timed steps per run and repeats for the best precision within DURATION of wall time "
                        "(e.g. 20m, 1h30m, 900s)")


def parse_duration(text: str) -> float:
    """Seconds of a duration like ``20m``, ``1h30m``, ``90s`` or ``600`` (seconds).

    Raises:
        BenchError: anything else (one line naming the allowed forms).
    """
    import re

    t = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        seconds = float(t)
    else:
        m = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", t)
        if not t or not m or not any(m.groups()):
            raise BenchError(f"--budget {text!r}: not a duration (allowed: e.g. 20m, 1h30m, 900s, 600)")
        h, mi, s = (float(g) if g else 0.0 for g in m.groups())
        seconds = h * 3600 + mi * 60 + s
    if not 0 < seconds <= 30 * 86400:  # the range of --timeout (bench.cli.FLAG_RANGES)
        raise BenchError(f"--budget {text!r}: allowed range (0 s, 30 days]")
    return seconds


def planned_slots(args: argparse.Namespace) -> int:
    """Runs of a block at once for the planner: 1 without ``--parallel``, its count, or for ``auto`` the usable
    alive nodes of the ``--ray-address`` cluster (:func:`bench.execution.ray_parallel.cluster_nodes`, counted now; the
    sweep counts them again when it starts).

    Raises:
        BenchError: ``--parallel`` without ``--ray-address``, a bad value, or a cluster that cannot be listed.
    """
    parallel = getattr(args, "parallel", None)
    if parallel is None:
        return 1
    address = getattr(args, "ray_address", None)
    if not address:
        raise BenchError(f"--parallel {parallel}: needs --ray-address (the Ray cluster whose nodes run the runs)")
    text = str(parallel).strip().lower()
    if text != "auto":
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            raise BenchError(f"--parallel {parallel}: allowed values: auto, or a number of runs at once >= 1")
        return n
    nodes, _ = usable_nodes(cluster_nodes(address))
    return parallel_slots("auto", nodes, address)


@dataclass
class Prepared:
    """What :func:`prepare` decided: the (possibly re-planned) matrix and plan, the stop rule (``None``: a
    fixed design) and the planning record for ``sweep.json``/MLflow (``None`` without --precision/--budget)."""

    matrix: Any
    plan: Any
    stop_rule: Any = None
    planning: dict[str, Any] | None = None


def check_planning_flags(args: argparse.Namespace) -> None:
    """The forms of ``--threshold``, ``--alpha``, ``--precision`` and ``--budget`` (and that at most one of the last
    two is given), checked before the matrix is read so that a bad flag is named before the matrix's own errors.

    Raises:
        BenchError: naming the flag, its value and what is allowed.
    """
    precision, budget = getattr(args, "precision", None), getattr(args, "budget", None)
    threshold, alpha = getattr(args, "threshold", 0.05), getattr(args, "alpha", 0.05)
    if not 0 < threshold < 1:
        raise BenchError(f"--threshold {threshold}: must be a fraction in (0, 1) (0.05 = 5 %)")
    if not 0 < alpha < 0.5:
        raise BenchError(f"--alpha {alpha}: must be in (0, 0.5)")
    if precision is not None and budget is not None:
        raise BenchError("--precision and --budget: give one of them (allowed: --precision P or --budget DURATION)")
    if precision is not None and not 0 < precision < 1:
        raise BenchError(f"--precision {precision}: must be a fraction in (0, 1) (0.02 = 2 %)")
    if budget is not None:
        parse_duration(budget)


def prepare(args: argparse.Namespace, matrix: Any, plan: Any) -> Prepared:
    """Apply ``--precision``/``--budget`` (re-plan steps and repeats from the target's noise and cost model)
    and ``--sequential`` (the effects' stop rule over the plan's repeats as looks).

    Raises:
        BenchError: bad values, both --precision and --budget, or a sequential sweep in a non-blocked order.
    """
    check_planning_flags(args)
    precision, budget = getattr(args, "precision", None), getattr(args, "budget", None)
    threshold, alpha = getattr(args, "threshold", 0.05), getattr(args, "alpha", 0.05)
    planning = None
    if precision is not None or budget is not None:
        budget_s = parse_duration(budget) if budget is not None else None
        matrix, plan, planning = replan(matrix, plan, args.results, precision=precision, budget_s=budget_s,
                                        alpha=alpha, threshold=threshold, slots=planned_slots(args))
    sequential = bool(getattr(args, "sequential", False) or planning)
    rule = None
    if sequential:
        if getattr(args, "order", "blocked") != "blocked":
            raise BenchError("--sequential: a sequential sweep decides after each block: it needs --order blocked "
                             "(allowed: blocked)")
        from bench.planning.sequential import EffectsStopRule  # deferred: bench.planning.sequential loads scipy

        rule = EffectsStopRule(plan.repeats, threshold=threshold, alpha=alpha, claims=matrix.expect)
    return Prepared(matrix=matrix, plan=plan, stop_rule=rule, planning=planning)


def print_planning(prep: Prepared, console: Any) -> None:
    """The dry run's planning lines (after the run order): the plan of --precision/--budget with its predicted
    wall time and precision and why, and the stopping rule of a sequential sweep."""
    if prep.planning:
        console.print("\n[bold]planning[/]", markup=True)
        for line in plan_lines(prep.planning):
            console.print(f"  {line}", markup=False, soft_wrap=True)
    if prep.stop_rule is not None:
        from bench.planning.sequential import METHOD  # deferred: bench.planning.sequential loads scipy

        r = prep.stop_rule
        console.print(f"sequential stopping: after each of up to {r.max_looks} block(s) every main effect is decided "
                      f"(slower / faster / no change within +-{r.threshold:.1%}, error rate {r.alpha} over all looks: "
                      f"{METHOD}); the sweep stops when all are decided", markup=False, soft_wrap=True)


def closing_verdict_line(prep: Prepared, sweep_dir: Any, *, threshold: float = 0.05, alpha: float = 0.05
                         ) -> str | None:
    """The console's last word on a finished sweep: for a sequential sweep (its ``sweep.json`` records looks, with or
    without ``--sequential`` in this invocation) the verdicts and repeated intervals of its stopping look, the figures
    of its report and ``summary.md`` (:func:`bench.planning.view.verdict_line`); else
    :func:`fixed_verdict_line`."""
    from pathlib import Path

    from bench.planning.view import verdict_line, view  # deferred: bench.planning.view loads scipy

    v = view(read_json(Path(sweep_dir) / SWEEP) or {})
    if v is not None:
        return verdict_line(v)
    return fixed_verdict_line(prep, sweep_dir, threshold=threshold, alpha=alpha)


def fixed_verdict_line(prep: Prepared, sweep_dir: Any, *, threshold: float = 0.05, alpha: float = 0.05) -> str | None:
    """The console's last word on a fixed design (no stop rule): every main effect (and step-time ``expect`` claim)
    decided once at the sweep's end with the sequential rule at one look (:class:`bench.planning.sequential.
    EffectsStopRule` with ``max_looks = 1``: the plain t interval at ``alpha / m``), and what stays undecided with
    how many more blocks would likely decide it. ``None`` for a sequential sweep (its looks were printed) or when
    nothing varies."""
    if prep.stop_rule is not None:
        return None
    from bench.planning.sequential import EffectsStopRule  # deferred: bench.planning.sequential loads scipy

    try:  # an informational line after a finished sweep: a failure here must not fail the sweep
        look = EffectsStopRule(1, threshold=threshold, alpha=alpha, claims=prep.matrix.expect).after_block(
            load_records(sweep_dir), 1)
    except Exception as exc:  # noqa: BLE001
        return f"verdicts of this fixed design: not computed ({type(exc).__name__}: {exc})"
    if not look.decisions:
        return None
    text = "; ".join(d.text() for d in look.decisions)
    why = []
    for d in look.decisions:
        if d.verdict == "undecided":
            more = look.more_blocks.get(d.name)
            why.append(f"{d.name} (" + ("no interval: too few runs per cell" if d.lo is None else
                                        f"about {more} more block(s)" if more else "not within 100 more blocks") + ")")
    tail = (". Undecided: " + ", ".join(why) + "; `--precision P` plans steps and blocks for them from this sweep's "
            "noise and cost, `--sequential` stops when they are decided") if why else ""
    return (f"verdicts of this fixed design (decided once at its end; change that matters +-{threshold:.0%}, error "
            f"rate {alpha} over {len(look.decisions)} comparison(s)): {text}{tail}")
