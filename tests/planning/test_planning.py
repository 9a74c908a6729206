"""The noise and cost model and the planner (issue 17): known components -> known allocation (Kalibera & Jones'
cost-optimal steps per run, the design's standard errors), the model's estimates recover the components of
seeded simulated sweeps, and the CLI's dry run prints the plan."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bench.planning.allocation import block_wall_s, design_factors, evaluate, plan_allocation, steps_range_for
from bench.planning.apply import target_key
from bench.planning.model import NoiseCost, estimate_model, kappa, kj_optimal_steps, step_components

FACTORS = ["rmsnorm_fused", "dynamic_bsz"]
CELLS = [{"rmsnorm_fused": a, "dynamic_bsz": b} for a in (0, 1) for b in (0, 1)]


def _model(**kw) -> NoiseCost:
    base = dict(sd_step=0.2, sd_run=0.02, sd_block=0.0, startup_s=4.0, step_s=3.0, warmup_step_s=2.7,
                profiled_step_s=4.0, harness_s=4.0)
    return NoiseCost(**{**base, **kw})


def test_design_standard_errors_of_known_designs():
    facs, df = design_factors(CELLS, FACTORS, 3)  # 2x2 x 3 blocks: se(effect) = 2 sigma / sqrt(12), 12 - 6 df
    assert facs == pytest.approx({"rmsnorm_fused": 2 / math.sqrt(12), "dynamic_bsz": 2 / math.sqrt(12)})
    assert df == 6
    keys = ["rmsnorm_fused", "dynamic_bsz", "graph_mode", "forward_prefetch"]
    oat = [{k: 0 for k in keys}] + [{k: int(k == f) for k in keys} for f in keys]  # one at a time, 5 cells
    facs, df = design_factors(oat, keys, 2)  # each effect = cell - reference: var 2 sigma^2 / R -> factor 1
    assert facs == pytest.approx({k: 1.0 for k in keys}) and df == 10 - 6


def test_known_components_give_the_kalibera_jones_allocation():
    """Steps per run near Kalibera & Jones' n* = sqrt(kappa sd_step^2 C / (sd_run^2 c)); dear start-up -> more steps
    per run; large run-to-run spread -> more repeats and fewer steps; the plan meets its goal at the least cost."""
    emb = _model()
    verl = _model(startup_s=80.0, step_s=1.0, warmup_step_s=15.0, profiled_step_s=2.4, harness_s=2.0)
    n_emb, n_verl = kj_optimal_steps(emb, 1, 1), kj_optimal_steps(verl, 2, 1)
    assert n_emb == pytest.approx(math.sqrt(math.pi / 2 * 0.04 * (4 + 4 + 2.7 + 4) / (0.0004 * 3)), rel=1e-9)
    assert n_verl == pytest.approx(math.sqrt(math.pi / 2 * 0.04 * (80 + 2 + 30 + 2.4) / 0.0004), rel=1e-9)
    a_emb, ok1 = plan_allocation(emb, CELLS, FACTORS, precision=0.05, warmup=1, profiled=1)
    a_verl, ok2 = plan_allocation(verl, CELLS, FACTORS, precision=0.05, warmup=2, profiled=1)
    assert ok1 and ok2
    assert 0.6 * n_emb <= a_emb.timed_steps <= 1.4 * n_emb, (a_emb, n_emb)
    assert a_verl.timed_steps > 2 * a_emb.timed_steps  # whole repeats move it off n*, the direction stays
    for m, w, n_star in ((emb, 1, n_emb), (verl, 2, n_verl)):  # n* minimizes cost x variance of one run
        best = min(range(3, 400), key=lambda n: m.run_cost(n, w, 1) * m.run_var(n))
        assert abs(best - n_star) <= 1
    assert a_emb.half_width <= math.log1p(0.05) and a_verl.half_width <= math.log1p(0.05)
    noisy_runs = _model(sd_run=0.08)
    a_noisy, _ = plan_allocation(noisy_runs, CELLS, FACTORS, precision=0.05, warmup=1, profiled=1)
    assert a_noisy.repeats > a_emb.repeats and a_noisy.timed_steps < a_emb.timed_steps
    # least cost: no other point of the grid reaches the target for less
    for r in range(2, 12):
        for n in range(2, 200, 7):
            e = evaluate(emb, CELLS, FACTORS, n, r, alpha=0.05, warmup=1, profiled=1)
            if e is not None and e.half_width <= math.log1p(0.05):
                assert e.wall_s >= a_emb.wall_s - 1e-9
    # wall time = runs x (start-up + harness + warm-up + profiled + n timed steps)
    assert a_emb.wall_s == pytest.approx(a_emb.runs * (4 + 4 + 2.7 + 4 + 3 * a_emb.timed_steps))


def test_budget_buys_the_best_precision_within_it():
    m = _model()
    a, ok = plan_allocation(m, CELLS, FACTORS, budget_s=1200, warmup=1, profiled=1)
    assert ok and a.wall_s <= 1200
    b, _ = plan_allocation(m, CELLS, FACTORS, budget_s=2400, warmup=1, profiled=1)
    assert b.half_width < a.half_width
    tiny, ok = plan_allocation(m, CELLS, FACTORS, budget_s=10, warmup=1, profiled=1)
    assert not ok and tiny.repeats == 2 and tiny.timed_steps == 2  # the cheapest plan, flagged as not reaching it


def test_budget_with_parallel_nodes_counts_a_block_as_its_longest_node():
    """--parallel N: a block of C runs takes ceil(C / N) run times; the node is a blocking factor (one df for two
    nodes; with an even number of blocks the cyclic assignment leaves it orthogonal to the effects)."""
    m = _model()
    one = m.run_cost(10, 1, 1)
    assert block_wall_s(m, 4, 10, warmup=1, profiled=1) == pytest.approx(4 * one)
    assert block_wall_s(m, 4, 10, warmup=1, profiled=1, slots=2) == pytest.approx(2 * one)
    assert block_wall_s(m, 5, 10, warmup=1, profiled=1, slots=2) == pytest.approx(3 * one)
    f1, df1 = design_factors(CELLS, FACTORS, 4)
    f2, df2 = design_factors(CELLS, FACTORS, 4, slots=2)
    assert df2 == df1 - 1 and f2 == pytest.approx(f1)
    serial, ok1 = plan_allocation(m, CELLS, FACTORS, budget_s=1200, warmup=1, profiled=1)
    par, ok2 = plan_allocation(m, CELLS, FACTORS, budget_s=1200, warmup=1, profiled=1, slots=2)
    assert ok1 and ok2 and par.slots == 2 and par.wall_s <= 1200
    assert par.wall_s == pytest.approx(par.repeats * 2 * m.run_cost(par.timed_steps, 1, 1))
    assert par.runs > 1.5 * serial.runs and par.half_width < serial.half_width  # the same time buys more runs


def _sim_sweep(rng, sd_step, sd_run, sd_block, n, *, sd_stepidx=0.0, blocks=8, cells=("a", "b", "c", "d"),
               startup=30.0, step=2.0):
    """Run records of one simulated sweep: every run replays the same step pattern ``w`` (same batches)."""
    recs, t = [], 1000.0
    w = rng.normal(0, sd_stepidx, n + 2)  # shared by every run and cell of the sweep
    for k in range(blocks):
        beta = rng.normal(0, sd_block)
        for cid in cells:
            mu = math.log(step) + beta + rng.normal(0, sd_run) + (0.1 if cid == "b" else 0.0)
            steps = {str(i + 1): {"timing_s/step": float(math.exp(mu + w[i] + rng.normal(0, sd_step)))}
                     for i in range(n + 2)}
            timed = list(range(2, n + 2))
            wall = startup + sum(v["timing_s/step"] for v in steps.values())
            recs.append({"status": "ok", "cell_id": cid, "repeat": k, "levels": {}, "steps": steps, "started_at": t,
                         "wall_s": wall, "summary": {"timed_steps": timed, "measured_steps": list(range(2, n + 3)),
                                                     "profiled_steps": [n + 2],
                                                     "step_time_samples_s": [steps[str(s)]["timing_s/step"]
                                                                             for s in timed]}})
            t += wall + 5.0
    return recs


def test_model_recovers_known_components_from_simulated_sweeps():
    rng = np.random.default_rng(7)
    recs = _sim_sweep(rng, 0.10, 0.05, 0.04, 12)
    m = estimate_model([("sim", recs)])
    assert m.sd_step == pytest.approx(0.10, rel=0.15)
    assert m.sd_stepidx < 0.04
    assert m.sd_run == pytest.approx(0.05, abs=0.025)
    assert m.sd_block == pytest.approx(0.04, abs=0.03)
    assert m.startup_s == pytest.approx(30.0) and m.harness_s == pytest.approx(5.0)
    assert m.step_s == pytest.approx(2.0, rel=0.1) and m.runs == 32


def test_median_variance_with_a_step_pattern_shared_by_the_runs():
    """kappa(n, rho): the variance of the median of n steps N(w_s, sd^2), w shared by the runs, between runs, in
    units of sd^2 / n, checked by simulation (pi / 2 without a pattern, about sqrt(2) rho for a large one)."""
    assert kappa(2, 5.0) == 1.0 and kappa(9) == pytest.approx(math.pi / 2)
    assert kappa(9, 30.0) == pytest.approx(math.sqrt(2) * 30.0, rel=0.02)
    rng = np.random.default_rng(11)
    n, sd = 25, 0.05
    for rho in (0.0, 1.0, 4.0):
        var = np.mean([np.var(np.median(rng.normal(0, rho * sd, n) + rng.normal(0, sd, (300, n)), axis=1), ddof=1)
                       for _ in range(150)])  # a fresh pattern per sweep, 300 runs of it
        assert var == pytest.approx(kappa(n, rho) * sd ** 2 / n, rel=0.12), rho


def test_shared_step_pattern_is_not_noise_and_the_plan_stops_adding_steps():
    """Known components -> known allocation when every run replays the same batches: the estimate separates the
    shared step pattern (0.10) from the run x step noise (0.05) and keeps the run-to-run spread (0.03), so the
    plan's steps per run stay near Kalibera & Jones' n* of the true components. Taking the whole within-run
    spread as independent step noise with no run-to-run spread (sd_run = 0, what the previous model found on
    full.yaml's records) plans many more steps than help."""
    rng = np.random.default_rng(3)
    sweeps = [(f"s{i}", _sim_sweep(rng, 0.05, 0.03, 0.0, 16, sd_stepidx=0.10, blocks=6, startup=100.0, step=1.0))
              for i in range(3)]  # verl-like: dear start-up, cheap steps
    m = estimate_model(sweeps)
    true = NoiseCost(**{**m.to_dict(), "sd_step": 0.05, "sd_run": 0.03, "sd_stepidx": 0.10})
    assert m.sd_step == pytest.approx(0.05, rel=0.2) and m.sd_stepidx == pytest.approx(0.10, rel=0.35)
    assert m.sd_run == pytest.approx(0.03, abs=0.012)
    ss_i, df_i, ss_w, df_w = step_components([np.log(2.0) + rng.normal(0, 0.2, 16) + rng.normal(0, 0.05, (4, 16))])
    assert df_i == 3 * 15 and df_w == 15
    n_star = kj_optimal_steps(true, 1, 1)
    fixed = true.startup_s + true.harness_s + true.warmup_step_s + true.profiled_step_s
    assert n_star == pytest.approx(math.sqrt(kappa(3, 2.0) * 0.0025 * fixed / (0.0009 * true.step_s)), rel=1e-9)
    plan, ok = plan_allocation(m, CELLS, FACTORS, precision=0.03, warmup=1, profiled=1)
    assert ok and 0.5 * n_star <= plan.timed_steps <= 2 * n_star, (plan, n_star)
    naive = NoiseCost(**{**m.to_dict(), "sd_step": math.sqrt(0.05 ** 2 + 0.1 ** 2), "sd_run": 0.0, "sd_stepidx": 0.0})
    assert kj_optimal_steps(naive, 1, 1) == math.inf
    old, _ = plan_allocation(naive, CELLS, FACTORS, precision=0.03, warmup=1, profiled=1)
    assert old.timed_steps > 2 * plan.timed_steps


#: full.yaml's embedded target as measured in a quiet window (docs/lab-notes/planning.md): no run-to-run spread
#: beyond the steps', a step pattern shared by the runs three times the run x step noise, a step about 1/5 of a
#: run's fixed cost
QUIET_EMBEDDED = dict(sd_step=0.063, sd_run=0.0, sd_block=0.0, startup_s=2.0, step_s=1.64, warmup_step_s=1.81,
                      profiled_step_s=1.95, harness_s=2.57, sd_stepidx=0.186)


def test_steps_range_starts_at_the_matrix_s_own_timed_steps():
    assert steps_range_for(8) == (8, 200) and steps_range_for(1) == (2, 200) and steps_range_for(250) == (250, 250)


def test_runs_barely_differ_so_the_plan_buys_steps_not_runs():
    """Known components -> known allocation where runs barely differ (quiet embedded): more timed steps per run than
    the matrix's 8 and fewer runs; against the fixed design with the matrix's 8 steps that reaches the same
    half-width (the fewest repeats, same model) it needs at most half the runs and no more wall time."""
    m = NoiseCost(**QUIET_EMBEDDED)
    plan, ok = plan_allocation(m, CELLS, FACTORS, precision=0.025, warmup=1, profiled=1, steps_range=steps_range_for(8))
    assert ok and plan.timed_steps > 2 * 8 and plan.half_width <= math.log1p(0.025)
    fixed = next(e for r in range(2, 60)
                 if (e := evaluate(m, CELLS, FACTORS, 8, r, alpha=0.05, warmup=1, profiled=1)).half_width
                 <= math.log1p(0.025))
    assert plan.runs <= 0.5 * fixed.runs, (plan, fixed)
    assert plan.wall_s <= fixed.wall_s
    # the same components with a run-to-run spread (0.02 log SD): more runs pay again
    spread = NoiseCost(**{**QUIET_EMBEDDED, "sd_run": 0.02})
    more, _ = plan_allocation(spread, CELLS, FACTORS, precision=0.025, warmup=1, profiled=1,
                              steps_range=steps_range_for(8))
    assert more.repeats > plan.repeats and more.timed_steps < plan.timed_steps


def test_target_ignores_what_planning_changes():
    a = target_key("embedded", "cpu", {"steps": 10, "model": "x", "n": 4})
    assert a == target_key("embedded", "cpu", {"steps": 30, "model": "x", "n": 4})
    assert a != target_key("embedded", "cpu", {"steps": 10, "model": "x", "n": 8})


def test_cli_plans_from_a_finished_sweep_and_records_the_plan(tmp_path, monkeypatch, capsys):
    """A finished sweep of matrix/full.yaml (drifting fake machine) is the target's model; ``--precision`` on the
    dry run prints the plan, its predicted wall time and precision and why; ``--budget`` runs the planned sweep
    with sequential stopping and records the plan in sweep.json and on the MLflow parent."""
    from drift_fake import DriftExecutor
    from mlflow import MlflowClient
    from test_run_order import small_full

    from bench.cli import main

    path = small_full(tmp_path)
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    common = ["--results", str(tmp_path / "res"), "--tracking-uri", uri]
    fake = DriftExecutor(12, seed=5, probe=True, run_sd=0.02, step_sd=0.05)
    monkeypatch.setattr("bench.commands.run.make_executor", lambda *a, **k: fake)
    assert main(["run", str(path), "--order-seed", "1", *common]) == 0
    capsys.readouterr()
    assert main(["run", str(path), "--precision", "0.05", "--dry-run", *common]) == 0
    out = capsys.readouterr().out
    assert "goal: precision +-5.00%; reached" in out and "predicted wall time" in out
    assert "model from 12 run(s) of 1 finished sweep(s)" in out and "sequential stopping: after each of up to" in out
    ray = ["--ray-address", "http://127.0.0.1:9", "--parallel", "2"]  # a count: no cluster is asked on a dry run
    plans = {}
    for extra in ([], ray):
        assert main(["run", str(path), "--budget", "10m", "--dry-run", *extra, *common]) == 0
        out = capsys.readouterr().out
        plans[bool(extra)] = float(out.split("predicted precision: +-")[1].split("%")[0])
        assert ("with 2 runs of a block at once on distinct Ray nodes" in out) == bool(extra)
    assert plans[True] < 0.85 * plans[False]  # two nodes: the same 10 min buy more steps, a narrower interval
    fake2 = DriftExecutor(200, seed=6, probe=True, run_sd=0.02, step_sd=0.05)
    monkeypatch.setattr("bench.commands.run.make_executor", lambda *a, **k: fake2)
    assert main(["run", str(path), "--budget", "10m", "--order-seed", "2", *common]) in (0, 1)
    metas = [json.loads(p.read_text()) for p in (tmp_path / "res" / "full").glob("2*/sweep.json")]
    planned = next(m for m in metas if m.get("planning"))
    plan = planned["planning"]
    assert plan["goal"] == "budget 10.0 min" and plan["allocation"]["wall_s"] <= 600
    assert planned["matrix"]["repeats"] == plan["repeats"] and planned["sequential"]["max_looks"] == plan["repeats"]
    assert planned["matrix"]["base"]["steps"] == 1 + plan["timed_steps"] + 1  # warm-up + timed + profiled (last)
    assert len(fake2.calls) == 4 * len(planned["sequential"]["looks"])
    parent = MlflowClient(uri).get_run(planned["parent_run_id"]).data
    params = parent.params
    assert parent.tags["bench.sequential.blocks"] == f"{len(planned['sequential']['looks'])}/{plan['repeats']}"
    assert params["plan.timed_steps"] == str(plan["timed_steps"]) and params["plan.goal"] == "budget 10.0 min"
    rec = json.loads(next((tmp_path / "res" / "full").glob(f"{planned['sweep_id']}/*/r0/record.json")).read_text())
    assert set(rec["timing"]) == {"startup_s", "steps_s", "warmup_s", "timed_s", "profiled_s", "harness_s"}
    assert rec["timing"]["steps_s"] == pytest.approx(sum(s["timing_s/step"] for s in rec["steps"].values()))


def test_plan_never_times_fewer_steps_than_the_matrix(tmp_path, monkeypatch, capsys):
    """Every run replays the same batches, so an effect can depend on which steps are timed (full.yaml's
    dynamic_bsz: +16 % over steps 2-9, +6 % over steps 2-3, issue 17's real check): a plan keeps at least the
    matrix's own timed steps, even where the shared step pattern makes 2 steps the cheapest (a mean of 2)."""
    import yaml
    from drift_fake import DriftExecutor
    from test_run_order import small_full

    from bench.cli import main

    path = small_full(tmp_path)
    m = yaml.safe_load(path.read_text())
    m["base"].update(steps=10, profile_steps=[10])
    path.write_text(yaml.safe_dump(m, sort_keys=False))
    own = 10 - int(m["base"].get("warmup_steps", 1)) - 1
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    common = ["--results", str(tmp_path / "res"), "--tracking-uri", uri]
    fake = DriftExecutor(12, seed=5, probe=True, run_sd=0.0, step_sd=0.05)
    monkeypatch.setattr("bench.commands.run.make_executor", lambda *a, **k: fake)
    assert main(["run", str(path), "--order-seed", "1", *common]) == 0
    capsys.readouterr()
    assert main(["run", str(path), "--budget", "3m", "--dry-run", *common]) == 0
    out = capsys.readouterr().out
    timed = int(out.split("plan: ")[1].split(" timed step")[0])
    assert timed >= own, out
    assert f"timed steps searched from the matrix's own {own} up" in out
