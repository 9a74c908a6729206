"""What an MLflow user sees of a sweep (issue 13): a real sqlite MLflow store, read back with MLflow's client
(the UI reads the same fields through the same REST API).

- the experiment is a "Machine learning" experiment (``mlflow.experimentKind``) with a description; a
  description a user edited in the UI is kept;
- every run has MLflow's system tags (User, Source, Git commit) and a markdown description;
- a child's Created and Duration are those of the run it mirrors (also when ``sync`` logs it later into
  another store), its headline metrics are the run values of :mod:`bench.records.figures` (the numbers of
  ``summary.csv``), and its description shows those same numbers;
- the parent's description holds the sweep's summary table; a failed child says why on its own page.

The sweeps run :mod:`drift_fake`'s executor (no GRPO steps) except the failing one, which runs the real
embedded engine on a missing dataset.
"""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
from pathlib import Path

import pytest
from drift_fake import DriftExecutor
from test_run_order import small_full

from bench.cli import main
from bench.tracking import EXPERIMENT_KIND, NOTE, REPORT_POINTER, Tracker, git_commit

ROOT = Path(__file__).resolve().parent.parent


def _client(uri):
    from mlflow import MlflowClient

    return MlflowClient(uri)


def _runs(uri: str, experiment: str):
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    return (exp, [r for r in runs if r.data.tags.get("bench.kind") == "sweep"],
            [r for r in runs if r.data.tags.get("bench.kind") == "cell"])


def _assert_system_tags(tags: dict[str, str]) -> None:
    assert tags["mlflow.source.name"] == "run_bench.py" and tags["mlflow.source.type"] == "LOCAL"
    assert tags.get("mlflow.user")  # MLflow's own resolution of the user
    sha = git_commit().removesuffix("+dirty")
    if sha != "unknown":
        assert tags["mlflow.source.git.commit"] == sha
        branch = subprocess.run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
        assert tags.get("mlflow.source.git.branch") == (branch if branch != "HEAD" else None)


def _records(sweep: Path) -> dict[tuple[str, int], dict]:
    return {(r["cell_id"], r["repeat"]): r for r in (json.loads(p.read_text()) for p in sweep.glob("*/r*/record.json"))}


def test_children_show_their_run_as_it_ran_and_the_numbers_of_the_summary(tmp_path, monkeypatch):
    from bench.records.figures import run_value
    from bench.records.snapshot import record_samples
    from bench.tracking.records import run_start
    from bench.tracking.upload_queue import MLFLOW_MARK, sync_sweep

    fake = DriftExecutor(4, seed=3)  # no speed probe: summary.csv holds the raw values too
    monkeypatch.setattr("bench.commands.run.make_executor", lambda *a, **k: fake)
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    path = small_full(tmp_path, repeats=1)
    assert main(["run", str(path), "--order-seed", "5", "--results", str(tmp_path / "res"), "--tracking-uri", uri]) == 0
    sweep = next((tmp_path / "res" / "full").glob("2*"))
    meta = json.loads((sweep / "sweep.json").read_text())
    recs = _records(sweep)
    summary = {r["cell_id"]: r for r in csv.DictReader((sweep / "summary.csv").open())}

    exp, parents, children = _runs(uri, "full")
    assert exp.tags[EXPERIMENT_KIND[0]] == "custom_model_development"
    assert "One **parent run per sweep**" in exp.tags[NOTE]
    assert len(parents) == 1 and len(children) == 4
    parent = parents[0]
    _assert_system_tags(parent.data.tags)
    assert parent.info.start_time == round(meta["created_at"] * 1000)
    note = parent.data.tags[NOTE]
    assert meta["sweep_id"] in note and "4 cells x 1 repeats = 4 runs" in note
    cells_md = (sweep / "summary.md").read_text().split("\n## ")[0]  # the cells table (then MFU per phase)
    md_rows = [ln for ln in cells_md.splitlines() if ln.startswith("|")]
    assert len(md_rows) == 6 and all(ln in note.splitlines() for ln in md_rows)  # header, rule, 4 cells

    for child in children:
        tags, m = child.data.tags, child.data.metrics
        rec = recs[(tags["cell_id"], int(tags["repeat"]))]
        _assert_system_tags(tags)
        assert tags["mlflow.parentRunId"] == parent.info.run_id and child.info.status == "FINISHED"
        # Created and Duration of the run itself, not of the upload
        assert child.info.start_time == round(run_start(rec) * 1000)
        assert child.info.end_time == round(rec["finished_at"] * 1000)
        assert (
            _client(uri).get_metric_history(child.info.run_id, "step_time_median_s")[0].timestamp == child.info.end_time
        )
        # the run values of bench.records.figures, = summary.csv's (one repeat: the cell value is the run value)
        samples = record_samples(rec)
        row = summary[tags["cell_id"]]
        for metric, column in (("step_time_median_s", "step_time_s"), ("rollout_share", "rollout_share"),
                               ("throughput", "throughput")):
            key = {"step_time_median_s": "step_time"}.get(metric, metric)
            assert m[metric] == pytest.approx(run_value(samples[key]), rel=1e-12)
            assert m[metric] == pytest.approx(float(row[column]), rel=1e-9), (metric, row)
        assert "free_ratio" not in m  # no profiler trace on the fake machine: nothing made up
        # ... and the description shows them
        text = tags[NOTE]
        assert f"**{rec['label']}**, repeat 0, cell `{rec['cell_id']}`: **ok**" in text
        assert f"| {m['step_time_median_s']:.3f} s |" in text and f"| {m['throughput']:.1f} tokens/s |" in text
        assert "| Free ratio | n/a |" in text

    # the report's pointer heads the parent's description, and stays when the finished sweep is run again
    common = ["--results", str(tmp_path / "res"), "--tracking-uri", uri]
    assert main(["report", "full", *common]) == 0
    assert main(["run", str(path), *common]) == 0  # resumes the finished sweep: nothing runs, the parent closes again
    text = _client(uri).get_run(parent.info.run_id).data.tags[NOTE]
    assert text.startswith(REPORT_POINTER) and text.count("report/report.md") == 1 and md_rows[-1] in text

    # the store is lost: sync logs the sweep into a fresh one with the same times
    for mark in sweep.glob(f"*/r*/{MLFLOW_MARK}"):
        mark.unlink()
    uri2 = f"sqlite:///{(tmp_path / 'other.db').as_posix()}"
    counts = sync_sweep(sweep, Tracker(uri2, "full"))
    assert counts["children"] == 4 and counts["parents"] == 1
    _, parents2, children2 = _runs(uri2, "full")
    assert parents2[0].info.start_time == round(meta["created_at"] * 1000)
    assert meta["sweep_id"] in parents2[0].data.tags[NOTE]
    for child in children2:
        rec = recs[(child.data.tags["cell_id"], int(child.data.tags["repeat"]))]
        assert (child.info.start_time, child.info.end_time) == (round(run_start(rec) * 1000),
                                                                round(rec["finished_at"] * 1000))


def test_experiment_description_a_user_edited_is_kept(tmp_path):
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    tr = Tracker(uri, "mine")
    exp = _client(uri).get_experiment(tr.experiment_id)
    assert exp.tags[EXPERIMENT_KIND[0]] == EXPERIMENT_KIND[1] and "bench.kind" in exp.tags[NOTE]
    _client(uri).set_experiment_tag(tr.experiment_id, NOTE, "my notes")
    _client(uri).set_experiment_tag(tr.experiment_id, EXPERIMENT_KIND[0], "finetuning")
    Tracker(uri, "mine")  # a later invocation
    assert _client(uri).get_experiment(tr.experiment_id).tags[NOTE] == "my notes"
    assert _client(uri).get_experiment(tr.experiment_id).tags[EXPERIMENT_KIND[0]] == "finetuning"


def test_a_description_longer_than_mlflow_allows_is_cut_not_refused(tmp_path):
    from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    tr = Tracker(uri, "long")
    long = "| row | value |\n" * 2000  # 30000 characters: MLflow refuses such a tag value
    rid = tr.start_parent("p", {"bench.kind": "sweep"}, {}, description=long)
    tr.finish_parent(rid, metrics={}, artifacts=[], status="FINISHED", description=long)
    got = _client(uri).get_run(rid).data.tags[NOTE]
    assert len(got) <= MAX_TAG_VAL_LENGTH and got.endswith("the full text is in the run's artifacts)")
    table = got.split("\n\n")[0].splitlines()
    assert len(table) > 100 and all(ln == "| row | value |" for ln in table)  # cut at a line end: rows stay whole


CRASH = """\
name: crashview
engine: embedded
platform: cpu
base:
  steps: 2
  warmup_steps: 1
  profile_steps: [1]   # the one measured step stays unprofiled (timed)
  train_batch_size: 4
  n: 2
  ppo_mini_batch_size: 4
  micro_batch_size_per_gpu: 2
  max_response_length: 16
  data: BROKEN   # a file that is not a parquet: every run stops at start, recorded as failed
factors:
  dynamic_bsz: [on, off]
design: full
"""


@pytest.mark.slow
def test_a_failed_child_says_why_on_its_own_page(tmp_path):
    from bench.tracking.records import run_start

    (tmp_path / "broken.parquet").write_text("not a parquet file")
    (tmp_path / "crash.yaml").write_text(CRASH.replace("BROKEN", str(tmp_path / "broken.parquet")))
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    assert main(["run", str(tmp_path / "crash.yaml"), "--results", str(tmp_path / "res"), "--tracking-uri", uri]) == 1
    sweep = next((tmp_path / "res" / "crashview").glob("2*"))
    recs = _records(sweep)
    _, parents, children = _runs(uri, "crashview")
    assert len(children) == 2 and parents[0].info.status == "FAILED"
    assert "| failed: r0 bad_input: " in parents[0].data.tags[NOTE]  # the summary table with the failed cells
    for child in children:
        rec = recs[(child.data.tags["cell_id"], 0)]
        text = child.data.tags[NOTE]
        assert child.info.status == "FAILED" and rec["status"] == "failed"
        assert f"Failure ({rec['failure_kind']}): {rec['reason']}" in text and "broken.parquet" in text
        assert "Last lines of `run.log`:" in text
        last = [ln for ln in rec["log_tail"].splitlines() if ln.strip()][-1]
        assert last in text
        assert "| step time, median | n/a |" in text
        assert child.info.end_time - child.info.start_time == round(rec["finished_at"] * 1000) - round(
            run_start(rec) * 1000
        )
        assert not math.isnan(child.info.end_time)


def test_an_interrupted_sweep_says_so_and_shows_running_again_when_resumed(tmp_path):
    from bench.execution.sweep import Sweep
    from bench.spec.loading import load_matrix
    from bench.spec.plan import make_plan

    path = small_full(tmp_path, repeats=1)
    matrix, uri = load_matrix(path), f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    plan = make_plan(matrix)
    with pytest.raises(KeyboardInterrupt):
        Sweep(matrix, plan, tmp_path / "res", uri, executor=DriftExecutor(4, stop_after=2), order_seed=1).run()
    _, [parent], children = _runs(uri, "full")
    assert parent.info.status == "KILLED" and len(children) == 2
    assert "Stopped (interrupted): KeyboardInterrupt" in parent.data.tags[NOTE]
    assert "rerun the same command to resume" in parent.data.tags[NOTE]

    seen = []

    class Watching(DriftExecutor):
        def execute(self, launch):  # the parent's status while the resumed sweep runs
            seen.append(_client(uri).get_run(parent.info.run_id).info.status)
            return super().execute(launch)

    out = Sweep(matrix, plan, tmp_path / "res", uri, executor=Watching(4)).run()
    assert out.parent_run_id == parent.info.run_id and seen == ["RUNNING", "RUNNING"]
    _, [parent], children = _runs(uri, "full")
    assert parent.info.status == "FINISHED" and len(children) == 4
    assert "Stopped" not in parent.data.tags[NOTE] and "| all-off (`" in parent.data.tags[NOTE]


def _artifact_json(uri: str, run_id: str, path: str, dst: Path):
    return json.loads(Path(_client(uri).download_artifacts(run_id, path, str(dst))).read_text())


def test_names_cells_table_step_series_report_page_gate_run_and_system_metrics(tmp_path, monkeypatch):
    """Run names (sweep: matrix, date, short sha; cells: compact label + repeat, full label as bench.label),
    the parent's cells.json (= summary.csv), the step-time series split by step role, system metrics on the
    parent, report.html with the plots embedded, and a compare run nested under the judged sweep's parent."""
    from bench.gate.markdown import RUN_STATUS
    from bench.spec.optimizations import compact_label
    from bench.tracking import sweep_run_name

    monkeypatch.setattr("bench.tracking.SYSTEM_METRICS_INTERVAL_S", 0.2)

    class Slow(DriftExecutor):  # a few tenths of a second per run, so that the monitor samples during the sweep
        def execute(self, launch):
            import time

            time.sleep(0.4)
            return super().execute(launch)

    monkeypatch.setattr("bench.commands.run.make_executor", lambda *a, **k: Slow(4, seed=4))
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    path = small_full(tmp_path, repeats=1)
    common = ["--results", str(tmp_path / "res"), "--tracking-uri", uri]
    assert main(["run", str(path), "--order-seed", "2", *common]) == 0
    sweep = next((tmp_path / "res" / "full").glob("2*"))
    meta = json.loads((sweep / "sweep.json").read_text())
    recs = _records(sweep)
    _, [parent], children = _runs(uri, "full")
    pid = parent.info.run_id

    # names
    assert parent.info.run_name == sweep_run_name("full", meta["created_at"], meta["git_commit"])
    assert parent.data.tags["bench.sweep_id"] == meta["sweep_id"]
    names = set()
    for child in children:
        rec = recs[(child.data.tags["cell_id"], int(child.data.tags["repeat"]))]
        assert child.info.run_name == f"{compact_label(rec['levels'])} r0"
        assert child.data.tags["bench.label"] == rec["label"]
        names.add(child.info.run_name)
        # step time at the timed steps only; warm-up and profiled steps in their own series
        # (the fake machine has no profiler: no profiled step; the real-server test sees one)
        assert rec["summary"]["timed_steps"] == [2, 3, 4] and rec["summary"]["profiled_steps"] == []
        phases = {"": [2, 3, 4], ".warmup": [1], ".profiled": []}
        for suffix, steps in phases.items():
            hist = sorted(
                _client(uri).get_metric_history(child.info.run_id, "step_time_s" + suffix), key=lambda h: h.step
            )
            assert [h.step for h in hist] == steps
            assert [h.value for h in hist] == [rec["steps"][str(s)]["timing_s/step"] for s in steps]
        assert child.data.tags["bench.warmup_steps"] == "1" and child.data.tags["bench.profile_steps"] == "none"
    assert names == {"all-off r0", "dbsz r0", "rms r0", "rms+dbsz r0"}

    # the parent's per-cell table: the values of summary.csv
    table = _artifact_json(uri, pid, "cells.json", tmp_path / "dl")
    rows = [dict(zip(table["columns"], r)) for r in table["data"]]
    summary = {r["cell_id"]: r for r in csv.DictReader((sweep / "summary.csv").open())}
    assert sorted(r["cell id"] for r in rows) == sorted(summary)
    for r in rows:
        s = summary[r["cell id"]]
        assert r["label"] == s["label"] and r["runs ok"] == f"{s['repeats_ok']}/{s['repeats']}"
        assert r["cell"] == compact_label(
            {k: None if s[k] == "n/a" else int(s[k]) for k in ("rmsnorm_fused", "dynamic_bsz")}
        )
        for col, key in (("step time s", "step_time_s"), ("speedup", "speedup"), ("rollout share", "rollout_share"),
                         ("tokens/s", "throughput")):
            assert r[col] == float(f"{float(s[key]):.4g}"), (col, r)  # rounded for reading: 4 significant digits
        # one repeat: no interval (the all-off reference's speedup is 1 by definition)
        assert [r["speedup low"], r["speedup high"]] == ([1.0, 1.0] if r["label"] == "all-off" else [None, None])
        assert r["Free ratio"] is None and s["free_ratio"] == ""
        assert r["dynamic_bsz"] == s["dynamic_bsz"] and "mc2" not in r  # factors that apply nowhere left out
    assert {"path": "cells.json", "type": "table"} in json.loads(
        _client(uri).get_run(pid).data.tags["mlflow.loggedArtifacts"]
    )

    # MLflow's system metrics, sampled on the parent while the sweep ran
    system = [k for k in _client(uri).get_run(pid).data.metrics if k.startswith("system/")]
    assert "system/cpu_utilization_percentage" in system

    # the report as a page the UI renders: report.html beside report.md, every plot embedded
    assert main(["report", "full", *common]) == 0
    listed = [f.path for f in _client(uri).list_artifacts(pid, "report")]
    assert {"report/report.md", "report/report.html"} <= set(listed)
    md = (sweep / "report" / "report.md").read_text()
    pngs = sorted(set(re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", md)))
    assert pngs and all(f"report/{p}" in listed for p in pngs)
    page = Path(_client(uri).download_artifacts(pid, "report/report.html", str(tmp_path / "dl2"))).read_text()
    assert page.count('src="data:image/png;base64,') == len(re.findall(r"!\[[^\]]*\]\([^)]+\.png\)", md))
    assert "<table>" in page and ".png)" not in page

    # a second sweep compared with the first: the compare run is nested under the second's parent
    assert main(["run", str(path), "--force", "--order-seed", "3", *common]) == 0
    second = max((tmp_path / "res" / "full").glob("2*"))
    assert second != sweep
    rc = main(["compare", str(sweep), str(second), "--bootstrap", "200", *common])
    data = json.loads((second / "compare" / "gate.json").read_text())
    run = _client(uri).get_run(data["mlflow_run_id"])
    meta2 = json.loads((second / "sweep.json").read_text())
    assert run.data.tags["mlflow.parentRunId"] == meta2["parent_run_id"]
    assert run.info.experiment_id == parent.info.experiment_id
    assert run.data.tags["bench.verdict"] == data["verdict"] and rc == data["exit_code"]
    assert run.info.status == RUN_STATUS[data["verdict"]]
    assert run.info.run_name == f"gate {meta2['sweep_id']} vs {data['baseline']['name']}: {data['verdict']}"
    gate_rows = _artifact_json(uri, run.info.run_id, "gate_cells.json", tmp_path / "dl3")
    got = [dict(zip(gate_rows["columns"], r)) for r in gate_rows["data"]]
    assert [(g["cell"], g["metric"], g["verdict"]) for g in got] == [
        (r["cell"], r["metric"], r["verdict"]) for r in data["rows"]
    ]
    assert not [k for k in run.data.metrics if "/" in k]  # no per-cell metric names any more
    if data["verdict"] == "cannot judge":
        assert run.info.status == "FINISHED"


def test_compact_labels_of_the_full_plan_differ_in_the_part_the_runs_list_shows():
    """MLflow 3.17's runs list shows about the first 13 characters of a run name: the compact labels of
    matrix/full.yaml's plan differ within their first 12, while summary.md keeps the full labels."""
    from bench.spec.loading import load_matrix
    from bench.spec.optimizations import REGISTRY, compact_label
    from bench.spec.plan import make_plan

    plan = make_plan(load_matrix(ROOT / "matrix" / "full.yaml"))
    compact = [compact_label(r.levels) for r in plan.runs]
    assert len({c[:12] for c in compact}) == len(plan.runs) == 4
    assert "all-off" in compact and [r.label for r in plan.runs if compact_label(r.levels) == "rms+dbsz"] == [
        "rmsnorm_fused+dynamic_bsz"]
    assert len({o.short for o in REGISTRY.values()}) == len(REGISTRY)  # one code per optimization
    assert compact_label({"rmsnorm_fused": 1, "task_queue": 1, "dynamic_bsz": 1}) == "rms+tq=1+dbsz"
    assert compact_label({"task_queue": 2, "mc2": None}) == "tq=2"
