"""The ``history`` command's change points (issue 44), on histories resampled from the harness's own recorded real
runs (``benchmarks/data/recorded_runs_embedded.json``, via ``benchmarks/history_false_alarms.py``: each save draws 6
recorded runs per cell and goes through the real ``history_entry``): a planted 10 % step at save k is found at k, the
same history without the step has no change point, and the command end to end on a baseline file in the real format
(bad inputs: one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
import history_false_alarms as hfa  # noqa: E402
from _badinput import box, check_refused  # noqa: E402, F401, F811 - box: the fixture

#: the recorded cell with the smallest run-to-run spread (SD of log run value 0.057): a 10 % step is 4 SDs of a save
#: of 6 runs there; the benchmark states the rates of the noisier cells (docs/history.md)
QUIET = "rmsnorm_fused+dynamic_bsz"
K = 10


@pytest.fixture(scope="module")
def pool():
    return hfa.load_pool()


def _history(pool, step_at):
    """20 saves of 6 resampled runs per cell; the same draws with and without the step."""
    return hfa.resampled_baseline(pool, np.random.default_rng(44), saves=20, runs=6, step_at=step_at)


def test_a_planted_step_is_found_at_its_save(pool):
    from bench.gate.history import analyse

    res = analyse(_history(pool, K), ["step_time"], 0.01, cell=QUIET)
    (row,) = res["series"]
    assert res["family"] == 1 and len(row["values"]) == 20
    assert [p["index"] for p in row["points"]] == [K]
    p = row["points"][0]
    assert p["position"] == K + 1 and p["before"] == K and p["after"] == 20 - K
    assert p["low"] < math.log(1.1) < p["high"] and 5 < p["change"] < 15, p
    assert p["p"] < 0.01


def test_the_same_history_without_the_step_has_no_change_point(pool):
    from bench.gate.history import analyse

    res = analyse(_history(pool, None), ["step_time", "step_time_normalized"], 0.01)
    assert res["family"] == 8 and len(res["series"]) == 8  # 4 cells x 2 metrics, each at 0.01 / 8
    assert [r["points"] for r in res["series"]] == [[]] * 8
    assert all(r["tested"] and r["tested"][0][1] >= res["alpha_series"] for r in res["series"])


def test_ruptures_split_is_the_permutation_statistics_own(pool):
    """The split ruptures' binary segmentation (rank cost) picks is the largest gain of the statistic the permutation
    test shuffles, and its gain is that statistic over the ranks' variance, on a real resampled series."""
    import ruptures as rpt

    from bench.gate.history import build_series
    from bench.stats.changepoints import split_gains

    (s,) = build_series(_history(pool, K), ["step_time"], cell="all-off")[0]
    algo = rpt.Binseg(model="rank", min_size=2, jump=1).fit(np.array(s.values))
    t, gain = algo.single_bkp(0, len(s.values))
    ranks = algo.cost.ranks.ravel()
    g = split_gains(ranks[None, :])[0]
    assert t == 2 + int(np.argmax(g))
    assert gain == pytest.approx(g.max() / ranks.var(), rel=1e-9)


def test_min_saves_and_permutations():
    from bench.stats.changepoints import min_saves, permutations_for

    assert min_saves(0.01) == 10 and min_saves(0.0025) == 12  # 2 / C(10, 5) = 0.0079; 2 / C(12, 6) = 0.0022
    assert permutations_for(0.01) == 2000 and permutations_for(0.5) == 999


def _write(results: Path, base: dict, name: str = "nightly") -> Path:
    """The baseline file, and proof the real reader accepts it."""
    from bench.gate.baseline import load_baseline

    path = results / "baselines" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(base))
    assert load_baseline(name, results)["history"]
    return path


def test_history_command_end_to_end(pool, tmp_path, monkeypatch):
    """``run_bench.py history`` on a results folder: every series printed with its point, PNGs, history.json, the
    series in MLflow, and ``--fail-on-new`` exits 1 only when the point is among the last N saves."""
    res_dir, out, db = tmp_path / "results", tmp_path / "plots", tmp_path / "ml.db"
    _write(res_dir, _history(pool, K))
    cmd = [sys.executable, str(ROOT / "run_bench.py"), "history", "nightly", "--results", str(res_dir)]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    p = subprocess.run(cmd + ["--fail-on-new", "12", "--out", str(out), "--tracking-uri", f"sqlite:///{db}"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "4 series judged, alpha 0.01 over 4 series" in p.stdout
    assert f"{QUIET} · step_time" in p.stdout and "save 11 (" in p.stdout
    assert "in the last 12 saves" in p.stdout.splitlines()[-1]
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) == 4 and all(f.read_bytes()[:4] == b"\x89PNG" for f in pngs)
    saved = json.loads((out / "history.json").read_text())
    assert [r["label"] for r in saved["series"]] == list(pool["cells"])
    with sqlite3.connect(db) as con:
        kinds = [r[0] for r in con.execute("select value from tags where key = 'bench.kind'")]
        points = con.execute("select count(*) from metrics where key = 'step_time'").fetchone()[0]
    assert sorted(kinds) == ["history"] + ["history-series"] * 4 and points == 4 * 20
    from bench.cli import main  # the same command in-process (cheaper): the point is not among the last 5 saves

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    assert main(["history", "nightly", "--results", str(res_dir), "--fail-on-new", "5"]) == 0


def test_history_bad_inputs(pool, box, capsys):  # noqa: F811 - the fixture
    """Unknown name, too few saves, one series over two machines, ``--fail-on-new 0``: one line, exit 2, nothing
    written (``--out`` is not created); without ``--cell`` the two machines are split and said so."""
    from bench.cli import main

    base = _history(pool, None)
    _write(box / "res", base)
    short = {**base, "history": base["history"][:9]}
    _write(box / "res", short, "short")
    mixed = hfa.resampled_baseline(pool, np.random.default_rng(7), saves=28, runs=6)  # 14 saves on each machine
    for e in mixed["history"][14:]:
        e["machine"] = {**e["machine"], "hostname": "other"}
    _write(box / "res", mixed, "mixed")
    common = ["--results", "res", "--out", "plots"]
    check_refused(box, ["history", "nope", *common], capsys, ("history nope: unknown baseline", "nightly"))
    check_refused(box, ["history", "short", *common], capsys, ("9 saves", "needs at least 12"))
    check_refused(box, ["history", "short", "--cell", QUIET, *common], capsys, ("9 saves", "needs at least 10"))
    check_refused(box, ["history", "mixed", "--cell", QUIET, *common], capsys,
                  ("asks for one series", "2 (matrix, machine, stack) groups", "other ("))
    check_refused(box, ["history", "nightly", "--fail-on-new", "0", *common], capsys,
                  ("--fail-on-new 0", "allowed range [1, "))
    check_refused(box, ["history", "nightly", "--machine", "elsewhere", *common], capsys, "allowed: recorded (")
    assert main(["history", "mixed", "--results", "res"]) == 0
    out = capsys.readouterr().out
    assert "saves from 2 (matrix, machine, stack) groups, split into separate series" in out.splitlines()[0]
    assert out.count("14 saves, no change point") == 8 and "other (" in out  # at 0.01 / 8 a series needs 13
    assert main(["history", "mixed", "--results", "res", "--cell", QUIET, "--machine", "other"]) == 0  # one picked
    out = capsys.readouterr().out
    assert "machine other (" in out and f"{QUIET} · step_time: 14 saves" in out and "groups" not in out


def test_baseline_save_keeps_the_series_fields_and_reads_old_entries(pool, tmp_path):
    """``baseline save --force`` onto a baseline with 24 saves keeps 25 (the sweep-to-sweep SD still over the last
    20) and writes the new entry's commit, matrix, machine, stack and per-cell figures; an entry saved before them
    (log step time only) is read as an unknown machine and stack, split from the others and said so."""
    from _sweeps import EMBEDDED_CELLS, make_sweep

    from bench.gate.baseline import save
    from bench.gate.history import build_series

    old = hfa.resampled_baseline(pool, np.random.default_rng(3), saves=24, runs=2)
    old["history"][0] = {k: old["history"][0][k] for k in ("sweep", "created_at", "log_step_time",
                                                           "log_step_time_normalized")}  # as saved before issue 44
    _write(tmp_path, old, "mix")
    make_sweep(tmp_path, "synth", EMBEDDED_CELLS[:2], repeats=2, seed=1)
    _, snap, _ = save("synth", "mix", tmp_path, None, force=True)
    hist = snap["history"]
    assert len(hist) == 25 and snap["sweep_to_sweep"]["sweeps"] == 20
    new = hist[-1]
    assert new["matrix"] == "synth" and new["git_commit"] == snap["git_commit"]
    assert new["machine"]["cpu_count"] == snap["machine"]["cpu_count"]
    want = {k: v for k, v in snap["versions"].items() if k not in ("mlflow", "optuna")}
    assert new["stack"] == (want or None)  # the sweep's recorded versions (until stacks name themselves)
    fig = new["cells"][snap["cells"][0]["key"]]
    assert fig["runs"] == 2 and math.log(fig["step_time_s"]) == pytest.approx(new["log_step_time"][
        snap["cells"][0]["key"]])
    series, note = build_series(snap, ["step_time"])
    assert "saves from 3 (matrix, machine, stack) groups" in note and "an unknown machine" in note
    assert sorted(len(s.values) for s in series) == [1] * 4 + [1] * 2 + [23] * 4  # old, the new sweep, resampled
