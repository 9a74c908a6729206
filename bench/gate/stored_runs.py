"""Run-level comparison of two sweeps for ``gate --baseline`` (a stored baseline, or another sweep):
:func:`compare_runs`, with the speed probe checked first (:func:`runs_probe_check`).

The unit is the run, as in the interleaved gate and the report (:mod:`bench.gate.runs`): a run's value is
:func:`bench.records.figures.run_value` (the median of its timed-step samples) and steps of one run are never treated as
independent samples. Per matched cell, on the log scale (``x = log v`` for a time, ``-log v`` for a rate, so that
``x`` grows when the cell gets worse): estimate ``mean(x_cand) - mean(x_base)``, standard error

    ``se^2 = s_b^2 / n_b + s_c^2 / n_c + 2 * s_o^2``

with ``s_b``, ``s_c`` the SDs of the runs' ``x`` on each side and ``s_o^2`` the **sweep offset variance** the
stored baseline measured over its saved sweeps (:func:`bench.gate.baseline.sweep_to_sweep`: the SD of a sweep's cell
value across saves, minus the part its runs' spread explains; on the scale compared, speed-normalized where the
probe is applied, :func:`sweep_offset_var`), since the two sides are different sweeps and each carries its own
offset; degrees of freedom by Welch-Satterthwaite over the three terms (Kalibera & Jones 2020: runs as the unit,
the ratio on the log scale), **at most the offset's own** ``df_o`` (saves - 1: one offset per sweep, shared by its
cells; :func:`bench.gate.baseline.sweep_to_sweep`). The cap is the conservative rule of the smallest component's
degrees of freedom (Hsu 1938; Mickey & Brown 1966, for the Behrens-Fisher statistic): Welch-Satterthwaite alone
trusts a sweep-to-sweep variance estimated on 1 or 2 df whenever that estimate happens to come out small, and then
ignores the offset (2 saves, 4 cells, a shared offset SD 0.04, recorded runs at an idle machine's spread: 3.3 % false
regressions at alpha 1 %, 4.1 % with the offset's df counted per cell, 0 of 800 with the cap;
``tests/gate/test_baseline_offset_df.py``). A baseline saved from few sweeps therefore judges
step time only where the offset is small against the threshold, and says that saving more sweeps would help.
Without a measured sweep-to-sweep figure (one save, or a sweep as reference) ``s_o``
is unknown: the interval then holds within sweeps only, and the gate does not decide on it (below).

**Speed probe** (``--normalize auto``): each run's ``x`` minus the log of its median probe time, applied only
where the probe tracks the metric **in the reference alone** (:func:`declared_probes`: the stored baseline's saved
sweep, or the reference sweep; never the candidate's data, so the correction is declared before the data it
judges): over the reference's runs, each cell centred on its own mean, ``x`` and the log probe correlate
(one-sided Pearson ``p < PROBE_ALPHA``) and the corrected values spread less than the raw ones
(:func:`bench.gate.runs.probe_check`, the interleaved gate's test, with runs instead of block pairs).
Otherwise the raw run values are compared and the note says why.

**Family** (:func:`family_alpha`): the ``m`` rows (matched cells x metrics) and the ``expect`` claims can each make
the verdict, so each is tested, and its interval drawn, at ``alpha / m`` (Bonferroni). **No measured offset**
(:func:`no_offset_reason`): with a reference that measured no sweep-to-sweep offset (a baseline saved from one
sweep, or a sweep) a speed-scaled row is "cannot judge", whatever its within-sweep interval says
(``judged_verdict`` keeps that). **Failed runs** are missing data (:func:`failed_runs`).

Verdict rules as the interleaved gate's (:func:`bench.gate.runs.judge_ratios`, without its rank check):
**regression** when the gate can see ``max_mde`` (:func:`bench.stats.power.mde_from_se` on this ``se`` and
``df``, the formula of :func:`bench.stats.power.gate_mde`), the interval is above 0 and the estimate beyond the
threshold; **improvement** likewise below; **unchanged** when it can see ``max_mde`` and the interval's upper end
is below it; else **noisy** (cannot judge). A busy machine (CPU pressure recorded around either side's runs above
:data:`bench.records.snapshot.CONTENDED_PSI`) shifts whole sweeps by tens of percent, which no within-sweep spread
shows: without a measured sweep-to-sweep figure the row is then "noisy" too.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import numpy as np
from scipy import stats as sps

from bench.gate.runs import probe_check
from bench.records.figures import run_value
from bench.records.speed import SPEED_SCALED
from bench.spec.metrics import METRICS
from bench.stats.decide import Evidence, decide_change
from bench.stats.power import mde_from_se


def run_logs(cell: dict[str, Any], metric: str, sign: float) -> tuple[list[float], list[float | None]]:
    """Per ok repeat of a snapshot cell: ``sign * log(run value)`` and the log of the run's median probe time
    (``None`` unless the probe covers every sample)."""
    xs, ps = [], []
    for r in cell.get("repeats") or []:
        if r.get("status", "ok") != "ok":
            continue
        samples = r.get("samples") or {}
        vals, pr = samples.get(metric) or [], samples.get("speed_probe") or []
        v = run_value(vals)
        if not v or v <= 0:
            continue
        xs.append(sign * math.log(v))
        ps.append(math.log(run_value(pr)) if pr and len(pr) == len(vals) and min(pr) > 0 else None)
    return xs, ps


def runs_probe_check(sides: list[tuple[list[float], list[float | None]]]) -> dict[str, Any]:
    """Whether the probe tracks the metric over the runs of these sweeps: ``sides`` = per (cell, side) the runs'
    ``x`` and log probes (:func:`run_logs`); :func:`bench.gate.runs.probe_check` with each (cell, side) as
    a group of runs."""
    cells = {str(i): {"pairs": [(j, x, p, 0) for j, (x, p) in enumerate(zip(xs, ps))]}
             for i, (xs, ps) in enumerate(sides)}
    return probe_check(cells, unit="runs")


def sweep_offset_var(s2s: dict[str, Any] | None, base_xs: list[float],
                     normalized: bool = False) -> tuple[float, float | None, str | None]:
    """``(s_o^2, df, scale)``: the variance of one sweep's offset from a stored baseline's measured sweep-to-sweep
    SD (minus the part the baseline's own run spread explains, floored at 0), its degrees of freedom and the scale
    it was measured on (``"raw"`` or ``"speed-normalized"``); ``(0, None, None)`` when not measured.

    ``normalized``: the compared values are speed-normalized (the probe applied): the baseline's
    speed-normalized figure is used, measured on the same scale; a baseline saved without it (older files, or
    sweeps without the probe) gives the raw figure, which is larger on a machine whose speed moves between
    sweeps (conservative: the interval is wider, never narrower)."""
    s2s = s2s or {}
    fig, scale = s2s, "raw"
    if normalized and (s2s.get("normalized") or {}).get("sd_log") is not None:
        fig, scale = s2s["normalized"], "speed-normalized"
    sd = fig.get("sd_log")
    if sd is None:
        return 0.0, None, None
    within = float(np.var(base_xs, ddof=1)) / len(base_xs) if len(base_xs) > 1 else 0.0
    return max(0.0, sd ** 2 - within), float(fig.get("df") or 1), scale


def compare_runs(base_cell: dict[str, Any], cand_cell: dict[str, Any], metric: str, *, higher_is_better: bool,
                 threshold: float, alpha: float, max_mde: float, probe: bool, s2s: dict[str, Any] | None = None,
                 busy: str | None = None) -> dict[str, Any]:
    """Compare one metric of two snapshot cells, runs as the unit (module text). ``probe``: apply the speed
    probe (the caller ran :func:`runs_probe_check`); ``s2s``: the stored baseline's ``sweep_to_sweep``; ``busy``:
    why the machine counts as busy (None when quiet).

    Returns the row fields: ``verdict`` (regression | improvement | unchanged | noisy), ``change`` (relative
    change of the metric), ``ci_low``/``ci_high``, ``p_value``, ``se``, ``df``, ``mde``, ``n_base``/``n_cand``
    (runs), ``sd_base``/``sd_cand`` (of the runs' log values), ``sweep_offset_sd``, ``raw_change``, ``reason``.
    """
    sign = -1.0 if higher_is_better else 1.0
    (xb, pb), (xc, pc) = run_logs(base_cell, metric, sign), run_logs(cand_cell, metric, sign)
    row: dict[str, Any] = {"verdict": "noisy", "n_base": len(xb), "n_cand": len(xc), "reason": ""}
    if len(xb) < 2 or len(xc) < 2:
        row["verdict"] = "cannot judge"
        row["reason"] = (f"too few runs: {len(xb)} baseline and {len(xc)} candidate run(s); a run-level comparison "
                         "needs 2 or more runs per side (set the matrix's repeats)")
        return row
    raw = float(np.mean(xc) - np.mean(xb))
    row.update(raw_change=math.expm1(sign * raw), base_median=float(np.median(np.exp(sign * np.array(xb)))),
               cand_median=float(np.median(np.exp(sign * np.array(xc)))))
    if probe:
        xb = [x - p for x, p in zip(xb, pb)]
        xc = [x - p for x, p in zip(xc, pc)]
        row["speed_change"] = math.expm1(float(np.mean(pc) - np.mean(pb)))
    diff = float(np.mean(xc) - np.mean(xb))
    vo, df_o, scale = sweep_offset_var(s2s, xb, normalized=probe)
    terms = [(float(np.var(xb, ddof=1)) / len(xb), len(xb) - 1), (float(np.var(xc, ddof=1)) / len(xc), len(xc) - 1)]
    if df_o is not None:
        terms.append((2 * vo, df_o))
    se2 = sum(t for t, _ in terms)
    se = math.sqrt(se2)
    df = se2 ** 2 / sum(t ** 2 / d for t, d in terms) if se2 > 0 else float(len(xb) + len(xc) - 2)
    if df_o is not None:  # never more than the offset's own (module text: the smallest component's df)
        df = min(df, df_o)
    h = float(sps.t.ppf(1 - alpha / 2, df)) * se
    lo, hi = diff - h, diff + h
    ends = sorted((math.expm1(sign * lo), math.expm1(sign * hi)))
    row.update(change=math.expm1(sign * diff), ci_low=ends[0], ci_high=ends[1], se=se, df=df,
               sd_base=math.sqrt(terms[0][0] * len(xb)), sd_cand=math.sqrt(terms[1][0] * len(xc)),
               sweep_offset_sd=math.sqrt(vo) if df_o is not None else None, sweep_offset_scale=scale,
               p_value=float(2 * sps.t.sf(abs(diff) / se, df)) if se > 0 else (0.0 if diff else 1.0),
               mde=mde_from_se(se, alpha=alpha, threshold=threshold, df=df))
    if busy and df_o is None:
        row["reason"] = (f"cannot judge: {busy}; a busy machine shifts whole sweeps by tens of percent, which the "
                         "runs' spread does not show and this baseline has no measured sweep-to-sweep figure: rerun "
                         "on an idle machine, or use `gate --interleave` (both versions in one sweep)")
        return row
    row["verdict"] = decide_change(Evidence(estimate=diff, lo=lo, hi=hi, threshold=threshold, alpha=alpha,
                                            mde=row["mde"], max_mde=max_mde)).verdict
    if row["verdict"] == "noisy":
        need = row["runs_needed"] = runs_needed(row["sd_base"], row["sd_cand"], vo, alpha=alpha, threshold=threshold,
                                                max_mde=max_mde, offset_df=df_o)
        more = (f"{need} runs per side would do at this spread" if need else
                f"no number of runs per side gets under {max_mde:.0%} at this spread")
        if df_o is not None and not need:
            more += (f" (the sweep offset is measured on {df_o:.0f} degree(s) of freedom, saves - 1: save the "
                     "baseline from more sweeps)")
        row["reason"] = (f"cannot judge: with {len(xb)} + {len(xc)} runs the gate sees a change of {row['mde']:.1%} "
                         f"or more (limit {max_mde:.0%}), interval {ends[0]:+.1%} to {ends[1]:+.1%}"
                         + (f" (a sweep's own offset, SD {math.sqrt(vo):.3f} {scale}, included)" if df_o is not None
                            else "")
                         + f"; {more}; an idle machine, or `gate --interleave`, would let it judge")
    return row


def runs_needed(sd_base: float, sd_cand: float, offset_var: float, *, alpha: float, threshold: float,
                max_mde: float, limit: int = 1000, offset_df: float | None = None) -> int | None:
    """Fewest runs per side with which :func:`compare_runs` would see ``max_mde`` at these run SDs (of log values)
    and sweep offset variance (the figure of :func:`bench.stats.power.mde_from_se`, Welch df taken as
    ``2 n - 2``, at most ``offset_df`` where the offset is measured, as in :func:`compare_runs`); ``None`` when not
    even ``limit`` runs would (the offset alone, or its few degrees of freedom, is too large). The figure falls as
    ``n`` grows (smaller ``se``, more df), so the first ``n`` is found by bisection (:func:`bisect.bisect_left`)."""
    def sees(n: int) -> bool:
        se = math.sqrt((sd_base ** 2 + sd_cand ** 2) / n + 2 * offset_var)
        df = 2 * n - 2 if offset_df is None else min(2 * n - 2, offset_df)
        return mde_from_se(se, alpha=alpha, threshold=threshold, df=df) <= max_mde

    ns = range(2, limit + 1)
    i = bisect.bisect_left(ns, True, key=sees)
    return ns[i] if i < len(ns) else None


def declared_probes(ref_cells: list[dict[str, Any]], metrics: list[str], source: str) -> dict[str, dict[str, Any]]:
    """Per speed-scaled metric, whether the gate applies the speed probe, **declared from the reference alone**
    (the stored baseline's saved sweep, or the reference sweep): :func:`runs_probe_check` over the reference's
    cells whose ok runs all carry a probe at every sample, so that no candidate's data can choose the correction
    its own comparison then uses. ``source`` names the reference in the note. Each value: ``apply``, ``note``,
    ``decided_from`` and the check's figures (``r``, ``p``, ``n``, ``sd_raw``, ``sd_corrected``)."""
    out = {}
    for metric in metrics:
        if metric not in SPEED_SCALED:
            continue
        sign = -1.0 if METRICS[metric].higher_is_better else 1.0
        sides = [run_logs(c, metric, sign) for c in ref_cells]
        sides = [(xs, ps) for xs, ps in sides if xs and all(p is not None for p in ps)]
        chk = runs_probe_check(sides)
        chk["note"] = chk["note"].replace("in this sweep", f"in {source}")
        chk["decided_from"] = (f"{source} alone, before any candidate data is read: the probe is applied only where "
                               "it tracks the metric over the reference's own runs")
        out[metric] = chk
    return out


def family_alpha(alpha: float, m: int) -> float:
    """Each row's (and claim's) level in a gate of ``m`` verdict-making tests: ``alpha / m`` (Bonferroni: the
    chance that any of the ``m`` says regression or "not met" when none should is at most ``alpha``; Dunn 1961)."""
    return alpha / max(1, m)


def no_offset_reason(kind: str, s2s: dict[str, Any] | None) -> str:
    """Why a speed-scaled row of a reference without a measured sweep-to-sweep offset cannot be judged, and what to
    do (one line). ``kind``: ``baseline`` or ``sweep``."""
    if kind == "baseline":
        what = (f"baseline saved from {(s2s or {}).get('sweeps', 1)} sweep(s); save it again from a second sweep of "
                "the same code (`baseline save SWEEP --name NAME --force` appends it to the history)")
    else:
        what = "the reference is a sweep; give a baseline saved from 2 or more sweeps (`baseline save`, then --force)"
    return (f"cannot judge: no measured sweep-to-sweep offset, which this within-sweep interval ignores ({what}), "
            "or use `gate --interleave`")


def failed_runs(cell: dict[str, Any], input_kinds: tuple[str, ...] = ("bad_input",)) -> tuple[str | None, str]:
    """A candidate cell with failed runs: ``(verdict, reason)``. Failed runs are missing data, never a regression
    on their own: the row is compared on the ok runs (``verdict`` None) when 2 or more remain, else "cannot
    judge"; only a cell of which 2 or more runs and at least half of its runs failed, none on bad input, is
    ``failed`` (the candidate does not run where the baseline did; the interleaved gate's rule,
    :data:`bench.gate.runs.FAILED_MIN_BLOCKS`)."""
    fails = cell.get("failures") or []
    ok = [r for r in cell.get("repeats") or [] if r.get("status", "ok") == "ok"]
    text = "; ".join(f"r{f['repeat']} {f['kind']}: {' '.join(str(f['reason']).split())[:200]}" for f in fails)
    if any(f["kind"] in input_kinds for f in fails):
        return "cannot judge", f"candidate failed on bad input (not a regression): {text}"
    if len(fails) >= 2 and 2 * len(fails) >= len(fails) + len(ok):
        return "failed", f"{len(fails)} of {len(fails) + len(ok)} candidate runs failed: {text}"
    if len(ok) < 2:
        return "cannot judge", (f"missing data: {len(fails)} candidate run(s) failed, {len(ok)} ok (a comparison of "
                                f"runs needs 2): {text}")
    return None, f"missing data: {len(fails)} failed candidate run(s) left out, compared on {len(ok)} ok runs: {text}"
