"""Sequential stopping (issue 17): the O'Brien-Fleming boundaries, the decision rule, its error rate under the
null over all looks (seeded simulation of the run-level model), and the sweep's block loop with a stop rule
(stops early on a clear effect, records its looks in sweep.json, resumes in the middle and stops where an
uninterrupted sweep would)."""

from __future__ import annotations

import gc
import json
import math
from pathlib import Path

import numpy as np
import pytest
from drift_fake import DriftExecutor
from test_run_order import small_full

from bench.cli import main
from bench.planning.sequential import EffectsStopRule, Look, critical_value, decide, obf_boundaries, obf_spending


@pytest.fixture(scope="module", autouse=True)
def _frozen_heap():
    """statsmodels' Holm adjustment calls ``gc.collect()`` on every fit; with the heap frozen (as in
    test_drift) 2000 looks take seconds."""
    gc.freeze()
    yield
    gc.unfreeze()


def test_obf_boundaries_spend_alpha_over_the_looks():
    c = obf_boundaries(0.05, 5)
    assert len(c) == 5 and all(a > b for a, b in zip(c, c[1:]))  # O'Brien-Fleming: strict early, near 1.96 late
    assert c[0] == pytest.approx(1.959964 / math.sqrt(0.2), rel=1e-6)  # look 1 spends alpha(0.2) alone
    assert 1.96 < c[-1] < 2.1
    assert obf_boundaries(0.05, 1) == pytest.approx((1.959964,), rel=1e-5)
    # Monte Carlo of the Brownian motion: the chance of crossing at any look is alpha
    rng = np.random.default_rng(0)
    z = rng.normal(size=(200_000, 5)).cumsum(1) / np.sqrt(np.arange(1, 6))
    assert (np.abs(z) >= np.array(c)).any(1).mean() == pytest.approx(0.05, abs=0.003)
    assert obf_spending(1.0, 0.05) == pytest.approx(0.05)


def test_a_final_look_before_the_plan_ends_spends_the_alpha_left():
    """The budget ends a 5-look plan at look 3: looks 1-2 keep their boundaries, look 3 spends the rest, and the
    chance of crossing any of the three (Brownian motion at t = 1/5, 2/5, 3/5) is alpha (Lan & DeMets 1983)."""
    plan, cut = obf_boundaries(0.05, 5), obf_boundaries(0.05, 5, final_look=3)
    assert len(cut) == 3 and cut[:2] == plan[:2] and cut[2] < plan[2]
    assert obf_boundaries(0.05, 5, final_look=5) == plan
    rng = np.random.default_rng(1)
    z = rng.normal(size=(200_000, 3)).cumsum(1) / np.sqrt(np.arange(1, 4))  # Z at t = k / 5 (scale-free)
    assert (np.abs(z) >= np.array(cut)).any(1).mean() == pytest.approx(0.05, abs=0.003)
    assert (np.abs(z) >= np.array(plan[:3])).any(1).mean() < 0.03  # without it: alpha left unspent
    assert critical_value(8, alpha=0.05, look=3, max_looks=5, final=True) < critical_value(8, alpha=0.05, look=3,
                                                                                            max_looks=5)
    d = decide(0.05, 0.02, 8, threshold=0.05, alpha=0.05, look=3, max_looks=5, final=True)
    assert d.final and not decide(0.05, 0.02, 8, threshold=0.05, alpha=0.05, look=5, max_looks=5, final=True).final
    with pytest.raises(ValueError, match="final_look 6 not in 1..5"):
        obf_boundaries(0.05, 5, final_look=6)


def test_decision_rule_reads_the_interval():
    kw = dict(threshold=0.05, alpha=0.05, look=3, max_looks=3)
    assert decide(0.10, 0.01, 10, **kw).verdict == "slower" and decide(0.10, 0.01, 10, **kw).matters is True
    assert decide(-0.10, 0.01, 10, **kw).verdict == "faster"
    assert decide(0.0, 0.01, 10, **kw).verdict == "no_change"
    assert decide(0.03, 0.02, 10, **kw).verdict == "undecided"  # straddles 0 and reaches past +5 %
    assert decide(0.03, 0.005, 10, **kw).matters is False  # slower, but all of it within the threshold
    assert decide(0.3, 0.01, 0, **kw).verdict == "undecided"  # no residual degree of freedom: no interval
    # early looks are stricter than the last one
    assert critical_value(10, alpha=0.05, look=1, max_looks=5) > critical_value(10, alpha=0.05, look=5, max_looks=5)


def _records(rng, looks, effect=0.0, run_sd=0.03, cells=((0, 0), (1, 0), (0, 1), (1, 1)), drift=0.05):
    """Run records of ``looks`` blocks of a 2x2 design: log run value = effect x dynamic_bsz + block drift + noise."""
    out = []
    for k in range(looks):
        for a, b in cells:
            v = math.exp(effect * b + drift * k + rng.normal(0, run_sd))
            out.append({"status": "ok", "repeat": k, "levels": {"rmsnorm_fused": a, "dynamic_bsz": b},
                        "summary": {"step_time_samples_s": [v]}})
    return out


def test_stop_rule_false_effect_rate_under_the_null_is_at_most_alpha():
    """400 seeded sequential sweeps (up to 6 blocks of the 2x2 design, both effects 0, block drift): a sweep that
    ever calls an effect slower or faster counts as a false effect; the rate stays at alpha = 0.05 or below
    (binomial 99 % margin: 0.05 + 2.6 x sqrt(0.05 x 0.95 / 400) = 0.078)."""
    rule = EffectsStopRule(6, threshold=0.05, alpha=0.05)
    false, decided_no_change, runs = 0, 0, []
    for seed in range(400):
        rng = np.random.default_rng(seed)
        recs = _records(rng, 6)
        for look in range(1, 7):
            lk = rule.after_block(recs[: 4 * look], look)
            if lk.stop:
                break
        verdicts = {d.verdict for d in lk.decisions}
        false += bool(verdicts & {"slower", "faster"})
        decided_no_change += verdicts == {"no_change"}
        runs.append(lk.runs)
    assert false / 400 <= 0.078, false
    assert decided_no_change > 200  # 3 % run noise decides "no effect beyond 5 %" in most sweeps
    assert np.mean(runs) < 24  # and it stops before the planned 6 blocks on average


def test_expect_claims_on_step_time_are_decided_too():
    """A claim that dynamic_bsz improves step time by at least 5 % is not met when it makes steps 35 % slower; a
    claim that rmsnorm_fused changes it by at most +-10 % is met; alpha is shared by the 2 mains and 2 claims."""
    claims = [{"factor": "dynamic_bsz", "at_least": 0.05, "name": "dbsz helps"},
              {"factor": "rmsnorm_fused", "at_least": -0.10, "at_most": 0.10},
              {"factor": "dynamic_bsz", "metric": "free_ratio", "at_least": 0.1}]  # not a step-time claim: left out
    rule = EffectsStopRule(6, claims=claims)
    lk = rule.after_block(_records(np.random.default_rng(2), 5, effect=0.3, run_sd=0.01), 5)
    got = {d.name: d for d in lk.decisions}
    assert set(got) == {"dynamic_bsz", "rmsnorm_fused", "expect: dbsz helps", "expect: rmsnorm_fused vs all_off"}
    assert got["expect: dbsz helps"].verdict == "not_met" and got["expect: dbsz helps"].change > 0.3
    assert got["expect: rmsnorm_fused vs all_off"].verdict == "met"
    assert all(d.alpha == pytest.approx(0.05 / 4) for d in lk.decisions) and lk.stop


def test_look_round_trips_through_json():
    rule = EffectsStopRule(4)
    lk = rule.after_block(_records(np.random.default_rng(1), 3, effect=0.3), 3)
    back = Look.from_dict(json.loads(json.dumps(lk.to_dict())))
    assert back.to_dict() == lk.to_dict()
    assert [d.verdict for d in back.decisions if d.name == "dynamic_bsz"] == ["slower"]
    assert "dynamic_bsz: slower" in lk.line


def test_sequential_sweep_stops_early_and_resumes_in_the_middle(tmp_path, monkeypatch, capsys):
    """``--sequential`` on the drifting fake machine with a 40 % slowdown of dynamic_bsz and no rmsnorm_fused
    effect: killed after 6 runs (block 2 unfinished), the rerun resumes, recomputes the looks from the records
    and stops at the same block as an uninterrupted sweep of the same seed; the unplanned blocks never run."""
    path = small_full(tmp_path, repeats=6)
    model = dict(effects={"dynamic_bsz": math.log(1.4)}, run_sd=0.005, step_sd=0.005, drift=0.02)

    def sweep(name, stop_after=None):
        fake = DriftExecutor(24, seed=3, stop_after=stop_after, **model)
        monkeypatch.setattr("bench.commands.run.make_executor", lambda *a, **k: fake)
        uri = f"sqlite:///{(tmp_path / (name + '.db')).as_posix()}"
        return main(["run", str(path), "--sequential", "--order-seed", "2", "--results", str(tmp_path / name),
                     "--tracking-uri", uri]), fake

    rc, whole = sweep("whole")
    assert rc == 0
    meta = json.loads(next((tmp_path / "whole" / "full").glob("2*/sweep.json")).read_text())
    seq = meta["sequential"]
    stopped = seq["stopped_after"]
    assert 2 <= stopped < 6 and len(whole.calls) == 4 * stopped  # stopped before the planned 6 blocks
    last = seq["looks"][-1]
    assert {d["name"]: d["verdict"] for d in last["decisions"]}["dynamic_bsz"] == "slower"
    assert meta["status"] == "complete" and seq["max_looks"] == 6 and "O'Brien-Fleming" in seq["method"]
    capsys.readouterr()

    rc, _ = sweep("cut", stop_after=6)  # the harness is interrupted before the 7th run
    assert rc == 130
    rc, resumed = sweep("cut")
    assert rc == 0
    out = capsys.readouterr().out
    meta2 = json.loads(next((tmp_path / "cut" / "full").glob("2*/sweep.json")).read_text())
    assert meta2["sequential"]["stopped_after"] == stopped
    assert len(resumed.calls) == 4 * stopped - 6  # block 1 and 2 runs of block 2 cached; the rest ran
    assert [lk["look"] for lk in meta2["sequential"]["looks"]] == list(range(1, stopped + 1))
    # look 1 is recomputed from block 1's runs only (the same runs as the uninterrupted sweep's), not from the two
    # runs of block 2 the interruption left on disk
    assert meta2["sequential"]["looks"][0] == seq["looks"][0] and seq["looks"][0]["runs"] == 4
    assert f"look {stopped}/6" in out and "stop: every comparison decided" in out
    summary = next((tmp_path / "cut" / "full").glob("2*/summary.md")).read_text()
    assert "sequential stopping" in summary



def test_an_interrupted_sweep_whose_launches_changed_since_is_not_resumed(tmp_path, monkeypatch, capsys):
    """Interrupted after 3 runs, then rerun with the same matrix by a harness whose launches differ (here: every
    cell id salted, as a changed patch list of an engine does): the old sweep is left as it was, a warning says why,
    and a new sweep runs all its runs (no KeyError on the old order's cell ids)."""
    import bench.spec.plan as plan_mod

    path = small_full(tmp_path, repeats=2)
    uri = f"sqlite:///{(tmp_path / 'm.db').as_posix()}"
    args = ["run", str(path), "--order-seed", "2", "--results", str(tmp_path / "res"), "--tracking-uri", uri]
    fake = DriftExecutor(8, seed=1, stop_after=3)
    monkeypatch.setattr("bench.commands.run.make_executor", lambda *a, **k: fake)
    assert main(args) == 130
    (old,) = list((tmp_path / "res" / "full").glob("2*"))
    before = sorted(p.name for p in old.rglob("record.json"))
    original = plan_mod.cell_id_of
    monkeypatch.setattr(plan_mod, "cell_id_of", lambda *a: original(*a)[::-1])
    fake2 = DriftExecutor(8, seed=1)
    monkeypatch.setattr("bench.commands.run.make_executor", lambda *a, **k: fake2)
    capsys.readouterr()
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "launches differ from this harness's" in out and "that sweep is not resumed" in out
    assert len(fake2.calls) == 8
    sweeps = sorted((tmp_path / "res" / "full").glob("2*"))
    assert len(sweeps) == 2 and sorted(p.name for p in old.rglob("record.json")) == before

def test_fixed_sweep_console_says_what_is_decided_and_what_stays_undecided(tmp_path, monkeypatch, capsys):
    """A fixed design (no --sequential) ends with its verdicts, decided once with the same rule: a 40 % slowdown of
    dynamic_bsz is "slower"; rmsnorm_fused (no effect, 6 % run noise, 3 blocks) stays undecided, and the console
    says how many more blocks would likely decide it and how to plan them."""
    path = small_full(tmp_path, repeats=3)
    fake = DriftExecutor(12, seed=4, effects={"dynamic_bsz": math.log(1.4)}, run_sd=0.06, step_sd=0.005, drift=0.0)
    monkeypatch.setattr("bench.commands.run.make_executor", lambda *a, **k: fake)
    uri = f"sqlite:///{(tmp_path / 'm.db').as_posix()}"
    rc = main(["run", str(path), "--order-seed", "2", "--results", str(tmp_path / "res"), "--tracking-uri", uri])
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 0 and len(fake.calls) == 12
    assert "verdicts of this fixed design (decided once at its end" in out
    assert "dynamic_bsz: slower, beyond the threshold" in out
    assert "Undecided: rmsnorm_fused (about" in out and "--precision P" in out
    meta = json.loads(next((tmp_path / "res" / "full").glob("2*/sweep.json")).read_text())
    assert "sequential" not in meta  # a fixed design stays one: nothing of a stop rule is recorded


@pytest.mark.slow
def test_real_embedded_sequential_sweep_resumes_in_the_middle(tmp_path):
    """The user's path: ``run_bench.py smoke.yaml --sequential`` (real embedded GRPO runs, 2 cells x up to 3 blocks),
    the harness killed (SIGKILL) once block 1 has finished, the same command again: the finished runs are kept,
    every look is recomputed from the records (look 1 again, then 2 and 3), and the sweep closes complete."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    root = Path(__file__).resolve().parents[2]
    m = yaml.safe_load((root / "matrix" / "smoke.yaml").read_text())
    m["base"].update(steps=4, profile_steps=[4])
    m["repeats"] = 3
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(m, sort_keys=False))
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    cmd = [sys.executable, str(root / "run_bench.py"), str(path), "--sequential", "--order-seed", "3",
           "--results", "res", "--tracking-uri", uri]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 900
        while time.time() < deadline:
            metas = [json.loads(p.read_text()) for p in (tmp_path / "res" / "smoke").glob("2*/sweep.json")]
            if metas and (metas[0].get("sequential") or {}).get("looks"):
                break  # look 1 written: block 1 finished
            assert proc.poll() is None, "harness ended before block 1 finished"
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = len(list((tmp_path / "res").glob("smoke/2*/*/r*/record.json")))
    assert 2 <= before < 6
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stdout + p.stderr
    meta = json.loads(next((tmp_path / "res" / "smoke").glob("2*/sweep.json")).read_text())
    seq = meta["sequential"]
    assert [lk["look"] for lk in seq["looks"]] == list(range(1, len(seq["looks"]) + 1))
    assert seq["stopped_after"] == len(seq["looks"]) and meta["status"] == "complete"
    assert "look 1/3" in p.stdout and f"cached {before}" in p.stdout
    records = [json.loads(r.read_text()) for r in (tmp_path / "res").glob("smoke/2*/*/r*/record.json")]
    assert len(records) == 2 * seq["stopped_after"] and all(r["status"] == "ok" for r in records)
    assert all(r["timing"]["startup_s"] > 0 and r["timing"]["steps_s"] > 0 for r in records)
