"""``run_bench.py run MATRIX.yaml``: plan, then run the sweep (or print the plan with ``--dry-run``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.commands.base import Command, add_execution_arguments, given_path
from bench.commands.dry_run import (
    plan_json,
    print_dry_run,
    print_order,
    print_plan,
    print_smoke_dry_run,
    print_stacks,
    smoke_json,
)
from bench.commands.run_planning import (
    add_planning_arguments,
    check_planning_flags,
    closing_verdict_line,
    prepare,
    print_planning,
)
from bench.core.engine_registry import engine_class, engines_with, get_engine
from bench.core.errors import BenchError, clip_words
from bench.execution.executors import LocalExecutor
from bench.execution.forkserver import ForkServerExecutor
from bench.execution.progress import FORKSERVER_STARTING, LiveProgress, make_console, run_status
from bench.execution.ray_executor import RayJobExecutor, ray_address_parts
from bench.execution.ray_parallel import RayNodesExecutor
from bench.execution.smoke import run_smoke
from bench.execution.stacks import StackExecutor, open_stacks
from bench.execution.sweep import Sweep
from bench.records.figures import SUMMARY_STEP_TIME
from bench.records.results import check_writable, run_dir
from bench.spec.loading import load_matrix
from bench.spec.optimizations import FACTOR_KEYS
from bench.spec.plan import ORDERS, Plan, make_plan, new_order_seed, run_order
from bench.tracking import ML_VIEW, run_url
from bench.tracking.upload_queue import queued_line
from bench.tune.storage import check_tune_block


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``run``."""
    p.add_argument("matrix", type=given_path, help="matrix YAML file (see matrix/)")
    p.add_argument("overrides", nargs="*", default=[], metavar="base.KEY=VALUE",
                   help="Hydra-style overrides of the matrix's base settings, validated like the file "
                        "(e.g. base.steps=4 base.embedded.update_delay_s=0.1)")
    p.add_argument("--cells", default=None, metavar="PATTERN",
                   help="run only the cells whose label or cell id contains PATTERN or matches it as a glob "
                        "(* ? [...]); comma-separated alternatives, e.g. --cells 'all-off,dynamic_bsz*'")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would be launched, run nothing: the base launch once, then per run only what "
                        "differs from it (overrides, env, patches), what was left out and why")
    p.add_argument("--verbose", action="store_true",
                   help="with --dry-run: every run's whole launch (argv, env, patches, run config) and levels")
    p.add_argument("--json", action="store_true",
                   help="with --dry-run: everything (plan, every launch, run order) as one JSON document")
    p.add_argument("--force", action="store_true", help="start a new sweep: rerun cells already finished")
    add_execution_arguments(p, "cell")
    p.add_argument("--smoke", action="store_true",
                   help="verl matrices: run every cell's own launch for a few real steps on this CPU (tiny model, "
                   "verl:cpu target) to catch config errors and ignored knobs before accelerator time")
    p.add_argument("--smoke-steps", type=int, default=2, choices=range(1, 11), metavar="N",
                   help="GRPO steps per smoke cell (1-10, default 2)")
    p.add_argument("--parallel", default=None, metavar="N|auto",
                   help="with --ray-address: run the runs of each block at once on N distinct Ray nodes (auto: every "
                        "alive node), one run per node; blocks still run one after another (docs/ray-cluster.md)")
    p.add_argument("--order", choices=ORDERS, default="blocked",
                   help="run order of a new sweep: blocked (default: block k = repeat k of every cell, shuffled "
                        "with a recorded seed, so machine drift is not confounded with the factors) or sequential "
                        "(every repeat of one cell, then the next; for debugging). A resumed sweep keeps its order")
    p.add_argument("--order-seed", type=int, default=None, metavar="N",
                   help="shuffle seed of the blocked order (default: a fresh random seed, recorded in sweep.json)")
    add_planning_arguments(p)


def cell_patterns(pattern: str) -> list[str]:
    """The comma-separated alternatives of a ``--cells`` pattern (checked before the matrix is read).

    Raises:
        BenchError: an empty pattern.
    """
    alts = [a.strip() for a in pattern.split(",") if a.strip()]
    if not alts:
        raise BenchError(f"--cells {pattern!r}: empty pattern (give a label, a cell id or a glob)")
    return alts


def select_cells(plan: Plan, pattern: str, matrix_file: str | Path = "matrix") -> Plan:
    """The plan restricted to the runs whose label or cell id matches ``pattern``.

    ``pattern``: comma-separated alternatives; each is a glob (``fnmatch``, case-sensitive) when it holds
    ``*``, ``?`` or ``[``, else a substring of the label or the cell id.

    Raises:
        BenchError: an empty pattern, or one that matches no run (naming the allowed labels).
    """
    from fnmatch import fnmatchcase

    alts = cell_patterns(pattern)

    def hit(run, alt: str) -> bool:
        if any(ch in alt for ch in "*?["):
            return fnmatchcase(run.label, alt) or fnmatchcase(run.cell_id, alt)
        return alt in run.label or alt in run.cell_id

    runs = [r for r in plan.runs if any(hit(r, a) for a in alts)]
    if not runs:
        labels = ", ".join(r.label for r in plan.runs)
        raise BenchError(f"{matrix_file}: --cells {pattern!r} matches no cell (allowed labels: {labels}; "
                         "or a cell id, a substring or a glob)")
    return plan.model_copy(update={"runs": runs})


class ConsoleView:
    """The live progress of a sweep (:class:`bench.execution.progress.LiveProgress`: runs done/total, ETA from the
    measured run times, the current cell and what it is doing) plus a line per finished run.

    Each line shows the run's own median timed step (raw seconds); speedups are a cell statistic and
    appear only in the final table (:func:`summary_table`, the rows of ``summary.md``).

    Args:
        console: :func:`bench.execution.progress.make_console`.
        executor: the sweep's executor (a fork server still importing is shown as such).
        steps: GRPO steps per run (``base.steps``), for ``step k/N``.
        engine: the matrix's engine (what a run's start-up is called).
    """

    def __init__(self, console: Console, executor: Any = None, steps: int = 0, engine: str = ""):
        self.console = console
        self.executor, self.steps, self.engine = executor, steps, engine
        self.live = LiveProgress(console, noun="run")
        self.sweep_dir: Path | None = None

    def prepare(self, text: str) -> None:
        """Before the sweep's start event: say what the harness is doing (results folder, MLflow, fork server)."""
        self.live.start(text)

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "start":
            verb = "resuming" if data.get("resumed") else "sweep"
            self.sweep_dir = Path(data["sweep_dir"])
            self.live.print(f"{verb}: {data['sweep_dir']}", markup=False)
            if data.get("order"):
                seed = f", seed {data['order_seed']}" if data.get("order_seed") is not None else ""
                self.live.print(f"run order: {data['order']}{seed}", markup=False)
            self.live.print(f"{'status':8} {'cell':34} {'rep':>3} {'step s':>8} {'rollout':>8} {'Free':>6}",
                            markup=False)
            starting = getattr(self.executor, "proc", None) is not None and not getattr(self.executor, "ready", True)
            self.live.start(FORKSERVER_STARTING if starting else "starting the first run", total=data["total"])
        elif kind == "launch":
            spec, k = data["spec"], data["repeat"]
            rdir = run_dir(self.sweep_dir, spec.cell_id, k) if self.sweep_dir is not None else None
            steps = self.steps or 1
            status_of = (lambda: run_status(rdir, steps, self.engine, spec.launch, self.executor)) if rdir else None
            self.live.begin(f"{spec.label} r{k}", status_of)
        elif kind in ("done", "skip"):
            rec = data["record"] or {}
            s = rec.get("summary") or {}
            st = s.get(SUMMARY_STEP_TIME)
            status = ("cached" if kind == "skip" else rec.get("status", "?"))
            fr, rs = s.get("free_ratio_median"), s.get("rollout_share_median")
            label = data["spec"].label
            if self.console.is_terminal:
                label = label[:34]  # a terminal's width is known; a log keeps the whole label
            line = (f"{status:8} {label:34} {data['repeat']:>3} "
                    f"{(f'{st:.3f}' if st else '-'):>8} {(f'{rs:.3f}' if rs is not None else '-'):>8} "
                    f"{(f'{fr:.3f}' if fr is not None else '-'):>6}")
            if (rec.get("node") or {}).get("name"):
                line += f"  node {rec['node']['name']}"
            if rec.get("status") == "failed":
                line += f"  {rec.get('failure_kind')}: {clip_words(rec.get('reason', ''), 100)}"
            self.live.print(line, style="red" if rec.get("status") == "failed" else None, soft_wrap=True,
                            markup=False)
            self.live.finish(measured=kind == "done")
            if self.live.total is not None and self.live.done >= self.live.total:
                self.live.set_status("writing the summary and closing the MLflow run")
        elif kind == "warn":
            self.live.print(f"warning: {data['message']}", markup=False)
        elif kind == "look":  # a sequential sweep's decisions after a block (bench.execution.blocks)
            self.live.print(data["line"] + ("" if not data["stop"] else f" -> stop: {data['reason']}"),
                            markup=False, soft_wrap=True)

    def stop(self) -> None:
        self.live.stop()


def summary_table(rows: list[dict[str, Any]]) -> Table:
    """The final rich table of cells: the rows of ``summary.md`` (:func:`bench.records.summary.cell_rows`), factor
    columns only for factors that apply and vary."""
    head, body = _summary_columns(rows)
    t = Table(title="cells")
    for col in head:
        t.add_column(col, overflow="fold")
    for b in body:
        t.add_row(*b)
    return t


#: width of the console when the output is not a terminal (a CI log, a file): wide enough for the cells table
PLAIN_WIDTH = 160


def _summary_columns(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and text cells of the final table (shared by the rich and the plain layout)."""
    factors = [k for k in FACTOR_KEYS if len({r[k] for r in rows}) > 1 or any(r[k] not in ("n/a", "0") for r in rows)]
    factors += ["stack"] if any(r.get("stack") for r in rows) else []  # the stack factor's level by name
    head = ["cell", *factors, "step s", "raw s", "IQR", "speedup", "rollout", "Free", "status"]
    body = [[r["label"], *[r[k] for k in factors],
             *(f"{v:.3f}" if isinstance(v, float) else "-" for v in
               (r["step_time_s"], r["step_time_raw_s"], r["step_time_iqr_s"], r["speedup"], r["rollout_share"],
                r["free_ratio"])),
             r["status"] + (f": {clip_words(r['reason'], 60)}" if r["reason"] else "")] for r in rows]
    return head, body


def plain_table(rows: list[dict[str, Any]]) -> list[str]:
    """The final table as plain lines for a non-terminal (CI log, file): a header, then one line per cell.

    Columns are padded to their widest entry and nothing is cut or wrapped: a label stays whole on its line
    however long it is (print each line with ``soft_wrap=True``).
    """
    head, body = _summary_columns(rows)
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [fmt(head), fmt(["-" * w for w in widths]), *(fmt(b) for b in body)]


def print_summary(rows: list[dict[str, Any]], console: Console) -> None:
    """The final cells table: rich's table on a terminal, :func:`plain_table` elsewhere (never wrapped)."""
    if console.is_terminal:
        console.print(summary_table(rows))
        return
    console.print("cells", markup=False)
    for line in plain_table(rows):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


#: most runs ``--parallel N`` starts at once (one per Ray node)
MAX_PARALLEL = 4096


def check_parallel(value: str) -> None:
    """Refuse a ``--parallel`` that is neither ``auto`` nor a whole number of runs at once in 1..:data:`MAX_PARALLEL`
    (checked before the matrix is read, ``--dry-run`` included; the cluster's node count is checked when Ray is met,
    :func:`bench.execution.ray_parallel.parallel_slots`).

    Raises:
        BenchError: naming the value and what is allowed.
    """
    text = str(value).strip()
    if text.lower() == "auto":
        return
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_PARALLEL:
        raise BenchError(f"--parallel {str(value)[:40]!r}: allowed: auto, or a number of runs at once in "
                         f"1..{MAX_PARALLEL}")


def make_executor(args: argparse.Namespace, engine: str = "", platform: str = "", stacks: dict | None = None):
    """Ray job executor with ``--ray-address``; the fork server where the engine allows it on this platform
    (``forkserver_platforms``: embedded CPU runs) unless ``--spawn`` (with ``stacks``, the open stacks of a
    ``stack`` factor: one fork server per stack, in its interpreter with its paths and variables,
    :class:`bench.execution.stacks.StackExecutor`); else a fresh local process per run (a stack's interpreter,
    paths and variables are in its launch). A ``--parallel`` without ``--ray-address`` never gets here
    (:func:`bench.cli.check_flag_combinations`)."""
    if getattr(args, "ray_address", None):
        if getattr(args, "parallel", None) is not None:
            return RayNodesExecutor(args.ray_address, args.parallel)
        return RayJobExecutor(args.ray_address)
    if engine and platform in engine_class(engine).forkserver_platforms and not getattr(args, "spawn", False):
        if stacks:
            return StackExecutor(lambda st: ForkServerExecutor(python=st.python, paths=st.paths, env=st.env), stacks)
        return ForkServerExecutor()
    return LocalExecutor()


def main(args: argparse.Namespace) -> int:
    """Run (or dry-run) a matrix; 0 when every cell finished, 1 when some failed, 2 on bad input."""
    # the flags' own forms first: a bad flag is named before the matrix's errors (a dry run never meets Ray)
    if getattr(args, "parallel", None) is not None:
        check_parallel(args.parallel)
    if getattr(args, "ray_address", None):
        ray_address_parts(args.ray_address)
    if getattr(args, "cells", None) is not None:
        cell_patterns(args.cells)
    check_planning_flags(args)
    console = make_console(PLAIN_WIDTH)  # CI log or file: no colours, no 80-column default
    matrix = load_matrix(args.matrix, getattr(args, "overrides", None))  # its expect claims too
    if matrix.tune is not None:  # one validation pass: a matrix's tune block is checked by every command
        check_tune_block(matrix)
    if getattr(args, "smoke", False):
        return smoke_main(args, matrix, console)
    plan = make_plan(matrix, strict=not args.dry_run)
    if getattr(args, "cells", None) is not None:
        plan = select_cells(plan, args.cells, args.matrix)
        if len(plan.runs) < len(make_plan(matrix, strict=False).runs):
            # its own sweep: a subset neither resumes nor is resumed by the sweep of every cell
            matrix.selected_cells = sorted(r.cell_id for r in plan.runs)
    order_seed = getattr(args, "order_seed", None)
    order_kind = getattr(args, "order", "blocked")
    prep = prepare(args, matrix, plan)  # --precision/--budget re-plan steps and repeats; --sequential: a stop rule
    matrix, plan = prep.matrix, prep.plan
    with open_stacks(matrix, plan.platform) as stacks:  # checked (and revisions checked out) before anything runs
        if args.dry_run:
            seed = (order_seed if order_seed is not None else new_order_seed()) if order_kind == "blocked" else None
            order = run_order([r.cell_id for r in plan.runs], plan.repeats, order_kind, seed)
            if getattr(args, "json", False):
                out = plan_json(plan, order)
                if stacks:
                    out["stacks"] = {n: st.describe() for n, st in stacks.items()}
                print(json.dumps(out, indent=1))
                return 0
            (print_plan if getattr(args, "verbose", False) else print_dry_run)(plan, console)
            print_stacks(stacks, console)
            print_order(plan, order, console)
            print_planning(prep, console)
            return 0
        return _run(args, matrix, plan, prep, console, stacks, order_kind, order_seed)


def _run(args: argparse.Namespace, matrix, plan: Plan, prep, console: Console, stacks: dict, order_kind: str,
         order_seed: int | None) -> int:
    """The real sweep of :func:`main` (the stacks open for its duration)."""
    get_engine(matrix.engine).preflight(matrix, [r.launch for r in plan.runs], plan.platform)
    check_writable(args.results, matrix.name)
    executor = make_executor(args, matrix.engine, plan.platform, stacks)
    if hasattr(executor, "describe"):  # --parallel: how many runs at once, on which nodes
        console.print(f"parallel: {executor.describe()}", markup=False, soft_wrap=True)
    view = ConsoleView(console, executor, matrix.base.steps, matrix.engine)
    view.prepare(f"opening the results folder and the MLflow store ({args.tracking_uri})")
    try:
        out = Sweep(matrix, plan, args.results, args.tracking_uri, executor=executor,
                    force=args.force, on_event=view, order=order_kind, order_seed=order_seed,
                    stop_rule=prep.stop_rule, planning=prep.planning, stacks=stacks).run()
    finally:
        view.stop()
        if isinstance(executor, StackExecutor):
            executor.close()
    print_summary(out.rows, console)
    console.print(f"sweep folder: {out.sweep_dir}")
    console.print(f"summary: {out.sweep_dir / 'summary.md'}")
    link = run_url(args.tracking_uri, out.experiment_id, out.parent_run_id)
    if queued := queued_line(out.sweep_dir):  # an outage (or a store that kept nothing): never a dead link
        console.print(queued, markup=False, soft_wrap=True)
    elif link:
        console.print(f"MLflow: {link}", soft_wrap=True)
    else:
        console.print(f"MLflow: {args.tracking_uri} (parent run {out.parent_run_id}); browse with "
                      f"`mlflow ui --backend-store-uri {args.tracking_uri}` (experiment links with ?{ML_VIEW} open "
                      "on its runs)", soft_wrap=True)
    console.print(f"executed {out.executed}, cached {out.skipped}, failed {out.failed}; wall {out.wall_s:.1f} s, "
                  f"in GRPO steps {out.in_step_s:.1f} s, harness overhead {out.overhead_share:.1%}")
    if verdict := closing_verdict_line(prep, out.sweep_dir, threshold=args.threshold, alpha=args.alpha):
        console.print(verdict, markup=False, soft_wrap=True)
    if any(r["status"] != "ok" for r in out.rows):  # exit 1: one line on stderr says why
        bad = sum(r["status"] != "ok" for r in out.rows)
        print(f"error: {bad} cell(s) not ok ({out.failed} run(s) failed now): see the status column, "
              f"{out.sweep_dir / 'summary.md'} and each run.log", file=sys.stderr)
        return 1
    return 0


def smoke_main(args: argparse.Namespace, matrix, console: Console) -> int:
    """``--smoke``: each cell of a verl matrix for a few real steps on the CPU; 0 when every cell ran."""
    if matrix.stack_levels:  # a smoke run would use the harness's own stack for every level
        raise BenchError(f"{args.matrix}: factors.stack: --smoke does not run stacks yet (allowed: a matrix without "
                         "the stack factor; run the sweep itself)")
    if not engine_class(matrix.engine).supports_smoke:
        allowed = engines_with("supports_smoke")
        raise BenchError(f"{args.matrix}: engine: --smoke checks {' or '.join(allowed)} launches; this matrix uses "
                         f"engine {matrix.engine!r} (allowed: {', '.join(allowed)})")
    plan = make_plan(matrix, strict=False)
    if getattr(args, "cells", None) is not None:
        plan = select_cells(plan, args.cells, args.matrix)
    engine = get_engine(matrix.engine)
    cells = engine.smoke_cells(matrix, plan, args.smoke_steps)
    if args.dry_run:
        kw = {"matrix_name": matrix.name, "steps": args.smoke_steps,
              "not_exercised": engine.not_exercised(plan, matrix)}
        if getattr(args, "json", False):
            print(json.dumps(smoke_json(cells, **kw), indent=1))
        elif getattr(args, "verbose", False):
            for c in cells:
                console.print(f"[bold]{c.source_label}[/] -> smoke cell {c.spec.cell_id}", markup=True)
                console.print(f"  argv: {json.dumps(c.spec.launch.argv)}", soft_wrap=True, markup=False)
                for x in c.left_out + c.inert:
                    console.print(f"  left out / inert: {x}", markup=False)
        else:
            print_smoke_dry_run(cells, console, **kw)
        return 0
    base, _ = engine.smoke_base(matrix, args.smoke_steps)
    engine.preflight(matrix.model_copy(update={"platform": "cpu", "base": base}),
                                 [c.spec.launch for c in cells], "cpu")
    check_writable(args.results)

    def on_cell(kind, i, n, cell, res):
        if kind == "start":
            console.print(f"smoke {i}/{n}: {cell.source_label} ({cell.spec.cell_id}) ...")
        else:
            st = f"{res['step_time_s']:.2f} s/step" if res["step_time_s"] else "-"
            line = f"  {res['status']}: {res['steps']} step(s), {st}"
            if res["status"] != "ran":
                line += f"; {res['failure_kind']}: {res['reason']}"
            console.print(line, markup=False, style=None if res["status"] == "ran" else "red")

    started = time.monotonic()
    folder, results = run_smoke(matrix, plan, args.results, steps=args.smoke_steps, on_cell=on_cell)
    console.print(f"\nsmoke run of {args.matrix} on this CPU ({args.smoke_steps} step(s) per cell, tiny model "
                  f"{base.model}): {len(results)} cell(s) in {time.monotonic() - started:.0f} s", markup=False)
    for key, why in engine.not_exercised(plan, matrix).items():
        console.print(f"not exercised on CPU: {key}: {why} (its variables and patches are still launched)",
                      markup=False)
    for r in results:
        head = f"- {r['cell']}: {r['status']}"
        if r["status"] != "ran":
            head += f" ({r['failure_kind']}): {r['reason']}"
        console.print(head, markup=False)
        for k, v in r["evidence"].items():
            console.print(f"    factor {k}: evidence {v}", markup=False)
        for name, line in r["patches"].items():
            if "refused in 0" not in line or "error" in line:
                console.print(f"    patch {name}: {line}", markup=False)
        for x in r["left_out"]:
            console.print(f"    left out {x}", markup=False)
        for x in r["inert_env"]:
            console.print(f"    env {x}", markup=False)
    console.print(f"smoke folder: {folder} (smoke.json, one run folder per cell)")
    return 0 if all(r["status"] == "ran" for r in results) else 1


__all__ = ["add_arguments", "cell_patterns", "main", "plain_table", "select_cells", "print_plan", "print_summary",
           "smoke_main"]


class Run(Command, name="run"):
    """``run``: :func:`add_arguments`, :func:`main`."""

    setup_arguments, run = staticmethod(add_arguments), staticmethod(main)
