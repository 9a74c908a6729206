"""A sweep's summary: one row per cell from its snapshot (:func:`cell_rows`) and ``summary.csv`` / ``summary.md``
(:func:`write_summary`); the MLflow parent's cells table from those rows is
:func:`bench.tracking.records.parent_cells`."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from bench.core.errors import clip_words
from bench.core.files import atomic_write_text
from bench.measure._common import iqr
from bench.records.figures import SUMMARY_PEAK_MEM, Snapshot, cell_stats
from bench.records.mfu import PHASE_FLOPS, sweep_phase_perf
from bench.records.mfu import markdown_lines as mfu_markdown
from bench.spec.optimizations import FACTOR_KEYS, REGISTRY
from bench.spec.plan import Plan


def _levels_str(levels: dict[str, int | None]) -> dict[str, str]:
    return {k: ("n/a" if v is None else str(v)) for k, v in levels.items()}


def cell_rows(snap: dict[str, Any]) -> list[dict[str, Any]]:
    """One summary row per run spec of a sweep snapshot (:func:`bench.records.snapshot.snapshot`).

    When the snapshot was speed-normalized (:func:`bench.records.speed.normalize_snapshot`) every value is at
    the sweep's median machine speed; ``step_time_raw_s`` keeps the measured seconds. Values come from
    :mod:`bench.records.figures` (the report and MLflow use the same functions): ``step_time_s`` = geometric mean
    over the ok repeats of each run's median timed step (s); ``speedup`` = all-off cell's value / this
    cell's (> 1 = faster); rollout share, Free ratio and throughput likewise per run, then over runs.

    Columns: cell_id, label, one per factor, stack (the stack's name where the matrix lists the ``stack`` factor),
    versions (what the cell's ok runs imported, each in its own process: ``verl 0.9.1, torch 2.13.0``; a package
    whose runs disagree lists each version), merged (design cells represented), repeats_ok, repeats,
    step_time_s, step_time_raw_s, step_time_iqr_s (of the pooled timed steps), speedup, rollout_share,
    free_ratio, throughput, peak_memory_gb, status, reason, all_off, startup_s, steps_s, harness_s (means over
    the ok runs of :func:`bench.execution.runner.run_timing`: start-up, all GRPO steps, the harness's own time;
    seconds),
    nodes (the Ray node of each repeat, ``r0 1a2b3c4d; r1 ...``: first 8 hex digits of the node id; empty for
    local runs).
    """
    model = Snapshot.model_validate(snap)
    st = cell_stats(model, "step_time")
    raw = cell_stats(model, "step_time_raw")
    others = {m: cell_stats(model, m) for m in ("rollout_share", "free_ratio", "throughput")}
    cell_perf, basis = sweep_phase_perf(model.cells)
    perf = {c.cell_id: p for c, p in cell_perf}
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
            "peak_memory_gb": max((m for r in ok if (m := r.summary.get(SUMMARY_PEAK_MEM)) is not None), default=None),
            "status": c.status,
            "reason": "; ".join(f"r{f['repeat']} {f['kind']}: {clip_words(f.get('reason') or '', 120)}"
                                for f in c.failures)
            or (f"unfinished (repeats {c.missing_repeats})" if c.status == "pending" else ""),
            "all_off": c.all_off,
            **_timing(c),
            "nodes": "; ".join(f"r{r.repeat} {r.node[:8]}" for r in c.repeats if r.node),
            "stack": getattr(c, "stack", None) or "",
            "versions": run_versions_text([getattr(r, "versions", None) or {} for r in ok]),
            "phase_perf": perf[c.cell_id],
            **{f"mfu_{p}": v.get("mfu") for p, v in perf[c.cell_id].items()},
            **{f"tokens_per_s_per_device_{p}": v.get("tokens_per_s_per_device") for p, v in perf[c.cell_id].items()},
        }
        rows.append(row)
    if basis is not None and rows:
        rows[0]["mfu_basis"] = basis
    return rows


def _timing(cell: Any) -> dict[str, float | None]:
    """Per cell, the mean over its ok runs of each run's ``startup_s``, ``steps_s`` and ``harness_s``
    (:func:`bench.execution.runner.run_timing`; ``None`` for runs recorded before it existed)."""
    out: dict[str, float | None] = {}
    for key in ("startup_s", "steps_s", "harness_s"):
        v = [float(r.timing[key]) for r in cell.ok_repeats() if isinstance(getattr(r, "timing", None), dict)
             and r.timing.get(key) is not None]
        out[key] = sum(v) / len(v) if v else None
    return out


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def write_summary(sweep_dir: Path, rows: list[dict[str, Any]], header: dict[str, Any],
                  sections: list[str] | None = None) -> tuple[Path, Path]:
    """Write ``summary.csv`` and ``summary.md`` (atomically) into the sweep folder; returns both paths.
    ``sections``: markdown lines after the cells table (a sequential sweep's verdicts,
    :func:`bench.planning.view.summary_lines`)."""
    stacks = any(r.get("stack") for r in rows)  # a sweep of the stack factor: its level and each run's versions
    cols = ["cell_id", "label", *FACTOR_KEYS, *(["stack", "versions"] if stacks else []), "merged", "repeats_ok",
            "repeats", "step_time_s", "step_time_raw_s",
            "step_time_iqr_s", "speedup", "rollout_share", "free_ratio", "throughput", "peak_memory_gb",
            "status", "reason", "startup_s", "steps_s", "harness_s", "nodes",
            *(f"{fig}_{p}" for p in PHASE_FLOPS for fig in ("mfu", "tokens_per_s_per_device"))]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in cols})
    csv_path, md_path = sweep_dir / "summary.csv", sweep_dir / "summary.md"
    atomic_write_text(csv_path, buf.getvalue())
    md = [f"# Sweep {header.get('sweep_id')} of `{header.get('matrix')}`", ""]
    md += [f"- {k}: {v}" for k, v in header.items() if k not in ("sweep_id", "matrix")]
    nodes = any(r.get("nodes") for r in rows)  # runs on Ray nodes: which node each repeat ran on
    md += [
        "",
        "| cell | "
        + " | ".join(REGISTRY[k].key for k in FACTOR_KEYS)
        + (" | stack | versions (each run's own)" if stacks else "")
        + " | step time s | raw step time s | IQR s | speedup vs all-off"
        + " | rollout share | Free ratio | tokens/s | status | start-up s | steps s | harness s |"
        + (" Ray node per repeat |" if nodes else ""),
        "|---" * (len(FACTOR_KEYS) + 12 + nodes + 2 * stacks) + "|",
    ]
    for r in rows:
        md.append(
            f"| {r['label']} (`{r['cell_id']}`) | "
            + " | ".join(r[k] for k in FACTOR_KEYS)
            + (f" | {r.get('stack') or '-'} | {r.get('versions') or '-'}" if stacks else "")
            + f" | {_fmt(r['step_time_s'])} | {_fmt(r['step_time_raw_s'])}"
            + f" | {_fmt(r['step_time_iqr_s'])} | {_fmt(r['speedup'])}"
            f" | {_fmt(r['rollout_share'])} | {_fmt(r['free_ratio'])} | {_fmt(r['throughput'], 1)}"
            f" | {r['status']}{(': ' + clip_words(r['reason'], 80)) if r['reason'] else ''}"
            f" | {_fmt(r.get('startup_s'), 1)} | {_fmt(r.get('steps_s'), 1)} | {_fmt(r.get('harness_s'), 1)} |"
            + (f" {r.get('nodes') or '-'} |" if nodes else "")
        )
    md += mfu_markdown([(f"{r['label']} (`{r['cell_id']}`)", r.get("phase_perf") or {}) for r in rows],
                       next((r["mfu_basis"] for r in rows if r.get("mfu_basis")), None))
    atomic_write_text(md_path, "\n".join(md + list(sections or [])) + "\n")
    return csv_path, md_path


def run_versions_text(runs: list[dict[str, str]]) -> str:
    """The versions of a cell's runs (each a :func:`bench.core.metadata.flat_run_versions`) as one text:
    ``verl 0.9.1, torch 2.13.0``; a package whose runs disagree lists each version (``verl 0.9.0/0.9.1``)."""
    seen: dict[str, list[str]] = {}
    for got in runs:
        for k, v in got.items():
            if v not in seen.setdefault(k, []):
                seen[k].append(v)
    return ", ".join(f"{k} {'/'.join(v)}" for k, v in seen.items())


def plan_summary(plan: Plan) -> list[dict[str, Any]]:
    """JSON-ready list of the plan's runs (cell id, label, levels, merged cells, not-applicable reasons, and the
    stack's name where the matrix lists the ``stack`` factor)."""
    return [{"cell_id": r.cell_id, "label": r.label, "levels": r.levels, "cells": r.cells,
             "not_applicable": r.not_applicable, "all_off": r.is_all_off(), **({"stack": r.stack} if r.stack else {})}
            for r in plan.runs]


def sweep_header(meta: dict[str, Any], rows: list[dict[str, Any]], probe_ref: float | None,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The head of ``summary.md`` (key -> text) of a sweep from its ``sweep.json`` content ``meta`` (its first
    invocation's wall time and overhead; resumes listed), the :func:`cell_rows` ``rows``, the speed-probe
    reference time ``probe_ref`` (seconds; ``None``: raw values) and ``extra`` lines (the sequential looks)."""
    extra = extra or {}
    first = meta["invocations"][0]
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
        "tokens/s": "per run the median perf/throughput, geometric mean over the cell's ok repeats"
        + ("; speed-normalized like the step time" if probe_ref else "; raw"),
        "run order": f"{meta.get('order', {}).get('kind', 'sequential')}"
        + (f", seed {meta['order']['seed']}" if (meta.get("order") or {}).get("seed") is not None else ""),
        "harness overhead": f"{first['overhead_share']:.1%} of {first['wall_s']:.1f} s wall "
        f"(in GRPO steps {first['in_step_s']:.1f} s)",
        **extra,
    }
    resumes = meta["invocations"][1:]
    if resumes:
        header["resumed"] = "; ".join(
            f"invocation {i}: {inv['wall_s']:.1f} s wall, overhead {inv['overhead_share']:.1%}, executed "
            f"{inv['executed']}, cached {inv['skipped']}" for i, inv in enumerate(resumes, 2))
    return header
