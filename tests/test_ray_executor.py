"""The Ray job executor: unit tests with a stand-in client, then a real local Ray head (marked ``ray``).

The real head is started with ``ray start --head --block --num-cpus=2 --num-gpus=0`` on free ports
and its own temp folder, and stopped afterwards (SIGTERM to that ``ray start`` process, which shuts
down what it started; its process group is killed if it does not) even when a test fails.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest

from bench.core.errors import BenchError
from bench.execution.executors import resolve_launch
from bench.execution.ray_executor import RayJobExecutor, refuse_closed_port, submission_id_for

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------- stand-in


class FakeClient:
    """Just enough of JobSubmissionClient: a scripted sequence of statuses and growing logs."""

    def __init__(self, statuses, logs, exit_code=0, message=""):
        self.statuses, self.logs = list(statuses), list(logs)
        self.exit_code, self.message = exit_code, message
        self.submitted, self.stopped = [], []

    def submit_job(self, **kw):
        self.submitted.append(kw)
        return kw["submission_id"]

    def get_job_status(self, sid):
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]

    def get_job_logs(self, sid):
        return self.logs.pop(0) if len(self.logs) > 1 else self.logs[0]

    def get_job_info(self, sid):
        return type("Info", (), {"driver_exit_code": self.exit_code, "message": self.message})()

    def stop_job(self, sid):
        self.stopped.append(sid)
        self.statuses = ["STOPPED"]
        return True


def _launch(tmp_path, argv=None, timeout=30.0, env=None, patches=()):
    rdir = tmp_path / "cell0123" / "r0"
    rdir.mkdir(parents=True)
    return resolve_launch(argv or ["{python}", "-c", "print('hi')"], env or {"FOO": "a b"}, list(patches), rdir,
                          timeout)


def test_submission_env_entrypoint_and_logs(tmp_path):
    launch = _launch(tmp_path, argv=["{python}", "-m", "verl.trainer.main_ppo", "a.b='{run_dir}/x y'", "c=[1,2]"],
                     patches=["qwen3vl_npu_fused:on"])
    client = FakeClient(["PENDING", "RUNNING", "RUNNING", "SUCCEEDED"], ["line1\n", "line1\nline2\n"])
    ex = RayJobExecutor("http://head:8265", poll_s=0.01, log_every_s=0.0, client=client)
    res = ex.execute(launch)
    assert (res.returncode, res.timed_out, res.reason) == (0, False, "")
    sub = client.submitted[0]
    rdir = str(launch.run_dir)
    assert sub["entrypoint"] == (f"cd {rdir} && exec {sys.executable} -m verl.trainer.main_ppo "
                                 f"'a.b='\"'\"'{rdir}/x y'\"'\"'' 'c=[1,2]'")
    env = sub["runtime_env"]["env_vars"]
    assert env["FOO"] == "a b" and env["BENCH_RUN_DIR"] == rdir and env["BENCH_PATCHES"] == "qwen3vl_npu_fused:on"
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(ROOT / "patches"), str(ROOT)]
    assert env["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1"
    assert sub["submission_id"].startswith("bench-cell0123-r0-") and sub["metadata"] == {"bench_run_dir": rdir}
    log = (launch.run_dir / "run.log").read_text()
    assert log.startswith("line1\nline2\n") and "SUCCEEDED (exit code 0)" in log  # each line once


def test_failed_job_and_timeout(tmp_path):
    client = FakeClient(["RUNNING", "FAILED"], ["boom\n"], exit_code=3, message="Job entrypoint failed")
    res = RayJobExecutor("x", poll_s=0.01, client=client).execute(_launch(tmp_path / "a"))
    assert res.returncode == 3 and not res.timed_out
    assert res.reason.startswith("Ray job bench-") and "failed: exit code 3; Job entrypoint failed" in res.reason
    killed = FakeClient(["FAILED"], [""], exit_code=-9)
    assert "SIGKILL (out of memory?)" in RayJobExecutor("x", client=killed).execute(_launch(tmp_path / "b")).reason
    slow = FakeClient(["RUNNING"], ["working\n"])
    res = RayJobExecutor("x", poll_s=0.01, client=slow).execute(_launch(tmp_path / "c", timeout=0.05))
    assert res.timed_out and res.returncode is None and "timed out after 0.05 s" in res.reason
    assert slow.stopped == [slow.submitted[0]["submission_id"]]
    assert "stopped Ray job" in (tmp_path / "c" / "cell0123" / "r0" / "run.log").read_text()


def test_unreachable_cluster_is_a_bench_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BenchError, match=rf"--ray-address http://127.0.0.1:{port}: cannot reach the Ray job server"):
        RayJobExecutor(f"http://127.0.0.1:{port}")
    assert submission_id_for(Path("/r/abc/r1")).startswith("bench-abc-r1-")


@pytest.mark.parametrize("form", ["{p}", "http://{p}", "ray://{p}"])
def test_a_closed_port_is_refused_before_ray_is_asked(form):
    """A bare ``host:port`` is a GCS address to Ray, which rewrites 127.0.0.1 to the node's own IP and retries for
    about 40 s: a refused connection is named at once, in every form of the address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = form.format(p=f"127.0.0.1:{port}")
    with pytest.raises(BenchError, match=rf"--ray-address {address}: cannot reach the Ray job server: nothing "
                                         rf"listens at 127.0.0.1:{port} \(connection refused\)"):
        refuse_closed_port(address)
    refuse_closed_port("auto")  # Ray finds the cluster itself: nothing to probe
    with socket.socket() as s:  # a listening port passes the probe
        s.bind(("127.0.0.1", 0))
        s.listen()
        refuse_closed_port(f"127.0.0.1:{s.getsockname()[1]}")


# ------------------------------------------------------------------------------------ real head


from _rayhead import start_head as _start_head  # noqa: E402


@pytest.fixture(scope="module")
def ray_head():
    """A local Ray head (CPU only, token authentication off) on free ports; yields its job server address."""
    yield from _start_head({"RAY_AUTH_MODE": "disabled"})


TOKEN = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def ray_head_token():
    """A local Ray head that requires token authentication (as Ray 2.60 local clusters do by default)."""
    yield from _start_head({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN})


JOB_CODE = """
import json, os, sys
print("hello from the ray job", flush=True)
if os.environ.get("EXIT"):
    sys.exit(int(os.environ["EXIT"]))
import ray
ray.init()  # inside a job: joins the cluster, as verl's main_ppo does

@ray.remote(num_cpus=0)
def in_worker():
    return {"tq": os.environ.get("TASK_QUEUE_ENABLE"), "patched": "bench_patches" in sys.modules, "pid": os.getpid()}

worker = ray.get(in_worker.remote())
json.dump({"cwd": os.getcwd(), "FOO": os.environ.get("FOO"), "run_dir": os.environ.get("BENCH_RUN_DIR"),
           "tq": os.environ.get("TASK_QUEUE_ENABLE"), "worker": worker, "driver_pid": os.getpid()},
          open("job.json", "w"))
"""


@pytest.mark.ray
def test_jobs_on_a_real_ray_head(ray_head, tmp_path):
    ex = RayJobExecutor(ray_head, poll_s=0.1, log_every_s=1.0, stop_grace_s=20)
    ok = _launch(tmp_path / "ok", argv=["{python}", "-c", JOB_CODE], env={"FOO": "bar", "TASK_QUEUE_ENABLE": "2"},
                 patches=["qwen3vl_npu_fused:off"])
    res = ex.execute(ok)
    assert res.returncode == 0 and not res.timed_out, (ok.run_dir / "run.log").read_text()
    log = (ok.run_dir / "run.log").read_text()
    assert "hello from the ray job" in log and "SUCCEEDED" in log
    seen = json.loads((ok.run_dir / "job.json").read_text())
    worker = seen.pop("worker")
    assert {k: v for k, v in seen.items() if k != "driver_pid"} == {
        "cwd": str(ok.run_dir), "FOO": "bar", "run_dir": str(ok.run_dir), "tq": "2"}
    # env and patches reach the job's driver and the Ray workers it starts (runtime_env + sitecustomize)
    assert worker["tq"] == "2" and worker["patched"] is True and worker["pid"] != seen["driver_pid"]
    reports = {r["pid"]: r for r in (json.loads(p.read_text()) for p in (ok.run_dir / "patches").glob("*.json"))}
    assert reports[seen["driver_pid"]]["role"] == "python-c"
    assert reports[worker["pid"]]["role"] == "ray-worker"
    assert all(r["patches"]["qwen3vl_npu_fused"]["status"] == "armed" for r in reports.values())

    bad = _launch(tmp_path / "bad", argv=["{python}", "-c", JOB_CODE], env={"EXIT": "3"})
    res = ex.execute(bad)
    assert res.returncode == 3 and "exit code 3" in res.reason

    slow = _launch(tmp_path / "slow", argv=["{python}", "-c", "import time; print('sleeping', flush=True); "
                                            "time.sleep(120)"], timeout=3)
    res = ex.execute(slow)
    assert res.timed_out and "stopped" in res.reason
    assert ex.client.get_job_status(ex.last_submission_id).value == "STOPPED"


@pytest.mark.ray
def test_embedded_sweep_through_ray_lands_in_mlflow(ray_head, tmp_path):
    """A small sweep with the embedded engine as the job entrypoint: records, run.log and MLflow as locally."""
    from mlflow import MlflowClient

    from bench.execution.sweep import Sweep
    from bench.spec.loading import load_matrix
    from bench.spec.plan import make_plan

    matrix = load_matrix(ROOT / "matrix" / "smoke.yaml")
    matrix = matrix.model_copy(update={"factors": {"dynamic_bsz": [1]}})  # one cell keeps the test short
    plan = make_plan(matrix)
    assert plan.runs[0].launch.argv[:3] == ["{python}", "-m", "bench.engines.embedded"]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    outcome = Sweep(matrix, plan, tmp_path / "results", uri, executor=RayJobExecutor(ray_head, poll_s=0.1)).run()
    assert (outcome.executed, outcome.failed) == (1, 0), outcome
    rdir = next((tmp_path / "results" / "smoke").glob("*/*/r0"))
    record = json.loads((rdir / "record.json").read_text())
    assert record["status"] == "ok" and len(record["steps"]) == 3
    assert (rdir / "metrics.jsonl").stat().st_size > 0
    assert "Ray job bench-" in (rdir / "run.log").read_text()
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("smoke")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("bench.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("bench.kind") == "cell"]
    assert len(parents) == 1 and len(children) == 1
    assert children[0].data.tags["mlflow.parentRunId"] == parents[0].info.run_id
    assert children[0].data.metrics["step_time_s"] > 0


@pytest.mark.ray
def test_token_auth_cluster(ray_head_token, tmp_path, monkeypatch):
    """A token-auth cluster: no token -> one clear line; token from the environment or a token file -> the
    job runs; the token never reaches the run's environment or files."""
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token of the machine's user
    for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(BenchError, match="requires Ray token authentication.*RAY_AUTH_TOKEN"):
        RayJobExecutor(ray_head_token, poll_s=0.1)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token_file))
    ex = RayJobExecutor(ray_head_token, poll_s=0.1, stop_grace_s=20)
    launch = _launch(
        tmp_path / "ok", argv=["{python}", "-c", "import os; print('job ran', 'RAY_AUTH_TOKEN' in os.environ)"]
    )
    res = ex.execute(launch)
    assert res.returncode == 0, (res.reason, (launch.run_dir / "run.log").read_text())
    assert "job ran" in (launch.run_dir / "run.log").read_text()
    assert TOKEN not in json.dumps(ex.runtime_env(launch))
    from bench.execution.ray_parallel import cluster_nodes  # --parallel lists the nodes with the same token

    (node,) = cluster_nodes(ray_head_token)
    assert node.is_head and len(node.id) == 56
    assert not any(TOKEN in p.read_text(errors="replace") for p in launch.run_dir.rglob("*") if p.is_file())
