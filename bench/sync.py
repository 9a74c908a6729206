"""``run_bench.py sync [SWEEP]``: upload to MLflow what a tracking-store outage left queued.

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

import argparse
import time
from pathlib import Path
from typing import Any, Callable

from bench.errors import BenchError, doing
from bench.results import SWEEP, atomic_write_json, find_sweep, is_no_space, read_json, run_dir

#: the queue file of a sweep folder
QUEUE = "mlflow_queue.json"
#: the per-run mark: this run's child is logged (holds its MLflow run id)
MLFLOW_MARK = "mlflow.json"


def queue_upload(sweep_dir: Path, tracking_uri: str, reason: str, parent_finish: dict[str, Any] | None = None) -> None:
    """Record in ``<sweep>/mlflow_queue.json`` that uploads are pending (best effort: a full disk is ignored).

    Args:
        sweep_dir: the sweep folder.
        tracking_uri: the store the uploads are for.
        reason: one line on why the upload failed.
        parent_finish: ``{"metrics", "tags", "status"}`` of the parent run to apply later, if any.
    """
    path = Path(sweep_dir) / QUEUE
    data = read_json(path) or {}
    data.update({"tracking_uri": tracking_uri, "reason": reason, "since": data.get("since") or time.time()})
    if parent_finish is not None:
        data["parent_finish"] = parent_finish
    try:
        atomic_write_json(path, data)
    except OSError:
        pass


def pending(sweep_dir: Path) -> bool:
    """Whether the sweep has a queue file (uploads pending)."""
    return (Path(sweep_dir) / QUEUE).exists()


def parent_fields(meta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tags, params) of a sweep's parent run, from its ``sweep.json``: those the sweep gives it when it starts
    (:meth:`bench.sweep.Sweep._start_parent`), for a parent that ``sync`` creates after an outage."""
    from bench.tracking import git_commit, versions

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
              **{f"base.{k}": v for k, v in (m.get("base") or {}).items() if k not in ("env", "overrides", "embedded")}}
    return tags, params


def sync_sweep(
    sweep_dir: Path, tracker, on_event: Callable[[str, dict[str, Any]], None] | None = None
) -> dict[str, int]:
    """Upload everything of one sweep that MLflow lacks; returns counts ``{"children", "parents", "closed"}``.

    Stops at the first failing MLflow call (the tracker is marked down; the queue file stays).

    Raises:
        BenchError: the folder is not a sweep.
    """
    from bench.spec.matrix import Matrix
    from bench.spec.plan import RunSpec
    from bench.tracking import sweep_run_name
    from bench.tracking.records import log_record, parent_description

    on_event = on_event or (lambda kind, data: None)
    sweep_dir = Path(sweep_dir)
    meta = read_json(sweep_dir / SWEEP)
    if not isinstance(meta, dict) or not isinstance((meta.get("plan") or {}).get("runs"), list):
        raise BenchError(f"{sweep_dir / SWEEP}: not a sweep record")
    counts = {"children": 0, "parents": 0, "closed": 0}
    if tracker.down:
        return counts
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
                spec = RunSpec.model_validate(read_json(sweep_dir / entry["cell_id"] / "spec.json"))
                for k in range(int(meta["plan"].get("repeats", 1))):
                    rdir = run_dir(sweep_dir, spec.cell_id, k)
                    rec = read_json(rdir / "record.json")
                    if rec is None or (rdir / MLFLOW_MARK).exists():
                        continue
                    tracker.drop_children(parent, {"cell_id": spec.cell_id, "repeat": rec["repeat"]})
                    rid = log_record(tracker, parent, spec, rec, rdir, matrix)
                    atomic_write_json(rdir / MLFLOW_MARK, {"run_id": rid, "tracking_uri": tracker.uri})
                    counts["children"] += 1
            queue = read_json(sweep_dir / QUEUE) or {}
            fin = queue.get("parent_finish")
            if fin:  # close the parent as the sweep's own end would have: same metrics, tags, artifacts, table
                md = sweep_dir / "summary.md"
                tracker.finish_parent(parent, metrics=fin.get("metrics") or {},
                                      artifacts=[sweep_dir / "summary.csv", md, sweep_dir / SWEEP],
                                      status=fin.get("status", "FAILED"), tags=fin.get("tags") or {},
                                      description=parent_description(meta, md.read_text() if md.is_file() else None),
                                      cells=_parent_cells(sweep_dir))
                counts["closed"] += 1
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
    from bench.analyze.snapshot import snapshot
    from bench.speed import normalize_snapshot
    from bench.summary import parent_cells

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
        queue = read_json(sweep / QUEUE) or {}
        if queue.get("tracking_uri") not in (None, tracker.uri):
            continue  # queued for another store
        for k, v in sync_sweep(sweep, tracker, on_event).items():
            total[k] += v
        if tracker.down:
            break
    return total


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``sync``."""
    p.add_argument("sweep", nargs="?", default=None,
                   help="the sweep: a sweep folder, a matrix name (its latest sweep) or <matrix>/<sweep id>; "
                        "default: every sweep under --results with uploads pending")


def main(args: argparse.Namespace) -> int:
    """Sync one sweep (or every pending sweep); 0 when MLflow holds everything, 1 when the store is still
    unreachable (the queue stays), 2 on bad input."""
    from bench.tracking import Tracker, check_tracking_uri

    if args.sweep is not None:
        sweeps = [find_sweep(args.sweep, args.results)]
    else:
        root = Path(args.results)
        sweeps = (
            sorted(p.parent for p in root.glob(f"*/*/{QUEUE}") if not p.parent.is_symlink()) if root.is_dir() else []
        )
        if not sweeps:
            print(f"nothing to sync under {root}")
            return 0
    done = {"children": 0, "parents": 0, "closed": 0}
    left = 0
    for sweep in sweeps:
        meta = read_json(sweep / SWEEP) or {}
        uri = args.tracking_uri if getattr(args, "tracking_uri_given", False) else (
            meta.get("tracking_uri") or args.tracking_uri)
        check_tracking_uri(uri)
        tracker = Tracker(uri, meta.get("matrix_name") or sweep.parent.name)
        for k, v in sync_sweep(sweep, tracker, lambda kind, d: print(f"warning: {d['message']}")).items():
            done[k] += v
        left += pending(sweep)
        print(f"{sweep}: {uri}: " + ("still pending" if pending(sweep) else "in sync"))
    print(f"logged {done['children']} child run(s), created {done['parents']} parent run(s), "
          f"closed {done['closed']} parent run(s); {left} sweep(s) still pending")
    return 1 if left else 0


__all__ = ["QUEUE", "MLFLOW_MARK", "queue_upload", "pending", "sync_sweep", "sync_matrix", "add_arguments", "main"]
