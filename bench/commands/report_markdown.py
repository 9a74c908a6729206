"""``report.md``: the report's data (:func:`bench.report.tables.analyze` and :func:`bench.commands.report.build`)
rendered as markdown (:func:`render`)."""

from __future__ import annotations

import math
from typing import Any

from bench.planning.allocation import report_lines
from bench.planning.sequential import Decision
from bench.planning.view import NOT_COVERED, SequentialView, summary_lines
from bench.records.mfu import markdown_lines as mfu_lines
from bench.report.md import ci_pct, table_head
from bench.report.md import pct as _pct
from bench.report.where_md import where_lines
from bench.spec.stack import level_text
from bench.stats.estimators import DEFAULT_ALPHA as GATE_ALPHA
from bench.stats.estimators import DEFAULT_THRESHOLD as GATE_THRESHOLD


def _f(v: Any, fmt: str = ".3f") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return format(v, fmt)


def _phase_perf(data: dict[str, Any]) -> list[str]:
    """MFU and tokens/s per device per phase of each cell, the phase furthest from the peak
    (:func:`bench.records.mfu.markdown_lines` of the report's ``phase_perf``)."""
    pp = data.get("phase_perf") or {}
    return mfu_lines([(f"{r['label']} (`{r['cell']}`)", r["phases"]) for r in pp.get("cells", [])], pp.get("basis"))


def render(data: dict[str, Any]) -> str:
    """``report.md`` from the report's data (:func:`bench.commands.report.build`): the sections in order, each
    written by its own function below; ``lvl`` is the confidence level of the intervals (1 - alpha), ``sv`` the
    stopping look's verdicts of a sequential sweep (``None`` for a fixed-size sweep)."""
    lvl = 1 - data["alpha"]
    sv = data.get("sequential_verdicts")  # a sequential sweep: its stopping look's verdicts (sequential_view)
    L = _header(data, lvl)
    if sv:
        L += summary_lines(SequentialView.from_dict(sv))[1:] + [""]
    L += _cells(data, lvl, sv)
    L += _effects(data, lvl, sv)
    L += _phases(data)
    L += _phase_perf(data)
    L += _long_tail(data)
    L += _article(data, lvl, sv)
    L += _mde(data)
    L += _expectations(data, sv)
    L += where_lines(data.get("where"), lvl)
    L += _method()
    L += report_lines(data)
    return "\n".join(L)


def _header(data: dict[str, Any], lvl: float) -> list[str]:
    """The title, the sweep's facts and the cells left out."""
    s = data["sweep"]
    L = [
        f"# Ablation report: `{s['matrix']}` sweep `{s['sweep_id']}`",
        "",
        f"- engine / platform: {s['engine']} / {s['platform']}; design: {s['design']}; cells: {len(data['cells'])}; "
        f"repeats: {s['repeats']}",
        f"- versions: {', '.join(f'{k} {v}' for k, v in (s.get('versions') or {}).items()) or '-'}",
        f"- git commit: {s.get('git_commit') or '-'}",
        f"- reference for speedups: `{data['reference'] or 'none (no finished all-off cell)'}`; intervals at {lvl:.0%}",
        "- machine speed: "
        + (
            f"step times and throughput speed-normalized to the sweep's median speed-probe time "
            f"({data['speed_normalized_to_s']:.4f} s): each step time x median probe / its step's probe"
            if data.get("speed_normalized_to_s")
            else "raw step times (no speed probe in every run, or --normalize off)"
        ),
        "",
    ]
    if data["failed"]:
        L += ["**Cells not finished** (left out of every statistic):", ""]
        L += [f"- `{r['cell']}` ({r['status']}): {r['reason']}" for r in data["failed"]] + [""]
    return L


def _cells(data: dict[str, Any], lvl: float, sv: dict[str, Any] | None) -> list[str]:
    """The cell table: step time, speedup with its interval and p, shares and throughput per cell."""
    L: list[str] = []
    varied = data["effects"]["varied"]
    names = data["effects"].get("stack_levels") or []  # the stack factor's names (its levels are positions)
    rep = data["replication"]
    L += [
        "## Cells",
        "",
        f"Unit of replication: the run ({rep['runs']} runs, at most {rep['runs_per_cell']} per cell; run order "
        f"{rep['order']}{', seed ' + str(rep['order_seed']) if rep.get('order_seed') is not None else ''}). "
        "Step time = "
        "per run the median timed step, geometric mean over the cell's runs; speedup = all-off / cell; interval and "
        f"p: t on the log run values with the pooled residual SD of the cell-means model"
        f"{' with the time block' if rep['blocked'] else ''}"
        f"{' and the node (' + str(rep['nodes']) + ' Ray nodes)' if (rep.get('nodes') or 0) > 1 else ''}"
        f" ({_f(rep['sd'], '.4f')}, {rep['df']} df)."
        + (f" **{rep['note']}**" if rep.get("note") else "")
        + (f" Speedup intervals and p values of this table: {NOT_COVERED}." if sv else ""),
        "",
        "| cell | " + " | ".join(varied) + f" | runs | steps | step time s | speedup [{lvl:.0%} CI] | p | "
        "rollout share | Free ratio | tokens/s |",
        "|---" * (len(varied) + 9) + "|",
    ]
    for r in data["cells"]:
        ci = r["speedup_ci"]
        sp = f"{_f(r['speedup'])} [{_f(ci[0])}, {_f(ci[1])}]" if r["speedup"] is not None else "-"
        L.append(
            f"| {r['cell']} | "
            + " | ".join(level_text(k, r["levels"].get(k), names) for k in varied)
            + f" | {r['runs_ok']}/{r['runs']} | {r['n_steps']} | {_f(r['step_time_s'])} | {sp} | "
            f"{_f(r['p_value'], '.2g')} | {_f(r['rollout_share'])} | {_f(r['free_ratio'])} | "
            f"{_f(r['throughput'], '.1f')} |"
        )
    return L


def _effects(data: dict[str, Any], lvl: float, sv: dict[str, Any] | None) -> list[str]:
    """The effects model's terms (a sequential sweep: its verdicts) and a fractional design's aliases."""
    L: list[str] = []
    s = data["sweep"]
    L += ["", "![speedup](speedup.png)", "", "## Effects (OLS on per-run log step time)", ""]
    eff = data["effects"]
    fit = eff.get("fit")
    if fit:
        blocks = (
            f", the {fit['n_blocks']} time blocks as a fixed factor" if fit.get("n_blocks") else ", no block factor"
        )
        if fit.get("n_nodes"):
            blocks += (f", the {fit['n_nodes']} Ray nodes the runs ran on as a second blocking factor "
                       f"({fit.get('node_columns', 0)} column(s) beside the blocks)")
        L += [
            f"**Unit of replication: the {fit['unit']}** ({fit['n_obs']} {fit['unit']}s in {fit['n_cells']} cells"
            f"{blocks}); one observation per {fit['unit']} = log of its median timed step. Residual SD "
            f"{_f(fit['residual_sd'], '.4f')} with **{fit['df_resid']:.0f} residual degrees of freedom**; "
            + (f"main effects: the estimate, repeated confidence interval and verdict of the sequential analysis at "
               f"look {sv['look']} of {sv['max_looks']} (the figures its stop rule decided on, error rate "
               f"{sv['alpha']} over all looks and comparisons; no fixed-sample p value); terms marked † "
               f"(interactions): t interval at {lvl:.0%} and Holm-adjusted p, {NOT_COVERED}. Coding: " if sv else
               f"intervals and p values are t-based on them; a term is significant when its Holm-adjusted p "
               f"(over the terms of this table) is below {data['alpha']}. Coding: ")
            + "; ".join(f"{k}: {v}" for k, v in fit["coding"].items())
            + "."
            + (f" **{fit['note']}.**" if fit.get("note") else ""),
            "",
            *table_head("term", "effect (log)", "step time change [interval]" if sv else
                        f"step time change [{lvl:.0%} CI]", "speedup", "p", "p (Holm)",
                        "verdict" if sv else "significant", "aliased with"),
        ]
        decided = {d["name"]: Decision(**d) for d in (sv or {}).get("decisions") or []}
        for t in fit["terms"]:
            ci = " " + ci_pct(t["change_ci_low"], t["change_ci_high"]) if t["change_ci_low"] is not None else ""
            sig = ("yes" if t["significant"] else "no") if t["p_value"] is not None else "not judged"
            if sv:
                sig = (f"{decided[t['name']].verdict_text()} (sequential)" if t.get("covered") and t["name"] in decided
                       else f"{'significant' if t['significant'] else 'not significant'} †"
                       if t["p_value"] is not None else "not judged †")
            L.append(
                f"| {t.get('label') or t['name']}{' †' if sv and not t.get('covered') else ''} | {t['effect']:+.4f} | "
                f"{_pct(t['change'])}{ci} | {math.exp(-t['effect']):.3f}x | "
                f"{_f(t['p_value'], '.2g')} | {_f(t['p_adjusted'], '.2g')} | {sig} | {', '.join(t['aliases']) or '-'} |"
            )
        for t in fit.get("not_read_terms") or ():  # the stack does not read the switch: no measured effect
            L.append(f"| {t['name']} | not read | not read | - | - | - | {t['not_read']} | "
                     f"{', '.join(t['aliases']) or '-'} |")
        if fit["not_estimable"]:
            L += ["", "Terms left out of the model:", ""]
            L += [f"- `{k}`: {v}" for k, v in fit["not_estimable"].items()]
        L += ["", "![effects](effects.png)"]
    else:
        L.append(eff.get("note") or "no effects")
    if eff.get("design") == "fractional" or eff.get("aliases"):
        L += [
            "",
            f"**Fractional design**, resolution {s.get('resolution') or '?'}: each main effect or interaction "
            "below is estimated together with the terms on the same line (pyDOE3 alias structure); a resolution IV "
            "design keeps main effects clear of two-factor interactions but confounds interactions with each other.",
            "",
        ]
        L += [f"- {a}" for a in eff.get("aliases") or []]
    return L


def _phases(data: dict[str, Any]) -> list[str]:
    """The phases of a step, rollout share and Free ratio per finished cell."""
    L: list[str] = []
    L += [
        "",
        "## Phases, rollout share, Free ratio",
        "",
        "| cell | gen s | old_log_prob s | ref s | update_actor s | reward s | adv s | other s | rollout share "
        "| Free ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["cells"]:
        if r["status"] != "ok":
            continue
        ph = r["phases"]
        L.append(f"| {r['cell']} | " + " | ".join(_f(ph.get(p)) for p in ("gen", "old_log_prob", "ref", "update_actor",
                                                                           "reward", "adv", "other")) +
                 f" | {_f(r['rollout_share'])} | {_f(r['free_ratio'])} |")
    return L


def _long_tail(data: dict[str, Any]) -> list[str]:
    """The rollout long tail (article 2.6) per finished cell."""
    L: list[str] = []
    L += [
        "",
        "![phases](phases.png)",
        "",
        "## Rollout long tail (article 2.6)",
        "",
        "Decode slots wasted waiting for the longest sample of a batch: "
        "`1 - response_length/mean / response_length/max`.",
        "",
        "| cell | response length min | mean | max | long-tail waste |",
        "|---|---|---|---|---|",
    ]
    for r in data["cells"]:
        if r["status"] == "ok":
            L.append(
                f"| {r['cell']} | {_f(r['response_length_min'], '.1f')} | {_f(r['response_length_mean'], '.1f')} | "
                f"{_f(r['response_length_max'], '.1f')} | "
                f"{_f(r['long_tail_waste'] * 100 if r['long_tail_waste'] is not None else None, '.1f')}% |"
            )
    return L


def _article(data: dict[str, Any], lvl: float, sv: dict[str, Any] | None) -> list[str]:
    """The article's gains beside ours, per optimization with an article figure."""
    L: list[str] = []
    L += [
        "",
        "![long tail](long_tail.png)",
        "",
        "## The article's gains beside ours",
        "",
        "Gain = speedup - 1 (step time all-off / cell - 1). The article measured Qwen3-VL-8B on Ascend Atlas 800T A2 "
        "with verl 0.6.1; factors that do not apply on this engine/platform say why."
        + (f" Main effects: the sequential look's repeated intervals; cell vs all-off: {NOT_COVERED}." if sv else ""),
        "",
        f"| optimization | article | ours: cell vs all-off [{lvl:.0%} CI] | ours: main effect [{lvl:.0%} CI] | note |",
        "|---|---|---|---|---|",
    ]
    for a in data["article"]:
        c, e = a["ours_cell_ci"], a["ours_effect_ci"]
        cell = f"{_pct(a['ours_cell'])} [{_pct(c[0])}, {_pct(c[1])}]" if a["ours_cell"] is not None else "-"
        ef = f"{_pct(a['ours_effect'])} [{_pct(e[0])}, {_pct(e[1])}]" if a["ours_effect"] is not None else "-"
        L.append(f"| {a['claim']} ({a['section']}) | {_pct(a['article'])} | {cell} | {ef} | {a['note']} |")
    return L


def _mde(data: dict[str, Any]) -> list[str]:
    """The minimal detectable effects of this sweep and of the gate."""
    L: list[str] = []
    L += ["", "![article](article.png)", "", "## Minimal detectable effect", ""]
    m = data["mde"]
    n = m["noise"]
    if m.get("note"):
        L.append(m["note"])
    else:
        L += [
            f"Noise of log step time: {_f(n['sd_step'], '.4f')} within a run (step to step), "
            f"{_f(n['sd_run'], '.4f')} between runs of one cell; {n['steps_per_run']:.1f} timed steps per run, "
            f"{n['runs_per_cell']:.1f} runs per cell. SD of one run's value used below: {_f(m.get('run_sd'), '.4f')} "
            f"(from {m.get('run_sd_source')}).",
            "",
            f"Smallest true change found with 80 % power (two-sided, alpha {data['alpha']}):",
            "",
            f"- between two cells of this sweep: {_pct(m.get('two_cells'))}",
            f"- a main effect ({m.get('runs')} runs): {_pct(m.get('main_effect'))}",
            f"- by the gate (smallest change the gate can see; threshold {GATE_THRESHOLD:.0%}, alpha {GATE_ALPHA}; "
            f"{m.get('gate_source') or 'interleaved, as many blocks as runs per cell'}): {_pct(m.get('gate'))}",
            "",
        ]
    return L


def _expectations(data: dict[str, Any], sv: dict[str, Any] | None) -> list[str]:
    """The claims of the matrix ``expect`` block, judged as one family."""
    L: list[str] = []
    if data.get("expectations"):
        L += [
            "## Claims of the matrix `expect` block",
            "",
            "Judged on the runs (t on the log run values of the two cells, pooled residual SD, as the cell table)"
            + (f"; the block's {fam['m']} claims are one family: each judged at alpha / {fam['m']} = "
               f"{fam['per_claim_alpha']:.3g} (its interval at {1 - fam['per_claim_alpha']:.2%}), so any wrong "
               f"verdict among them has probability at most {fam['alpha']:g}."
               if (fam := data.get("expectations_family")) and fam.get("m", 1) > 1 else ".")
            + (" Step-time claims: the sequential look's repeated interval and decision (no p value); the other "
               f"claims (†): {NOT_COVERED}." if sv else ""),
            "",
            "| claim | improvement | CI | p | result |",
            "|---|---|---|---|---|",
        ]
        for e in data["expectations"]:
            ci = e.get("improvement_ci") or [None, None]
            L.append(f"| {e['claim']}{' †' if sv and not e.get('covered') else ''} | {_pct(e.get('improvement'))} | "
                     f"[{_pct(ci[0])}, {_pct(ci[1])}] | "
                     f"{_f(e.get('p_value'), '.2g')} | {e['result']}{': ' + e['reason'] if e.get('reason') else ''} |")
        L.append("")
    return L


def _method() -> list[str]:
    """The method text."""
    L: list[str] = []
    L += [
        "## Method",
        "",
        "The run is the unit of replication: the timed steps of one run (warm-up and profiled steps excluded) share "
        "its start-up, placement and machine state, so each run is summarized by its median timed step before any "
        "test (no p value here treats steps as independent samples). Runs execute in time blocks (block k = repeat k "
        "of every cell, shuffled with the recorded seed); the block is a fixed factor of the models. "
        "Speedup: all-off cell's value / the cell's (geometric means over runs of the run medians), interval and p "
        "from a t test on the log run values with the pooled residual SD of the cell-means model (Montgomery, Design "
        "and Analysis of Experiments, ch. 4). Effects: statsmodels OLS of the log run values on +-1 coded factors, "
        "their two-factor interactions and the block (effect = 2 x coefficient = change of log step time from the low "
        "to the high level; step time change = exp(effect) - 1; speedup = exp(-effect)); p values Holm-adjusted over "
        "the terms. With one run per cell no run-to-run variance exists to test against: estimates only.",
        "",
    ]
    return L
