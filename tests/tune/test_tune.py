"""``run_bench.py tune``: Optuna search of the dynamic-bsz token limits.

Real sqlite storages (Optuna and MLflow) in tmp folders, the real planner, records and MLflow logging;
only the run itself is replaced by :class:`test_tune_fake.FakeExecutor` (milliseconds instead of
seconds). Real embedded trials are in ``test_tune_slow.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from test_tune_fake import SEQ, FakeExecutor, step_time

from bench.cli import main as cli_main
from bench.core.errors import BenchError
from bench.core.process import ExecResult
from bench.spec.loading import load_matrix
from bench.spec.matrix import Base
from bench.tune import Tuner, resolve_settings
from bench.tune.report import CONSTRAINT, is_interrupted, verl_overrides
from bench.tune.space import IntDim, TuneBlock, resolve_space

ROOT = Path(__file__).resolve().parents[2]
S = optuna.trial.TrialState

MATRIX = """\
name: {name}
engine: embedded
platform: cpu
base:
  steps: 3
  warmup_steps: 1
  profile_steps: []
  max_prompt_length: 96
  max_response_length: 64
tune:
  fixed: {{rmsnorm_fused: on}}
  space:
    ppo_max_token_len_per_gpu: {{low: 1, high: 16, unit: seq, log: true}}
    log_prob_max_token_len_per_gpu: {{low: 1, high: 32, unit: seq, log: true}}
  n_trials: {n}
  sampler: {{type: tpe, seed: 3, n_startup_trials: 3}}
  confirm_blocks: 0
"""


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> str:
    """One MLflow sqlite store for the module (creating one costs seconds); experiments differ per test."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def make(tmp_path: Path, name: str, n: int = 6, text: str | None = None) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text if text is not None else MATRIX.format(name=name, n=n))
    return path


def tune(tmp_path: Path, matrix: Path, uri: str, executor, **kw):
    m = load_matrix(matrix)
    s = resolve_settings(m, results=tmp_path / "res", tracking_uri=uri,
                         storage=f"sqlite:///{tmp_path / 'optuna.db'}", **kw)
    return s, Tuner(s, executor=executor).run()


def load(tmp_path: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'optuna.db'}")


def mlflow_runs(uri: str, experiment: str):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    return client, [r for r in runs if r.data.tags.get("bench.kind") == "tune"], \
        [r for r in runs if r.data.tags.get("bench.kind") == "trial"]


# -- search space ---------------------------------------------------------------------------------

def test_space_in_units_of_seq_and_tokens_resolves_to_integers():
    base = Base(max_prompt_length=96, max_response_length=64)
    block = TuneBlock(space={"ppo_max_token_len_per_gpu": {"low": 1, "high": 8, "unit": "seq", "log": True},
                             "log_prob_max_token_len_per_gpu": {"low": 200, "high": 1000, "step": 300}})
    space, notes = resolve_space(block, base)
    assert space["ppo_max_token_len_per_gpu"] == IntDim("ppo_max_token_len_per_gpu", 160, 1280, 1, True)
    # 200 + k*300 <= 1000 -> high lowered to 800, and said so
    assert space["log_prob_max_token_len_per_gpu"] == IntDim("log_prob_max_token_len_per_gpu", 200, 800, 300, False)
    assert notes == ["log_prob_max_token_len_per_gpu: high 1000 is not on the grid 200 + k*300: lowered to 800"]
    assert space["log_prob_max_token_len_per_gpu"].grid() == [200, 500, 800]
    assert space["log_prob_max_token_len_per_gpu"].snap(640) == 500


def test_bound_below_longest_sequence_is_refused_not_clipped():
    base = Base(max_prompt_length=96, max_response_length=64)
    block = TuneBlock(space={"ppo_max_token_len_per_gpu": {"low": 0.5, "high": 4, "unit": "seq"}})
    with pytest.raises(BenchError, match=r"tune.space.ppo_max_token_len_per_gpu.low: 0.5 x \(P\+R\) = 80 tokens is "
                                         r"below the longest possible sequence P\+R = 160 .* refused, not clipped"):
        resolve_space(block, base, "m.yaml")


# -- bad input: one line, exit 2, nothing written -------------------------------------------------

BAD = {
    "lower_above_upper": ("ppo_max_token_len_per_gpu: {low: 8, high: 2, unit: seq}",
                          "tune.space.ppo_max_token_len_per_gpu: low (8) is above high (2)"),
    "unknown_parameter": ("micro_batch_size: {low: 1, high: 2}",
                          "tune.space: unknown parameter 'micro_batch_size' (allowed: ppo_max_token_len_per_gpu, "
                          "log_prob_max_token_len_per_gpu)"),
    "below_p_plus_r": ("log_prob_max_token_len_per_gpu: {low: 100, high: 2000}",
                       "tune.space.log_prob_max_token_len_per_gpu.low: 100 tokens is below the longest possible "
                       "sequence P+R = 160"),
    "log_and_step": ("ppo_max_token_len_per_gpu: {low: 160, high: 640, log: true, step: 160}",
                     "log: true and step exclude each other"),
}


def _bad_matrix(space_line: str) -> str:
    return ("name: bad\nengine: embedded\nplatform: cpu\nbase: {max_prompt_length: 96, max_response_length: 64}\n"
            f"tune:\n  n_trials: 2\n  space:\n    {space_line}\n")


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_search_space_is_one_line_exit_2(tmp_path, capsys, case):
    space_line, expected = BAD[case]
    (tmp_path / "m.yaml").write_text(_bad_matrix(space_line))
    rc = cli_main(["tune", str(tmp_path / "m.yaml"), "--results", str(tmp_path / "res")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert expected in err[0] and str(tmp_path / "m.yaml") in err[0], err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.yaml"]


@pytest.mark.parametrize("url, expected", [
    ("sqlite:///{tmp}/no/such/folder/optuna.db", "cannot open Optuna storage"),
    ("nosuchdb://host/x", "unsupported storage"),
    ("results/optuna.db", "not a URL"),
    ("journal:{tmp}/no/such/folder/journal.log", "does not exist"),
])
def test_storage_that_cannot_be_opened_is_one_line_exit_2(tmp_path, capsys, url, expected):
    (tmp_path / "m.yaml").write_text(MATRIX.format(name="st", n=2))
    url = url.format(tmp=tmp_path)
    rc = cli_main(["tune", str(tmp_path / "m.yaml"), "--results", str(tmp_path / "res"), "--storage", url])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("error: --storage ") and expected in err[0], err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.yaml"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("name: t\nplatform: cpu\n", "tune: missing"),
        (
            "name: t\nplatform: cpu\ntune:\n  space:\n    ppo_max_token_len_per_gpu: {low: 1, high: 2, unit: seq}\n",
            "give n_trials and/or timeout_s",
        ),
        (
            "name: t\nplatform: cpu\ntune:\n  n_trials: 2\n  fixed: {dynamic_bsz: off}\n  space:\n"
            "    ppo_max_token_len_per_gpu: {low: 1, high: 2, unit: seq}\n",
            "dynamic_bsz: must be on",
        ),
        (
            "name: t\nplatform: cpu\ntune:\n  n_trials: 2\n  fixed: {turbo: on}\n  space:\n"
            "    ppo_max_token_len_per_gpu: {low: 1, high: 2, unit: seq}\n",
            "unknown factor 'turbo'",
        ),
        (
            "name: t\nplatform: cpu\ntune:\n  n_trials: 2\n  sampler: grid\n  space:\n"
            "    ppo_max_token_len_per_gpu: {low: 1, high: 2, unit: seq, log: true}\n",
            "grid needs step (not log) dimensions",
        ),
        (
            "name: t\nplatform: cpu\ntune:\n  n_trials: 2\n  objective: latency\n  space:\n"
            "    ppo_max_token_len_per_gpu: {low: 1, high: 2, unit: seq}\n",
            "tune.objective: allowed: 'step_time' or 'throughput'",
        ),
        (
            "name: t\nplatform: cpu\ntune:\n  n_trials: 2\n  confirm_blocks: -1\n  space:\n"
            "    ppo_max_token_len_per_gpu: {low: 1, high: 2, unit: seq}\n",
            "m.yaml:5: tune.confirm_blocks: must be greater than or equal to 0, got -1",
        ),
        (
            "name: t\nplatform: cpu\ntune:\n  n_trials: 2\n  confirm_blocks: '2'\n  space:\n"
            "    ppo_max_token_len_per_gpu: {low: 1, high: 2, unit: seq}\n",
            "m.yaml:5: tune.confirm_blocks: expected an integer, got a string '2'",
        ),
    ],
)
def test_other_bad_tune_blocks(tmp_path, capsys, text, expected):
    (tmp_path / "m.yaml").write_text(text)
    rc = cli_main(["tune", str(tmp_path / "m.yaml"), "--results", str(tmp_path / "res")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and expected in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.yaml"]


def test_exit_code_2_through_the_real_entry_point(tmp_path):
    (tmp_path / "m.yaml").write_text(_bad_matrix(BAD["lower_above_upper"][0]))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), "tune", "m.yaml", "--results", "out"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "m.yaml:" in p.stderr and "low (8) is above high (2)" in p.stderr


# -- infeasible trials, failed trials, best value -------------------------------------------------

def test_infeasible_trials_are_constrained_pruned_with_reason_and_never_best(tmp_path, mlflow_uri):
    # the fake's optimum (ppo 640, log-prob 1280) lies inside the infeasible region (< 700 tokens)
    fake = FakeExecutor(infeasible_below=700, oom_above=2200)
    _, out = tune(tmp_path, make(tmp_path, "infeas", n=14), mlflow_uri, fake)
    study = load(tmp_path, "infeas")
    trials = study.trials
    assert len(trials) == 14
    infeasible = [t for t in trials if t.state == S.PRUNED]
    assert infeasible, [(t.params, t.state) for t in trials]
    kinds = set()
    for t in infeasible:
        assert t.constraints[CONSTRAINT] >= 1.0
        assert t.value is None
        kinds.add(t.user_attrs["failure_kind"])
        assert t.user_attrs["reason"]
        assert (tmp_path / "res" / "infeas" / "tune" / "infeas" / t.user_attrs["run_dir"] / "record.json").is_file()
        if t.user_attrs["failure_kind"] == "infeasible":
            assert "longest sequence" in t.user_attrs["reason"]
            assert min(t.params.values()) < 700
            # deeper violation -> larger constraint (1 + shortfall / (P+R), longest = 700 from verl's message)
            assert t.constraints[CONSTRAINT] == pytest.approx(1 + (700 - min(t.params.values())) / SEQ)
        else:
            assert t.params["ppo_max_token_len_per_gpu"] > 2200 and t.constraints[CONSTRAINT] == 1.0
    assert kinds == {"infeasible", "oom"}, kinds
    for t in trials:
        if t.state == S.COMPLETE:
            assert t.constraints[CONSTRAINT] == 0.0
    best = study.best_trial
    assert best.state == S.COMPLETE and best.constraints[CONSTRAINT] == 0.0
    assert min(best.params.values()) >= 700 and best.params["ppo_max_token_len_per_gpu"] <= 2200
    feasible_values = [t.value for t in trials if t.state == S.COMPLETE]
    assert best.value == min(feasible_values)
    assert out.summary["best"]["trial"] == best.number
    assert out.summary["counts"]["infeasible"] == len(infeasible)


def test_crash_is_a_failed_trial_with_log_tail_and_the_tune_goes_on(tmp_path, mlflow_uri):
    fake = FakeExecutor(crash_at={320})  # trial 0 = rule of thumb 2*(P+R) = 320 -> crashes
    _, out = tune(tmp_path, make(tmp_path, "crash", n=3), mlflow_uri, fake)
    study = load(tmp_path, "crash")
    t0 = study.trials[0]
    assert t0.params == {"ppo_max_token_len_per_gpu": 320, "log_prob_max_token_len_per_gpu": 640}
    assert t0.state == S.FAIL and t0.constraints == {}
    assert t0.user_attrs["failure_kind"] == "crash"
    assert "RuntimeError: boom in the fake engine" in t0.user_attrs["log_tail"]
    assert [t.state for t in study.trials[1:]] == [S.COMPLETE, S.COMPLETE]
    assert out.summary["counts"] == {"feasible": 2, "infeasible": 0, "failed": 1, "interrupted": 0}


def test_pruned_with_constraint_teaches_tpe_where_nan_fail_does_not():
    """The state chosen for infeasible trials: PRUNED + constraint steers TPE away; FAIL (NaN) does not."""

    def run(mode: str, seed: int) -> int:
        study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=5))

        def objective(trial):
            x = trial.suggest_int("x", 160, 5120, log=True)
            if x < 1000:  # infeasible region
                if mode == "fail":
                    return float("nan")
                trial.set_constraint(CONSTRAINT, 1.0)
                raise optuna.TrialPruned()
            trial.set_constraint(CONSTRAINT, 0.0)
            return (x - 1100) ** 2 / 1e5 + 1.0

        optuna.logging.set_verbosity(optuna.logging.ERROR)
        study.optimize(objective, n_trials=30)
        if mode == "pruned":
            assert study.best_trial.params["x"] >= 1000
        return sum(t.params["x"] < 1000 for t in study.trials[5:])

    pruned = sum(run("pruned", s) for s in range(4))
    fail = sum(run("fail", s) for s in range(4))
    assert pruned < fail / 2, (pruned, fail)


# -- resume, MLflow tree, outputs -----------------------------------------------------------------

def test_resume_continues_trial_count_and_reuses_mlflow_parent(tmp_path, mlflow_uri):
    path = make(tmp_path, "resume", n=3)
    fake = FakeExecutor()
    _, out1 = tune(tmp_path, path, mlflow_uri, fake)
    assert out1.ran == 3
    study = load(tmp_path, "resume")
    parent = study.user_attrs["mlflow_parent_run_id"]
    # a harness killed mid-trial leaves a RUNNING trial behind
    stale = study.ask({"ppo_max_token_len_per_gpu": optuna.distributions.IntDistribution(160, 2560, log=True),
                       "log_prob_max_token_len_per_gpu": optuna.distributions.IntDistribution(160, 5120, log=True)})
    stale_params = dict(stale.params)
    assert stale.number == 3
    _, out2 = tune(tmp_path, path, mlflow_uri, fake, n_trials=6)
    study = load(tmp_path, "resume")
    numbers = [(t.number, t.state) for t in study.trials]
    assert numbers[:3] == [(0, S.COMPLETE), (1, S.COMPLETE), (2, S.COMPLETE)]
    assert numbers[3] == (3, S.FAIL) and is_interrupted(study.trials[3])  # failed through study.tell, no failure_kind
    # 3 more finished trials (6 in all, the interrupted one not counted), numbered on from 4
    assert [n for n, st in numbers[4:]] == [4, 5, 6] and all(st == S.COMPLETE for _, st in numbers[4:])
    assert out2.ran == 3
    # the interrupted point runs again first
    assert study.trials[4].params == stale_params and study.trials[4].user_attrs["rerun_of"] == 3
    assert study.user_attrs["mlflow_parent_run_id"] == parent
    # nothing left to do: a third call runs nothing
    _, out3 = tune(tmp_path, path, mlflow_uri, fake, n_trials=6)
    assert out3.ran == 0 and len(load(tmp_path, "resume").trials) == 7

    client, parents, children = mlflow_runs(mlflow_uri, "resume")
    assert [p.info.run_id for p in parents] == [parent]
    assert sorted(int(c.data.tags["optuna.trial_number"]) for c in children) == [0, 1, 2, 4, 5, 6]
    for c in children:
        assert c.data.tags["mlflow.parentRunId"] == parent
        assert c.data.tags["mlflow.runName"] == f"trial-{c.data.tags['optuna.trial_number']}"
        assert c.data.tags["optuna.state"] == "COMPLETE" and c.data.tags["infeasible"] == "false"
        p, m = c.data.params, c.data.metrics
        assert int(p["ppo_max_token_len_per_gpu"]) >= 160 and int(p["log_prob_max_token_len_per_gpu"]) >= 160
        assert m["objective"] == pytest.approx(step_time(int(p["ppo_max_token_len_per_gpu"]),
                                                         int(p["log_prob_max_token_len_per_gpu"])))
        assert m["constraint"] == 0.0 and m["step_time_s"] == pytest.approx(m["objective"])
        assert p["factor.dynamic_bsz"] == "1" and p["factor.rmsnorm_fused"] == "1"
        hist = client.get_metric_history(c.info.run_id, "timing_s/step")
        assert sorted(h.step for h in hist) == [1, 2, 3]
    prun = client.get_run(parent)
    assert prun.info.status == "FINISHED"
    assert prun.data.metrics["trials_feasible"] == 6 and prun.data.metrics["trials_interrupted"] == 1
    arts = {a.path for a in client.list_artifacts(parent)}
    assert {"best_overrides.txt", "best_fragment.yaml", "importance.json", "objective_vs_limits.png",
            "trials.csv", "best.json"} <= arts


def test_mlflow_tree_marks_infeasible_and_failed_children(tmp_path, mlflow_uri):
    fake = FakeExecutor(infeasible_below=200, crash_at={640})
    path = make(tmp_path, "tree", text=MATRIX.format(name="tree", n=4).replace(
        "sampler: {type: tpe, seed: 3, n_startup_trials: 3}", "sampler: {type: grid}").replace(
        "{low: 1, high: 16, unit: seq, log: true}", "{low: 1, high: 4, unit: seq, step: 1}").replace(
        "{low: 1, high: 32, unit: seq, log: true}", "{low: 3, high: 3, unit: seq}"))
    _, out = tune(tmp_path, path, mlflow_uri, fake)
    # grid: ppo in {160, 320, 480, 640} x log-prob {480}: 160 infeasible, 640 crashes
    _, parents, children = mlflow_runs(mlflow_uri, "tree")
    assert len(parents) == 1 and len(children) == 4
    by_ppo = {int(c.data.params["ppo_max_token_len_per_gpu"]): c for c in children}
    assert sorted(by_ppo) == [160, 320, 480, 640]
    inf = by_ppo[160]
    assert inf.data.tags["optuna.state"] == "PRUNED" and inf.data.tags["infeasible"] == "true"
    assert (
        inf.data.tags["failure_kind"] == "infeasible"
        and "longest sequence of 200 tokens" in inf.data.tags["failure_reason"]
    )
    assert inf.data.metrics["constraint"] == pytest.approx(1 + 40 / SEQ) and "objective" not in inf.data.metrics
    assert inf.info.status == "FAILED"
    crash = by_ppo[640]
    assert crash.data.tags["optuna.state"] == "FAIL" and crash.data.tags["failure_kind"] == "crash"
    assert "constraint" not in crash.data.metrics
    assert by_ppo[320].data.tags["optuna.state"] == "COMPLETE"
    assert out.summary["best"]["limits"] == {"ppo_max_token_len_per_gpu": 480, "log_prob_max_token_len_per_gpu": 480}


def test_outputs_written_and_importance_needs_two_trials(tmp_path, mlflow_uri):
    path = make(tmp_path, "outs2", n=1)
    s, out = tune(tmp_path, path, mlflow_uri, FakeExecutor())
    d = s.study_dir
    assert (
        out.summary["importance"] is None
        and "needs >= 2 feasible complete trials, have 1" in out.summary["importance_note"]
    )
    limits = {"ppo_max_token_len_per_gpu": 320, "log_prob_max_token_len_per_gpu": 640}  # rule of thumb = trial 0
    assert out.summary["best"]["limits"] == limits
    assert (d / "best_overrides.txt").read_text().splitlines() == verl_overrides(limits) == [
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=320",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=640",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=640",
    ]
    frag = yaml.safe_load((d / "best_fragment.yaml").read_text())
    assert frag == {
        "base": {"ppo_max_token_len": 320, "log_prob_max_token_len": 640},
        "factors": {"dynamic_bsz": [True]},
    }  # YAML reads `on` as true
    # the fragment pastes into a matrix
    merged = yaml.safe_load(path.read_text())
    merged["base"].update(frag["base"])
    merged["factors"] = frag["factors"]
    # kept beside factors that no longer list its fixed levels, the tune block is refused by name (issue 33)
    (tmp_path / "merged.yaml").write_text(yaml.safe_dump(merged))
    with pytest.raises(BenchError, match=r"tune\.fixed\.\w+: the matrix does not list"):
        load_matrix(tmp_path / "merged.yaml")
    merged.pop("tune")  # a matrix to run: the fragment without the tuning block
    (tmp_path / "merged.yaml").write_text(yaml.safe_dump(merged))
    m = load_matrix(tmp_path / "merged.yaml")
    assert m.base.context()["ppo_max_token_len"] == 320
    assert (d / "objective_vs_limits.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # more trials -> importance computed for both limits
    s, out = tune(tmp_path, path, mlflow_uri, FakeExecutor(), n_trials=6)
    imp = out.summary["importance"]
    assert set(imp) == {"ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu"}
    assert sum(imp.values()) == pytest.approx(1.0)


def test_resume_with_changed_settings_is_refused(tmp_path, mlflow_uri):
    path = make(tmp_path, "chg", n=1)
    tune(tmp_path, path, mlflow_uri, FakeExecutor())
    path.write_text(path.read_text().replace("steps: 3", "steps: 4"))
    with pytest.raises(BenchError, match=r"--study chg: the study in .* was made with other settings "
                                         r"\(changed: base.steps\); .*--study NEW_NAME"):
        tune(tmp_path, path, mlflow_uri, FakeExecutor(), n_trials=2)


def test_grid_sampler_runs_every_point_once_and_resumes_to_nothing(tmp_path, mlflow_uri):
    text = MATRIX.format(name="grid", n=1).replace("  n_trials: 1\n", "").replace(
        "sampler: {type: tpe, seed: 3, n_startup_trials: 3}", "sampler: grid").replace(
        "{low: 1, high: 16, unit: seq, log: true}", "{low: 1, high: 3, unit: seq, step: 1}").replace(
        "{low: 1, high: 32, unit: seq, log: true}", "{low: 2, high: 4, unit: seq, step: 2}")
    path = make(tmp_path, "grid", text=text)
    fake = FakeExecutor()
    _, out = tune(tmp_path, path, mlflow_uri, fake)
    assert sorted(fake.calls) == [(p, lp) for p in (160, 320, 480) for lp in (320, 640)]
    assert out.ran == 6
    _, out = tune(tmp_path, path, mlflow_uri, fake)
    assert out.ran == 0 and len(fake.calls) == 6


class InterruptAt(FakeExecutor):
    """Ctrl-C during the run of the ``at``-th launch (0-based)."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at

    def execute(self, launch):
        if len(self.calls) == self.at:
            self.calls.append(None)
            raise KeyboardInterrupt
        return super().execute(launch)


def test_ctrl_c_keeps_finished_trials_and_resume_reruns_the_interrupted_point(tmp_path, mlflow_uri):
    path = make(tmp_path, "ctrlc", n=4)
    with pytest.raises(KeyboardInterrupt):
        tune(tmp_path, path, mlflow_uri, InterruptAt(2))
    study = load(tmp_path, "ctrlc")
    assert [t.state for t in study.trials] == [S.COMPLETE, S.COMPLETE, S.FAIL]
    cut = study.trials[2]
    assert cut.user_attrs["interrupted"] is True and cut.user_attrs["reason"] == "interrupted by the user"
    parent = study.user_attrs["mlflow_parent_run_id"]
    client, _, _ = mlflow_runs(mlflow_uri, "ctrlc")
    assert client.get_run(parent).info.status == "KILLED"
    # outputs of the finished trials were written on the way out
    assert (tmp_path / "res" / "ctrlc" / "tune" / "ctrlc" / "best_overrides.txt").is_file()
    fake = FakeExecutor()
    _, out = tune(tmp_path, path, mlflow_uri, fake)
    study = load(tmp_path, "ctrlc")
    assert out.ran == 2 and [t.number for t in study.trials] == [0, 1, 2, 3, 4]
    assert study.trials[3].params == cut.params and study.trials[3].user_attrs["rerun_of"] == 2
    assert client.get_run(parent).info.status == "FINISHED"


def test_journal_file_storage_and_timeout_budget(tmp_path, mlflow_uri):
    path = make(tmp_path, "journal", n=1)
    m = load_matrix(path)
    s = resolve_settings(m, results=tmp_path / "res", tracking_uri=mlflow_uri,
                         storage=f"journal:{tmp_path / 'optuna.journal'}", n_trials=None, timeout_s=0.01)
    s.n_trials = None  # the time budget alone: checked after each trial, so exactly one trial runs
    out = Tuner(s, executor=FakeExecutor()).run()
    assert out.ran == 1 and (tmp_path / "optuna.journal").stat().st_size > 0
    out = Tuner(s, executor=FakeExecutor()).run()
    assert out.ran == 1
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    study = optuna.load_study(study_name="journal",
                              storage=JournalStorage(JournalFileBackend(str(tmp_path / "optuna.journal"))))
    assert [t.number for t in study.trials] == [0, 1]


class BadInput(FakeExecutor):
    def execute(self, launch):
        import json as _json

        from bench.core.process import ExecResult

        self.calls.append(None)
        (Path(launch.run_dir) / "failure.json").write_text(_json.dumps(
            {"kind": "bad_input", "reason": "data: prompt of row 7 has 97 tokens, above max_prompt_length=96"}))
        return ExecResult(2, False, 0.01, "exit code 2")


def test_engine_bad_input_stops_the_tune_with_exit_2(tmp_path, mlflow_uri):
    fake = BadInput()
    with pytest.raises(BenchError, match=r"trial 0: the engine refused the settings: data: prompt of row 7 has 97 "
                                         r"tokens, above max_prompt_length=96"):
        tune(tmp_path, make(tmp_path, "badin", n=5), mlflow_uri, fake)
    assert len(fake.calls) == 1
    (t,) = load(tmp_path, "badin").trials
    assert t.state == S.FAIL and t.user_attrs["failure_kind"] == "bad_input"


def test_objective_is_speed_normalized_to_the_first_trials_machine(tmp_path, mlflow_uri):
    # the machine alternates between nominal and 30 % slower: raw values carry that, normalized ones do not
    slow = [1.0, 1.3]
    s, out = tune(tmp_path, make(tmp_path, "tspeed", n=4), mlflow_uri, FakeExecutor(machine=slow))
    st = load(tmp_path, "tspeed")
    assert st.user_attrs["speed_probe_ref_s"] == pytest.approx(0.03)
    assert st.user_attrs["speed_probe_spec"].startswith("matmul")
    done = [t for t in st.trials if t.state == S.COMPLETE]
    assert len(done) == 4
    for i, t in enumerate(done):
        true = step_time(t.user_attrs["ppo_max_token_len_per_gpu"], t.user_attrs["log_prob_max_token_len_per_gpu"])
        assert t.value == pytest.approx(true, rel=1e-6)
        assert t.user_attrs["raw_value"] == pytest.approx(true * slow[i % 2], rel=1e-6)
    # normalize: false keeps the raw medians
    text = MATRIX.format(name="traw", n=2).replace("  n_trials:", "  normalize: false\n  n_trials:")
    tune(tmp_path, make(tmp_path, "traw", text=text), mlflow_uri, FakeExecutor(machine=[1.3]))
    raw = [t for t in load(tmp_path, "traw").trials if t.state == S.COMPLETE]
    assert all(t.value == pytest.approx(1.3 * step_time(t.user_attrs["ppo_max_token_len_per_gpu"],
                                                        t.user_attrs["log_prob_max_token_len_per_gpu"])) for t in raw)


# -- what optuna-dashboard shows: the objective's name and unit, raw and normalized values, settings as keys ---------

def test_study_names_its_objective_with_unit_and_keeps_raw_and_normalized_values(tmp_path, mlflow_uri):
    slow = [1.0, 1.3]  # the machine alternates between nominal and 30 % slower
    tune(tmp_path, make(tmp_path, "tnames", n=3), mlflow_uri, FakeExecutor(machine=slow))
    st = load(tmp_path, "tnames")  # a fresh load from the sqlite storage: what the dashboard reads
    assert st.metric_names == ["step_time_s (s, median, speed-normalized)"]
    a = st.user_attrs
    assert a["objective.name"] == "step_time_s (s, median, speed-normalized)" and a["objective.unit"] == "s"
    assert a["objective.direction"] == "minimize" and a["objective.speed_normalized"] is True
    # settings as one key each, no JSON blob
    assert "bench_settings" not in a
    assert (
        a["setting.engine"] == "embedded" and a["setting.platform"] == "cpu" and a["setting.objective"] == "step_time"
    )
    assert a["setting.cell.dynamic_bsz"] == 1 and a["setting.cell.rmsnorm_fused"] == 1
    assert a["setting.space.ppo_max_token_len_per_gpu.low"] == SEQ and a["setting.base.steps"] == 3
    assert not [k for k, v in a.items() if isinstance(v, dict) and v], "a study attribute holds a JSON object"
    ref = a["speed_probe_ref_s"]
    done = [t for t in st.trials if t.state == S.COMPLETE]
    assert len(done) == 3
    for i, t in enumerate(done):
        true = step_time(t.user_attrs["ppo_max_token_len_per_gpu"], t.user_attrs["log_prob_max_token_len_per_gpu"])
        assert t.user_attrs["step_time_s_normalized"] == t.value == pytest.approx(true, rel=1e-6)
        assert (
            t.user_attrs["step_time_s_raw"] == t.user_attrs["raw_value"] == pytest.approx(true * slow[i % 2], rel=1e-6)
        )
        assert t.user_attrs["reference_probe_s"] == ref == pytest.approx(0.03)
        assert t.user_attrs["speed_probe_median_s"] == pytest.approx(0.03 * slow[i % 2])
    # normalize: false: the name says raw, and there is no normalized value
    text = MATRIX.format(name="tnraw", n=1).replace("  n_trials:", "  normalize: false\n  n_trials:")
    tune(tmp_path, make(tmp_path, "tnraw", text=text), mlflow_uri, FakeExecutor(machine=[1.3]))
    st = load(tmp_path, "tnraw")
    assert st.metric_names == ["step_time_s (s, median, raw)"] and st.user_attrs["objective.speed_normalized"] is False
    (t,) = st.trials
    assert t.user_attrs["step_time_s_raw"] == t.value and "step_time_s_normalized" not in t.user_attrs


def test_stale_running_trial_is_failed_through_the_public_api_and_rerun(tmp_path, mlflow_uri):
    path = make(tmp_path, "tstale", n=1)
    tune(tmp_path, path, mlflow_uri, FakeExecutor())
    st = load(tmp_path, "tstale")
    stale = st.ask({"ppo_max_token_len_per_gpu": optuna.distributions.IntDistribution(160, 2560, log=True),
                    "log_prob_max_token_len_per_gpu": optuna.distributions.IntDistribution(160, 5120, log=True)})
    s, out = tune(tmp_path, path, mlflow_uri, FakeExecutor(), n_trials=2)
    st = load(tmp_path, "tstale")
    assert st.trials[stale.number].state == S.FAIL and is_interrupted(st.trials[stale.number])
    assert st.trials[-1].params == stale.params and st.trials[-1].state == S.COMPLETE
    rows = {r["number"]: r for r in out.summary["rows"]}
    assert rows[stale.number]["kind"] == "interrupted"
    assert rows[stale.number]["reason"] == "the harness stopped during this trial"


def test_tune_console_shows_progress_eta_and_best_so_far(tmp_path, mlflow_uri):
    import io

    from bench.commands.tune import ConsoleView

    buf = io.StringIO()
    view = ConsoleView(out=buf, steps=3, engine="embedded")
    m = load_matrix(make(tmp_path, "tprog", n=3))
    s = resolve_settings(m, results=tmp_path / "res", tracking_uri=mlflow_uri,
                         storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    try:
        Tuner(s, executor=FakeExecutor(), on_event=view).run()
    finally:
        view.stop()
    text = buf.getvalue()
    assert "\x1b" not in text and "\r" not in text  # plain lines: no control characters
    progress = [ln for ln in text.splitlines() if ln.startswith("[")]
    first = next(ln for ln in progress if " trial 1/3 #0: " in ln)
    assert "0/3 done, ETA ?" in first  # nothing finished yet: no estimate
    third = next(ln for ln in progress if " trial 3/3 #2: " in ln)
    assert "2/3 done, ETA " in third and "ETA ?" not in third and "best so far " in third and " s (trial " in third
    assert any("3/3 done, ETA 0s" in ln and "writing the outputs" in ln for ln in progress)


# -- the confirmation: the best trial against the rule of thumb in interleaved blocks (not trials) --------------

def _recompute(best: list[float], other: list[float], alpha: float = 0.05) -> tuple[float, float, float]:
    """change, ci_low, ci_high of the paired t interval of log(best / other), written out independently."""
    import numpy as np
    from scipy import stats

    d = np.log(np.asarray(best) / np.asarray(other))
    h = stats.t.ppf(1 - alpha / 2, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    return float(np.expm1(d.mean())), float(np.expm1(d.mean() - h)), float(np.expm1(d.mean() + h))


def test_confirmation_comparison_calls_a_change_only_when_the_interval_excludes_zero():
    from bench.tune.confirm import compare, describe

    best, other = [0.97, 0.95, 0.96], [1.0, 1.0, 1.0]
    r = compare(best, other)
    assert r["verdict"] == "better" and r["blocks"] == 3
    assert (r["change"], r["ci_low"], r["ci_high"]) == pytest.approx(_recompute(best, other))
    line = describe(r, "best (trial 4) vs rule of thumb", 3)
    assert line == (f"best (trial 4) vs rule of thumb: {100 * r['change']:+.1f} % [{100 * r['ci_low']:+.1f} %, "
                    f"{100 * r['ci_high']:+.1f} %] over 3 blocks")
    assert line.startswith("best (trial 4) vs rule of thumb: -4.0 %")
    noisy = compare([0.9, 1.1, 1.02], [1.0, 1.0, 1.0])
    assert noisy["verdict"] == "indistinguishable" and noisy["ci_low"] < 0 < noisy["ci_high"]
    assert describe(noisy, "best (trial 4) vs rule of thumb", 3) == (
        "best (trial 4) vs rule of thumb: cannot tell them apart (+0.3 % [-22.0 %, +29.0 %] over 3 blocks)")
    worse = compare([1.05, 1.06, 1.04], [1.0, 1.0, 1.0])
    assert worse["verdict"] == "worse" and worse["ci_low"] > 0
    # throughput: the sign flips (a higher throughput of the best is a negative change, like a shorter step time)
    thr = compare([1 / v for v in best], [1.0, 1.0, 1.0], direction="maximize")
    assert (thr["change"], thr["ci_low"], thr["ci_high"]) == pytest.approx((r["change"], r["ci_low"], r["ci_high"]))
    # a failed run (None) leaves its block out; under 2 complete blocks nothing is judged
    part = compare([0.97, None, 0.96], [1.0, 1.0, 1.0])
    assert part["blocks"] == 2 and part["change"] == pytest.approx(_recompute([0.97, 0.96], [1.0, 1.0])[0])
    few = compare([0.97, None], [1.0, 1.0])
    assert few["verdict"] == "too_few_blocks" and few["change"] is None
    assert "not judged (1 complete block(s) of 2" in describe(few, "x", 2)


def test_confirmation_when_the_best_trial_is_the_rule_of_thumb_uses_the_runner_up():
    from bench.tune.confirm import plan

    def trial(number, ppo, lp, value):
        return optuna.trial.create_trial(value=value, user_attrs={"ppo_max_token_len_per_gpu": ppo,
                                                                  "log_prob_max_token_len_per_gpu": lp})

    trials = [trial(0, 320, 640, 1.0), trial(1, 900, 900, 1.3), trial(2, 500, 700, 1.1)]
    for i, t in enumerate(trials):
        t.number = i
    rot = {"ppo_max_token_len_per_gpu": 320, "log_prob_max_token_len_per_gpu": 640}
    what = plan(trials[0], trials, rot, Tuner.limits_of_trial, "minimize")
    assert what["against"] == "runner_up" and what["other_trial"] == 2
    assert what["lead"] == "the rule of thumb is the best trial (trial 0); vs the runner-up (trial 2)"
    alone = plan(trials[0], trials[:1], rot, Tuner.limits_of_trial, "minimize")
    assert alone["line"] == "the rule of thumb is the best trial (trial 0); no other feasible trial to compare it with"
    assert plan(trials[2], trials, rot, Tuner.limits_of_trial, "minimize")["lead"] == "best (trial 2) vs rule of thumb"


class CrashAtCall(FakeExecutor):
    """Crashes the ``at``-th call (1-based)."""

    def __init__(self, at: int, **kw):
        super().__init__(**kw)
        self.at = at

    def execute(self, launch):
        if len(self.calls) + 1 == self.at:
            self.calls.append(None)
            (Path(launch.run_dir) / "run.log").write_text("RuntimeError: boom in the fake engine\n")
            return ExecResult(1, False, 0.01, "exit code 1")
        return super().execute(launch)


def test_confirmation_reruns_best_and_rule_of_thumb_interleaved_not_as_trials(tmp_path, mlflow_uri):
    import io
    import json

    from bench.commands.tune import ConsoleView, print_result
    from bench.tune.confirm import block_orders

    text = MATRIX.format(name="conf", n=4).replace("confirm_blocks: 0", "confirm_blocks: 3")
    path = make(tmp_path, "conf", text=text)
    # trials are calls 1-4; the confirmation's 6 runs follow, the 2nd of them (block 0's second run) crashes
    fake = CrashAtCall(6, machine=[1.0, 1.04, 0.97, 1.02, 0.99, 1.06, 1.01])
    buf = io.StringIO()
    view = ConsoleView(out=buf, steps=3, engine="embedded")
    m = load_matrix(path)
    s = resolve_settings(m, results=tmp_path / "res", tracking_uri=mlflow_uri,
                         storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert s.confirm_blocks == 3
    out = Tuner(s, executor=fake, on_event=view).run()
    print_result(out, s, view)
    view.stop()
    study = load(tmp_path, "conf")
    assert len(study.trials) == 4 and len(fake.calls) == 10  # the confirmation's runs are not trials
    conf = json.loads((s.study_dir / "best.json").read_text())["confirmation"]
    best = out.summary["best"]
    assert best["trial"] != 0 and conf["best_trial"] == best["trial"] and conf["best_limits"] == best["limits"]
    assert conf["against"] == "rule_of_thumb"
    assert conf["other_limits"] == {"ppo_max_token_len_per_gpu": 2 * SEQ, "log_prob_max_token_len_per_gpu": 4 * SEQ}
    runs = conf["runs"]
    assert [(r["block"], r["role"]) for r in runs] == [(b, role) for b, order in enumerate(block_orders(3, 3))
                                                        for role in order]
    for r, call in zip(runs, fake.calls[4:]):  # each run ran its limits, in the recorded order
        assert call is None or call == (r["limits"]["ppo_max_token_len_per_gpu"],
                                        r["limits"]["log_prob_max_token_len_per_gpu"])
    failed = [r for r in runs if r["status"] != "ok"]
    assert len(failed) == 1 and failed[0]["block"] == 0 and failed[0]["failure_kind"] == "crash"
    assert conf["blocks"] == 2 and conf["complete_blocks"] == [1, 2] and conf["blocks_requested"] == 3
    val = {(r["block"], r["role"]): r["value"] for r in runs}
    want = _recompute([val[b, "best"] for b in (1, 2)], [val[b, "other"] for b in (1, 2)])
    assert (conf["change"], conf["ci_low"], conf["ci_high"]) == pytest.approx(want)
    last = buf.getvalue().strip().splitlines()[-1]
    assert last == conf["line"] and last.startswith(f"best (trial {best['trial']}) vs rule of thumb: ")
    assert last.endswith(" over 2 blocks") or last.endswith(" over 2 blocks)")
    assert "(block left out)" in buf.getvalue()
    _, parents, children = mlflow_runs(mlflow_uri, "conf")
    assert len(children) == 4
    pm = parents[0].data.metrics
    assert pm["confirm.change"] == pytest.approx(conf["change"]) and pm["confirm.blocks"] == 2
    assert (pm["confirm.ci_low"], pm["confirm.ci_high"]) == pytest.approx((conf["ci_low"], conf["ci_high"]))
    assert parents[0].data.tags["confirm.line"] == conf["line"]
    # a resumed tune that runs no trial keeps the confirmation instead of running it again
    again = FakeExecutor()
    _, out2 = tune(tmp_path, path, mlflow_uri, again)
    assert again.calls == [] and out2.summary["confirmation"]["line"] == conf["line"]
