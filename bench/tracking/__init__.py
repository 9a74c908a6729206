"""MLflow recording: a parent run per sweep, a child run per cell and repeat.

- experiment = matrix name;
- parent run: tags ``bench.kind=sweep``, sweep id, engine, platform, versions, git commit; params = the
  matrix's base settings; at the end the sweep's summary table (CSV, markdown) as artifacts and the
  harness overhead as a metric;
- child run (``bench.kind=cell``): params = factor levels (``n/a`` when not applicable) and key
  settings; tags = cell id, repeat, status, failure reason, evidence per factor; metrics = every
  per-step series of the verl JSONL (with its step index), per-step ``free_ratio`` and the summary
  values (``step_time_median_s``, ``rollout_share``, ``free_ratio`` ...); artifacts = resolved config,
  JSONL, log, evidence and the profiler summary.

What the MLflow UI shows follows MLflow's own conventions (:func:`system_tags`, :data:`NOTE`):

- the experiment is a "Machine learning" experiment (tag ``mlflow.experimentKind``), so the UI opens on its
  training runs, and carries a description of how its runs are laid out;
- every run has MLflow's system tags (User, Source ``run_bench.py``, Git commit) and a markdown description
  (``mlflow.note.content``): a child says its cell, factor levels, status (the failure reason and log tail
  when failed) and headline values; the parent says what the sweep is and, when finished, holds the
  sweep's summary table;
- a child's start and end times are those of the run it mirrors (``record.json``'s ``started_at`` and
  ``finished_at``), so Duration and Created are the run's, not the upload's, also when ``sync`` logs it
  later; its metrics carry the run's end time as timestamp.

Uses :class:`mlflow.MlflowClient` with ``log_batch`` (one round trip per child), which works against a
``sqlite:///`` store and an ``http://`` tracking server alike.

MLflow is a best-effort mirror of the results folder (the source of truth): HTTP calls get a short timeout
and retry budget (:data:`HTTP_DEFAULTS`, seconds; each can be overridden by setting the MLflow variable),
the first failure of an invocation marks the tracker *down* (later calls are skipped at once), and what
was not uploaded is queued on disk and uploaded by ``run_bench.py sync`` (:mod:`bench.tracking.upload_queue`).

The package: :class:`Tracker` here; :mod:`bench.tracking.store` (the store behind a URI: HTTP settings, the
URI check), :mod:`bench.tracking.naming` (run names, descriptions, system tags, links, the report page),
:mod:`bench.tracking.records` (a run record as a child run; the sweep parent's description and metrics) and
:mod:`bench.tune.tracking` (a tune study's parent and trial runs).
"""


from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from bench.core.errors import BenchError, DiskFullError, InputError, doing, is_no_space
from bench.core.metadata import git_commit, versions  # noqa: F401  (re-exported; gathered in bench.core.metadata)
from bench.tracking.naming import (  # noqa: F401  (re-exported: the public names of bench.tracking)
    EXPERIMENT_KIND,
    ML_VIEW,
    NOTE,
    REPORT_POINTER,
    _finite,
    _ms,
    _tag,
    experiment_description,
    markdown_html,
    mlflow_key,
    note,
    run_url,
    sweep_run_name,
    system_tags,
)
from bench.tracking.store import (  # noqa: F401  (re-exported)
    HTTP_DEFAULTS,
    PROBE_TIMEOUT_S,
    SCHEMES,
    TRACKING_URI,
    _artifact_location,
    check_tracking_uri,
    discard_half_made,
    http_defaults,
    outage_reason,
    sqlite_path,
    store_failure,
)

_MAX_BATCH = 1000  # MLflow's log_batch limit on metrics per call

#: a profiled step's compressed trace larger than this (bytes) is not uploaded (tag ``bench.trace``)
TRACE_CAP_BYTES = 50 * 2**20
#: seconds between two samples of MLflow's system-metrics monitor on a sweep's parent run
SYSTEM_METRICS_INTERVAL_S = 5.0


class Tracker:
    """Thin wrapper over :class:`mlflow.MlflowClient` for one experiment.

    ``down`` is ``None`` while the store answers, else the reason of the first failure: callers skip
    further calls (the upload is queued on disk for ``run_bench.py sync``).

    Raises:
        BenchError: the tracking URI cannot be opened (bad scheme, unreachable server, unwritable file).
    """

    def __init__(self, tracking_uri: str, experiment: str):
        http_defaults()
        self.uri = tracking_uri
        self.down: str | None = None
        db = sqlite_path(tracking_uri)
        fresh = db is not None and not db.exists()
        try:
            with doing(f"opening the MLflow store {tracking_uri}"):
                import mlflow
                from mlflow import MlflowClient

                for name in (
                    "mlflow",
                    "alembic",
                ):  # "Creating initial MLflow database tables..." is not for the terminal
                    logging.getLogger(name).setLevel(logging.WARNING)
                # a failing store: MLflow logs the SQL statement and a traceback before it raises (and its
                # system-metrics thread logs every failed flush); the harness says why in one line of its own
                # (mark_down / the BenchError below), so these never reach the console
                for name in ("mlflow.store.db.utils", "mlflow.system_metrics", "mlflow.utils.async_logging"):
                    logging.getLogger(name).setLevel(logging.CRITICAL)
                self._mlflow = mlflow
                if db is not None:  # two harnesses creating one fresh database: one migrates, the other waits
                    from filelock import FileLock

                    db.parent.mkdir(parents=True, exist_ok=True)
                    with FileLock(str(db) + ".lock", timeout=120):
                        self.client = MlflowClient(tracking_uri=tracking_uri)
                        self.experiment_id = self._experiment(experiment)
                else:
                    self.client = MlflowClient(tracking_uri=tracking_uri)
                    self.experiment_id = self._experiment(experiment)
        except BenchError:
            raise
        except Exception as exc:  # MlflowException, requests errors, sqlalchemy errors, filelock timeout
            if is_no_space(exc):
                if fresh:  # the store this call began to create is half made: none is better (rerun makes it)
                    discard_half_made(db)
                raise DiskFullError(f"--tracking-uri {tracking_uri}: disk full while creating the MLflow store "
                                    f"(nothing kept); free space in {db.parent if db else 'its folder'} and rerun") \
                    from None
            if db is not None and "database is locked" in str(exc):  # sqlite waited its busy timeout
                raise InputError(TRACKING_URI, f"{TRACKING_URI} {tracking_uri}: {db} stays locked by another process "
                                 "(a harness, `sync` or `mlflow ui` writing it); rerun when it is done, or give "
                                 "another tracking URI") from None
            raise InputError(TRACKING_URI, f"{TRACKING_URI} {tracking_uri}: cannot open MLflow store: "
                             f"{outage_reason(exc, tracking_uri, named=False)}") from None

    def _experiment(self, experiment: str) -> str:
        """The experiment's id (created when missing); sets its kind and description where it has none
        (a description a user edited in the UI is kept)."""
        for attempt in range(3):  # a concurrent creator may win the race: look it up again
            exp = self.client.get_experiment_by_name(experiment)
            if exp:
                break
            try:
                exp = self.client.get_experiment(self.client.create_experiment(
                    experiment, artifact_location=_artifact_location(self.uri, experiment)))
                break
            except Exception:
                if attempt == 2:
                    raise
                time.sleep(0.5)
        wanted = {EXPERIMENT_KIND[0]: EXPERIMENT_KIND[1], NOTE: experiment_description(experiment)}
        for key, value in wanted.items():
            if key not in exp.tags:
                self.client.set_experiment_tag(exp.experiment_id, key, value)
        return exp.experiment_id

    def mark_down(self, exc: BaseException) -> str:
        """Record the first failure (later calls are skipped); returns the one-line reason, in our words
        (:func:`bench.tracking.store.outage_reason`)."""
        if self.down is None:
            self.down = outage_reason(exc, getattr(self, "uri", "") or "")
        return self.down

    def _tags(self, tags: dict[str, Any], description: str | None) -> dict[str, str]:
        out = {**system_tags(), **{k: _tag(v) for k, v in tags.items()}}
        if description:
            out[NOTE] = note(description)
        return out

    def start_parent(self, name: str, tags: dict[str, Any], params: dict[str, Any], *,
                     start_time: float | None = None, description: str | None = None) -> str:
        """Create a parent run (status RUNNING) with :func:`system_tags`; returns its run id.

        ``start_time``: epoch seconds (default now), e.g. when ``sync`` creates the parent of an earlier
        sweep; ``description``: markdown for the run's description (:data:`NOTE`).
        """
        run = self.client.create_run(self.experiment_id, run_name=name, start_time=_ms(start_time),
                                     tags=self._tags(tags, description))
        self._log(run.info.run_id, params=params)
        if not self.parent_alive(run.info.run_id):  # a store that answers but keeps nothing: an outage
            raise RuntimeError(f"the tracking store did not keep the new parent run {run.info.run_id!r} (writes lost)")
        return run.info.run_id

    def parent_alive(self, run_id: str) -> bool:
        """Whether the parent run exists in this store under that id (resume reuses it)."""
        if not run_id:
            return False
        try:
            run = self.client.get_run(run_id)
            return bool(run is not None and run.info.run_id == run_id)
        except Exception:
            return False

    def drop_children(self, parent_id: str, tags: dict[str, Any]) -> int:
        """Delete child runs of ``parent_id`` whose tags equal ``tags`` (a half-logged child left by a
        killed harness, so that resuming logs it exactly once); returns how many were deleted."""
        query = " and ".join([f"tags.mlflow.parentRunId = '{parent_id}'"]
                             + [f"tags.{k} = '{_tag(v)}'" for k, v in tags.items()])
        runs = self.client.search_runs([self.experiment_id], filter_string=query, max_results=100)
        for run in runs:
            self.client.delete_run(run.info.run_id)
        return len(runs)

    def log_child(self, parent_id: str, name: str, *, params: dict[str, Any], tags: dict[str, Any],
                  series: dict[str, list[tuple[int, float]]], summary: dict[str, Any],
                  artifacts: list[Path | tuple[Path, str]], status: str, start_time: float | None = None,
                  end_time: float | None = None, description: str | None = None, trace: Path | None = None,
                  json_artifacts: dict[str, Any] | None = None) -> str:
        """Create a finished child run under ``parent_id`` with everything logged; returns its id.

        ``series``: metric -> [(step, value)]; ``summary``: metric -> value (non-numbers skipped).
        ``start_time``/``end_time``: epoch seconds of the run it mirrors (default: now), which the UI shows
        as Created and Duration; metrics are stamped with ``end_time``. ``description``: markdown
        (:data:`NOTE`). ``status``: ``ok`` -> FINISHED, anything else -> FAILED. ``trace``: the profiled
        step's trace file, uploaded gzip-compressed under ``trace/`` (:meth:`log_trace`); ``json_artifacts``:
        artifact file name -> JSON-ready object (e.g. ``profile_summary.json``).
        """
        from mlflow.entities import Metric

        tags = {**tags, "mlflow.parentRunId": parent_id}
        run = self.client.create_run(self.experiment_id, run_name=name, start_time=_ms(start_time),
                                     tags=self._tags(tags, description))
        rid = run.info.run_id
        now = _ms(end_time) or int(time.time() * 1000)
        metrics = [Metric(mlflow_key(k), f, now, int(step)) for k, pts in series.items() for step, v in pts
                   if (f := _finite(v)) is not None]
        metrics += [Metric(mlflow_key(k), f, now, 0) for k, v in summary.items() if (f := _finite(v)) is not None]
        self._log(rid, params=params, metrics=metrics)
        for item in artifacts:
            path, under = item if isinstance(item, tuple) else (item, None)
            if Path(path).is_file():
                self.client.log_artifact(rid, str(path), under)
            elif Path(path).is_dir():  # a folder: its files under ``under`` (default: the folder's name)
                self.client.log_artifacts(rid, str(path), under or Path(path).name)
        for name, obj in (json_artifacts or {}).items():
            self.client.log_dict(rid, obj, name)
        if trace is not None:
            self.log_trace(rid, Path(trace))
        self.client.set_terminated(rid, status="FINISHED" if status == "ok" else "FAILED", end_time=_ms(end_time))
        self.confirm(rid, parent_id)
        return rid

    def confirm(self, run_id: str, parent_id: str) -> None:
        """Read a child run back: the store must hold it, under ``parent_id``, terminated. A store that
        accepts writes but does not keep them (an in-memory database behind a server) is an outage: the
        caller queues the upload instead of marking the run as uploaded.

        Raises:
            RuntimeError: the store does not return the run as written.
        """
        try:
            run = self.client.get_run(run_id)
        except Exception as exc:
            raise RuntimeError(f"the tracking store did not keep run {run_id} (writes lost: {exc})"[:300]) from None
        if run.data.tags.get("mlflow.parentRunId") != parent_id or run.info.status == "RUNNING":
            raise RuntimeError(f"the tracking store did not keep run {run_id} as written (writes lost)")

    def log_trace(self, run_id: str, trace: Path) -> str:
        """Upload a profiler trace under ``trace/`` as ``<name>.json.gz`` (a ``.gz`` file as it is), unless
        the compressed file exceeds :data:`TRACE_CAP_BYTES`; tags ``bench.trace`` with what was done
        (``trace/<file> (<MB> MB)`` or why it was skipped). Returns the tag's value."""
        import gzip
        import shutil
        import tempfile

        cap_mb = TRACE_CAP_BYTES / 2**20
        if not trace.is_file():
            what = f"not uploaded: {trace.name} missing"
        elif trace.suffix == ".gz":
            size = trace.stat().st_size
            if size > TRACE_CAP_BYTES:
                what = f"not uploaded: {trace.name} is {size / 2**20:.1f} MB (cap {cap_mb:.0f} MB); in the run folder"
            else:
                self.client.log_artifact(run_id, str(trace), "trace")
                what = f"trace/{trace.name} ({size / 2**20:.1f} MB)"
        else:
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / (trace.name + ".gz")
                too_big = False
                with open(trace, "rb") as src, gzip.open(out, "wb", compresslevel=6) as dst:
                    while chunk := src.read(4 << 20):
                        dst.write(chunk)
                        if out.stat().st_size > TRACE_CAP_BYTES:
                            too_big = True
                            break
                if too_big:
                    what = (f"not uploaded: {trace.name} compresses to over {cap_mb:.0f} MB (cap); in the run folder "
                            f"({trace.stat().st_size / 2**20:.1f} MB)")
                else:
                    self.client.log_artifact(run_id, str(out), "trace")
                    mb_out, mb_in = out.stat().st_size / 2**20, trace.stat().st_size / 2**20
                    what = f"trace/{out.name} ({mb_out:.1f} MB, from {mb_in:.1f} MB)"
                shutil.rmtree(tmp, ignore_errors=True)
        self.client.set_tag(run_id, "bench.trace", what)
        return what

    def set_tag(self, run_id: str, key: str, value: Any) -> None:
        """Set one tag of a run (non-strings as JSON, cut to 5000 characters)."""
        self.client.set_tag(run_id, key, _tag(value))

    def log_table(self, run_id: str, rows: list[dict[str, Any]], artifact_file: str) -> None:
        """A table artifact (MLflow's ``log_table``: the UI shows it as a table) from ``rows`` (one dict per
        row, same keys; ``None`` stays empty). An existing table of that name is replaced (``log_table``
        alone would append the rows to it, e.g. when a finished sweep is run again)."""
        import posixpath
        import tempfile

        import pandas as pd

        data = pd.DataFrame(rows)
        folder = posixpath.dirname(artifact_file) or None
        if artifact_file not in [f.path for f in self.client.list_artifacts(run_id, folder)]:
            self.client.log_table(run_id, data=data, artifact_file=artifact_file)
            return
        with tempfile.TemporaryDirectory() as tmp:  # the same file log_table writes, in place of the old one
            path = Path(tmp) / posixpath.basename(artifact_file)
            data.to_json(path, orient="split", index=False, date_format="iso")
            self.client.log_artifact(run_id, str(path), folder)

    def log_report(self, run_id: str, files: list[Path], under: str = "report") -> None:
        """Upload a report's files under ``under/`` and, for its ``report.md``, a ``report.html`` beside it
        with the images embedded (:func:`markdown_html`), which the MLflow UI renders."""
        import tempfile

        for f in files:
            self.client.log_artifact(run_id, str(f), artifact_path=under)
        md = next((Path(f) for f in files if Path(f).name == "report.md"), None)
        if md is not None and md.is_file():
            with tempfile.TemporaryDirectory() as tmp:
                page = Path(tmp) / "report.html"
                page.write_text(markdown_html(md.read_text(), md.parent, title=md.parent.parent.name))
                self.client.log_artifact(run_id, str(page), artifact_path=under)

    def monitor_system(self, run_id: str) -> Any:
        """Start MLflow's system-metrics monitor (CPU, memory, disk, network, GPU where present; metrics
        ``system/*``, one sample every :data:`SYSTEM_METRICS_INTERVAL_S` s) on the RUNNING run ``run_id``;
        returns it (stop it with :func:`stop_monitor`), or ``None`` when it cannot start (no psutil, or the
        tracker is down). The monitor stops by itself once the run is no longer RUNNING."""
        if self.down:
            return None
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            logging.getLogger("mlflow.system_metrics").setLevel(logging.CRITICAL)  # see __init__
            mon = SystemMetricsMonitor(run_id, sampling_interval=SYSTEM_METRICS_INTERVAL_S,
                                       resume_logging=True, tracking_uri=self.uri)
            mon.start()
            return mon
        except Exception:
            return None

    def finish_parent(self, run_id: str, *, metrics: dict[str, Any], artifacts: list[Path], status: str,
                      tags: dict[str, Any] | None = None, description: str | None = None,
                      cells: list[dict[str, Any]] | None = None) -> None:
        """Log final metrics/artifacts/tags (and the markdown ``description``, :data:`NOTE`, below the
        :data:`REPORT_POINTER` when the description had one) on the parent and mark it finished (or failed/killed).
        ``cells``: the per-cell results table, logged as ``cells.json`` (:meth:`log_table`)."""
        from mlflow.entities import Metric

        if cells:
            self.log_table(run_id, cells, "cells.json")

        now = int(time.time() * 1000)
        ms = [Metric(mlflow_key(k), f, now, 0) for k, v in metrics.items() if (f := _finite(v)) is not None]
        self._log(run_id, metrics=ms)
        tags = {k: _tag(v) for k, v in (tags or {}).items()}
        if description:
            if self.client.get_run(run_id).data.tags.get(NOTE, "").startswith(REPORT_POINTER):
                description = REPORT_POINTER + "\n\n" + description
            tags[NOTE] = note(description)
        for k, v in tags.items():
            self.client.set_tag(run_id, k, v)
        for path in artifacts:
            if Path(path).is_file():
                self.client.log_artifact(run_id, str(path))
        self.client.set_terminated(run_id, status=status)

    def _log(self, run_id: str, params: dict[str, Any] | None = None, metrics: list | None = None) -> None:
        from mlflow.entities import Param

        ps = [Param(mlflow_key(k), str(v)[:6000]) for k, v in (params or {}).items()]
        metrics = metrics or []
        for i in range(0, max(len(metrics), len(ps), 1), _MAX_BATCH):
            self.client.log_batch(run_id, metrics=metrics[i:i + _MAX_BATCH], params=ps[i:i + 100] if i == 0 else [])
        for i in range(100, len(ps), 100):
            self.client.log_batch(run_id, params=ps[i:i + 100])


def stop_monitor(monitor: Any) -> None:
    """Stop a monitor of :meth:`Tracker.monitor_system` (flushing what it sampled); ``None`` is fine; never raises."""
    if monitor is None:
        return
    try:
        monitor.finish()
    except Exception:
        pass
