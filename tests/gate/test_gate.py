"""``run_bench.py gate``: verdicts, exit codes, outputs (markdown, JSON, MLflow), bad input, expect claims."""

from __future__ import annotations

import json

import pytest
from _sweeps import EMBEDDED_CELLS, log_normal_times, make_sweep

from bench.cli import main
from bench.core.errors import BenchError
from bench.gate.verdicts import validate_expect


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    from bench.tracking import Tracker

    d = tmp_path_factory.mktemp("mlflow")
    u = f"sqlite:///{d}/mlflow.db"
    Tracker(u, "synth")  # create the store once (schema migrations take a few seconds)
    return u


@pytest.fixture()
def results(tmp_path, uri):
    """A results folder holding baseline ``base`` of a 4-cell synthetic embedded sweep (4 repeats x 4 steps), saved
    from six sweeps of it so that it measures its sweep-to-sweep offset on 5 degrees of freedom (saves - 1; a
    baseline saved once decides nothing, saved twice its 1 df decides next to nothing)."""
    for i, seed in enumerate((21, 1, 31, 41, 51, 61)):
        make_sweep(tmp_path, "synth", EMBEDDED_CELLS, repeats=4, times=log_normal_times(sd=0.02), seed=seed)
        assert main(["baseline", "save", "synth", "--name", "base", "--results", str(tmp_path), "--tracking-uri", uri,
                     *(["--force"] if i else [])]) == 0
    return tmp_path


def gate(results, uri, *extra, candidate="cand"):
    return main(["gate", "--baseline", "base", "--candidate", candidate, "--results", str(results),
                 "--tracking-uri", uri, "--bootstrap", "300", *extra])


def test_identical_rerun_passes_and_writes_outputs(results, uri, monkeypatch, tmp_path_factory, capsys):
    summary = tmp_path_factory.mktemp("gh") / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    sweep = make_sweep(results, "cand", EMBEDDED_CELLS, repeats=4, times=log_normal_times(sd=0.02), seed=2)
    assert gate(results, uri) == 0
    out = capsys.readouterr().out
    assert "## Gate PASS" in out and "| cell | metric |" in out
    data = json.loads((sweep / "gate" / "gate.json").read_text())
    assert data["verdict"] == "pass" and data["exit_code"] == 0
    assert len(data["rows"]) == 4 and {r["verdict"] for r in data["rows"]} == {"unchanged"}
    assert all(r["ci_low"] < r["change"] < r["ci_high"] for r in data["rows"])
    assert (sweep / "gate" / "gate.md").read_text().startswith("## Gate PASS")
    assert "## Gate PASS" in summary.read_text()
    from mlflow import MlflowClient

    run = MlflowClient(tracking_uri=uri).get_run(data["mlflow_run_id"])
    assert run.data.tags["bench.kind"] == "gate" and run.data.tags["bench.verdict"] == "pass"
    assert run.data.params["threshold"] == "0.05"
    assert (
        run.data.tags["mlflow.note.content"] == (sweep / "gate" / "gate.md").read_text()
    )  # the run page's description


def test_ten_percent_slowdown_is_a_regression(results, uri, capsys, tmp_path):
    make_sweep(results, "cand", EMBEDDED_CELLS, repeats=4, times=log_normal_times(sd=0.02, delay_s=0.2), seed=3,
               base_extra={"update_delay_s": 0.2})
    out_dir = tmp_path / "gate-out"
    assert gate(results, uri, "--out", str(out_dir)) == 1
    data = json.loads((out_dir / "gate.json").read_text())
    assert data["verdict"] == "regression"
    assert {r["verdict"] for r in data["rows"]} == {"regression"}
    for r in data["rows"]:
        assert 0.07 < r["change"] < 0.13 and r["p_value"] < 0.01
    assert "base settings differ: embedded.update_delay_s: None -> 0.2" in (out_dir / "gate.md").read_text()
    assert "REGRESSION" in capsys.readouterr().out


def test_small_change_below_threshold_is_unchanged(results, uri):
    # 2 % slower with very low noise: significant, but below the 5 % threshold
    make_sweep(results, "cand", EMBEDDED_CELLS, repeats=4, times=log_normal_times(base_s=2.04, sd=0.003), seed=4)
    assert gate(results, uri) == 0


def test_improvement_and_other_metrics(results, uri):
    sweep = make_sweep(results, "cand", EMBEDDED_CELLS, repeats=4, times=log_normal_times(base_s=1.6, sd=0.02), seed=5)
    assert gate(results, uri, "--metric", "step_time,throughput", "--metric", "rollout_share") == 0
    rows = json.loads((sweep / "gate" / "gate.json").read_text())["rows"]
    by = {(r["cell"], r["metric"]): r["verdict"] for r in rows}
    assert by[("all-off", "step_time")] == "improvement"
    assert by[("all-off", "throughput")] == "improvement"  # higher is better
    assert by[("all-off", "rollout_share")] == "unchanged"  # 0.55 of the step in both
    slow = make_sweep(results, "slow", EMBEDDED_CELLS, repeats=4, times=log_normal_times(base_s=2.4, sd=0.02), seed=6)
    assert gate(results, uri, "--metric", "throughput", candidate="slow") == 1
    rows = json.loads((slow / "gate" / "gate.json").read_text())["rows"]
    assert {r["verdict"] for r in rows} == {"regression"} and all(r["change"] < -0.1 for r in rows)


def test_free_ratio_with_one_profiled_step_cannot_be_judged(results, uri, capsys):
    make_sweep(results, "cand", EMBEDDED_CELLS, repeats=4, seed=7)
    assert gate(results, uri, "--metric", "free_ratio") == 3
    err = capsys.readouterr().err
    assert "free_ratio: cannot judge: with 4 + 4 runs the gate sees" in err


def test_too_few_samples_is_an_error_not_a_pass(tmp_path, uri, capsys):
    make_sweep(tmp_path, "synth", [{}], repeats=4, steps=6, seed=1)
    assert main(["baseline", "save", "synth", "--name", "base", "--results", str(tmp_path), "--tracking-uri", uri]) == 0
    make_sweep(tmp_path, "cand", [{}], repeats=1, steps=4, times=log_normal_times(base_s=3.0), seed=2)
    assert gate(tmp_path, uri) == 3
    out, err = capsys.readouterr()
    assert "too few runs: 4 baseline and 1 candidate run(s)" in err
    # "cannot judge" is its own verdict and exit code: never reported as an ERROR
    assert "gate: cannot judge (exit 3)" in out and "ERROR" not in out + err and "error:" not in err
    md = next(tmp_path.glob("cand/*/gate/gate.md")).read_text()
    assert md.startswith("## Gate CANNOT JUDGE") and "**cannot judge**: too few runs" in md
    data = json.loads(next(tmp_path.glob("cand/*/gate/gate.json")).read_text())
    assert data["verdict"] == "cannot judge" and data["exit_code"] == 3 and data["counts"]["cannot judge"] == 1


def test_steps_of_the_same_work_are_paired(tmp_path, uri):
    # a large step-to-step workload spread (the same in every run) hides 10 % from an unpaired test;
    # pairing the steps that did the same work removes it
    times = log_normal_times(sd=0.01, work_sd=0.2)
    for i, seed in enumerate((11, 1)):  # saved from two sweeps: the baseline measures its sweep-to-sweep offset
        make_sweep(tmp_path, "synth", [{}], repeats=1, steps=12, times=times, seed=seed, same_work=True)
        assert main(["baseline", "save", "synth", "--name", "base", "--results", str(tmp_path), "--tracking-uri", uri,
                     *(["--force"] if i else [])]) == 0
    slow = make_sweep(tmp_path, "cand", [{}], repeats=1, steps=12, seed=2, same_work=True,
                      times=log_normal_times(sd=0.01, work_sd=0.2, base_s=2.2))
    # per-step tests are for diagnosis (issue 30): their verdict is shown, the gate cannot judge on it (exit 3)
    assert gate(tmp_path, uri, "--pairing", "auto") == 3
    row = json.loads((slow / "gate" / "gate.json").read_text())["rows"][0]
    assert row["test"].startswith("wilcoxon") and 0.08 < row["change"] < 0.12 and row["ci_low"] > 0.05
    assert row["verdict"] == "cannot judge" and row["judged_verdict"] == "regression"
    assert row["reason"].startswith("per-step comparison, for diagnosis only")
    # the default compares runs: one run per side cannot be judged (exit 3), not a pass
    assert gate(tmp_path, uri) == 3
    row = json.loads((slow / "gate" / "gate.json").read_text())["rows"][0]
    assert row["test"] == "welch t on runs" and row["verdict"] == "cannot judge" and "too few runs" in row["reason"]
    # unpaired steps (a named test), the workload spread makes the comparison too noisy to judge
    assert gate(tmp_path, uri, "--test", "mann-whitney u") == 3
    row = json.loads((slow / "gate" / "gate.json").read_text())["rows"][0]
    assert row["test"] == "mann-whitney u" and row["verdict"] == "noisy" and row["judged_verdict"] == "unchanged"
    assert row["reason"].startswith("too noisy to judge") and row["mde"] > 0.10
    assert gate(tmp_path, uri, "--test", "mann-whitney u", "--max-mde", "0.5") == 3  # a looser limit: unchanged,
    row = json.loads((slow / "gate" / "gate.json").read_text())["rows"][0]  # per step: shown, not decided
    assert row["judged_verdict"] == "unchanged" and row["verdict"] == "cannot judge"
    # other work in the candidate (different response lengths): not paired
    other = make_sweep(tmp_path, "other", [{}], repeats=1, steps=12, seed=3, times=times)
    assert gate(tmp_path, uri, "--pairing", "auto", candidate="other") == 3
    assert json.loads((other / "gate" / "gate.json").read_text())["rows"][0]["test"] == "mann-whitney u"


def test_failed_candidate_runs_are_missing_data_and_a_cell_that_never_runs_is_a_regression(results, uri, capsys):
    # one failed run of four: missing data, the cell is compared on its 3 ok runs (issue 30: was a regression)
    sweep = make_sweep(results, "cand", EMBEDDED_CELLS, repeats=4, seed=8, failed={(1, 0): "oom"},
                       times=log_normal_times(sd=0.02))
    assert gate(results, uri) == 0
    row = next(r for r in json.loads((sweep / "gate" / "gate.json").read_text())["rows"] if r["cell"] == "dynamic_bsz")
    assert row["verdict"] == "unchanged" and row["n_cand"] == 3 and "r0 oom" in row["reason"]
    # every run of the cell failed: the candidate does not run where the baseline did
    sweep = make_sweep(results, "cand2", EMBEDDED_CELLS, repeats=4, seed=8, failed={(1, k): "oom" for k in range(4)})
    assert gate(results, uri, candidate="cand2") == 1
    data = json.loads((sweep / "gate" / "gate.json").read_text())
    failed = [r for r in data["rows"] if r["verdict"] == "failed"]
    assert len(failed) == 1 and "oom" in failed[0]["reason"] and failed[0]["cell"] == "dynamic_bsz"
    assert "**failed**" in capsys.readouterr().out


def test_candidate_input_failure_and_missing_runs_are_errors(results, uri, capsys):
    make_sweep(results, "cand", EMBEDDED_CELLS, repeats=4, seed=9, failed={(0, 0): "bad_input"})
    assert gate(results, uri) == 3
    make_sweep(results, "cand2", EMBEDDED_CELLS, repeats=4, seed=9, pending={(2, 1)})
    assert gate(results, uri, candidate="cand2") == 3
    assert "missing samples" in capsys.readouterr().err


def test_other_engine_or_platform_is_refused(results, uri, capsys):
    make_sweep(results, "cand", [{"dynamic_bsz": 0}], engine="verl", platform="npu", seed=10)
    assert gate(results, uri) == 2
    err = capsys.readouterr().err
    assert "embedded/cpu" in err and "verl/npu" in err
    make_sweep(results, "cand2", EMBEDDED_CELLS, platform="cuda", seed=10)
    assert gate(results, uri, candidate="cand2") == 2
    assert "embedded/cuda" in capsys.readouterr().err


def test_no_matching_cells_and_unknown_inputs(results, uri, capsys):
    make_sweep(results, "cand", [{"dynamic_bsz": 1}], seed=11, engine="embedded")
    # a candidate with one matching cell is judged on it, the others are noted
    assert gate(results, uri) == 0
    make_sweep(results, "odd", [{"rmsnorm_fused": 1, "dynamic_bsz": 1}], seed=12, engine="embedded")
    # levels of the odd sweep include task_queue=None etc. like the baseline; change one factor value to mismatch
    import json as _json

    meta_path = next((results / "odd").glob("*/sweep.json"))
    meta = _json.loads(meta_path.read_text())
    for r in meta["plan"]["runs"]:
        r["levels"]["task_queue"] = 1
    meta_path.write_text(_json.dumps(meta))
    capsys.readouterr()
    assert gate(results, uri, candidate="odd") == 2
    assert "no matching cells" in capsys.readouterr().err
    assert (
        main(["gate", "--baseline", "nope", "--candidate", "cand", "--results", str(results), "--tracking-uri", uri])
        == 2
    )
    assert "unknown baseline" in capsys.readouterr().err
    assert gate(results, uri, candidate="nosuch") == 2
    assert gate(results, uri, "--metric", "speed") == 2
    assert "unknown metric" in capsys.readouterr().err
    assert main(["gate", "--candidate", "cand", "--results", str(results), "--tracking-uri", uri]) == 2
    assert "nothing to check" in capsys.readouterr().err


# -- expect block --------------------------------------------------------------------------------

def test_expect_schema_errors_name_the_key():
    with pytest.raises(BenchError, match=r"m.yaml:2: expect.0.factor: unknown factor 'dyn'"):
        validate_expect([{"factor": "dyn", "at_least": 0.1}], "m.yaml", "name: x\nexpect:\n  - factor: dyn\n")
    with pytest.raises(BenchError, match=r"expect.0.metric: .*step_time"):
        validate_expect([{"factor": "dynamic_bsz", "metric": "speed", "at_least": 0.1}], "m.yaml")
    with pytest.raises(BenchError, match="at_least and/or at_most"):
        validate_expect([{"factor": "dynamic_bsz"}], "m.yaml")
    with pytest.raises(BenchError, match=r"expect.0.vs"):
        validate_expect([{"factor": "dynamic_bsz", "at_least": 0.1, "vs": "ref"}], "m.yaml")
    with pytest.raises(BenchError, match="unknown key"):
        validate_expect([{"factor": "dynamic_bsz", "at_least": 0.1, "by": 2}], "m.yaml")
    assert validate_expect([{"factor": "all", "at_least": 0.3}], "m.yaml")[0].describe() == \
        "all factors on lowers step time by at least 30% vs all-off"


def test_expect_claims_met_not_met_and_na(tmp_path, uri):
    times = log_normal_times(effects={"dynamic_bsz": -0.16, "rmsnorm_fused": -0.02}, sd=0.01)
    expect = [{"factor": "dynamic_bsz", "metric": "step_time", "at_least": 0.10, "vs": "all_off"},
              {"factor": "rmsnorm_fused", "at_least": 0.10},
              {"factor": "task_queue", "at_least": 0.09},
              {"factor": "all", "at_least": 0.05},
              {"factor": "dynamic_bsz", "vs": "all_on", "metric": "throughput", "at_least": 0.1, "at_most": 0.3}]
    sweep = make_sweep(tmp_path, "claims", EMBEDDED_CELLS, repeats=4, times=times, expect=expect, seed=3)
    rc = main(
        ["gate", "--candidate", "claims", "--results", str(tmp_path), "--tracking-uri", uri, "--bootstrap", "200"]
    )
    assert rc == 1  # rmsnorm_fused does not give 10 %
    exp = json.loads((sweep / "gate" / "gate.json").read_text())["expectations"]
    assert [e["result"] for e in exp] == ["met", "not met", "n/a", "met", "met"]
    assert 0.12 < exp[0]["improvement"] < 0.18
    assert exp[0]["improvement_ci"][0] < exp[0]["improvement"] < exp[0]["improvement_ci"][1]
    assert "TASK_QUEUE_ENABLE" in exp[2]["reason"]
    assert exp[4]["cell"] == "rmsnorm_fused+dynamic_bsz" and exp[4]["reference"] == "rmsnorm_fused"
    # --no-expect skips them
    assert main(["gate", "--candidate", "claims", "--results", str(tmp_path), "--no-expect"]) == 2


def test_expect_needs_its_cells(tmp_path, uri, capsys):
    expect = [{"factor": "dynamic_bsz", "at_least": 0.1}]
    make_sweep(tmp_path, "few", [{}, {"rmsnorm_fused": 1}], repeats=4, expect=expect, seed=3)
    assert main(["gate", "--candidate", "few", "--results", str(tmp_path), "--tracking-uri", uri]) == 3
    assert "no compared cell" in capsys.readouterr().err


def test_run_refuses_a_bad_expect_block_before_sweeping(tmp_path, capsys):
    m = tmp_path / "m.yaml"
    m.write_text("name: m\nengine: embedded\nplatform: cpu\nfactors:\n  dynamic_bsz: [off, on]\n"
                 "expect:\n  - factor: dynamic_bsz\n    metric: speed\n    at_least: 0.1\n")
    assert main(["run", str(m), "--dry-run", "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "m.yaml:" in err and "expect.0.metric" in err and "step_time" in err
    m.write_text(m.read_text().replace("speed", "step_time"))
    assert main(["run", str(m), "--dry-run", "--results", str(tmp_path / "r")]) == 0


def test_error_goes_to_the_job_summary_and_bad_baseline_cells_are_refused(results, uri, monkeypatch, tmp_path, capsys):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    make_sweep(results, "cand", EMBEDDED_CELLS, platform="cuda", seed=13)
    assert gate(results, uri) == 2
    assert summary.read_text().startswith("## Gate ERROR") and "embedded/cuda" in summary.read_text()
    # a hand-edited baseline holding a failed cell cannot judge anything
    path = results / "baselines" / "base.json"
    data = json.loads(path.read_text())
    data["cells"][0]["status"] = "failed"
    path.write_text(json.dumps(data))
    make_sweep(results, "cand2", EMBEDDED_CELLS, seed=14)
    assert gate(results, uri, candidate="cand2") == 2
    assert "baseline has unusable cells" in capsys.readouterr().err


def test_contended_runs_are_called_out(tmp_path, uri):
    for i, seed in enumerate((11, 1, 21, 31)):  # "base" saved from 4 sweeps (its offset measured), "once" from one
        make_sweep(tmp_path, "synth", [{}], repeats=4, seed=seed, psi=3.0)
        assert main(["baseline", "save", "synth", "--name", "base", "--results", str(tmp_path), "--tracking-uri", uri,
                     *(["--force"] if i else [])]) == 0
    assert main(["baseline", "save", "synth", "--name", "once", "--results", str(tmp_path), "--tracking-uri", uri]) == 0
    quiet = make_sweep(tmp_path, "quiet", [{}], repeats=4, seed=2, psi=8.0)
    assert gate(tmp_path, uri, candidate="quiet") == 0
    notes = json.loads((quiet / "gate" / "gate.json").read_text())["notes"]
    assert notes[0] == "CPU pressure during the runs (PSI some avg60, highest): baseline 3 %, candidate 8 %"
    busy = make_sweep(tmp_path, "busy", [{}], repeats=4, seed=3, psi=85.0, times=log_normal_times(base_s=2.6))
    # +30 % on a busy machine against a baseline with no measured sweep-to-sweep figure: cannot judge, and why
    assert main(["gate", "--baseline", "once", "--candidate", "busy", "--results", str(tmp_path),
                 "--tracking-uri", uri]) == 3
    md = (busy / "gate" / "gate.md").read_text()
    assert "**contended machine**" in md and "candidate 85 %" in md
    row = json.loads((busy / "gate" / "gate.json").read_text())["rows"][0]
    assert row["change"] > 0.2 and row["reason"].startswith("cannot judge: CPU pressure around the runs 85 %")


def test_a_shift_measured_on_very_noisy_steps_is_not_judged(tmp_path, uri, capsys):
    # what a busy machine does: every step slower by a random amount, the whole sweep shifted
    make_sweep(tmp_path, "synth", [{}], repeats=4, steps=8, seed=1, same_work=True, times=log_normal_times(sd=0.02))
    assert main(["baseline", "save", "synth", "--name", "base", "--results", str(tmp_path), "--tracking-uri", uri]) == 0
    make_sweep(tmp_path, "busy", [{}], repeats=4, steps=8, seed=2, same_work=True,
               times=log_normal_times(base_s=2.8, sd=0.3, run_sd=0.2))
    assert gate(tmp_path, uri, candidate="busy") == 3
    err = capsys.readouterr().err
    assert "cannot judge: with 4 + 4 runs the gate sees" in err
    # the reason is written out whole
    reason = json.loads(next(tmp_path.glob("busy/*/gate/gate.json")).read_text())["rows"][0]["reason"]
    assert len(reason) > 150 and reason.endswith("`gate --interleave`, would let it judge")
    assert "runs per side" in reason
    assert reason in err and reason in next(tmp_path.glob("busy/*/gate/gate.md")).read_text()


def test_run_to_run_shifts_count_as_noise(tmp_path, uri):
    # four repeats per side whose runs sit 10 % apart: the steps alone look precise, the runs do not
    base_t = log_normal_times(sd=0.01, run_sd=0.10)
    make_sweep(tmp_path, "synth", [{}], repeats=4, steps=12, seed=5, same_work=True, times=base_t)
    assert main(["baseline", "save", "synth", "--name", "base", "--results", str(tmp_path), "--tracking-uri", uri]) == 0
    cand = make_sweep(tmp_path, "cand", [{}], repeats=4, steps=12, seed=6, same_work=True, times=base_t)
    assert gate(tmp_path, uri) == 3
    row = json.loads((cand / "gate" / "gate.json").read_text())["rows"][0]
    assert row["verdict"] == "noisy" and row["sd_base"] > 0.04 and row["mde"] > 0.10
    # steady runs: judged
    steady = log_normal_times(sd=0.01)
    for i, seed in enumerate((17, 7, 27, 37)):  # saved from 4 sweeps: its sweep-to-sweep offset measured (3 df)
        make_sweep(tmp_path, "synth2", [{}], repeats=4, steps=12, seed=seed, same_work=True, times=steady)
        assert main(["baseline", "save", "synth2", "--name", "steady", "--results", str(tmp_path),
                     "--tracking-uri", uri, *(["--force"] if i else [])]) == 0
    make_sweep(tmp_path, "cand2", [{}], repeats=4, steps=12, seed=8, same_work=True, times=steady)
    assert main(["gate", "--baseline", "steady", "--candidate", "cand2", "--results", str(tmp_path),
                 "--tracking-uri", uri]) == 0


def test_clip_cuts_long_texts_only_between_sentences():
    from bench.gate.verdicts import clip

    assert clip("short  text\n on two lines") == "short text on two lines"
    text = "First sentence here. " + "x" * 50 + "; second clause " + "y" * 400
    assert clip(text, 100) == "First sentence here. " + "x" * 50 + "; [...]"
    assert clip("z" * 500, 100) == "z" * 500  # no break to cut at: kept whole, never cut mid-word
    from bench.gate.markdown import _cell_text

    assert _cell_text("r0 oom: a | r1 oom: b") == "r0 oom: a \\| r1 oom: b"  # a table cell stays one cell


def test_gate_help_lists_the_exit_codes(capsys):
    assert main(["gate", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "exit codes: 0 pass; 1 regression" in out and "2 bad input" in out and "3 cannot judge" in out
