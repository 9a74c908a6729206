"""``run_bench.py compare SWEEP_A SWEEP_B`` and ``gate --baseline <sweep>``: two sweeps compared directly."""

from __future__ import annotations

import json

import pytest
from _sweeps import EMBEDDED_CELLS, log_normal_times, make_sweep

from bench.cli import main


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    from bench.tracking import Tracker

    u = f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"
    Tracker(u, "a")  # create the store once (schema migrations take a few seconds)
    return u


def compare(results, uri, a, b, *extra):
    return main(["compare", a, b, "--results", str(results), "--tracking-uri", uri, "--bootstrap", "300", *extra])


def test_identical_sweeps_without_a_saved_baseline_cannot_be_judged(tmp_path, uri, capsys):
    # a sweep as the reference measures no sweep-to-sweep offset: the within-sweep interval says "unchanged", but
    # two sweeps differ by an offset of their own it ignores, so no step-time row is decided (issue 30: was pass)
    a = make_sweep(tmp_path, "a", EMBEDDED_CELLS, repeats=4, times=log_normal_times(sd=0.02), seed=1)
    b = make_sweep(tmp_path, "b", EMBEDDED_CELLS, repeats=4, times=log_normal_times(sd=0.02), seed=2)
    assert compare(tmp_path, uri, "a", str(b)) == 3
    out = capsys.readouterr().out
    assert out.startswith("## Gate CANNOT JUDGE") and "compare: cannot judge (exit 3)" in out
    data = json.loads((b / "compare" / "gate.json").read_text())
    assert data["baseline"]["kind"] == "sweep" and data["baseline"]["name"] == f"a/{a.name}"
    assert data["baseline"]["file"] == a.name and data["candidate"]["sweep_id"] == b.name
    assert len(data["rows"]) == 4 and {r["judged_verdict"] for r in data["rows"]} == {"unchanged"}
    assert all("the reference is a sweep" in r["reason"] for r in data["rows"])
    assert "expectations" not in data
    assert not (tmp_path / "baselines").exists() and not (b / "gate").exists()  # nothing stored as a baseline
    # a baseline saved from four sweeps carries the offset (on 3 df): compare then decides
    saves = [str(a)]
    for seed in (11, 12, 13):
        saves.append(str(make_sweep(tmp_path, "a", EMBEDDED_CELLS, repeats=4, times=log_normal_times(sd=0.02),
                                    seed=seed)))
    for i, sweep in enumerate(saves):
        assert main(["baseline", "save", sweep, "--name", "twice", "--results", str(tmp_path), "--tracking-uri", uri,
                     *(["--force"] if i else [])]) == 0
    assert compare(tmp_path, uri, "twice", str(b)) == 0
    assert {r["verdict"] for r in json.loads((b / "compare" / "gate.json").read_text())["rows"]} == {"unchanged"}


def test_a_slower_sweep_is_a_regression_via_compare_and_gate(tmp_path, uri, capsys):
    a = make_sweep(tmp_path, "a", EMBEDDED_CELLS, repeats=4, times=log_normal_times(sd=0.02), seed=1)
    b = make_sweep(tmp_path, "b", EMBEDDED_CELLS, repeats=4, times=log_normal_times(sd=0.02, base_s=2.2), seed=3)
    # two sweeps alone measure no sweep-to-sweep offset: the within-sweep interval sees the regression, the gate
    # does not decide on it (exit 3, judged_verdict kept)
    assert compare(tmp_path, uri, str(a), "b") == 3
    rows = json.loads((b / "compare" / "gate.json").read_text())["rows"]
    assert {r["judged_verdict"] for r in rows} == {"regression"} and all(0.06 < r["change"] < 0.14 for r in rows)
    assert "compare: cannot judge (exit 3)" in capsys.readouterr().out
    # the same through gate --baseline <sweep folder>, and the reverse direction is an improvement within sweeps
    assert main(["gate", "--baseline", str(a), "--candidate", "b", "--results", str(tmp_path),
                 "--tracking-uri", uri, "--bootstrap", "300"]) == 3
    gated = json.loads((b / "gate" / "gate.json").read_text())["rows"]
    assert [r["change"] for r in gated] == [r["change"] for r in rows]
    assert compare(tmp_path, uri, "b", "a") == 3
    back = json.loads((a / "compare" / "gate.json").read_text())["rows"]
    assert {r["judged_verdict"] for r in back} == {"improvement"}


def test_too_few_samples_cannot_be_judged(tmp_path, uri, capsys):
    make_sweep(tmp_path, "a", [{}], repeats=1, steps=4, seed=1)
    make_sweep(tmp_path, "b", [{}], repeats=1, steps=4, seed=2)
    assert compare(tmp_path, uri, "a", "b") == 3
    out, err = capsys.readouterr()
    assert "compare: cannot judge (exit 3)" in out and "compare: cannot judge: " in err and "too few runs" in err


def test_bad_inputs_are_one_line_exit_2(tmp_path, uri, capsys):
    make_sweep(tmp_path, "a", EMBEDDED_CELLS, repeats=4, seed=1)
    make_sweep(tmp_path, "cuda", EMBEDDED_CELLS, repeats=4, platform="cuda", seed=2)
    make_sweep(tmp_path, "bad", EMBEDDED_CELLS, repeats=4, seed=3, failed={(1, 0): "oom"})
    cases = [
        (("nosuch", "a"), "SWEEP_A nosuch: neither a baseline nor a sweep: unknown baseline"),
        (("a", "nosuch"), "nosuch: no sweep found"),
        (("a", "cuda"), "embedded/cpu"),
        (("bad", "a"), "1 of 4 cells unusable: dynamic_bsz"),
        (("a", "a", "--threshold", "-1"), "--threshold -1.0: allowed range"),
    ]
    for args, expected in cases:
        assert compare(tmp_path, uri, *args) == 2, args
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and expected in err, (args, err)


def test_compare_help_lists_the_exit_codes(capsys):
    assert main(["compare", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "SWEEP_A SWEEP_B" in out and "3 cannot judge" in out and "2 bad input" in out


def test_gate_baseline_names_win_over_sweeps_and_unknown_names_list_both(tmp_path, uri, capsys):
    make_sweep(tmp_path, "a", EMBEDDED_CELLS, repeats=4, seed=1)
    make_sweep(tmp_path, "b", EMBEDDED_CELLS, repeats=4, seed=2)
    args = ["--results", str(tmp_path), "--tracking-uri", uri, "--bootstrap", "300"]
    assert main(["gate", "--baseline", "zz", "--candidate", "b", *args]) == 2
    err = capsys.readouterr().err
    assert "--baseline zz: neither a baseline nor a sweep: unknown baseline" in err and "no sweep found" in err
    # (exit 3: neither a sweep nor a baseline saved once measures a sweep-to-sweep offset)
    assert main(["gate", "--baseline", "a", "--candidate", "b", *args]) == 3  # matrix a's latest sweep
    assert json.loads(next(tmp_path.glob("b/*/gate/gate.json")).read_text())["baseline"]["kind"] == "sweep"
    assert main(["baseline", "save", "b", "--name", "a", *args[:4]]) == 0  # a baseline named like matrix a
    assert main(["gate", "--baseline", "a", "--candidate", "b", *args]) == 3
    data = json.loads(next(tmp_path.glob("b/*/gate/gate.json")).read_text())
    assert data["baseline"]["kind"] == "baseline" and data["baseline"]["file"] == "a.json"
