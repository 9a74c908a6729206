"""The tuner: runs an Optuna study of a :class:`~bench.tune.settings.TuneSettings` (public Optuna API only),
one trial = one run (:func:`bench.execution.runner.execute_spec`), its outcome told to the study as described in
:mod:`bench.tune`; MLflow: :class:`bench.tune.tracking.TuneTracking`."""

from __future__ import annotations

import math
from typing import Any, Callable

import bench.tune.confirm as C
from bench.core.errors import BenchError
from bench.core.files import atomic_write_json, read_json
from bench.core.inputs import check_numbers
from bench.execution.executors import Executor, LocalExecutor
from bench.execution.runner import execute_spec
from bench.records.figures import run_value
from bench.records.results import ResultsDir
from bench.records.snapshot import record_samples
from bench.records.speed import normalized_median, probe_spec
from bench.tracking import Tracker
from bench.tune.report import CONSTRAINT, best_trial, is_interrupted, write_outputs
from bench.tune.settings import TuneOutcome, TuneSettings, make_sampler
from bench.tune.space import PARAMS, limits_of, rule_of_thumb, tune_fingerprint
from bench.tune.storage import FP_ATTR, SETTINGS_PREFIX, _diff, flatten, open_storage, redact, study_settings
from bench.tune.tracking import TuneTracking
from bench.tune.trial import INFEASIBLE_KINDS, LOG_TAIL_CHARS, TrialFailed, constraint_of, trial_spec

#: study user attributes: the reference probe time (s) and kernel that trial objectives are normalized to
PROBE_REF, PROBE_SPEC = "speed_probe_ref_s", "speed_probe_spec"


def _counted(t: Any) -> bool:
    import optuna

    S = optuna.trial.TrialState
    return t.state in (S.COMPLETE, S.PRUNED) or (t.state == S.FAIL and not is_interrupted(t))


def _done_points(trials: list[Any]) -> set[tuple]:
    """Distinct parameter points of the trials that count as finished."""
    return {tuple(sorted(t.params.items())) for t in trials if _counted(t)}


def _finished(trials: list[Any]) -> int:
    """Trials that count toward ``n_trials``: COMPLETE, PRUNED and FAIL except interrupted ones."""
    return sum(1 for t in trials if _counted(t))


class Tuner(TuneTracking):
    """Runs a study for :class:`TuneSettings`.

    Args:
        settings: from :func:`resolve_settings`.
        executor: how runs are launched (default: a local subprocess; the CLI picks as ``run`` does: the
            fork server for embedded CPU runs, Ray with ``--ray-address``); closed at the end if it has ``close``.
        on_event: callback ``(kind, data)`` for the console (kinds: start, trial, warn, done).
    """

    def __init__(self, settings: TuneSettings, executor: Executor | None = None,
                 on_event: Callable[[str, dict[str, Any]], None] | None = None):
        self.s = settings
        self.executor = executor or LocalExecutor()
        self.on_event = on_event or (lambda kind, data: None)
        self.tracker = None
        self.parent_id: str | None = None
        self.storage: Any = None
        self.bad_input: str | None = None

    # -- study ---------------------------------------------------------------------------------
    def open_study(self) -> Any:
        """Create or load the study; refuse one created from different settings; fail stale RUNNING trials."""
        import optuna

        s = self.s
        storage = self.storage if self.storage is not None else open_storage(s.storage_url, s.storage_from)
        ident = s.identity()
        fp = tune_fingerprint(ident)
        try:
            study = optuna.load_study(study_name=s.study_name, storage=storage,
                                      sampler=make_sampler(s.block, s.space))
            resumed = True
        except KeyError:
            study = optuna.create_study(study_name=s.study_name, storage=storage, direction=s.direction,
                                        sampler=make_sampler(s.block, s.space))
            study.set_user_attr(FP_ATTR, fp)
            for k, v in flatten(ident, SETTINGS_PREFIX).items():
                study.set_user_attr(k, v)
            study.set_user_attr("matrix", s.matrix.name)
            resumed = False
        if resumed:
            old = study.user_attrs.get(FP_ATTR)
            if old != fp:
                prev = study_settings(study.user_attrs)
                changed = sorted({*_diff(prev, flatten(ident))}) or ["(settings unknown: not a bench study)"]
                raise BenchError(
                    f"--study {s.study_name}: the study in {redact(s.storage_url)} was made with other settings "
                    f"(changed: {', '.join(changed[:6])}); resume with the same matrix, or give --study NEW_NAME")
        if study.metric_names != [s.metric_name]:  # also names a study made before the objective had a name
            import warnings

            with warnings.catch_warnings():  # "experimental" since Optuna 3.2; what optuna-dashboard reads
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names([s.metric_name])
        for k, v in {"objective.name": s.metric_name, "objective.unit": s.unit, "objective.direction": s.direction,
                     "objective.statistic": "median over the timed steps of the trial's run",
                     "objective.speed_normalized": s.block.normalize}.items():
            if study.user_attrs.get(k) != v:
                study.set_user_attr(k, v)
        self._fail_stale(study)
        return study, resumed

    def _requeue_interrupted(self, study: Any, trials: list[Any]) -> None:
        """Run the points of interrupted trials again first (unless a finished trial covers them)."""
        import optuna

        done = _done_points(trials)
        waiting = {tuple(sorted(t.params.items())) for t in trials if t.state == optuna.trial.TrialState.WAITING}
        for t in trials:
            point = tuple(sorted(t.params.items()))
            if is_interrupted(t) and point and point not in done and point not in waiting:
                study.enqueue_trial(dict(t.params), user_attrs={"rerun_of": t.number})
                waiting.add(point)

    def _fail_stale(self, study: Any) -> None:
        """Mark trials a killed harness left RUNNING as FAIL (``study.tell``): a FAIL trial without a
        ``failure_kind`` attribute is an interrupted one (:func:`bench.tune.report.is_interrupted`)."""
        import optuna

        S = optuna.trial.TrialState
        for t in study.get_trials(deepcopy=False, states=[S.RUNNING]):
            try:
                study.tell(t.number, state=S.FAIL, skip_if_finished=True)
            except Exception as exc:  # another process finished it meanwhile
                self.on_event("warn", {"message": f"could not mark stale trial {t.number} failed: {exc}"})

    # -- the objective -------------------------------------------------------------------------
    def speed_normalized(self, trial: Any, rec: dict[str, Any], raw: float) -> float:
        """The trial's objective corrected for the machine's speed (:mod:`bench.records.speed`), or ``raw``.

        Median over the timed steps of ``step_time * ref / probe`` (throughput: ``* probe / ref``), with
        ``ref`` the median probe time of the study's first probed trial (study user attribute
        ``speed_probe_ref_s``), so every trial is expressed at the same machine speed. Used when the tune
        block has ``normalize: true`` (default) and the run timed the speed probe at every timed step
        with the study's probe kernel; the raw median is kept as the trial's ``raw_value`` attribute.
        """
        import numpy as np

        trial.set_user_attr("raw_value", raw)
        trial.set_user_attr(f"{self.s.value_key}_raw", raw)
        trial.set_user_attr("normalized", False)
        if not self.s.block.normalize:
            return raw
        smp = record_samples(rec)
        xs, ps = smp[self.s.block.objective], smp["speed_probe"]
        kernel = probe_spec(rec)
        if not ps or len(ps) != len(xs) or kernel is None:
            return raw
        attrs = trial.study.user_attrs
        ref, ref_kernel = attrs.get(PROBE_REF), attrs.get(PROBE_SPEC)
        if ref is None:
            ref, ref_kernel = float(np.median(ps)), kernel
            trial.study.set_user_attr(PROBE_REF, ref)
            trial.study.set_user_attr(PROBE_SPEC, kernel)
        if kernel != ref_kernel:
            self.on_event("warn", {"message": f"trial {trial.number}: probe kernel {kernel} differs from the study's "
                                              f"{ref_kernel}: raw objective used"})
            return raw
        value = normalized_median(xs, ps, float(ref), self.s.block.objective)
        trial.set_user_attr("speed_probe_median_s", float(np.median(ps)))
        trial.set_user_attr("reference_probe_s", float(ref))
        trial.set_user_attr(f"{self.s.value_key}_normalized", value)
        trial.set_user_attr("normalized", True)
        return value

    def objective(self, trial: Any) -> float:
        """One trial: sample the limits, run the trial's spec, log it; returns the objective (s or tokens/s).

        Raises:
            optuna.TrialPruned: the run was infeasible (limit too small, out of memory); constraint set.
            TrialFailed: the run failed otherwise (FAIL; after ``bad_input`` the study is stopped).
        """
        import optuna

        s = self.s
        params = {name: trial.suggest_int(name, d.low, d.high, step=d.step, log=d.log) for name, d in s.space.items()}
        limits = limits_of(params, s.matrix.base)
        for k, v in limits.items():
            trial.set_user_attr(k, v)
        rel = f"trial-{trial.number}"
        rdir = s.study_dir / rel
        trial.set_user_attr("run_dir", rel)
        spec = trial_spec(s.matrix, s.cell, limits, s.platform)
        trial.set_user_attr("cell_id", spec.cell_id)
        self.on_event("launch", {"number": trial.number, "limits": limits, "run_dir": str(rdir), "spec": spec})
        try:
            rec = execute_spec(spec, rdir, 0, self.executor, s.matrix.base.warmup_steps)
        except KeyboardInterrupt:
            trial.set_user_attr("interrupted", True)
            trial.set_user_attr("reason", "interrupted by the user")
            raise
        atomic_write_json(rdir / "spec.json", spec.model_dump(mode="json"))
        atomic_write_json(rdir / "trial.json", {"study": s.study_name, "number": trial.number, "limits": limits,
                                                "storage": redact(s.storage_url)})
        value = run_value(record_samples(rec)[s.block.objective]) if rec["status"] == "ok" else None
        if rec["status"] == "ok" and value is not None:
            value = self.speed_normalized(trial, rec, float(value))
            trial.set_constraint(CONSTRAINT, 0.0)
            self.log_trial(trial.number, "COMPLETE", value, 0.0, limits, spec, rec, rdir)
            self.on_event("trial", {"number": trial.number, "limits": limits, "kind": "feasible", "value": value,
                                    "raw_value": trial.user_attrs.get("raw_value"),
                                    "normalized": bool(trial.user_attrs.get("normalized")), "unit": s.unit})
            return float(value)
        kind = rec.get("failure_kind") or "no_metrics"
        reason = rec.get("reason") or f"the run's summary has no {s.objective_key}"
        trial.set_user_attr("failure_kind", kind)
        trial.set_user_attr("reason", reason[:2000])
        trial.set_user_attr("log_tail", (rec.get("log_tail") or "")[-LOG_TAIL_CHARS:])
        if kind in INFEASIBLE_KINDS:
            c = constraint_of(rec, limits, s.seq)
            trial.set_constraint(CONSTRAINT, c)
            self.log_trial(trial.number, "PRUNED", None, c, limits, spec, rec, rdir)
            self.on_event("trial", {"number": trial.number, "limits": limits, "kind": "infeasible",
                                    "failure_kind": kind, "reason": reason, "constraint": c})
            raise optuna.TrialPruned(f"infeasible ({kind}): {reason}")
        self.log_trial(trial.number, "FAIL", None, None, limits, spec, rec, rdir)
        self.on_event("trial", {"number": trial.number, "limits": limits, "kind": "failed", "failure_kind": kind,
                                "reason": reason})
        if kind == "bad_input":  # the engine refuses the matrix's settings: every trial would fail alike
            self.bad_input = f"trial {trial.number}: the engine refused the settings: {reason.splitlines()[0][:300]}"
            trial.study.stop()
        raise TrialFailed(f"{kind}: {reason}")

    # -- run -----------------------------------------------------------------------------------
    def run(self) -> TuneOutcome:
        """Open (or resume) the study under the results lock, run the trials still to do, write the outputs.

        Raises:
            BenchError: bad input (another study's settings, a storage that cannot be opened, the engine
                refusing the settings).
        """
        import optuna

        s = self.s
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        self.storage = open_storage(s.storage_url, s.storage_from)  # before anything is written
        self.tracker = Tracker(s.tracking_uri, s.matrix.name)  # a bad tracking URI fails before the study exists
        rd = ResultsDir(s.results, s.matrix.name)
        with rd.lock():
            study, resumed = self.open_study()
            s.study_dir.mkdir(parents=True, exist_ok=True)
            self.open_parent(study)
            self.catch_up_mlflow(study)
            trials = study.get_trials(deepcopy=False)
            before = len(trials)
            done = _finished(trials)
            todo = None if s.n_trials is None else max(0, s.n_trials - done)
            if s.block.sampler.type == "grid":
                left = math.prod(len(d.grid()) for d in s.space.values()) - len(_done_points(trials))
                todo = left if todo is None else min(todo, left)
            elif not resumed and s.block.start_at_rule_of_thumb:
                study.enqueue_trial(rule_of_thumb(s.space, s.matrix.base), skip_if_exists=True)
            if todo is None or todo > 0:
                self._requeue_interrupted(study, trials)
            self.on_event("start", {"study": s.study_name, "resumed": resumed, "finished": done, "todo": todo,
                                    "timeout_s": s.timeout_s, "study_dir": str(s.study_dir),
                                    "storage": redact(s.storage_url), "space": s.space, "notes": s.notes,
                                    "cell": s.cell, "parent_run_id": self.parent_id})
            status = "FINISHED"
            confirmation = None
            try:
                if todo is None or todo > 0:
                    study.optimize(self.objective, n_trials=todo, timeout=s.timeout_s, catch=(TrialFailed,),
                                   gc_after_trial=False)
                if not self.bad_input and s.confirm_blocks > 0:
                    ran_now = sum(1 for t in study.get_trials(deepcopy=False)[before:] if t.state.is_finished())
                    try:
                        confirmation = self.confirm(study, reuse=ran_now == 0)
                    except Exception as exc:  # the confirmation never costs the tune its trials
                        self.on_event("warn", {"message": f"the confirmation failed: {type(exc).__name__}: {exc}"})
                        confirmation = {"error": f"{type(exc).__name__}: {exc}"[:2000],
                                        "line": f"confirmation failed ({type(exc).__name__}: {exc}): not judged"}
            except KeyboardInterrupt:
                status = "KILLED"
                raise
            finally:
                close = getattr(self.executor, "close", None)  # e.g. the fork server of embedded CPU runs
                if close is not None:
                    close()
                ran = sum(1 for t in study.get_trials(deepcopy=False)[before:] if t.state.is_finished())
                summary = self.finish(study, "FAILED" if self.bad_input else status, confirmation)
        if self.bad_input:
            raise BenchError(f"{s.matrix.source}: {self.bad_input} (fix the matrix; the study keeps its trials)")
        return TuneOutcome(s.study_name, s.study_dir, self.parent_id, ran, summary, s.notes)

    def header(self) -> str:
        """Two lines naming the tune (matrix, engine, platform, study, objective, P+R, fixed levels)."""
        s = self.s
        return (f"tune of {s.matrix.name} ({s.matrix.engine}, {s.platform}), study {s.study_name}, "
                f"objective {s.block.objective} ({s.direction})\nP+R = {s.seq} tokens; fixed levels: "
                + " ".join(f"{k}={v}" for k, v in s.cell.items()))

    @staticmethod
    def limits_of_trial(t: Any) -> dict[str, int]:
        """Both limits of a finished trial, tokens."""
        return {k: int(t.user_attrs.get(k, t.params.get(k))) for k in PARAMS}

    # -- the confirmation (bench.tune.confirm) ------------------------------------------------
    def confirm(self, study: Any, reuse: bool = False) -> dict[str, Any] | None:
        """The confirmation of the best trial (:mod:`bench.tune.confirm`): ``confirm_blocks`` interleaved blocks
        of one run of the best trial's limits and one of the rule of thumb's (or, when the best is the rule of
        thumb, the runner-up's), run like trials but not told to the study; ``None`` without a feasible trial.
        ``reuse``: keep the study's last confirmation when it compared the same limits with as many blocks
        (a resumed tune that ran no trial). Also written to ``<study>/confirmation.json``."""
        s = self.s
        best = best_trial(study)
        if best is None:
            return None
        rot = limits_of(rule_of_thumb(s.space, s.matrix.base), s.matrix.base)
        what = C.plan(best, study.get_trials(deepcopy=False), rot, self.limits_of_trial, s.direction)
        what["blocks_requested"] = s.confirm_blocks
        path = s.study_dir / C.FILE
        if "skipped" in what:
            atomic_write_json(path, what)
            return what
        old = read_json(path) if reuse else None
        try:  # a hand-edited or damaged confirmation (a NaN ratio) is computed again, never shown
            check_numbers(old, str(path), signed=("*",))
        except BenchError:
            old = None
        if old and all(old.get(k) == what[k] for k in ("best_trial", "best_limits", "other_limits",
                                                       "blocks_requested")) and "line" in old:
            return old
        import shutil

        folder = s.study_dir / C.FOLDER
        if folder.exists():
            shutil.rmtree(folder)
        lims = {"best": what["best_limits"], "other": what["other_limits"]}
        label = {"best": f"best (trial {best.number})",
                 "other": "rule of thumb" if what["against"] == "rule_of_thumb"
                 else f"runner-up (trial {what['other_trial']})"}
        orders = C.block_orders(s.confirm_blocks, s.block.sampler.seed)
        self.on_event("confirm_start", {"lead": what["lead"], "blocks": s.confirm_blocks, "limits": lims,
                                        "labels": label})
        runs: list[dict[str, Any]] = []
        values: dict[str, list[float | None]] = {"best": [], "other": []}
        for b, order in enumerate(orders):
            for pos, role in enumerate(order):
                rel = f"{C.FOLDER}/block-{b}-{role}"
                rdir = s.study_dir / rel
                run = {"block": b, "position": pos, "role": role, "label": label[role], "limits": lims[role],
                       "run_dir": rel, "status": "failed", "value": None}
                self.on_event("confirm_launch", {**run, "blocks": s.confirm_blocks})
                try:
                    spec = trial_spec(s.matrix, s.cell, lims[role], s.platform)
                    rec = execute_spec(spec, rdir, 0, self.executor, s.matrix.base.warmup_steps)
                    atomic_write_json(rdir / "spec.json", spec.model_dump(mode="json"))
                    value = run_value(record_samples(rec)[s.block.objective]) if rec["status"] == "ok" else None
                    if value is not None and math.isfinite(float(value)) and float(value) > 0:
                        run.update(status="ok", value=float(value))
                    else:
                        run.update(failure_kind=rec.get("failure_kind") or "no_metrics",
                                   reason=(rec.get("reason") or f"the run has no {s.objective_key}")[:2000])
                except Exception as exc:  # never crash the tune: the run is recorded failed, its block left out
                    run.update(failure_kind="error", reason=f"{type(exc).__name__}: {exc}"[:2000])
                runs.append(run)
                values[role].append(run["value"])
                self.on_event("confirm_run", {**run, "blocks": s.confirm_blocks, "unit": s.unit})
        res = C.compare(values["best"], values["other"], s.direction)
        complete = [b for b in range(len(orders)) if values["best"][b] is not None and values["other"][b] is not None]
        out = {**what, **res, "complete_blocks": complete, "runs": runs,
               "run_value": f"median over the timed steps of {s.value_key} ({s.unit}), raw",
               "ratio": ("log(best / other) per block" if s.direction == "minimize" else
                         "log(other / best) per block (throughput: negative = the best is faster)"),
               "line": C.describe(res, what["lead"], s.confirm_blocks)}
        atomic_write_json(path, out)
        return out

    def finish(self, study: Any, status: str, confirmation: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write the outputs and log them on the MLflow parent (best effort when interrupted)."""
        s = self.s
        try:
            summary = write_outputs(s.study_dir, study, space=s.space, objective=s.block.objective,
                                    objective_key=s.objective_key, unit=s.unit,
                                    limits_of_trial=self.limits_of_trial,
                                    header=self.header(),
                                    reference={k: s.matrix.base.context()[f] for k, f in PARAMS.items()},
                                    metric_name=s.metric_name, confirmation=confirmation)
        except Exception:
            if status == "KILLED":
                return {}
            raise
        self.log_study_end(summary, status)
        return summary
