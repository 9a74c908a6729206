"""The interleaved gate's comparison: baseline and candidate code in one blocked sweep, paired by block, runs
as the unit (:func:`paired_comparison`).

Each block of an interleaved gate sweep (:func:`bench.spec.plan.interleaved_order`) holds one run of every
cell under each code version, in random order. Per cell and block with both runs ok, the **block's log
ratio** is ``d = log(v_cand) - log(v_base)`` with ``v`` a run's value (:func:`bench.figures.run_value`, the
median of its timed steps): steps of one run are never treated as independent samples. Over the ``n``
blocks: estimate ``exp(mean d) - 1``, interval ``mean d +- t(1 - alpha/2, n - 1) * sd(d) / sqrt(n)``
(Kalibera & Jones 2020, "Quantifying performance changes with effect size confidence intervals": runs as
the unit, the ratio on the log scale; the paired t interval because both versions share each block's
machine state), p from the paired t test.

**Speed probe, checked before use** (:func:`probe_check`): the probe's block log ratios ``d_probe`` are
computed like ``d``; the correction ``d - d_probe`` is applied only when, in this sweep, the probe tracks
the step time: Pearson correlation of ``d`` and ``d_probe`` over all (cell, block) pairs after removing each
cell's mean, one-sided ``p < PROBE_ALPHA``, and the corrected ratios vary less than the raw ones. Otherwise
the raw ratios are used, with the test's figures in a note.

Verdict per cell (:func:`judge_ratios`): **regression** only when the gate could see the limit
(:func:`bench.analyze.power.gate_mde` <= ``max_mde``), the interval is above 0, the mean log ratio is beyond
``threshold`` and the robust check agrees (:func:`robust_check`: Hodges-Lehmann estimate beyond the threshold,
one-sided Wilcoxon signed-rank p < ``alpha``); **improvement** likewise the other way; **unchanged** when the
gate could see ``max_mde`` and the interval's upper end is below it (so a real slowdown of that size passes with
probability under ``alpha / 2``); else **noisy** ("cannot judge", with the blocks that would let it judge:
:func:`bench.analyze.power.blocks_needed`). Contention on a shared machine is heavy-tailed: a burst that hits a
few runs of one version moves the mean and widens the spread; the figure (``mde``) and the robust check keep
such a burst from being called a regression (issue 18's measured false alarm: +33.8 %, interval
[+0.3 %, +78.5 %], figure 27.9 %, now "cannot judge"). With the sequential intervals of
:func:`bench.analyze.sequential.decide` the rules are applied to the look's repeated confidence interval, so the
error rate holds across the looks of a sweep that stops when every cell is decided.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
from scipy import stats as sps

from bench.analyze.power import blocks_needed, gate_mde
from bench.figures import run_value
from bench.speed import PROBE_METRIC

#: one-sided level of the probe-tracking test
PROBE_ALPHA = 0.05


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


def block_pairs(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per cell id: ``label`` and ``pairs`` = per block with both versions ok, ``(block, log step ratio, log
    probe ratio or None, cpu side)``, plus ``failed`` (runs not ok, with version and block). ``cpu side`` is +1
    (-1) when a side-by-side block (:mod:`bench.side_by_side`) ran the candidate on the higher (lower) numbered
    CPU of the two, 0 when the runs were not pinned side by side."""
    runs: dict[str, dict[int, dict[str, dict[str, Any]]]] = {}
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        v = r.get("code_version")
        if v not in ("baseline", "candidate"):
            continue
        cell = out.setdefault(r["cell_id"], {"label": r.get("label") or r["cell_id"], "pairs": [], "failed": []})
        if r.get("status") != "ok":
            cell["failed"].append({"version": v, "block": r["repeat"], "kind": r.get("failure_kind"),
                                   "reason": (r.get("reason") or "")[:300]})
            continue
        runs.setdefault(r["cell_id"], {}).setdefault(r["repeat"], {})[v] = r
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
    from bench.side_by_side import run_cpu

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
    passes groups of runs: :func:`bench.analyze.gate_stored.runs_probe_check`)."""
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


def paired_comparison(records: list[dict[str, Any]], *, threshold: float, alpha: float,
                      max_mde: float | None = None, normalize: bool = True, look: int | None = None,
                      max_looks: int | None = None, decide: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Compare the two code versions of an interleaved gate sweep, per cell, paired by block (module text).

    Args:
        records: run records of the sweep (both versions; ``code_version`` and ``repeat`` = block).
        threshold: smallest relative change that counts (0.05 = 5 %).
        alpha: two-sided level of the test and ``1 - alpha`` intervals.
        max_mde: judge "unchanged" only when the gate can see this change (default ``2 * threshold``).
        normalize: use the speed probe where :func:`probe_check` accepts it.
        look, max_looks, decide: sequential intervals (:func:`bench.analyze.sequential.decide`: the repeated
            confidence interval ``lo``/``hi`` at ``look`` (complete blocks) of ``max_looks``, O'Brien-Fleming
            spending) instead of the fixed-sample t interval; the gate's rules are applied to that interval.

    Returns:
        ``{"rows": [...], "probe": probe_check(...), "notes", "counts", "verdict", "exit_code"}``; each row has
        ``cell``, ``cell_id``, ``blocks``, ``change`` (fraction), ``ci_low``/``ci_high``, ``p_value``,
        ``sd_pair`` (log), ``mde`` (:func:`bench.analyze.power.gate_mde`), ``blocks_needed``, ``verdict``,
        ``reason``.
    """
    max_mde = 2 * threshold if max_mde is None else max_mde
    cells = block_pairs(records)
    probe = probe_check(cells) if normalize else {"apply": False, "note": "--normalize off: raw run values"}
    rows = []
    for cid, c in cells.items():
        row: dict[str, Any] = {"cell": c["label"], "cell_id": cid, "metric": "step_time", "blocks": len(c["pairs"]),
                               "normalized": probe["apply"], "verdict": "cannot judge", "reason": ""}
        rows.append(row)
        if c["failed"]:
            cand_fail = [f for f in c["failed"] if f["version"] == "candidate"]
            base_fail = [f for f in c["failed"] if f["version"] == "baseline"]
            row["verdict"] = "failed" if cand_fail and not base_fail else "cannot judge"
            row["reason"] = "; ".join(f"{f['version']} block {f['block']} {f['kind']}: {f['reason']}"
                                      for f in c["failed"])
            continue
        d = np.array([x - (dp if probe["apply"] else 0.0) for _, x, dp, _ in c["pairs"]], float)
        d, cpu = cpu_term(d, np.array([side for *_, side in c["pairs"]], float))
        row.update(judge_ratios(d, threshold=threshold, alpha=alpha, max_mde=max_mde, look=look, max_looks=max_looks,
                                decide=decide, name=c["label"], fitted=int(cpu is not None)))
        row["cpu_effect"] = cpu
        if row.get("change") is not None:
            row["raw_change"] = math.expm1(float(np.mean([x for _, x, _, _ in c["pairs"]])))
    counts = {v: sum(r["verdict"] == v for r in rows)
              for v in ("regression", "failed", "improvement", "unchanged", "noisy", "cannot judge")}
    if counts["regression"] or counts["failed"]:
        verdict, code = "regression", 1
    elif counts["noisy"] or counts["cannot judge"] or not rows:
        verdict, code = "cannot judge", 3
    else:
        verdict, code = "pass", 0
    notes = [probe["note"]] + [f"{r['cell']}: side by side, a run on the higher numbered CPU took "
                               f"{r['cpu_effect']['effect']:+.1%} longer (removed: a CPU term in the comparison)"
                               for r in rows if r.get("cpu_effect")]
    return {"rows": rows, "probe": probe, "notes": notes, "counts": counts, "verdict": verdict,
            "exit_code": code}


def judge_ratios(d: Any, *, threshold: float, alpha: float, max_mde: float | None = None, look: int | None = None,
                 max_looks: int | None = None, decide: Callable[..., Any] | None = None,
                 name: str = "", fitted: int = 0) -> dict[str, Any]:
    """The gate's verdict on one cell from its block log ratios ``d`` (``log(v_cand / v_base)`` per block, a
    1-D array; module text). Returns the row fields: ``verdict`` (regression | improvement | unchanged | noisy),
    ``change``, ``ci_low``/``ci_high``, ``p_value``, ``sd_pair``, ``se``, ``df``, ``mde``
    (:func:`bench.analyze.power.gate_mde`), ``blocks_needed``, ``robust`` (:func:`robust_check`, computed only
    where the other rules call a change, else ``None``), ``reason``
    and, with ``decide`` and ``look``, the look's ``decision``. ``fitted``: terms besides the mean already removed
    from ``d`` (:func:`cpu_term`), each costing a degree of freedom.

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
    se, df = sd / math.sqrt(n), n - 1 - fitted
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
    thr, lim = math.log1p(threshold), math.log1p(max_mde)
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
    sees = row["mde"] is not None and row["mde"] <= max_mde
    slower, faster = sees and lo > 0 and mean > thr, sees and hi < 0 and mean < -thr
    rob = row["robust"] = robust_check(d, threshold=threshold, alpha=alpha) if slower or faster else None
    if slower and rob["slower"]:
        row["verdict"] = "regression"
    elif faster and rob["faster"]:
        row["verdict"] = "improvement"
    elif sees and hi < lim and not (lo > 0 and mean > thr):
        row["verdict"] = "unchanged"
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
