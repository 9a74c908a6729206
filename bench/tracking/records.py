"""A run record as an MLflow child run (:func:`log_record`: params, tags, per-step series, summary metrics,
artifacts, description) and the sweep parent's description, metrics and cells table (:func:`parent_cells`); used by
the sweep, ``sync`` and ``tune``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.core.metadata import flat_run_versions, git_commit, versions
from bench.measure.patch_reports import patch_evidence
from bench.measure.top_ops import TOP_N, step_top_ops
from bench.records.figures import SUMMARY_PEAK_MEM, SUMMARY_STEP_IQR, run_value
from bench.records.mfu import mlflow_metrics
from bench.records.snapshot import record_samples
from bench.records.summary import cell_rows
from bench.spec.optimizations import FACTOR_KEYS, REGISTRY, compact_label
from bench.tracking.naming import mlflow_key

if TYPE_CHECKING:
    from bench.spec.matrix import Matrix
    from bench.spec.plan import RunSpec
    from bench.tracking import Tracker

#: significant digits of the figures of the MLflow cells table (``cells.json``): short enough to read, finer
#: than the run-to-run noise of any figure the harness measures (a few percent)
CELLS_DIGITS = 4
#: the level of the speedup intervals in ``cells.json``: the report's default (``report --alpha 0.05``)
CELLS_ALPHA = 0.05


def _sig(value: Any, digits: int = CELLS_DIGITS) -> Any:
    """``value`` rounded to ``digits`` significant digits (floats only; ``None`` and non-finite -> ``None``)."""
    if isinstance(value, bool) or not isinstance(value, float):
        return value
    return float(f"{value:.{digits}g}") if math.isfinite(value) else None


def speedup_intervals(snap: dict[str, Any], alpha: float = CELLS_ALPHA) -> dict[str, list[float | None]]:
    """Cell id -> ``[low, high]`` of its speedup against the all-off cell at level ``1 - alpha``, as the report
    computes it (:func:`bench.report.tables.cell_table`: t on the log run values with the pooled run-to-run
    SD; ``[None, None]`` with one repeat or a failed cell)."""
    from bench.report.tables import cell_table  # deferred: bench.report.tables loads scipy

    rows, _ = cell_table(snap, alpha)
    return {r["cell_id"]: list(r["speedup_ci"]) for r in rows}


def cells_table(rows: list[dict[str, Any]], intervals: dict[str, list[float | None]] | None = None
                ) -> list[dict[str, Any]]:
    """The sweep parent's per-cell results table (MLflow artifact ``cells.json``) from
    :func:`bench.records.summary.cell_rows`' rows, the values of ``summary.csv`` rounded to :data:`CELLS_DIGITS`
    significant digits: ``cell`` (compact label, as in the child run names), ``label``, ``runs ok``,
    ``step time s``, ``speedup``, ``speedup low`` / ``speedup high`` (its interval from ``intervals``,
    :func:`speedup_intervals`; ``None`` without one), ``rollout share``, ``Free ratio``, ``tokens/s`` (``None``
    where ``summary.csv`` is empty), ``cell id`` and one column per factor that applies to some cell (its level,
    ``n/a``); the figures come first so that the UI's table shows them without scrolling."""
    applicable = [k for k in FACTOR_KEYS if any(r.get(k) not in (None, "n/a") for r in rows)]
    out = []
    for r in rows:
        levels = {k: (None if r.get(k) in (None, "n/a") else int(r[k])) for k in FACTOR_KEYS if k in r}
        low, high = (intervals or {}).get(r["cell_id"]) or [None, None]
        out.append({"cell": compact_label(levels, r.get("stack") or None), "label": r["label"],
                    "runs ok": f"{r['repeats_ok']}/{r['repeats']}",
                    "step time s": _sig(r.get("step_time_s")), "speedup": _sig(r.get("speedup")),
                    "speedup low": _sig(low), "speedup high": _sig(high),
                    "rollout share": _sig(r.get("rollout_share")), "Free ratio": _sig(r.get("free_ratio")),
                    "tokens/s": _sig(r.get("throughput")), "cell id": r["cell_id"], **{k: r[k] for k in applicable},
                    **({"stack": r["stack"]} if r.get("stack") else {})})
    return out


def parent_cells(snap: dict[str, Any]) -> list[dict[str, Any]]:
    """``cells.json`` of a sweep from its snapshot, speed-normalized as the sweep's summary
    (:func:`bench.records.speed.normalize_snapshot` applied first): what a finished sweep and ``sync`` log."""
    return cells_table(cell_rows(snap), speedup_intervals(snap))


#: base settings logged as params on every child run
KEY_SETTINGS = ("steps", "warmup_steps", "train_batch_size", "n", "max_prompt_length", "max_response_length",
                "ppo_mini_batch_size", "rollout_tp", "n_gpus_per_node", "nnodes")


def summary_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """MLflow metrics of the sweep's parent run from the summary rows: ``speedup.<label>`` and
    ``step_time_s.<label>`` (the values of ``summary.md``), ``perf/mfu/<phase>.<label>`` and
    ``perf/tokens_per_s_per_device/<phase>.<label>`` (its MFU section)."""
    out = {}
    for r in rows:
        for k in ("speedup", "step_time_s"):
            if r.get(k) is not None:
                out[mlflow_key(f"{k}.{r['label']}")] = float(r[k])
        for k, v in mlflow_metrics(r.get("phase_perf") or {}).items():  # bench.records.mfu.cell_phase_perf
            out[mlflow_key(f"{k}.{r['label']}")] = v
    return out


def log_record(tracker: Tracker, parent_id: str, spec: RunSpec, rec: dict[str, Any], rdir: Path,
               matrix: Matrix) -> str:
    """Log one run record as an MLflow child run of ``parent_id``; returns the child's run id."""
    summ = rec.get("summary") or {}
    series = step_series(rec)
    for step, value in rec.get("free_ratio", {}).items():
        series.setdefault("free_ratio/step", []).append((int(step), value))
    # the run's values as summary.md, the report and the gate see them (bench.records.figures.run_value of the timed
    # steps; Free ratio: profiled steps), raw seconds (a sweep's speed normalization is the parent's)
    samples = record_samples(rec)
    summary = {
        "step_time_median_s": run_value(samples["step_time"]), "step_time_iqr_s": summ.get(SUMMARY_STEP_IQR),
        "cpu_time_median_s": run_value(samples["cpu_time"]),
        "rollout_share": run_value(samples["rollout_share"]), "free_ratio": run_value(samples["free_ratio"]),
        "throughput": run_value(samples["throughput"]), "peak_memory_gb": summ.get(SUMMARY_PEAK_MEM),
        "long_tail_waste": summ.get("long_tail_waste_median"), "wall_s": rec.get("wall_s"),
        **{f"phase/{k}_s": v for k, v in (summ.get("phase_median_s") or {}).items()},
        # where the run's time went (bench.execution.runner.run_timing): start-up, GRPO steps, the harness's own time
        **{f"timing/{k}": v for k, v in (rec.get("timing") or {}).items()},
        # MFU and tokens/s per device per phase (bench.records.mfu.phase_perf, in the record's summary)
        **mlflow_metrics(summ.get("phase_perf") or {}),
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
    if rec.get("node"):  # the Ray node the run ran on (a blocking factor of the report's model)
        tags.update({"bench.node": rec["node"].get("name"), "bench.node_id": rec["node"].get("id"),
                     "bench.node_ip": rec["node"].get("ip"), "bench.ray_job": rec["node"].get("submission_id")})
    if rec.get("patch_reports"):
        tags.update({f"evidence.patch.{k}": v for k, v in patch_evidence(rdir).items()})
    if rec["status"] != "ok":
        tags.update({"failure_kind": rec.get("failure_kind"), "failure_reason": rec.get("reason")})
    params = {**{f"factor.{k}": ("n/a" if v is None else v) for k, v in spec.levels.items()},
              **{k: getattr(matrix.base, k) for k in KEY_SETTINGS}, "cell_id": spec.cell_id}
    if spec.stack:  # the stack factor's level by name, and its interpreter (issue 43)
        params["factor.stack"] = spec.stack
        tags["bench.stack"] = spec.stack
        tags["bench.stack.python"] = (rec.get("stack") or {}).get("python")
    # what the run's own process imported (bench.core.metadata.run_versions), beside the harness's version.* tags
    tags.update({f"run_version.{k}": v for k, v in flat_run_versions(rec.get("run_versions")).items()})
    for pkg, got in (((rec.get("run_versions") or {}).get("packages")) or {}).items():
        if isinstance(got, dict) and got.get("file"):  # where it was imported from (a stack's source tree shows)
            tags[f"run_version.{pkg}.file"] = got["file"]
    arts: list = [rdir / n for n in ("run_config.yaml", "metrics.jsonl", "run.log", "evidence.json", "record.json",
                                     "engine.log")]
    # verl runs: the config verl composed (Hydra's record of the job) and the per-process patch reports
    arts += [(rdir / "hydra" / ".hydra", "verl_config"), (rdir / "patches", "patch_reports")]
    trace, prof = profile_summary(rec, rdir, summary.get("free_ratio"))
    return tracker.log_child(parent_id, f"{compact_label(spec.levels, spec.stack)} r{rec['repeat']}", params=params,
                             tags=tags, series=series, summary=summary, artifacts=arts, status=rec["status"],
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
    memo: dict = {}
    for step, d in steps.items():
        d["free_ratio"] = (rec.get("free_ratio") or {}).get(step, d["free_ratio"])
        d["top_ops"] = step_top_ops(rdir, step, d["sources"], memo)
    return trace, {
        "free_ratio": free_ratio,
        "free_ratio_is": "median over the profiled measured steps of the per-step Free ratio "
                         "(bench.records.figures.run_value)",
        "definition": "per profiler step window: free = window - union of busy intervals; Free ratio = free / window",
        "basis_meaning": {
            "device": "union of device kernel/memcpy/memset intervals (all streams)",
            "cpu": "union of cpu_op intervals of the main thread (no device events)",
        },
        "profiled_steps": summ.get("profiled_steps") or [],
        "profiled_measured_steps": summ.get("profiled_measured_steps"),
        "window": "one ProfilerStep#N window per profiled step",
        "top_ops_are": f"per profiled step the top {TOP_N} operators by self time (duration minus nested operators; "
                       "cpu: cpu_op events, device: kernels and memory copies; Ascend: kernel_details.csv), from "
                       "the step's first source, read from the parse of the Free ratio (the run's .trace_cache); "
                       "self_ms in ms, share = self time / step window",
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
