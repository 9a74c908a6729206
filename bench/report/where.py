"""Where each optimization acts: the report's run-level model fitted to each operator category's time, and the
trace diff between a factor's cell and the base cell.

Per run (the unit of replication, as for the step time): its category times per profiled step
(:func:`bench.measure.run_ops.ensure_op_times`, the run folder's ``op_times.json``), averaged over its
profiled steps (ms per step; raw, not speed-normalized: the blocks absorb the sweep's drift as they do for the
step time). Each category's run values go through the report's own fit (:func:`bench.stats.effects.fit_effects`
with the observations, blocks, nodes, interactions and level of :func:`bench.report.tables.effects`), on the
millisecond scale (a category can be 0 in a cell, so not on the log scale): a main effect's ``effect`` is the
change in ms per step from the low to the high level (``2 x coefficient``; a dummy-coded level: that level minus
the first), with its t interval; the % is that change over the mean run value at the factor's first level (the
interval in % divides the ms interval by the same mean).

Trace diff (:func:`trace_diff`): per cell the median over its runs of each operator's ms per step (0 in a run
that lacks it); ops present in one cell only *appear* / *vanish*, others get *faster* / *slower*; the top ``n``
by absolute change.

:func:`where_metrics` is the one flat view of the figures that the markdown, ``report.json`` (the section
itself) and MLflow (metrics ``report.where.*``) are written from.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from bench.measure.op_categories import CATEGORIES
from bench.measure.run_ops import ALL_PHASES, ensure_op_times
from bench.records.figures import Snapshot, reference_cell
from bench.records.run_record import load_records
from bench.report.tables import _ok_cells, _varied
from bench.stats.effects import fit_effects

#: operators listed per trace diff
DIFF_TOP_N = 8
#: categories listed per factor
CATEGORIES_PER_FACTOR = 6

#: what a trace of this platform cannot show (``cpu``: no device events, the torch CPU trace's cpu_op self times)
PLATFORM_NOTES = {
    "cpu": ("CPU trace: no device events, so the categories are the torch cpu_op self times of the profiled step. "
            "AI-CPU tasks, ViewCopy / TransData (Ascend's copy kernels) and HCCL collectives exist only in an "
            "Ascend trace: ai_cpu is always 0 here, copy counts aten::copy_ / contiguous / reshapes, and "
            "communication is gloo or nothing; the NPU fused kernels (npu_rms_norm, npu_rotary_mul) that "
            "rmsnorm_fused / mrope_cache swap in on Ascend do not exist on CPU."),
    "cuda": ("GPU trace: device kernels by duration; AI-CPU and ViewCopy exist only on Ascend (ai_cpu is 0)."),
}


def run_category_values(run_dir: Path, record: dict[str, Any]) -> dict[str, Any] | None:
    """One run's ``{"series": {series: ms per step}, "ops": {name: ms per step}}``: the mean over its profiled
    steps; series are the categories (summed over phases) and, when the run has named phases, ``phase:category``.
    ``None`` when the run has no readable profiled step."""
    got = ensure_op_times(run_dir, record)
    steps = list((got.get("steps") or {}).values())
    if not steps:
        return None
    series: dict[str, float] = {}
    ops: dict[str, float] = {}
    for s in steps:
        for c in CATEGORIES:
            series[c] = series.get(c, 0.0) + s["category_ms"].get(c, 0.0) / len(steps)
        for ph, cats in (s.get("phases") or {}).items():
            if ph != ALL_PHASES:
                for c in CATEGORIES:
                    series[f"{ph}:{c}"] = series.get(f"{ph}:{c}", 0.0) + cats.get(c, 0.0) / len(steps)
        for name, ms in (s.get("ops") or {}).items():
            ops[name] = ops.get(name, 0.0) + ms / len(steps)
    return {"series": series, "ops": ops}


def collect(sweep: Path, snap: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    """:func:`run_category_values` of every ok run of the snapshot's cells, keyed ``(cell id, repeat)``."""
    wanted = {(c["cell_id"], r["repeat"]) for c in snap["cells"] for r in c["repeats"] if r.get("status") == "ok"}
    out = {}
    for rec in load_records(sweep):
        key = (rec.get("cell_id"), rec.get("repeat"))
        if key in wanted and rec.get("status") == "ok":
            v = run_category_values(Path(rec["_dir"]), rec)
            if v is not None:
                out[key] = v
    return out


def fit_series(snap: dict[str, Any], runs: dict[tuple[str, int], dict[str, Any]], series: str, *,
               alpha: float, interactions: bool, blocked: bool, nodes_varied: bool) -> dict[str, Any] | None:
    """The report's fit of one series (ms per step) over the runs: ``{"fit": EffectsFit dict, "base": {factor:
    mean at its first level}}``; ``None`` when no factor varies among the runs that have it or the fit fails."""
    m = Snapshot.model_validate(snap)
    cells = [c for c in _ok_cells(m) if any((c.cell_id, r.repeat) in runs for r in c.ok_repeats())]
    varied = _varied(cells)
    if not varied:
        return None
    obs, y, blocks, nodes = [], [], [], []
    per_cell: dict[str, int] = {}
    for c in cells:
        for r in c.ok_repeats():
            v = runs.get((c.cell_id, r.repeat))
            if v is None:
                continue
            obs.append({f: c.levels[f] for f in varied})
            y.append(v["series"].get(series, 0.0))
            blocks.append(r.repeat)
            nodes.append(str(r.node))
            per_cell[c.cell_id] = per_cell.get(c.cell_id, 0) + 1
    try:
        fit = fit_effects(obs, y, varied, alpha=alpha, interactions=interactions, blocks=blocks if blocked else None,
                          unit="run", replicated=max(per_cell.values()) > 1, nodes=nodes if nodes_varied else None)
    except ValueError:
        return None
    base = {}
    for f in varied:
        first = min(o[f] for o in obs)
        vals = [yy for o, yy in zip(obs, y) if o[f] == first]
        base[f] = float(np.mean(vals)) if vals else None
    return {"fit": fit.to_dict(), "base": base}


def _pct(x: float | None, base: float | None) -> float | None:
    return None if x is None or not base else 100.0 * x / base


def factor_rows(fits: dict[str, dict[str, Any]], not_read: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """Per factor term (main effect or level), one row per series: ``{"series", "base_ms", "change_ms",
    "ci_low_ms", "ci_high_ms", "change_pct", "ci_low_pct", "ci_high_pct", "p_value", "moves"}`` (``moves``: the
    interval excludes 0), sorted by absolute ms change. Terms of a factor the stack does not read are left out."""
    out: dict[str, list[dict[str, Any]]] = {}
    for series, got in fits.items():
        for t in got["fit"]["terms"]:
            if t["kind"] == "interaction" or any(f in not_read for f in t["factors"]):
                continue
            base = got["base"].get(t["factors"][0])
            lo, hi = t["ci_low"], t["ci_high"]
            out.setdefault(t["name"], []).append({
                "series": series, "base_ms": base, "change_ms": t["effect"], "ci_low_ms": lo, "ci_high_ms": hi,
                "change_pct": _pct(t["effect"], base), "ci_low_pct": _pct(lo, base), "ci_high_pct": _pct(hi, base),
                "p_value": t["p_value"], "moves": lo is not None and hi is not None and (lo > 0 or hi < 0)})
    for rows in out.values():
        rows.sort(key=lambda r: (-abs(r["change_ms"]), r["series"]))
    return out


def cell_ops(runs: dict[tuple[str, int], dict[str, Any]], cell_id: str) -> dict[str, float]:
    """Median over the cell's runs of each operator's ms per step (0 in a run that lacks the operator)."""
    mine = [v["ops"] for (cid, _), v in sorted(runs.items()) if cid == cell_id]
    names = sorted({n for ops in mine for n in ops})
    return {n: float(np.median([ops.get(n, 0.0) for ops in mine])) for n in names} if mine else {}


def trace_diff(base: dict[str, float], cell: dict[str, float], n: int = DIFF_TOP_N) -> list[dict[str, Any]]:
    """Operators that appear, vanish, get faster or slower from ``base`` to ``cell`` (``{name: ms per step}``),
    the top ``n`` by absolute change: ``[{"op", "status", "base_ms", "cell_ms", "change_ms"}]`` (``status``:
    ``appears`` (0 in base), ``vanishes`` (0 in the cell), ``slower``, ``faster``, ``same``)."""
    rows = []
    for name in sorted(set(base) | set(cell)):
        a, b = base.get(name, 0.0), cell.get(name, 0.0)
        status = ("appears" if a == 0 and b > 0 else "vanishes" if b == 0 and a > 0 else
                  "slower" if b > a else "faster" if b < a else "same")
        rows.append({"op": name, "status": status, "base_ms": a, "cell_ms": b, "change_ms": b - a})
    rows.sort(key=lambda r: (-abs(r["change_ms"]), r["op"]))
    return rows[:n]


def _factor_cells(snap: dict[str, Any], ref_id: str) -> list[tuple[str, Any, str]]:
    """``(factor, level, cell id)`` of each cell that differs from the reference cell in one factor only."""
    cells = {c["cell_id"]: c for c in snap["cells"] if c["status"] == "ok"}
    ref = cells[ref_id]["levels"]
    out = []
    for cid, c in cells.items():
        diff = [k for k, v in c["levels"].items() if v != ref.get(k)]
        if len(diff) == 1:
            out.append((diff[0], c["levels"][diff[0]], cid))
    return sorted(out, key=lambda x: (x[0], str(x[1])))


def where_section(sweep: Path, snap: dict[str, Any], eff: dict[str, Any], *, alpha: float,
                  interactions: bool) -> dict[str, Any]:
    """The report's ``where`` section (see the module text): ``{"runs", "series", "absent", "factors": {term: rows},
    "diffs": [{"factor", "level", "cell", "base_cell", "ops": [...]}], "platform_note", "note", "unit"}``."""
    runs = collect(Path(sweep), snap)
    out: dict[str, Any] = {"runs": len(runs), "unit": "ms per profiled step (mean over the run's profiled steps)",
                           "factors": {}, "diffs": [], "series": [],
                           "platform_note": PLATFORM_NOTES.get(str(snap.get("platform")), ""), "note": ""}
    if not runs:
        out["note"] = "no run has a readable profiled step (no trace kept): nothing to attribute"
        return out
    rep = eff.get("replication") or {}
    series = sorted({s for v in runs.values() for s, x in v["series"].items()},
                    key=lambda s: (":" in s, s))
    out["series"] = [s for s in series if any(v["series"].get(s, 0.0) > 0 for v in runs.values())]
    # categories no trace of any run holds (nothing to fit: on CPU rotary, ai_cpu, ...), named so a reader knows
    # they were looked for
    out["absent"] = [c for c in CATEGORIES if c not in out["series"]]
    fits = {}
    for s in out["series"]:
        got = fit_series(snap, runs, s, alpha=alpha, interactions=interactions, blocked=bool(rep.get("blocked")),
                         nodes_varied=(rep.get("nodes") or 0) > 1)
        if got is not None:
            fits[s] = got
    out["factors"] = factor_rows(fits, eff.get("not_read") or {})
    if any(f.get("replicated") is False for f in (g["fit"] for g in fits.values())):
        out["note"] = "one run per cell: estimates without intervals (add repeats)"
    m = Snapshot.model_validate(snap)
    ref = reference_cell([c for c in m.cells if c.status == "ok"])
    if ref is not None:
        base_ops = cell_ops(runs, ref.cell_id)
        for f, level, cid in _factor_cells(snap, ref.cell_id):
            if base_ops and (ops := cell_ops(runs, cid)):
                out["diffs"].append({"factor": f, "level": level, "cell": cid, "base_cell": ref.cell_id,
                                     "ops": trace_diff(base_ops, ops)})
    return out


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def shown_rows(section: dict[str, Any] | None) -> dict[str, list[dict[str, Any]]]:
    """Per factor term the rows the report shows: of each group of series (the whole step's categories, and each
    phase's ``phase:category``), the first :data:`CATEGORIES_PER_FACTOR` by absolute change, so a phase whose
    times are smaller (the rollout beside the training) is never crowded out; in the order of the term's rows
    (all rows stay in ``report.json``'s section)."""
    out = {}
    for term, rows in ((section or {}).get("factors") or {}).items():
        seen: dict[str, int] = {}
        keep = []
        for r in rows:
            group = r["series"].split(":", 1)[0] if ":" in r["series"] else ""
            seen[group] = seen.get(group, 0) + 1
            if seen[group] <= CATEGORIES_PER_FACTOR:
                keep.append(r)
        out[term] = keep
    return out


def where_metrics(section: dict[str, Any] | None) -> dict[str, float]:
    """The shown figures (:func:`shown_rows`, the trace diffs) as one flat ``{key: value}`` (keys
    ``where.<term>.<series>.<field>`` and ``where.diff.<factor>=<level>.<op>.change_ms``): what MLflow logs
    (prefixed ``report.``), what the markdown prints and what ``report.json``'s section holds, from one place."""
    out: dict[str, float] = {}
    for term, rows in shown_rows(section).items():
        for r in rows:
            for k in ("change_ms", "ci_low_ms", "ci_high_ms", "change_pct", "ci_low_pct", "ci_high_pct"):
                if (v := _num(r[k])) is not None:
                    out[f"where.{term}.{r['series']}.{k}"] = v
    for d in (section or {}).get("diffs") or []:
        for o in d["ops"]:
            out[f"where.diff.{d['factor']}={d['level']}.{o['op'][:120]}.change_ms"] = float(o["change_ms"])
    return out
