"""The upload queue: what a tracking-store outage left for MLflow, and its upload (``run_bench.py sync``,
:mod:`bench.commands.sync`).

The results folder is the source of truth; MLflow mirrors it. When an MLflow call fails during a sweep
the harness keeps going and queues the upload on disk:

- a run folder with a ``record.json`` but no ``mlflow.json`` is a child run still to log;
- ``<sweep>/mlflow_queue.json`` says the sweep has pending uploads and holds the parent run's final
  metrics, tags and status when closing the parent failed.

``sync`` logs every pending child (deleting first any half-logged child of the same cell and repeat, so
it is idempotent: running it twice logs nothing twice), creates the parent run if the store does not
have it, closes the parent as the sweep ended, and removes the queue file. ``run`` does the same for
the sweeps of its matrix at start (:func:`sync_matrix`), so the next invocation fills MLflow in.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from bench.core.errors import BenchError, doing, say
from bench.core.files import atomic_write_json, atomic_write_text, read_json
from bench.core.inputs import read_bytes
from bench.records.results import SWEEP, check_sweep_meta, is_no_space, run_dir
from bench.records.run_record import RecordError, corrupt_records, read_record
from bench.records.snapshot import snapshot
from bench.records.speed import normalize_snapshot
from bench.spec.loading import value_message
from bench.spec.matrix import Matrix, base_params
from bench.spec.plan import RunSpec
from bench.tracking import git_commit, sweep_run_name, versions
from bench.tracking.records import log_record, parent_cells, parent_description

#: the queue file of a sweep folder
QUEUE = "mlflow_queue.json"
#: the per-run mark: this run's child is logged (holds its MLflow run id)
MLFLOW_MARK = "mlflow.json"


def read_queue(sweep_dir: Path, on_event: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The queue file of a sweep as a dict (``{}`` when there is none).

    A queue file that cannot be used (not a regular file, not a JSON object, ``parent_finish`` not an object)
    is never deleted: it is renamed to ``mlflow_queue.json.bad-<time>`` beside it, named in a warning through
    ``on_event`` (or stderr), and the sweep stays pending (an empty queue is written in its place).
    """
    path = Path(sweep_dir) / QUEUE
    if not path.exists() and not path.is_symlink():
        return {}
    try:
        data = json.loads(read_bytes(path, 16 << 20, "queue file"))
        problem = None if isinstance(data, dict) else "not a JSON object"
        if problem is None and not isinstance(data.get("parent_finish") or {}, dict):
            problem = "parent_finish is not an object"
    except (BenchError, ValueError, RecursionError) as exc:
        data, problem = None, (str(exc).split(": ", 1)[-1] if isinstance(exc, BenchError) else "not JSON")
    if problem is None:
        return data
    aside = path.with_name(f"{QUEUE}.bad-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        path.rename(aside)
        atomic_write_text(path, "{}\n")
        kept = f"kept aside as {aside.name}"
    except OSError as exc:
        kept = f"left in place ({exc.strerror})"
    msg = (f"{path}: unusable MLflow queue file ({problem}); {kept}; the pending runs are found from their "
           "folders, but the parent's final metrics it may have held are not uploaded")
    if on_event is not None:
        on_event("warn", {"message": msg})
    else:
        say(f"warning: {msg}")
    return {}


def queue_upload(sweep_dir: Path, tracking_uri: str, reason: str, parent_finish: dict[str, Any] | None = None) -> None:
    """Record in ``<sweep>/mlflow_queue.json`` that uploads are pending (best effort: a full disk is ignored).

    Args:
        sweep_dir: the sweep folder.
        tracking_uri: the store the uploads are for.
        reason: one line on why the upload failed.
        parent_finish: ``{"metrics", "tags", "status"}`` of the parent run to apply later, if any.
    """
    path = Path(sweep_dir) / QUEUE
    data = read_queue(sweep_dir)
    data.update({"tracking_uri": tracking_uri, "reason": reason, "since": data.get("since") or time.time()})
    if parent_finish is not None:
        data["parent_finish"] = parent_finish
    try:
        atomic_write_json(path, data)
    except OSError:
        pass


def queued_line(sweep_dir: Path) -> str | None:
    """The console line of a sweep whose uploads are queued (an outage, or a store that kept nothing), or ``None``
    when nothing is pending."""
    if not pending(sweep_dir):
        return None
    why = read_queue(sweep_dir).get("reason") or "the store did not take the uploads"
    return (f"MLflow: not uploaded ({why}); queued in {sweep_dir}: run `run_bench.py sync {sweep_dir}` when the "
            "store is back")


def pending(sweep_dir: Path) -> bool:
    """Whether the sweep has a queue file (uploads pending)."""
    return (Path(sweep_dir) / QUEUE).exists()


def parent_fields(meta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tags, params) of a sweep's parent run, from its ``sweep.json``: those the sweep gives it when it starts
    (:meth:`bench.execution.sweep.Sweep._start_parent`), for a parent that ``sync`` creates after an outage."""
    m = meta.get("matrix") or {}
    plan = meta.get("plan") or {}
    order = meta.get("order") or {"kind": "sequential"}  # a sweep from before run orders ran sequentially
    seed = order.get("seed")
    tags = {"bench.kind": "sweep", "bench.sweep_id": meta.get("sweep_id"), "bench.fingerprint": meta.get("fingerprint"),
            "bench.order": order.get("kind"), "bench.order_seed": "" if seed is None else str(seed),
            "engine": meta.get("engine"), "platform": meta.get("platform"),
            "git_commit": meta.get("git_commit") or git_commit(), "matrix_file": meta.get("matrix_source", ""),
            "design": (m.get("design") or {}).get("type"),
            **{f"version.{k}": v for k, v in (meta.get("versions") or versions()).items()}}
    params = {"design": (m.get("design") or {}).get("type"), "repeats": m.get("repeats"),
              "cells": len(plan.get("runs") or []), "order": order.get("kind"),
              "order_seed": "none" if seed is None else seed, "design_cells": plan.get("design_cells"),
              "factors": ",".join(plan.get("varied") or []),
              **base_params(m.get("base") or {})}
    return tags, params


def check_sweep_files(sweep_dir: Path, meta: dict[str, Any] | None = None
                      ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Check, before MLflow is touched, every file a sync reads: ``sweep.json`` (``meta``: its content as
    :func:`bench.records.results.check_sweep_meta` already returned it to the caller), each run record
    (:func:`bench.records.run_record.read_record`) and each cell's ``spec.json``.

    Returns:
        (sweep meta, cell id -> RunSpec of the cells whose ``spec.json`` is usable, one line per unusable
        record or spec, records first).

    Raises:
        BenchError: ``sweep.json`` is unusable, or no run at all could be uploaded (every record or spec
            unusable): the first unusable file is named, with the count of further ones, nothing uploaded.
    """
    from pydantic import ValidationError

    sweep_dir = Path(sweep_dir)
    meta = check_sweep_meta(sweep_dir / SWEEP) if meta is None else meta
    problems = corrupt_records(sweep_dir)
    specs = {}
    for entry in meta["plan"]["runs"]:
        path = sweep_dir / entry["cell_id"] / "spec.json"
        try:
            specs[entry["cell_id"]] = RunSpec.model_validate(read_json(path))
        except (ValidationError, BenchError) as exc:
            if isinstance(exc, BenchError):
                problems.append(str(exc))
                continue
            err = exc.errors()[0]
            what = ".".join(str(p) for p in err["loc"])
            problems.append(f"{path}: not a usable run spec ("
                            + (f"{what}: {value_message(err)})" if what else "missing or not JSON)"))
    bad_records = {line.split(": ", 1)[0] for line in problems}
    usable = [r for cid in specs for r in sorted((sweep_dir / cid).glob("r*/record.json")) if str(r) not in bad_records]
    if problems and not usable:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise RecordError(f"{problems[0]}{more}; nothing uploaded: fix the file or move its run folder away")
    return meta, specs, problems


#: a sweep's final ``status`` in ``sweep.json`` -> its MLflow parent's run status (a ``running`` sweep is left open)
FINAL_STATUS = {"complete": "FINISHED", "incomplete": "FAILED", "failed": "FAILED", "interrupted": "KILLED"}


def sync_sweep(
    sweep_dir: Path, tracker, on_event: Callable[[str, dict[str, Any]], None] | None = None,
    checked: tuple[dict[str, Any], dict[str, Any], list[str]] | None = None,
) -> dict[str, int]:
    """Upload everything of one sweep that MLflow lacks; returns counts ``{"children", "parents", "closed"}``.

    Stops at the first failing MLflow call (the tracker is marked down; the queue file stays). Every file it
    reads is checked first (:func:`check_sweep_files`; ``checked``: what that returned for this sweep, when the
    caller ran it before opening the store, so no record is read twice): the usable runs are uploaded, and the
    unusable records and specs are then named in one error (the queue file stays, the parent stays open until
    they are fixed); when no run is usable nothing is uploaded.

    Raises:
        BenchError: the folder is not a sweep, or a record or spec cannot be used (the queue file stays; the
            other runs are uploaded first).
    """
    on_event = on_event or (lambda kind, data: None)
    sweep_dir = Path(sweep_dir)
    meta, specs, corrupt = checked if checked is not None else check_sweep_files(sweep_dir)
    corrupt = list(corrupt)
    counts = {"children": 0, "parents": 0, "closed": 0}
    if tracker.down:
        return counts
    named = set(corrupt)
    try:
        with doing(f"syncing {sweep_dir} to MLflow"):
            parent = meta.get("parent_run_id")
            if not (parent and tracker.parent_alive(parent)):
                tags, params = parent_fields(meta)
                name = sweep_run_name(meta.get("matrix_name") or sweep_dir.parent.name, meta.get("created_at"),
                                      meta.get("git_commit"))
                parent = tracker.start_parent(name, tags, params,
                                              start_time=meta.get("created_at"), description=parent_description(meta))
                meta["parent_run_id"] = parent
                atomic_write_json(sweep_dir / SWEEP, meta)
                counts["parents"] += 1
            try:
                matrix = Matrix.model_validate(meta["matrix"])
            except Exception:
                matrix = Matrix.model_construct(**meta["matrix"])
            for entry in meta["plan"]["runs"]:
                spec = specs.get(entry["cell_id"])
                if spec is None:  # its spec.json is unusable (named in corrupt)
                    continue
                for k in range(int(meta["plan"].get("repeats", 1))):
                    rdir = run_dir(sweep_dir, spec.cell_id, k)
                    mark = read_json(rdir / MLFLOW_MARK) if (rdir / MLFLOW_MARK).exists() else None
                    if isinstance(mark, dict) and mark.get("tracking_uri") in (None, tracker.uri):
                        continue  # uploaded to this store (a mark of another store's upload: uploaded here too)
                    try:
                        rec = read_record(rdir / "record.json")
                    except RecordError as exc:
                        if str(exc) not in named:
                            corrupt.append(str(exc))
                        continue
                    if rec is None:
                        continue
                    tracker.drop_children(parent, {"cell_id": spec.cell_id, "repeat": rec["repeat"]})
                    rid = log_record(tracker, parent, spec, rec, rdir, matrix)
                    atomic_write_json(rdir / MLFLOW_MARK, {"run_id": rid, "tracking_uri": tracker.uri})
                    counts["children"] += 1
            if corrupt:  # the queue stays: these runs are still to upload once their records are fixed
                raise RecordError(corrupt[0] + (f" (and {len(corrupt) - 1} more)" if len(corrupt) > 1 else "")
                                  + "; the other runs are uploaded, the sweep stays pending")
            queue = read_queue(sweep_dir, on_event)
            fin = queue.get("parent_finish")
            if not fin and meta.get("status") in FINAL_STATUS and \
                    tracker.client.get_run(parent).info.status == "RUNNING":
                # a finished sweep whose parent nothing will close (synced to another store, or its close lost
                # with no queue): closed with the sweep's own status, its table and summary
                fin = {"metrics": {}, "tags": {"bench.status": meta["status"]}, "status": FINAL_STATUS[meta["status"]]}
            if fin:  # close the parent as the sweep's own end would have: same metrics, tags, artifacts, table
                md = sweep_dir / "summary.md"
                tracker.finish_parent(parent, metrics=fin.get("metrics") or {},
                                      artifacts=[sweep_dir / "summary.csv", md, sweep_dir / SWEEP],
                                      status=fin.get("status", "FAILED"), tags=fin.get("tags") or {},
                                      description=parent_description(meta, md.read_text() if md.is_file() else None),
                                      cells=_parent_cells(sweep_dir))
                counts["closed"] += 1
            if not tracker.parent_alive(parent):  # a store that accepted the writes but did not keep them
                raise RuntimeError(f"the tracking store did not keep the parent run {parent} (writes lost)")
            (sweep_dir / QUEUE).unlink(missing_ok=True)
    except BenchError:
        raise
    except Exception as exc:  # the store is down again: keep the queue
        if isinstance(exc, OSError) and is_no_space(exc):
            raise
        reason = tracker.mark_down(exc)
        on_event("warn", {"message": f"MLflow sync of {sweep_dir.name} stopped: {reason}; "
                                     f"run `run_bench.py sync {sweep_dir}` later"})
    return counts


def _parent_cells(sweep_dir: Path) -> list[dict[str, Any]]:
    """The parent's ``cells.json`` from the sweep folder, computed as the sweep's end computes it."""
    snap = snapshot(sweep_dir)
    normalize_snapshot(snap)
    return parent_cells(snap)


def sync_matrix(base: Path, tracker, skip: Path | None = None,
                on_event: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, int]:
    """:func:`sync_sweep` every sweep under a matrix folder that has a queue file (except ``skip``)."""
    total = {"children": 0, "parents": 0, "closed": 0}
    if not Path(base).is_dir():
        return total
    for sweep in sorted(Path(base).iterdir()):
        if sweep.is_symlink() or not pending(sweep) or (skip is not None and sweep.resolve() == Path(skip).resolve()):
            continue
        queue = read_queue(sweep, on_event)
        if queue.get("tracking_uri") not in (None, tracker.uri):
            continue  # queued for another store
        try:
            got = sync_sweep(sweep, tracker, on_event)
        except BenchError as exc:  # an older sweep's unusable file must not stop this invocation
            on_event("warn", {"message": f"not synced: {exc}"})
            continue
        for k, v in got.items():
            total[k] += v
        if tracker.down:
            break
    return total


__all__ = ["QUEUE", "MLFLOW_MARK", "read_queue", "queue_upload", "pending", "queued_line", "sync_sweep", "sync_matrix",
           "check_sweep_files"]
