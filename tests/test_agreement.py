"""One sweep, one set of numbers (issue 11): the console table, ``summary.csv``/``summary.md``,
``report.json``/``report.md`` and the MLflow parent run give every cell the same step time and speedup
(all from :mod:`bench.figures`), and the tune's best value is the same statistic of its run.

The sweep is ``matrix/full.yaml`` (4 runs x 3 repeats, blocked order) on the drifting fake machine of
:mod:`drift_fake` with a speed probe, so the values are speed-normalized on every path.
"""

from __future__ import annotations

import csv
import json
import math
import re

import pytest
from drift_fake import DriftExecutor
from test_run_order import small_full

from bench.cli import main
from bench.tracking import _key


def test_console_summary_report_and_mlflow_agree_on_every_speedup(tmp_path, capsys, monkeypatch):
    from mlflow import MlflowClient

    fake = DriftExecutor(12, seed=4, probe=True, effects={"dynamic_bsz": math.log(1.2)})
    monkeypatch.setattr("bench.commands.run.make_executor", lambda *a, **k: fake)
    monkeypatch.setenv("COLUMNS", "240")  # one console line per table row
    path = small_full(tmp_path)
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    common = ["--results", str(tmp_path / "res"), "--tracking-uri", uri]
    assert main(["run", str(path), "--order-seed", "9", *common]) == 0
    console = capsys.readouterr().out
    assert main(["report", "full", *common]) == 0
    sweep = next((tmp_path / "res" / "full").glob("2*"))
    summary = {r["label"]: r for r in csv.DictReader((sweep / "summary.csv").open())}
    md = (sweep / "summary.md").read_text()
    report = json.loads((sweep / "report" / "report.json").read_text())
    report_md = (sweep / "report" / "report.md").read_text()
    rows = {r["cell"]: r for r in report["cells"]}
    parent = MlflowClient(uri).get_run(report["sweep"]["parent_run_id"]).data.metrics
    assert report["speed_normalized_to_s"] and "speed-normalized" in md
    assert set(summary) == set(rows) == {"all-off", "rmsnorm_fused", "dynamic_bsz", "rmsnorm_fused+dynamic_bsz"}
    for label, r in rows.items():
        sp, st = r["speedup"], r["step_time_s"]
        assert float(summary[label]["speedup"]) == pytest.approx(sp, rel=1e-12)
        assert float(summary[label]["step_time_s"]) == pytest.approx(st, rel=1e-12)
        assert parent[_key(f"speedup.{label}")] == pytest.approx(sp, rel=1e-12)
        assert parent[_key(f"report.speedup.{label}")] == pytest.approx(sp, rel=1e-12)
        assert parent[_key(f"step_time_s.{label}")] == pytest.approx(st, rel=1e-12)
        # the same three decimals in the console table, summary.md and report.md rows of this cell
        txt = f"{sp:.3f}"
        assert re.search(rf"^\S*\s*{re.escape(label)}\s.*{re.escape(txt)}", console, re.M), (label, txt)
        assert re.search(rf"^\| {re.escape(label)} \(`.*\| {re.escape(txt)} \|", md, re.M), (label, txt)
        assert re.search(rf"^\| {re.escape(label)} \|.*\| {re.escape(txt)} \[", report_md, re.M), (label, txt)
    # the fake machine logs no memory: missing is shown as missing, never as 0
    assert {r["peak_memory_gb"] for r in summary.values()} == {""}
    # the injected 20 % slowdown of dynamic_bsz is what every path shows (drift removed by the probe)
    assert rows["dynamic_bsz"]["speedup"] == pytest.approx(1 / 1.2, rel=0.03)
    assert report["effects"]["fit"]["unit"] == "run" and report["effects"]["fit"]["df_resid"] == 6
    assert "**Unit of replication: the run**" in report_md and "6 residual degrees of freedom" in report_md


def test_tune_best_value_is_the_run_value_of_its_record(tmp_path):
    """The tune's objective of a trial = :func:`bench.figures.run_value` of its record's (normalized) samples."""
    import optuna
    from test_tune import load, make, tune
    from test_tune_fake import FakeExecutor

    from bench.analyze.snapshot import record_samples
    from bench.figures import run_value
    from bench.results import read_json
    from bench.speed import normalize

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

    from bench.tune_report import best_summary, trials_rows

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
