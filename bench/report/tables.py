"""The report's numbers of one sweep snapshot: per-cell table with speedups, effects, replication,
article rows, minimal detectable effects and the ``expect`` claims judged on the runs (:func:`analyze`).

Pure: no files, no MLflow; the markdown is :mod:`bench.commands.report_markdown`, the plots :mod:`bench.report.plots`,
the command ``report`` is :mod:`bench.commands.report`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from bench.core.errors import BenchError
from bench.records.figures import CellResult, Snapshot, cell_stats, cell_value, reference_cell, run_values
from bench.spec.metrics import METRICS
from bench.spec.optimizations import REGISTRY, applicability, article_factors, factor_keys, not_read
from bench.spec.optimizations.versions import stack_versions
from bench.spec.stack import STACK_FACTOR, level_text, stack_names_of
from bench.stats.decide import judge_claim
from bench.stats.effects import cell_means_residual, fit_effects, run_contrast
from bench.stats.estimators import DEFAULT_ALPHA as GATE_ALPHA
from bench.stats.estimators import DEFAULT_THRESHOLD as GATE_THRESHOLD
from bench.stats.power import gate_mde, mde_from_se, noise_components

#: the article's end-to-end claim (summary)
ARTICLE_E2E = 0.30


def _ok_cells(m: Snapshot) -> list[CellResult]:
    return [c for c in m.cells if c.status == "ok" and run_values(c, "step_time")]


def _varied(cells: list[CellResult]) -> list[str]:
    """Applicable factors that take more than one level among the cells, registry order, then the ``stack`` factor
    (:mod:`bench.spec.stack`: its levels are the stacks' positions, the first the reference)."""
    return [k for k in [*factor_keys(), STACK_FACTOR]
            if len({c.levels.get(k) for c in cells if c.levels.get(k) is not None}) > 1]


def _log_runs(m: Snapshot, metric: str = "step_time") -> dict[str, list[tuple[int, float]]]:
    """Per finished cell id, its runs as ``(block = repeat, log run value)``: the observations of every test."""
    return {c.cell_id: [(k, math.log(v)) for k, v in run_values(c, metric) if v > 0] for c in _ok_cells(m)}


def _run_nodes(m: Snapshot, logs: dict[str, list[tuple[int, float]]]) -> dict[str, list[str | None]]:
    """Per finished cell id, the node of each run of ``logs`` (same order); ``None`` for a local run."""
    out = {}
    for c in _ok_cells(m):
        node_of = {r.repeat: r.node for r in c.ok_repeats()}
        out[c.cell_id] = [node_of.get(k) for k, _ in logs.get(c.cell_id, [])]
    return out


def replication(m: Snapshot) -> dict[str, Any]:
    """The unit of replication of the report's tests and its residual variance.

    ``sd``/``df``: residual SD of the log run value and its degrees of freedom in the cell-means model
    (with the time block when the sweep ran blocked, and the node when the runs ran on more than one node;
    :func:`bench.stats.effects.cell_means_residual`); ``nodes``: distinct nodes among the runs;
    ``runs_per_cell``: the most ok runs of a cell; ``note`` when no run-to-run variance can be estimated.
    """
    logs = _log_runs(m)
    blocked = m.blocked()
    nodes = _run_nodes(m, logs)
    n_nodes = len({x for v in nodes.values() for x in v})
    sd, df = cell_means_residual(list(logs.values()), blocked=blocked,
                                 nodes=[nodes[c] for c in logs] if n_nodes > 1 else None)
    most = max((len(v) for v in logs.values()), default=0)
    out = {"unit": "run", "blocked": blocked, "nodes": n_nodes, "order": (m.order or {}).get("kind", "sequential"),
           "order_seed": (m.order or {}).get("seed"), "sd": sd, "df": df, "runs_per_cell": most,
           "runs": sum(len(v) for v in logs.values()), "note": ""}
    if most <= 1 or sd is None:
        out["note"] = ("one run per cell: no run-to-run variance can be estimated, so the report gives estimates "
                       "without intervals, p values or verdicts (add repeats)")
    elif not blocked:
        out["note"] = ("the sweep ran in sequential order: machine drift during the sweep is confounded with the "
                       "cells and no block factor can absorb it (rerun with the default --order blocked)")
    return out


def cell_table(snap: dict[str, Any], alpha: float) -> tuple[list[dict[str, Any]], str | None]:
    """Per cell: values of :mod:`bench.records.figures` (step time, speedup vs the all-off cell, rollout share, Free
    ratio, throughput), the speedup's interval and p value from the runs (:func:`bench.stats.effects.run_contrast`
    with the pooled residual SD of :func:`replication`), phases and long tail. Returns (rows, reference label).

    Phases: each phase's mean share of the timed steps (``other`` = the rest of the step) times the cell's
    step time, so that the bars add up to the step time of the table.
    """
    m = Snapshot.model_validate(snap)
    st = cell_stats(m, "step_time")
    other = {k: cell_stats(m, k) for k in ("rollout_share", "free_ratio", "throughput")}
    ok = _ok_cells(m)
    ref = reference_cell(ok)
    logs = _log_runs(m)
    rep = replication(m)
    rows = []
    for c in m.cells:
        reps = c.ok_repeats()
        summ = [r.summary for r in reps]
        samples = [t for g in c.groups("step_time") for t in g]
        value = st[c.cell_id]["value"]
        shares = {p: float(np.mean([np.mean(getattr(r.samples, f"phase_share/{p}", None) or [np.nan]) for r in reps]))
                  if reps else None for p in ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "other")}
        row: dict[str, Any] = {"cell": c.label, "cell_id": c.cell_id, "levels": c.levels, "status": c.status,
                               "runs_ok": len(reps), "runs": len(c.repeats) + len(c.missing_repeats),
                               "n_steps": len(samples), "step_time_s": value,
                               "rollout_share": other["rollout_share"][c.cell_id]["value"],
                               "free_ratio": other["free_ratio"][c.cell_id]["value"],
                               "throughput": other["throughput"][c.cell_id]["value"],
                               "phases": {p: (v * value if v is not None and value is not None and math.isfinite(v)
                                              else None) for p, v in shares.items()},
                               "response_length_mean": cell_value([s.get("response_length_mean") for s in summ]),
                               "response_length_max": cell_value([s.get("response_length_max") for s in summ]),
                               "response_length_min": cell_value([s.get("response_length_min") for s in summ]),
                               "long_tail_waste": cell_value([s.get("long_tail_waste_median") for s in summ]),
                               "speedup": st[c.cell_id]["speedup"], "speedup_ci": [None, None], "p_value": None,
                               "reason": ""}
        if c.status != "ok":
            row["reason"] = (
                "; ".join(f"r{f['repeat']} {f['kind']}: {(f.get('reason') or '')[:120]}" for f in c.failures)
                or f"unfinished (repeats {c.missing_repeats})"
            )
        elif ref is not None and c.cell_id in logs:
            if c is ref:
                row.update(speedup_ci=[1.0, 1.0])
            else:
                con = run_contrast([y for _, y in logs[ref.cell_id]], [y for _, y in logs[c.cell_id]], rep["sd"],
                                   rep["df"], alpha=alpha)
                if con.ci_low is not None:
                    row["speedup_ci"] = [math.exp(-con.ci_high), math.exp(-con.ci_low)]
                row["p_value"] = con.p_value
                row["test"] = (
                    f"t on log run values, {con.df} df" if con.p_value is not None else "none (one run per cell)"
                )
        rows.append(row)
    return rows, (ref.label if ref else None)


def not_read_factors(snap: dict[str, Any]) -> dict[str, str]:
    """Per factor the sweep varied, why the stack its runs recorded (``versions``) does not read the factor's
    switch (:func:`bench.spec.optimizations.not_read`); such a factor's effect is never reported as measured."""
    engine, platform = snap.get("engine"), snap.get("platform")
    if not engine or not platform:
        return {}
    versions = stack_versions(platform, snap.get("versions") or {}, env=False)
    keys = dict.fromkeys(k for c in snap.get("cells") or [] for k, v in (c.get("levels") or {}).items()
                         if v is not None and k in REGISTRY)
    return {k: why for k in keys if (why := not_read(k, engine, platform, versions))}


def effects(snap: dict[str, Any], alpha: float, interactions: bool = True) -> dict[str, Any]:
    """Main effects and interactions with the run as the unit of replication, plus the design's alias structure.

    One observation per finished run: the log of its value (:func:`bench.records.figures.run_value`: median timed
    step, speed-normalized when the snapshot is); the time block (= repeat) is a fixed factor when the
    sweep ran blocked, and the node each run ran on when the runs ran on more than one node
    (:func:`bench.stats.effects.fit_effects`).
    """
    m = Snapshot.model_validate(snap)
    ok = _ok_cells(m)
    varied = _varied(ok)
    rep = replication(m)
    out: dict[str, Any] = {"varied": varied, "design": (snap.get("design") or {}).get("type"),
                           "aliases": snap.get("aliases") or [], "resolution": None, "fit": None, "note": "",
                           "replication": rep, "not_read": not_read_factors(snap),
                           "stack_levels": stack_names_of(snap.get("cells") or [])}
    if not varied:
        out["note"] = "no factor varies among the finished cells: no effect to estimate"
        return out
    logs = _log_runs(m)
    run_nodes = _run_nodes(m, logs)
    obs, y, blocks, nodes = [], [], [], []
    for c in ok:
        for (k, v), node in zip(logs[c.cell_id], run_nodes[c.cell_id]):
            obs.append({f: c.levels[f] for f in varied})
            y.append(v)
            blocks.append(k)
            nodes.append(str(node))
    try:
        fit = fit_effects(obs, y, varied, alpha=alpha, interactions=interactions,
                          blocks=blocks if rep["blocked"] else None, unit="run", replicated=rep["runs_per_cell"] > 1,
                          nodes=nodes)
    except ValueError as exc:
        out["note"] = str(exc)
        return out
    out["fit"] = fit.to_dict()
    # a term of a switch the stack does not read is no measured effect: out of the terms (table, plot, CSV,
    # MLflow), into ``not_read_terms`` (the table's "not read" rows)
    kept, out["fit"]["not_read_terms"] = [], []
    for t in out["fit"]["terms"]:
        why = [out["not_read"][f] for f in t.get("factors") or () if f in out["not_read"]]
        if why:
            out["fit"]["not_read_terms"].append({"name": t["name"], "aliases": t.get("aliases") or [],
                                                 "not_read": "; ".join(why)})
        else:
            kept.append(t)
    out["fit"]["terms"] = kept
    names = out["stack_levels"]
    if names and STACK_FACTOR in out["fit"]["coding"]:  # the stack factor's positions read as its stacks' names
        out["fit"]["coding"][STACK_FACTOR] += "; " + ", ".join(
            f"{i} = {level_text(STACK_FACTOR, i, names)}" for i in range(len(names)))
        for t in kept:
            if STACK_FACTOR in (t.get("factors") or ()):
                t["label"] = _stack_term_label(t["name"], names)
    return out


def _stack_term_label(name: str, names: list[str]) -> str:
    """An effect term of the ``stack`` factor as a user reads it: ``stack (b vs a)``, ``dynamic_bsz:stack (b vs
    a)``, ``stack=c (vs a)`` (a level of a factor of more than two stacks); the names from
    :func:`bench.spec.stack.level_text`."""
    ref = level_text(STACK_FACTOR, 0, names)
    head, _, level = name.partition(f"{STACK_FACTOR}=")
    if level.isdigit():
        return f"{head}{STACK_FACTOR}={level_text(STACK_FACTOR, int(level), names)} (vs {ref})"
    return f"{name} ({level_text(STACK_FACTOR, len(names) - 1, names)} vs {ref})"


def article_rows(snap: dict[str, Any], rows: list[dict[str, Any]], eff: dict[str, Any]) -> list[dict[str, Any]]:
    """The article's reported gains beside ours (gain = speedup - 1, i.e. step time ratio all-off / cell - 1)."""
    by_levels = {tuple(sorted((k, v) for k, v in r["levels"].items())): r for r in rows if r["status"] == "ok"}
    ok_cells = [c for c in snap["cells"] if c["status"] == "ok"]
    ref_m = reference_cell([c for c in Snapshot.model_validate(snap).cells if c.status == "ok"])
    ref = next((c for c in ok_cells if ref_m is not None and c["cell_id"] == ref_m.cell_id), None)
    terms = {t["name"]: t for t in ((eff.get("fit") or {}).get("terms") or [])}
    out = []

    def cell_gain(levels: dict[str, Any]) -> tuple[float | None, list]:
        r = by_levels.get(tuple(sorted(levels.items())))
        if r is None or r["speedup"] is None:
            return None, [None, None]
        ci = r["speedup_ci"]
        return r["speedup"] - 1, [None if ci[0] is None else ci[0] - 1, None if ci[1] is None else ci[1] - 1]

    # end to end: all-on vs all-off
    e2e = {
        "claim": "end to end (all optimizations)",
        "section": "summary",
        "article": ARTICLE_E2E,
        "ours_cell": None,
        "ours_cell_ci": [None, None],
        "ours_effect": None,
        "ours_effect_ci": [None, None],
        "note": "",
    }
    if ref is not None:
        # every optimization on; a stack is not an optimization: the reference cell's stack is kept
        highs = {k: (v if k == STACK_FACTOR else max(c["levels"][k] for c in ok_cells)) if v is not None else None
                 for k, v in ref["levels"].items()}
        varied = [f for f in eff.get("varied") or [] if f != STACK_FACTOR]
        if varied or STACK_FACTOR not in ref["levels"]:
            e2e["ours_cell"], e2e["ours_cell_ci"] = cell_gain(highs)
        e2e["note"] = f"all-on vs all-off over the factors varied here ({', '.join(varied) or 'none'})"
        if ref["levels"].get(STACK_FACTOR) is not None:
            stack = level_text(STACK_FACTOR, ref["levels"][STACK_FACTOR], eff.get("stack_levels") or [])
            e2e["note"] += f", both in stack {stack}"
        if e2e["ours_cell"] is None:
            e2e["note"] += "; the sweep has no finished all-on cell" if varied or STACK_FACTOR not in ref["levels"] \
                else "; no optimization varies (a stack is not one)"
    out.append(e2e)
    for key, on_level in article_factors():
        opt = REGISTRY[key]
        row = {"claim": opt.title, "factor": key, "section": opt.section, "article": opt.article_gain,
               "ours_cell": None, "ours_cell_ci": [None, None], "ours_effect": None, "ours_effect_ci": [None, None],
               "note": ""}
        if ref is None or ref["levels"].get(key, 0) is None:
            row["note"] = "not applicable: " + (
                applicability(key, snap["engine"], snap["platform"], snap.get("base") or {})
                or "not applicable in this sweep"
            )
        elif key in (eff.get("not_read") or {}):
            row["note"] = eff["not_read"][key] + ": not measured"
        elif key not in eff.get("varied", []):
            row["note"] = "not varied in this sweep"
        else:
            row["ours_cell"], row["ours_cell_ci"] = cell_gain({**ref["levels"], key: on_level})
            name = key if key in terms else f"{key}={on_level}"
            t = terms.get(name)
            if t is not None:
                # a negative effect on log step time is a gain: gain = exp(-effect) - 1
                row["ours_effect"] = math.expm1(-t["effect"])
                if t["ci_low"] is not None:
                    row["ours_effect_ci"] = [math.expm1(-t["ci_high"]), math.expm1(-t["ci_low"])]
            row["note"] = (
                f"cell: {key}={on_level} alone vs all-off; effect: OLS main effect averaged over the other factors"
            )
        out.append(row)
    return out


def mde_section(snap: dict[str, Any], alpha: float, eff: dict[str, Any]) -> dict[str, Any]:
    """Minimal detectable effects (80 % power) given the measured noise of log step time.

    The noise of a run's value is the residual SD of the cell-means model of the log run values
    (:func:`replication`); without replicated runs it is estimated from the steps
    (:func:`bench.stats.power.noise_components`: ``sqrt(sd_run^2 + sd_step^2 / steps)``, run-to-run part unknown).
    """
    m = Snapshot.model_validate(snap)
    ok = _ok_cells(m)
    noise = noise_components([c.groups("step_time") for c in ok])
    rep = (eff.get("replication") or replication(m))
    out: dict[str, Any] = {"noise": noise.to_dict(), "power": 0.8, "alpha": alpha, "unit": "run"}
    sd = rep["sd"] if rep.get("sd") is not None else noise.run_mean_sd()
    out["run_sd"], out["run_sd_source"] = sd, ("runs (cell-means model)" if rep.get("sd") is not None else
                                               "steps only: run-to-run variance unknown (one run per cell)")
    if sd is None:
        out["note"] = "too few samples to measure the noise"
        return out
    r = float(max(rep.get("runs_per_cell") or 1, 1))
    n_runs = sum(len(run_values(c)) for c in ok)
    # comparing two cells of this sweep: each cell's mean log run value has variance sd^2 / r
    se_cells = math.sqrt(2.0) * sd / math.sqrt(r)
    out["two_cells"] = mde_from_se(se_cells, alpha=alpha)
    # a +-1 main effect over N runs: var(effect) = 4 sd^2 / N
    if eff.get("fit") and n_runs:
        out["main_effect"] = mde_from_se(2.0 * sd / math.sqrt(n_runs), alpha=alpha)
    # the interleaved gate with as many blocks as this sweep has runs per cell: a block's log ratio has SD
    # sqrt(2) * sd (the one function behind the gate's "cannot judge" and this figure)
    out["gate"] = gate_mde(math.sqrt(2.0) * sd, int(r), alpha=GATE_ALPHA, threshold=GATE_THRESHOLD)
    out["gate_source"] = f"predicted for an interleaved gate with {int(r)} blocks at this sweep's run-to-run noise"
    out["runs_per_cell"], out["steps_per_run"], out["runs"] = r, noise.steps_per_run, n_runs
    return out


def claims_on_runs(snap: dict[str, Any], results: list[dict[str, Any]], alpha: float) -> list[dict[str, Any]]:
    """Judge the matrix ``expect`` claims on the runs: the cells each claim names (found by
    :func:`bench.gate.verdicts.check_expectations`) are compared by :func:`bench.stats.effects.run_contrast` of
    their run values (log scale for step time and throughput, linear for ratios), as the cell table does; the
    step-level comparison is dropped. Decided on the ``1 - alpha`` interval (:func:`bench.stats.decide.judge_claim`:
    met inside the bounds, not met outside, else cannot judge); the gate judges its claims by this function
    (:func:`bench.gate.stored.judge_claims`)."""
    m = Snapshot.model_validate(snap)
    by_label = {c.label: c for c in m.cells}
    out = []
    for e in results:
        e = dict(e)
        out.append(e)
        if "comparison" not in e or e.get("cell") not in by_label or e.get("reference") not in by_label:
            continue
        metric = METRICS[e["metric"]]
        log = metric.scale == "log"
        vals = {lab: run_values(by_label[lab], e["metric"]) for lab in (e["reference"], e["cell"])}
        if log and any(v <= 0 for lab in vals for _, v in vals[lab]):
            log = False
        ys = {c.cell_id: [(k, math.log(v) if log else v) for k, v in run_values(c, e["metric"])] for c in _ok_cells(m)}
        sd, df = cell_means_residual([v for v in ys.values() if v], blocked=m.blocked())
        ref_y = [math.log(v) if log else v for _, v in vals[e["reference"]]]
        cell_y = [math.log(v) if log else v for _, v in vals[e["cell"]]]
        e.pop("comparison")
        if not ref_y or not cell_y:
            e.update(result="cannot judge", reason="no run values for the claim's cells")
            continue
        con = run_contrast(ref_y, cell_y, sd, df, alpha=alpha)
        ref_mean = float(np.mean(ref_y))

        def change(d: float) -> float:
            return math.expm1(d) if log else d / ref_mean

        sign = 1.0 if metric.higher_is_better else -1.0
        imp = sign * change(con.diff)
        ci = sorted((sign * change(con.ci_low), sign * change(con.ci_high))) if con.ci_low is not None else [None, None]
        e.update(improvement=imp, improvement_ci=ci, p_value=con.p_value, unit="run", df=con.df,
                 runs=[con.n_ref, con.n_cell], alpha=alpha)
        e["result"], e["reason"] = judge_claim(e["at_least"], e["at_most"], ci, level=1 - alpha)
    return out


def analyze(snap: dict[str, Any], *, alpha: float = 0.05, interactions: bool = True) -> dict[str, Any]:
    """The report's statistics of one (already speed-normalized or raw) snapshot: cell rows, effects,
    replication, article rows, minimal detectable effects. Pure: no files, no MLflow.

    Raises:
        BenchError: no finished cell.
    """
    rows, ref = cell_table(snap, alpha)
    if not any(r["status"] == "ok" for r in rows):
        raise BenchError(f"{snap['source'].get('sweep')}: no finished cell to report on (" +
                         "; ".join(f"{r['cell']}: {r['reason']}" for r in rows)[:600] + ")")
    eff = effects(snap, alpha, interactions)
    return {"reference": ref, "cells": rows, "effects": eff, "replication": eff["replication"],
            "failed": [r for r in rows if r["status"] != "ok"],
            "article": article_rows(snap, rows, eff), "mde": mde_section(snap, alpha, eff)}
