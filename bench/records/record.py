"""Measure a finished run folder into a run record (the JSON every later stage reads).

A record holds the run's status (``ok`` / ``failed`` with a kind and a one-line reason and the tail of
its log), the per-step metrics of the verl JSONL, the per-step Free ratio, the summary statistics of
:func:`bench.measure.summarize`, and the evidence that each factor took effect.

Every time figure uses the *timed* steps: the measured (non-warm-up) steps that ran without the
profiler when there are any, else all measured steps (the summary says which: profiling perturbs
timing); the Free ratio comes from the profiled steps (:mod:`bench.measure.run_summary`, computed once).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from bench.core.errors import clip_words
from bench.core.files import atomic_write_json, read_json
from bench.core.metadata import RUN_VERSIONS_FILE
from bench.core.process import ExecResult
from bench.measure import MeasureError, collect, summarize
from bench.measure.evidence import factor_evidence, flagged
from bench.records.results import RECORD, is_record
from bench.records.run_record import SCHEMA_VERSION, RecordError, RunRecord, read_record
from bench.records.speed import probe_from_patches
from bench.spec.optimizations import registry

LOG_TAIL_LINES = 30
#: a log line that says what went wrong (a crash's reason quotes the last such line of the run's log, never an
#: unrelated last line such as a logger's start-up message)
ERROR_LINE = re.compile(r"error|exception|traceback|fatal|fault|abort|killed|signal|assert", re.IGNORECASE)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a text file ('' when missing); reads at most the last 64 KiB."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 65536))
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def _failure(run_dir: Path, res: ExecResult) -> tuple[str, str]:
    """(kind, reason) of a failed run: the engine's ``failure.json`` if any, else the executor's view."""
    info = read_json(run_dir / "failure.json") or {}
    if info.get("reason"):
        return str(info.get("kind", "error")), str(info["reason"])
    if res.timed_out:
        return "timeout", res.reason
    tail = log_tail(run_dir / "run.log", 200).lower()
    if "out of memory" in tail or "outofmemoryerror" in tail or "out of memory" in res.reason:
        return "oom", res.reason + (" (out of memory in log)" if "out of memory" in tail else "")
    last = next((ln.strip() for ln in reversed(log_tail(run_dir / "run.log").splitlines()) if ERROR_LINE.search(ln)),
                "")
    return "crash", clip_words(f"{res.reason}: {last}", 500) if last else res.reason


def build_record(run_dir: Path, res: ExecResult, *, spec: dict[str, Any], repeat: int, warmup_steps: int,
                 started_at: float, classify_failure: Any = None) -> dict[str, Any]:
    """Measure ``run_dir`` after the executor returned ``res``; the record as a JSON-ready dict.
    ``classify_failure``: the engine's reading of a failed run's log
    (:meth:`bench.engines.base.EngineBase.classify_failure`), or ``None``."""
    run_dir = Path(run_dir)
    rec: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "cell_id": spec["cell_id"],
        "repeat": repeat,
        "engine": spec["engine"],
        "platform": spec["platform"],
        "levels": spec["levels"],
        "cells": spec["cells"],
        "not_applicable": spec.get("not_applicable", {}),
        "started_at": started_at,
        "finished_at": time.time(),
        "wall_s": res.wall_s,
        "returncode": res.returncode,
        "node": res.node,  # the Ray node the run ran on (id, ip, name, submission_id, job_start/end); None locally
        "status": "ok",
        "failure_kind": None,
        "reason": "",
        "log_tail": "",
        "steps": {},
        "free_ratio": {},
        "summary": {},
        "evidence": read_json(run_dir / "evidence.json") or {},
        "patch_reports": [read_json(p) for p in sorted((run_dir / "patches").glob("*.json"))],
        "warnings": [],
    }
    try:
        got = collect(run_dir)
    except MeasureError as exc:
        got = None
        rec["warnings"].append(str(exc))
    if got is not None:
        rec["steps"] = {str(k): v for k, v in got["metrics"].items()}
        rec["free_ratio"] = {str(k): v for k, v in got["free_ratio"].items()}
        rec["free_ratio_detail"] = {str(k): v for k, v in got["free_ratio_detail"].items()}
        rec["warnings"].extend(got["warnings"])
        if got["metrics"]:
            rec["summary"] = summarize(got, warmup_steps)
    ran = read_json(run_dir / RUN_VERSIONS_FILE)
    if isinstance(ran, dict) and ran.get("packages"):  # written by the run's own process (issue 43)
        rec["run_versions"] = ran
    if "speed_probe" not in rec["evidence"]:  # a probe timed by a patch (verl:cpu's driver), named in its report
        sp = probe_from_patches(rec["patch_reports"])
        if sp is not None:
            rec["evidence"]["speed_probe"] = sp
    _registry_evidence(run_dir, rec)  # every engine: the checks the registry names for its target
    if res.returncode != 0 or res.timed_out:
        rec["status"] = "failed"
        rec["failure_kind"], rec["reason"] = _failure(run_dir, res)
        got = classify_failure and classify_failure(
            run_dir, log_tail(run_dir / "run.log", 400), timed_out=res.timed_out, steps_done=len(rec["steps"]),
            returncode=res.returncode, argv=spec["launch"]["argv"])
        if got:
            rec["failure_kind"], rec["reason"] = got
    elif not rec["summary"] or rec["summary"].get("step_time_median_s") is None:
        rec["status"] = "failed"
        rec["failure_kind"], rec["reason"] = "no_metrics", "the run exited 0 but wrote no step metrics"
    if rec["status"] != "ok":
        rec["log_tail"] = log_tail(run_dir / "run.log")
    return rec


def _registry_evidence(run_dir: Path, rec: dict[str, Any]) -> None:
    """Evidence of every applicable factor from the check its registry entry names for this engine/platform
    (:attr:`bench.spec.optimizations.Optimization.evidence_checks`, :mod:`bench.measure.evidence`; ``missing``
    where it names none), into the record, and into ``evidence.json`` (``{"factors": ...}``) unless the run wrote
    its own there. Missing or contradicted evidence becomes a warning."""
    levels = {k: v for k, v in rec["levels"].items() if v is not None and k in registry()}
    if not levels:
        return
    ev = factor_evidence(run_dir, levels, rec["engine"], rec["platform"])
    rec["evidence"] = {**rec["evidence"], **{k: f"{v['verdict']}: {v['detail']}" for k, v in ev.items()}}
    rec["evidence_verdicts"] = {k: v["verdict"] for k, v in ev.items()}
    rec["evidence_flagged"] = flagged(ev)
    for key in rec["evidence_flagged"]:
        rec["warnings"].append(f"factor {key}: evidence {ev[key]['verdict']}: {ev[key]['detail']}")
    if not (run_dir / "evidence.json").exists():
        atomic_write_json(run_dir / "evidence.json", {"factors": ev})


def write_record(run_dir: Path, record: dict[str, Any]) -> None:
    """Write ``record.json`` atomically (last file of a run: its presence marks the run measured), after
    validating it as a :class:`~bench.records.run_record.RunRecord` (a record that its own loader would refuse is
    never written).

    Raises:
        pydantic.ValidationError: ``record`` is not a valid run record (a harness bug, not bad input).
    """
    RunRecord.model_validate(record)
    atomic_write_json(Path(run_dir) / RECORD, record)


def is_finished(run_dir: Path) -> bool:
    """True when the run folder holds a usable record (:func:`bench.records.run_record.read_record`) with status ``ok``;
    an unusable one (truncated, wrong types, non-finite times) is not finished: the run is done again."""
    try:
        rec = read_record(Path(run_dir) / RECORD)
    except RecordError:
        return False
    return bool(rec is not None and is_record(rec) and rec.get("status") == "ok")
