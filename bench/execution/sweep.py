"""Run a plan: one process per cell repeat, measure, record (results folder + MLflow), summarize.

The sweep goes on when a run fails (recorded with its reason and log tail); each finished run's
``record.json`` is written atomically before anything else happens, so a killed harness loses no
finished run; rerunning the same matrix resumes the newest sweep of the same content.

Harness overhead = wall time of this invocation (from process start) not spent inside GRPO steps (the sum of
``timing_s/step`` of every step the runs executed), as a share of the invocation's wall time (x the runs at
once with ``--parallel``). The sweep's
wall time and overhead are those of its first finished invocation; a resume records its own under
``invocations`` (and ``resume_*`` metrics) and never overwrites them.

Faults: the results lock is taken before MLflow is touched; MLflow failures queue the upload on disk
(:mod:`bench.tracking.upload_queue`) and never stop the sweep; a resume first ends processes a killed harness
left in the sweep's folders; a full disk records the current run as failed when it can, closes the sweep and its
parent run as failed and stops with :class:`~bench.core.errors.DiskFullError`; SIGTERM/Ctrl-C close them as
interrupted.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bench.core.errors import BenchError, DiskFullError, doing
from bench.core.files import atomic_write_json, read_json
from bench.execution.blocks import (
    plan_params,
    resume_rule,
    run_blocks,
    sequential_header,
    sequential_metrics,
    sequential_summary,
    sequential_tags,
)
from bench.execution.code_versions import gate_fingerprint, version_meta
from bench.execution.executors import Executor, LocalExecutor, kill_strays
from bench.execution.runner import execute_spec, shared_matmul_peak
from bench.records.record import is_finished
from bench.records.results import SWEEP, ResultsDir, folder_size, free_bytes, is_no_space, run_dir
from bench.records.run_record import corrupt_records
from bench.records.snapshot import snapshot
from bench.records.speed import normalize_snapshot
from bench.records.summary import cell_rows, plan_summary, sweep_header, write_summary
from bench.spec.matrix import Matrix, base_params
from bench.spec.plan import Plan, RunSpec, interleaved_order, new_order_seed, planned_order, run_order
from bench.tracking import NOTE, Tracker, check_tracking_uri, git_commit, note, stop_monitor, sweep_run_name, versions
from bench.tracking.records import log_record, parent_cells, parent_description, summary_metrics
from bench.tracking.upload_queue import QUEUE, queue_upload, read_queue, sync_matrix

MLFLOW_MARK = "mlflow.json"


@dataclass
class SweepOutcome:
    """What a sweep invocation did. Times in seconds."""

    sweep_dir: Path
    parent_run_id: str | None
    rows: list[dict[str, Any]]
    executed: int
    skipped: int
    failed: int
    wall_s: float
    in_step_s: float
    overhead_share: float
    notes: list[str] = field(default_factory=list)
    #: the MLflow experiment's id (``None`` when the store was not reached)
    experiment_id: str | None = None


def process_start() -> float:
    """Epoch seconds at which this process started (the harness overhead counts from there)."""
    import psutil

    return psutil.Process().create_time()


class Sweep:
    """Executes a :class:`Plan` into a results folder and an MLflow store.

    Args:
        matrix: the validated matrix.
        plan: its plan (strict).
        results_root: the ``--results`` folder.
        tracking_uri: MLflow tracking URI.
        executor: how runs are launched (default: local subprocess).
        force: start a new sweep even if a resumable one exists.
        on_event: callback ``(kind, data)`` for the console: start, launch, done, skip, warn.
        order: run order of a new sweep, ``blocked`` (default) or ``sequential`` (:func:`bench.spec.plan.run_order`);
            a resumed sweep keeps the order it planned.
        order_seed: shuffle seed of a blocked order (default: a fresh random one, recorded in ``sweep.json``).
        stop_rule: decide after each complete block whether to stop (:mod:`bench.execution.blocks`); ``None``: run all.
        planning: the plan of ``--precision``/``--budget`` (:mod:`bench.planning.allocation`), kept in ``sweep.json``.
        code_versions: an interleaved gate sweep's code versions (:mod:`bench.gate.interleaved`,
            :mod:`bench.gate.versions`).
        analysis: the analysis declared before the first run (an interleaved gate's metric, covariate, cells,
            family, threshold and alpha: :func:`bench.gate.runs.declare_analysis`), kept in ``sweep.json``
            (key ``analysis``); a resume with another declared analysis is refused (``BenchError``).
        stacks: the open stacks of the matrix's ``stack`` factor (:func:`bench.execution.stacks.open_stacks`): each
            run uses its stack's (a gate between stacks: the stack its code version names, key ``stack``);
            ``sweep.json`` keeps them (key ``stacks``), and their commits and interpreters
            enter the fingerprint (a branch that moved is a new sweep, not a resume).
    """

    def __init__(self, matrix: Matrix, plan: Plan, results_root: Path, tracking_uri: str,
                 executor: Executor | None = None, force: bool = False,
                 on_event: Callable[[str, dict[str, Any]], None] | None = None,
                 order: str = "blocked", order_seed: int | None = None, stop_rule: Any = None,
                 planning: dict[str, Any] | None = None, code_versions: dict[str, dict[str, Any]] | None = None,
                 analysis: dict[str, Any] | None = None, stacks: dict[str, Any] | None = None):
        self.matrix, self.plan, self.stop_rule, self.planning = matrix, plan, stop_rule, planning
        self.stacks = stacks or {}
        self.analysis = analysis
        self.code_versions = code_versions or {}
        self.order_kind, self.order_seed = order, order_seed
        self.rd = ResultsDir(results_root, matrix.name)
        self.tracking_uri = tracking_uri
        self.executor = executor or LocalExecutor()
        self.force = force
        self.on_event = on_event or (lambda kind, data: None)

    def run(self) -> SweepOutcome:
        """Run every unfinished cell repeat; returns the outcome (failed runs do not raise).

        Raises:
            BenchError: the tracking URI is unusable or another harness holds the matrix's lock.
            DiskFullError: the results folder filled up (the sweep is closed as failed; rerun to resume).
            KeyboardInterrupt: SIGINT/SIGTERM (the sweep is closed as interrupted; rerun to resume).
        """
        check_tracking_uri(self.tracking_uri)
        try:
            with self.rd.lock():
                tracker = Tracker(self.tracking_uri, self.matrix.name)
                return self._run_locked(tracker)
        finally:
            close = getattr(self.executor, "close", None)
            if close is not None:
                close()

    def _run_locked(self, tracker: Tracker) -> SweepOutcome:
        with doing(f"opening the sweep of {self.matrix.source or self.matrix.name}"):
            sweep_dir, meta = self._open_sweep(tracker)
            if meta.get("resumed"):
                left = kill_strays(sweep_dir)  # what a killed harness of this sweep may have left running
                if left:
                    self.on_event("warn", {"message": f"ended {len(left)} process(es) of an earlier harness still "
                                                      f"running in {sweep_dir}: {left}"})
            sync_matrix(self.rd.base, tracker, skip=sweep_dir, on_event=self.on_event)
            for problem in corrupt_records(sweep_dir):  # resumed: named, and the repeat runs again
                self.on_event("warn", {"message": f"{problem}; this repeat runs again"})
        specs = {r.cell_id: r for r in self.plan.runs}
        order = planned_order(meta)
        todo = order.todo(specs)
        self.on_event("start", {"total": len(todo), "sweep_dir": str(sweep_dir), "resumed": meta.get("resumed"),
                                "order": order.kind, "order_seed": order.seed})
        counts = {"executed": 0, "skipped": 0, "failed": 0, "in_step": 0.0}
        # MLflow's system metrics (system/*) on the parent while the runs run; stopped before it is closed
        monitor = tracker.monitor_system(meta["parent_run_id"]) if meta.get("parent_run_id") else None
        try:
            try:
                self._loop(tracker, sweep_dir, meta, todo, counts)
            finally:
                stop_monitor(monitor)
            executed, skipped, failed, in_step = (counts[k] for k in ("executed", "skipped", "failed", "in_step"))
            wall = time.time() - process_start()
            cap = wall * getattr(self.executor, "slots", 1)  # --parallel: node-time, N runs at once
            overhead = (cap - in_step) / cap if wall > 0 and executed else 0.0
            with doing(f"writing the summary of {sweep_dir}"):
                return self._finish(tracker, sweep_dir, meta, executed, skipped, failed, wall, in_step, overhead)
        except BaseException as exc:
            self._abort(tracker, sweep_dir, meta, exc, todo, counts)
            raise

    def _loop(self, tracker: Tracker, sweep_dir: Path, meta: dict[str, Any], todo: list, counts: dict) -> None:
        """Run or skip every (spec, repeat) of ``todo`` block by block
        (:func:`bench.execution.blocks.run_blocks`: the stop rule may end the sweep after a block; ``--parallel``
        runs a block's runs at once on distinct Ray nodes,
        :meth:`bench.execution.ray_parallel.RayNodesExecutor.run_block`), updating ``counts`` as runs finish."""
        par = getattr(self.executor, "run_block", None) if planned_order(meta).blocked() else None
        run_blocks(todo, lambda spec, k: self._one(tracker, sweep_dir, meta, spec, k, counts),
                   stop_rule=self.stop_rule, sweep_dir=sweep_dir, meta=meta, on_event=self.on_event,
                   **({"run_block": par} if par else {}))

    def _one(self, tracker: Tracker, sweep_dir: Path, meta: dict[str, Any], spec: RunSpec, k: int,
             counts: dict) -> None:
        rdir = run_dir(sweep_dir, spec.cell_id, k, spec.code_version)
        if is_finished(rdir):
            counts["skipped"] += 1
            self._log_mlflow(tracker, meta["parent_run_id"], spec, rdir)
            self.on_event("skip", {"spec": spec, "repeat": k, "record": read_json(rdir / "record.json")})
            return
        self.on_event("launch", {"spec": spec, "repeat": k})
        with doing(f"running cell {spec.cell_id} repeat {k} in {rdir}"):
            rec = self._run_one(sweep_dir, spec, k)
        counts["executed"] += 1
        if rec["status"] != "ok" and self._out_of_space(sweep_dir, rec):
            raise OSError(28, "No space left on device", str(rdir))
        counts["failed"] += rec["status"] != "ok"
        counts["in_step"] += sum(float(s.get("timing_s/step", 0.0)) for s in rec["steps"].values())
        self._log_mlflow(tracker, meta["parent_run_id"], spec, rdir)
        self.on_event("done", {"spec": spec, "repeat": k, "record": rec})

    # -- pieces ---------------------------------------------------------------------------------
    def _open_sweep(self, tracker: Tracker) -> tuple[Path, dict[str, Any]]:
        fp = gate_fingerprint(self.matrix.fingerprint(), self.code_versions)  # the matrix's own without versions
        if self.stacks:
            fp = gate_fingerprint(fp, {n: {"commit": [s.python, *(t["commit"] for t in s.trees)]}
                                       for n, s in self.stacks.items()})
        sweep_dir = None if self.force else self.rd.find_resumable(fp, self.plan.platform,
                                                                   [r.cell_id for r in self.plan.runs])
        for problem in self.rd.unusable:  # an older sweep whose sweep.json cannot be read
            self.on_event("warn", {"message": f"{problem}; that sweep is not resumed"})
        if sweep_dir is not None:
            meta = read_json(sweep_dir / SWEEP)
            self.stop_rule = resume_rule(meta, self.stop_rule, self.matrix.expect, sweep_dir / SWEEP)  # sequential
            declared = meta.get("analysis")
            if self.analysis is not None and declared is not None and declared != self.analysis:
                diff = ", ".join(f"{k} {declared.get(k)!r} (now {self.analysis.get(k)!r})"
                                 for k in sorted(set(declared) | set(self.analysis))
                                 if declared.get(k) != self.analysis.get(k))
                raise BenchError(f"{sweep_dir / SWEEP}: analysis: the sweep declared its analysis before its first "
                                 f"run and cannot change it on resume: {diff}; rerun with the same options, or "
                                 "--force for a new sweep")
            if self.analysis is not None:
                meta["analysis"] = self.analysis
            meta["resumed"] = True
            planned = planned_order(meta)
            if (planned.kind, planned.seed) != (self.order_kind, self.order_seed if self.order_seed is not None
                                                 else planned.seed):
                self.on_event(
                    "warn",
                    {
                        "message": f"resuming sweep {meta['sweep_id']} in its planned order "
                        f"({planned.kind}, seed {planned.seed}), not --order {self.order_kind}"
                    },
                )
            self._ensure_parent(tracker, meta)
        else:
            sweep_dir = self.rd.new_sweep(fp)
            sweep_id = sweep_dir.name
            meta = {
                "sweep_id": sweep_id, "matrix_name": self.matrix.name, "matrix_source": self.matrix.source,
                "fingerprint": fp, "engine": self.plan.engine, "platform": self.plan.platform,
                "matrix": self.matrix.model_dump(mode="json"), "created_at": time.time(),
                "plan": {"runs": plan_summary(self.plan), "dropped": [d.model_dump() for d in self.plan.dropped],
                         "design_cells": self.plan.design_cells, "varied": self.plan.varied,
                         "aliases": self.plan.aliases, "resolution": self.plan.resolution,
                         "repeats": self.plan.repeats},
                "versions": versions(), "git_commit": git_commit(), "tracking_uri": self.tracking_uri,
                "invocations": [], "resumed": False, "planning": self.planning,
            }
            if self.analysis is not None:
                meta["analysis"] = self.analysis
            blocked = self.order_kind == "blocked" or bool(self.code_versions)
            seed = (self.order_seed if self.order_seed is not None else new_order_seed()) if blocked else None
            ids = [r.cell_id for r in self.plan.runs]
            order = (interleaved_order(ids, list(self.code_versions), self.plan.repeats, seed) if self.code_versions
                     else run_order(ids, self.plan.repeats, self.order_kind, seed))
            if self.code_versions:
                meta["code_versions"] = version_meta(self.code_versions)
            if self.stacks:
                meta["stacks"] = {n: s.describe() for n, s in self.stacks.items()}
            meta["order"] = order.model_dump(mode="json")
            meta["parent_run_id"] = None
            self._ensure_parent(tracker, meta)
        if self.plan.platform == "cpu":  # this machine's measured matmul peak: the MFU denominator of its runs
            meta["machine_peak"] = shared_matmul_peak()
        meta["status"] = "running"
        atomic_write_json(sweep_dir / SWEEP, meta)
        for spec in self.plan.runs:
            atomic_write_json(sweep_dir / spec.cell_id / "spec.json", spec.model_dump(mode="json"))
        self.rd.point_latest(sweep_dir)
        return sweep_dir, meta

    def _ensure_parent(self, tracker: Tracker, meta: dict[str, Any]) -> None:
        """Reuse the sweep's parent run when the store has it, else create one; an MLflow failure marks the
        tracker down (uploads are queued) instead of stopping the sweep."""
        try:
            if not (meta.get("parent_run_id") and tracker.parent_alive(meta["parent_run_id"])):
                meta["parent_run_id"] = self._start_parent(tracker, meta)
            elif meta.get("resumed"):  # shown as running again (not KILLED or FAILED) until this invocation closes it
                tracker.client.update_run(meta["parent_run_id"], status="RUNNING")
        except Exception as exc:
            if isinstance(exc, OSError) and is_no_space(exc):
                raise
            self.on_event("warn", {"message": f"MLflow unreachable ({tracker.mark_down(exc)}): uploads queued; "
                                              "`run_bench.py sync` fills MLflow in later"})

    def _start_parent(self, tracker: Tracker, meta: dict[str, Any]) -> str:
        """Create the sweep's parent run (started when the sweep was created); returns its run id."""
        m, sweep_id, order = self.matrix, meta["sweep_id"], planned_order(meta)
        tags = {"bench.kind": "sweep", "bench.sweep_id": sweep_id, "bench.fingerprint": m.fingerprint(),
                "bench.order": order.kind, "bench.order_seed": "" if order.seed is None else str(order.seed),
                "engine": self.plan.engine, "platform": self.plan.platform, "git_commit": git_commit(),
                "matrix_file": m.source, "design": m.design.type,
                **{f"version.{k}": v for k, v in versions().items()}}
        params = {"design": m.design.type, "repeats": m.repeats, "cells": len(self.plan.runs),
                  "order": order.kind, "order_seed": "none" if order.seed is None else order.seed,
                  "design_cells": self.plan.design_cells, "factors": ",".join(self.plan.varied),
                  **plan_params(meta.get("planning")),
                  **base_params(m.base.model_dump())}
        return tracker.start_parent(sweep_run_name(m.name, meta.get("created_at"), meta.get("git_commit")), tags,
                                    params, start_time=meta.get("created_at"),
                                    description=parent_description(meta))

    def _run_one(self, sweep_dir: Path, spec: RunSpec, repeat: int) -> dict[str, Any]:
        return execute_spec(spec, run_dir(sweep_dir, spec.cell_id, repeat, spec.code_version), repeat,
                            self.executor, self.matrix.base.warmup_steps, self.code_versions.get(spec.code_version),
                            stack=self.stacks.get(self._stack_name(spec)))

    def _stack_name(self, spec: RunSpec) -> str | None:
        """The run's stack: its level of the ``stack`` factor, else the stack its code version names (a gate
        between two stacks, :mod:`bench.gate.stacks`), else none (the harness's own)."""
        return spec.stack or (self.code_versions.get(spec.code_version) or {}).get("stack")

    def _log_mlflow(self, tracker: Tracker, parent_id: str, spec: RunSpec, rdir: Path) -> None:
        if (rdir / MLFLOW_MARK).exists():
            return
        rec = read_json(rdir / "record.json")
        if rec is None:
            return
        if tracker.down or not parent_id:  # queued: `run_bench.py sync` (or the next invocation) logs it
            queue_upload(rdir.parent.parent, self.tracking_uri, tracker.down or "no parent run")
            return
        try:
            tracker.drop_children(parent_id, {"cell_id": spec.cell_id, "repeat": rec["repeat"]})
            rid = log_record(tracker, parent_id, spec, rec, rdir, self.matrix)
        except Exception as exc:  # the store went away: keep going, queue the upload
            if isinstance(exc, OSError) and is_no_space(exc):
                raise
            reason = tracker.mark_down(exc)
            queue_upload(rdir.parent.parent, self.tracking_uri, reason)
            self.on_event("warn", {"message": f"MLflow unreachable ({reason}): uploads queued in "
                                              f"{rdir.parent.parent}; `run_bench.py sync` fills MLflow in later"})
            return
        atomic_write_json(rdir / MLFLOW_MARK, {"run_id": rid, "tracking_uri": self.tracking_uri})

    def _out_of_space(self, sweep_dir: Path, rec: dict[str, Any]) -> bool:
        """A failed run on a (nearly) full disk: ENOSPC in its log or less free space than a run takes."""
        if "No space left on device" in (rec.get("log_tail") or "") or "Disk quota exceeded" in (
            rec.get("log_tail") or ""
        ):
            return True
        free = free_bytes(sweep_dir)
        return free is not None and free < min(self._run_bytes(sweep_dir), 8 << 20)

    def _run_bytes(self, sweep_dir: Path) -> int:
        """Bytes one run folder takes: the largest finished run of the sweep, else 32 MiB."""
        sizes = [folder_size(p.parent) for p in Path(sweep_dir).glob("*/r*/record.json")]
        return max(sizes, default=0) or (32 << 20)

    def _abort(self, tracker: Tracker, sweep_dir: Path, meta: dict[str, Any], exc: BaseException, todo: list,
               counts: dict) -> None:
        """Close the sweep after an exception: status, parent run, and a :class:`DiskFullError` for ENOSPC."""
        disk_full = is_no_space(exc)
        meta["status"] = "failed" if disk_full or not isinstance(exc, KeyboardInterrupt) else "interrupted"
        meta["stopped"] = {"at": time.time(), "reason": f"{type(exc).__name__}: {exc}"[:500]}
        for attempt in range(2):
            try:
                atomic_write_json(sweep_dir / SWEEP, meta)
                break
            except OSError:
                if attempt == 0:  # free the unfinished run's folder (it reruns on resume) and try again
                    for rdir in Path(sweep_dir).glob("*/r*"):
                        if rdir.is_dir() and not (rdir / "record.json").exists():
                            shutil.rmtree(rdir, ignore_errors=True)
        status = "KILLED" if meta["status"] == "interrupted" else "FAILED"
        if not tracker.down and meta.get("parent_run_id"):
            try:
                tracker.client.set_tag(meta["parent_run_id"], "bench.status", meta["status"])
                tracker.client.set_tag(meta["parent_run_id"], NOTE, note(parent_description(meta)))
                tracker.client.set_terminated(meta["parent_run_id"], status=status)
            except Exception as mexc:
                queue_upload(sweep_dir, self.tracking_uri, tracker.mark_down(mexc),
                             {"metrics": {}, "tags": {"bench.status": meta["status"]}, "status": status})
        if disk_full:
            done = sum(1 for spec, k in todo
                       if (run_dir(sweep_dir, spec.cell_id, k, spec.code_version) / "record.json").exists())
            need = self._run_bytes(sweep_dir) * max(1, len(todo) - done)
            free = free_bytes(sweep_dir) or 0
            digits = 0 if need >= 10 << 20 else 2  # a small need to the hundredth (was "about 0 MiB")
            raise DiskFullError(
                f"{sweep_dir}: disk full ({free / 2**20:.1f} MiB free; about {need / 2**20:.{digits}f} MiB needed "
                f"for the {max(1, len(todo) - done)} run(s) left); the sweep is closed as failed, finished runs are "
                "kept: free space and rerun the same command to resume") from None

    def _finish(self, tracker, sweep_dir, meta, executed, skipped, failed, wall, in_step, overhead) -> SweepOutcome:
        snap = snapshot(sweep_dir)
        probe_ref = normalize_snapshot(snap)
        rows = cell_rows(snap)
        meta["invocations"].append({"finished_at": time.time(), "wall_s": wall, "in_step_s": in_step,
                                    "overhead_share": overhead, "executed": executed, "skipped": skipped,
                                    "failed": failed})
        all_ok = all(r["status"] == "ok" for r in rows)
        meta["status"] = "complete" if all_ok else "incomplete"
        header = sweep_header(meta, rows, probe_ref, sequential_header(meta))
        csv_path, md_path = write_summary(sweep_dir, rows, header, sequential_summary(meta))
        atomic_write_json(sweep_dir / SWEEP, meta)
        n = len(meta["invocations"]) - 1
        metrics = {"cells_failed": sum(r["status"] != "ok" for r in rows), **summary_metrics(rows),
                   **sequential_metrics(meta)}
        if n == 0:
            metrics.update(harness_overhead_share=overhead, sweep_wall_s=wall, in_step_s=in_step)
        else:
            metrics.update({f"resume{n}_wall_s": wall, f"resume{n}_overhead_share": overhead,
                            f"resume{n}_in_step_s": in_step})
        queued = read_queue(sweep_dir, self.on_event).get("parent_finish") or {}
        metrics = {**(queued.get("metrics") or {}), **metrics}  # an earlier invocation's, never uploaded
        finish = {"metrics": metrics, "tags": {"bench.status": meta["status"], **sequential_tags(meta)},
                  "status": "FINISHED" if all_ok else "FAILED"}
        if tracker.down or not meta.get("parent_run_id"):
            queue_upload(sweep_dir, self.tracking_uri, tracker.down or "no parent run", finish)
        else:
            try:
                tracker.finish_parent(meta["parent_run_id"], artifacts=[csv_path, md_path, sweep_dir / SWEEP],
                                      cells=parent_cells(snap),
                                      description=parent_description(meta, md_path.read_text()), **finish)
                if not tracker.parent_alive(meta["parent_run_id"]):  # accepted but not kept: an outage
                    raise RuntimeError("the tracking store did not keep the parent run (writes lost)")
                if not tracker.down:  # every child is logged and the parent closed: nothing left queued
                    (sweep_dir / QUEUE).unlink(missing_ok=True)
            except Exception as exc:
                if isinstance(exc, OSError) and is_no_space(exc):
                    raise
                queue_upload(sweep_dir, self.tracking_uri, tracker.mark_down(exc), finish)
                self.on_event("warn", {"message": f"MLflow parent update failed ({tracker.down}): queued; "
                                                  f"`run_bench.py sync {sweep_dir}` fills it in later"})
        return SweepOutcome(sweep_dir, meta["parent_run_id"], rows, executed, skipped, failed, wall, in_step,
                            overhead, experiment_id=getattr(tracker, "experiment_id", None))
