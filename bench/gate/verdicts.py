"""``run_bench.py gate --baseline NAME_OR_FILE --candidate SWEEP``: did this change make training slower?

Cells of the candidate sweep are matched to the baseline's by their factor levels (not by cell id:
a candidate with other base settings, e.g. an injected delay, has other cell ids but the same levels).
For each matched cell and metric (``--metric``, default ``step_time``; also ``throughput``,
``rollout_share``, ``free_ratio``) the **runs** of both sides are compared (:mod:`bench.gate.stored_runs`:
a run's value is the median of its timed steps, Welch t on the log run values, plus the stored baseline's
measured sweep-offset variance; the speed probe applied only where it tracks the metric over the baseline's own
runs, declared before the candidate is read), as in the interleaved gate and the report. Each of the ``m`` rows
(cells x metrics) and applicable claims is tested, and its interval drawn, at ``alpha / m`` (Bonferroni: at most
``alpha`` chance of any false regression in one gate). A step-time or throughput row against a reference that
measured no sweep-to-sweep offset (a baseline saved from one sweep, or a sweep) is "cannot judge".
Verdicts: **regression** when the gate can see ``--max-mde`` (default
twice the threshold), the interval is above 0 and the change beyond ``--threshold`` (default 5 %);
**improvement** likewise below; **unchanged** when it can see ``--max-mde`` and the interval's upper end is
below it; else **noisy** ("cannot judge", exit 3), also whenever a side ran on a busy machine (CPU pressure
above :data:`bench.records.snapshot.CONTENDED_PSI`) and the baseline has no measured sweep-to-sweep figure.

``--pairing auto`` or a named ``--test`` keep the older per-step comparison
(:func:`bench.stats.stat_tests.compare`: Hodges-Lehmann shift of the log step samples, Mann-Whitney U or,
paired step by step on equal work, Wilcoxon signed-rank; bootstrap interval over repeats; speed-normalized
per step where both sides carry the probe; "noisy" when the spread would hide ``--max-mde``). Steps of one
run are not independent samples, so its p-values are too small on a machine whose runs shift as a whole:
use it for diagnosis, not as the gate.

Exit code (:data:`EXIT_CODES`): **1** when a cell regressed, 2 or more and at least half of the runs of a
candidate cell failed where the baseline's ran, or a claim of the ``expect`` block is not met; else **3**
("cannot judge") when a compared cell or claim could not be judged (missing samples, fewer than 2 ok runs left
after failed ones, too few samples to ever reach ``p < alpha``, too noisy, no measured sweep-to-sweep offset, a
candidate failure of kind ``bad_input``, a cell a claim needs, a claim whose interval holds its bound); a single failed
run is missing data, not a regression;
else **0**. **2** is bad input only (one line on stderr, nothing judged: unknown baseline or sweep, no
matching cells, another engine or platform, a failed baseline cell, bad flags). Every reason is written
out in full.

Outputs: ``gate.md`` (a markdown table for a CI job summary; appended to ``$GITHUB_STEP_SUMMARY``
when set) and ``gate.json`` in ``--out`` (default ``<candidate sweep>/gate/``), and an MLflow run
(``bench.kind=gate``, tag ``bench.verdict``) in the candidate's experiment; the candidate's parent run
is tagged ``bench.gate.stored.<baseline>=<verdict>``.

The matrix ``expect`` block (claims such as "dynamic_bsz lowers step time by at least 10 % vs the
all-off cell") is checked within the candidate sweep on its runs, by the report's own function
(:func:`check_expectations` finds the cells, :func:`bench.report.tables.claims_on_runs` judges them;
:func:`bench.gate.stored.judge_claims`): a claim whose interval excludes it is not met and exits 1. Without
``--baseline`` only the claims are checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from bench.core.errors import BenchError
from bench.gate.stored_runs import compare_runs, declared_probes, failed_runs, family_alpha, no_offset_reason
from bench.records.snapshot import CONTENDED_PSI, cpu_pressure, levels_key, pairable
from bench.records.speed import SPEED_SCALED, normalizable, normalized_pair
from bench.spec.expect import Expect, ExpectBlock
from bench.spec.loading import format_validation_error
from bench.spec.metrics import METRICS
from bench.spec.optimizations import REGISTRY, applicability
from bench.stats.decide import (  # noqa: F401  (CANNOT_JUDGE, EXIT_*: the gate's public names)
    CANNOT_JUDGE,
    EXIT_BAD_INPUT,
    EXIT_CANNOT_JUDGE,
    EXIT_PASS,
    EXIT_REGRESSION,
    gate_outcome,
)
from bench.stats.estimators import N_BOOT
from bench.stats.power import mde_from_se
from bench.stats.stat_tests import compare, verdict

EXIT_CODES = (f"exit codes: {EXIT_PASS} pass; {EXIT_REGRESSION} regression (a cell slower beyond the threshold, "
              f"half or more (2+) of a candidate cell's runs failed, or a claim of the matrix `expect` block not met); "
              f"{EXIT_BAD_INPUT} bad input "
              "(one line on stderr: unknown baseline or sweep, no matching cells, another engine or platform, a failed "
              f"baseline cell, a bad flag); {EXIT_CANNOT_JUDGE} cannot judge (too noisy, too few samples to reach "
              "p < alpha, missing samples or failed runs, no measured sweep-to-sweep offset, a candidate cell that "
              "failed on bad input: the reasons are printed)")
#: metrics whose whole sweep moves with the machine (clock, contention): a row of one is decided against a stored
#: reference only where the reference measured its sweep-to-sweep offset (CPU time: its own figure, never scaled by
#: the wall-clock speed probe)
OFFSET_METRICS = frozenset(SPEED_SCALED) | {"cpu_time"}


def offset_figure(s2s: dict[str, Any] | None, metric: str) -> dict[str, Any] | None:
    """The stored baseline's measured sweep-to-sweep figure (``{"sd_log", "df"}``) of a metric with its own
    (``cpu_time``: :func:`bench.gate.baseline.sweep_to_sweep`'s ``cpu_time``), or ``None`` where not measured."""
    fig = (s2s or {}).get(metric)
    return fig if isinstance(fig, dict) and fig.get("sd_log") is not None else None


#: candidate failure kinds that are input errors, not regressions of the candidate
INPUT_FAILURES = ("bad_input",)
#: base settings whose difference is expected between baseline and candidate (not reported)
_IGNORED_BASE = {"timeout_s"}


def clip(text: str, limit: int = 400) -> str:
    """``text`` on one line, at most about ``limit`` characters, cut only at the end of a sentence or clause
    (``. ``, ``; ``, `` | ``) and then marked ``[...]``; a text with no such break within the limit is kept whole."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    cut = max(text.rfind(sep, 0, limit) for sep in (". ", "; ", " | "))
    return text if cut <= 0 else text[:cut + 1].rstrip() + " [...]"


# -- expect block ---------------------------------------------------------------------------------

def validate_expect(raw: Any, file: str | Path = "matrix", text: str = "") -> list[Expect]:
    """Validate a matrix's ``expect`` list.

    Raises:
        BenchError: one line naming file, line (when found), ``expect.<i>.<key>`` and the problem.
    """
    try:
        return ExpectBlock(expect=raw or []).expect
    except ValidationError as exc:
        raise BenchError(format_validation_error(file, exc, text)) from None


def _find_cell(snap: dict[str, Any], levels: dict[str, Any]) -> dict[str, Any] | None:
    key = levels_key(levels)
    return next((c for c in snap["cells"] if c["key"] == key), None)


def _groups(cell: dict[str, Any], metric: str) -> list[list[float]]:
    return [r["samples"].get(metric, []) for r in cell["repeats"] if r.get("status") == "ok"]


def _matrix_levels(snap: dict[str, Any]) -> dict[str, list[int]]:
    """Levels of each factor present in the sweep's cells (applicable ones only)."""
    out: dict[str, set] = {}
    for c in snap["cells"]:
        for k, v in c["levels"].items():
            if v is not None:
                out.setdefault(k, set()).add(v)
    return {k: sorted(v) for k, v in out.items()}


def check_expectations(snap: dict[str, Any], expects: list[Expect], *, alpha: float, n_boot: int = N_BOOT,
                       seed: int = 0, pairing: bool = False, normalize: bool = True,
                       test: str | None = None) -> list[dict[str, Any]]:
    """Find the cells of each claim within one sweep snapshot and compare their pooled steps; one result dict per
    claim. The gate and the report then judge each claim on its runs (:func:`bench.report.tables.claims_on_runs`,
    which replaces ``result``/``reason`` wherever a ``comparison`` was made); the step-level ``result`` here is
    never a verdict on its own.

    With ``normalize`` (default) step times and throughput are speed-normalized (:mod:`bench.records.speed`)
    when both cells carry the same speed probe: cells of a sweep run minutes apart.

    ``result``: ``met``, ``not met``, ``n/a`` (the factor does not apply on this engine/platform) or
    ``cannot judge`` (a cell the claim needs is missing, failed or has no samples; ``reason`` says which).
    """
    out = []
    all_levels = _matrix_levels(snap)
    any_cell = snap["cells"][0]["levels"] if snap["cells"] else {}
    # all-off / all-on: every applicable factor at its lowest / highest level in the sweep (a factor the
    # matrix holds fixed keeps its one level)
    off = {k: (None if v is None else all_levels[k][0]) for k, v in any_cell.items()}
    on = {k: (None if v is None else all_levels[k][-1]) for k, v in any_cell.items()}
    for i, e in enumerate(expects):
        res: dict[str, Any] = {
            "index": i,
            "claim": e.describe(),
            **e.model_dump(),
            "result": CANNOT_JUDGE,
            "reason": "",
        }
        out.append(res)
        if e.factor != "all" and any_cell.get(e.factor, 0) is None:
            res["result"] = "n/a"
            res["reason"] = applicability(e.factor, snap["engine"], snap["platform"], snap.get("base") or {}) or \
                "not applicable in this sweep"
            continue
        if e.factor == "all":
            ref_lv, cell_lv = off, on
        elif e.vs == "all_off":
            seen = all_levels.get(e.factor, [])
            level = (
                e.level
                if e.level is not None
                else (seen[-1] if len(seen) > 1 else REGISTRY[e.factor].default_levels[-1])
            )
            ref_lv, cell_lv = off, {**off, e.factor: level}
        else:
            ref_lv, cell_lv = {**on, e.factor: all_levels.get(e.factor, [REGISTRY[e.factor].off])[0]}, on
        if ref_lv == cell_lv:
            res["reason"] = f"{e.factor} takes one level in this sweep: nothing to compare"
            continue
        ref, cell = _find_cell(snap, ref_lv), _find_cell(snap, cell_lv)
        missing = [
            f"{name} cell ({levels_key(lv)})"
            for name, lv, c in (("reference", ref_lv, ref), ("compared", cell_lv, cell))
            if c is None
        ]
        if missing:
            res["reason"] = f"the sweep has no {' and no '.join(missing)}: add it to the design"
            continue
        res["reference"], res["cell"] = ref["label"], cell["label"]
        bad = [c for c in (ref, cell) if c["status"] != "ok"]
        if bad:
            res["reason"] = "; ".join(f"{c['label']} is {c['status']}" for c in bad)
            continue
        m = METRICS[e.metric]
        rg, cg = _groups(ref, e.metric), _groups(cell, e.metric)
        if normalize and normalizable(ref, cell, e.metric) is None:
            rg, cg, res["speed_change"] = normalized_pair(ref, cell, e.metric, rg, cg)
            res["normalized"] = True
        cmp = compare(rg, cg, alpha=alpha, n_boot=n_boot, seed=seed,
                      scale=m.scale, paired=pairing and pairable(ref, cell, e.metric), test=test)
        res["comparison"] = cmp.to_dict()
        if cmp.change is None:
            res["reason"] = f"no {e.metric} samples ({cmp.n_base} reference, {cmp.n_cand} compared)" + \
                (f"; {'; '.join(cmp.notes)}" if cmp.notes else "")
            continue
        sign = 1.0 if m.higher_is_better else -1.0
        imp = sign * cmp.change
        lo, hi = sorted((sign * cmp.ci_low, sign * cmp.ci_high)) if cmp.ci_low is not None else (None, None)
        res.update(improvement=imp, improvement_ci=[lo, hi], p_value=cmp.p_value)
        ok = (e.at_least is None or imp >= e.at_least) and (e.at_most is None or imp <= e.at_most)
        if ok and e.at_least is not None and e.at_least > 0 and not cmp.p_value < alpha:
            ok = False
            if cmp.min_p >= alpha:
                res["result"] = CANNOT_JUDGE
                res["reason"] = (f"{cmp.n_base}+{cmp.n_cand} samples cannot reach p < {alpha} "
                                 f"(smallest possible p {cmp.min_p:.3g}): add steps or repeats")
                continue
            res["reason"] = f"not significant (p = {cmp.p_value:.3g} >= {alpha})"
        res["result"] = "met" if ok else "not met"
        if not ok and not res["reason"]:
            res["reason"] = f"improvement {imp:+.1%} outside the claim"
    return out


# -- baseline vs candidate ------------------------------------------------------------------------

def _diff_dicts(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(a) | set(b)):
        if k in _IGNORED_BASE:
            continue
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _diff_dicts(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {va!r} -> {vb!r}")
    return out


#: why a per-step comparison (``--pairing auto`` or a named ``--test``) of step time or throughput decides nothing
PER_STEP_REASON = ("per-step comparison, for diagnosis only: the steps of one run are not independent samples and "
                   "the sweep-to-sweep offset is not in it; the run-level comparison (the default) decides")


def compare_snapshots(base: dict[str, Any], cand: dict[str, Any], *, metrics: list[str], threshold: float,
                      alpha: float, n_boot: int = N_BOOT, seed: int = 0, pairing: bool = False,
                      max_mde: float | None = None, normalize: bool = True, test: str | None = None,
                      s2s: dict[str, Any] | None = None, also_judged: int = 0) -> dict[str, Any]:
    """Gate a candidate snapshot against a baseline snapshot: runs as the unit (:mod:`bench.gate.stored_runs`,
    with ``s2s`` the stored baseline's measured ``sweep_to_sweep``), or per-step samples with ``pairing`` or a
    named ``test``.

    With ``normalize`` (default) ``step_time`` and ``throughput`` samples are speed-normalized
    (:mod:`bench.records.speed`) when both cells carry the same speed probe; each row then has
    ``normalized: true``, ``speed_change`` (the machine's slowdown during the candidate vs the
    baseline) and ``raw_change`` (the change before normalization). Otherwise ``normalize_reason``
    says why the raw samples were compared.

    Family: each row is tested at ``alpha / m`` (Bonferroni, :func:`bench.gate.stored_runs.family_alpha`),
    ``m`` = matched cells x metrics + ``also_judged`` (the claims the caller judges in the same gate), fixed by
    the design before any value is read. The speed probe of the run-level comparison is declared from the
    baseline alone (:func:`bench.gate.stored_runs.declared_probes`). A speed-scaled row whose reference measured
    no sweep-to-sweep offset (``s2s`` None or without ``sd_log``) is "cannot judge" (``judged_verdict``: what its
    within-sweep interval said). Failed candidate runs are missing data
    (:func:`bench.gate.stored_runs.failed_runs`).

    Returns ``{"rows": [...], "notes": [...], "unmatched": {...}, "counts": {...}, "verdict", "exit_code",
    "family": {"m", "alpha_each"}, "normalization": {metric: declared probe decision}}``.

    Raises:
        BenchError: different engine or platform, a failed/unfinished baseline cell, or no matching cells.
    """
    max_mde = 2 * threshold if max_mde is None else max_mde
    bmap, cmap, matched = _match_cells(base, cand)
    only_b = [bmap[k]["label"] for k in bmap if k not in cmap]
    only_c = [cmap[k]["label"] for k in cmap if k not in bmap]
    notes, psi_max = _context_notes(base, cand, [bmap[k] for k in matched], [cmap[k] for k in matched], only_b,
                                    only_c)
    run_level = not pairing and test is None
    busy = f"CPU pressure around the runs {psi_max:.0f} %" if psi_max is not None and psi_max > CONTENDED_PSI else None
    kind = base.get("_kind", "baseline")
    source = f"the {kind} {base.get('name') or base['source'].get('sweep')}"
    probes = declared_probes(base["cells"], metrics, source) if run_level and normalize else {}
    notes += [f"{m}: {chk['note']}" for m, chk in probes.items()]
    m_family = len(matched) * len(metrics) + also_judged
    a_row = family_alpha(alpha, m_family)  # every row's test and interval (Bonferroni over the family)
    offset_known = s2s is not None and s2s.get("sd_log") is not None
    cpu_s2s = offset_figure(s2s, "cpu_time")
    rows = []
    for key in matched:
        bc, cc = bmap[key], cmap[key]
        for metric in metrics:
            m = METRICS[metric]
            row: dict[str, Any] = {"cell": cc["label"], "levels": key, "metric": metric,
                                   "baseline_cell_id": bc["cell_id"], "candidate_cell_id": cc["cell_id"],
                                   "verdict": CANNOT_JUDGE, "reason": ""}
            rows.append(row)
            missing = ""
            if cc["status"] == "failed":  # failed runs are missing data (gate_stored.failed_runs)
                v_fail, missing = failed_runs(cc, INPUT_FAILURES)
                if v_fail is not None:
                    row["verdict"], row["reason"] = v_fail, missing
                    continue
            if cc["status"] == "pending":
                row["reason"] = (
                    f"candidate cell unfinished: repeats {cc['missing_repeats']} never ran (missing samples)"
                )
                continue
            bg, cg = _groups(bc, metric), _groups(cc, metric)
            nb, nc = sum(map(len, bg)), sum(map(len, cg))
            if not nb or not nc:
                side = " and ".join(s for s, n in (("baseline", nb), ("candidate", nc)) if not n)
                row["reason"] = f"missing samples: no {metric} samples in the {side} ({m.source})"
                row.update(n_base=nb, n_cand=nc)
                continue
            why = normalizable(bc, cc, metric) if normalize else "--normalize off"
            if run_level:  # runs as the unit (bench.gate.stored_runs)
                use = why is None and metric in probes and probes[metric]["apply"]
                row.update(normalized=use, test="welch t on runs", **({} if use else {"normalize_reason": why or
                                                                                       probes[metric]["note"]}))
                row.update(compare_runs(bc, cc, metric, higher_is_better=m.higher_is_better, threshold=threshold,
                                        alpha=a_row, max_mde=max_mde, probe=use, busy=busy,
                                        s2s=cpu_s2s if metric == "cpu_time" else
                                        s2s if metric in SPEED_SCALED else None))
                _finish_row(row, metric, cpu_s2s is not None if metric == "cpu_time" else offset_known, kind, s2s,
                            missing)
                continue
            if _judge_steps(row, bc, cc, metric, bg, cg, why, pairing=pairing, alpha_row=a_row, n_boot=n_boot,
                            seed=seed, test=test, threshold=threshold, max_mde=max_mde):
                _finish_row(row, metric, offset_known, kind, s2s, missing)
    counts, v, code = _overall(rows)
    return {"rows": rows, "notes": notes, "unmatched": {"baseline": only_b, "candidate": only_c},
            "counts": counts, "verdict": v, "exit_code": code, "family": {"m": m_family, "alpha_each": a_row},
            "normalization": probes}


def _match_cells(base: dict[str, Any], cand: dict[str, Any]
                 ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], list[str]]:
    """The cells of both snapshots by their key (factor levels) and the keys of both, in the baseline's order.

    Raises:
        BenchError: different engine or platform, a failed/unfinished baseline cell, or no matching cells.
    """
    if (base["engine"], base["platform"]) != (cand["engine"], cand["platform"]):
        raise BenchError(
            f"baseline {base.get('name') or base['source'].get('sweep')} is {base['engine']}/{base['platform']} "
            "but the "
            f"candidate {cand['source'].get('sweep')} is {cand['engine']}/{cand['platform']}: "
            "step times of different engines or platforms are not comparable (save a baseline on this one)"
        )
    bad_base = [c for c in base["cells"] if c.get("status", "ok") != "ok"]
    if bad_base:
        raise BenchError(
            "baseline has unusable cells: " + "; ".join(f"{c['label']} is {c.get('status')}" for c in bad_base)
        )
    bmap = {c["key"]: c for c in base["cells"]}
    cmap = {c["key"]: c for c in cand["cells"]}
    matched = [k for k in bmap if k in cmap]
    if not matched:
        raise BenchError(
            f"no matching cells: the candidate {cand['source'].get('sweep')}'s factor levels match none of the "
            f"baseline {base.get('name') or base['source'].get('sweep')}'s "
            f"(baseline: {'; '.join(c['label'] + ' [' + c['key'] + ']' for c in base['cells'][:6])}; "
            f"candidate: {'; '.join(c['label'] + ' [' + c['key'] + ']' for c in cand['cells'][:6])})")
    return bmap, cmap, matched


def _context_notes(base: dict[str, Any], cand: dict[str, Any], base_cells: list[dict[str, Any]],
                   cand_cells: list[dict[str, Any]], only_b: list[str], only_c: list[str]
                   ) -> tuple[list[str], float | None]:
    """The notes on what differs around the comparison (cells on one side only, base settings, package versions,
    machine, CPU pressure during the matched cells' runs) and the highest CPU pressure (PSI some avg60, %) of
    either side, or ``None`` where no run recorded it."""
    notes: list[str] = []
    if only_b:
        notes.append(f"baseline cells not in the candidate (not compared): {', '.join(only_b)}")
    if only_c:
        notes.append(f"candidate cells not in the baseline (not compared): {', '.join(only_c)}")
    diffs = _diff_dicts(base.get("base") or {}, cand.get("base") or {})
    if diffs:
        notes.append("base settings differ: " + "; ".join(diffs))
    vdiff = _diff_dicts(base.get("versions") or {}, cand.get("versions") or {})
    if vdiff:
        notes.append("package versions differ: " + "; ".join(vdiff))
    bm, cm = base.get("machine") or {}, cand.get("machine") or {}
    if bm and cm:
        mdiff = [d for d in _diff_dicts({k: bm.get(k) for k in ("cpu", "cpu_count", "hostname")},
                                        {k: cm.get(k) for k in ("cpu", "cpu_count", "hostname")})]
        if mdiff:
            notes.append("machine differs: " + "; ".join(mdiff))
    pb = [cpu_pressure(c) for c in base_cells]
    pc = [cpu_pressure(c) for c in cand_cells]
    pb_max = max((v for v in pb if v is not None), default=None)
    pc_max = max((v for v in pc if v is not None), default=None)
    psi_max = max((v for v in (pb_max, pc_max) if v is not None), default=None)  # either side's highest
    if psi_max is not None:
        fmt = lambda v: "-" if v is None else f"{v:.0f} %"  # noqa: E731
        line = (
            f"CPU pressure during the runs (PSI some avg60, highest): baseline {fmt(pb_max)}, candidate {fmt(pc_max)}"
        )
        if psi_max > CONTENDED_PSI:
            line = ("**contended machine**: " + line + f" (above {CONTENDED_PSI:.0f} %): other jobs competed for the "
                    "CPUs, which shifts step times by tens of percent; rerun both on an idle machine before trusting "
                    "a verdict")
        notes.insert(0, line)
    return notes, psi_max


def _judge_steps(row: dict[str, Any], bc: dict[str, Any], cc: dict[str, Any], metric: str, bg: list, cg: list,
                 why: str | None, *, pairing: bool, alpha_row: float, n_boot: int, seed: int, test: str | None,
                 threshold: float, max_mde: float) -> bool:
    """Judge ``row`` on per-step samples (``bg``/``cg``: the baseline's and candidate's groups, one per run;
    speed-normalized first where ``why`` is ``None``) with the paired test or the named ``test``, each at
    ``alpha_row``. Fills ``row`` in place; ``False`` where the row stays "cannot judge" with its reason (too few
    samples, no relative change), ``True`` where the caller finishes it (:func:`_finish_row`)."""
    m = METRICS[metric]
    nb, nc = sum(map(len, bg)), sum(map(len, cg))
    paired = pairing and pairable(bc, cc, metric)
    if why is None:
        raw = compare(bg, cg, alpha=alpha_row, n_boot=0, ci=False, scale=m.scale, paired=paired, test=test)
        bg, cg, sp = normalized_pair(bc, cc, metric, bg, cg)
        row.update(normalized=True, speed_change=sp, raw_change=raw.change,
                   raw_base_median=raw.base_median, raw_cand_median=raw.cand_median)
    else:
        row.update(normalized=False, normalize_reason=why)
    cmp = compare(bg, cg, alpha=alpha_row, n_boot=n_boot, seed=seed, scale=m.scale, paired=paired, test=test)
    row.update(cmp.to_dict())
    if cmp.min_p >= alpha_row:
        row["reason"] = (
            f"too few samples: {nb} baseline + {nc} candidate steps cannot reach p < {alpha_row:.3g} "
            f"with the {cmp.test} test (smallest possible p {cmp.min_p:.3g}); add steps or repeats"
        )
        return False
    if cmp.change is None:
        row["reason"] = "; ".join(cmp.notes) or "relative change undefined"
        return False
    row["verdict"] = verdict(cmp.change, cmp.p_value, threshold=threshold, alpha=alpha_row,
                             higher_is_better=m.higher_is_better)
    notes_ = list(cmp.notes)
    se = max((x for x in (cmp.se, cmp.se_boot) if x is not None), default=None)
    if se is not None:
        row["mde"] = mde_from_se(se, alpha=alpha_row, threshold=threshold)
        if row["mde"] > max_mde:
            row["judged_verdict"], row["verdict"] = row["verdict"], "noisy"
            notes_.insert(
                0,
                f"too noisy to judge: at this spread (steps and repeats) a change under {row['mde']:.0%} "
                f"would often go unseen (limit {max_mde:.0%}); the spread of a busy machine comes with "
                "sweep-to-sweep shifts of tens of percent: rerun on an idle machine, or add steps",
            )
    if notes_:
        row["reason"] = "; ".join(notes_)
    if metric in OFFSET_METRICS and row["verdict"] in ("regression", "improvement", "unchanged"):
        # per-step tests treat a run's steps as independent and carry no sweep-to-sweep offset: their
        # verdict is shown (judged_verdict), the gate is not decided on it
        row["judged_verdict"], row["verdict"] = row["verdict"], CANNOT_JUDGE
        row["reason"] = "; ".join(x for x in (PER_STEP_REASON + f" (per step: {row['judged_verdict']})",
                                              row.get("reason")) if x)
    return True


def _overall(rows: list[dict[str, Any]]) -> tuple[dict[str, int], str, int]:
    """The verdict count per kind, the gate's verdict and its exit code (:func:`bench.stats.decide.gate_outcome`):
    a regression or a failed cell fails it, else a row that cannot be judged or is too noisy makes it "cannot
    judge", else it passes."""
    out = gate_outcome([r["verdict"] for r in rows])
    return out.counts, out.verdict, out.exit_code


def _finish_row(row: dict[str, Any], metric: str, offset_known: bool, kind: str, s2s: dict[str, Any] | None,
                missing: str) -> None:
    """The rules after a row's comparison: a speed-scaled row whose reference measured no sweep-to-sweep offset
    is not decided on its within-sweep interval (``judged_verdict`` keeps what it said); failed runs left out
    (``missing``) are named in the reason."""
    if metric in OFFSET_METRICS and not offset_known and row["verdict"] in ("regression", "improvement", "unchanged"):
        row["judged_verdict"], row["verdict"] = row["verdict"], CANNOT_JUDGE
        row["reason"] = no_offset_reason(kind, s2s) + (f" (within sweeps: {row['judged_verdict']})")
    if missing:
        row["reason"] = "; ".join(x for x in (row.get("reason"), missing) if x)


# -- output ----------------------------------------------------------------------------------------
