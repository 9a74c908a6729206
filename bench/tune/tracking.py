"""The MLflow side of a tune (:class:`TuneTracking`, mixed into :class:`bench.tune.tuner.Tuner`): a parent run
per study (its id kept in the study's user attributes and reused on resume), a child run per trial (the sweep's
run record, :func:`bench.tracking.records.log_record`, plus the trial's number, limits, objective, state and
constraint), trials the store missed logged later, and the study's outputs on the parent at the end."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.core.files import atomic_write_json, read_json
from bench.spec.matrix import base_params
from bench.spec.plan import RunSpec
from bench.tracking import Tracker, git_commit, versions
from bench.tracking.records import log_record
from bench.tune.report import CONSTRAINT, verl_overrides
from bench.tune.space import PARAMS
from bench.tune.storage import redact

if TYPE_CHECKING:
    from bench.tracking import Tracker
    from bench.tune.settings import TuneSettings

#: marker file of a trial folder whose run is logged in MLflow (``run_id``, ``tracking_uri``)
MLFLOW_MARK = "mlflow.json"
#: study user attributes: the MLflow parent run's id and the tracking URI it lives in
PARENT_ATTR = "mlflow_parent_run_id"
URI_ATTR = "mlflow_tracking_uri"


class TuneTracking:
    """MLflow logging of a :class:`bench.tune.tuner.Tuner` (attributes ``s``: its settings, ``tracker``,
    ``parent_id``, ``on_event``)."""

    s: TuneSettings
    tracker: Tracker | None
    parent_id: str | None
    on_event: Any

    def open_parent(self, study: Any) -> None:
        """Reuse the study's MLflow parent run (same tracking URI, still there; set RUNNING again) or create it
        (tags: kind, study, storage, engine, platform, versions; params: objective, sampler, space, fixed levels,
        base) and keep its id in the study's user attributes."""
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
            **base_params(s.matrix.base.model_dump()),
        }
        self.parent_id = self.tracker.start_parent(f"tune-{s.study_name}", tags, params)
        study.set_user_attr(PARENT_ATTR, self.parent_id)
        study.set_user_attr(URI_ATTR, s.tracking_uri)

    def log_trial(self, number: int, state: str, value: float | None, constraint: float | None,
                  limits: dict[str, int], spec: RunSpec, rec: dict[str, Any], rdir: Path) -> str | None:
        """Log one trial as an MLflow child of the study's parent (once: a mark file in the trial folder)."""
        from mlflow.entities import Metric, Param, RunTag

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

    def log_study_end(self, summary: dict[str, Any], status: str) -> None:
        """Log the study's outputs on its MLflow parent (trial counts, the best trial, importance and the
        confirmation's ``confirm.change`` / ``confirm.ci_low`` / ``confirm.ci_high`` / ``confirm.blocks`` as
        metrics, its line and verdict as ``confirm.*`` tags; the output files as artifacts) and close it with
        ``status``; a failure is a warning."""
        from mlflow.entities import Metric

        if self.tracker is None or not self.parent_id:
            return
        s = self.s
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
            conf = summary.get("confirmation") or {}
            if "blocks" in conf:  # bench.tune.confirm: the best trial against the rule of thumb (or the runner-up)
                ms.append(Metric("confirm.blocks", float(conf["blocks"]), now, 0))
                ms.append(Metric("confirm.blocks_requested", float(conf["blocks_requested"]), now, 0))
                for k in ("change", "ci_low", "ci_high"):
                    if conf.get(k) is not None:
                        ms.append(Metric(f"confirm.{k}", float(conf[k]), now, 0))
            self.tracker.client.log_batch(self.parent_id, metrics=ms)
            if conf:  # tags, not params: a resumed tune confirms again with other values
                tags = {"confirm.line": conf.get("line", ""), "confirm.against": str(conf.get("against")),
                        "confirm.verdict": str(conf.get("verdict", conf.get("skipped", ""))),
                        "confirm.other_trial": str(conf.get("other_trial")), "confirm.alpha": str(conf.get("alpha"))}
                for k, v in tags.items():
                    self.tracker.client.set_tag(self.parent_id, k, v[:4000])
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
