"""The tune's figures agree: a trial's objective is the run value of its record, and the best trial's note says
when it was not the fastest on the clock (moved from tests/test_agreement.py with the tune package)."""

from __future__ import annotations

import csv
import json

import pytest


def test_tune_best_value_is_the_run_value_of_its_record(tmp_path):
    """The tune's objective of a trial = :func:`bench.records.figures.run_value` of its record's (normalized)
    samples."""
    import optuna
    from test_tune import load, make, tune
    from test_tune_fake import FakeExecutor

    from bench.core.files import read_json
    from bench.records.figures import run_value
    from bench.records.snapshot import record_samples
    from bench.records.speed import normalize

    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    s, out = tune(tmp_path, make(tmp_path, "agree", n=3), uri, FakeExecutor(machine=[1.0, 1.25]))
    st = load(tmp_path, "agree")
    assert st.metric_names == ["step_time_s (s, median, speed-normalized)"]
    ref = st.user_attrs["speed_probe_ref_s"]
    best = out.summary["best"]
    for t in st.get_trials(states=[optuna.trial.TrialState.COMPLETE]):
        smp = record_samples(read_json(s.study_dir / t.user_attrs["run_dir"] / "record.json"))
        assert t.value == run_value(normalize([smp["step_time"]], [smp["speed_probe"]], ref, "step_time")[0])
        assert t.user_attrs["raw_value"] == run_value(smp["step_time"])
    bj = json.loads((s.study_dir / "best.json").read_text())["best"]
    assert bj["value"] == best["value"] == st.best_value
    assert (
        bj["objective_name"] == "step_time_s (s, median, speed-normalized)"
        and bj["normalized"]
        and bj["reference_probe_s"] == ref
    )
    assert bj["raw_value"] == st.best_trial.user_attrs["raw_value"]
    import io

    from bench.commands.tune import ConsoleView, print_result

    buf = io.StringIO()
    print_result(out, s, ConsoleView(buf))
    assert (
        f"best: trial {bj['trial']}, step_time_s (s, median, speed-normalized) = {bj['value']:.4g} s "
        "(median over the timed "
        f"steps at the study's reference speed: probe {ref:.4f} s); measured median {bj['raw_value']:.4g} s"
    ) in buf.getvalue()
    trials = {int(r["number"]): r for r in csv.DictReader(open(s.study_dir / "trials.csv"))}
    assert float(trials[bj["trial"]]["step_time_median_s"]) == pytest.approx(bj["value"], rel=1e-12)
    assert float(trials[bj["trial"]]["raw_value"]) == pytest.approx(bj["raw_value"], rel=1e-12)


def test_tune_says_when_the_best_trial_was_not_the_fastest_on_the_clock():
    import optuna

    from bench.tune.report import best_summary, trials_rows

    study = optuna.create_study(direction="minimize")
    study.set_user_attr("speed_probe_ref_s", 0.03)
    for value, raw in ((2.6, 6.0), (2.9, 3.1), (3.2, 3.3)):  # trial 0 ran while the machine was 2.3x slower
        study.add_trial(optuna.trial.create_trial(value=value, user_attrs={"raw_value": raw, "normalized": True},
                                                  params={}, distributions={}))
    b = best_summary(study, study.best_trial, trials_rows(study, "step_time_median_s"), "step_time_median_s",
                     "step_time_s (s, median, speed-normalized)", "s")
    assert b["trial"] == 0 and b["value"] == 2.6 and b["raw_value"] == 6.0 and b["reference_probe_s"] == 0.03
    assert "measured 6 s, place 3 of 3 on the clock; trial 1 measured best (3.1 s)" in b["note"]
    study2 = optuna.create_study(direction="minimize")
    for value, raw in ((2.6, 3.0), (2.9, 3.1)):
        study2.add_trial(optuna.trial.create_trial(value=value, user_attrs={"raw_value": raw, "normalized": True},
                                                   params={}, distributions={}))
    assert best_summary(study2, study2.best_trial, trials_rows(study2, "k"), "k", "n", "s")["note"] == ""
