"""``run_bench.py report``: known effects recovered from synthetic sweeps, report files and rows, MLflow."""

from __future__ import annotations

import json
import math

import pytest
from _sweeps import EMBEDDED_CELLS, log_normal_times, make_sweep

from bench.cli import main
from bench.spec.design import fractional
from bench.spec.matrix import FractionalDesign, Matrix

FILES = ("report.md", "report.json", "effects.csv", "speedup.png", "effects.png", "phases.png", "long_tail.png",
         "article.png")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from bench.tracking import Tracker

    d = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{d}/mlflow.db"
    return uri, Tracker(uri, "npu3")


def _cells3():
    import itertools

    return [dict(zip(("rmsnorm_fused", "dynamic_bsz", "mc2"), lv)) for lv in itertools.product([0, 1], repeat=3)]


def test_full_design_report_recovers_effects_and_writes_files(tmp_path, store):
    uri, tr = store
    pid = tr.start_parent("sweep", {"bench.kind": "sweep"}, {})
    truth = {"dynamic_bsz": -0.16, "mc2": -0.08, "rmsnorm_fused": 0.0}
    inter = {("dynamic_bsz", "mc2"): 0.04}
    times = log_normal_times(effects=truth, interactions=inter, sd=0.02)
    sweep = make_sweep(tmp_path, "npu3", _cells3(), repeats=2, steps=6, engine="verl", platform="npu",
                       times=times, parent_run_id=pid, expect=[{"factor": "dynamic_bsz", "at_least": 0.10}])
    assert main(["report", "npu3", "--results", str(tmp_path), "--tracking-uri", uri, "--bootstrap", "300"]) == 0
    out = sweep / "report"
    for name in FILES:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    data = json.loads((out / "report.json").read_text())
    terms = {t["name"]: t for t in data["effects"]["fit"]["terms"]}
    for name, true in [*truth.items(), ("dynamic_bsz:mc2", 0.04), ("rmsnorm_fused:mc2", 0.0)]:
        assert terms[name]["ci_low"] <= true <= terms[name]["ci_high"], (name, terms[name])
    assert terms["dynamic_bsz"]["p_value"] < 1e-6
    # per cell speedup vs all-off with its interval
    rows = {r["cell"]: r for r in data["cells"]}
    assert rows["all-off"]["speedup"] == 1.0 and len(rows) == 8
    d = rows["dynamic_bsz"]
    expected = math.exp(0.16 + 0.04)  # log all-off - log cell: main effect 0.16, interaction flips sign (x_mc2 = -1)
    assert d["speedup_ci"][0] < expected < d["speedup_ci"][1]
    # article rows: dynamic bsz and mc2 measured, task queue not varied
    art = {a.get("factor", "e2e"): a for a in data["article"]}
    assert art["dynamic_bsz"]["article"] == 0.15 and art["dynamic_bsz"]["ours_effect"] > 0.1
    assert art["task_queue"]["note"] == "not varied in this sweep"
    assert art["e2e"]["article"] == 0.30 and art["e2e"]["ours_cell"] > 0.15
    assert data["mde"]["two_cells"] > 0 and data["mde"]["gate"] > 0.05
    assert data["expectations"][0]["result"] == "met"
    md = (out / "report.md").read_text()
    for label in rows:
        assert f"| {label} |" in md
    for needle in ("## Effects", "dynamic_bsz:mc2", "## Phases", "## Rollout long tail", "## The article's gains",
                   "## Minimal detectable effect", "![phases](phases.png)", "+15.0%"):
        assert needle in md, needle
    csv_lines = (out / "effects.csv").read_text().splitlines()
    assert csv_lines[0].startswith("term,") and len(csv_lines) == 1 + 6
    # logged on the parent run
    run = tr.client.get_run(pid)
    assert run.data.tags["bench.report"] == "report/report.md"
    assert run.data.tags["mlflow.note.content"].startswith("Report (factor effects")  # the run page points at it
    assert main(["report", "npu3", "--results", str(tmp_path), "--tracking-uri", uri, "--bootstrap", "300"]) == 0
    assert tr.client.get_run(pid).data.tags["mlflow.note.content"].count("report/report.md") == 1  # once, rerun or not
    assert "report.effect.dynamic_bsz" in run.data.metrics
    assert {a.path for a in tr.client.list_artifacts(pid, "report")} >= {f"report/{n}" for n in FILES}


def test_fractional_report_states_alias_structure(tmp_path):
    factors = ["rmsnorm_fused", "dynamic_bsz", "forward_prefetch", "mc2"]
    m = Matrix(name="frac", engine="verl", platform="npu", factors={k: [0, 1] for k in factors},
               design=FractionalDesign(type="fractional", generators="a b c abc"))
    design = fractional(m, m.design)
    assert len(design.cells) == 8 and design.resolution == 4
    truth = {"rmsnorm_fused": -0.05, "dynamic_bsz": -0.15, "forward_prefetch": 0.0, "mc2": -0.08}
    cells = [{k: c[k] for k in factors} for c in design.cells]
    sweep = make_sweep(tmp_path, "frac", cells, repeats=2, steps=6, engine="verl", platform="npu",
                       times=log_normal_times(effects=truth, sd=0.02), design={"type": "fractional", "resolution": 4},
                       aliases=design.aliases, resolution=design.resolution)
    assert main(["report", str(sweep), "--results", str(tmp_path), "--tracking-uri", "", "--bootstrap", "200"]) == 0
    data = json.loads((sweep / "report" / "report.json").read_text())
    fit = data["effects"]["fit"]
    terms = {t["name"]: t for t in fit["terms"]}
    for name, true in truth.items():
        assert terms[name]["ci_low"] <= true <= terms[name]["ci_high"], name
    assert len(fit["not_estimable"]) == 3 and all(v.startswith("aliased with") for v in fit["not_estimable"].values())
    md = (sweep / "report" / "report.md").read_text()
    assert "**Fractional design**, resolution 4" in md
    assert "rmsnorm_fused:dynamic_bsz = forward_prefetch:mc2" in md.replace(" ", " ")


def test_embedded_report_names_what_does_not_apply_and_failed_cells(tmp_path, capsys):
    times = log_normal_times(effects={"dynamic_bsz": -0.1}, sd=0.02)
    sweep = make_sweep(tmp_path, "emb", EMBEDDED_CELLS, repeats=2, times=times, failed={(2, 1): "crash"})
    assert main(["report", "emb", "--results", str(tmp_path), "--tracking-uri", "", "--bootstrap", "200"]) == 0
    assert "not finished" in capsys.readouterr().err
    data = json.loads((sweep / "report" / "report.json").read_text())
    art = {a.get("factor", "e2e"): a for a in data["article"]}
    assert art["task_queue"]["note"].startswith("not applicable: TASK_QUEUE_ENABLE")
    assert art["mc2"]["note"].startswith("not applicable: ")
    assert [r["cell"] for r in data["failed"]] == ["rmsnorm_fused"]
    md = (sweep / "report" / "report.md").read_text()
    assert "**Cells not finished**" in md and "r1 crash" in md
    # the two other finished cells still give both main effects (rmsnorm_fused from its ok repeat is left out)
    assert {t["name"] for t in data["effects"]["fit"]["terms"]} >= {"dynamic_bsz", "rmsnorm_fused"}


def test_report_bad_input(tmp_path, capsys):
    assert main(["report", "nosuch", "--results", str(tmp_path), "--tracking-uri", ""]) == 2
    make_sweep(tmp_path, "dead", [{}], repeats=1, failed={(0, 0): "oom"})
    assert main(["report", "dead", "--results", str(tmp_path), "--tracking-uri", ""]) == 2
    assert "no finished cell" in capsys.readouterr().err
    make_sweep(tmp_path, "one", [{}], repeats=2)
    assert main(["report", "one", "--results", str(tmp_path), "--tracking-uri", "", "--alpha", "2"]) == 2
    assert main(["report", "one", "--results", str(tmp_path), "--tracking-uri", ""]) == 0
    assert "no factor varies" in (tmp_path / "one" / "latest" / "report" / "report.md").read_text()
