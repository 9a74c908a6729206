"""``run_bench.py tune`` with real embedded GRPO runs (slow: about a minute and a half on 2 cores).

- the CLI end to end: a real trial, then a resumed study with one more real trial (trial numbers go on,
  the MLflow parent is reused, each child has the per-step series of a sweep cell);
- a real infeasible trial: the embedded engine refuses a token limit below its longest sequence
  (exit 2, ``failure.json`` kind ``infeasible``) and the tune records it as a constrained, pruned trial.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from bench.spec.loading import load_matrix
from bench.tune import Tuner, resolve_settings
from bench.tune.report import CONSTRAINT
from bench.tune.space import IntDim

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
S = optuna.trial.TrialState

TINY = """\
name: tune_tiny
engine: embedded
platform: cpu
base:
  steps: 2
  warmup_steps: 1
  profile_steps: []
  train_batch_size: 4
  n: 2
  ppo_mini_batch_size: 4
  max_prompt_length: 128
  max_response_length: 24
  timeout_s: 300
tune:
  fixed: {rmsnorm_fused: on}
  space:
    ppo_max_token_len_per_gpu: {low: 1, high: 8, unit: seq, log: true}
    log_prob_max_token_len_per_gpu: {low: 1, high: 8, unit: seq, log: true}
  n_trials: 1
  sampler: {type: tpe, seed: 0, n_startup_trials: 2}
  confirm_blocks: 2
"""


def bench(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, str(ROOT / "run_bench.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_cli_real_trial_then_resume_with_one_more(tmp_path):
    (tmp_path / "m.yaml").write_text(TINY)
    p = bench(["tune", "m.yaml"], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "new study tune_tiny in sqlite:///results/optuna.db: 0 finished, 1 trial(s) to run" in p.stdout
    # trial 0 is the article's rule of thumb: 2*(P+R) = 304, 4*(P+R) = 608
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=304" in p.stdout
    assert "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=608" in p.stdout
    assert "parameter importance: needs >= 2 feasible complete trials, have 1" in p.stdout
    # the only trial is the rule of thumb: nothing to confirm it against
    assert p.stdout.strip().splitlines()[-1] == ("the rule of thumb is the best trial (trial 0); "
                                                 "no other feasible trial to compare it with")
    p = bench(["tune", "m.yaml", "--n-trials", "2"], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "resuming study tune_tiny in sqlite:///results/optuna.db: 1 finished, 1 trial(s) to run" in p.stdout
    assert "parameter importance (fANOVA): " in p.stdout
    assert "confirmation, 2 interleaved block(s) (not trials): " in p.stdout

    study = optuna.load_study(study_name="tune_tiny", storage="sqlite:///" + str(tmp_path / "results" / "optuna.db"))
    assert [(t.number, t.state) for t in study.trials] == [(0, S.COMPLETE), (1, S.COMPLETE)]
    sdir = tmp_path / "results" / "tune_tiny" / "tune" / "tune_tiny"
    for t in study.trials:
        assert 0 < t.value < 60 and t.constraints[CONSTRAINT] == 0.0
        run = sdir / f"trial-{t.number}"
        assert (run / "metrics.jsonl").is_file() and (run / "record.json").is_file()
        cfg = (run / "run_config.yaml").read_text()
        assert f"ppo_max_token_len_per_gpu: {t.params['ppo_max_token_len_per_gpu']}" in cfg
        assert "use_dynamic_bsz: true" in cfg and "rmsnorm_fused: true" in cfg
    for name in (
        "best_overrides.txt",
        "best_fragment.yaml",
        "importance.json",
        "objective_vs_limits.png",
        "trials.csv",
    ):
        assert (sdir / name).is_file(), name

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tune_tiny")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("bench.kind") == "tune"]
    children = [r for r in runs if r.data.tags.get("bench.kind") == "trial"]
    assert len(parents) == 1 and len(children) == 2
    assert parents[0].info.run_id == study.user_attrs["mlflow_parent_run_id"]
    for c in children:
        assert c.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        n = int(c.data.tags["optuna.trial_number"])
        assert c.data.metrics["objective"] == pytest.approx(study.trials[n].value)
        assert sorted(h.step for h in client.get_metric_history(c.info.run_id, "timing_s/step")) == [1, 2]
    assert "objective_vs_limits.png" in {a.path for a in client.list_artifacts(parents[0].info.run_id)}

    # the confirmation: best vs rule of thumb (or, when trial 0 won, vs the runner-up) in 2 interleaved blocks
    import json
    import re
    import statistics

    from bench.records.snapshot import record_samples
    from bench.tune.confirm import block_orders

    conf = json.loads((sdir / "best.json").read_text())["confirmation"]
    last = p.stdout.strip().splitlines()[-1]
    assert last == conf["line"], p.stdout
    pct = r"[+-]\d+\.\d %"
    assert re.fullmatch(r"(best \(trial 1\) vs rule of thumb|the rule of thumb is the best trial \(trial 0\); "
                        rf"vs the runner-up \(trial 1\)): (cannot tell them apart \()?{pct} \[{pct}, {pct}\] "
                        r"over 2 blocks\)?", last), last
    runs = conf["runs"]
    order = [(b, role) for b, o in enumerate(block_orders(2, 0)) for role in o]
    assert [(r["block"], r["role"]) for r in runs] == order
    assert all(r["status"] == "ok" for r in runs), runs
    val = {}
    for r in runs:  # the recorded value is the run's median timed step, from its own record
        rec = json.loads((sdir / r["run_dir"] / "record.json").read_text())
        assert r["value"] == pytest.approx(statistics.median(record_samples(rec)["step_time"]))
        val[r["block"], r["role"]] = r["value"]
    d = [math.log(val[b, "best"] / val[b, "other"]) for b in (0, 1)]
    mean, h = sum(d) / 2, 12.706204736174694 * abs(d[0] - d[1]) / math.sqrt(2) / math.sqrt(2)  # t(0.975, 1) sd/sqrt(2)
    assert (conf["change"], conf["ci_low"], conf["ci_high"]) == pytest.approx(
        (math.expm1(mean), math.expm1(mean - h), math.expm1(mean + h)))
    assert conf["blocks"] == 2 and len(study.trials) == 2  # the confirmation's runs are no trials
    pm = client.get_run(parents[0].info.run_id).data.metrics
    assert pm["confirm.change"] == pytest.approx(conf["change"]) and pm["confirm.blocks"] == 2
    assert (pm["confirm.ci_low"], pm["confirm.ci_high"]) == pytest.approx((conf["ci_low"], conf["ci_high"]))


def test_real_infeasible_trial_is_recorded_with_reason(tmp_path):
    (tmp_path / "m.yaml").write_text(TINY)
    m = load_matrix(tmp_path / "m.yaml")
    s = resolve_settings(m, results=tmp_path / "res", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                         storage=f"sqlite:///{tmp_path / 'optuna.db'}", study="inf")
    # the schema refuses bounds below P+R; force one (below any prompt + response) to reach the engine's check
    s.space = {"ppo_max_token_len_per_gpu": IntDim("ppo_max_token_len_per_gpu", 40, 40)}
    s.block = s.block.model_copy(update={"start_at_rule_of_thumb": False})
    out = Tuner(s).run()
    study = optuna.load_study(study_name="inf", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    (t,) = study.trials
    assert t.state == S.PRUNED and t.value is None
    assert t.user_attrs["failure_kind"] == "infeasible"
    assert "ppo_max_token_len_per_gpu=40 is below the longest sequence" in t.user_attrs["reason"]
    assert t.constraints[CONSTRAINT] > 1.0  # 1 + shortfall / (P+R), shortfall from the engine's message
    assert out.summary["best"] is None and out.summary["counts"]["infeasible"] == 1
    with pytest.raises(ValueError):
        study.best_trial  # noqa: B018 - no feasible trial: Optuna refuses rather than return the infeasible one
