"""End to end on the embedded engine: real GRPO runs -> results folder -> MLflow (sqlite and server)."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "matrix" / "smoke.yaml"
pytestmark = pytest.mark.slow


def bench(args, cwd, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, str(ROOT / "run_bench.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900, **kw)


def runs_of(uri: str, experiment: str):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("bench.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("bench.kind") == "cell"]
    return client, parents, children


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_smoke_sweep_against_a_real_mlflow_server_then_resume(tmp_path):
    port = free_port()
    store = f"sqlite:///{tmp_path / 'server.db'}"
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store,
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                               "--artifacts-destination", str(tmp_path / "artifacts")],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(1)
        p = bench([str(SMOKE), "--results", "res", "--tracking-uri", uri], tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "executed 2, cached 0, failed 0" in p.stdout
        assert "harness overhead" in p.stdout
        client, parents, children = runs_of(uri, "smoke")
        assert len(parents) == 1 and len(children) == 2
        parent = parents[0].info.run_id
        for child in children:
            assert child.data.tags["mlflow.parentRunId"] == parent
            m = child.data.metrics
            assert 0 < m["step_time_s"] < 60
            assert 0 < m["rollout_share"] < 1
            assert 0 <= m["free_ratio"] < 1
            assert child.data.params["factor.dynamic_bsz"] in ("0", "1")
            assert child.data.params["factor.mc2"] == "n/a"
            # per-step series with their step index
            hist = client.get_metric_history(child.info.run_id, "timing_s/step")
            assert sorted(h.step for h in hist) == [1, 2, 3]
        assert "harness_overhead_share" in client.get_run(parent).data.metrics

        sweep = (tmp_path / "res" / "smoke" / "latest").resolve()
        # what the MLflow UI shows through the server: Created/Duration of the runs themselves, descriptions,
        # MLflow's system tags, a "Machine learning" experiment
        assert client.get_experiment_by_name("smoke").tags["mlflow.experimentKind"] == "custom_model_development"
        for child in children:
            rec = json.loads((sweep / child.data.tags["cell_id"] / "r0" / "record.json").read_text())
            assert child.info.start_time == round((rec["finished_at"] - rec["wall_s"]) * 1000)  # the run's own clock
            assert child.info.end_time == round(rec["finished_at"] * 1000)
            assert child.info.end_time - child.info.start_time > 500  # a real run: not the upload's few ms
            assert f"**{rec['label']}**" in child.data.tags["mlflow.note.content"]
            assert child.data.tags["mlflow.source.name"] == "run_bench.py"
        assert "| all-off (`" in client.get_run(parent).data.tags["mlflow.note.content"]
        rows = list(csv.DictReader(open(sweep / "summary.csv")))
        assert [r["dynamic_bsz"] for r in rows] == ["0", "1"]
        assert rows[0]["speedup"] and abs(float(rows[0]["speedup"]) - 1.0) < 1e-9
        rec = json.loads(next(sweep.glob("*/r0/record.json")).read_text())
        assert rec["summary"]["timed_steps"] == [2] and rec["summary"]["profiled_steps"] == [3]

        # names, step roles, trace and profiler summary, system metrics, durations: through the server
        from bench.spec.optimizations import compact_label
        from bench.tracking import ML_VIEW, sweep_run_name

        meta = json.loads((sweep / "sweep.json").read_text())
        prun = client.get_run(parent)
        assert prun.info.run_name == sweep_run_name("smoke", meta["created_at"], meta["git_commit"])
        assert f"/#/experiments/{prun.info.experiment_id}/runs/{parent}?{ML_VIEW}" in p.stdout  # the printed link
        assert any(k.startswith("system/") for k in prun.data.metrics)  # MLflow's system metrics during the sweep
        cells = json.loads(open(client.download_artifacts(parent, "cells.json", str(tmp_path / "dl"))).read())
        assert sorted(r[cells["columns"].index("cell id")] for r in cells["data"]) == sorted(r["cell_id"] for r in rows)
        for child in children:
            rid, tags = child.info.run_id, child.data.tags
            rec = json.loads((sweep / tags["cell_id"] / "r0" / "record.json").read_text())
            assert child.info.run_name == f"{compact_label(rec['levels'])} r0" and tags["bench.label"] == rec["label"]
            for key, steps in (("step_time_s", [2]), ("step_time_s.warmup", [1]), ("step_time_s.profiled", [3])):
                hist = client.get_metric_history(rid, key)
                assert [(h.step, h.value) for h in hist] == [(s, rec["steps"][str(s)]["timing_s/step"]) for s in steps]
            assert (tags["bench.warmup_steps"], tags["bench.profile_steps"]) == ("1", "3")
            duration = (child.info.end_time - child.info.start_time) / 1000
            assert abs(duration - rec["wall_s"]) <= 0.1 * rec["wall_s"], (duration, rec["wall_s"])
            traces = [f.path for f in client.list_artifacts(rid, "trace")]
            assert traces == ["trace/steps_3-3.json.gz"] and tags["bench.trace"].startswith("trace/steps_3-3.json.gz (")
            import gzip

            raw = gzip.open(client.download_artifacts(rid, traces[0], str(tmp_path / "dl" / rid))).read()
            assert raw == (sweep / tags["cell_id"] / "r0" / "trace" / "steps_3-3.json").read_bytes()
            prof = json.loads(
                open(client.download_artifacts(rid, "profile_summary.json", str(tmp_path / "dl" / rid))).read()
            )
            assert prof["free_ratio"] == pytest.approx(m_free := child.data.metrics["free_ratio"]) and 0 <= m_free < 1
            assert prof["steps"]["3"]["basis"] == ["cpu"] and prof["steps"]["3"]["free_ratio"] == rec["free_ratio"]["3"]

        # a comparison of the sweep with itself: a gate run nested under the sweep's parent, its verdict as status
        pc = bench(
            ["compare", "smoke", "smoke", "--results", "res", "--tracking-uri", uri, "--bootstrap", "200"], tmp_path
        )
        gate = json.loads((sweep / "compare" / "gate.json").read_text())
        grun = client.get_run(gate["mlflow_run_id"])
        assert pc.returncode == gate["exit_code"] and grun.data.tags["mlflow.parentRunId"] == parent
        assert grun.data.tags["bench.verdict"] == gate["verdict"]
        assert (
            grun.info.status
            == {"pass": "FINISHED", "regression": "FAILED", "cannot judge": "FINISHED"}[gate["verdict"]]
        )
        assert "gate_cells.json" in [f.path for f in client.list_artifacts(grun.info.run_id)]

        # same matrix again: resumes the sweep, runs nothing, logs nothing twice
        p2 = bench([str(SMOKE), "--results", "res", "--tracking-uri", uri], tmp_path)
        assert p2.returncode == 0, p2.stderr
        assert "executed 0, cached 2, failed 0" in p2.stdout
        _, parents2, children2 = runs_of(uri, "smoke")
        assert len(parents2) == 1 and len(children2) == 2
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


CRASH = """\
name: crash
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
  data: BROKEN   # a file that is not a parquet: every run stops at start, recorded as failed, the sweep goes on
factors:
  dynamic_bsz: [on, off]
design: full
"""


def test_failing_run_is_recorded_and_the_sweep_goes_on(tmp_path):
    (tmp_path / "broken.parquet").write_text("not a parquet file")
    (tmp_path / "crash.yaml").write_text(CRASH.replace("BROKEN", str(tmp_path / "broken.parquet")))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    p = bench(["crash.yaml", "--results", "res", "--tracking-uri", uri], tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "2 cell(s) not ok" in err[0] and "Traceback" not in p.stderr, p.stderr
    sweep = (tmp_path / "res" / "crash" / "latest").resolve()
    recs = {r["levels"]["dynamic_bsz"]: r for r in
            (json.loads(x.read_text()) for x in sweep.glob("*/r0/record.json"))}
    assert sorted(recs) == [0, 1]  # the first failure did not stop the sweep
    for rec in recs.values():
        assert rec["status"] == "failed" and rec["failure_kind"] == "bad_input"
        assert "broken.parquet" in rec["reason"] and rec["log_tail"]
    _, parents, children = runs_of(uri, "crash")
    assert len(parents) == 1 and sorted(c.data.tags["status"] for c in children) == ["failed", "failed"]
