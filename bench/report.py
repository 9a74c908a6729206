"""``run_bench.py report SWEEP``: what each optimization buys, whether they interact, and how sure we are.

Writes into ``<sweep>/report/`` (or ``--out``) and logs on the sweep's MLflow parent run (artifacts
under ``report/``, effect metrics, tag ``bench.report``):

* ``report.md``: the tables below, with the plots linked; ``report.json``: the same numbers;
  ``effects.csv``: the model terms;
* the unit of replication is the **run**: each finished run is summarized by its value
  (:func:`bench.model.run_value`: median of its timed steps, speed-normalized when every run timed the
  probe) and every interval and p value below is computed from run values, never from steps as if they
  were independent samples; the time block (repeat ``k`` of a blocked sweep) is a fixed factor;
* per cell: speedup vs the all-off cell (:func:`bench.model.speedup` of the cells' geometric-mean run
  values, the same number as ``summary.md``) with a t interval and p value from the log run values and
  the pooled residual SD of the cell-means model (:func:`bench.analyze.effects.run_contrast`) -> ``speedup.png``;
* main effects and two-factor interactions: OLS (statsmodels) of the log run values, factors coded +-1
  (effect = 2 x coefficient; factors with more than two levels dummy-coded vs their first level), the
  block as a factor, residual degrees of freedom stated, Holm-adjusted p values deciding "significant";
  with one run per cell, estimates only (no run-to-run variance to test against); for fractional
  designs the alias structure (pyDOE3) and which interactions are confounded -> ``effects.png``;
* phase breakdown per cell (gen, old_log_prob, ref, update_actor, other = step - those, reward and
  adv included): each phase's mean share of the timed steps times the cell's step time, so the bars add
  up to the table's step time; with the rollout share and the Free ratio -> ``phases.png``;
* the rollout long tail (article 2.6): response length min / mean / max per cell and the decode slots
  wasted waiting for the longest sample, ``1 - mean/max`` -> ``long_tail.png``;
* the article's reported gains (+30 % end to end, ~+15 % dynamic bsz, +9 % task queue, +8 % mc2)
  beside ours -> ``article.png``;
* the minimal detectable effect given the measured noise (within-run and run-to-run), for a
  two-cell comparison, a main effect, and the gate against a baseline;
* the matrix's ``expect`` claims, when it has some, judged on the runs (:func:`claims_on_runs`).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.analyze.effects import cell_means_residual, fit_effects, run_contrast
from bench.analyze.estimators import N_BOOT
from bench.analyze.power import mde_from_se, noise_components
from bench.baseline import snapshot
from bench.errors import BenchError
from bench.gate import DEFAULT_ALPHA as GATE_ALPHA
from bench.gate import DEFAULT_THRESHOLD as GATE_THRESHOLD
from bench.gate import check_expectations, validate_expect
from bench.model import METRICS, CellResult, Snapshot, cell_stats, cell_value, reference_cell, run_values
from bench.optimizations import FACTOR_KEYS, REGISTRY, applicability, article_factors
from bench.results import atomic_write_json, atomic_write_text, find_sweep
from bench.speed import normalize_snapshot

#: the article's end-to-end claim (summary) and the stacked phases of the plot
ARTICLE_E2E = 0.30
PLOT_PHASES = ("gen", "old_log_prob", "ref", "update_actor", "other")
PHASE_COLORS = {"gen": "#4c72b0", "old_log_prob": "#dd8452", "ref": "#55a868", "update_actor": "#c44e52",
                "other": "#9d9d9d"}


def _ok_cells(m: Snapshot) -> list[CellResult]:
    return [c for c in m.cells if c.status == "ok" and run_values(c, "step_time")]


def _varied(cells: list[CellResult]) -> list[str]:
    """Applicable factors that take more than one level among the cells, registry order."""
    return [k for k in FACTOR_KEYS if len({c.levels.get(k) for c in cells if c.levels.get(k) is not None}) > 1]


def _log_runs(m: Snapshot, metric: str = "step_time") -> dict[str, list[tuple[int, float]]]:
    """Per finished cell id, its runs as ``(block = repeat, log run value)``: the observations of every test."""
    return {c.cell_id: [(k, math.log(v)) for k, v in run_values(c, metric) if v > 0] for c in _ok_cells(m)}


def replication(m: Snapshot) -> dict[str, Any]:
    """The unit of replication of the report's tests and its residual variance.

    ``sd``/``df``: residual SD of the log run value and its degrees of freedom in the cell-means model
    (with the time block when the sweep ran blocked; :func:`bench.analyze.effects.cell_means_residual`);
    ``runs_per_cell``: the most ok runs of a cell; ``note`` when no run-to-run variance can be estimated.
    """
    logs = _log_runs(m)
    blocked = m.blocked()
    sd, df = cell_means_residual(list(logs.values()), blocked=blocked)
    most = max((len(v) for v in logs.values()), default=0)
    out = {"unit": "run", "blocked": blocked, "order": (m.order or {}).get("kind", "sequential"),
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
    """Per cell: values of :mod:`bench.model` (step time, speedup vs the all-off cell, rollout share, Free
    ratio, throughput), the speedup's interval and p value from the runs (:func:`bench.analyze.effects.run_contrast`
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
            row["reason"] = "; ".join(f"r{f['repeat']} {f['kind']}: {(f.get('reason') or '')[:120]}" for f in c.failures) or \
                f"unfinished (repeats {c.missing_repeats})"
        elif ref is not None and c.cell_id in logs:
            if c is ref:
                row.update(speedup_ci=[1.0, 1.0])
            else:
                con = run_contrast([y for _, y in logs[ref.cell_id]], [y for _, y in logs[c.cell_id]], rep["sd"],
                                   rep["df"], alpha=alpha)
                if con.ci_low is not None:
                    row["speedup_ci"] = [math.exp(-con.ci_high), math.exp(-con.ci_low)]
                row["p_value"] = con.p_value
                row["test"] = f"t on log run values, {con.df} df" if con.p_value is not None else "none (one run per cell)"
        rows.append(row)
    return rows, (ref.label if ref else None)


def effects(snap: dict[str, Any], alpha: float, interactions: bool = True) -> dict[str, Any]:
    """Main effects and interactions with the run as the unit of replication, plus the design's alias structure.

    One observation per finished run: the log of its value (:func:`bench.model.run_value`: median timed
    step, speed-normalized when the snapshot is); the time block (= repeat) is a fixed factor when the
    sweep ran blocked (:func:`bench.analyze.effects.fit_effects`).
    """
    m = Snapshot.model_validate(snap)
    ok = _ok_cells(m)
    varied = _varied(ok)
    rep = replication(m)
    out: dict[str, Any] = {"varied": varied, "design": (snap.get("design") or {}).get("type"),
                           "aliases": snap.get("aliases") or [], "resolution": None, "fit": None, "note": "",
                           "replication": rep}
    if not varied:
        out["note"] = "no factor varies among the finished cells: no effect to estimate"
        return out
    logs = _log_runs(m)
    obs, y, blocks = [], [], []
    for c in ok:
        for k, v in logs[c.cell_id]:
            obs.append({f: c.levels[f] for f in varied})
            y.append(v)
            blocks.append(k)
    try:
        fit = fit_effects(obs, y, varied, alpha=alpha, interactions=interactions,
                          blocks=blocks if rep["blocked"] else None, unit="run", replicated=rep["runs_per_cell"] > 1)
    except ValueError as exc:
        out["note"] = str(exc)
        return out
    out["fit"] = fit.to_dict()
    return out


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
    e2e = {"claim": "end to end (all optimizations)", "section": "summary", "article": ARTICLE_E2E,
           "ours_cell": None, "ours_cell_ci": [None, None], "ours_effect": None, "ours_effect_ci": [None, None], "note": ""}
    if ref is not None:
        highs = {k: max(c["levels"][k] for c in ok_cells) if v is not None else None for k, v in ref["levels"].items()}
        e2e["ours_cell"], e2e["ours_cell_ci"] = cell_gain(highs)
        e2e["note"] = f"all-on vs all-off over the factors varied here ({', '.join(eff.get('varied') or []) or 'none'})"
        if e2e["ours_cell"] is None:
            e2e["note"] += "; the sweep has no finished all-on cell"
    out.append(e2e)
    for key, on_level in article_factors():
        opt = REGISTRY[key]
        row = {"claim": opt.title, "factor": key, "section": opt.section, "article": opt.article_gain,
               "ours_cell": None, "ours_cell_ci": [None, None], "ours_effect": None, "ours_effect_ci": [None, None],
               "note": ""}
        if ref is None or ref["levels"].get(key, 0) is None:
            row["note"] = "not applicable: " + (applicability(key, snap["engine"], snap["platform"], snap.get("base") or {})
                                                 or "not applicable in this sweep")
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
            row["note"] = f"cell: {key}={on_level} alone vs all-off; effect: OLS main effect averaged over the other factors"
        out.append(row)
    return out


def mde_section(snap: dict[str, Any], alpha: float, eff: dict[str, Any]) -> dict[str, Any]:
    """Minimal detectable effects (80 % power) given the measured noise of log step time.

    The noise of a run's value is the residual SD of the cell-means model of the log run values
    (:func:`replication`); without replicated runs it is estimated from the steps
    (:func:`bench.analyze.power.noise_components`: ``sqrt(sd_run^2 + sd_step^2 / steps)``, run-to-run part unknown).
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
    # the gate against a baseline with the same counts: the threshold and its alpha also apply
    out["gate"] = mde_from_se(se_cells, alpha=GATE_ALPHA, threshold=GATE_THRESHOLD)
    out["runs_per_cell"], out["steps_per_run"], out["runs"] = r, noise.steps_per_run, n_runs
    return out


# -- plots ------------------------------------------------------------------------------------------

def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_speedup(rows: list[dict[str, Any]], path: Path, level: float) -> None:
    plt = _plt()
    rs = [r for r in rows if r["speedup"] is not None]
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(rs) + 2), 3.8))
    x = np.arange(len(rs))
    sp = np.array([r["speedup"] for r in rs])
    lo = np.array([r["speedup_ci"][0] if r["speedup_ci"][0] is not None else r["speedup"] for r in rs])
    hi = np.array([r["speedup_ci"][1] if r["speedup_ci"][1] is not None else r["speedup"] for r in rs])
    ax.bar(x, sp, color=["#55a868" if s >= 1 else "#c44e52" for s in sp])
    ax.errorbar(x, sp, yerr=[sp - lo, hi - sp], fmt="none", ecolor="black", capsize=4)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(x, [r["cell"] for r in rs], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("speedup vs all-off (x)")
    ax.set_title(f"Speedup per cell ({level:.0%} CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_effects(eff: dict[str, Any], path: Path) -> None:
    plt = _plt()
    terms = (eff.get("fit") or {}).get("terms") or []
    fig, ax = plt.subplots(figsize=(6.5, max(2.5, 0.45 * len(terms) + 1.2)))
    y = np.arange(len(terms))[::-1]
    ch = np.array([100 * t["change"] for t in terms])
    lo = np.array([100 * t["change_ci_low"] if t["change_ci_low"] is not None else 100 * t["change"] for t in terms])
    hi = np.array([100 * t["change_ci_high"] if t["change_ci_high"] is not None else 100 * t["change"] for t in terms])
    ax.barh(y, ch, color=["#4c72b0" if t["kind"] != "interaction" else "#8172b2" for t in terms])
    ax.errorbar(ch, y, xerr=[ch - lo, hi - ch], fmt="none", ecolor="black", capsize=3)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(y, [t["name"] for t in terms], fontsize=8)
    ax.set_xlabel("step time change, low -> high level (%)  (negative = faster)")
    lvl = (eff.get("fit") or {}).get("level", 0.95)
    unit = (eff.get("fit") or {}).get("unit", "run")
    ax.set_title(f"Main effects and interactions\n(OLS on log {unit} step time, {lvl:.0%} CI)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_phases(rows: list[dict[str, Any]], path: Path) -> None:
    plt = _plt()
    rs = [r for r in rows if r["status"] == "ok" and r["step_time_s"]]
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(rs) + 2.5), 4.2))
    x = np.arange(len(rs))
    bottom = np.zeros(len(rs))
    for p in PLOT_PHASES:
        vals = []
        for r in rs:
            ph = r["phases"]
            if p == "other":
                v = sum(ph.get(q) or 0.0 for q in ("other", "reward", "adv"))
            else:
                v = ph.get(p) or 0.0
            vals.append(max(v, 0.0))
        ax.bar(x, vals, bottom=bottom, label=p, color=PHASE_COLORS[p])
        bottom += np.array(vals)
    for i, r in enumerate(rs):
        txt = []
        if r["rollout_share"] is not None:
            txt.append(f"roll {r['rollout_share']:.0%}")
        if r["free_ratio"] is not None:
            txt.append(f"Free {r['free_ratio']:.0%}")
        ax.text(i, bottom[i] * 1.01, "\n".join(txt), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [r["cell"] for r in rs], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("seconds per step (phase share x step time)")
    ax.set_ylim(0, max(bottom.max() if len(bottom) else 1, 1e-9) * 1.25)
    ax.set_title("Phase breakdown per cell (rollout share, Free ratio above)")
    ax.legend(fontsize=7, loc="upper left", ncols=5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_long_tail(rows: list[dict[str, Any]], path: Path) -> None:
    plt = _plt()
    rs = [r for r in rows if r["status"] == "ok" and r["response_length_max"] is not None]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(max(7, 1.2 * len(rs) + 3), 3.8))
    x = np.arange(len(rs))
    mean = np.array([r["response_length_mean"] or 0 for r in rs])
    mx = np.array([r["response_length_max"] or 0 for r in rs])
    mn = np.array([r["response_length_min"] if r["response_length_min"] is not None else m for r, m in zip(rs, mean)])
    a1.errorbar(x, mean, yerr=[mean - mn, mx - mean], fmt="o", capsize=5)
    a1.set_xticks(x, [r["cell"] for r in rs], rotation=30, ha="right", fontsize=8)
    a1.set_ylabel("response length (tokens)")
    a1.set_title("Response length: min / mean / max")
    waste = [100 * (r["long_tail_waste"] or 0) for r in rs]
    a2.bar(x, waste, color="#dd8452")
    a2.set_xticks(x, [r["cell"] for r in rs], rotation=30, ha="right", fontsize=8)
    a2.set_ylabel("% of decode slots idle (1 - mean/max)")
    a2.set_title("Long-tail waste")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_article(arts: list[dict[str, Any]], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    x = np.arange(len(arts))
    w = 0.28
    art = [100 * (a["article"] or 0) for a in arts]
    cell = [100 * a["ours_cell"] if a["ours_cell"] is not None else np.nan for a in arts]
    effv = [100 * a["ours_effect"] if a["ours_effect"] is not None else np.nan for a in arts]
    ax.bar(x - w, art, w, label="article (Ascend A2, Qwen3-VL-8B)", color="#9d9d9d")
    ax.bar(x, cell, w, label="ours: cell vs all-off", color="#4c72b0")
    ax.bar(x + w, effv, w, label="ours: OLS main effect", color="#55a868")
    for i, a in enumerate(arts):
        if a["ours_cell"] is None and a["ours_effect"] is None:
            ax.text(i + w / 2, 1, "not measured", ha="center", fontsize=7, rotation=90, va="bottom")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(x, [a.get("factor") or "end to end" for a in arts], fontsize=8)
    ax.set_ylabel("performance gain (%)")
    ax.set_title("Article's reported gains vs this sweep")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- markdown ---------------------------------------------------------------------------------------

def _f(v: Any, fmt: str = ".3f") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return format(v, fmt)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def render(data: dict[str, Any]) -> str:
    """``report.md`` from the report's data."""
    s = data["sweep"]
    lvl = 1 - data["alpha"]
    L = [f"# Ablation report: `{s['matrix']}` sweep `{s['sweep_id']}`", "",
         f"- engine / platform: {s['engine']} / {s['platform']}; design: {s['design']}; cells: {len(data['cells'])}; "
         f"repeats: {s['repeats']}", f"- versions: {', '.join(f'{k} {v}' for k, v in (s.get('versions') or {}).items()) or '-'}",
         f"- git commit: {s.get('git_commit') or '-'}",
         f"- reference for speedups: `{data['reference'] or 'none (no finished all-off cell)'}`; intervals at {lvl:.0%}",
         "- machine speed: " + (f"step times and throughput speed-normalized to the sweep's median speed-probe time "
                                f"({data['speed_normalized_to_s']:.4f} s): each step time x median probe / its step's probe"
                                if data.get("speed_normalized_to_s") else "raw step times (no speed probe in every run, "
                                "or --normalize off)"),
         ""]
    if data["failed"]:
        L += ["**Cells not finished** (left out of every statistic):", ""]
        L += [f"- `{r['cell']}` ({r['status']}): {r['reason']}" for r in data["failed"]] + [""]
    varied = data["effects"]["varied"]
    rep = data["replication"]
    L += ["## Cells", "",
          f"Unit of replication: the run ({rep['runs']} runs, at most {rep['runs_per_cell']} per cell; run order "
          f"{rep['order']}{', seed ' + str(rep['order_seed']) if rep.get('order_seed') is not None else ''}). Step time = "
          "per run the median timed step, geometric mean over the cell's runs; speedup = all-off / cell; interval and "
          f"p: t on the log run values with the pooled residual SD of the cell-means model"
          f"{' with the time block' if rep['blocked'] else ''} ({_f(rep['sd'], '.4f')}, {rep['df']} df)."
          + (f" **{rep['note']}**" if rep.get("note") else ""), "",
          "| cell | " + " | ".join(varied) + f" | runs | steps | step time s | speedup [{lvl:.0%} CI] | p | "
          "rollout share | Free ratio | tokens/s |", "|---" * (len(varied) + 9) + "|"]
    for r in data["cells"]:
        ci = r["speedup_ci"]
        sp = f"{_f(r['speedup'])} [{_f(ci[0])}, {_f(ci[1])}]" if r["speedup"] is not None else "-"
        L.append(f"| {r['cell']} | " + " | ".join(str(r["levels"].get(k)) for k in varied) +
                 f" | {r['runs_ok']}/{r['runs']} | {r['n_steps']} | {_f(r['step_time_s'])} | {sp} | "
                 f"{_f(r['p_value'], '.2g')} | {_f(r['rollout_share'])} | {_f(r['free_ratio'])} | {_f(r['throughput'], '.1f')} |")
    L += ["", "![speedup](speedup.png)", "", "## Effects (OLS on per-run log step time)", ""]
    eff = data["effects"]
    fit = eff.get("fit")
    if fit:
        blocks = f", the {fit['n_blocks']} time blocks as a fixed factor" if fit.get("n_blocks") else ", no block factor"
        L += [f"**Unit of replication: the {fit['unit']}** ({fit['n_obs']} {fit['unit']}s in {fit['n_cells']} cells"
              f"{blocks}); one observation per {fit['unit']} = log of its median timed step. Residual SD "
              f"{_f(fit['residual_sd'], '.4f')} with **{fit['df_resid']:.0f} residual degrees of freedom**; "
              f"intervals and p values are t-based on them; a term is significant when its Holm-adjusted p "
              f"(over the terms of this table) is below {data['alpha']}. Coding: "
              + "; ".join(f"{k}: {v}" for k, v in fit["coding"].items()) + "."
              + (f" **{fit['note']}.**" if fit.get("note") else ""), "",
              f"| term | effect (log) | step time change [{lvl:.0%} CI] | speedup | p | p (Holm) | significant | aliased with |",
              "|---|---|---|---|---|---|---|---|"]
        for t in fit["terms"]:
            ci = f" [{_pct(t['change_ci_low'])}, {_pct(t['change_ci_high'])}]" if t["change_ci_low"] is not None else ""
            sig = ("yes" if t["significant"] else "no") if t["p_value"] is not None else "not judged"
            L.append(f"| {t['name']} | {t['effect']:+.4f} | {_pct(t['change'])}{ci} | {math.exp(-t['effect']):.3f}x | "
                     f"{_f(t['p_value'], '.2g')} | {_f(t['p_adjusted'], '.2g')} | {sig} | {', '.join(t['aliases']) or '-'} |")
        if fit["not_estimable"]:
            L += ["", "Terms left out of the model:", ""]
            L += [f"- `{k}`: {v}" for k, v in fit["not_estimable"].items()]
        L += ["", "![effects](effects.png)"]
    else:
        L.append(eff.get("note") or "no effects")
    if eff.get("design") == "fractional" or eff.get("aliases"):
        L += ["", f"**Fractional design**, resolution {s.get('resolution') or '?'}: each main effect or interaction "
              "below is estimated together with the terms on the same line (pyDOE3 alias structure); a resolution IV "
              "design keeps main effects clear of two-factor interactions but confounds interactions with each other.", ""]
        L += [f"- {a}" for a in eff.get("aliases") or []]
    L += ["", "## Phases, rollout share, Free ratio", "",
          "| cell | gen s | old_log_prob s | ref s | update_actor s | reward s | adv s | other s | rollout share | Free ratio |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["cells"]:
        if r["status"] != "ok":
            continue
        ph = r["phases"]
        L.append(f"| {r['cell']} | " + " | ".join(_f(ph.get(p)) for p in ("gen", "old_log_prob", "ref", "update_actor",
                                                                           "reward", "adv", "other")) +
                 f" | {_f(r['rollout_share'])} | {_f(r['free_ratio'])} |")
    L += ["", "![phases](phases.png)", "", "## Rollout long tail (article 2.6)", "",
          "Decode slots wasted waiting for the longest sample of a batch: `1 - response_length/mean / response_length/max`.", "",
          "| cell | response length min | mean | max | long-tail waste |", "|---|---|---|---|---|"]
    for r in data["cells"]:
        if r["status"] == "ok":
            L.append(f"| {r['cell']} | {_f(r['response_length_min'], '.1f')} | {_f(r['response_length_mean'], '.1f')} | "
                     f"{_f(r['response_length_max'], '.1f')} | {_f(r['long_tail_waste'] * 100 if r['long_tail_waste'] is not None else None, '.1f')}% |")
    L += ["", "![long tail](long_tail.png)", "", "## The article's gains beside ours", "",
          "Gain = speedup - 1 (step time all-off / cell - 1). The article measured Qwen3-VL-8B on Ascend Atlas 800T A2 "
          "with verl 0.6.1; factors that do not apply on this engine/platform say why.", "",
          f"| optimization | article | ours: cell vs all-off [{lvl:.0%} CI] | ours: main effect [{lvl:.0%} CI] | note |",
          "|---|---|---|---|---|"]
    for a in data["article"]:
        c, e = a["ours_cell_ci"], a["ours_effect_ci"]
        cell = f"{_pct(a['ours_cell'])} [{_pct(c[0])}, {_pct(c[1])}]" if a["ours_cell"] is not None else "-"
        ef = f"{_pct(a['ours_effect'])} [{_pct(e[0])}, {_pct(e[1])}]" if a["ours_effect"] is not None else "-"
        L.append(f"| {a['claim']} ({a['section']}) | {_pct(a['article'])} | {cell} | {ef} | {a['note']} |")
    L += ["", "![article](article.png)", "", "## Minimal detectable effect", ""]
    m = data["mde"]
    n = m["noise"]
    if m.get("note"):
        L.append(m["note"])
    else:
        L += [f"Noise of log step time: {_f(n['sd_step'], '.4f')} within a run (step to step), "
              f"{_f(n['sd_run'], '.4f')} between runs of one cell; {n['steps_per_run']:.1f} timed steps per run, "
              f"{n['runs_per_cell']:.1f} runs per cell. SD of one run's value used below: {_f(m.get('run_sd'), '.4f')} "
              f"(from {m.get('run_sd_source')}).", "",
              f"Smallest true change found with 80 % power (two-sided, alpha {data['alpha']}):", "",
              f"- between two cells of this sweep: {_pct(m.get('two_cells'))}",
              f"- a main effect ({m.get('runs')} runs): {_pct(m.get('main_effect'))}",
              f"- by the gate against a baseline with the same counts (threshold {GATE_THRESHOLD:.0%}, alpha {GATE_ALPHA}): "
              f"{_pct(m.get('gate'))}", ""]
    if data.get("expectations"):
        L += ["## Claims of the matrix `expect` block", "",
              "Judged on the runs (t on the log run values of the two cells, pooled residual SD, as the cell table).", "",
              "| claim | improvement | CI | p | result |", "|---|---|---|---|---|"]
        for e in data["expectations"]:
            ci = e.get("improvement_ci") or [None, None]
            L.append(f"| {e['claim']} | {_pct(e.get('improvement'))} | [{_pct(ci[0])}, {_pct(ci[1])}] | "
                     f"{_f(e.get('p_value'), '.2g')} | {e['result']}{': ' + e['reason'] if e.get('reason') else ''} |")
        L.append("")
    L += ["## Method", "",
          "The run is the unit of replication: the timed steps of one run (warm-up and profiled steps excluded) share "
          "its start-up, placement and machine state, so each run is summarized by its median timed step before any "
          "test (no p value here treats steps as independent samples). Runs execute in time blocks (block k = repeat k "
          "of every cell, shuffled with the recorded seed); the block is a fixed factor of the models. "
          "Speedup: all-off cell's value / the cell's (geometric means over runs of the run medians), interval and p "
          "from a t test on the log run values with the pooled residual SD of the cell-means model (Montgomery, Design "
          "and Analysis of Experiments, ch. 4). Effects: statsmodels OLS of the log run values on +-1 coded factors, "
          "their two-factor interactions and the block (effect = 2 x coefficient = change of log step time from the low "
          "to the high level; step time change = exp(effect) - 1; speedup = exp(-effect)); p values Holm-adjusted over "
          "the terms. With one run per cell no run-to-run variance exists to test against: estimates only.", ""]
    return "\n".join(L)


def claims_on_runs(snap: dict[str, Any], results: list[dict[str, Any]], alpha: float) -> list[dict[str, Any]]:
    """Judge the matrix ``expect`` claims on the runs: the cells each claim names (found by
    :func:`bench.gate.check_expectations`) are compared by :func:`bench.analyze.effects.run_contrast` of their run
    values (log scale for step time and throughput, linear for ratios), as the cell table does; the
    step-level comparison of the gate is dropped. A claim needing significance is not judged (``error``)
    with one run per cell."""
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
            e.update(result="error", reason="no run values for the claim's cells")
            continue
        con = run_contrast(ref_y, cell_y, sd, df, alpha=alpha)
        ref_mean = float(np.mean(ref_y))

        def change(d: float) -> float:
            return math.expm1(d) if log else d / ref_mean

        sign = 1.0 if metric.higher_is_better else -1.0
        imp = sign * change(con.diff)
        ci = sorted((sign * change(con.ci_low), sign * change(con.ci_high))) if con.ci_low is not None else [None, None]
        e.update(improvement=imp, improvement_ci=ci, p_value=con.p_value, unit="run", df=con.df,
                 runs=[con.n_ref, con.n_cell], reason="")
        ok = (e["at_least"] is None or imp >= e["at_least"]) and (e["at_most"] is None or imp <= e["at_most"])
        if ok and e["at_least"] is not None and e["at_least"] > 0:
            if con.p_value is None:
                e.update(result="error", reason="one run per cell: no run-to-run variance to test the claim against "
                                                "(add repeats)")
                continue
            if not con.p_value < alpha:
                ok = False
                e["reason"] = f"not significant on {con.n_ref}+{con.n_cell} runs (p = {con.p_value:.3g} >= {alpha})"
        e["result"] = "met" if ok else "not met"
        if not ok and not e["reason"]:
            e["reason"] = f"improvement {imp:+.1%} outside the claim"
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


def build(sweep: Path, results: Path, *, alpha: float = 0.05, n_boot: int = N_BOOT, seed: int = 0,
          interactions: bool = True, normalize: bool = True) -> dict[str, Any]:
    """All numbers of the report of one sweep (no files written).

    With ``normalize`` (default) and a speed probe in every run (embedded engine on CPU), step times and
    throughput are speed-normalized to the sweep's median probe time first (:func:`bench.speed.normalize_snapshot`),
    exactly as ``summary.md`` is. ``n_boot``/``seed`` are kept for the command line; the report's
    intervals are t intervals on runs and draw no bootstrap.
    """
    snap = snapshot(sweep, results)
    if not snap["cells"]:
        raise BenchError(f"{sweep}: the sweep's plan has no cells")
    # cells of a sweep run minutes apart: read every step time at the sweep's median machine speed
    probe_ref = normalize_snapshot(snap) if normalize else None
    stats = analyze(snap, alpha=alpha, interactions=interactions)
    from bench.results import read_json

    meta = read_json(Path(sweep) / "sweep.json") or {}
    resolution = (meta.get("plan") or {}).get("resolution") or (snap.get("design") or {}).get("resolution")
    data = {
        "format": "grpo-bench-report", "format_version": 2, "created_at": time.time(), "alpha": alpha,
        "sweep": {"matrix": snap["source"]["matrix"], "sweep_id": snap["source"]["sweep_id"], "sweep": snap["source"]["sweep"],
                  "engine": snap["engine"], "platform": snap["platform"], "design": stats["effects"]["design"],
                  "repeats": snap["repeats"], "versions": snap["versions"], "git_commit": snap.get("git_commit"),
                  "resolution": resolution, "parent_run_id": snap["source"].get("parent_run_id"),
                  "order": snap.get("order")},
        "speed_normalized_to_s": probe_ref, **stats,
    }
    if snap.get("expect"):
        try:
            found = check_expectations(snap, validate_expect(snap["expect"], snap["source"].get("matrix_file") or sweep),
                                       alpha=alpha, n_boot=0, seed=seed, normalize=False)
            data["expectations"] = claims_on_runs(snap, found, alpha)
        except BenchError as exc:
            data["expectations_error"] = str(exc)
    return data


def write(data: dict[str, Any], out: Path) -> list[Path]:
    """Write report.md, report.json, effects.csv and the PNG plots into ``out``; returns the files."""
    out.mkdir(parents=True, exist_ok=True)
    files = []
    lvl = 1 - data["alpha"]
    for name, fn in (("speedup.png", lambda p: plot_speedup(data["cells"], p, lvl)),
                     ("effects.png", lambda p: plot_effects(data["effects"], p)),
                     ("phases.png", lambda p: plot_phases(data["cells"], p)),
                     ("long_tail.png", lambda p: plot_long_tail(data["cells"], p)),
                     ("article.png", lambda p: plot_article(data["article"], p))):
        tmp = out / f".{name}.tmp.png"
        fn(tmp)
        tmp.replace(out / name)
        files.append(out / name)
    buf = io.StringIO()
    w = csv.writer(buf)
    fit = data["effects"].get("fit") or {}
    w.writerow(["term", "kind", "effect_log", "se", "ci_low", "ci_high", "p_value", "p_holm", "step_time_change",
                "aliases", "unit", "df_resid"])
    for t in fit.get("terms") or []:
        w.writerow([t["name"], t["kind"], t["effect"], t["se"], t["ci_low"], t["ci_high"], t["p_value"], t["p_adjusted"],
                    t["change"], " ".join(t["aliases"]), fit.get("unit"), fit.get("df_resid")])
    atomic_write_text(out / "effects.csv", buf.getvalue())
    atomic_write_json(out / "report.json", data)
    atomic_write_text(out / "report.md", render(data))
    return [out / "report.md", out / "report.json", out / "effects.csv", *files]


def log_mlflow(data: dict[str, Any], files: list[Path], tracking_uri: str) -> str | None:
    """Log the report files (artifact folder ``report``), effect metrics and a tag on the sweep's parent run."""
    rid = data["sweep"].get("parent_run_id")
    if not rid:
        return "the sweep has no MLflow parent run recorded; report not logged to MLflow"
    try:
        from mlflow.entities import Metric

        from bench.tracking import Tracker, _key

        tr = Tracker(tracking_uri, data["sweep"]["matrix"])
        for f in files:
            tr.client.log_artifact(rid, str(f), artifact_path="report")
        now = int(time.time() * 1000)
        ms = [Metric(_key(f"report.effect.{t['name']}"), float(t["change"]), now, 0)
              for t in ((data["effects"].get("fit") or {}).get("terms") or [])]
        ms += [Metric(_key(f"report.speedup.{r['cell']}"), float(r["speedup"]), now, 0)
               for r in data["cells"] if r["speedup"] is not None]
        for i in range(0, len(ms), 900):
            tr.client.log_batch(rid, metrics=ms[i:i + 900])
        tr.client.set_tag(rid, "bench.report", "report/report.md")
    except Exception as exc:
        return f"report not logged to MLflow run {rid} at {tracking_uri}: {str(exc).splitlines()[0] if str(exc) else exc!r}"
    return None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``report``."""
    p.add_argument("sweep", help="the sweep: a sweep folder, a matrix name (its latest sweep) or <matrix>/<sweep id>")
    p.add_argument("--out", type=Path, default=None, metavar="DIR", help="output folder (default: <sweep>/report/)")
    p.add_argument("--alpha", type=float, default=0.05, help="intervals at 1-alpha, tests at alpha (default 0.05)")
    p.add_argument("--bootstrap", type=int, default=N_BOOT, metavar="N",
                   help=f"bootstrap resamples (default {N_BOOT}; kept for scripts: the report's intervals are t "
                        "intervals on run values and draw no bootstrap)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0; see --bootstrap)")
    p.add_argument("--no-interactions", action="store_true", help="main effects only")
    p.add_argument("--normalize", choices=("auto", "off"), default="auto",
                   help="auto (default): speed-normalize step times by the machine-speed probe when every run has "
                        "one (embedded engine on CPU); off: raw step times")


def main(args: argparse.Namespace) -> int:
    """Build and write the report; 0 on success, 2 on bad input."""
    if not 0 < args.alpha < 0.5:
        raise BenchError(f"--alpha {args.alpha}: must be in (0, 0.5)")
    sweep = find_sweep(args.sweep, args.results)
    data = build(sweep, args.results, alpha=args.alpha, n_boot=args.bootstrap, seed=args.seed,
                 interactions=not args.no_interactions, normalize=args.normalize == "auto")
    out = Path(args.out) if args.out else sweep / "report"
    files = write(data, out)
    warn = log_mlflow(data, files, args.tracking_uri) if args.tracking_uri else None
    print(f"report: {out / 'report.md'} ({len(data['cells'])} cells, "
          f"{len((data['effects'].get('fit') or {}).get('terms') or [])} model terms, {len(files) - 3} plots)")
    if data["failed"]:
        print(f"note: {len(data['failed'])} cell(s) not finished, left out: " +
              ", ".join(r["cell"] for r in data["failed"]), file=sys.stderr)
    if warn:
        print(f"warning: {warn}", file=sys.stderr)
    elif args.tracking_uri:
        print(f"MLflow: logged under report/ on parent run {data['sweep']['parent_run_id']}")
    return 0
