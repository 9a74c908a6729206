"""``run_bench.py gate --interleave REV MATRIX``: the interleaved gate (:func:`run_interleaved_gate`).

The baseline's code (a git revision checked out into a temporary ``git worktree``, removed at the end, or a
folder with another checkout: :func:`bench.code_versions.baseline_checkout`) and the candidate's code (this
working tree) run in ONE blocked sweep of the matrix: each block holds a run of every cell under each version,
in random order (:func:`bench.spec.plan.interleaved_order`), so machine drift hits both alike (asv
``continuous --interleave-rounds``). Every run executes its own version's code: ``PYTHONPATH`` and ``{repo}``
name that version's checkout, and each version has its own fork server (or process) started in it
(:class:`bench.code_versions.VersionedExecutor`). Cell ids do not change: the version is a run attribute
(``code_version`` in the record, folder ``r<k>-baseline`` for the baseline's runs). Both versions' records
stay in the one gate sweep; rerunning the same command resumes an interrupted one (same matrix, same baseline
commit), ``--force`` starts a new one.

The comparison is run-level and paired by block (:func:`bench.analyze.gate_runs.paired_comparison`). With
``--blocks N`` the sweep plans ``N`` blocks; after each complete block the stop rule
(:class:`GateStopRule`) compares what has run and the sweep stops as soon as every cell is pass or
regression (with the verdict helper's block loop; without it every planned block runs). Where it still
cannot decide, each row says how many blocks would let it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bench.analyze.gate_markdown import append_step_summary, render_interleaved
from bench.analyze.gate_runs import paired_comparison
from bench.code_versions import BASELINE, CANDIDATE, VersionedExecutor, baseline_checkout, candidate_version
from bench.errors import BenchError
from bench.results import atomic_write_json, atomic_write_text, load_records

#: blocks an interleaved gate plans when neither ``--blocks`` nor the matrix says more
DEFAULT_BLOCKS = 8


def _sequential_decide() -> Callable[..., Any] | None:
    """The verdict helper's sequential decision function (error control across looks), when present."""
    import importlib

    try:  # by name: the module comes with the verdict helper's branch
        sequential = importlib.import_module("bench.analyze.sequential")
    except ImportError:
        return None
    return getattr(sequential, "decide", None)


@dataclass
class GateLook:
    """What the stop rule decided after a block: ``stop``, the gate's result so far and a human ``line``."""

    stop: bool
    line: str
    result: dict[str, Any] = field(default_factory=dict)
    decisions: list[dict[str, Any]] = field(default_factory=list)


class GateStopRule:
    """Stop an interleaved gate sweep when every cell is pass or regression (``after_block`` after each complete
    block, the verdict helper's ``StopRule`` protocol). ``min_blocks``: never before this many blocks."""

    def __init__(self, *, threshold: float, alpha: float, max_mde: float | None, normalize: bool,
                 max_blocks: int, min_blocks: int = 3):
        self.kw = {"threshold": threshold, "alpha": alpha, "max_mde": max_mde, "normalize": normalize}
        self.max_blocks, self.min_blocks = max_blocks, min_blocks

    def after_block(self, records: list[dict[str, Any]], look: int) -> GateLook:
        """Compare the blocks so far; stop when no cell is left undecided (or the planned blocks are done)."""
        res = paired_comparison(records, **self.kw, look=look, max_looks=self.max_blocks,
                                decide=_sequential_decide())
        undecided = [r for r in res["rows"] if r["verdict"] in ("noisy", "cannot judge")]
        stop = look >= self.max_blocks or (look >= self.min_blocks and not undecided)
        line = (f"gate look {look}/{self.max_blocks}: {res['verdict']}; " +
                ", ".join(f"{r['cell']} {r['verdict']}" + (f" {r['change']:+.1%}" if r.get("change") is not None
                                                            else "") for r in res["rows"]))
        return GateLook(stop=stop, line=line, result=res, decisions=res["rows"])


def _interleaved_sweep_class():
    """:class:`bench.sweep.Sweep` with a look after each complete block (:class:`GateStopRule`): stops when the
    gate has decided; the sweep's order and plan are then cut to the blocks that ran, so the sweep is complete
    and a rerun resumes nothing. (The verdict helper's block loop does the same for every sweep; this class
    goes once that loop carries the stop rule.)"""
    from bench.results import run_dir
    from bench.sweep import Sweep

    class InterleavedSweep(Sweep):
        stop_rule: GateStopRule | None = None

        def _loop(self, tracker, sweep_dir, meta, todo, counts) -> None:
            if self.stop_rule is None:
                return super()._loop(tracker, sweep_dir, meta, todo, counts)
            blocks: dict[int, list] = {}
            for spec, k in todo:
                blocks.setdefault(k, []).append((spec, k))
            meta["looks"] = []
            for look, k in enumerate(sorted(blocks), 1):
                super()._loop(tracker, sweep_dir, meta, blocks[k], counts)
                if not all((run_dir(sweep_dir, sp.cell_id, kk, sp.code_version) / "record.json").exists()
                           for sp, kk in blocks[k]):
                    continue
                res = self.stop_rule.after_block(load_records(sweep_dir), look)
                meta["looks"].append({"look": look, "stop": res.stop, "line": res.line})
                self.on_event("look", {"look": look, "stop": res.stop, "line": res.line})
                if res.stop:
                    meta["order"]["runs"] = [r for r in meta["order"]["runs"] if r[1] <= k]
                    meta["plan"]["repeats"] = k + 1
                    meta["blocks_planned"] = len(blocks)
                    atomic_write_json(sweep_dir / "sweep.json", meta)
                    return
            return None

    return InterleavedSweep


def run_interleaved_gate(*, matrix_path: Path, baseline_ref: str, results: Path, tracking_uri: str,
                         overrides: list[str] | None = None, blocks: int | None = None, threshold: float,
                         alpha: float, max_mde: float | None = None, normalize: bool = True, force: bool = False,
                         spawn: bool = False, order_seed: int | None = None, out: Path | None = None,
                         on_event: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the interleaved gate sweep and judge it; returns the result (``exit_code``, ``verdict``, ``rows``,
    ``files``, ``sweep``, ``wall_s``). Thresholds are fractions.

    Raises:
        BenchError: bad matrix, unknown revision, bad flags.
    """
    from bench.engines import engine_class
    from bench.executors import LocalExecutor
    from bench.spec.loading import load_matrix
    from bench.spec.plan import make_plan

    if not 0 <= threshold < 1:
        raise BenchError(f"--threshold {threshold}: must be a fraction in [0, 1) (0.05 = 5 %)")
    if not 0 < alpha < 0.5:
        raise BenchError(f"--alpha {alpha}: must be in (0, 0.5)")
    t0 = time.time()
    matrix = load_matrix(matrix_path, overrides)
    plan = make_plan(matrix)
    n_blocks = blocks if blocks is not None else max(matrix.repeats, DEFAULT_BLOCKS)
    if n_blocks < 2:
        raise BenchError(f"--blocks {n_blocks}: a paired comparison needs 2 or more blocks")
    plan.repeats = n_blocks
    cand = candidate_version()
    fork = plan.platform in engine_class(matrix.engine).forkserver_platforms and not spawn

    def make(root: Path):
        if fork:
            from bench.forkserver import ForkServerExecutor

            return ForkServerExecutor(repo_root=root)
        return LocalExecutor()

    rule = GateStopRule(threshold=threshold, alpha=alpha, max_mde=max_mde, normalize=normalize, max_blocks=n_blocks)
    with baseline_checkout(baseline_ref) as base:
        versions = {BASELINE: base, CANDIDATE: cand}
        executor = VersionedExecutor(make, {k: Path(v["root"]) for k, v in versions.items()})
        sweep = _interleaved_sweep_class()(matrix, plan, results, tracking_uri, executor=executor, force=force,
                                           on_event=on_event, order_seed=order_seed, code_versions=versions)
        sweep.stop_rule = rule
        outcome = sweep.run()
    records = load_records(outcome.sweep_dir)
    look = max((r["repeat"] for r in records), default=-1) + 1
    res = paired_comparison(records, threshold=threshold, alpha=alpha, max_mde=max_mde, normalize=normalize,
                            look=look if _sequential_decide() else None, max_looks=n_blocks,
                            decide=_sequential_decide())
    result: dict[str, Any] = {
        "format": "grpo-bench-gate", "format_version": 2, "kind": "interleaved", "created_at": time.time(),
        "settings": {"threshold": threshold, "alpha": alpha, "max_mde": 2 * threshold if max_mde is None else max_mde,
                     "normalize": "auto" if normalize else "off", "blocks_planned": n_blocks,
                     "estimate": "exp(mean over blocks of log(run value cand / run value base)) - 1; run value = "
                                 "median timed step",
                     "ci": "paired t over blocks (Kalibera & Jones 2020), 1 - alpha"},
        "baseline": {"ref": base["ref"], "commit": base.get("commit"), "kind": base.get("kind")},
        "candidate": {"ref": cand["ref"], "commit": cand.get("commit"), "dirty": cand.get("dirty"),
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
