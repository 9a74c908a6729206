"""The interleaved gate's order and its run-level, block-paired comparison (bench.gate.runs), the speed
probe check and the one noise figure (bench.stats.power.gate_mde). The end-to-end runs with two real code
versions are in tests/gate/test_gate_interleaved_e2e.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.gate.runs import block_pairs, paired_comparison, probe_check
from bench.records.results import run_dir
from bench.records.speed import PROBE_METRIC
from bench.spec.plan import RunSpec, interleaved_order
from bench.stats.power import blocks_needed, gate_mde


def _rec(cell: str, block: int, version: str, steps: list[float], probes: list[float] | None = None,
         status: str = "ok") -> dict:
    timed = list(range(2, 2 + len(steps)))
    rec = {"cell_id": cell, "repeat": block, "code_version": version, "status": status, "label": f"L{cell}",
           "summary": {"timed_steps": timed, "step_time_samples_s": steps},
           "steps": {str(s): {"timing_s/step": x} for s, x in zip(timed, steps)}}
    if probes is not None:
        for s, p in zip(timed, probes):
            rec["steps"][str(s)][PROBE_METRIC] = p
    return rec


def _sweep(slowdown: float, *, blocks: int, sd_run: float, sd_block: float = 0.1, seed: int = 0, probe: str = "none",
           cells: tuple[str, ...] = ("aaaaaaaaaaaa",)) -> list[dict]:
    """Records of an interleaved sweep: log run value = block drift + run noise (+ log(1+slowdown) for the
    candidate). ``probe``: none | tracks (the probe moves with each run's own machine-speed shift) | random."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(blocks):
        drift = rng.normal(0, sd_block)
        for c in cells:
            for v in ("baseline", "candidate"):
                speed = rng.normal(0, sd_run)  # this run's machine-speed shift
                base = 0.5 * math.exp(drift + speed + (math.log1p(slowdown) if v == "candidate" else 0.0))
                steps = list(base * np.exp(rng.normal(0, 0.01, 5)))
                probes = None
                if probe == "tracks":
                    probes = list(0.03 * math.exp(drift + speed) * np.exp(rng.normal(0, 0.005, 5)))
                elif probe == "random":
                    probes = list(0.03 * math.exp(rng.normal(0, sd_run)) * np.exp(rng.normal(0, 0.005, 5)))
                out.append(_rec(c, k, v, steps, probes))
    return out


def test_interleaved_order_holds_both_versions_of_every_cell_in_every_block():
    cells = ["c1", "c2", "c3"]
    o = interleaved_order(cells, ["baseline", "candidate"], 4, seed=7)
    assert o.kind == "blocked" and o.versions == ["baseline", "candidate"] and len(o.runs) == 24
    for k in range(4):
        block = o.runs[6 * k:6 * (k + 1)]
        assert {r[1] for r in block} == {k}
        assert sorted((r[0], r[2]) for r in block) == sorted((c, v) for c in cells for v in ("baseline", "candidate"))
    # random order within blocks, reproducible from the seed
    assert o == interleaved_order(cells, ["baseline", "candidate"], 4, seed=7)
    orders = {tuple((r[0], r[2]) for r in o.runs[6 * k:6 * (k + 1)]) for k in range(4)}
    assert len(orders) > 1


def test_version_is_a_run_attribute_not_part_of_the_cell_id(tmp_path):
    from bench.spec.loading import load_matrix
    from bench.spec.plan import make_plan

    (tmp_path / "m.yaml").write_text("name: m\nengine: embedded\nplatform: cpu\nbase: {steps: 2, warmup_steps: 1}\n"
                                     "factors: {dynamic_bsz: [off, on]}\nrepeats: 1\n")
    plan = make_plan(load_matrix(tmp_path / "m.yaml"))
    spec = plan.runs[0]
    other = spec.model_copy(update={"code_version": "baseline"})
    assert isinstance(other, RunSpec) and other.cell_id == spec.cell_id
    assert run_dir(tmp_path, spec.cell_id, 3, "baseline") == tmp_path / spec.cell_id / "r3-baseline"
    assert run_dir(tmp_path, spec.cell_id, 3, "candidate") == run_dir(tmp_path, spec.cell_id, 3)


def test_ten_percent_slowdown_is_a_regression_and_unchanged_code_passes():
    slow = paired_comparison(_sweep(0.10, blocks=10, sd_run=0.02, seed=1), threshold=0.05, alpha=0.01)
    (row,) = slow["rows"]
    assert slow["verdict"] == "regression" and slow["exit_code"] == 1 and row["verdict"] == "regression"
    assert 0.06 < row["change"] < 0.14 and row["ci_low"] > 0 and row["p_value"] < 0.01
    same = paired_comparison(_sweep(0.0, blocks=10, sd_run=0.02, seed=2), threshold=0.05, alpha=0.01)
    assert same["verdict"] == "pass" and same["exit_code"] == 0 and same["rows"][0]["verdict"] == "unchanged"
    assert same["rows"][0]["mde"] <= 0.10


def test_block_drift_cancels_in_the_pairs():
    # whole blocks move by 30 % (a busy machine for a minute): the paired comparison still judges
    res = paired_comparison(_sweep(0.0, blocks=10, sd_run=0.02, sd_block=0.3, seed=3), threshold=0.05, alpha=0.01)
    assert res["verdict"] == "pass"


def test_noisy_cell_cannot_be_judged_and_says_how_many_blocks_would_do():
    res = paired_comparison(_sweep(0.0, blocks=3, sd_run=0.08, seed=4), threshold=0.05, alpha=0.01)
    (row,) = res["rows"]
    assert res["exit_code"] == 3 and row["verdict"] == "noisy"
    need = row["blocks_needed"]
    assert need is not None and need > 3 and f"{need} blocks would do" in row["reason"]
    # the promise: at the measured SD, that many blocks get the gate's figure under the limit, one fewer do not
    assert gate_mde(row["sd_pair"], need, alpha=0.01, threshold=0.05) <= 0.10
    assert gate_mde(row["sd_pair"], need - 1, alpha=0.01, threshold=0.05) > 0.10
    assert row["mde"] == gate_mde(row["sd_pair"], 3, alpha=0.01, threshold=0.05)


def test_gate_mde_and_blocks_needed():
    assert gate_mde(0.05, 1, alpha=0.01, threshold=0.05) is None
    a, b = gate_mde(0.05, 5, alpha=0.01, threshold=0.05), gate_mde(0.05, 20, alpha=0.01, threshold=0.05)
    assert a > b > 0.05  # more blocks see smaller changes, never below the threshold
    assert blocks_needed(0.05, alpha=0.01, threshold=0.05, max_mde=0.05) is None  # the threshold itself: never
    assert blocks_needed(0.0, alpha=0.01, threshold=0.05, max_mde=0.10) == 2


def test_probe_is_fitted_as_a_covariate_with_its_slope_estimated():
    """The probe enters as a covariate (CUPED / ANCOVA): where it tracks, its slope is about 1 and the corrected
    spread is smaller; the old tracking test survives as a description only."""
    tracks = _sweep(0.0, blocks=10, sd_run=0.08, seed=5, probe="tracks", cells=("c1", "c2"))
    chk = probe_check(block_pairs(tracks))
    assert chk["apply"] and chk["p"] < 0.05 and chk["sd_corrected"] < chk["sd_raw"]
    res = paired_comparison(tracks, threshold=0.05, alpha=0.01)
    assert all(r["normalized"] for r in res["rows"]) and "fitted as a covariate" in res["notes"][0]
    assert all(0.7 < r["probe_slope"] < 1.3 for r in res["rows"])
    raw = paired_comparison(tracks, threshold=0.05, alpha=0.01, normalize=False)
    assert all(a["sd_pair"] < 0.5 * b["sd_pair"] for a, b in zip(res["rows"], raw["rows"]))
    assert res["probe"]["check"]["apply"] and res["analysis"]["covariate"] == "speed_probe"


def test_a_probe_that_does_not_track_gets_a_slope_near_zero_not_a_data_driven_choice():
    rand = _sweep(0.10, blocks=10, sd_run=0.02, seed=6, probe="random", cells=("c1", "c2"))
    chk = probe_check(block_pairs(rand))
    assert not chk["apply"] and chk["r"] is not None
    res = paired_comparison(rand, threshold=0.05, alpha=0.01)
    assert all(r["normalized"] for r in res["rows"])  # declared: fitted whatever the data say
    for r in res["rows"]:
        assert abs(r["probe_slope"]) < 0.6  # the probe does not track: its slope is near 0 ...
        assert r["change"] == pytest.approx(r["raw_change"], abs=0.03)  # ... and the estimate stays the raw change
        assert r["df"] == r["blocks"] - 2  # it cost one degree of freedom


def test_one_failed_run_is_missing_data_a_candidate_failing_in_most_blocks_is_failed():
    recs = _sweep(0.0, blocks=4, sd_run=0.02, seed=7)
    recs[1]["status"], recs[1]["failure_kind"] = "failed", "crash"  # block 0 candidate
    row = paired_comparison(recs, threshold=0.05, alpha=0.01)["rows"][0]
    assert row["verdict"] != "failed" and row["blocks"] == 3 and "missing, not a regression" in row["reason"]
    recs = _sweep(0.0, blocks=4, sd_run=0.02, seed=7)
    recs[0]["status"], recs[0]["failure_kind"] = "failed", "crash"  # block 0 baseline
    res = paired_comparison(recs, threshold=0.05, alpha=0.01)
    assert res["rows"][0]["verdict"] != "failed" and res["rows"][0]["blocks"] == 3
    recs = _sweep(0.0, blocks=4, sd_run=0.02, seed=7)
    for i in (1, 3, 5):  # the candidate of blocks 0, 1, 2
        recs[i]["status"], recs[i]["failure_kind"] = "failed", "crash"
    res = paired_comparison(recs, threshold=0.05, alpha=0.01)
    assert res["rows"][0]["verdict"] == "failed" and res["exit_code"] == 1


def test_stored_baseline_measures_its_sweep_to_sweep_variance(tmp_path, capsys):
    """A stored baseline keeps the sweeps saved under its name and states their measured spread; the gate
    against it carries the note."""
    import json

    from _sweeps import EMBEDDED_CELLS, log_normal_times, make_sweep

    from bench.cli import main

    uri = f"sqlite:///{tmp_path / 'ml.db'}"
    save = ["baseline", "save", "synth", "--name", "base", "--results", str(tmp_path), "--tracking-uri", uri]
    make_sweep(tmp_path, "synth", EMBEDDED_CELLS, repeats=2, times=log_normal_times(sd=0.02), seed=1, sweep_id="s1")
    assert main(save) == 0
    first = json.loads((tmp_path / "baselines" / "base.json").read_text())
    assert first["sweep_to_sweep"]["sd_log"] is None and "unknown" in first["sweep_to_sweep"]["note"]
    # the machine 8 % slower in the second sweep: the baseline says how far its sweeps moved
    make_sweep(tmp_path, "synth", EMBEDDED_CELLS, repeats=2, times=log_normal_times(base_s=2.0 * 1.08, sd=0.02),
               seed=2, sweep_id="s2")
    assert main([*save, "--force"]) == 0
    data = json.loads((tmp_path / "baselines" / "base.json").read_text())
    s2s = data["sweep_to_sweep"]
    assert s2s["sweeps"] == 2 and len(data["history"]) == 2
    # two sweeps log(1.08) apart: SD of the pair = log(1.08) / sqrt(2) (+- the step noise)
    assert s2s["sd_log"] == pytest.approx(math.log(1.08) / math.sqrt(2), abs=0.02)
    assert "sweep-to-sweep SD" in capsys.readouterr().out
    make_sweep(tmp_path, "synth", EMBEDDED_CELLS, repeats=2, times=log_normal_times(sd=0.02), seed=3, sweep_id="s3")
    main(["gate", "--baseline", "base", "--candidate", "synth", "--results", str(tmp_path), "--tracking-uri", uri,
          "--bootstrap", "200"])
    gate = json.loads((tmp_path / "synth" / "latest" / "gate" / "gate.json").read_text())
    assert gate["baseline"]["sweep_to_sweep"]["sd_log"] == pytest.approx(s2s["sd_log"])
    assert any("sweep-to-sweep SD" in n for n in gate["notes"])


def test_stop_rule_stops_once_every_cell_is_decided_or_the_budget_ends():
    from bench.gate.interleaved import GateStopRule

    rule = GateStopRule(threshold=0.05, alpha=0.01, max_mde=None, normalize=True, max_blocks=12)
    clear = _sweep(0.30, blocks=8, sd_run=0.01, seed=8)
    look = rule.after_block(clear, 8)
    assert look.stop and "regression" in look.line and look.to_dict()["decisions"][0]["verdict"] == "slower"
    assert look.decisions[0].lo > 0  # the repeated confidence interval at look 8 of 12 (O'Brien-Fleming)
    # the same data at look 3: the early looks' intervals are wide (little alpha spent): no stop yet
    assert not rule.after_block(_sweep(0.30, blocks=3, sd_run=0.01, seed=8), 3).stop
    assert not rule.after_block(_sweep(0.30, blocks=2, sd_run=0.01, seed=8), 2).stop  # never before 3 blocks
    noisy = _sweep(0.0, blocks=4, sd_run=0.2, seed=9)
    assert not rule.after_block(noisy, 4).stop
    assert rule.after_block(_sweep(0.0, blocks=12, sd_run=0.2, seed=9), 12).stop  # the budget ends


def test_a_look_where_the_budget_ends_the_gate_spends_the_alpha_left():
    """A budget that ends the sweep at look 8 of 14 makes look 8 the final analysis: its interval is the one of
    the remaining alpha (narrower than look 8's in the 14-look plan), the decision says ``final``, and a gate
    that the plan's look-8 interval could not decide is decided."""
    from bench.gate.interleaved import GateStopRule

    now = [0.0]
    recs = _sweep(0.08, blocks=8, sd_run=0.04, sd_block=0.05, seed=2)
    plain = GateStopRule(threshold=0.05, alpha=0.01, max_mde=None, normalize=True, max_blocks=14)
    mid = plain.after_block(recs, 8)  # no budget: an ordinary look 8 of 14
    assert not mid.stop and mid.decisions[0].verdict == "undecided" and not mid.decisions[0].final
    rule = GateStopRule(threshold=0.05, alpha=0.01, max_mde=None, normalize=True, max_blocks=14, budget_s=80,
                        clock=lambda: now[0])
    for k in range(1, 8):  # blocks of 10 s: after look 8 (80 s) another block would end past the budget
        now[0] = 10.0 * k
        assert not rule.after_block(_sweep(0.08, blocks=k, sd_run=0.04, sd_block=0.05, seed=2), k).stop
    now[0] = 80.0
    last = rule.after_block(recs, 8)
    d, d0 = last.decisions[0], mid.decisions[0]
    assert last.stop and rule.final_look == 8 and d.final and "final look" in last.reason
    assert d.estimate == pytest.approx(d0.estimate) and (d.hi - d.lo) < 0.75 * (d0.hi - d0.lo)
    assert d.verdict == "slower" and "regression" in last.line


def test_bad_interleave_inputs_are_one_line_errors(tmp_path, capsys):
    from bench.cli import main

    (tmp_path / "m.yaml").write_text("name: m\nengine: embedded\nplatform: cpu\nbase: {steps: 2, warmup_steps: 1}\n"
                                     "factors: {dynamic_bsz: [on]}\nrepeats: 2\n")
    common = ["--results", str(tmp_path / "r"), "--tracking-uri", f"sqlite:///{tmp_path / 'ml.db'}"]
    assert main(["gate", "--interleave", "no-such-rev-xyz", "--matrix", str(tmp_path / "m.yaml"), *common]) == 2
    err = capsys.readouterr().err
    assert "--interleave no-such-rev-xyz: neither a harness checkout folder nor a git revision" in err
    assert main(["gate", "--interleave", "HEAD", *common]) == 2
    assert "give --matrix" in capsys.readouterr().err
    assert main(["gate", "--interleave", "HEAD", "--matrix", str(tmp_path / "m.yaml"), "--blocks", "1", *common]) == 2
    assert "2 or more blocks" in capsys.readouterr().err
    m = str(tmp_path / "m.yaml")
    assert main(["gate", "--interleave", "HEAD", "--matrix", m, "--budget", "soon", *common]) == 2
    assert "--budget 'soon': not a duration" in capsys.readouterr().err
    assert not (tmp_path / "r" / "m").exists()  # nothing half-written


def test_side_by_side_cpu_plan_is_a_crossover_balanced_in_every_pair_of_blocks():
    from bench.gate.side_by_side import cpu_plan

    firsts = set()
    for cell in ("c1", "c2", "c3"):
        for j in range(6):
            a, b = cpu_plan(11, cell, 2 * j, (0, 1)), cpu_plan(11, cell, 2 * j + 1, (0, 1))
            assert {a["baseline"], a["candidate"]} == {0, 1} == {b["baseline"], b["candidate"]}
            assert a["baseline"] == b["candidate"] and a["candidate"] == b["baseline"]  # swapped within the pair
            firsts.add(a["candidate"])
    assert firsts == {0, 1}  # which assignment comes first is drawn, not fixed
    assert cpu_plan(11, "c1", 4, (2, 5)) == cpu_plan(11, "c1", 4, (2, 5))


def _side_by_side(tmp_path, slowdown: float, cpu_slow: float, blocks: int = 12, seed: int = 3) -> list[dict]:
    """Records of a side-by-side sweep whose higher numbered CPU runs ``cpu_slow`` slower, with ``affinity.json``
    in each run's folder (as :class:`bench.gate.side_by_side.SideBySide` writes it)."""
    import json

    from bench.gate.side_by_side import AFFINITY_FILE, cpu_plan

    rng = np.random.default_rng(seed)
    out = []
    for k in range(blocks):
        drift, plan = rng.normal(0, 0.1), cpu_plan(seed, "c", k, (0, 1))
        for v in ("baseline", "candidate"):
            mu = drift + rng.normal(0, 0.01) + math.log1p(cpu_slow) * plan[v] + (math.log1p(slowdown) if
                                                                                 v == "candidate" else 0.0)
            rec = _rec("c", k, v, list(0.4 * math.exp(mu) * np.exp(rng.normal(0, 0.002, 5))))
            d = tmp_path / f"r{k}-{v}"
            d.mkdir()
            (d / AFFINITY_FILE).write_text(json.dumps({"cpus": [plan[v]], "alone": False}))
            rec["_dir"] = str(d)
            out.append(rec)
    return out


def test_side_by_side_comparison_removes_the_cpu_effect(tmp_path):
    from bench.gate.runs import cpu_term

    recs = _side_by_side(tmp_path, 0.10, cpu_slow=0.06)
    sides = [p[3] for p in block_pairs(recs)["c"]["pairs"]]
    assert sorted(set(sides)) == [-1, 1] and sides.count(1) == sides.count(-1)
    res = paired_comparison(recs, threshold=0.05, alpha=0.01)
    (row,) = res["rows"]
    assert row["cpu_effect"]["effect"] == pytest.approx(0.06, abs=0.01)
    assert row["change"] == pytest.approx(0.10, abs=0.02) and row["verdict"] == "regression"
    assert row["df"] == len(sides) - 2 and any("higher numbered CPU took +6" in n for n in res["notes"])
    # without the term the CPU effect is in the spread: the block ratios sit +-6 % apart
    raw = np.array([p[1] for p in block_pairs(recs)["c"]["pairs"]])
    assert np.std(raw, ddof=1) > 3 * row["sd_pair"]
    # not side by side (no affinity files), or one side only: no term
    d, eff = cpu_term(raw, np.zeros(len(raw)))
    assert eff is None and np.array_equal(d, raw)
    assert cpu_term(raw[:3], np.array([1.0, 1.0, -1.0]))[1] is None
