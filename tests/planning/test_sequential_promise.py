"""A sequential sweep keeps its promise (issue 30, findings 6 and 7): after it stops, the report, ``summary.md``, the
console and MLflow show one interval and verdict per decided comparison, the stopping look's repeated confidence
interval (no fixed-sample p value or "significant" beside it; the fixed-sample figures left are labelled as not
covered by the sequential error control), and a resume without ``--sequential`` goes on with the recorded rule."""

from __future__ import annotations

import csv
import json
import math
import shutil
from types import SimpleNamespace

import pytest
from _sweeps import EMBEDDED_CELLS, log_normal_times, make_sweep
from drift_fake import DriftExecutor
from test_run_order import small_full

from bench.cli import main
from bench.core.files import atomic_write_json
from bench.execution.blocks import run_blocks
from bench.planning.sequential import Decision, EffectsStopRule
from bench.records.results import SWEEP
from bench.report.md import ci_pct
from bench.spec.plan import run_order

#: how the report labels a fixed-sample figure beside a sequential sweep's verdicts
NOT_COVERED = "fixed-sample, not covered by the sequential error control"


def _stopped_sweep(tmp_path, *, max_looks=6, expect=()):
    """A synthetic 2x2 sweep (dynamic_bsz 25 % faster, rmsnorm_fused +2 %, 1 % run noise) decided block by block by
    the harness's own block loop and stop rule on its records (as ``run --sequential`` does: no run is executed
    here, every run's record is on disk); the blocks after the stop are removed, as they would never have run.
    Returns (sweep folder, its sweep.json content)."""
    times = log_normal_times(effects={"dynamic_bsz": -0.25, "rmsnorm_fused": 0.02}, sd=0.01, run_sd=0.01)
    sweep = make_sweep(tmp_path, "seq", EMBEDDED_CELLS, repeats=max_looks, steps=6, times=times, seed=5,
                       expect=list(expect))
    meta = json.loads((sweep / SWEEP).read_text())
    order = run_order([r["cell_id"] for r in meta["plan"]["runs"]], max_looks, "blocked", 1)
    meta["order"] = order.model_dump(mode="json")
    rule = EffectsStopRule(max_looks, threshold=0.05, alpha=0.05, claims=meta["matrix"]["expect"])
    todo = [(SimpleNamespace(cell_id=c), k) for c, k in order.runs]
    stopped = run_blocks(todo, lambda spec, k: None, stop_rule=rule, sweep_dir=sweep, meta=meta)
    assert stopped is not None and stopped < max_looks  # it did stop early
    for rdir in sweep.glob("*/r*"):
        if int(rdir.name[1:]) >= stopped:
            shutil.rmtree(rdir)
    atomic_write_json(sweep / SWEEP, meta)
    return sweep, json.loads((sweep / SWEEP).read_text())


def test_report_after_a_sequential_stop_shows_the_stopping_looks_intervals_and_verdicts(tmp_path):
    """Every main effect of the report (report.json, report.md, effects.csv) has the stopping look's estimate,
    repeated interval and verdict, no fixed-sample p value and no "significant"; interactions keep their fixed-sample
    figures labelled as not covered; a step-time claim takes the look's decision."""
    sweep, meta = _stopped_sweep(tmp_path, expect=[{"factor": "dynamic_bsz", "at_least": 0.10, "name": "dbsz"}])
    look = meta["sequential"]["looks"][-1]
    assert look["stop"] and look["look"] == meta["sequential"]["stopped_after"]
    decided = {d["name"]: Decision(**d) for d in look["decisions"]}
    assert {"dynamic_bsz", "rmsnorm_fused", "expect: dbsz"} == set(decided)
    assert main(["report", str(sweep), "--results", str(tmp_path), "--tracking-uri", ""]) == 0
    data = json.loads((sweep / "report" / "report.json").read_text())
    terms = {t["name"]: t for t in data["effects"]["fit"]["terms"]}
    md = (sweep / "report" / "report.md").read_text()
    effects_md = md.split("\n## Effects", 1)[1].split("\n## ", 1)[0]
    rows = {ln.split(" | ")[0].lstrip("| ").strip(): ln for ln in effects_md.splitlines() if ln.startswith("| ")}
    for name in ("dynamic_bsz", "rmsnorm_fused"):
        d, t = decided[name], terms[name]
        assert (t["effect"], t["ci_low"], t["ci_high"]) == (d.estimate, d.lo, d.hi), name
        assert (t["change_ci_low"], t["change_ci_high"]) == (d.change_lo, d.change_hi)
        assert t["verdict"] == d.verdict and t["covered"] is True
        assert t["p_value"] is None and t["p_adjusted"] is None and t["significant"] is None
        row = rows[name]  # the effects table's row: the look's interval and verdict, no p value, no "yes"
        assert ci_pct(d.change_lo, d.change_hi) in row and f"{d.verdict_text()} (sequential)" in row
        assert "| yes |" not in row and "significant" not in row and row.count("| - |") >= 2
    assert decided["dynamic_bsz"].verdict == "faster"
    inter = terms["rmsnorm_fused:dynamic_bsz"]
    assert inter["covered"] is False and inter["interval"] == NOT_COVERED and inter["p_value"] is not None
    assert "rmsnorm_fused:dynamic_bsz †" in rows and NOT_COVERED in md
    # the article's main-effect gain is the same repeated interval (gain = exp(-effect) - 1)
    art = {a.get("factor"): a for a in data["article"]}["dynamic_bsz"]
    assert art["ours_effect_ci"] == [math.expm1(-decided["dynamic_bsz"].hi), math.expm1(-decided["dynamic_bsz"].lo)]
    claim = data["expectations"][0]
    d = decided["expect: dbsz"]
    assert claim["result"] == {"met": "met", "not_met": "not met", "undecided": "undecided"}[d.verdict]
    assert claim["improvement_ci"] == [-d.change_hi, -d.change_lo] and claim["p_value"] is None
    # the verdicts section at the top: one line per comparison, the same figures as the look
    assert data["sequential_verdicts"]["look"] == look["look"]
    for name, d in decided.items():
        assert f"| {name} | {d.verdict_text()} | {d.change:+.1%} | {d.interval_text()} |" in md
    with (sweep / "report" / "effects.csv").open() as f:
        csv_rows = {r["term"]: r for r in csv.DictReader(f)}
    assert csv_rows["dynamic_bsz"]["verdict"] == decided["dynamic_bsz"].verdict
    assert csv_rows["dynamic_bsz"]["interval"] == f"repeated, look {look['look']} of 6"
    assert csv_rows["dynamic_bsz"]["p_value"] == "" and csv_rows["dynamic_bsz"]["p_holm"] == ""
    assert csv_rows["rmsnorm_fused:dynamic_bsz"]["interval"] == NOT_COVERED


def test_a_sequential_sweep_resumed_without_sequential_keeps_its_looks_and_stops_by_its_rule(tmp_path, monkeypatch,
                                                                                                 capsys):
    """``--sequential --threshold 0.04`` interrupted after 6 runs, rerun without ``--sequential``: the resume
    rebuilds the recorded rule (same looks from block 1 on, threshold 0.04) and stops before the planned 6 blocks
    (the unplanned blocks never run); the console's last word, summary.md and the MLflow parent carry the
    stopping look's verdicts. A rerun with ``--sequential`` and another --threshold is refused (exit 2, one line
    naming the recorded values, sweep.json unchanged)."""
    path = small_full(tmp_path, repeats=6)
    model = dict(effects={"dynamic_bsz": math.log(1.4)}, run_sd=0.005, step_sd=0.005, drift=0.02)
    uri = f"sqlite:///{(tmp_path / 'm.db').as_posix()}"

    def sweep(*extra, stop_after=None):
        fake = DriftExecutor(24, seed=3, stop_after=stop_after, **model)
        monkeypatch.setattr("bench.commands.run.make_executor", lambda *a, **k: fake)
        return main(["run", str(path), "--order-seed", "2", "--results", str(tmp_path / "res"), "--tracking-uri", uri,
                     *extra]), fake

    assert sweep("--sequential", "--threshold", "0.04", stop_after=6)[0] == 130
    capsys.readouterr()
    rc, resumed = sweep()  # no --sequential
    out = " ".join(capsys.readouterr().out.split())
    assert rc == 0
    (folder,) = (tmp_path / "res" / "full").glob("2*")
    meta = json.loads((folder / SWEEP).read_text())
    seq = meta["sequential"]
    stopped = seq["stopped_after"]
    assert seq["threshold"] == 0.04 and seq["alpha"] == 0.05 and seq["max_looks"] == 6
    assert stopped is not None and stopped < 6 and [lk["look"] for lk in seq["looks"]] == list(range(1, stopped + 1))
    last = seq["looks"][-1]
    assert last["stop"] and last["reason"].startswith("every comparison decided")
    assert all(d["threshold"] == 0.04 for d in last["decisions"])
    assert len(resumed.calls) == 4 * stopped - 6 and len(list(folder.glob("*/r*/record.json"))) == 4 * stopped
    decided = [Decision(**d) for d in last["decisions"]]
    assert {d.name: d.verdict for d in decided}["dynamic_bsz"] == "slower"
    assert "verdicts of this fixed design" not in out and "verdicts of this sequential sweep" in out
    assert all(d.text() in out for d in decided)
    summary = (folder / "summary.md").read_text()
    assert "## Sequential verdicts" in summary
    assert all(f"| {d.name} | {d.verdict_text()} | {d.change:+.1%} | {d.interval_text()} |" in summary
               for d in decided)
    from bench.tracking import Tracker

    run = Tracker(uri, "full").client.get_run(meta["parent_run_id"])
    got = {d.name: d for d in decided}["dynamic_bsz"]
    assert run.data.metrics["sequential.change_low.dynamic_bsz"] == pytest.approx(got.change_lo, rel=1e-9)
    assert run.data.metrics["sequential.change_high.dynamic_bsz"] == pytest.approx(got.change_hi, rel=1e-9)
    assert run.data.tags["bench.sequential.verdict.dynamic_bsz"].startswith(got.verdict_text())

    before = (folder / SWEEP).read_bytes()
    capsys.readouterr()
    rc, refused = sweep("--sequential")  # threshold 0.05 now, 0.04 recorded
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(refused.calls) == 0 and (folder / SWEEP).read_bytes() == before
    assert len(err) == 1 and "--threshold 0.04 --alpha 0.05" in err[0] and "--force" in err[0]
