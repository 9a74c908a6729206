"""The stored-baseline gate keeps its promise (issue 30): the speed-probe correction is declared from the baseline
alone, the rows of one gate share one error rate (Bonferroni), the ``expect`` claims are judged on runs by the
report's own function, a baseline that measured no sweep-to-sweep offset decides no step-time row, and a failed
candidate run is missing data. Mostly in process, on synthetic snapshots (:func:`_snap`)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from _sweeps import log_normal_times, make_sweep

from bench.gate.baseline import sweep_to_sweep
from bench.gate.verdicts import compare_snapshots

THR = 0.05
#: a baseline whose sweeps were measured not to move (many df): the offset is known and about 0
STILL = {"sd_log": 1e-4, "df": 1000, "sweeps": 20, "normalized": {"sd_log": 1e-4, "df": 1000}, "note": "still"}


def _cell(i: int, runs: list[float], probes: list[float] | None = None,
          failed: dict[int, str] | None = None) -> dict:
    """A snapshot cell ``i`` whose runs have these step times (one timed step each: the run value), the speed
    probe's seconds per run where given, and failed runs (repeat -> kind) appended."""
    reps = []
    for k, v in enumerate(runs):
        smp = {"step_time": [float(v)], "throughput": [], "rollout_share": [], "free_ratio": [],
               "speed_probe": [float(probes[k])] if probes is not None else []}
        reps.append({"repeat": k, "status": "ok", "samples": smp, "probe_spec": "kernel" if probes else None})
    fails = []
    for k, kind in (failed or {}).items():
        reps.append({"repeat": k, "status": "failed", "samples": {"step_time": []}, "probe_spec": None})
        fails.append({"repeat": k, "kind": kind, "reason": "killed"})
    return {"key": f"cell={i}", "cell_id": f"c{i}", "label": f"cell{i}", "levels": {},
            "status": "failed" if fails else "ok", "failures": fails, "missing_repeats": [], "repeats": reps}


def _snap(cells: list[dict], name: str = "s") -> dict:
    return {"engine": "embedded", "platform": "cpu", "source": {"sweep": name}, "cells": cells, "base": {},
            "versions": {}, "name": name, "_kind": "baseline"}


def _gate(base: dict, cand: dict, alpha: float = 0.05, **kw) -> dict:
    kw.setdefault("s2s", STILL)
    kw.setdefault("threshold", THR)
    return compare_snapshots(base, cand, metrics=["step_time"], alpha=alpha, n_boot=0, **kw)


def _tracked(rng: np.random.Generator, n: int, cells: int = 2) -> dict:
    """Runs whose machine speed moves by 4 % from run to run and whose probe sees it (it tracks)."""
    out = []
    for i in range(cells):
        m = rng.normal(0, 0.04, n)
        out.append(_cell(i, list(2.0 * np.exp(m + rng.normal(0, 0.005, n))),
                         list(0.03 * np.exp(m + rng.normal(0, 0.003, n)))))
    return _snap(out)


def test_probe_correction_is_declared_from_the_baseline_alone():
    """Two candidates whose own runs would flip a probe check over both sides (in A the probe tracks the runs, in
    B the runs vary by 15 % that the probe does not see) get the same decision: the baseline's."""
    rng = np.random.default_rng(7)
    base = _tracked(rng, 6)
    cand_a = _tracked(rng, 6)
    cand_b = _snap([_cell(i, list(2.0 * np.exp(rng.normal(0, 0.15, 10))),
                          list(0.03 * np.exp(rng.normal(0, 0.003, 10)))) for i in range(2)])
    ga, gb = _gate(base, cand_a), _gate(base, cand_b)
    assert [r["normalized"] for r in ga["rows"]] == [r["normalized"] for r in gb["rows"]] == [True, True]
    assert ga["normalization"] == gb["normalization"]
    decl = ga["normalization"]["step_time"]
    assert decl["apply"] and decl["n"] == 12  # the baseline's 12 runs, none of the candidate's
    assert "alone" in decl["decided_from"] and "the baseline s" in decl["note"]
    # the baseline decides the other way too: a probe that does not track the baseline's runs is never applied
    flat = _snap([_cell(i, list(2.0 * np.exp(rng.normal(0, 0.05, 6))), list(0.03 * np.exp(rng.normal(0, 0.003, 6))))
                  for i in range(2)])
    assert not any(r["normalized"] for r in _gate(flat, cand_a)["rows"])


def _null_gates(trials: int, cells: int, n: int, sd: float, rng: np.random.Generator, **kw) -> list[dict]:
    return [_gate(_snap([_cell(i, list(2.0 * np.exp(rng.normal(0, sd, n)))) for i in range(cells)]),
                  _snap([_cell(i, list(2.0 * np.exp(rng.normal(0, sd, n)))) for i in range(cells)]), **kw)
            for _ in range(trials)]


def test_family_wise_false_regression_rate_is_held_over_many_cells():
    """200 seeded null gates of 10 cells (8 runs a side, run SD 4 %) through the real comparison, at threshold 0
    (any slowdown the interval shows counts) and a 10 % limit: uncorrected, each row says regression with chance
    alpha / 2 = 2.5 %, a gate of 10 rows about 22 %; at alpha / m each row is tested at 0.5 % and the gate's rate
    stays within alpha plus Monte Carlo error. The gate still judges: most rows are "unchanged", and a real 20 %
    slowdown of one cell is caught."""
    alpha, trials = 0.05, 200
    kw = {"threshold": 0.0, "max_mde": 0.10}
    gates = _null_gates(trials, 10, 8, 0.04, np.random.default_rng(11), **kw)
    rate = sum(g["verdict"] == "regression" for g in gates) / trials
    assert rate <= alpha + 2.5 * math.sqrt(alpha * (1 - alpha) / trials), rate
    assert gates[0]["family"] == {"m": 10, "alpha_each": pytest.approx(alpha / 10)}
    rows = [r["verdict"] for g in gates for r in g["rows"]]
    assert rows.count("unchanged") > 0.6 * len(rows)
    rng = np.random.default_rng(12)
    caught = 0
    for _ in range(20):
        b = _snap([_cell(i, list(2.0 * np.exp(rng.normal(0, 0.04, 8)))) for i in range(10)])
        c = _snap([_cell(i, list(2.0 * (1.2 if i == 3 else 1.0) * np.exp(rng.normal(0, 0.04, 8)))) for i in range(10)])
        caught += _gate(b, c, **kw)["rows"][3]["verdict"] == "regression"
    assert caught >= 0.8 * 20


def test_single_sweep_baseline_decides_no_step_time_row_and_history_carries_the_offset():
    rng = np.random.default_rng(3)
    base = _snap([_cell(i, list(2.0 * np.exp(rng.normal(0, 0.01, 6)))) for i in range(2)])
    cand = _snap([_cell(i, list(2.0 * np.exp(rng.normal(0, 0.01, 6)))) for i in range(2)])
    once = sweep_to_sweep([{"sweep": "s0", "log_step_time": {"cell=0": 0.69, "cell=1": 0.70}}])
    g = _gate(base, cand, s2s=once)
    assert g["verdict"] == "cannot judge" and g["exit_code"] == 3
    for r in g["rows"]:
        assert r["judged_verdict"] == "unchanged" and r["verdict"] == "cannot judge"  # not a too-narrow "pass"
        assert "saved from 1 sweep(s)" in r["reason"] and "--force" in r["reason"] and "--interleave" in r["reason"]
    # a sweep as the reference measures no offset either
    assert _gate({**base, "_kind": "sweep"}, cand, s2s=None)["verdict"] == "cannot judge"
    # saved from three sweeps 3 % apart: the offset is measured and in each row's variance
    hist = [{"sweep": f"s{j}", "log_step_time": {"cell=0": math.log(2.0) + d, "cell=1": math.log(2.0) + d}}
            for j, d in enumerate((0.0, 0.03, -0.03))]
    s2s = sweep_to_sweep(hist)
    assert s2s["sd_log"] == pytest.approx(0.03) and s2s["df"] == 2  # one offset per sweep: saves - 1
    g = _gate(base, cand, s2s=s2s)
    for r, c in zip(g["rows"], range(2)):
        xb = np.log([x["samples"]["step_time"][0] for x in base["cells"][c]["repeats"]])
        xc = np.log([x["samples"]["step_time"][0] for x in cand["cells"][c]["repeats"]])
        vo = 0.03 ** 2 - np.var(xb, ddof=1) / 6
        assert r["sweep_offset_sd"] == pytest.approx(math.sqrt(vo))
        assert r["se"] ** 2 == pytest.approx(np.var(xb, ddof=1) / 6 + np.var(xc, ddof=1) / 6 + 2 * vo)
        assert r["verdict"] != "cannot judge" or "offset" not in r["reason"].split(";")[0]


def test_one_failed_candidate_run_is_missing_data_not_a_regression():
    rng = np.random.default_rng(5)
    base = _snap([_cell(i, list(2.0 * np.exp(rng.normal(0, 0.01, 6)))) for i in range(2)])
    cand = _snap([_cell(0, list(2.0 * np.exp(rng.normal(0, 0.01, 5))), failed={5: "oom"}),
                  _cell(1, list(2.0 * np.exp(rng.normal(0, 0.01, 6))))])
    g = _gate(base, cand)
    row = g["rows"][0]
    assert row["verdict"] == "unchanged" and row["n_cand"] == 5 and g["verdict"] == "pass"
    assert "missing data: 1 failed candidate run(s) left out, compared on 5 ok runs" in row["reason"]
    # one ok run left: cannot judge; 2 or more runs, half of them or more, failed: the candidate does not run
    # where the baseline did (the interleaved gate's rule)
    one = _snap([_cell(0, [2.0], failed={1: "oom"}), _cell(1, [2.0, 2.01])])
    assert _gate(base, one)["rows"][0]["verdict"] == "cannot judge"
    half = _snap([_cell(0, [2.0, 2.01], failed={2: "oom", 3: "timeout"}), _cell(1, [2.0, 2.01])])
    assert _gate(base, half)["rows"][0]["verdict"] == "failed" and _gate(base, half)["verdict"] == "regression"


def test_claims_are_judged_on_runs_by_the_report_function(tmp_path):
    """Two runs per cell of 30 steps each, the runs 10 % apart: pooled over steps the claim "dynamic_bsz lowers
    step time by at least 10 %" looks decisively not met (the old gate: exit 1), on runs its interval holds 10 %:
    cannot judge (exit 3). The report says the same of the same sweep."""
    from bench.commands.report import build
    from bench.gate.stored import run_gate

    expect = [{"factor": "dynamic_bsz", "at_least": 0.10}]
    sweep = make_sweep(tmp_path, "few", [{}, {"dynamic_bsz": 1}], repeats=2, steps=32, seed=9, expect=expect,
                       times=log_normal_times(effects={"dynamic_bsz": -0.05}, sd=0.01, run_sd=0.1))
    res = run_gate(baseline_ref=None, candidate_ref="few", results=tmp_path, tracking_uri=None,
                   metrics=["step_time"], threshold=THR, alpha=0.05, n_boot=0)
    (claim,) = res["expectations"]
    assert claim["result"] == "cannot judge" and res["exit_code"] == 3, claim
    assert claim["unit"] == "run" and claim["runs"] == [2, 2]
    assert claim["improvement_ci"][0] < 0.10 < claim["improvement_ci"][1]
    assert res["settings"]["family"]["m"] == 1
    rep = build(sweep, tmp_path, alpha=0.05)["expectations"]
    keys = ("result", "improvement", "improvement_ci", "p_value", "reason")
    assert [{k: e[k] for k in keys} for e in rep] == [{k: claim[k] for k in keys}]
    assert json.loads((sweep / "gate" / "gate.json").read_text())["expectations"][0]["result"] == "cannot judge"


def test_saved_thrice_the_gate_decides_and_records_what_it_declared(tmp_path):
    """Through ``baseline save`` and the gate: saved from one sweep an identical candidate cannot be judged (exit
    3); saved from two the offset is measured on 1 degree of freedom (saves - 1), which no run count makes up for:
    still cannot judge, and the row says to save more sweeps; saved from a third (2 df) the offset is in the
    interval and the gate passes; gate.json records the declared probe decision and the family."""
    from bench.gate.baseline import save
    from bench.gate.stored import run_gate

    cells = [{}, {"dynamic_bsz": 1}]
    for i in range(3):
        make_sweep(tmp_path, f"s{i}", cells, repeats=4, steps=6, times=log_normal_times(sd=0.01), seed=60 + i)
    make_sweep(tmp_path, "cand", cells, repeats=4, steps=6, times=log_normal_times(sd=0.01), seed=70)

    def gate() -> dict:
        return run_gate(baseline_ref="b", candidate_ref="cand", results=tmp_path, tracking_uri=None,
                        metrics=["step_time"], threshold=THR, alpha=0.05, n_boot=0)

    save("s0", "b", tmp_path, None, alpha=0.05)
    g = gate()
    assert g["exit_code"] == 3 and {r["verdict"] for r in g["rows"]} == {"cannot judge"}
    save("s1", "b", tmp_path, None, force=True, alpha=0.05)
    g = gate()
    assert g["exit_code"] == 3 and {r["verdict"] for r in g["rows"]} == {"noisy"}, g["rows"]
    assert all(r["df"] <= 1 and "save the baseline from more sweeps" in r["reason"] for r in g["rows"])
    save("s2", "b", tmp_path, None, force=True, alpha=0.05)
    g = gate()
    assert g["exit_code"] == 0 and {r["verdict"] for r in g["rows"]} == {"unchanged"}, g["rows"]
    assert all(r["sweep_offset_sd"] is not None for r in g["rows"])
    s = json.loads(next((tmp_path / "cand").glob("*/gate/gate.json")).read_text())["settings"]
    assert s["family"]["m"] == 2 and s["family"]["alpha_each"] == pytest.approx(0.025)
    assert "Bonferroni" in s["family"]["method"] and "alone" in s["normalization"]["step_time"]["decided_from"]


def test_the_report_judges_the_expect_block_as_one_family(tmp_path):
    """Two claims in the matrix's expect block: the report judges each at alpha / 2 (Bonferroni, m fixed by the
    matrix), so its intervals are those of ``claims_on_runs`` at alpha / 2, wider than at alpha; report.md says so."""
    from bench.commands.report import build, write
    from bench.gate.verdicts import check_expectations, validate_expect
    from bench.records.speed import normalize_snapshot
    from bench.report.tables import claims_on_runs

    expect = [{"factor": "dynamic_bsz", "at_least": 0.02}, {"factor": "dynamic_bsz", "at_most": 0.50}]
    sweep = make_sweep(tmp_path, "two", [{}, {"dynamic_bsz": 1}], repeats=3, steps=8, seed=4, expect=expect,
                       times=log_normal_times(effects={"dynamic_bsz": -0.10}, sd=0.02, run_sd=0.03))
    data = build(sweep, tmp_path, alpha=0.05)
    fam = data["expectations_family"]
    assert (fam["m"], fam["per_claim_alpha"]) == (2, 0.025)
    assert [e["alpha"] for e in data["expectations"]] == [0.025, 0.025]
    from bench.records.snapshot import snapshot

    snap = snapshot(sweep)
    normalize_snapshot(snap)
    found = check_expectations(snap, validate_expect(expect), alpha=0.05, n_boot=0, normalize=False)
    wide, narrow = claims_on_runs(snap, found, 0.025), claims_on_runs(snap, found, 0.05)
    for got, w, n in zip(data["expectations"], wide, narrow):
        assert got["improvement_ci"] == w["improvement_ci"]
        assert w["improvement_ci"][0] < n["improvement_ci"][0] and n["improvement_ci"][1] < w["improvement_ci"][1]
    write(data, sweep / "report")
    assert "each judged at alpha / 2 = 0.025" in (sweep / "report" / "report.md").read_text()
