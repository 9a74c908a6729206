"""One sweep, one set of numbers (issue 11): the console table, ``summary.csv``/``summary.md``,
``report.json``/``report.md`` and the MLflow parent run give every cell the same step time and speedup
(all from :mod:`bench.records.figures`), and the tune's best value is the same statistic of its run.

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
from bench.tracking import mlflow_key


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
        assert parent[mlflow_key(f"speedup.{label}")] == pytest.approx(sp, rel=1e-12)
        assert parent[mlflow_key(f"report.speedup.{label}")] == pytest.approx(sp, rel=1e-12)
        assert parent[mlflow_key(f"step_time_s.{label}")] == pytest.approx(st, rel=1e-12)
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


