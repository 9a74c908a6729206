"""``run_bench.py tune MATRIX.yaml``: Optuna search of the dynamic-bsz token limits on real runs.

A trial = the fixed factor levels of the matrix's ``tune`` block (dynamic bsz on) + the sampled
``ppo_max_token_len_per_gpu`` / ``log_prob_max_token_len_per_gpu``. The harness builds the trial's
:class:`~bench.spec.plan.RunSpec` exactly as a sweep does (a copy of the matrix whose ``base`` carries the
limits and whose design is the one fixed cell, through :func:`bench.spec.plan.make_plan`), runs it with
:func:`bench.runner.execute_spec` into ``results/<matrix>/tune/<study>/trial-<n>/`` and takes the
objective from the run record: the run's value (:func:`bench.model.run_value`, the median over its
timed steps of the step time, minimized, or of the throughput, maximized; the same statistic a sweep
reports per run), speed-normalized when the run timed the machine-speed probe
(:meth:`Tuner.speed_normalized`, :mod:`bench.speed`; the tune block's ``normalize: false`` turns it
off): trials run minutes apart on a shared machine whose speed drifts by several percent. The objective
is named with its unit in Optuna (``study.set_metric_names``), MLflow and the outputs
(:attr:`TuneSettings.metric_name`); the best trial is reported with its measured median beside the
normalized value (:func:`bench.tune_report.best_summary`). A trial is one run: trials run one at a time
in the sampler's order (there is no run order to block).

How a run's outcome becomes a trial:

- ``ok`` -> COMPLETE with the objective value and constraint ``infeasible = 0``;
- ``infeasible`` (a limit below the longest sequence: the engine's ``failure.json``) or ``oom`` ->
  PRUNED with ``trial.set_constraint("infeasible", c)``, ``c = 1 + shortfall / (P+R)`` for a too-small
  limit and ``c = 1`` for out of memory, and the reason / failure kind / log tail as user attributes.
  TPE puts constraint-violating trials in its "bad" group, so it learns to avoid the region; a PRUNED
  trial has no value, so ``study.best_trial`` (COMPLETE trials only), the importance and the plots
  never see a made-up number. (A NaN/FAIL trial would be ignored by TPE, which then keeps probing the
  infeasible region: see tests/test_tune.py.)
- any other failure (crash, timeout, no metrics ...) -> FAIL with the reason and log tail kept; the tune
  goes on, except after ``bad_input`` (the engine refuses the matrix's settings whatever the limits):
  the study stops and the command exits 2 with the engine's reason.

Resuming: the same study name (default: the matrix name) in the same storage continues; ``n_trials`` is
the number of finished trials the study should hold, so an interrupted tune runs only the rest. Trials
left RUNNING by a killed harness are marked FAIL (``interrupted``) and not counted. A study refuses to
resume when the settings its values depend on (engine, platform, base, fixed levels, space, objective)
changed.

MLflow (experiment = matrix name): a parent run per study (its id kept as the study user attribute
``mlflow_parent_run_id`` and reused on resume), a child per trial: the sweep's per-step metrics and
summary (:func:`bench.tracking.records.log_record`) plus the trial number, both limits, the objective value, the
Optuna state and the constraint. The parent gets the outputs (overrides, matrix fragment, importance,
plot, trials table) as artifacts.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bench.errors import BenchError
from bench.executors import Executor
from bench.results import ResultsDir, atomic_write_json, check_writable, read_json
from bench.spec.loading import load_matrix
from bench.spec.matrix import ExplicitDesign, Matrix
from bench.spec.optimizations import FACTOR_KEYS, REGISTRY
from bench.spec.plan import RunSpec, detect_platform, make_plan
from bench.spec.tune_space import (
    OBJECTIVES,
    PARAMS,
    STUDY_NAME,
    IntDim,
    TuneBlock,
    limits_of,
    parse_tune,
    resolve_space,
    rule_of_thumb,
    seq_len,
    tune_fingerprint,
)
from bench.tune_report import CONSTRAINT, is_interrupted, verl_overrides, write_outputs

MLFLOW_MARK = "mlflow.json"
PARENT_ATTR = "mlflow_parent_run_id"
URI_ATTR = "mlflow_tracking_uri"
FP_ATTR = "bench_fingerprint"
SETTINGS_ATTR = "bench_settings"  # studies made before the settings were split into keys: one JSON value
#: prefix of the study user attributes that hold the settings a study's values depend on, one key each
SETTINGS_PREFIX = "setting."
INFEASIBLE_KINDS = ("infeasible", "oom")
LOG_TAIL_CHARS = 4000


class TrialFailed(Exception):
    """A trial whose run failed for a reason other than infeasibility (recorded FAIL, the tune goes on)."""


# --------------------------------------------------------------------------------------------------
# storage


def default_storage(results: Path) -> str:
    """``sqlite:///<results>/optuna.db``."""
    return f"sqlite:///{Path(results).as_posix()}/optuna.db"


def redact(url: str) -> str:
    """The storage URL without a password (for logs and MLflow tags)."""
    if url.startswith("journal:"):
        return url
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1] if "@" in url else url


def open_storage(url: str, where: str = "--storage") -> Any:
    """An Optuna storage: ``journal:PATH`` (journal file) or any SQLAlchemy URL (RDB).

    Raises:
        BenchError: the storage cannot be opened (bad URL, missing driver, unwritable/absent folder).
    """
    import optuna

    try:
        if url.startswith("journal:"):
            from optuna.storages import JournalStorage
            from optuna.storages.journal import JournalFileBackend

            path = Path(url.removeprefix("journal:").removeprefix("//"))
            if not path.parent.is_dir():
                raise OSError(f"folder {path.parent} does not exist")
            return JournalStorage(JournalFileBackend(str(path)))
        if "://" not in url:
            raise ValueError("not a URL (give e.g. sqlite:///results/optuna.db, postgresql://..., or journal:PATH)")
        return optuna.storages.RDBStorage(url, skip_table_creation=False)
    except BaseException as exc:  # sqlalchemy / driver import errors come in many classes
        if isinstance(exc, KeyboardInterrupt):
            raise
        msg = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise BenchError(f"{where} {redact(url)}: cannot open Optuna storage: {msg}") from None


# --------------------------------------------------------------------------------------------------
# one trial = one run spec


def fixed_cell(matrix: Matrix, block: TuneBlock) -> dict[str, int]:
    """The factor levels of every trial: ``tune.fixed``, else the matrix's first level (dynamic bsz on)."""
    cell = {k: matrix.factors.get(k, [REGISTRY[k].off])[0] for k in FACTOR_KEYS}
    cell.update(block.fixed)
    cell["dynamic_bsz"] = 1
    return cell


def trial_matrix(matrix: Matrix, cell: dict[str, int], limits: dict[str, int]) -> Matrix:
    """A copy of ``matrix`` whose ``base`` carries ``limits`` and whose design is the single ``cell``."""
    base = matrix.base.model_copy(update={PARAMS[k]: v for k, v in limits.items()})
    return matrix.model_copy(update={"base": base, "design": ExplicitDesign(type="explicit", cells=[dict(cell)]),
                                     "repeats": 1})


def trial_spec(matrix: Matrix, cell: dict[str, int], limits: dict[str, int], platform: str) -> RunSpec:
    """The :class:`RunSpec` of one trial, built by :func:`bench.spec.plan.make_plan` like a sweep's cell.

    Raises:
        BenchError: the fixed cell is invalid or excluded, or the engine refuses the settings.
    """
    plan = make_plan(trial_matrix(matrix, cell, limits), platform, strict=True)
    spec = plan.runs[0]
    if spec.levels.get("dynamic_bsz") != 1:
        why = spec.not_applicable.get("dynamic_bsz", "not applicable")
        raise BenchError(f"{matrix.source}: tune: dynamic_bsz is not applicable here ({why}): nothing to tune")
    return spec


#: study user attributes: the reference probe time (s) and kernel that trial objectives are normalized to
PROBE_REF, PROBE_SPEC = "speed_probe_ref_s", "speed_probe_spec"

#: the longest sequence in a failure message: verl's assert (``max_seq_len=N``) or the embedded engine's
_MAX_SEQ = re.compile(r"(?:max_seq_len\s*[=:]\s*(?:tensor\()?|longest sequence (?:of |\()?)(\d+)")


def constraint_of(rec: dict[str, Any], limits: dict[str, int], seq: int) -> float:
    """Constraint value (> 0 = infeasible) of a failed record of kind infeasible / oom.

    Too-small limit: ``1 + shortfall / (P+R)``, the shortfall measured against the longest sequence the
    engine reported (verl's ``max_seq_len=N`` or the embedded engine's "longest sequence of N"
    tokens in the reason or log), else against P+R, so TPE ranks a
    deeper violation worse. Out of memory: ``1`` (the threshold is unknown).
    """
    if rec.get("failure_kind") != "infeasible":
        return 1.0
    found = _MAX_SEQ.findall(f"{rec.get('reason', '')}\n{rec.get('log_tail', '')}")
    longest = int(found[-1]) if found else seq
    shortfall = max(0, longest - min(limits.values()))
    return 1.0 + shortfall / seq


# --------------------------------------------------------------------------------------------------
# the tuner


@dataclass
class TuneSettings:
    """Everything resolved from the matrix and the command line before anything is written."""

    matrix: Matrix
    block: TuneBlock
    platform: str
    space: dict[str, IntDim]
    notes: list[str]
    cell: dict[str, int]
    study_name: str
    storage_url: str
    storage_from: str
    n_trials: int | None
    timeout_s: float | None
    results: Path
    tracking_uri: str

    @property
    def objective_key(self) -> str:
        return OBJECTIVES[self.block.objective][0]

    @property
    def direction(self) -> str:
        return OBJECTIVES[self.block.objective][1]

    @property
    def unit(self) -> str:
        return OBJECTIVES[self.block.objective][2]

    @property
    def value_key(self) -> str:
        """The objective's key with its unit: ``step_time_s`` / ``throughput_tokens_per_s`` (prefix of the
        trial user attributes ``<key>_raw`` and ``<key>_normalized``)."""
        return {"step_time": "step_time_s", "throughput": "throughput_tokens_per_s"}[self.block.objective]

    @property
    def metric_name(self) -> str:
        """The objective's name in Optuna (``study.set_metric_names``, what optuna-dashboard shows), MLflow and
        the outputs, with its unit and whether it is speed-normalized: ``step_time_s (s, median, speed-normalized)``
        or ``step_time_s (s, median, raw)`` (throughput: ``tokens/s``). A trial without a probe keeps its raw
        value even when the block normalizes; its ``normalized`` attribute says which."""
        kind = "speed-normalized" if self.block.normalize else "raw"
        return f"{self.value_key} ({self.unit}, median, {kind})"

    @property
    def seq(self) -> int:
        return seq_len(self.matrix.base)

    @property
    def study_dir(self) -> Path:
        return Path(self.results) / self.matrix.name / "tune" / self.study_name

    def identity(self) -> dict[str, Any]:
        """What a study's values depend on (a resumed study must match)."""
        base = self.matrix.base.model_dump(mode="json", exclude={"ppo_max_token_len", "log_prob_max_token_len",
                                                                 "timeout_s"})
        return {"engine": self.matrix.engine, "platform": self.platform, "base": base, "cell": self.cell,
                "space": {k: vars(v) for k, v in self.space.items()}, "objective": self.block.objective,
                "normalize": self.block.normalize}


def resolve_settings(matrix: Matrix, *, results: Path, tracking_uri: str, study: str | None = None,
                     storage: str | None = None, n_trials: int | None = None, timeout_s: float | None = None,
                     platform: str | None = None) -> TuneSettings:
    """Validate the tune block and the command line; build one trial spec as a check. Writes nothing.

    Raises:
        BenchError: any bad input (one line).
    """
    block = parse_tune(matrix)
    src = matrix.source or "matrix"
    if platform is None:
        platform = detect_platform() if matrix.platform == "auto" else matrix.platform
    space, notes = resolve_space(block, matrix.base, src)
    cell = fixed_cell(matrix, block)
    name = study or block.study or matrix.name
    if not STUDY_NAME.match(name):
        raise BenchError(f"--study {name!r}: a study name is letters, digits, '_', '.', '-' (not starting with one)")
    n = n_trials if n_trials is not None else block.n_trials
    t = timeout_s if timeout_s is not None else block.timeout_s
    if n is not None and n < 1:
        raise BenchError(f"--n-trials {n}: must be >= 1")
    if t is not None and t <= 0:
        raise BenchError(f"--timeout {t:g}: must be > 0 seconds")
    if n is None and t is None and block.sampler.type != "grid":
        raise BenchError(f"{src}: tune: give n_trials and/or timeout_s (or --n-trials / --timeout)")
    if storage:
        url, url_from = storage, "--storage"
    elif block.storage:
        url, url_from = block.storage, f"{src}: tune.storage:"
    else:
        url, url_from = default_storage(results), "storage"
    settings = TuneSettings(matrix, block, platform, space, notes, cell, name, url, url_from, n, t,
                            Path(results), tracking_uri)
    # one real spec as a check: conflicts, exclusions, engine refusals surface now, before anything is written
    trial_spec(matrix, cell, limits_of({k: d.low for k, d in space.items()}, matrix.base), platform)
    return settings


@dataclass
class TuneOutcome:
    """What a tune invocation did."""

    study_name: str
    study_dir: Path
    parent_run_id: str | None
    ran: int
    summary: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def make_sampler(block: TuneBlock, space: dict[str, IntDim]) -> Any:
    import optuna

    s = block.sampler
    if s.type == "grid":
        return optuna.samplers.GridSampler({k: d.grid() for k, d in space.items()}, seed=s.seed)
    if s.type == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    return optuna.samplers.TPESampler(seed=s.seed, n_startup_trials=s.n_startup_trials,
                                      multivariate=s.multivariate)


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


class Tuner:
    """Runs a study for :class:`TuneSettings`.

    Args:
        settings: from :func:`resolve_settings`.
        executor: how runs are launched (default: a local subprocess; the CLI picks as ``run`` does: the
            fork server for embedded CPU runs, Ray with ``--ray-address``); closed at the end if it has ``close``.
        on_event: callback ``(kind, data)`` for the console (kinds: start, trial, warn, done).
    """

    def __init__(self, settings: TuneSettings, executor: Executor | None = None,
                 on_event: Callable[[str, dict[str, Any]], None] | None = None):
        from bench.executors import LocalExecutor

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
        ``failure_kind`` attribute is an interrupted one (:func:`bench.tune_report.is_interrupted`)."""
        import optuna

        S = optuna.trial.TrialState
        for t in study.get_trials(deepcopy=False, states=[S.RUNNING]):
            try:
                study.tell(t.number, state=S.FAIL, skip_if_finished=True)
            except Exception as exc:  # another process finished it meanwhile
                self.on_event("warn", {"message": f"could not mark stale trial {t.number} failed: {exc}"})

    # -- MLflow --------------------------------------------------------------------------------
    def open_parent(self, study: Any) -> None:
        from bench.tracking import Tracker, git_commit, versions

        s = self.s
        if self.tracker is None:
            self.tracker = Tracker(s.tracking_uri, s.matrix.name)
        pid = study.user_attrs.get(PARENT_ATTR)
        if pid and study.user_attrs.get(URI_ATTR) == s.tracking_uri and self.tracker.parent_alive(pid):
            self.parent_id = pid
            try:
                self.tracker.client.update_run(pid, status="RUNNING")
            except Exception:
                pass
            return
        tags = {"bench.kind": "tune", "optuna.study": s.study_name, "optuna.storage": redact(s.storage_url),
                "engine": s.matrix.engine, "platform": s.platform, "git_commit": git_commit(),
                "matrix_file": s.matrix.source, **{f"version.{k}": v for k, v in versions().items()}}
        params = {
            "objective": s.block.objective,
            "direction": s.direction,
            "sampler": s.block.sampler.type,
            "sampler.seed": s.block.sampler.seed,
            "seq_len_P_plus_R": s.seq,
            **{f"space.{k}": d.describe() for k, d in s.space.items()},
            **{f"fixed.{k}": v for k, v in s.cell.items()},
            **{f"base.{k}": v for k, v in s.matrix.base.model_dump(exclude={"env", "overrides", "embedded"}).items()},
        }
        self.parent_id = self.tracker.start_parent(f"tune-{s.study_name}", tags, params)
        study.set_user_attr(PARENT_ATTR, self.parent_id)
        study.set_user_attr(URI_ATTR, s.tracking_uri)

    def log_trial(self, number: int, state: str, value: float | None, constraint: float | None,
                  limits: dict[str, int], spec: RunSpec, rec: dict[str, Any], rdir: Path) -> str | None:
        """Log one trial as an MLflow child of the study's parent (once: a mark file in the trial folder)."""
        from mlflow.entities import Metric, Param, RunTag

        from bench.tracking.records import log_record

        mark = read_json(rdir / MLFLOW_MARK)
        if self.tracker is None or (mark and mark.get("tracking_uri") == self.s.tracking_uri):
            return None
        try:
            rid = log_record(self.tracker, self.parent_id, spec, rec, rdir, self.s.matrix)
            now = int(time.time() * 1000)
            metrics = [Metric("constraint", float(constraint), now, 0)] if constraint is not None else []
            if value is not None:
                metrics.append(Metric("objective", float(value), now, 0))
            params = [Param("trial", str(number)), Param("objective_name", self.s.block.objective),
                      *[Param(k, str(v)) for k, v in limits.items()]]
            tags = [
                RunTag("mlflow.runName", f"trial-{number}"),
                RunTag("bench.kind", "trial"),
                RunTag("optuna.study", self.s.study_name),
                RunTag("optuna.trial_number", str(number)),
                RunTag("optuna.state", state),
                RunTag("infeasible", str(bool(constraint and constraint > 0)).lower()),
            ]
            self.tracker.client.log_batch(rid, metrics=metrics, params=params, tags=tags)
            if value is not None:
                self.tracker.client.log_batch(
                    self.parent_id, metrics=[Metric("trial_value", float(value), now, number)]
                )
        except Exception as exc:
            self.on_event("warn", {"message": f"MLflow logging of trial {number} failed: {exc}"})
            return None
        atomic_write_json(rdir / MLFLOW_MARK, {"run_id": rid, "tracking_uri": self.s.tracking_uri})
        return rid

    def catch_up_mlflow(self, study: Any) -> None:
        """Log finished trials whose run folder has no MLflow mark (the store was down, or a kill)."""
        import optuna

        S = optuna.trial.TrialState
        for t in study.get_trials(deepcopy=False, states=[S.COMPLETE, S.PRUNED, S.FAIL]):
            rdir = t.user_attrs.get("run_dir")
            if not rdir:
                continue
            rdir = self.s.study_dir / rdir
            rec, spec, mark = (read_json(rdir / n) for n in ("record.json", "spec.json", MLFLOW_MARK))
            if rec is None or spec is None or (mark and mark.get("tracking_uri") == self.s.tracking_uri):
                continue
            limits = {k: int(t.user_attrs.get(k, t.params.get(k, 0))) for k in PARAMS}
            self.log_trial(t.number, t.state.name, t.value if t.values else None,
                           t.constraints.get(CONSTRAINT), limits, RunSpec(**spec), rec, rdir)

    # -- the objective -------------------------------------------------------------------------
    def speed_normalized(self, trial: Any, rec: dict[str, Any], raw: float) -> float:
        """The trial's objective corrected for the machine's speed (:mod:`bench.speed`), or ``raw``.

        Median over the timed steps of ``step_time * ref / probe`` (throughput: ``* probe / ref``), with
        ``ref`` the median probe time of the study's first probed trial (study user attribute
        ``speed_probe_ref_s``), so every trial is expressed at the same machine speed. Used when the tune
        block has ``normalize: true`` (default) and the run timed the speed probe at every timed step
        with the study's probe kernel; the raw median is kept as the trial's ``raw_value`` attribute.
        """
        import numpy as np

        from bench.analyze.snapshot import record_samples
        from bench.speed import normalized_median, probe_spec

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
        import optuna

        from bench.runner import execute_spec

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
        from bench.analyze.snapshot import record_samples
        from bench.model import run_value

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
        import optuna

        s = self.s
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        self.storage = open_storage(s.storage_url, s.storage_from)  # before anything is written
        from bench.tracking import Tracker

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
            try:
                if todo is None or todo > 0:
                    study.optimize(self.objective, n_trials=todo, timeout=s.timeout_s, catch=(TrialFailed,),
                                   gc_after_trial=False)
            except KeyboardInterrupt:
                status = "KILLED"
                raise
            finally:
                close = getattr(self.executor, "close", None)  # e.g. the fork server of embedded CPU runs
                if close is not None:
                    close()
                ran = sum(1 for t in study.get_trials(deepcopy=False)[before:] if t.state.is_finished())
                summary = self.finish(study, "FAILED" if self.bad_input else status)
        if self.bad_input:
            raise BenchError(f"{s.matrix.source}: {self.bad_input} (fix the matrix; the study keeps its trials)")
        return TuneOutcome(s.study_name, s.study_dir, self.parent_id, ran, summary, s.notes)

    def header(self) -> str:
        s = self.s
        return (f"tune of {s.matrix.name} ({s.matrix.engine}, {s.platform}), study {s.study_name}, "
                f"objective {s.block.objective} ({s.direction})\nP+R = {s.seq} tokens; fixed levels: "
                + " ".join(f"{k}={v}" for k, v in s.cell.items()))

    def finish(self, study: Any, status: str) -> dict[str, Any]:
        """Write the outputs and log them on the MLflow parent (best effort when interrupted)."""
        from mlflow.entities import Metric

        s = self.s
        try:
            summary = write_outputs(s.study_dir, study, space=s.space, objective=s.block.objective,
                                    objective_key=s.objective_key, unit=s.unit,
                                    limits_of_trial=lambda t: {k: int(t.user_attrs.get(k, t.params.get(k)))
                                                               for k in PARAMS},
                                    header=self.header(),
                                    reference={k: s.matrix.base.context()[f] for k, f in PARAMS.items()},
                                    metric_name=s.metric_name)
        except Exception:
            if status == "KILLED":
                return {}
            raise
        if self.tracker is not None and self.parent_id:
            try:
                now = int(time.time() * 1000)
                c = summary["counts"]
                ms = [Metric(f"trials_{k}", float(v), now, 0) for k, v in c.items()]
                best = summary["best"]
                if best:
                    ms.append(Metric("best_value", float(best["value"]), now, 0))
                    if best.get("raw_value") is not None:
                        ms.append(Metric("best_raw_value", float(best["raw_value"]), now, 0))
                    for k, v in best["limits"].items():
                        ms.append(Metric(f"best.{k}", float(v), now, 0))
                for k, v in (summary["importance"] or {}).items():
                    ms.append(Metric(f"importance.{k}", float(v), now, 0))
                self.tracker.client.log_batch(self.parent_id, metrics=ms)
                self.tracker.client.set_tag(self.parent_id, "objective_name", s.metric_name)
                if best:
                    self.tracker.client.set_tag(self.parent_id, "best_trial", str(best["trial"]))
                    if best.get("note"):
                        self.tracker.client.set_tag(self.parent_id, "best_note", best["note"][:4000])
                    self.tracker.client.set_tag(
                        self.parent_id, "best_overrides", " ".join(verl_overrides(best["limits"]))
                    )
                for p in summary["files"].values():
                    if Path(p).is_file():
                        self.tracker.client.log_artifact(self.parent_id, p)
                self.tracker.client.set_terminated(self.parent_id, status=status)
            except Exception as exc:
                self.on_event("warn", {"message": f"MLflow parent update failed: {exc}"})
        return summary


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{prefix + "a.b": 1}``: one key per leaf (lists stay values)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def study_settings(attrs: dict[str, Any]) -> dict[str, Any]:
    """The flattened settings a study was made with (its ``setting.*`` user attributes, or the single
    ``bench_settings`` value of an older study); keys without the prefix."""
    flat = {k[len(SETTINGS_PREFIX):]: v for k, v in attrs.items() if k.startswith(SETTINGS_PREFIX)}
    return flat or flatten(attrs.get(SETTINGS_ATTR) or {})


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys where two JSON-like values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            out += _diff(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else str(k))
        return out
    return (
        []
        if json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)
        else [prefix or "(root)"]
    )


# --------------------------------------------------------------------------------------------------
# CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``tune``."""
    p.add_argument("matrix", type=Path, help="matrix YAML file with a 'tune' block (e.g. matrix/tune_dynamic_bsz.yaml)")
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
    p.add_argument("--spawn", action="store_true",
                   help="start every run in a fresh interpreter (default on CPU for the embedded engine: fork "
                        "each run from a warm server, as `run`)")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="run each trial as a job on this existing Ray cluster (as `run --ray-address`)")


class ConsoleView:
    """One line per trial, plus the start and the result, under a live progress line
    (:class:`bench.progress.LiveProgress`: trials done/total, ETA from the measured trial times, best so far,
    and what the current trial's run is doing).

    Args:
        out: a file to print to instead of the console (plain lines, no live display; for tests).
        executor: the tune's executor (a fork server still importing is shown as such).
        steps: GRPO steps per trial run (``base.steps``); engine: the matrix's engine.
        direction: ``minimize`` / ``maximize`` (which value is the best so far).
    """

    def __init__(self, out=None, executor: Any = None, steps: int = 0, engine: str = "", direction: str = "minimize"):
        from rich.console import Console

        from bench.progress import LiveProgress, make_console

        self.out = out
        console = make_console() if out is None else Console(file=out, force_terminal=False, no_color=True,
                                                                 width=160, highlight=False, soft_wrap=True)
        self.live = LiveProgress(console, noun="trial")
        self.executor, self.steps, self.engine, self.direction = executor, steps, engine, direction
        self.best: tuple[float, int, str] | None = None

    def p(self, text: str = "") -> None:
        self.live.print(text, markup=False, highlight=False, soft_wrap=True)

    def stop(self) -> None:
        self.live.stop()

    def __call__(self, kind: str, d: dict[str, Any]) -> None:
        from bench.progress import FORKSERVER_STARTING, run_status

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


def main(args: argparse.Namespace) -> int:
    """Tune; 0 when the study has a feasible best trial, 1 when not, 2 on bad input."""
    from bench.engines.base import get_engine

    matrix = load_matrix(args.matrix)
    settings = resolve_settings(matrix, results=args.results, tracking_uri=args.tracking_uri, study=args.study,
                                storage=args.storage, n_trials=args.n_trials, timeout_s=args.timeout)
    spec = trial_spec(matrix, settings.cell, limits_of({k: d.low for k, d in settings.space.items()}, matrix.base),
                      settings.platform)
    get_engine(matrix.engine).preflight(matrix, [spec.launch], settings.platform)
    check_writable(args.results)
    if settings.storage_url == default_storage(args.results):
        Path(args.results).mkdir(parents=True, exist_ok=True)
    from bench.cli_run import make_executor

    executor = make_executor(args, matrix.engine, settings.platform)
    view = ConsoleView(executor=executor, steps=matrix.base.steps, engine=matrix.engine, direction=settings.direction)
    view.live.start(f"opening the Optuna storage and the MLflow store ({settings.tracking_uri})")
    try:
        out = Tuner(settings, executor=executor, on_event=view).run()
    finally:
        view.stop()
    print_result(out, settings, view)
    return 0 if out.summary.get("best") else 1
