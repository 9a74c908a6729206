"""The snapshot of a sweep: what the gate and the report read of it (:func:`snapshot`; a baseline file
is a saved snapshot, :mod:`bench.gate.baseline`), and the checks on it.

Per cell its factor levels (:func:`levels_key`, the gate's matching key), status and failures, and per
repeat the per-step samples of every gate metric (:func:`record_samples`), the workload fingerprints
of the timed steps (:func:`record_workload`, :func:`pairable`), the speed probe and the run's summary
statistics. Checks: :func:`check_snapshot` (the typed model), :func:`check_complete`,
:func:`check_judgeable`; :func:`cpu_pressure` of the runs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.core.errors import BenchError
from bench.core.metadata import flat_run_versions
from bench.measure import step_samples
from bench.records.figures import SUMMARY_CPU_TIME, SUMMARY_STEP_TIME, Snapshot
from bench.records.results import SWEEP, check_sweep_meta, load_records
from bench.records.speed import PROBE_METRIC, probe_spec
from bench.spec.metrics import METRICS
from bench.spec.optimizations import factor_keys
from bench.spec.stack import STACK_FACTOR

#: format of a snapshot and of a baseline file (a saved snapshot)
FORMAT = "grpo-bench-baseline"
FORMAT_VERSION = 1
#: CPU pressure (PSI some avg60, %) above which runs are called contended: other jobs shared the CPUs
CONTENDED_PSI = 40.0
#: summary values copied per repeat into the snapshot
_SUMMARY_KEYS = (SUMMARY_STEP_TIME, "step_time_iqr_s", "step_time_mean_s", SUMMARY_CPU_TIME, "rollout_share_median",
                 "free_ratio_median", "throughput_median", "phase_median_s", "peak_memory_gb",
                 "response_length_mean", "response_length_max", "response_length_min",
                 "long_tail_waste_median", "timed_steps", "profiled_steps", "measured_steps",
                 "phase_perf", "mfu_basis")


def levels_key(levels: dict[str, Any]) -> str:
    """Canonical text of a cell's factor levels (``n/a`` = not applicable); the gate's matching key."""
    keys = [*factor_keys(), STACK_FACTOR]  # the stack factor's position, where a matrix lists it
    return ",".join(f"{k}={'n/a' if levels.get(k) is None else levels[k]}" for k in keys if k in levels)


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f and abs(f) != float("inf") else None


def record_samples(rec: dict[str, Any]) -> dict[str, list[float]]:
    """Per-step samples of every gate metric in one run record (empty lists where absent), plus
    ``speed_probe``: the speed probe's seconds at each timed step (:mod:`bench.records.speed`), or empty, and
    ``phase_share/<phase>``: each phase's share of the step time at each timed step (``other`` = the
    rest of the step), so that a phase breakdown describes the same steps as the step time."""
    summ = rec.get("summary") or {}
    by_step = {int(k): v for k, v in (rec.get("steps") or {}).items() if isinstance(v, dict)}
    timed = [int(s) for s in summ.get("timed_steps") or []]
    got = step_samples(by_step, timed)  # the same function, steps and order as the record's summary
    fr_steps = summ.get("profiled_measured_steps")
    fr_map = rec.get("free_ratio") or {}
    if fr_steps is None:
        fr_steps = [int(k) for k in fr_map]
    fr = [v for v in (_num(fr_map.get(str(s))) for s in fr_steps) if v is not None]
    # the machine-speed probe of each timed step (bench.records.speed); kept only when every timed step has one
    pr = [_num((by_step.get(s) or {}).get(PROBE_METRIC)) for s in timed]
    pr = pr if pr and all(v is not None and v > 0 for v in pr) else []
    shares = {k: v for k, v in got.items() if k.startswith("phase_share/")}
    # a record without per-step metrics: the samples its summary kept (step_samples at measuring time)
    st = got["step_time"] or [v for v in (_num(x) for x in summ.get("step_time_samples_s") or []) if v is not None]
    return {"step_time": st, "cpu_time": got["cpu_time"], "throughput": got["throughput"],
            "rollout_share": got["rollout_share"],
            "free_ratio": fr, "speed_probe": pr, **shares}


#: per-step metrics that identify the work a step did (same values = same prompts and responses)
WORKLOAD_KEYS = ("response_length/mean", "response_length/max", "prompt_length/mean")


def record_workload(rec: dict[str, Any]) -> tuple[list[int], list[list[float | None]]]:
    """The timed steps of a run and, per timed step, its workload fingerprint (:data:`WORKLOAD_KEYS`).

    Runs with the same seed and settings draw the same prompts and sample the same responses in each
    step; when two runs' fingerprints agree step by step, their samples can be compared pairwise.
    """
    summ = rec.get("summary") or {}
    steps = rec.get("steps") or {}
    timed = [int(s) for s in summ.get("timed_steps") or []]
    return timed, [[_num((steps.get(str(s)) or {}).get(k)) for k in WORKLOAD_KEYS] for s in timed]


def pairable(base_cell: dict[str, Any], cand_cell: dict[str, Any], metric: str) -> bool:
    """Whether two cells' samples of ``metric`` align sample by sample: the same ok repeats, the same
    timed steps, a sample at every timed step, and equal workload fingerprints at every step."""
    if metric == "free_ratio":
        return False
    br = [r for r in base_cell["repeats"] if r.get("status") == "ok"]
    cr = [r for r in cand_cell["repeats"] if r.get("status") == "ok"]
    if not br or len(br) != len(cr):
        return False
    for x, y in zip(br, cr):
        if not x.get("steps") or x.get("steps") != y.get("steps"):
            return False
        if len(x["samples"].get(metric, [])) != len(x["steps"]) or len(y["samples"].get(metric, [])) != len(y["steps"]):
            return False
        wx, wy = x.get("workload") or [], y.get("workload") or []
        if len(wx) != len(x["steps"]) or len(wy) != len(y["steps"]):
            return False
        for a, b in zip(wx, wy):
            known = [(u, v) for u, v in zip(a, b) if u is not None and v is not None]
            if not known or any(abs(u - v) > 1e-9 * max(1.0, abs(u)) for u, v in known) or \
                    [u is None for u in a] != [v is None for v in b]:
                return False
    return True


def snapshot(sweep: Path, results_root: Path | None = None, version: str | None = None) -> dict[str, Any]:
    """Everything the gate compares, read from a sweep folder (same shape as a baseline file).

    Cells come from the sweep's plan; each carries ``status`` (``ok`` when every repeat finished ok,
    ``failed`` when a repeat failed, ``pending`` when a repeat never ran) and the failures' reasons.
    An interleaved gate sweep holds two code versions of every run: ``version`` picks one (default: the
    candidate's, so summaries and reports of a gate sweep describe the code under test).
    """
    sweep = Path(sweep)
    if not (sweep / SWEEP).exists():
        raise BenchError(f"{sweep}: not a sweep folder ({SWEEP} missing)")
    meta = check_sweep_meta(sweep / SWEEP)  # named with what is wrong (bench.records.results)
    records = load_records(sweep)
    if meta.get("code_versions"):
        records = [r for r in records if r.get("code_version") == (version or "candidate")]
    by_cell: dict[str, list[dict]] = {}
    for rec in records:
        by_cell.setdefault(rec["cell_id"], []).append(rec)
    plan = meta.get("plan") or {}
    # a sequential sweep that stopped after block k has k repeats per cell (bench.execution.blocks)
    repeats = int((meta.get("sequential") or {}).get("stopped_after") or plan.get("repeats") or 1)
    cells = []
    for spec in plan.get("runs", []):
        recs = sorted(by_cell.get(spec["cell_id"], []), key=lambda r: r.get("repeat", 0))
        reps = []
        failures = []
        for r in recs:
            summ = r.get("summary") or {}
            steps, work = record_workload(r) if r.get("status") == "ok" else ([], [])
            reps.append({"repeat": r.get("repeat"), "status": r.get("status"),
                         "samples": record_samples(r) if r.get("status") == "ok" else {m: [] for m in METRICS},
                         "steps": steps, "workload": work, "host_load": r.get("host_load"), "timing": r.get("timing"),
                         "probe_spec": probe_spec(r), "node": (r.get("node") or {}).get("id"),
                         "versions": flat_run_versions(r.get("run_versions")),
                         "summary": {k: summ.get(k) for k in _SUMMARY_KEYS if k in summ}})
            if r.get("status") != "ok":
                failures.append({"repeat": r.get("repeat"), "kind": r.get("failure_kind"),
                                 "reason": (r.get("reason") or "")[:300]})
        done = {r.get("repeat") for r in recs}
        missing = [k for k in range(repeats) if k not in done]
        status = "failed" if failures else ("pending" if missing or not recs else "ok")
        cells.append({"key": levels_key(spec["levels"]), "cell_id": spec["cell_id"], "label": spec["label"],
                      "levels": spec["levels"], "merged_cells": len(spec.get("cells") or []),
                      "all_off": bool(spec.get("all_off")), "status": status, "failures": failures,
                      "missing_repeats": missing, "repeats": reps,
                      **({"stack": spec["stack"]} if spec.get("stack") else {})})
    matrix = meta.get("matrix") or {}
    rel = sweep.name
    if results_root is not None:
        try:
            rel = sweep.resolve().relative_to(Path(results_root).resolve()).as_posix()
        except ValueError:
            rel = f"{meta.get('matrix_name')}/{sweep.name}"
    out = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "engine": meta.get("engine"), "platform": meta.get("platform"),
        "versions": meta.get("versions") or {}, "git_commit": meta.get("git_commit"),
        "source": {"matrix": meta.get("matrix_name"), "sweep_id": meta.get("sweep_id"), "sweep": rel,
                   "matrix_file": meta.get("matrix_source"), "fingerprint": meta.get("fingerprint"),
                   "parent_run_id": meta.get("parent_run_id"), "created_at": meta.get("created_at")},
        "base": matrix.get("base") or {}, "design": matrix.get("design") or {},
        "repeats": repeats, "varied": plan.get("varied") or [], "aliases": plan.get("aliases") or [],
        "expect": matrix.get("expect") or [],
        "order": {k: v for k, v in (meta.get("order") or {"kind": "sequential", "seed": None}).items() if k != "runs"},
        "cells": cells,
    }
    check_snapshot(out, str(sweep / SWEEP))
    return out


def check_snapshot(data: dict[str, Any], where: str) -> Snapshot:
    """Validate a snapshot or baseline dict against :class:`bench.records.figures.Snapshot`; returns the typed model.

    Raises:
        BenchError: one line naming ``where``, the first offending key and the problem.
    """
    from pydantic import ValidationError

    try:
        return Snapshot.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        raise BenchError(f"{where}: {loc}: {err.get('msg')}") from None


def cpu_pressure(cell_or_snap: dict[str, Any]) -> float | None:
    """Highest CPU pressure (PSI some avg60, %, at the end of each run) over the runs of a cell or snapshot."""
    cells = cell_or_snap.get("cells") or [cell_or_snap]
    vals = [((r.get("host_load") or {}).get("after") or {}).get("cpu_pressure_avg60")
            for c in cells for r in c.get("repeats", [])]
    vals = [v for v in vals if isinstance(v, (int, float))]
    return max(vals) if vals else None


def check_complete(snap: dict[str, Any], what: str) -> None:
    """Refuse a snapshot with failed/unfinished cells or cells without step-time samples.

    Raises:
        BenchError: naming each offending cell and why.
    """
    bad = []
    for c in snap["cells"]:
        if c["status"] == "failed":
            why = "; ".join(f"r{f['repeat']} {f['kind']}: {f['reason'][:120]}" for f in c["failures"])
            bad.append(f"{c['label']} ({c['cell_id']}) failed: {why}")
        elif c["status"] == "pending":
            bad.append(f"{c['label']} ({c['cell_id']}) unfinished: repeats {c['missing_repeats'] or 'all'} never ran")
        elif not all(r["samples"]["step_time"] for r in c["repeats"]):
            bad.append(f"{c['label']} ({c['cell_id']}) has a repeat without step-time samples")
    if bad:
        raise BenchError(f"{what}: {len(bad)} of {len(snap['cells'])} cells unusable: " + " | ".join(bad))


def check_judgeable(snap: dict[str, Any], what: str, alpha: float) -> None:
    """Refuse a snapshot whose cells have too few timed steps for the gate ever to judge them.

    A candidate run at the same settings has as many step-time samples per cell (``n``, all repeats
    pooled) as the baseline; the gate's default unpaired two-sided Mann-Whitney test on ``n`` + ``n``
    samples can reach ``p < alpha`` only when ``2 / C(2n, n) < alpha``
    (:func:`bench.stats.estimators.min_attainable_p`; 5 samples per side at alpha 0.01). Otherwise every gate
    against this baseline would say "cannot judge".

    Raises:
        BenchError: naming the cell with the fewest samples, the smallest possible p and what to raise
            (``repeats`` or ``steps`` in the matrix).
    """

    from bench.stats.estimators import (  # deferred: bench.stats.estimators loads scipy
        min_attainable_p,
        min_samples_for,
    )

    short = []
    for c in snap["cells"]:
        counts = [len(r["samples"].get("step_time") or []) for r in c["repeats"]]
        n = sum(counts)
        if counts and min_attainable_p(n, n) >= alpha:
            short.append((n, c, counts))
    if not short:
        return
    n, cell, counts = min(short, key=lambda x: x[0])
    need, reps, per = min_samples_for(alpha), len(counts), min(counts)
    more_steps = math.ceil(need / reps) - per
    more_reps = math.ceil(need / per) if per else None
    raise BenchError(
        f"{what}: {len(short)} of {len(snap['cells'])} cells can never pass the gate: {cell['label']} has {n} timed "
        f"step(s) ({reps} repeat(s) x {per}), so a candidate at the same settings cannot reach p < {alpha} "
        f"(smallest possible p {min_attainable_p(n, n):.3g}; the test needs {need} per cell): raise `steps` by "
        f"{more_steps}" + (f" or `repeats` to {more_reps}" if more_reps else "") + " in the matrix and rerun the sweep")
