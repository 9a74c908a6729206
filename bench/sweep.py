"""Run a plan: one process per cell repeat, measure, record (results folder + MLflow), summarize.

The sweep goes on when a run fails (recorded with its reason and log tail); each finished run's
``record.json`` is written atomically before anything else happens, so a killed harness loses no
finished run; rerunning the same matrix resumes the newest sweep of the same content.

Harness overhead = wall time of this invocation (from process start) not spent inside GRPO steps (the sum of
``timing_s/step`` of every step the runs executed), as a share of the invocation's wall time. The sweep's
wall time and overhead are those of its first finished invocation; a resume records its own under
``invocations`` (and ``resume_*`` metrics) and never overwrites them.

Faults: the results lock is taken before MLflow is touched; MLflow failures queue the upload on disk
(:mod:`bench.sync`) and never stop the sweep; a resume first ends processes a killed harness left in the
sweep's folders; a full disk records the current run as failed when it can, closes the sweep and its
parent run as failed and stops with :class:`~bench.errors.DiskFullError`; SIGTERM/Ctrl-C close them as
interrupted.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from bench.errors import DiskFullError, doing
from bench.executors import Executor, LocalExecutor, kill_strays, resolve_launch
from bench.measure._common import iqr
from bench.metadata import host_load  # noqa: F401  (re-exported; gathered in bench.metadata)
from bench.model import SUMMARY_PEAK_MEM, SUMMARY_STEP_IQR, Snapshot, cell_stats, run_value
from bench.record import build_record, is_finished, write_record
from bench.results import (
    SWEEP,
    ResultsDir,
    atomic_write_json,
    atomic_write_text,
    folder_size,
    free_bytes,
    is_no_space,
    new_sweep_id,
    read_json,
    run_dir,
)
from bench.spec.matrix import Matrix
from bench.spec.optimizations import FACTOR_KEYS, REGISTRY, compact_label
from bench.spec.plan import Plan, RunOrder, RunSpec, new_order_seed, run_order
from bench.sync import QUEUE, queue_upload, sync_matrix
from bench.tracking import (
    NOTE,
    Tracker,
    check_tracking_uri,
    git_commit,
    note,
    stop_monitor,
    sweep_run_name,
    versions,
)

MLFLOW_MARK = "mlflow.json"
#: base settings logged as params on every child run
KEY_SETTINGS = ("steps", "warmup_steps", "train_batch_size", "n", "max_prompt_length", "max_response_length",
                "ppo_mini_batch_size", "rollout_tp", "n_gpus_per_node", "nnodes")


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


def _levels_str(levels: dict[str, int | None]) -> dict[str, str]:
    return {k: ("n/a" if v is None else str(v)) for k, v in levels.items()}


def cell_rows(snap: dict[str, Any]) -> list[dict[str, Any]]:
    """One summary row per run spec of a sweep snapshot (:func:`bench.analyze.snapshot.snapshot`).

    When the snapshot was speed-normalized (:func:`bench.speed.normalize_snapshot`) every value is at
    the sweep's median machine speed; ``step_time_raw_s`` keeps the measured seconds. Values come from
    :mod:`bench.model` (the report and MLflow use the same functions): ``step_time_s`` = geometric mean
    over the ok repeats of each run's median timed step (s); ``speedup`` = all-off cell's value / this
    cell's (> 1 = faster); rollout share, Free ratio and throughput likewise per run, then over runs.

    Columns: cell_id, label, one per factor, merged (design cells represented), repeats_ok, repeats,
    step_time_s, step_time_raw_s, step_time_iqr_s (of the pooled timed steps), speedup, rollout_share,
    free_ratio, throughput, peak_memory_gb, status, reason, all_off.
    """
    model = Snapshot.model_validate(snap)
    st = cell_stats(model, "step_time")
    raw = cell_stats(model, "step_time_raw")
    others = {m: cell_stats(model, m) for m in ("rollout_share", "free_ratio", "throughput")}
    rows = []
    for c in model.cells:
        ok = c.ok_repeats()
        samples = [t for g in c.groups("step_time") for t in g]
        row = {
            "cell_id": c.cell_id,
            "label": c.label,
            **_levels_str(c.levels),
            "merged": c.merged_cells,
            "repeats_ok": len(ok),
            "repeats": len(c.repeats) + len(c.missing_repeats),
            "step_time_s": st[c.cell_id]["value"],
            "step_time_raw_s": raw[c.cell_id]["value"]
            if raw[c.cell_id]["value"] is not None
            else st[c.cell_id]["value"],
            "step_time_iqr_s": iqr(samples) if samples else None,
            "speedup": st[c.cell_id]["speedup"],
            **{m: others[m][c.cell_id]["value"] for m in others},
            "peak_memory_gb": max((r.summary.get(SUMMARY_PEAK_MEM) or 0 for r in ok), default=None),
            "status": c.status,
            "reason": "; ".join(f"r{f['repeat']} {f['kind']}: {(f.get('reason') or '')[:120]}" for f in c.failures)
            or (f"unfinished (repeats {c.missing_repeats})" if c.status == "pending" else ""),
            "all_off": c.all_off,
        }
        rows.append(row)
    return rows


def cells_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sweep parent's per-cell results table (MLflow artifact ``cells.json``) from :func:`cell_rows`'
    rows, the values of ``summary.csv``: ``cell`` (compact label, as in the child run names), ``label``,
    ``runs ok``, ``step time s``, ``speedup``, ``rollout share``, ``Free ratio``, ``tokens/s`` (``None``
    where ``summary.csv`` is empty), ``cell id`` and one column per factor that applies to some cell (its
    level, ``n/a``); the figures come first so that the UI's table shows them without scrolling."""
    applicable = [k for k in FACTOR_KEYS if any(r.get(k) not in (None, "n/a") for r in rows)]
    out = []
    for r in rows:
        levels = {k: (None if r.get(k) in (None, "n/a") else int(r[k])) for k in FACTOR_KEYS if k in r}
        out.append({"cell": compact_label(levels), "label": r["label"], "runs ok": f"{r['repeats_ok']}/{r['repeats']}",
                    "step time s": r.get("step_time_s"), "speedup": r.get("speedup"),
                    "rollout share": r.get("rollout_share"), "Free ratio": r.get("free_ratio"),
                    "tokens/s": r.get("throughput"), "cell id": r["cell_id"], **{k: r[k] for k in applicable}})
    return out


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def write_summary(sweep_dir: Path, rows: list[dict[str, Any]], header: dict[str, Any]) -> tuple[Path, Path]:
    """Write ``summary.csv`` and ``summary.md`` (atomically) into the sweep folder; returns both paths."""
    cols = ["cell_id", "label", *FACTOR_KEYS, "merged", "repeats_ok", "repeats", "step_time_s", "step_time_raw_s",
            "step_time_iqr_s", "speedup", "rollout_share", "free_ratio", "throughput", "peak_memory_gb",
            "status", "reason"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in cols})
    csv_path, md_path = sweep_dir / "summary.csv", sweep_dir / "summary.md"
    atomic_write_text(csv_path, buf.getvalue())
    md = [f"# Sweep {header.get('sweep_id')} of `{header.get('matrix')}`", ""]
    md += [f"- {k}: {v}" for k, v in header.items() if k not in ("sweep_id", "matrix")]
    md += [
        "",
        "| cell | "
        + " | ".join(REGISTRY[k].key for k in FACTOR_KEYS)
        + " | step time s | raw step time s | IQR s | speedup vs all-off"
        + " | rollout share | Free ratio | tokens/s | status |",
        "|---" * (len(FACTOR_KEYS) + 9) + "|",
    ]
    for r in rows:
        md.append(
            f"| {r['label']} (`{r['cell_id']}`) | "
            + " | ".join(r[k] for k in FACTOR_KEYS)
            + f" | {_fmt(r['step_time_s'])} | {_fmt(r['step_time_raw_s'])}"
            + f" | {_fmt(r['step_time_iqr_s'])} | {_fmt(r['speedup'])}"
            f" | {_fmt(r['rollout_share'])} | {_fmt(r['free_ratio'])} | {_fmt(r['throughput'], 1)}"
            f" | {r['status']}{(': ' + r['reason'][:80]) if r['reason'] else ''} |"
        )
    atomic_write_text(md_path, "\n".join(md) + "\n")
    return csv_path, md_path


def plan_summary(plan: Plan) -> list[dict[str, Any]]:
    """JSON-ready list of the plan's runs (cell id, label, levels, merged cells, not-applicable reasons)."""
    return [{"cell_id": r.cell_id, "label": r.label, "levels": r.levels, "cells": r.cells,
             "not_applicable": r.not_applicable, "all_off": r.is_all_off()} for r in plan.runs]


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
    """

    def __init__(self, matrix: Matrix, plan: Plan, results_root: Path, tracking_uri: str,
                 executor: Executor | None = None, force: bool = False,
                 on_event: Callable[[str, dict[str, Any]], None] | None = None,
                 order: str = "blocked", order_seed: int | None = None):
        self.matrix, self.plan = matrix, plan
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
        specs = {r.cell_id: r for r in self.plan.runs}
        order = planned_order(meta)
        todo = [(specs[c], k) for c, k in order.runs]
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
            overhead = (wall - in_step) / wall if wall > 0 and executed else 0.0
            with doing(f"writing the summary of {sweep_dir}"):
                return self._finish(tracker, sweep_dir, meta, executed, skipped, failed, wall, in_step, overhead)
        except BaseException as exc:
            self._abort(tracker, sweep_dir, meta, exc, todo, counts)
            raise

    def _loop(self, tracker: Tracker, sweep_dir: Path, meta: dict[str, Any], todo: list, counts: dict) -> None:
        """Run or skip every (spec, repeat) of ``todo``, updating ``counts`` as runs finish."""
        for spec, k in todo:
            rdir = run_dir(sweep_dir, spec.cell_id, k)
            if is_finished(rdir):
                counts["skipped"] += 1
                self._log_mlflow(tracker, meta["parent_run_id"], spec, rdir)
                self.on_event("skip", {"spec": spec, "repeat": k, "record": read_json(rdir / "record.json")})
                continue
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
        fp = self.matrix.fingerprint()
        sweep_dir = None if self.force else self.rd.find_resumable(fp, self.plan.platform)
        if sweep_dir is not None:
            meta = read_json(sweep_dir / SWEEP)
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
            sweep_id = new_sweep_id(fp)
            sweep_dir = self.rd.base / sweep_id
            sweep_dir.mkdir(parents=True)
            meta = {
                "sweep_id": sweep_id, "matrix_name": self.matrix.name, "matrix_source": self.matrix.source,
                "fingerprint": fp, "engine": self.plan.engine, "platform": self.plan.platform,
                "matrix": self.matrix.model_dump(mode="json"), "created_at": time.time(),
                "plan": {"runs": plan_summary(self.plan), "dropped": [d.model_dump() for d in self.plan.dropped],
                         "design_cells": self.plan.design_cells, "varied": self.plan.varied,
                         "aliases": self.plan.aliases, "resolution": self.plan.resolution,
                         "repeats": self.plan.repeats},
                "versions": versions(), "git_commit": git_commit(), "tracking_uri": self.tracking_uri,
                "invocations": [], "resumed": False,
            }
            seed = None
            if self.order_kind == "blocked":
                seed = self.order_seed if self.order_seed is not None else new_order_seed()
            order = run_order([r.cell_id for r in self.plan.runs], self.plan.repeats, self.order_kind, seed)
            meta["order"] = order.model_dump(mode="json")
            meta["parent_run_id"] = None
            self._ensure_parent(tracker, meta)
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
                  **{f"base.{k}": v for k, v in m.base.model_dump(exclude={"env", "overrides", "embedded"}).items()}}
        return tracker.start_parent(sweep_run_name(m.name, meta.get("created_at"), meta.get("git_commit")), tags,
                                    params, start_time=meta.get("created_at"),
                                    description=parent_description(meta))

    def _run_one(self, sweep_dir: Path, spec: RunSpec, repeat: int) -> dict[str, Any]:
        return execute_spec(spec, run_dir(sweep_dir, spec.cell_id, repeat), repeat, self.executor,
                            self.matrix.base.warmup_steps)

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
            done = sum(1 for spec, k in todo if (run_dir(sweep_dir, spec.cell_id, k) / "record.json").exists())
            need = self._run_bytes(sweep_dir) * max(1, len(todo) - done)
            free = free_bytes(sweep_dir) or 0
            raise DiskFullError(
                f"{sweep_dir}: disk full ({free / 2**20:.1f} MiB free; about {need / 2**20:.0f} MiB needed for the "
                f"{max(1, len(todo) - done)} run(s) left); the sweep is closed as failed, finished runs are kept: "
                "free space and rerun the same command to resume") from None

    def _finish(self, tracker, sweep_dir, meta, executed, skipped, failed, wall, in_step, overhead) -> SweepOutcome:
        from bench.analyze.snapshot import snapshot
        from bench.speed import normalize_snapshot

        snap = snapshot(sweep_dir)
        probe_ref = normalize_snapshot(snap)
        rows = cell_rows(snap)
        meta["invocations"].append({"finished_at": time.time(), "wall_s": wall, "in_step_s": in_step,
                                    "overhead_share": overhead, "executed": executed, "skipped": skipped,
                                    "failed": failed})
        first = meta["invocations"][0]  # the sweep's wall time and overhead: a resume never overwrites them
        all_ok = all(r["status"] == "ok" for r in rows)
        meta["status"] = "complete" if all_ok else "incomplete"
        header = {
            "sweep_id": meta["sweep_id"],
            "matrix": meta["matrix_name"],
            "engine": meta["engine"],
            "platform": meta["platform"],
            "design": meta["matrix"]["design"]["type"],
            "cells run / design cells": f"{len(rows)} / {meta['plan']['design_cells']}",
            "dropped": len(meta["plan"]["dropped"]),
            "timed steps": "measured steps without the profiler (profiled steps give the Free ratio)",
            "step time": "per run the median timed step, geometric mean over the cell's ok repeats"
            + (
                f"; speed-normalized to the sweep's median speed-probe time {probe_ref:.4f} s"
                if probe_ref
                else "; raw (no speed probe in every run)"
            ),
            "run order": f"{meta.get('order', {}).get('kind', 'sequential')}"
            + (f", seed {meta['order']['seed']}" if (meta.get("order") or {}).get("seed") is not None else ""),
            "harness overhead": f"{first['overhead_share']:.1%} of {first['wall_s']:.1f} s wall "
            f"(in GRPO steps {first['in_step_s']:.1f} s)",
        }
        resumes = meta["invocations"][1:]
        if resumes:
            header["resumed"] = "; ".join(
                f"invocation {i}: {inv['wall_s']:.1f} s wall, overhead {inv['overhead_share']:.1%}, executed "
                f"{inv['executed']}, cached {inv['skipped']}" for i, inv in enumerate(resumes, 2))
        csv_path, md_path = write_summary(sweep_dir, rows, header)
        atomic_write_json(sweep_dir / SWEEP, meta)
        n = len(meta["invocations"]) - 1
        metrics = {"cells_failed": sum(r["status"] != "ok" for r in rows), **summary_metrics(rows)}
        if n == 0:
            metrics.update(harness_overhead_share=overhead, sweep_wall_s=wall, in_step_s=in_step)
        else:
            metrics.update({f"resume{n}_wall_s": wall, f"resume{n}_overhead_share": overhead,
                            f"resume{n}_in_step_s": in_step})
        queued = (read_json(sweep_dir / QUEUE) or {}).get("parent_finish") or {}
        metrics = {**(queued.get("metrics") or {}), **metrics}  # an earlier invocation's, never uploaded
        finish = {"metrics": metrics, "tags": {"bench.status": meta["status"]},
                  "status": "FINISHED" if all_ok else "FAILED"}
        if tracker.down or not meta.get("parent_run_id"):
            queue_upload(sweep_dir, self.tracking_uri, tracker.down or "no parent run", finish)
        else:
            try:
                tracker.finish_parent(meta["parent_run_id"], artifacts=[csv_path, md_path, sweep_dir / SWEEP],
                                      cells=cells_table(rows),
                                      description=parent_description(meta, md_path.read_text()), **finish)
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


def summary_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """MLflow metrics of the sweep's parent run from the summary rows: ``speedup.<label>`` and
    ``step_time_s.<label>`` (the values of ``summary.md``)."""
    from bench.tracking import _key

    out = {}
    for r in rows:
        for k in ("speedup", "step_time_s"):
            if r.get(k) is not None:
                out[_key(f"{k}.{r['label']}")] = float(r[k])
    return out


def planned_order(meta: dict[str, Any]) -> RunOrder:
    """The run order recorded in a sweep's ``sweep.json`` (key ``order``); a sweep written before run
    orders existed ran sequentially (plan order, every repeat of a spec in turn)."""
    if meta.get("order"):
        return RunOrder.model_validate(meta["order"])
    plan = meta.get("plan") or {}
    return run_order([c["cell_id"] for c in plan.get("runs", [])], int(plan.get("repeats") or 1), "sequential")


def execute_spec(spec: RunSpec, rdir: Path, repeat: int, executor: Executor, warmup_steps: int) -> dict[str, Any]:
    """Run one repeat of ``spec`` in the fresh folder ``rdir``, measure it and write its record.

    An earlier unfinished attempt in ``rdir`` is removed first. Returns the record (status ``ok`` or
    ``failed`` with ``failure_kind`` in bad_input | infeasible | oom | timeout | crash | error | no_metrics).
    """
    rdir = Path(rdir)
    if rdir.exists():
        shutil.rmtree(rdir)
    rdir.mkdir(parents=True)
    launch = spec.launch
    launch_res = resolve_launch(launch.argv, launch.env, launch.patches, rdir, spec.timeout_s)
    if launch.config:
        cfg = json.loads(json.dumps(launch.config).replace("{run_dir}", str(rdir.resolve())))
        atomic_write_text(rdir / launch.config_file, yaml.safe_dump(cfg, sort_keys=False))
    started = time.time()
    load0 = host_load()
    res = executor.execute(launch_res)
    rec = build_record(rdir, res, spec=spec.model_dump(mode="json"), repeat=repeat, warmup_steps=warmup_steps,
                       started_at=started)
    rec["host_load"] = {"before": load0, "after": host_load()}  # the gate reports contention from it
    rec["label"] = spec.label
    rec["all_off"] = spec.is_all_off()
    write_record(rdir, rec)
    return rec


def log_record(tracker: Tracker, parent_id: str, spec: RunSpec, rec: dict[str, Any], rdir: Path,
               matrix: Matrix) -> str:
    """Log one run record as an MLflow child run of ``parent_id``; returns the child's run id."""
    summ = rec.get("summary") or {}
    series = step_series(rec)
    for step, value in rec.get("free_ratio", {}).items():
        series.setdefault("free_ratio/step", []).append((int(step), value))
    # the run's values as summary.md, the report and the gate see them (bench.model.run_value of the timed
    # steps; Free ratio: profiled steps), raw seconds (a sweep's speed normalization is the parent's)
    from bench.analyze.snapshot import record_samples

    samples = record_samples(rec)
    summary = {
        "step_time_median_s": run_value(samples["step_time"]), "step_time_iqr_s": summ.get(SUMMARY_STEP_IQR),
        "rollout_share": run_value(samples["rollout_share"]), "free_ratio": run_value(samples["free_ratio"]),
        "throughput": run_value(samples["throughput"]), "peak_memory_gb": summ.get(SUMMARY_PEAK_MEM),
        "long_tail_waste": summ.get("long_tail_waste_median"), "wall_s": rec.get("wall_s"),
        **{f"phase/{k}_s": v for k, v in (summ.get("phase_median_s") or {}).items()},
    }
    evidence = rec.get("evidence") or {}
    phases = step_phases(rec)
    tags = {
        "bench.kind": "cell",
        "cell_id": spec.cell_id,
        "repeat": rec["repeat"],
        "status": rec["status"],
        "label": spec.label,
        "bench.label": spec.label,
        "bench.warmup_steps": ",".join(map(str, phases["warmup"])) or "none",
        "bench.profile_steps": ",".join(map(str, phases["profiled"])) or "none",
        "engine": spec.engine,
        "platform": spec.platform,
        "merged_cells": len(spec.cells),
        "git_commit": git_commit(),
        "timed_steps": summ.get("timed_steps"),
        "profiled_steps": summ.get("profiled_steps"),
        **{f"version.{k}": v for k, v in versions().items()},
        **{f"evidence.{k}": v for k, v in evidence.items() if k in REGISTRY},
        **{f"not_applicable.{k}": v for k, v in spec.not_applicable.items()},
    }
    if rec.get("patch_reports"):
        from bench.engines.verl.notes import patch_evidence

        tags.update({f"evidence.patch.{k}": v for k, v in patch_evidence(rdir).items()})
    if rec["status"] != "ok":
        tags.update({"failure_kind": rec.get("failure_kind"), "failure_reason": rec.get("reason")})
    params = {**{f"factor.{k}": ("n/a" if v is None else v) for k, v in spec.levels.items()},
              **{k: getattr(matrix.base, k) for k in KEY_SETTINGS}, "cell_id": spec.cell_id}
    arts: list = [rdir / n for n in ("run_config.yaml", "metrics.jsonl", "run.log", "evidence.json", "record.json",
                                     "engine.log")]
    # verl runs: the config verl composed (Hydra's record of the job) and the per-process patch reports
    arts += [(rdir / "hydra" / ".hydra", "verl_config"), (rdir / "patches", "patch_reports")]
    trace, prof = profile_summary(rec, rdir, summary.get("free_ratio"))
    return tracker.log_child(parent_id, f"{compact_label(spec.levels)} r{rec['repeat']}", params=params, tags=tags,
                             series=series, summary=summary, artifacts=arts, status=rec["status"],
                             start_time=run_start(rec), end_time=rec.get("finished_at"),
                             description=child_description(spec, rec, summary), trace=trace,
                             json_artifacts={"profile_summary.json": prof} if prof else None)


def run_start(rec: dict[str, Any]) -> float | None:
    """Epoch seconds at which a recorded run itself started: ``finished_at - wall_s`` (the executor's clock
    runs from the run's start, e.g. its fork, to its exit), so that MLflow's Duration is the run's wall time
    and not the harness's launch work before it (starting the fork server, importing torch: seconds on the
    first run); ``started_at`` when that is later or ``wall_s`` is missing."""
    started, finished, wall = rec.get("started_at"), rec.get("finished_at"), rec.get("wall_s")
    if finished is None or not isinstance(wall, (int, float)) or not math.isfinite(wall) or wall < 0:
        return started
    return max(started, finished - wall) if started is not None else finished - wall


def step_phases(rec: dict[str, Any]) -> dict[str, list[int]]:
    """The steps of a run record by role: ``timed`` (measured, not profiled: what the step time is
    computed from), ``profiled`` (steps the profiler recorded) and ``warmup`` (every other step: the
    warm-up steps before measuring)."""
    summ = rec.get("summary") or {}
    steps = sorted(int(s) for s in (rec.get("steps") or {}))
    timed = [int(s) for s in summ.get("timed_steps") or []]
    profiled = [int(s) for s in summ.get("profiled_steps") or []]
    return {"timed": timed, "profiled": [s for s in steps if s in profiled and s not in timed],
            "warmup": [s for s in steps if s not in timed and s not in profiled]}


def step_series(rec: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """MLflow per-step series of a run record: every per-step metric of its steps (``timing_s/step``,
    ``perf/*`` ..., with the step index), ``free_ratio/step`` at the profiled steps, and the step time split
    by step role (:func:`step_phases`): ``step_time_s`` at the timed steps only (the samples of the run's
    step time), ``step_time_s.warmup`` and ``step_time_s.profiled`` at the others."""
    series: dict[str, list[tuple[int, float]]] = {}
    for step, metrics in (rec.get("steps") or {}).items():
        for key, value in metrics.items():
            series.setdefault(key, []).append((int(step), value))
    for step, value in (rec.get("free_ratio") or {}).items():
        series.setdefault("free_ratio/step", []).append((int(step), value))
    steps = rec.get("steps") or {}
    for role, key in (("timed", "step_time_s"), ("warmup", "step_time_s.warmup"), ("profiled", "step_time_s.profiled")):
        pts = [(s, (steps.get(str(s)) or {}).get("timing_s/step")) for s in step_phases(rec)[role]]
        if pts := [(s, v) for s, v in pts if v is not None]:
            series[key] = pts
    return series


def profile_summary(rec: dict[str, Any], rdir: Path, free_ratio: float | None) -> tuple[Path | None, dict | None]:
    """The profiled step's trace file in ``rdir`` (the first torch trace the measurement read, else the first
    ``trace/*.json[.gz]``; ``None`` without one) and a small profiler summary for MLflow
    (``profile_summary.json``): the run's Free ratio (``free_ratio``, the value :func:`log_record` logs), per
    profiled step its Free ratio, basis (``device``: union of device kernels; ``cpu``: CPU ops of the main
    thread), sources and spread over sources; ``None`` when the run has no profiled step."""
    detail = rec.get("free_ratio_detail") or {}
    summ = rec.get("summary") or {}
    trace = None
    for step in sorted(detail, key=int):
        for src in detail[step].get("sources") or []:
            if src.get("kind") == "torch" and (Path(rdir) / src.get("source", "")).is_file():
                trace = Path(rdir) / src["source"]
                break
        if trace:
            break
    if trace is None:
        found = sorted(Path(rdir).glob("trace/*.json")) + sorted(Path(rdir).glob("trace/*.json.gz"))
        trace = found[0] if found else None
    if not detail and not summ.get("profiled_steps"):
        return trace, None
    steps = {step: {"free_ratio": d.get("free_ratio", (rec.get("free_ratio") or {}).get(step)),
                    "basis": sorted({s.get("basis") for s in d.get("sources") or [] if s.get("basis")}),
                    "sources": d.get("sources") or [], "spread": d.get("spread"),
                    "missing_ranks": d.get("missing_ranks") or []}
             for step, d in sorted(detail.items(), key=lambda kv: int(kv[0]))}
    for step, d in steps.items():
        d["free_ratio"] = (rec.get("free_ratio") or {}).get(step, d["free_ratio"])
    return trace, {
        "free_ratio": free_ratio,
        "free_ratio_is": "median over the profiled measured steps of the per-step Free ratio (bench.model.run_value)",
        "definition": "per profiler step window: free = window - union of busy intervals; Free ratio = free / window",
        "basis_meaning": {
            "device": "union of device kernel/memcpy/memset intervals (all streams)",
            "cpu": "union of cpu_op intervals of the main thread (no device events)",
        },
        "profiled_steps": summ.get("profiled_steps") or [],
        "profiled_measured_steps": summ.get("profiled_measured_steps"),
        "window": "one ProfilerStep#N window per profiled step",
        "steps": steps,
        "trace": str(trace.relative_to(rdir)) if trace else None,
    }


def _fmt(value: Any, unit: str = "", digits: int = 3) -> str:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return f"{value:.{digits}f}{unit}" if ok else "n/a"


def child_description(spec: RunSpec, rec: dict[str, Any], summary: dict[str, Any]) -> str:
    """Markdown description of a child run (the Description of its MLflow run page).

    Args:
        spec: the run's spec (label, cell id, factor levels, not-applicable reasons).
        rec: its ``record.json`` (status, failure kind and reason, log tail, timed steps).
        summary: the summary metrics :func:`log_record` logs (``step_time_s`` in s, shares in [0, 1],
            ``throughput`` in tokens/s ...), so that the description shows exactly the logged values.

    Returns:
        Markdown: label, repeat, cell id and status; for a failed run its failure kind and reason; a table
        of the headline values; the factor levels; for a failed run the last lines of its log.
    """
    status = rec.get("status", "?")
    lines = [f"**{spec.label}**, repeat {rec.get('repeat')}, cell `{spec.cell_id}`: **{status}**", ""]
    if status != "ok":
        lines += [f"Failure ({rec.get('failure_kind') or 'error'}): {rec.get('reason') or 'no reason recorded'}", ""]
    timed = (rec.get("summary") or {}).get("timed_steps")
    rows = [(f"step time, median of timed steps {timed}" if timed else "step time, median",
             _fmt(summary.get("step_time_median_s"), " s")),
            ("step time IQR", _fmt(summary.get("step_time_iqr_s"), " s")),
            ("rollout share", _fmt(summary.get("rollout_share"))),
            ("Free ratio", _fmt(summary.get("free_ratio"))),
            ("throughput", _fmt(summary.get("throughput"), " tokens/s", 1)),
            ("peak memory", _fmt(summary.get("peak_memory_gb"), " GB", 2)),
            ("run wall time", _fmt(summary.get("wall_s"), " s", 1))]
    lines += ["| value | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows], "",
              "Values of this run alone, as measured (the parent's summary table may show them speed-normalized "
              "to the sweep's median machine speed).", ""]
    levels = [f"{k} = {v}" for k, v in spec.levels.items() if v is not None]
    na = [f"{k} ({spec.not_applicable[k]})" if spec.not_applicable.get(k) else k
          for k, v in spec.levels.items() if v is None]
    lines.append("Factor levels: " + (", ".join(levels) or "none")
                 + ("; not applicable: " + ", ".join(na) if na else "") + ".")
    lines.append("Per-step series are under Model metrics (`timing_s/*`, `perf/*`, ...); how each factor was seen "
                 "to take effect: tags `evidence.*`, artifact `evidence.json`.")
    if status != "ok" and rec.get("log_tail"):
        tail = "\n".join(str(rec["log_tail"]).splitlines()[-15:]).replace("```", "` ` `")
        lines += ["", "Last lines of `run.log`:", "", "```", tail, "```"]
    return "\n".join(lines)


def parent_description(meta: dict[str, Any], summary_md: str | None = None) -> str:
    """Markdown description of a sweep's parent run: what the sweep is (matrix, engine, platform, design,
    runs, order) and, once it finished, the body of its ``summary.md`` (the table every other view shows).

    Args:
        meta: the sweep's ``sweep.json`` content.
        summary_md: the text of ``summary.md``; ``None`` while the sweep runs.
    """
    plan = meta.get("plan") or {}
    order = meta.get("order") or {}
    cells, repeats = len(plan.get("runs") or []), int(plan.get("repeats") or 1)
    design = ((meta.get("matrix") or {}).get("design") or {}).get("type")
    head = (f"Sweep `{meta.get('sweep_id')}` of matrix `{meta.get('matrix_name')}` "
            f"(`{meta.get('matrix_source') or 'no file'}`): engine {meta.get('engine')}, platform "
            f"{meta.get('platform')}, design {design}, {cells} cells x {repeats} repeats = {cells * repeats} runs "
            f"(a child run each), order {order.get('kind', 'sequential')}"
            + (f" (seed {order['seed']})" if order.get("seed") is not None else "") + ".")
    if summary_md is None and meta.get("stopped"):
        return (head + f"\n\nStopped ({meta.get('status')}): {meta['stopped'].get('reason')}. Finished runs are "
                "kept: rerun the same command to resume.")
    if summary_md is None:
        return head + "\n\nRunning: the summary table appears here when the sweep finishes."
    body = summary_md.split("\n", 1)[1] if summary_md.startswith("# ") else summary_md
    return head + "\n\n" + body.strip() + "\n"
