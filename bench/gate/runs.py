"""The interleaved gate's comparison: baseline and candidate code in one blocked sweep, paired by block, runs
as the unit (:func:`paired_comparison`).

Each block of an interleaved gate sweep (:func:`bench.spec.plan.interleaved_order`) holds one run of every
cell under each code version, in random order. Per cell and block with both runs ok, the **block's log
ratio** is ``d = log(v_cand) - log(v_base)`` with ``v`` a run's value (:func:`bench.records.figures.run_value`, the
median of its timed steps): steps of one run are never treated as independent samples. Over the ``n``
blocks: estimate ``exp(mean d) - 1``, interval ``mean d +- t(1 - alpha/2, n - 1) * sd(d) / sqrt(n)``
(Kalibera & Jones 2020, "Quantifying performance changes with effect size confidence intervals": runs as
the unit, the ratio on the log scale; the paired t interval because both versions share each block's
machine state), p from the paired t test.

**Pre-declared analysis** (:func:`declare_analysis`): what the gate compares is fixed before its first run and
kept in the gate sweep's ``sweep.json`` (key ``analysis``): the metric (step time, run value), the covariate (the
speed probe, or none with ``--normalize off``), the cells (the plan's), the family size ``m`` (one comparison per
cell), the threshold, ``alpha`` and the decision rule. No look's data changes any of it.

**Speed probe as a covariate** (:func:`probe_covariate`, CUPED / ANCOVA: Deng, Xu, Kohavi & Walker 2013,
"Improving the sensitivity of online controlled experiments by utilizing pre-experiment data"): the probe's
block log ratios ``p_k = log(probe_cand / probe_base)`` enter the model ``d_k = mu + beta * p_k + e_k`` with
``beta`` estimated by least squares (not divided out with ``beta = 1``). ``mu`` is the change at equal machine
speed; when the versions do not move the probe (``E[p] = 0``) it is unbiased whatever ``beta`` is, and a probe
that does not track costs one degree of freedom instead of a choice made from the data. **No test on the data
decides whether it is fitted** (issue 45: a per-look paired t on the probe that switched it off raised the interval
error over 12 looks from 5.75 % to 8.45 % at alpha 5 %): it is fitted in every cell at every look where the
declaration names it, except where it cannot be, for reasons the data's values do not enter: fewer than
:data:`COVARIATE_MIN_BLOCKS` complete blocks (a property of the look), a block without a probe, or the two versions
timing different probe kernels (the kernel's parameters and source in each record's evidence). A candidate that
moves the probe itself (:func:`probe_moved`: paired t of ``p`` at :data:`PROBE_MOVED_ALPHA`, a change of at least
:data:`PROBE_MOVED_MIN`; threads, allocator or background work) keeps the declared analysis and its interval, but
its row draws no verdict ("cannot judge", ``judged_verdict`` kept): the covariate may have subtracted part of its
own change. :func:`probe_check` (the old per-sweep tracking test) is kept as a description of the sweep, never as
a choice.

**Family-wise error**: each cell is judged at ``alpha / m`` (Bonferroni over the ``m`` declared cells) with the
sequential intervals of all looks, so the chance of any false "regression" in one gate, over all its cells and
looks, is at most ``alpha`` (the union bound; validated in ``benchmarks/bench_gate.py`` and
``tests/gate/test_gate_promise.py``). **Failed runs** are missing data: a block whose run of either version failed is
left out of that cell's pairs (named in its reason); the cell is "failed" (exit 1) only when the candidate failed in
at least :data:`FAILED_MIN_BLOCKS` blocks, in at least half of the blocks where the baseline ran fine, and the
baseline never failed.

Verdict per cell (:func:`judge_ratios`, at the cell's ``alpha / m``): **regression** only when the gate could
see the limit (:func:`bench.stats.power.gate_mde` <= ``max_mde``), the interval is above 0, the estimate is beyond
``threshold`` and the robust check agrees (:func:`robust_check`: Hodges-Lehmann estimate beyond the threshold,
one-sided Wilcoxon signed-rank p < the cell's alpha); **improvement** likewise the other way; **unchanged** when the
gate could see ``max_mde`` and the interval's upper end is below it (so a real slowdown of that size passes with
probability under ``alpha / 2``); else **noisy** ("cannot judge", with the blocks that would let it judge:
:func:`bench.stats.power.blocks_needed`). **The indifference zone** is ``(0, max_mde)``: a true change in it may be
called either way (a true ``+threshold`` is a regression about half the time at large samples); the error rates
promised are a false regression at a true change <= 0 (at most ``alpha`` per gate) and a pass at a true change >=
``max_mde`` (at most ``alpha / 2`` per cell); the operating characteristic in between is measured in docs/gate.md.
Contention on a shared machine is heavy-tailed: a burst that hits a few runs of one version moves the mean and
widens the spread; the figure (``mde``) and the robust check keep such a burst from being called a regression
(issue 18's measured false alarm: +33.8 %, interval [+0.3 %, +78.5 %], figure 27.9 %, now "cannot judge"). With the
sequential intervals of :func:`bench.planning.sequential.decide` the rules are applied to the look's repeated
confidence interval, so the error rate holds across the looks of a sweep that stops when every cell is decided.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable

import numpy as np
from scipy import stats as sps

from bench.gate.side_by_side import run_cpu
from bench.records.figures import run_value
from bench.records.speed import PROBE_METRIC
from bench.stats.decide import Evidence, Robust, decide_change, gate_outcome
from bench.stats.power import blocks_needed, gate_mde

#: one-sided level of the probe-tracking test (:func:`probe_check`, a description of the sweep)
PROBE_ALPHA = 0.05
#: two-sided level of the paired t test that the candidate moved the speed probe itself
PROBE_MOVED_ALPHA = 0.01
#: ... and the smallest probe change (relative) that counts as moved
PROBE_MOVED_MIN = 0.01
#: a cell is "failed" only when the candidate failed in at least this many blocks (and half of them, baseline ok)
FAILED_MIN_BLOCKS = 2
#: blocks below which the probe covariate is not fitted (its slope needs residual degrees of freedom)
COVARIATE_MIN_BLOCKS = 3
#: how the declared covariate is used, in words (recorded with the declared analysis)
COVARIATE_RULE = (f"speed probe's block log ratio fitted by least squares in every cell at every look from "
                  f"{COVARIATE_MIN_BLOCKS} complete blocks (where every block has both versions' probe of one kernel); "
                  "never switched by a test on the data; a candidate that moved the probe itself gets no verdict")
#: the decision rule in words (recorded with the declared analysis)
RULE = ("regression: repeated interval at alpha/m above 0, estimate beyond the threshold, the gate sees max_mde, "
        "Hodges-Lehmann and signed-rank agree; unchanged: the gate sees max_mde and the upper end is below it; "
        "indifference zone (0, max_mde)")


def declare_analysis(*, cells: list[str], threshold: float, alpha: float, max_mde: float | None,
                     normalize: bool, max_looks: int) -> dict[str, Any]:
    """The interleaved gate's analysis, fixed before its first run (module text) and kept in ``sweep.json``:
    ``metric``, ``estimate``, ``covariate`` (``"speed_probe"`` or ``None``), ``cells`` (sorted cell ids),
    ``covariate_rule`` (how the covariate is used, in words: fitted at every look, never switched by a test on the
    data), ``family`` (``m`` = number of cells), ``alpha`` (the whole gate's, over cells and looks), ``alpha_per_cell``
    (``alpha / m``, Bonferroni), ``threshold``, ``max_mde`` (fractions), ``max_looks`` and ``rule``."""
    m = max(1, len(set(cells)))
    return {"metric": "step_time", "estimate": "mean over blocks of log(run value cand / run value base), run value "
            "= median timed step", "covariate": "speed_probe" if normalize else None,
            "covariate_rule": (COVARIATE_RULE if normalize else "none: raw run values at every look"),
            "cells": sorted(set(cells)),
            "family": m, "alpha": alpha, "alpha_per_cell": alpha / m, "threshold": threshold,
            "max_mde": 2 * threshold if max_mde is None else max_mde, "max_looks": int(max_looks), "rule": RULE}


def _timed(rec: dict[str, Any]) -> tuple[list[float], list[float]]:
    """A run's timed step times and probe times (probes empty unless every timed step has one)."""
    summ = rec.get("summary") or {}
    steps = rec.get("steps") or {}
    timed = [int(s) for s in summ.get("timed_steps") or []]
    st = [float(x) for x in summ.get("step_time_samples_s") or [] if x is not None]
    if not st:
        st = [float(v) for v in ((steps.get(str(s)) or {}).get("timing_s/step") for s in timed) if v is not None]
    pr = [(steps.get(str(s)) or {}).get(PROBE_METRIC) for s in timed]
    pr = [float(v) for v in pr] if pr and all(v is not None and v > 0 for v in pr) else []
    return st, pr


def probe_identity(rec: dict[str, Any]) -> tuple[Any, Any]:
    """The probe kernel a run timed: ``(spec, source)`` from its evidence (``evidence.speed_probe``: the
    kernel's parameters and a hash of its code; ``None`` where the record does not say)."""
    sp = (rec.get("evidence") or {}).get("speed_probe") or {}
    return (sp.get("spec"), sp.get("source")) if isinstance(sp, dict) else (None, None)


def block_pairs(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per cell id: ``label`` and ``pairs`` = per block with both versions ok, ``(block, log step ratio, log
    probe ratio or None, cpu side)``, plus ``failed`` (runs not ok, with version and block). ``cpu side`` is +1
    (-1) when a side-by-side block (:mod:`bench.gate.side_by_side`) ran the candidate on the higher (lower) numbered
    CPU of the two, 0 when the runs were not pinned side by side. ``probes``: per version the set of probe
    identities (:func:`probe_identity`) of its ok runs."""
    runs: dict[str, dict[int, dict[str, dict[str, Any]]]] = {}
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        v = r.get("code_version")
        if v not in ("baseline", "candidate"):
            continue
        cell = out.setdefault(r["cell_id"], {"label": r.get("label") or r["cell_id"], "pairs": [], "failed": [],
                                             "probes": {"baseline": set(), "candidate": set()}})
        if r.get("status") != "ok":
            cell["failed"].append({"version": v, "block": r["repeat"], "kind": r.get("failure_kind"),
                                   "reason": (r.get("reason") or "")[:300]})
            continue
        runs.setdefault(r["cell_id"], {}).setdefault(r["repeat"], {})[v] = r
        cell["probes"][v].add(probe_identity(r))
    for cid, blocks in runs.items():
        for k in sorted(blocks):
            pair = blocks[k]
            if len(pair) < 2:
                continue
            (sb, pb), (sc, pc) = _timed(pair["baseline"]), _timed(pair["candidate"])
            vb, vc = run_value(sb), run_value(sc)
            if not vb or not vc:
                continue
            dp = math.log(run_value(pc) / run_value(pb)) if pb and pc else None
            out[cid]["pairs"].append((k, math.log(vc / vb), dp, _cpu_side(pair)))
    return out


def _cpu_side(pair: dict[str, dict[str, Any]]) -> int:
    """+1 / -1: the candidate ran on the higher / lower numbered CPU of a side-by-side block; 0 otherwise."""
    cb, cc = (run_cpu(pair[v].get("_dir", "")) if pair[v].get("_dir") else None for v in ("baseline", "candidate"))
    return 0 if cb is None or cc is None or cb == cc else (1 if cc > cb else -1)


def cpu_term(d: Any, side: Any) -> tuple[np.ndarray, dict[str, Any] | None]:
    """Remove the CPU effect of side-by-side blocks from the block log ratios ``d``: the model
    ``d_k = mu + beta * side_k + e_k`` (``side`` +-1: which CPU the candidate had; an AB/BA cross-over design with
    the CPU as the period effect, Senn, *Cross-over Trials in Clinical Research*, 2nd ed. 2002, ch. 3) fitted by
    least squares; returns ``d - beta * side`` (mean = the fitted ``mu``, spread = the residuals) and
    ``{"effect": exp(beta) - 1, "blocks": {side: count}}`` (how much slower the higher CPU made a run than the
    lower), or ``d`` unchanged and ``None`` where the blocks were not side by side or each side has fewer than 2.
    """
    d, side = np.asarray(d, float), np.asarray(side, float)
    n_hi, n_lo = int(np.sum(side > 0)), int(np.sum(side < 0))
    if len(d) == 0 or n_hi + n_lo != len(d) or min(n_hi, n_lo) < 2:
        return d, None
    sc = side - side.mean()
    beta = float(np.dot(sc, d - d.mean()) / np.dot(sc, sc))
    return d - beta * side, {"effect": math.expm1(beta), "blocks": {"+1": n_hi, "-1": n_lo}}


def probe_check(cells: dict[str, dict[str, Any]], unit: str = "block pairs") -> dict[str, Any]:
    """Whether the speed probe tracks the step time in this sweep (module text): ``apply`` (bool), ``r``,
    ``p`` (one-sided Pearson), ``sd_raw`` / ``sd_corrected`` (of the cell-centred block ratios), ``n`` pairs,
    and ``note`` (why it is or is not applied). ``unit`` names the values in the note (the stored-baseline gate
    passes groups of runs: :func:`bench.gate.stored_runs.runs_probe_check`)."""
    xs, ys = [], []
    for c in cells.values():
        pairs = [(d, dp) for _, d, dp, _ in c["pairs"] if dp is not None]
        if len(pairs) < 2 or len(pairs) != len(c["pairs"]):
            continue
        d, dp = np.array(pairs, float).T
        xs += list(d - d.mean())
        ys += list(dp - dp.mean())
    out: dict[str, Any] = {"apply": False, "n": len(xs), "r": None, "p": None, "sd_raw": None, "sd_corrected": None}
    if len(xs) < 4:
        out["note"] = f"speed probe not used: {len(xs)} {unit} with a probe (need 4 to test that it tracks)"
        return out
    x, y = np.array(xs), np.array(ys)
    out["sd_raw"], out["sd_corrected"] = float(np.std(x)), float(np.std(x - y))
    if np.std(y) == 0 or np.std(x) == 0:
        out["note"] = "speed probe not used: no spread to correlate"
        return out
    res = sps.pearsonr(x, y, alternative="greater")
    out["r"], out["p"] = float(res.statistic), float(res.pvalue)
    out["apply"] = bool(out["p"] < PROBE_ALPHA and out["sd_corrected"] < out["sd_raw"])
    fig = (f"r = {out['r']:+.2f}, one-sided p = {out['p']:.3g} over {len(x)} {unit}; spread "
           f"{out['sd_raw']:.2%} raw, {out['sd_corrected']:.2%} corrected")
    out["note"] = (f"speed probe applied: it tracks the step time in this sweep ({fig})" if out["apply"] else
                   f"speed probe NOT applied, raw run values compared: it does not track the step time in this "
                   f"sweep ({fig}; needs p < {PROBE_ALPHA} and a smaller corrected spread)")
    return out


def probe_covariate(cell: dict[str, Any]) -> tuple[np.ndarray | None, str]:
    """The speed probe's block log ratios of one cell (:func:`block_pairs`) as the covariate of its comparison,
    or ``None`` with the reason it is left out (module text): too few blocks (< :data:`COVARIATE_MIN_BLOCKS`), a
    block without a probe, or the versions timing different probe kernels; never on the values of the data (a
    moved probe is :func:`probe_moved`'s, which withholds the verdict instead). The second value is a note for
    the row (empty when the covariate is used)."""
    pairs = cell["pairs"]
    if len(pairs) < COVARIATE_MIN_BLOCKS:
        return None, f"speed probe not fitted: {len(pairs)} complete block(s) (needs {COVARIATE_MIN_BLOCKS})"
    dp = [x[2] for x in pairs]
    if any(v is None for v in dp):
        return None, "speed probe not fitted: not every block has a probe of both versions"
    ids = {v: {i for i in cell["probes"][v] if i != (None, None)} for v in ("baseline", "candidate")}
    specs = {v: {i[0] for i in ids[v]} for v in ids}
    srcs = {v: {i[1] for i in ids[v] if i[1] is not None} for v in ids}
    if (specs["baseline"] and specs["candidate"] and specs["baseline"] != specs["candidate"]) or (
            srcs["baseline"] and srcs["candidate"] and srcs["baseline"] != srcs["candidate"]):
        return None, ("speed probe not fitted: the two versions timed different probe kernels (baseline "
                      f"{sorted(map(str, ids['baseline']))}, candidate {sorted(map(str, ids['candidate']))})")
    return np.asarray(dp, float), ""


def probe_moved(dp: Any) -> str | None:
    """Whether the candidate moved the speed probe itself (its threads, allocator or background work differ): the
    probe's block log ratios ``dp`` (1-D) have a mean whose paired t test gives ``p < PROBE_MOVED_ALPHA`` and a
    relative size of at least :data:`PROBE_MOVED_MIN` (or every block moved alike). Returns the reason a verdict is
    withheld, else ``None``.

    This test never chooses the analysis (the covariate is fitted as declared, at every look): where it fires, the
    fitted covariate may have subtracted part of the candidate's own change (or added one), so a row's verdict,
    whichever way, is withheld ("cannot judge"); its interval is the declared analysis's. Withholding a verdict
    cannot raise the false-regression rate or change any interval's coverage."""
    p = np.asarray(dp, float)
    if len(p) < 2:
        return None
    sd = float(p.std(ddof=1))
    moved = math.expm1(float(p.mean()))
    if sd > 0:
        pv = float(2 * sps.t.sf(abs(p.mean()) / (sd / math.sqrt(len(p))), len(p) - 1))
        if pv < PROBE_MOVED_ALPHA and abs(moved) >= PROBE_MOVED_MIN:
            return (f"the candidate moved the speed probe itself ({moved:+.1%}, paired t p {pv:.2g}): the declared "
                    "covariate may subtract part of its own change, so no verdict is drawn from it")
    elif p.mean() != 0:
        return (f"the candidate moved the speed probe itself ({moved:+.1%} in every block alike): the declared "
                "covariate may subtract part of its own change, so no verdict is drawn from it")
    return None


def fit_intercept(d: Any, covariates: list[Any]) -> tuple[np.ndarray, float, list[float]]:
    """Least squares ``d = mu + sum_j beta_j * x_j + e`` (no centring of the ``x_j``: ``mu`` is the change where
    every covariate is 0, i.e. equal probe speed and no CPU effect). Returns ``d`` with the covariate terms
    removed (mean = ``mu``, deviations = the residuals), the factor ``f`` by which the intercept's standard error
    exceeds ``s / sqrt(n)`` (``f**2 = n * [(X'X)^-1]_00``), and the slopes ``beta``. Covariates whose column has
    no spread are dropped (slope 0). Reference: any regression text, e.g. Draper & Smith, *Applied Regression
    Analysis*, 3rd ed. 1998, ch. 5."""
    d = np.asarray(d, float)
    cols = [np.asarray(x, float) for x in covariates if x is not None and np.std(np.asarray(x, float)) > 0]
    if not cols or len(d) <= len(cols) + 1:
        return d, 1.0, [0.0] * len(cols)
    X = np.column_stack([np.ones(len(d))] + cols)
    xtx_inv = np.linalg.pinv(X.T @ X)
    beta = xtx_inv @ X.T @ d
    adj = d - X[:, 1:] @ beta[1:]
    return adj, float(math.sqrt(max(len(d) * xtx_inv[0, 0], 1.0))), [float(b) for b in beta[1:]]


def paired_comparison(records: list[dict[str, Any]], *, threshold: float, alpha: float,
                      max_mde: float | None = None, normalize: bool = True, look: int | None = None,
                      max_looks: int | None = None, decide: Callable[..., Any] | None = None,
                      analysis: dict[str, Any] | None = None) -> dict[str, Any]:
    """Compare the two code versions of an interleaved gate sweep, per cell, paired by block (module text).

    Args:
        records: run records of the sweep (both versions; ``code_version`` and ``repeat`` = block).
        threshold: smallest relative change that counts (0.05 = 5 %).
        alpha: two-sided level of the whole gate (over its cells and looks); each cell gets ``alpha / m``.
        max_mde: judge "unchanged" only when the gate can see this change (default ``2 * threshold``).
        normalize: fit the speed probe as a covariate (:func:`probe_covariate`); ignored with ``analysis``.
        look, max_looks, decide: sequential intervals (:func:`bench.planning.sequential.decide`: the repeated
            confidence interval ``lo``/``hi`` at ``look`` (complete blocks) of ``max_looks``, O'Brien-Fleming
            spending) instead of the fixed-sample t interval; the gate's rules are applied to that interval.
        analysis: the declared analysis (:func:`declare_analysis`); without it, the cells found in ``records``
            make the family and ``normalize`` the covariate.

    Returns:
        ``{"rows": [...], "probe", "analysis", "notes", "counts", "verdict", "exit_code"}``; each row has
        ``cell``, ``cell_id``, ``blocks``, ``change`` (fraction), ``ci_low``/``ci_high``, ``p_value``,
        ``sd_pair`` (log), ``mde`` (:func:`bench.stats.power.gate_mde`), ``blocks_needed``, ``alpha`` (the
        cell's), ``normalized`` (the probe fitted), ``probe_slope``, ``verdict``, ``reason``; ``probe``:
        ``{"apply", "declared", "note", "check"}`` (``check``: :func:`probe_check`, a description only).
    """
    cells = block_pairs(records)
    if analysis is None:
        analysis = declare_analysis(cells=list(cells), threshold=threshold, alpha=alpha, max_mde=max_mde,
                                    normalize=normalize, max_looks=max_looks or look or 1)
    max_mde, cell_alpha = analysis["max_mde"], analysis["alpha_per_cell"]
    declared = analysis.get("covariate") == "speed_probe"
    rows = []
    for cid, c in cells.items():
        row: dict[str, Any] = {"cell": c["label"], "cell_id": cid, "metric": "step_time", "blocks": len(c["pairs"]),
                               "normalized": False, "alpha": cell_alpha, "verdict": "cannot judge", "reason": ""}
        rows.append(row)
        notes = []
        if c["failed"]:
            cand = {f["block"] for f in c["failed"] if f["version"] == "candidate"}
            base = {f["block"] for f in c["failed"] if f["version"] == "baseline"}
            what = "; ".join(f"{f['version']} block {f['block']} {f['kind']}: {f['reason']}" for f in c["failed"])
            if not base and len(cand) >= FAILED_MIN_BLOCKS and 2 * len(cand) >= len(cand) + len(c["pairs"]):
                row["verdict"], row["reason"] = "failed", what
                continue
            notes.append(f"left out (a run failed; missing, not a regression): {what}")
        d = np.array([x for _, x, _, _ in c["pairs"]], float)
        side = np.array([sd for *_, sd in c["pairs"]], float)
        dp, why = probe_covariate(c) if declared else (None, "")
        if why:
            notes.append(why)
        _, cpu = cpu_term(d, side)
        adj, inflate, slopes = fit_intercept(d, [dp, side if cpu is not None else None])
        fitted = sum(1 for x in (dp, side if cpu is not None else None) if x is not None and np.std(x) > 0)
        row["normalized"] = dp is not None and np.std(dp) > 0
        row["probe_slope"] = slopes[0] if row["normalized"] else None
        row.update(judge_ratios(adj, threshold=threshold, alpha=cell_alpha, max_mde=max_mde, look=look,
                                max_looks=max_looks, decide=decide, name=c["label"], fitted=fitted,
                                se_factor=inflate))
        if cpu is not None and len(slopes) == fitted:
            cpu = dict(cpu, effect=math.expm1(slopes[-1]))
        row["cpu_effect"] = cpu
        if row.get("change") is not None:
            row["raw_change"] = math.expm1(float(np.mean(d)))
        moved = probe_moved(dp) if row["normalized"] else None
        if moved and row["verdict"] in ("regression", "improvement", "unchanged"):
            row["judged_verdict"], row["verdict"] = row["verdict"], "noisy"
            if "decision" in row:
                row["decision"]["verdict"] = "undecided"
            notes.insert(0, f"cannot judge: {moved} (with the covariate: {row['judged_verdict']}, "
                            f"{row['change']:+.1%}; raw {row['raw_change']:+.1%})")
        elif moved:
            notes.append(moved)
        if notes:
            row["reason"] = "; ".join([row["reason"]] + notes if row["reason"] else notes)
    out = gate_outcome([r["verdict"] for r in rows], empty="cannot judge")
    counts, verdict, code = out.counts, out.verdict, out.exit_code
    fitted_rows = [r for r in rows if r["normalized"]]
    if not declared:
        pnote = "--normalize off: raw run values (declared before the first run)"
    elif fitted_rows:
        pnote = ("speed probe fitted as a covariate (declared before the first run; slope "
                 + ", ".join(f"{r['cell']} {r['probe_slope']:+.2f}" for r in fitted_rows) + ")")
    else:
        pnote = "speed probe declared as the covariate but fitted in no cell (each row says why)"
    probe = {"apply": bool(fitted_rows), "declared": analysis.get("covariate"), "note": pnote,
             "check": probe_check(cells) if declared else None}
    notes = [pnote, f"family: {analysis['family']} cell(s), each judged at alpha {cell_alpha:.3g} "
                    f"(Bonferroni, gate alpha {analysis['alpha']})"]
    notes += [f"{r['cell']}: side by side, a run on the higher numbered CPU took "
              f"{r['cpu_effect']['effect']:+.1%} longer (removed: a CPU term in the comparison)"
              for r in rows if r.get("cpu_effect")]
    return {"rows": rows, "probe": probe, "analysis": analysis, "notes": notes, "counts": counts,
            "verdict": verdict, "exit_code": code}


def judge_ratios(d: Any, *, threshold: float, alpha: float, max_mde: float | None = None, look: int | None = None,
                 max_looks: int | None = None, decide: Callable[..., Any] | None = None,
                 name: str = "", fitted: int = 0, se_factor: float = 1.0) -> dict[str, Any]:
    """The gate's verdict on one cell from its block log ratios ``d`` (``log(v_cand / v_base)`` per block, a
    1-D array; module text). Returns the row fields: ``verdict`` (regression | improvement | unchanged | noisy),
    ``change``, ``ci_low``/``ci_high``, ``p_value``, ``sd_pair``, ``se``, ``df``, ``mde``
    (:func:`bench.stats.power.gate_mde`), ``blocks_needed``, ``robust`` (:func:`robust_check`, computed only
    where the other rules call a change, else ``None``), ``reason``
    and, with ``decide`` and ``look``, the look's ``decision``. ``fitted``: terms besides the mean already removed
    from ``d`` (:func:`fit_intercept`: the probe covariate, the CPU term), each costing a degree of freedom;
    ``se_factor``: the intercept's standard error over ``sd / sqrt(n)`` in that fit (1 without covariates).

    A **regression** (improvement) needs all of: the interval above (below) 0, the mean log ratio beyond the
    threshold, the gate able to see ``max_mde`` (``mde <= max_mde``), and the robust check agreeing (the
    Hodges-Lehmann estimate of the block ratios beyond the threshold and the one-sided Wilcoxon signed-rank
    test at ``alpha``): a burst of contention that hits a few runs of one version inflates the mean but
    neither the robust estimate nor the rank test, and it inflates ``sd_pair`` and so ``mde``. Anything the
    rules cannot call is "noisy" (cannot judge), with the blocks that would let the gate judge at this noise.
    """
    max_mde = 2 * threshold if max_mde is None else max_mde
    d = np.asarray(d, float)
    n = len(d)
    row: dict[str, Any] = {"blocks": n, "verdict": "noisy", "reason": ""}
    if n < 2 + fitted:
        row["reason"] = f"{n} complete block(s): a paired comparison needs {2 + fitted} or more"
        return row
    mean, sd = float(d.mean()), float(d.std(ddof=1 + fitted))
    se, df = sd / math.sqrt(n) * se_factor, n - 1 - fitted
    row["sd_pair"], row["se"], row["df"] = sd, se, df
    row["change"] = math.expm1(mean)
    row["mde"] = gate_mde(sd, n, alpha=alpha, threshold=threshold)
    row["blocks_needed"] = blocks_needed(sd, alpha=alpha, threshold=threshold, max_mde=max_mde)
    if se > 0:
        row["p_value"] = float(2 * sps.t.sf(abs(mean / se), df))
        h = float(sps.t.ppf(1 - alpha / 2, df)) * se
    else:
        row["p_value"], h = (0.0 if mean else 1.0), 0.0
    row["ci_low"], row["ci_high"] = math.expm1(mean - h), math.expm1(mean + h)
    lo, hi = mean - h, mean + h
    if decide is not None and look is not None:  # repeated confidence interval: error rate over all looks
        dec = decide(mean, se, df, threshold=threshold, alpha=alpha, look=look, max_looks=max_looks or look,
                     name=name)
        row["method"] = dec.method
        if dec.lo is None:
            lo, hi = -math.inf, math.inf
        else:
            lo, hi = dec.lo, dec.hi
            row["ci_low"], row["ci_high"] = dec.change_lo, dec.change_hi  # clipped at exp(+-50)
        row["decision"] = dec.to_dict()
    ev = Evidence(estimate=mean, lo=lo, hi=hi, threshold=threshold, alpha=alpha, mde=row["mde"], max_mde=max_mde)
    call = decide_change(ev)
    sees, slower = call.sees, call.slower
    rob = row["robust"] = robust_check(d, threshold=threshold, alpha=alpha) if call.slower or call.faster else None
    if rob is not None:  # the robust check must agree before a change is called
        call = decide_change(replace(ev, robust=Robust(slower=rob["slower"], faster=rob["faster"])))
    row["verdict"] = call.verdict
    if "decision" in row:  # the look's decision in the sequential vocabulary, as the gate decided it
        row["decision"]["verdict"] = {"regression": "slower", "improvement": "faster",
                                      "unchanged": "no_change"}.get(row["verdict"], "undecided")
    if row["verdict"] == "noisy":
        more = row["blocks_needed"]
        why = ("" if sees or lo <= 0 else
               f"the interval is above 0 ({row['change']:+.1%}) but the gate cannot see {max_mde:.0%} at this noise, "
               "so a slowdown is not called: ")
        if slower:
            why = (f"the interval is above 0 ({row['change']:+.1%}) but the robust check disagrees (Hodges-Lehmann "
                   f"{math.expm1(rob['hl']):+.1%}, signed-rank p {rob['p_greater']:.3g}): ")
        row["reason"] = (why + f"cannot judge yet: with {n} blocks the gate sees a change of {row['mde']:.1%} or "
                         f"more (limit {max_mde:.0%}), upper bound {row['ci_high']:+.1%}; at this noise (SD of a "
                         f"block's log ratio {sd:.3f}) "
                         + (f"{more} blocks would do ({max(more - n, 1)} more)" if more else
                            f"no number of blocks gets under {max_mde:.0%}: quieten the machine"))
    return row


def robust_check(d: Any, *, threshold: float, alpha: float) -> dict[str, Any]:
    """Robust view of the block log ratios ``d``: ``hl`` the Hodges-Lehmann estimate (median of the Walsh
    averages ``(d_i + d_j) / 2``, i <= j), ``p_greater`` / ``p_less`` the one-sided Wilcoxon signed-rank
    p-values (scipy, exact for small n), and ``slower`` / ``faster``: ``hl`` beyond the threshold and the
    one-sided p under ``alpha``. A burst hitting one or two runs moves the mean but hardly these (Hollander &
    Wolfe, Nonparametric Statistical Methods, ch. 3)."""
    d = np.asarray(d, float)
    i, j = np.triu_indices(len(d))
    hl = float(np.median((d[i] + d[j]) / 2)) if len(d) else 0.0
    thr = math.log1p(threshold)
    out: dict[str, Any] = {"hl": hl, "p_greater": 1.0, "p_less": 1.0}
    if len(d) >= 2 and np.any(d != 0):
        out["p_greater"] = float(sps.wilcoxon(d, alternative="greater").pvalue)
        out["p_less"] = float(sps.wilcoxon(d, alternative="less").pvalue)
    out["slower"] = bool(hl > thr and out["p_greater"] < alpha)
    out["faster"] = bool(hl < -thr and out["p_less"] < alpha)
    return out


def gate_figure(records: list[dict[str, Any]], *, threshold: float, alpha: float) -> float | None:
    """The gate's "smallest change it can see" on an interleaved gate sweep: the largest :func:`gate_mde` over
    its cells, exactly as :func:`paired_comparison` computes it (the report shows this figure)."""
    res = paired_comparison(records, threshold=threshold, alpha=alpha)
    vals = [r["mde"] for r in res["rows"] if r.get("mde") is not None]
    return max(vals) if vals else None
