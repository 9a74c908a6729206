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
was not uploaded is queued on disk and uploaded by ``run_bench.py sync`` (:mod:`bench.sync`).
"""

from __future__ import annotations

import logging
import math
import os
import time
import urllib.parse
import urllib.request
from functools import lru_cache
from pathlib import Path
from typing import Any

from bench.errors import BenchError, doing
from bench.metadata import VERSIONED, git_commit, versions  # noqa: F401  (re-exported; gathered in bench.metadata)

#: MLflow HTTP settings the harness uses unless the variable is already set: timeout per request (s),
#: retries, backoff factor (s) and jitter (s). Worst case per failing call: about 10 + 2 x 10 + 3 s.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                 "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5"}
#: seconds the start-up reachability probe of an ``http(s)://`` tracking server may take
PROBE_TIMEOUT_S = 5.0
#: URI schemes a tracking URI may use
SCHEMES = ("sqlite", "http", "https", "file", "postgresql", "mysql", "mssql", "databricks")

_MAX_BATCH = 1000  # MLflow's log_batch limit on metrics per call

#: the run tag the MLflow UI shows (and edits) as a run's description; markdown (GitHub flavour, tables too)
NOTE = "mlflow.note.content"
#: first paragraph of a sweep parent's description once ``report`` logged its report there (kept when the
#: sweep's description is rewritten, e.g. by a rerun of a finished sweep)
REPORT_POINTER = ("Report (factor effects with intervals, per-cell speedups, phases, plots): artifact "
                  "`report/report.md`.")
#: experiment tag that tells the MLflow 3 UI which kind of experiment it shows (classic ML: "Training runs")
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
#: URL query that makes MLflow 3.17's UI open an experiment on its model-training view (it ignores
#: :data:`EXPERIMENT_KIND`; the link chooses the view, else what the browser chose last, default GenAI)
ML_VIEW = "workflowType=machine_learning"
#: a profiled step's compressed trace larger than this (bytes) is not uploaded (tag ``bench.trace``)
TRACE_CAP_BYTES = 50 * 2**20
#: seconds between two samples of MLflow's system-metrics monitor on a sweep's parent run
SYSTEM_METRICS_INTERVAL_S = 5.0


def experiment_description(name: str) -> str:
    """Markdown description of the experiment ``name`` (the MLflow UI shows it above the runs)."""
    return (f"GRPO ablation benchmark `{name}` (`run_bench.py`). One **parent run per sweep** (tag "
            "`bench.kind = sweep`; its description holds the sweep's summary table, its metrics "
            "`speedup.<cell>` and `step_time_s.<cell>`), with a **child run per cell and repeat** "
            "(`bench.kind = cell`): params `factor.*` are the factor levels (`n/a`: not applicable), metrics "
            "are the per-step series of the run and its summary (`step_time_s`, `rollout_share`, `free_ratio`, "
            "...), tags `evidence.*` say how each factor was seen to take effect. Tune studies "
            "(`bench.kind = tune`, a child per trial) and gate runs (`bench.kind = gate`) live here too. "
            "Filter children with e.g. `tags.bench.kind = 'cell' and params.factor.dynamic_bsz = '1'`.")


@lru_cache(maxsize=1)
def system_tags() -> dict[str, str]:
    """MLflow's system tags for a run this harness creates, as the UI shows them: ``mlflow.user`` (and any
    other tag of MLflow's run-context providers but git's), ``mlflow.source.name`` = ``run_bench.py``,
    ``mlflow.source.type`` = ``LOCAL`` and the project's git commit, branch and remote URL (MLflow's
    ``mlflow.source.git.*``; credentials stripped by MLflow) when it is a git checkout.

    :class:`mlflow.MlflowClient` sets none of them (only MLflow's fluent API does); without them the UI's
    User, Source and Git commit columns stay empty.
    """
    from mlflow.tracking.context.git_context import GitRunContext
    from mlflow.tracking.context.registry import resolve_tags
    from mlflow.utils.git_utils import get_git_branch, get_git_repo_url

    own = {"mlflow.source.name": "run_bench.py", "mlflow.source.type": "LOCAL"}
    sha = git_commit().removesuffix("+dirty")
    if sha != "unknown":  # the project's repository, not that of whatever script imported the harness
        root = str(Path(__file__).resolve().parent.parent)
        own["mlflow.source.git.commit"] = sha
        for key, value in (("mlflow.source.git.branch", get_git_branch(root)),
                           ("mlflow.source.git.repoURL", get_git_repo_url(root))):
            if value:
                own[key] = value
    return {k: str(v) for k, v in resolve_tags(own, ignore=[GitRunContext]).items()}


def sweep_run_name(matrix: str, created_at: float | None, commit: str | None) -> str:
    """A sweep parent run's name: ``<matrix> <YYYY-MM-DD HH:MM> <git short sha>`` (local time of
    ``created_at``, epoch seconds; the sha's first 7 characters, ``+dirty`` kept; no sha part when unknown)."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(created_at if created_at is not None else time.time()))
    sha = str(commit or "")
    dirty = sha.endswith("+dirty")
    sha = sha.removesuffix("+dirty")
    short = "" if not sha or sha == "unknown" else " " + sha[:7] + ("+dirty" if dirty else "")
    return f"{matrix} {when}{short}"


def run_url(tracking_uri: str, experiment_id: str | None, run_id: str | None = None) -> str | None:
    """The MLflow UI link of an experiment (or of one of its runs) on an ``http(s)`` tracking server, opening
    on the model-training view (:data:`ML_VIEW`); ``None`` for other stores (no UI at the URI)."""
    if not tracking_uri.lower().startswith(("http://", "https://")) or not experiment_id:
        return None
    page = f"#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"{tracking_uri.rstrip('/')}/{page}?{ML_VIEW}"


def markdown_html(md: str, base: Path, title: str = "report") -> str:
    """A standalone HTML page of the markdown text ``md`` (tables and fenced code rendered by the
    ``markdown`` package) with every local image (``![..](file.png)``, relative to ``base``) embedded as a
    base64 ``data:`` URI, so that the MLflow UI's artifact viewer shows it with its plots. Images that are
    not files under ``base`` are left as they are."""
    import base64
    import html
    import mimetypes
    import re

    import markdown

    body = markdown.markdown(md, extensions=["tables", "fenced_code"])

    def embed(m: re.Match) -> str:
        src = html.unescape(m.group(2))
        path = (base / urllib.parse.unquote(src)).resolve()
        if "://" in src or not path.is_file():
            return m.group(0)
        kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        return f'{m.group(1)}"data:{kind};base64,{base64.b64encode(path.read_bytes()).decode()}"'

    body = re.sub(r'(<img[^>]*?\ssrc=)"([^"]+)"', embed, body)
    style = ("body{font-family:sans-serif;max-width:1100px;margin:1em auto;padding:0 1em}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n{body}\n</body></html>\n")


def _ms(t: float | None) -> int | None:
    """Epoch seconds -> epoch milliseconds (MLflow's unit); ``None`` stays ``None``."""
    return None if t is None else int(round(float(t) * 1000))


def note(text: str) -> str:
    """``text`` fit for :data:`NOTE`: whole when it fits MLflow's tag limit (``MAX_TAG_VAL_LENGTH``, 8000
    characters), else cut at a line end (a markdown table stays well formed) with a closing remark."""
    from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

    if len(text) <= MAX_TAG_VAL_LENGTH:
        return text
    remark = f"\n\n... (cut at MLflow's {MAX_TAG_VAL_LENGTH}-character limit; the full text is in the run's artifacts)"
    cut = text[:MAX_TAG_VAL_LENGTH - len(remark)]
    if "\n" in cut:
        cut = cut[:cut.rindex("\n")]
    return cut.rstrip() + remark


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _tag(v: Any) -> str:
    s = v if isinstance(v, str) else __import__("json").dumps(v, sort_keys=True, default=str)
    return s[:5000]


def http_defaults() -> None:
    """Set :data:`HTTP_DEFAULTS` in ``os.environ`` where the user has not set them (MLflow reads them per call)."""
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)


def _sqlite_path(uri: str) -> Path | None:
    if uri.startswith("sqlite:///"):
        return Path(urllib.parse.unquote(uri[len("sqlite:///"):].split("?", 1)[0]))
    return None


def check_tracking_uri(uri: str) -> None:
    """Check a tracking URI without writing anything: known scheme; a sqlite file that is a database (or
    absent, in a writable folder); an ``http(s)`` server that answers within :data:`PROBE_TIMEOUT_S`.

    Raises:
        BenchError: naming ``--tracking-uri``, the URI and what is wrong.
    """
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    if scheme.split("+", 1)[0] not in SCHEMES:
        raise BenchError(f"--tracking-uri {uri}: unsupported scheme (allowed: sqlite:///PATH, http(s)://HOST:PORT, "
                         "file:PATH or a database URL)")
    db = _sqlite_path(uri)
    if scheme == "sqlite" and db is None:
        raise BenchError(f"--tracking-uri {uri}: a sqlite URI is sqlite:///PATH (three slashes)")
    if db is not None:
        folder = db.parent
        while not folder.exists() and folder.parent != folder:
            folder = folder.parent
        if db.exists():
            if not db.is_file():
                raise BenchError(f"--tracking-uri {uri}: {db} is not a file")
            try:
                with open(db, "rb") as fh:
                    head = fh.read(16)
            except OSError as exc:
                raise BenchError(f"--tracking-uri {uri}: cannot read {db}: {exc.strerror}") from None
            if head and head != b"SQLite format 3\x00":
                raise BenchError(f"--tracking-uri {uri}: {db} is not a SQLite database")
            if not os.access(db, os.W_OK) or not os.access(db.parent, os.W_OK | os.X_OK):
                raise BenchError(f"--tracking-uri {uri}: {db} is not writable")
        elif not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            raise BenchError(f"--tracking-uri {uri}: folder {folder} is not writable")
    if scheme in ("http", "https"):
        parsed = urllib.parse.urlparse(uri)
        if not parsed.hostname:
            raise BenchError(f"--tracking-uri {uri}: no host")
        try:
            parsed.port  # noqa: B018 - raises on a bad port
        except ValueError:
            raise BenchError(f"--tracking-uri {uri}: bad port") from None
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=PROBE_TIMEOUT_S) as resp:
                resp.read(64)
        except urllib.error.HTTPError:
            pass  # it answered: a server without /health is still a server
        except (OSError, ValueError) as exc:
            why = getattr(exc, "reason", None) or exc
            raise BenchError(f"--tracking-uri {uri}: tracking server unreachable ({why}); start it, or use "
                             "a sqlite:/// store and `run_bench.py sync` later") from None


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
        db = _sqlite_path(tracking_uri)
        try:
            with doing(f"opening the MLflow store {tracking_uri}"):
                import mlflow
                from mlflow import MlflowClient

                for name in (
                    "mlflow",
                    "alembic",
                ):  # "Creating initial MLflow database tables..." is not for the terminal
                    logging.getLogger(name).setLevel(logging.WARNING)
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
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise BenchError(f"--tracking-uri {tracking_uri}: cannot open MLflow store: {first}") from None

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
        """Record the first failure (later calls are skipped); returns the one-line reason."""
        if self.down is None:
            self.down = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
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
        return run.info.run_id

    def parent_alive(self, run_id: str) -> bool:
        """Whether the parent run exists in this store (resume reuses it)."""
        try:
            self.client.get_run(run_id)
            return True
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
        metrics = [Metric(_key(k), f, now, int(step)) for k, pts in series.items() for step, v in pts
                   if (f := _finite(v)) is not None]
        metrics += [Metric(_key(k), f, now, 0) for k, v in summary.items() if (f := _finite(v)) is not None]
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
        return rid

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

            logging.getLogger("mlflow.system_metrics").setLevel(logging.ERROR)
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
        ms = [Metric(_key(k), f, now, 0) for k, v in metrics.items() if (f := _finite(v)) is not None]
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

        ps = [Param(_key(k), str(v)[:6000]) for k, v in (params or {}).items()]
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


def _artifact_location(tracking_uri: str, experiment: str) -> str | None:
    """For a ``sqlite:///path/db`` store, artifacts go beside the database (``path/mlartifacts/<exp>``)
    instead of MLflow's default under the current folder; ``None`` (server default) otherwise."""
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///"):])
        return (db.resolve().parent / "mlartifacts" / experiment).as_uri()
    return None


def _key(k: str) -> str:
    """MLflow-safe metric/param key (letters, digits, ``_-./ :`` kept; others -> ``_``)."""
    return "".join(c if c.isalnum() or c in "_-./ :" else "_" for c in str(k))
