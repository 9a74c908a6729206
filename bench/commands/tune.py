"""``run_bench.py tune MATRIX.yaml``: argument parsing and printing (:func:`main`, the console view of the
trials); what a tune does: :mod:`bench.tune`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.commands.base import Command, add_execution_arguments, given_path
from bench.commands.run import make_executor
from bench.core.errors import BenchError
from bench.engines.base import get_engine
from bench.execution.progress import FORKSERVER_STARTING, LiveProgress, make_console, run_status
from bench.records.results import check_writable
from bench.spec.loading import load_matrix
from bench.tune import TuneOutcome, Tuner, TuneSettings, default_storage, redact, resolve_settings, trial_spec
from bench.tune.report import verl_overrides
from bench.tune.space import limits_of


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``tune``."""
    p.add_argument("matrix", type=given_path,
                   help="matrix YAML file with a 'tune' block (e.g. matrix/tune_dynamic_bsz.yaml)")
    p.add_argument("--n-trials", type=int, default=None, metavar="N",
                   help="finished trials the study should hold (a resumed study runs only the rest)")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="wall-clock budget of this invocation, seconds (checked before each trial)")
    p.add_argument(
        "--study", default=None, metavar="NAME", help="study name (default: tune.study, else the matrix name)"
    )
    p.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna storage: SQLAlchemy URL or journal:PATH (default: tune.storage, else "
                        "sqlite:///<results>/optuna.db)")
    add_execution_arguments(p, "trial")


class ConsoleView:
    """One line per trial, plus the start and the result, under a live progress line
    (:class:`bench.execution.progress.LiveProgress`: trials done/total, ETA from the measured trial times, best so far,
    and what the current trial's run is doing).

    Args:
        out: a file to print to instead of the console (plain lines, no live display; for tests).
        executor: the tune's executor (a fork server still importing is shown as such).
        steps: GRPO steps per trial run (``base.steps``); engine: the matrix's engine.
        direction: ``minimize`` / ``maximize`` (which value is the best so far).
    """

    def __init__(self, out=None, executor: Any = None, steps: int = 0, engine: str = "", direction: str = "minimize"):
        from rich.console import Console

        self.out = out
        console = make_console() if out is None else Console(file=out, force_terminal=False, no_color=True,
                                                                 width=160, highlight=False, soft_wrap=True)
        self.live = LiveProgress(console, noun="trial")
        self.executor, self.steps, self.engine, self.direction = executor, steps, engine, direction
        self.best: tuple[float, int, str] | None = None

    def p(self, text: str = "") -> None:
        """Print one plain line above the live progress line."""
        self.live.print(text, markup=False, highlight=False, soft_wrap=True)

    def stop(self) -> None:
        """End the live progress line."""
        self.live.stop()

    def __call__(self, kind: str, d: dict[str, Any]) -> None:
        if kind == "start":
            verb = "resuming" if d["resumed"] else "new"
            todo = "until the timeout" if d["todo"] is None else f"{d['todo']} trial(s) to run"
            self.p(f"{verb} study {d['study']} in {d['storage']}: {d['finished']} finished, {todo}"
                   + (f" (timeout {d['timeout_s']:g} s)" if d["timeout_s"] else ""))
            for dim in d["space"].values():
                self.p(f"  search {dim.describe()}")
            for n in d["notes"]:
                self.p(f"  note: {n}")
            self.p(f"  trial folders: {d['study_dir']}/trial-<n>/")
            if d["todo"] != 0:
                starting = getattr(self.executor, "proc", None) is not None and not getattr(
                    self.executor, "ready", True
                )
                if d["todo"] is None and d["timeout_s"]:
                    self.live.extra = f"stops after {d['timeout_s']:g} s"
                self.live.start(FORKSERVER_STARTING if starting else "sampling the first trial", total=d["todo"])
        elif kind == "launch":
            lim = " ".join(f"{k}={v}" for k, v in d["limits"].items())
            self.p(f"trial {d['number']:>3}: {lim} ...")
            rdir, spec, steps = Path(d["run_dir"]) if d.get("run_dir") else None, d.get("spec"), self.steps or 1
            status_of = ((lambda: run_status(rdir, steps, self.engine, spec.launch, self.executor))
                         if rdir is not None and spec is not None else None)
            self.live.begin(f"#{d['number']}", status_of)
        elif kind == "trial":
            if d["kind"] == "feasible":
                unit = d.get("unit", "")
                extra = (f" at the reference speed (measured {d['raw_value']:.4g} {unit})" if d.get("normalized")
                         and d.get("raw_value") is not None else "")
                self.p(f"trial {d['number']:>3}: {d['value']:.4g} {unit}{extra}")
                sign = 1 if self.direction == "minimize" else -1
                if self.best is None or sign * d["value"] < sign * self.best[0]:
                    self.best = (float(d["value"]), d["number"], unit)
            elif d["kind"] == "infeasible":
                self.p(f"trial {d['number']:>3}: INFEASIBLE ({d['failure_kind']}, constraint {d['constraint']:.3g}): "
                       f"{d['reason'][:160]}")
            else:
                self.p(f"trial {d['number']:>3}: FAILED ({d['failure_kind']}): {d['reason'][:160]}")
            if self.best is not None:
                self.live.extra = f"best so far {self.best[0]:.4g} {self.best[2]} (trial {self.best[1]})"
            self.live.finish()
            if self.live.total is not None and self.live.done >= self.live.total:
                self.live.set_status("writing the outputs (importance, plot) and the MLflow parent")
        elif kind == "confirm_start":
            lim = {r: " ".join(f"{k}={v}" for k, v in d["limits"][r].items()) for r in ("best", "other")}
            self.p(f"confirmation, {d['blocks']} interleaved block(s) (not trials): {d['labels']['best']} "
                   f"{lim['best']} vs {d['labels']['other']} {lim['other']}")
        elif kind == "confirm_launch":
            self.live.set_status(f"confirmation block {d['block'] + 1}/{d['blocks']}: {d['label']} run")
        elif kind == "confirm_run":
            what = (f"{d['value']:.4g} {d['unit']}" if d["status"] == "ok" else
                    f"FAILED ({d.get('failure_kind')}): {str(d.get('reason', ''))[:160]} (block left out)")
            self.p(f"confirm {d['block'] + 1}/{d['blocks']}: {d['label']}: {what}")
        elif kind == "warn":
            self.p(f"warning: {d['message']}")


def best_text(best: dict[str, Any], unit: str) -> str:
    """The best trial's objective in its units: the value with its name and, when speed-normalized, the
    reference probe time and the measured (raw) median."""
    txt = f"{best.get('objective_name') or 'objective'} = {best['value']:.4g} {unit}"
    if best.get("normalized"):
        txt += (
            f" (median over the timed steps at the study's reference speed: probe {best['reference_probe_s']:.4f} s); "
            f"measured median {best['raw_value']:.4g} {unit}"
        )
    elif best.get("raw_value") is not None:
        txt += " (measured median over the timed steps)"
    return txt


def print_result(out: TuneOutcome, settings: TuneSettings, view: ConsoleView) -> None:
    """Print the tune's result: trial counts, the best trial (value, limits, verl overrides, matrix fragment),
    parameter importance, the output files, where MLflow and optuna-dashboard show the study and, last, the
    confirmation's line (the best trial against the rule of thumb, :mod:`bench.tune.confirm`)."""
    s, summ = settings, out.summary
    c = summ.get("counts", {})
    view.p(f"\nstudy {s.study_name}: {c.get('feasible', 0)} feasible, {c.get('infeasible', 0)} infeasible, "
           f"{c.get('failed', 0)} failed, {c.get('interrupted', 0)} interrupted (ran {out.ran} now)")
    best = summ.get("best")
    if best:
        view.p(f"best: trial {best['trial']}, {best_text(best, s.unit)}")
        if best.get("note"):
            view.p(f"  note: {best['note']}")
        for k, v in best["limits"].items():
            view.p(f"  {k} = {v} tokens ({v / s.seq:.2f} x (P+R))")
        view.p("verl overrides (ready to paste):")
        for line in verl_overrides(best["limits"]):
            view.p(f"  {line}")
        view.p(f"matrix fragment: {summ['files']['fragment']}")
    else:
        view.p("no feasible trial yet: no best limits")
    imp = summ.get("importance")
    if imp:
        view.p("parameter importance (fANOVA): " + ", ".join(f"{k} {v:.2f}" for k, v in imp.items()))
    else:
        view.p(f"parameter importance: {summ.get('importance_note', 'n/a')}")
    if summ.get("files"):
        view.p(f"plot: {summ['files']['plot']}")
        view.p(f"trials: {summ['files']['trials']}")
    view.p(f"MLflow: {s.tracking_uri} (parent run {out.parent_run_id}); "
           f"dashboard: optuna-dashboard {redact(s.storage_url)}")
    conf = summ.get("confirmation")
    if conf and conf.get("line"):  # the last line: how sure the tune is (bench.tune.confirm)
        view.p(conf["line"])


def main(args: argparse.Namespace) -> int:
    """Tune; 0 when the study has a feasible best trial, 1 when not, 2 on bad input."""
    matrix = load_matrix(args.matrix)
    if matrix.stack_levels:  # a trial would run the harness's own stack whatever the level
        raise BenchError(f"{args.matrix}: factors.stack: tune does not search over stacks yet (allowed: a matrix "
                         "without the stack factor)")
    settings = resolve_settings(matrix, results=args.results, tracking_uri=args.tracking_uri, study=args.study,
                                storage=args.storage, n_trials=args.n_trials, timeout_s=args.timeout)
    spec = trial_spec(matrix, settings.cell, limits_of({k: d.low for k, d in settings.space.items()}, matrix.base),
                      settings.platform)
    get_engine(matrix.engine).preflight(matrix, [spec.launch], settings.platform)
    check_writable(args.results)
    executor = make_executor(args, matrix.engine, settings.platform)  # a Ray cluster is reached before any write
    if settings.storage_url == default_storage(args.results):
        Path(args.results).mkdir(parents=True, exist_ok=True)
    view = ConsoleView(executor=executor, steps=matrix.base.steps, engine=matrix.engine, direction=settings.direction)
    view.live.start(f"opening the Optuna storage and the MLflow store ({settings.tracking_uri})")
    try:
        out = Tuner(settings, executor=executor, on_event=view).run()
    finally:
        view.stop()
    print_result(out, settings, view)
    return 0 if out.summary.get("best") else 1


class Tune(Command, name="tune"):
    """``tune``: :func:`add_arguments`, :func:`main`."""

    setup_arguments, run = staticmethod(add_arguments), staticmethod(main)
