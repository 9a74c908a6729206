"""Small pieces of the reliability work: file modes, signal labels, stray processes, sync and queue."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from bench.core.errors import BenchError
from bench.core.files import atomic_write_json, atomic_write_text
from bench.execution.executors import kill_strays, signal_reason
from bench.records.results import is_no_space


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_writes_keep_the_umask_mode(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        atomic_write_json(tmp_path / "b.json", {"a": 1})
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == mode
    assert (tmp_path / "b.json").stat().st_mode & 0o777 == mode
    assert json.loads((tmp_path / "b.json").read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_sigkill_is_labelled_by_signal_not_as_oom():
    assert signal_reason(signal.SIGKILL, None) == "killed by signal 9 (SIGKILL)"
    assert signal_reason(signal.SIGTERM, 0) == "killed by signal 15 (SIGTERM)"


def test_oom_only_with_cgroup_evidence(monkeypatch):
    import bench.execution.executors as ex

    monkeypatch.setattr(ex, "oom_kills", lambda: 3)
    assert "out of memory (cgroup oom_kill counter 2 -> 3)" in ex.signal_reason(signal.SIGKILL, 2)
    assert "out of memory" not in ex.signal_reason(signal.SIGKILL, 3)


def test_no_space_is_recognised_through_wrapping():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("upload failed") from inner
    except RuntimeError as exc:
        assert is_no_space(exc)
    assert not is_no_space(OSError(errno.EACCES, "Permission denied"))


def test_kill_strays_ends_processes_working_in_the_folder_only(tmp_path):
    inside = tmp_path / "sweep" / "cell" / "r0"
    inside.mkdir(parents=True)
    code = "import time; time.sleep(120)"
    run_env = {**os.environ, "BENCH_RUN_DIR": str(inside)}
    a = subprocess.Popen([sys.executable, "-c", code], cwd=inside, env=run_env, start_new_session=True)
    b = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=run_env | {"BENCH_RUN_DIR": str(tmp_path)},
                         start_new_session=True)
    shell = subprocess.Popen([sys.executable, "-c", code], cwd=inside, start_new_session=True)  # a user in there
    try:
        time.sleep(0.3)
        ended = kill_strays(tmp_path / "sweep")
        assert ended == [a.pid]
        a.wait(timeout=10)  # ended (kill_strays reaped it already, so its status reads 0 or -9)
        assert a.returncode in (0, -signal.SIGKILL)
        time.sleep(0.2)
        assert b.poll() is None and shell.poll() is None
    finally:
        for p in (a, b, shell):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_yaml_duplicate_and_non_string_keys_are_refused():
    import yaml

    from bench.spec.loading import load_yaml

    assert load_yaml("a: 1\nb: {c: 2}\n") == {"a": 1, "b": {"c": 2}}
    with pytest.raises(yaml.YAMLError, match="duplicate key 'c'"):
        load_yaml("b:\n  c: 1\n  c: 2\n")
    with pytest.raises(yaml.YAMLError, match="not a string"):
        load_yaml("1: 2\n")


def test_flag_ranges():
    import argparse

    from bench.cli import check_flag_ranges

    check_flag_ranges(argparse.Namespace(alpha=0.05, bootstrap=100, seed=0, threshold=0.05, n_trials=1))
    for bad in ({"alpha": 0.0}, {"bootstrap": 99}, {"seed": -1}, {"threshold": float("nan")}, {"timeout": 0.0}):
        with pytest.raises(BenchError):
            check_flag_ranges(argparse.Namespace(**bad))


def test_sync_without_store_changes_keeps_the_queue(tmp_path):
    """A queued sweep synced against a store that fails stays queued; against a working store it is emptied."""
    from bench.tracking.upload_queue import QUEUE, queue_upload

    queue_upload(tmp_path, "sqlite:///x.db", "server down", {"metrics": {"sweep_wall_s": 3.0}, "tags": {},
                                                             "status": "FINISHED"})
    data = json.loads((tmp_path / QUEUE).read_text())
    assert data["reason"] == "server down" and data["parent_finish"]["metrics"] == {"sweep_wall_s": 3.0}
    queue_upload(tmp_path, "sqlite:///x.db", "again")  # a later failure keeps the parent's pending finish
    data2 = json.loads((tmp_path / QUEUE).read_text())
    assert data2["parent_finish"]["metrics"] == {"sweep_wall_s": 3.0} and data2["since"] == data["since"]


class _FakeExecutor:
    """Writes a real verl JSONL (fixture) into the run folder: a finished run without running anything."""

    name = "fake"

    def execute(self, launch):
        import shutil
        from pathlib import Path

        from bench.core.process import ExecResult

        fixture = Path(__file__).parent / "fixtures" / "measure" / "verl09_metrics.jsonl"
        shutil.copy(fixture, launch.run_dir / "metrics.jsonl")
        return ExecResult(0, False, 0.1)


def _sweep(tmp_path, uri, steps):
    from bench.execution.sweep import Sweep
    from bench.spec.matrix import Matrix
    from bench.spec.plan import make_plan

    m = Matrix.model_validate({"name": "q", "engine": "embedded", "platform": "cpu",
                               "base": {"steps": steps, "train_batch_size": 4, "n": 2, "ppo_mini_batch_size": 4,
                                        "micro_batch_size_per_gpu": 2},
                               "factors": {"dynamic_bsz": [0, 1]}})
    m.source = "q.yaml"
    plan = make_plan(m)
    return Sweep(m, plan, tmp_path / "res", uri, executor=_FakeExecutor()).run()


def test_uploads_queued_in_an_outage_are_synced_by_the_next_run(tmp_path, monkeypatch):
    """An MLflow failure mid-sweep queues the uploads (the sweep finishes); the next `run` of the matrix
    (another sweep) uploads them first; `sync` afterwards has nothing left to do."""
    from mlflow import MlflowClient

    from bench.tracking import Tracker
    from bench.tracking.upload_queue import QUEUE

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    real = Tracker.log_child
    calls = {"n": 0}

    def flaky(self, *a, **k):
        calls["n"] += 1
        if calls["n"] >= 2:
            raise ConnectionError("server went away")
        return real(self, *a, **k)

    monkeypatch.setattr(Tracker, "log_child", flaky)
    first = _sweep(tmp_path, uri, steps=4)
    assert [r["status"] for r in first.rows] == ["ok", "ok"]
    assert (first.sweep_dir / QUEUE).exists() and calls["n"] == 2  # down after one failure: no third call
    assert len(list(first.sweep_dir.glob("*/r0/mlflow.json"))) == 1
    queue = json.loads((first.sweep_dir / QUEUE).read_text())
    assert queue["parent_finish"]["status"] == "FINISHED" and "sweep_wall_s" in queue["parent_finish"]["metrics"]

    monkeypatch.setattr(Tracker, "log_child", real)
    second = _sweep(tmp_path, uri, steps=5)  # other content: a new sweep of the same matrix
    assert second.sweep_dir != first.sweep_dir
    assert not (first.sweep_dir / QUEUE).exists()
    assert len(list(first.sweep_dir.glob("*/r0/mlflow.json"))) == 2
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("q")
    p1 = client.get_run(first.parent_run_id)
    assert p1.info.status == "FINISHED" and p1.data.metrics["sweep_wall_s"] == pytest.approx(first.wall_s)
    kids = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{first.parent_run_id}'")
    assert len(kids) == 2

    from bench.cli import main

    assert main(["sync", "--results", str(tmp_path / "res"), "--tracking-uri", uri]) == 0
    assert len(client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{first.parent_run_id}'")) == 2

    # a resume of the first sweep keeps its first wall time and overhead, and records its own
    line = next(ln for ln in (first.sweep_dir / "summary.md").read_text().splitlines() if "harness overhead" in ln)
    again = _sweep(tmp_path, uri, steps=4)
    assert again.sweep_dir == first.sweep_dir and (again.executed, again.skipped) == (0, 2)
    md = (first.sweep_dir / "summary.md").read_text()
    assert line in md and "- resumed: invocation 2:" in md
    meta = json.loads((first.sweep_dir / "sweep.json").read_text())
    assert len(meta["invocations"]) == 2 and meta["invocations"][0]["wall_s"] == pytest.approx(first.wall_s)
    p1 = client.get_run(first.parent_run_id)
    assert p1.data.metrics["sweep_wall_s"] == pytest.approx(first.wall_s)
    assert p1.data.metrics["resume1_wall_s"] == pytest.approx(again.wall_s)
