"""The gate's outputs other than MLflow: the markdown table (``gate.md``, also the CI job summary:
:func:`append_step_summary`) and the per-cell table of the gate run (:func:`gate_table`)."""

from __future__ import annotations

import os
from typing import Any

from bench.gate.verdicts import CANNOT_JUDGE
from bench.report.md import ci_pct, table_head
from bench.report.md import pct as _pct
from bench.spec.metrics import METRICS
from bench.stats.stat_tests import TESTS

#: ``settings`` keys of a gate against a stored baseline or another sweep: runs as the unit (the default) ...
STORED_METHOD = {"method": "runs",
                 "estimate": "exp(mean log run value cand - mean log run value base) - 1; run value = median "
                             "timed step",
                 "ci": "Welch t over runs (+ the stored baseline's measured sweep-offset variance), 1 - alpha/m "
                       "(Bonferroni over the gate's m rows and claims: settings.family)",
                 "claims": "on runs, by the report's function (bench.report.tables.claims_on_runs): t interval on "
                           "the log run values at 1 - alpha/m; met inside the claim, not met outside, else cannot "
                           "judge",
                 "offset": "a step-time or throughput row is decided only when the baseline measured its "
                           "sweep-to-sweep offset (saved from 2 or more sweeps); else cannot judge"}
#: ... or per-step samples (``--pairing auto`` or a named ``--test``)
PER_STEP_METHOD = {"method": "steps", "estimate": "exp(hodges-lehmann shift of log samples) - 1",
                   "ci": "bootstrap over repeats (and steps when < 4 repeats), percentile, 1 - alpha/m (Bonferroni "
                         "over the gate's m rows and claims: settings.family)",
                   "claims": STORED_METHOD["claims"], "offset": STORED_METHOD["offset"]}
STORED_TEXT = (
    "runs as the unit (bench.gate.stored_runs): a run's value is the median of its timed steps; change = "
    "exp(difference of the mean log run values) - 1; interval: Welch t at 1 - {alpha_each:.3g} (alpha {alpha} / m, "
    "Bonferroni over the m = {m} rows and claims that can make the verdict, so the chance of any false regression in "
    "this gate is at most {alpha}) with the variance of both sides' run means plus twice a sweep's own offset "
    "variance, as the stored baseline measured it over its saved sweeps; without that figure (a baseline saved once, "
    "or a sweep) no step-time or throughput row is decided: cannot judge. Regression: the gate can see "
    "{max_mde:.0%} (its smallest visible change, as in the interleaved gate), the interval above 0 and the change "
    "beyond {threshold:.0%}; unchanged: it can see {max_mde:.0%} and the interval's upper end is below it; else "
    "cannot judge. Failed candidate runs are missing data (a cell with 2 or more, at least half its runs, failed is "
    "'failed'). "
    "Machine speed: each run's value is divided by its median probe time only where the probe tracks the metric "
    "over the baseline's own runs, declared before the candidate is read (settings.normalization; the note gives "
    "the test). Claims: judged on runs by the report's function at 1 - {alpha_each:.3g}: met when the interval "
    "lies within the claim, not met when outside it, else cannot judge.")


def _cell_text(text: str) -> str:
    """A text in full, fit for a markdown table cell (``|`` escaped)."""
    return str(text).replace("|", "\\|")


def _val(v: float | None, metric: str) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" + (f" {METRICS[metric].unit}" if METRICS[metric].unit == "s" else "")


def _speed(row: dict[str, Any]) -> str:
    """Table cell: the machine's speed shift and the raw change when the row was speed-normalized."""
    if not row.get("normalized"):
        return "not normalized"
    return f"{_pct(row.get('speed_change'))} probe time; raw change {_pct(row.get('raw_change'))}"


def render_markdown(result: dict[str, Any]) -> str:
    """The gate's markdown: verdict line, settings, one table row per cell and metric, notes, claims."""
    s = result["settings"]
    head = {"pass": "PASS", "regression": "REGRESSION", CANNOT_JUDGE: "CANNOT JUDGE"}[result["verdict"]]
    lines = [
        f"## Gate {head}: `{result['candidate']['sweep']}` vs baseline `{result['baseline'].get('name') or '-'}`",
        "",
    ]
    if result.get("rows"):
        c = result["counts"]
        lines.append(
            f"{len(result['rows'])} comparisons: {c['regression']} regression, {c['failed']} failed, "
            f"{c['improvement']} improvement, {c['unchanged']} unchanged, {c['noisy']} too noisy, "
            f"{c[CANNOT_JUDGE]} cannot judge otherwise. "
            f"Threshold {s['threshold']:.0%}, alpha {s['alpha']}, engine {result['candidate']['engine']}/"
            f"{result['candidate']['platform']}."
        )
        lines += ["", f"| cell | metric | baseline median | candidate median | change | "
                  f"{1 - (s.get('family') or {}).get('alpha_each', s['alpha']):.2%} CI | p | "
                  "n base/cand | test | machine speed | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in result["rows"]:
            ci = f"[{_pct(r.get('ci_low'))}, {_pct(r.get('ci_high'))}]" if r.get("ci_low") is not None else "-"
            p = f"{r['p_value']:.2g}" if r.get("p_value") is not None else "-"
            verdict_txt = (
                f"**{r['verdict']}**"
                if r["verdict"] in ("regression", "failed", CANNOT_JUDGE, "noisy")
                else r["verdict"]
            )
            if r.get("reason"):
                verdict_txt += f": {_cell_text(r['reason'])}"
            lines.append(f"| {r['cell']} | {r['metric']} | {_val(r.get('base_median'), r['metric'])} | "
                         f"{_val(r.get('cand_median'), r['metric'])} | {_pct(r.get('change'))} | {ci} | {p} | "
                         f"{r.get('n_base', '-')}/{r.get('n_cand', '-')} | "
                         f"{_pairing_of(r.get('test'))} | "
                         f"{_speed(r)} | {verdict_txt} |")
    if result.get("expectations"):
        lines += ["", "### Expectations (matrix `expect`)", "",
                  "| claim | compared / reference | improvement | CI | p | result |", "|---|---|---|---|---|---|"]
        for e in result["expectations"]:
            ci = e.get("improvement_ci") or [None, None]
            ci_txt = f"[{_pct(ci[0])}, {_pct(ci[1])}]" if ci[0] is not None else "-"
            p = f"{e['p_value']:.2g}" if e.get("p_value") is not None else "-"
            res = e["result"] if e["result"] in ("met", "n/a") else f"**{e['result']}**"
            lines.append(f"| {e['claim']} | {e.get('cell', '-')} / {e.get('reference', '-')} | "
                         f"{_pct(e.get('improvement'))} | {ci_txt} | {p} | {res}"
                         f"{': ' + _cell_text(e['reason']) if e.get('reason') else ''} |")
    if result.get("notes"):
        lines += ["", "Notes:", *[f"- {n}" for n in result["notes"]]]
    fam = s.get("family") or {"m": 1, "alpha_each": s["alpha"]}
    if s.get("method") == STORED_METHOD["method"]:
        lines += ["", "Statistics: " + STORED_TEXT.format(alpha=s["alpha"], threshold=s["threshold"],
                                                          max_mde=s["max_mde"], m=fam["m"],
                                                          alpha_each=fam["alpha_each"]), ""]
        return "\n".join(lines)
    lines += [
        "",
        "Statistics: relative change = exp(Hodges-Lehmann shift of log per-step samples) - 1. Paired "
        "(steps that did the same work on both sides: same repeat and step, equal response/prompt lengths): "
        "one-sample Hodges-Lehmann of the per-step log ratios and a two-sided Wilcoxon signed-rank test; "
        "otherwise the two-sample shift and a two-sided Mann-Whitney U test on the samples of all repeats. "
        f"CI: bootstrap over repeats (and steps within them when fewer than 4) ({s['n_boot']} resamples). "
        "A regression needs change > "
        f"{s['threshold']:.0%} and p < {fam['alpha_each']:.3g} (alpha {s['alpha']} / m, Bonferroni over the "
        f"m = {fam['m']} rows and claims). Claims: judged on runs by the report's function. Machine speed: "
        "where both sides timed the same reference "
        "kernel around each step (speed probe), step times are divided by it (throughput multiplied) before "
        "the comparison, so a machine that ran slower for a while is not read as a regression; "
        "'probe time' is the candidate's median probe vs the baseline's (+ = machine slower), "
        "'raw change' the change before this correction.",
        "",
    ]
    return "\n".join(lines)


#: MLflow status of a gate run per verdict ("cannot judge" is not a failure: FINISHED, tag ``bench.verdict``)
RUN_STATUS = {"pass": "FINISHED", "regression": "FAILED", CANNOT_JUDGE: "FINISHED"}


def render_interleaved(result: dict[str, Any]) -> str:
    """The interleaved gate's markdown (:mod:`bench.gate.interleaved`): verdict, both versions, one row per cell
    (change, interval, p, blocks, smallest change the gate can see, blocks needed), the probe check and notes."""
    s, a = result["settings"], result.get("analysis")
    head = {"pass": "PASS", "regression": "REGRESSION", CANNOT_JUDGE: "CANNOT JUDGE"}[result["verdict"]]
    b, c = result["baseline"], result["candidate"]
    lines = [
        f"## Gate (interleaved): {head}",
        "",
        f"baseline `{b.get('ref')}` ({(b.get('commit') or '-')[:12]}) vs candidate"
        + (f" `{c.get('ref')}`, both in the" if c.get("stack") else ":")  # a gate between stacks: one harness
        + f" working tree of {(c.get('commit') or '-')[:12]}{' + uncommitted changes' if c.get('dirty') else ''}; "
        "one blocked sweep, "
        f"{result.get('blocks_run')} of {s['blocks_planned']} planned blocks, {result.get('wall_s', 0):.0f} s wall; "
        f"threshold {s['threshold']:.0%}, alpha {s['alpha']} for the whole gate"
        + (f" (each of {a['family']} cell(s) at {a['alpha_per_cell']:.3g}, over all looks)" if a else "")
        + f"; pass or regression only when the gate can see {s['max_mde']:.0%}, a regression also needs the robust "
        "check (Hodges-Lehmann, signed-rank); changes between 0 and that limit may be called either way"
        + (f"; covariate: {a['covariate'] or 'none'} (declared before the first run)" if a else "")
        + (f"; budget {s['budget_s']:.0f} s" if s.get("budget_s") else ""),
        "",
        *table_head("cell", "verdict", f"change [{1 - s['alpha']:.0%} CI]", "p", "blocks", "raw change",
                    "gate can see", "blocks needed", "reason"),
    ]
    for r in result["rows"]:
        ci = ci_pct(r.get("ci_low"), r.get("ci_high"))
        p = "-" if r.get("p_value") is None else f"{r['p_value']:.3g}"
        mde = "-" if r.get("mde") is None else f"{r['mde']:.1%}"
        lines.append(f"| {_cell_text(r['cell'])} | {r['verdict']} | {_pct(r.get('change'))} {ci} | {p} | "
                     f"{r.get('blocks')} | {_pct(r.get('raw_change'))} | {mde} | {r.get('blocks_needed') or '-'} | "
                     f"{_cell_text(r.get('reason') or '')} |")
    lines += [""] + [f"- {_cell_text(n)}" for n in result.get("notes", [])]
    return "\n".join(lines) + "\n"


def gate_table(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-cell gate results as table rows (MLflow artifact ``gate_cells.json``): cell (label), metric,
    verdict, relative change, CI low/high, p value, baseline and candidate cell ids, reason (``None``
    where not computed)."""
    return [{"cell": r["cell"], "metric": r["metric"], "verdict": r["verdict"], "change": r.get("change"),
             "CI low": r.get("ci_low"), "CI high": r.get("ci_high"), "p value": r.get("p_value"),
             "baseline cell id": r.get("baseline_cell_id"), "candidate cell id": r.get("candidate_cell_id"),
             "reason": r.get("reason") or ""} for r in result.get("rows", [])]


def _pairing_of(test: str | None) -> str:
    """``paired`` / ``unpaired`` for the markdown table, from the registered test of that name."""
    if not test:
        return "-"
    known = TESTS.get(test)
    return "paired" if (known.paired if known is not None else test.startswith("wilcoxon")) else "unpaired"


def append_step_summary(text: str) -> OSError | None:
    """Append ``text`` to the GitHub Actions job summary (the file ``$GITHUB_STEP_SUMMARY`` names) when that
    variable is set; returns the error when the file cannot be written (never raises), else ``None``."""
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with open(summary, "a") as fh:
                fh.write(text)
        except OSError as exc:
            return exc
    return None
