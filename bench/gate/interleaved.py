"""``run_bench.py gate --interleave REV MATRIX``: the interleaved gate (:func:`run_interleaved_gate`).

The baseline's code (a git revision checked out into a temporary ``git worktree``, removed at the end, or a
folder with another checkout: :func:`bench.gate.versions.baseline_checkout`) and the candidate's code (this
working tree) run in ONE blocked sweep of the matrix: each block holds a run of every cell under each version,
in random order (:func:`bench.spec.plan.interleaved_order`), so machine drift hits both alike (asv
``continuous --interleave-rounds``). Every run executes its own version's code: ``PYTHONPATH`` and ``{repo}``
name that version's checkout; both versions' runs are forked from one fork server, each child importing its own
version's harness (:class:`bench.gate.versions.VersionedExecutor` ``shared``). Cell ids do not change: the
version is a run attribute (``code_version`` in the record, folder ``r<k>-baseline`` for the baseline's runs).
Both versions' records stay in the one gate sweep; rerunning the same command resumes an interrupted one (same
matrix, same baseline commit), ``--force`` starts a new one.

``gate --stacks BASE CAND``: the same sweep and decision, with both sides this working tree, each run in its
own stack of the matrix's ``stacks:`` (one fork server per stack; :mod:`bench.gate.stacks`).

The comparison is run-level and paired by block (:func:`bench.gate.runs.paired_comparison`). With
``--blocks N`` the sweep plans ``N`` blocks; after each complete block the stop rule
(:class:`GateStopRule`, run by the sweep's block loop :func:`bench.execution.blocks.run_blocks`) compares what has run
on the repeated confidence intervals of :func:`bench.planning.sequential.decide`, and the sweep stops as soon as
every cell is pass or regression, else after the ``N`` blocks (the budget). Where it still cannot decide, each
row says how many blocks would let it (:func:`bench.stats.power.blocks_needed`).
"""

from __future__ import annotations

import contextlib
import random
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

from bench.core.engine_registry import engine_class
from bench.core.errors import BenchError, InputError
from bench.core.files import atomic_write_json, atomic_write_text
from bench.execution.executors import LocalExecutor
from bench.execution.forkserver import ForkServerExecutor
from bench.execution.stacks import open_stacks
from bench.execution.sweep import Sweep
from bench.gate.markdown import append_step_summary, render_interleaved
from bench.gate.runs import declare_analysis, paired_comparison
from bench.gate.side_by_side import SideBySide
from bench.gate.stacks import check_stack_sides, pin_stack_sides, stack_executor, stack_sides
from bench.gate.versions import BASELINE, CANDIDATE, VersionedExecutor, baseline_checkout, candidate_version
from bench.planning.sequential import Decision, Look, decide
from bench.records.results import load_records
from bench.spec.loading import load_matrix
from bench.spec.plan import make_plan
from bench.tune.storage import check_tune_block

#: blocks an interleaved gate plans when neither ``--blocks`` nor the matrix says more
DEFAULT_BLOCKS = 8


class GateStopRule:
    """The gate's stop rule (the verdict helper's ``StopRule``, called by the sweep's block loop
    :func:`bench.execution.blocks.run_blocks` after each complete block): compares the blocks so far
    (:func:`bench.gate.runs.paired_comparison` with the sequential intervals of
    :func:`bench.planning.sequential.decide`, so the error rate holds over all looks) and stops once every cell
    is pass or regression (never before ``min_blocks``), the planned blocks are done, or (with ``budget_s``,
    wall seconds counted from ``t0``, the rule's creation unless set) another block would likely end past the
    budget: the mean wall time of the blocks after the first (which carries the start-up) is the forecast.
    Stopping early never spends more error than planned: the intervals are those of ``max_blocks`` looks, except
    that a look where the budget ends the sweep is its final analysis and spends all the
    alpha left (:func:`bench.planning.sequential.obf_boundaries` ``final_look``; the clock, not the data, chose
    it); ``final_look`` records it."""

    def __init__(self, *, threshold: float, alpha: float, max_mde: float | None, normalize: bool,
                 max_blocks: int, min_blocks: int = 3, budget_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, analysis: dict[str, Any] | None = None):
        self.threshold, self.alpha, self.max_mde, self.normalize = threshold, alpha, max_mde, normalize
        self.analysis = analysis  # declared before the first run (bench.gate.runs.declare_analysis)
        self.max_looks, self.min_blocks = max_blocks, min_blocks
        self.budget_s, self.clock, self.t0, self.t_first = budget_s, clock, clock(), None
        self.final_look: int | None = None

    def compare(self, records: list[dict[str, Any]], look: int, final: bool = False) -> dict[str, Any]:
        """The gate's comparison at ``look`` (``paired_comparison`` result); ``final``: the look ends the sweep
        before the planned blocks (budget spent), its intervals spend all the alpha left."""
        return paired_comparison(records, threshold=self.threshold, alpha=self.alpha, max_mde=self.max_mde,
                                 normalize=self.normalize, look=look, max_looks=self.max_looks,
                                 decide=partial(decide, final=final), analysis=self.analysis)

    def after_block(self, records: list[dict[str, Any]], look: int) -> Look:
        """Compare the blocks so far; stop when no cell is left undecided (or the planned blocks are done)."""
        now = self.clock()
        elapsed = now - self.t0  # the block loop counts looks from 1 in this process, resumed or not
        if look <= 1 or self.t_first is None:  # the first block carries the start-up (worktree, fork servers)
            self.t_first, per_block = now, elapsed
            over = self.budget_s is not None and elapsed > self.budget_s
        else:
            per_block = (now - self.t_first) / (look - 1)
            over = self.budget_s is not None and elapsed + per_block > self.budget_s
        if over and look < self.max_looks:  # the budget ends the sweep here: its final analysis (one comparison)
            self.final_look = look
        res = self.compare(records, look, final=self.final_look == look)
        undecided = [r["cell"] for r in res["rows"] if r["verdict"] in ("noisy", "cannot judge")]
        done = look >= self.min_blocks and not undecided
        stop = done or over or look >= self.max_looks
        left = ", ".join(undecided) or "none"
        if done and self.final_look != look:
            reason = "every cell decided"
        elif over:
            reason = (f"budget {self.budget_s:.0f} s: {elapsed:.0f} s spent, a block takes {per_block:.0f} s; "
                      f"final look (the alpha left spent); undecided: {left}")
        elif stop:
            reason = f"planned blocks done; undecided: {left}"
        else:
            reason = f"undecided: {', '.join(undecided) or 'too few blocks'}"
        line = f"gate look {look}/{self.max_looks}: {res['verdict']}; " + ", ".join(
            f"{r['cell']} {r['verdict']}" + (f" {r['change']:+.1%}" if r.get("change") is not None else "")
            for r in res["rows"])
        return Look(look=look, max_looks=self.max_looks, stop=stop, reason=reason,
                    decisions=[Decision(**r["decision"]) for r in res["rows"] if r.get("decision")], line=line,
                    more_blocks={r["cell"]: (max(r["blocks_needed"] - look, 1) if r.get("blocks_needed") else None)
                                 for r in res["rows"] if r["cell"] in undecided},
                    runs=len(records))


def run_interleaved_gate(*, matrix_path: Path, baseline_ref: str | None, results: Path, tracking_uri: str,
                         overrides: list[str] | None = None, blocks: int | None = None, threshold: float,
                         alpha: float, max_mde: float | None = None, normalize: bool = True, force: bool = False,
                         spawn: bool = False, order_seed: int | None = None, out: Path | None = None,
                         budget_s: float | None = None, side_by_side: bool = False,
                         stacks: tuple[str, str] | None = None, candidate_root: Path | None = None,
                         stack_repo: Path | None = None,
                         on_event: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the interleaved gate sweep and judge it; returns the result (``exit_code``, ``verdict``, ``rows``,
    ``files``, ``sweep``, ``wall_s``). Thresholds are fractions; ``budget_s`` (wall seconds, from the start of
    this call) stops the sweep before a block that would likely end past it (:class:`GateStopRule`).
    ``stacks``: ``(BASE, CAND)``, a gate between two stacks the matrix declares (:mod:`bench.gate.stacks`): both
    sides run this checkout, each in its own stack (``baseline_ref`` then ``None``); a side ``NAME@REV`` is that stack
    with its source tree at ``REV`` (:func:`bench.gate.stacks.pin_stack_sides`; ``stack_repo`` picks the tree when the
    stack has several in git repositories). ``candidate_root``: another
    checkout of the harness as the candidate (``bisect``: a commit's worktree) instead of this working tree.

    Raises:
        BenchError: bad matrix, unknown revision, unknown or equal stacks, bad flags.
    """
    if not 0 <= threshold < 1:
        raise InputError("threshold", f"threshold {threshold}: must be a fraction in [0, 1) (0.05 = 5 %)")
    if not 0 < alpha < 0.5:
        raise InputError("alpha", f"alpha {alpha}: must be in (0, 0.5)")
    t0 = time.time()
    matrix = load_matrix(matrix_path, overrides)
    if matrix.tune is not None:  # one validation pass: a matrix's tune block is checked by every command
        check_tune_block(matrix)
    if stacks is not None:
        stacks = check_stack_sides(matrix, pin_stack_sides(matrix, stacks, stack_repo))
        if side_by_side:
            raise BenchError("--side-by-side: not with --stacks (allowed: one run at a time between two stacks)")
    elif matrix.stack_levels:  # the stacks would not run: every level would get this checkout's own
        raise BenchError(f"{matrix_path}: factors.stack: --interleave compares two checkouts of the harness (allowed: "
                         "a matrix without the stack factor; to compare two stacks: gate --stacks BASE CAND)")
    plan = make_plan(matrix)
    n_blocks = blocks if blocks is not None else max(matrix.repeats, DEFAULT_BLOCKS)
    if n_blocks < 2:
        raise InputError("blocks", f"blocks {n_blocks}: a paired comparison needs 2 or more blocks")
    plan.repeats = n_blocks
    cand = candidate_version() if candidate_root is None else candidate_version(Path(candidate_root))
    fork = plan.platform in engine_class(matrix.engine).forkserver_platforms and not spawn

    def make(root: Path):
        if fork:
            return ForkServerExecutor(repo_root=root)
        return LocalExecutor()

    if budget_s is not None and budget_s <= 0:
        raise InputError("budget", f"budget {budget_s}: must be a positive duration (e.g. 90s, 10m)")
    # the analysis is fixed here, before the first run, and kept in sweep.json: no look's data changes it
    analysis = declare_analysis(cells=[r.cell_id for r in plan.runs], threshold=threshold, alpha=alpha,
                                max_mde=max_mde, normalize=normalize, max_looks=n_blocks)
    rule = GateStopRule(threshold=threshold, alpha=alpha, max_mde=max_mde, normalize=normalize, max_blocks=n_blocks,
                        budget_s=budget_s, analysis=analysis)
    rule.t0 = time.monotonic() - (time.time() - t0)
    side = None
    if side_by_side:
        side = SideBySide(seed=order_seed if order_seed is not None else random.randrange(2**31))
    with contextlib.ExitStack() as ctx:
        opened: dict[str, Any] = {}
        if stacks is not None:  # both sides this checkout, each in its own stack (its own fork server)
            opened = ctx.enter_context(open_stacks(matrix, plan.platform, names=list(stacks)))
            versions = stack_sides(cand, stacks)
            base, cand = versions[BASELINE], versions[CANDIDATE]
            executor = stack_executor(opened, fork)
            ctx.callback(getattr(executor, "close", lambda: None))
        else:
            base = ctx.enter_context(baseline_checkout(baseline_ref))
            versions = {BASELINE: base, CANDIDATE: cand}
            roots = {k: Path(v["root"]) for k, v in versions.items()}
            # one fork server for both versions (each child imports its version's harness): a per-server offset of
            # speed cannot differ between the versions; side by side, each version keeps its own (pinned) server
            executor = VersionedExecutor(make, roots, side_by_side=side,
                                         shared=roots[CANDIDATE] if fork and side is None else None)
        outcome = Sweep(matrix, plan, results, tracking_uri, executor=executor, force=force, on_event=on_event,
                        order_seed=order_seed, stop_rule=rule, code_versions=versions, analysis=analysis,
                        stacks=opened).run()
    records = load_records(outcome.sweep_dir)
    look = max((r["repeat"] for r in records), default=-1) + 1
    res = rule.compare(records, look, final=rule.final_look == look)
    result: dict[str, Any] = {
        "format": "grpo-bench-gate", "format_version": 2, "kind": "interleaved", "created_at": time.time(),
        "settings": {"threshold": threshold, "alpha": alpha, "max_mde": 2 * threshold if max_mde is None else max_mde,
                     "normalize": "covariate" if normalize else "off", "blocks_planned": n_blocks,
                     "budget_s": budget_s,
                     "side_by_side": None if side is None else {"cpus": list(side.cpus), "seed": side.seed},
                     "estimate": "exp(mean over blocks of log(run value cand / run value base)) - 1; run value = "
                                 "median timed step",
                     "ci": "paired t over blocks (Kalibera & Jones 2020) with the speed probe as a covariate (CUPED / "
                           "ANCOVA), repeated confidence interval at this look (bench.planning.sequential: "
                           "O'Brien-Fleming spending over the planned blocks; a look where the budget ends the sweep "
                           "spends all the alpha left), each cell at alpha / m (Bonferroni over the cells)"},
        "baseline": {"ref": base["ref"], "commit": base.get("commit"), "kind": base.get("kind"),
                     **({"stack": opened[base["stack"]].describe()} if opened else {})},
        "candidate": {"ref": cand["ref"], "commit": cand.get("commit"), "dirty": cand.get("dirty"),
                      **({"stack": opened[cand["stack"]].describe()} if opened else {}),
                      "sweep": str(outcome.sweep_dir), "matrix": matrix.name, "engine": plan.engine,
                      "platform": plan.platform},
        "sweep": str(outcome.sweep_dir), "blocks_run": look, "wall_s": time.time() - t0,
        **res,
    }
    out = Path(out) if out is not None else outcome.sweep_dir / "gate"
    md = render_interleaved(result)
    atomic_write_text(out / "gate.md", md)
    atomic_write_json(out / "gate.json", result)
    result["files"] = [str(out / "gate.md"), str(out / "gate.json")]
    err = append_step_summary(md + "\n")
    if err is not None:
        result.setdefault("warnings", []).append(f"$GITHUB_STEP_SUMMARY not written: {err}")
    return result
