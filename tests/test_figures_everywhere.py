"""Every figure of a real embedded sweep is the same number wherever it is shown (issue 20).

A small real sweep (the embedded engine, dynamic_bsz off/on, 2 repeats of 4 GRPO steps: step 1 warm-up,
steps 2-3 timed, step 4 profiled) is run, reported, saved as a baseline and gated against itself through the
CLI. Each run's figures are recomputed here from the per-step metrics of its ``record.json`` by their
definitions (docs/results.md), independently of :mod:`bench.measure.run_summary`: a run's value = the median
over its timed steps (Free ratio: over its profiled measured steps), a cell's = the geometric mean over its
ok runs. Then every place is compared with them, for every figure it shows: the record's summary, the MLflow
child run, ``summary.csv``, ``summary.md``, the console table, ``report.json``/``report.md``, the MLflow
parent's metrics and its ``cells.json``, and the gate's samples. Speed-normalized figures (step time,
speedup, tokens/s; the embedded engine logs a speed probe) are compared place against place, and their raw
counterparts against the definitions. A figure no step logged is shown as missing, never as 0.
"""

from __future__ import annotations

import csv
import json
import math
import re

import numpy as np
import pytest
import yaml

from bench.cli import main
from bench.tracking import mlflow_key

pytestmark = pytest.mark.slow

TIMED, PROFILED, MEASURED = [2, 3], [4], [2, 3, 4]


def _geo(values):
    v = [x for x in values if x is not None]
    return float(math.exp(np.mean(np.log(v)))) if v and min(v) > 0 else (float(np.mean(v)) if v else None)


def _run_figures(rec: dict) -> dict:
    """A run's raw figures by their definitions, from the record's per-step metrics."""
    steps = {int(k): v for k, v in rec["steps"].items()}
    st = [steps[s]["timing_s/step"] for s in TIMED]
    mem = [v for s in MEASURED for k, v in steps[s].items() if k.endswith("perf/cpu_memory_used_gb")]
    return {"step_time": float(np.median(st)),
            "cpu_time": float(np.median([steps[s]["timing_s/step_cpu"] for s in TIMED])),
            "rollout_share": float(np.median([steps[s]["timing_s/gen"] / steps[s]["timing_s/step"] for s in TIMED])),
            "throughput": float(np.median([steps[s]["perf/throughput"] for s in TIMED])),
            "free_ratio": float(np.median([rec["free_ratio"][str(s)] for s in PROFILED])),
            "peak_memory_gb": max(mem) if mem else None}


def _f(text: str) -> float | None:
    return None if text in ("", None) else float(text)


def test_every_figure_is_the_same_in_every_place(tmp_path, capsys, monkeypatch):
    from mlflow import MlflowClient

    m = yaml.safe_load(open("matrix/smoke.yaml"))
    m["base"].update(steps=4, profile_steps=[4], warmup_steps=1)
    m["repeats"] = 2
    path = tmp_path / "fig.yaml"
    path.write_text(yaml.safe_dump(m, sort_keys=False))
    monkeypatch.setenv("COLUMNS", "240")  # one console line per table row
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    common = ["--results", str(tmp_path / "res"), "--tracking-uri", uri]
    assert main(["run", str(path), "--order-seed", "3", *common]) == 0
    console = capsys.readouterr().out
    assert main(["report", "smoke", *common]) == 0
    assert main(["baseline", "save", "smoke", "--name", "self", "--alpha", "0.3", *common]) == 0
    sweep = next((tmp_path / "res" / "smoke").glob("2*"))
    gate_out = tmp_path / "gate"
    gate_args = ["--baseline", "self", "--candidate", str(sweep), "--out", str(gate_out), "--alpha", "0.3"]
    assert main(["gate", *gate_args, *common]) in (0, 3)
    capsys.readouterr()

    recs = {(p.parent.parent.name, int(p.parent.name[1:])): json.loads(p.read_text())
            for p in sweep.glob("*/r*/record.json")}
    assert len(recs) == 4
    runs = {k: _run_figures(r) for k, r in recs.items()}
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("smoke")
    children = {(r.data.tags["cell_id"], int(r.data.tags["repeat"])): r.data.metrics
                for r in client.search_runs([exp.experiment_id], "tags.`bench.kind` = 'cell'")}
    # per run: the record's summary and the MLflow child show the definitions' values
    for key, rec in recs.items():
        want, summ, child = runs[key], rec["summary"], children[key]
        assert summ["timed_steps"] == TIMED and summ["profiled_measured_steps"] == PROFILED
        for fig, skey, ckey in (("step_time", "step_time_median_s", "step_time_median_s"),
                                ("cpu_time", "cpu_time_median_s", "cpu_time_median_s"),
                                ("rollout_share", "rollout_share_median", "rollout_share"),
                                ("throughput", "throughput_median", "throughput"),
                                ("free_ratio", "free_ratio_median", "free_ratio"),
                                ("peak_memory_gb", "peak_memory_gb", "peak_memory_gb")):
            assert summ[skey] == pytest.approx(want[fig], rel=1e-12), (key, fig, "record")
            assert child[mlflow_key(ckey)] == pytest.approx(want[fig], rel=1e-9), (key, fig, "MLflow child")
        # the console's line of this run: its raw step time, rollout share and Free ratio (3 decimals)
        label = "all-off" if not rec["levels"].get("dynamic_bsz") else "dynamic_bsz"
        line = f"ok       {label:34} {key[1]:>3} " + " ".join(
            f"{want[f]:.3f}".rjust(w) for f, w in (("step_time", 8), ("rollout_share", 8), ("free_ratio", 6)))
        assert line in console, (key, line)

    summary = {r["label"]: r for r in csv.DictReader((sweep / "summary.csv").open())}
    md = (sweep / "summary.md").read_text()
    report = json.loads((sweep / "report" / "report.json").read_text())
    report_md = (sweep / "report" / "report.md").read_text()
    rep = {r["cell"]: r for r in report["cells"]}
    parent_id = report["sweep"]["parent_run_id"]
    parent = client.get_run(parent_id).data.metrics
    table = json.loads(open(client.download_artifacts(parent_id, "cells.json", str(tmp_path))).read())
    cells_json = {row[table["columns"].index("label")]: dict(zip(table["columns"], row)) for row in table["data"]}
    assert set(summary) == set(rep) == set(cells_json) == {"all-off", "dynamic_bsz"}
    for label, row in summary.items():
        cid = row["cell_id"]
        mine = [runs[(cid, k)] for k in (0, 1)]
        # raw figures: the geometric mean over the runs of the definitions' run values
        for fig, col in (("step_time", "step_time_raw_s"), ("rollout_share", "rollout_share"),
                         ("free_ratio", "free_ratio")):
            assert _f(row[col]) == pytest.approx(_geo([r[fig] for r in mine]), rel=1e-12), (label, col)
        assert _f(row["peak_memory_gb"]) == pytest.approx(max(r["peak_memory_gb"] for r in mine), rel=1e-12)
        # every figure the same in every place that shows it (full precision; 4 significant digits in
        # cells.json; 3 decimals (tokens/s: 1) in the console and the markdown tables)
        places = {"step_time_s": (rep[label]["step_time_s"], parent[mlflow_key(f"step_time_s.{label}")],
                                  cells_json[label]["step time s"], 3),
                  "speedup": (rep[label]["speedup"], parent[mlflow_key(f"speedup.{label}")],
                              cells_json[label]["speedup"], 3),
                  "rollout_share": (rep[label]["rollout_share"], None, cells_json[label]["rollout share"], 3),
                  "free_ratio": (rep[label]["free_ratio"], None, cells_json[label]["Free ratio"], 3),
                  "throughput": (rep[label]["throughput"], None, cells_json[label]["tokens/s"], 1)}
        assert parent[mlflow_key(f"report.speedup.{label}")] == pytest.approx(float(row["speedup"]), rel=1e-12)
        md_row = next(ln for ln in md.splitlines() if ln.startswith(f"| {label} (`"))
        report_row = next(ln for ln in report_md.splitlines() if ln.startswith(f"| {label} |"))
        console_row = next(ln for ln in console.splitlines() if re.match(rf"^{re.escape(label)}\s", ln))
        for col, (in_report, in_parent, in_cells, digits) in places.items():
            value = _f(row[col])
            assert value is not None, (label, col)
            assert in_report == pytest.approx(value, rel=1e-12), (label, col, "report.json")
            if in_parent is not None:
                assert in_parent == pytest.approx(value, rel=1e-12), (label, col, "MLflow parent")
            assert in_cells == float(f"{value:.4g}"), (label, col, "cells.json")
            txt = f"{value:.{digits}f}"
            assert f"| {txt} |" in md_row, (label, col, "summary.md", txt, md_row)
            if col in ("step_time_s", "speedup", "rollout_share", "free_ratio"):
                assert re.search(rf"(^|\s){re.escape(txt)}(\s|$)", console_row), (label, col, "console", txt)
            if col == "speedup":
                assert f"| {txt} [" in report_row, (label, col, "report.md")
        assert _f(row["step_time_raw_s"]) == pytest.approx(_geo([children[(cid, k)][mlflow_key("step_time_median_s")]
                                                                 for k in (0, 1)]), rel=1e-9)

    # MFU and tokens/s per device per phase (issue 46): by definition from each run's steps, its model config and
    # the sweep's measured CPU peak; the same in the record, the MLflow child, summary.csv, report.json and the
    # parent; report.md and summary.md name the phase furthest from the peak
    from bench.measure.flops import training_flops

    peak = json.loads((sweep / "sweep.json").read_text())["machine_peak"]["fp32_flops"]
    assert peak > 0
    run_perf = {}
    for key, rec in recs.items():
        config = json.loads((sweep / key[0] / f"r{key[1]}" / "model_config.json").read_text())
        steps = {int(k): v for k, v in rec["steps"].items()}
        want = {}
        for phase, share in (("gen", 1 / 3), ("old_log_prob", 1 / 3), ("ref", 1 / 3), ("update_actor", 1.0)):
            mfu, tps = [], []
            for s in TIMED:
                row = steps[s]
                length = row["prompt_length/mean"] + row["response_length/mean"]
                n = round(row["perf/total_num_tokens"] / length)
                flops = training_flops(config, [row["perf/total_num_tokens"] / n] * n) * share  # one device: the CPU
                mfu.append(flops / row[f"timing_s/{phase}"] / peak)
                tps.append(row["perf/total_num_tokens"] / row[f"timing_s/{phase}"])
            want[phase] = {"mfu": float(np.median(mfu)), "tokens_per_s_per_device": float(np.median(tps))}
            got = rec["summary"]["phase_perf"][phase]
            for fig in ("mfu", "tokens_per_s_per_device"):
                assert 0 < got[fig] == pytest.approx(want[phase][fig], rel=1e-9), (key, phase, fig, "record")
                assert children[key][f"perf/{fig}/{phase}"] == pytest.approx(want[phase][fig], rel=1e-9), \
                    (key, phase, fig, "MLflow child")
        assert want["gen"]["mfu"] < 1 and rec["summary"]["mfu_basis"]["model_type"] == config["model_type"]
        run_perf[key] = want
    perf_cells = {r["label"]: r for r in report["phase_perf"]["cells"]}
    assert report["phase_perf"]["basis"]["peak_flops"] == peak
    assert "## MFU and tokens/s per device, per phase" in report_md and "## MFU and tokens/s per device" in md
    for label, row in summary.items():
        cid = row["cell_id"]
        for phase in ("gen", "old_log_prob", "ref", "update_actor"):
            value = _geo([run_perf[(cid, k)][phase]["mfu"] for k in (0, 1)])
            assert _f(row[f"mfu_{phase}"]) == pytest.approx(value, rel=1e-9), (label, phase, "summary.csv")
            assert perf_cells[label]["phases"][phase]["mfu"] == pytest.approx(value, rel=1e-9), (label, phase)
            assert parent[mlflow_key(f"perf/mfu/{phase}.{label}")] == pytest.approx(value, rel=1e-9)
            assert parent[mlflow_key(f"report.perf/mfu/{phase}.{cid}")] == pytest.approx(value, rel=1e-9)
        far = min(("gen", "old_log_prob", "ref", "update_actor"), key=lambda p: perf_cells[label]["phases"][p]["mfu"])
        assert perf_cells[label]["furthest_from_peak"] == far
        mfu_md = report_md.split("## MFU and tokens/s per device, per phase")[1]
        assert next(ln for ln in mfu_md.splitlines() if ln.startswith(f"| {label} (`")).endswith(
            {"gen": "rollout (generation)", "old_log_prob": "old log-prob", "ref": "ref log-prob",
             "update_actor": "update actor"}[far] + " |")

    # the gate judges the same runs (each run's value: the median of its timed steps), the sweep against itself
    gate = json.loads((gate_out / "gate.json").read_text())
    for g in gate["rows"]:
        cid = g["candidate_cell_id"]
        per_run = [float(np.median([recs[(cid, k)]["steps"][str(s)]["timing_s/step"] for s in TIMED])) for k in (0, 1)]
        assert g["metric"] == "step_time" and g["n_base"] == g["n_cand"] == len(per_run)
        assert g["cand_median"] == pytest.approx(float(np.median(per_run)), rel=1e-12)
        assert g["change"] == pytest.approx(0.0, abs=1e-12)
