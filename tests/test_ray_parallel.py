"""``--parallel``: the runs of a block at once on distinct Ray nodes, the node as a blocking factor.

Without Ray: node counting, the cyclic (Latin square) node assignment, the block loop with a stand-in job
client (blocks sequential, runs of a block overlapping, an exception stops the other jobs), and the report's
model on synthetic records where one node is faster. With a real local 2-node Ray cluster (marked ``ray``:
a head and a second raylet, each ``ray start --block`` with ``--num-cpus=1`` and the custom resource
``bench_node``, every node on 127.0.0.1, all stopped afterwards): the CLI runs an embedded sweep with
``--parallel auto``; each block's runs ran at the same time on distinct nodes, the node is in the record,
the summary and MLflow, and the report's model carries the node factor; an interrupted parallel sweep
leaves no job running and resumes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _sweeps import EMBEDDED_CELLS, log_normal_times, make_sweep

from bench.core.errors import BenchError
from bench.execution.executors import resolve_launch
from bench.execution.ray_executor import RayJobExecutor
from bench.execution.ray_parallel import ClusterNode, RayNodesExecutor, parallel_slots, split_blocks, usable_nodes

ROOT = Path(__file__).resolve().parent.parent


def _nodes(n: int, slots: float = 0.0) -> list[ClusterNode]:
    return [ClusterNode(id=f"{i:02d}" * 28, ip="127.0.0.1", name=f"{i:02d}" * 4, is_head=i == 0, slots=slots)
            for i in range(n)]


def test_parallel_slots_and_usable_nodes():
    nodes = _nodes(3)
    assert parallel_slots("auto", nodes, "A") == 3 and parallel_slots("2", nodes, "A") == 2
    with pytest.raises(BenchError, match=r"--parallel 4: the cluster at A has 3 usable alive node\(s\).*allowed 1-3"):
        parallel_slots(4, nodes, "A")
    for bad in ("0", "x", "-1"):
        with pytest.raises(BenchError, match=rf"--parallel {bad}: allowed values: auto"):
            parallel_slots(bad, nodes, "A")
    with pytest.raises(BenchError, match="no alive node"):
        parallel_slots("auto", [], "A")
    marked = [*_nodes(2, slots=1.0), ClusterNode(id="ff" * 28, ip="127.0.0.1", name="ff" * 4, is_head=False)]
    assert usable_nodes(marked) == (marked[:2], True)  # only the nodes with the bench_node resource
    assert usable_nodes(nodes) == (nodes, False)


def test_cyclic_assignment_is_a_latin_square():
    ex = RayNodesExecutor("A", "auto", ray=RayJobExecutor("A", client=object()), nodes=_nodes(3))
    cells = ["c", "a", "b"]
    seen = {c: [] for c in cells}
    for k in range(3):
        per_node = ex.assign([(c, k) for c in cells])
        assert [len(r) for r in per_node] == [1, 1, 1]  # one run per node in each block
        for j, runs in enumerate(per_node):
            seen[runs[0][0]].append(j)
    assert all(sorted(v) == [0, 1, 2] for v in seen.values())  # every cell once on every node
    # more cells than nodes: each node gets its share, every cell rotates
    ex2 = RayNodesExecutor("A", 2, ray=RayJobExecutor("A", client=object()), nodes=_nodes(3))
    per_node = ex2.assign([(c, 1) for c in "abcd"])
    assert len(per_node) == 2 and sorted(len(r) for r in per_node) == [2, 2]
    assert split_blocks([("a", 0), ("b", 0), ("a", 1)]) == [[("a", 0), ("b", 0)], [("a", 1)]]


class TimedJobs:
    """A stand-in JobSubmissionClient: every job runs ``job_s`` seconds (0.2 s when its run folder's name says
    ``quick``) on the node its label selector names; it records submissions and stops."""

    def __init__(self, job_s: float):
        self.job_s, self.jobs, self.stopped = job_s, {}, []
        self.lock = threading.Lock()

    def submit_job(self, **kw):
        with self.lock:
            self.jobs[kw["submission_id"]] = {"start": time.time(), "node": kw["entrypoint_label_selector"]
                                              ["ray.io/node-id"], "res": kw.get("entrypoint_resources"),
                                              "end": None, "dir": kw["metadata"]["bench_run_dir"]}

    def get_job_status(self, sid):
        job = self.jobs[sid]
        if job["end"] is None and time.time() - job["start"] >= (0.2 if "quick" in job["dir"] else self.job_s):
            job["end"] = time.time()
        if sid in self.stopped:
            return "STOPPED"
        return ("FAILED" if "fail" in job["dir"] else "SUCCEEDED") if job["end"] else "RUNNING"

    def get_job_logs(self, sid):
        return ""

    def get_job_info(self, sid):
        job = self.jobs[sid]
        return type("Info", (), {"driver_exit_code": 3 if "fail" in job["dir"] else 0, "message": "",
                                 "driver_node_id": job["node"],
                                 "start_time": job["start"] * 1000, "end_time": (job["end"] or 0) * 1000})()

    def stop_job(self, sid):
        self.stopped.append(sid)
        self.jobs[sid]["end"] = time.time()


def _launch(tmp_path, name):
    rdir = tmp_path / name
    rdir.mkdir(parents=True, exist_ok=True)
    return resolve_launch(["true"], {}, [], rdir, 30.0)


def test_run_block_overlaps_a_block_and_runs_blocks_in_turn(tmp_path):
    client = TimedJobs(0.4)
    ex = RayNodesExecutor("A", "auto", ray=RayJobExecutor("A", client=client, poll_s=0.02), nodes=_nodes(2, 1.0))
    results = {}

    def run_one(cell, k):
        results[(cell, k)] = ex.execute(_launch(tmp_path, f"{cell}{k}"))

    ex.run_block([(c, k) for k in range(2) for c in ("a", "b")], run_one)
    assert len(results) == 4 and all(r.returncode == 0 for r in results.values())
    for k in range(2):
        a, b = results[("a", k)].node, results[("b", k)].node
        assert a["id"] != b["id"]  # distinct nodes within a block
        assert max(a["job_start"], b["job_start"]) < min(a["job_end"], b["job_end"])  # at the same time
    assert max(results[(c, 0)].node["job_end"] for c in "ab") <= min(results[(c, 1)].node["job_start"] for c in "ab")
    assert results[("a", 0)].node["id"] == results[("b", 1)].node["id"]  # cells rotate over the nodes
    assert all(j["res"] == {"bench_node": 1.0} for j in client.jobs.values())

    # a failed run is a result like any other: the block goes on, the next block runs
    res2 = {}

    def run_or_fail(c, k):
        res2[(c, k)] = ex.execute(_launch(tmp_path, ("fail" if (c, k) == ("a", 2) else "") + f"{c}{k}"))

    ex.run_block([("a", 2), ("b", 2), ("a", 3), ("b", 3)], run_or_fail)
    assert res2[("a", 2)].returncode == 3 and "exit code 3" in res2[("a", 2)].reason
    assert [res2[x].returncode for x in (("b", 2), ("a", 3), ("b", 3))] == [0, 0, 0]

    # an exception in one run of a block: the other run's job is stopped, the exception comes back
    client2 = TimedJobs(30.0)
    ex2 = RayNodesExecutor("A", "auto", ray=RayJobExecutor("A", client=client2, poll_s=0.02, stop_grace_s=2),
                           nodes=_nodes(2))

    def boom(cell, k):
        if cell == "a":  # a short run, then the harness fails (e.g. writing its record on a full disk)
            ex2.execute(_launch(tmp_path, f"quick{cell}{k}"))
            raise OSError(28, "No space left on device")
        ex2.execute(_launch(tmp_path, f"x{cell}{k}"))

    t0 = time.time()
    with pytest.raises(OSError, match="No space"):
        ex2.run_block([("a", 0), ("b", 0), ("a", 1)], boom)
    assert time.time() - t0 < 10 and len(client2.jobs) == 2  # ("a", 1) never started
    assert [client2.jobs[s]["dir"].endswith("xb0") for s in client2.stopped] == [True]  # b's job was stopped


def test_step_stack_of_each_node_thread_is_its_own(tmp_path):
    """The error step ("running cell ... in ...", :class:`bench.core.errors.doing`) of a run stays that run's while
    the runs of a block overlap: with one shared stack a thread's step would be left behind (or another's
    popped) when the jobs end in another order than they started."""
    from bench.core.errors import current_step, doing

    client = TimedJobs(0.4)
    ex = RayNodesExecutor("A", "auto", ray=RayJobExecutor("A", client=client, poll_s=0.02), nodes=_nodes(2, 1.0))
    seen, after = {}, {}

    def run_one(cell, k):
        # cell "a" runs 0.2 s ("quick"), "b" 0.4 s: "a" enters first and leaves first
        name = ("quick" if cell == "a" else "") + f"{cell}{k}"
        with doing(f"running {cell}{k}"):
            ex.execute(_launch(tmp_path, name))  # the harness lock is let go here: the other run enters its step
            seen[(cell, k)] = current_step()
            try:
                with doing(f"recording {cell}{k}"):
                    raise OSError("disk")
            except OSError as exc:
                assert exc.bench_step == f"recording {cell}{k}"
            seen[(cell, k, "after error")] = current_step()
        after[(cell, k)] = current_step()

    ex.run_block([(c, k) for k in range(2) for c in ("a", "b")], run_one)
    for k in range(2):
        for c in "ab":
            assert seen[(c, k)] == seen[(c, k, "after error")] == f"running {c}{k}"
            assert after[(c, k)] is None
    assert current_step() is None  # the calling thread's stack is untouched


def test_node_factor_keeps_a_faster_node_from_posing_as_an_effect(tmp_path):
    """Synthetic records: no factor has an effect, node F is 15 % faster than node S, and the runs with
    rmsnorm_fused on happened to land on F in seven of eight blocks. Without the node factor rmsnorm_fused looks
    like a significant speed-up; with it (the report's model) it is not, and the node is in the model."""
    from bench.cli import main
    from bench.records.figures import Snapshot
    from bench.records.snapshot import snapshot
    from bench.report.tables import _log_runs, effects
    from bench.stats.effects import fit_effects

    base = log_normal_times(sd=0.01, run_sd=0.01)

    def fast(levels, k):
        return bool(levels.get("rmsnorm_fused")) == (k < 7)  # swapped in the last block

    def times(levels, k, step, rng, off):
        return base(levels, k, step, rng, off) * (0.85 if fast(levels, k) else 1.0)

    times.run_sd = 0.01
    sweep = make_sweep(tmp_path, "nodes", EMBEDDED_CELLS, repeats=8, steps=6, times=times, seed=3)
    meta = json.loads((sweep / "sweep.json").read_text())
    meta["order"] = {"kind": "blocked", "seed": 1, "runs": []}
    (sweep / "sweep.json").write_text(json.dumps(meta))
    for rec_path in sweep.glob("*/r*/record.json"):
        rec = json.loads(rec_path.read_text())
        f = fast(rec["levels"], rec["repeat"])
        rec["node"] = {"id": ("f" if f else "5") * 56, "ip": "127.0.0.1", "name": ("f" if f else "5") * 8}
        rec_path.write_text(json.dumps(rec))

    snap = snapshot(sweep, tmp_path)
    m = Snapshot.model_validate(snap)
    logs = _log_runs(m)
    obs, y, blocks = [], [], []
    for c in m.cells:
        for k, v in logs[c.cell_id]:
            obs.append({f: c.levels[f] for f in ("rmsnorm_fused", "dynamic_bsz")})
            y.append(v)
            blocks.append(k)
    naive = {t.name: t for t in fit_effects(obs, y, ["rmsnorm_fused", "dynamic_bsz"], blocks=blocks).terms}
    assert naive["rmsnorm_fused"].significant and naive["rmsnorm_fused"].change < -0.05  # the node posing as an effect

    fit = effects(snap, 0.05)["fit"]
    terms = {t["name"]: t for t in fit["terms"]}
    assert fit["n_nodes"] == 2 and fit["node_columns"] == 1 and fit["n_blocks"] == 8
    assert fit["df_resid"] == 32 - (1 + 7 + 1 + 3)  # runs - (intercept, blocks, node, 2 mains + interaction)
    assert not terms["rmsnorm_fused"]["significant"]
    assert terms["rmsnorm_fused"]["ci_low"] < 0 < terms["rmsnorm_fused"]["ci_high"]
    assert abs(terms["rmsnorm_fused"]["effect"]) < 0.03

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert main(["report", "nodes", "--results", str(tmp_path), "--tracking-uri", uri, "--bootstrap", "100"]) == 0
    data = json.loads((sweep / "report" / "report.json").read_text())
    assert data["effects"]["fit"]["n_nodes"] == 2 and data["replication"]["nodes"] == 2
    md = (sweep / "report" / "report.md").read_text()
    assert "the 2 Ray nodes the runs ran on as a second blocking factor" in md
    assert "**20 residual degrees of freedom**" in md and "and the node (2 Ray nodes)" in md


def test_parallel_needs_a_ray_address(tmp_path, capsys):
    from bench.cli import main

    rc = main(["run", str(ROOT / "matrix" / "smoke.yaml"), "--parallel", "2", "--results", str(tmp_path),
               "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"])
    assert rc == 2
    assert "--parallel 2: needs --ray-address" in capsys.readouterr().err
    assert not (tmp_path / "smoke").exists()


# ------------------------------------------------------------------------------ real 2-node cluster

from _rayhead import start_cluster  # noqa: E402

MATRIX = """
name: raypar
engine: embedded
platform: cpu
base:
  steps: 2
  warmup_steps: 1
  profile_steps: []
  train_batch_size: 4
  n: 2
  ppo_mini_batch_size: 4
  micro_batch_size_per_gpu: 2
  max_prompt_length: 128
  max_response_length: 16
  timeout_s: 300
factors:
  dynamic_bsz: [off, on]
design: full
repeats: 3
"""


@pytest.fixture(scope="module")
def two_nodes():
    """A head and a second raylet on 127.0.0.1, one CPU and one ``bench_node`` each; yields the job server."""
    yield from start_cluster({"RAY_AUTH_MODE": "disabled"},
                             [{"cpus": 1, "resources": {"bench_node": 1}}, {"cpus": 1, "resources": {"bench_node": 1}}])


def _cli(args: list[str], **kw) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "BENCH_RUN_DIR", "BENCH_PATCHES")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen([sys.executable, str(ROOT / "run_bench.py"), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _sweep(results: Path) -> Path:
    (sweep,) = [p for p in (results / "raypar").iterdir() if p.is_dir() and not p.is_symlink()]
    return sweep


def _records(results: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(_sweep(results).glob("*/r*/record.json"))]


@pytest.mark.ray
def test_parallel_sweep_on_two_ray_nodes(two_nodes, tmp_path):
    from mlflow import MlflowClient

    from bench.execution.ray_parallel import cluster_nodes

    matrix = tmp_path / "raypar.yaml"
    matrix.write_text(MATRIX)
    results, uri = tmp_path / "results", f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = _cli(["run", str(matrix), "--ray-address", two_nodes, "--parallel", "auto", "--results", str(results),
                 "--tracking-uri", uri, "--order-seed", "7"])
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    assert "parallel: 2 run(s) at once, one per Ray node (custom resource 'bench_node' + node label)" in out
    nodes = {n.id for n in cluster_nodes(two_nodes)}
    recs = _records(results)
    assert len(recs) == 6 and all(r["status"] == "ok" for r in recs)
    for k in range(3):
        a, b = [r for r in recs if r["repeat"] == k]
        assert {a["node"]["id"], b["node"]["id"]} == nodes  # the two runs of a block on the two nodes
        for t in ("job_start", "job_end"):
            assert t in a["node"] and t in b["node"]
        # Ray's times of the two jobs overlap, and so do the harness's times of the two runs
        assert max(a["node"]["job_start"], b["node"]["job_start"]) < min(a["node"]["job_end"], b["node"]["job_end"])
        assert max(a["started_at"], b["started_at"]) < min(a["finished_at"], b["finished_at"])
        if k:  # blocks in turn: this block started after the previous one ended
            prev = [r for r in recs if r["repeat"] == k - 1]
            assert min(a["started_at"], b["started_at"]) >= max(r["finished_at"] for r in prev)
    sweep = _sweep(results)
    summary = (sweep / "summary.md").read_text()
    assert "Ray node per repeat" in summary and all(n[:8] in summary for n in nodes)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("raypar")
    children = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("bench.kind") == "cell"]
    assert len(children) == 6 and {c.data.tags["bench.node_id"] for c in children} == nodes

    rep = _cli(["report", "raypar", "--results", str(results), "--tracking-uri", uri, "--bootstrap", "100"])
    out, _ = rep.communicate(timeout=300)
    assert rep.returncode == 0, out
    fit = json.loads((sweep / "report" / "report.json").read_text())["effects"]["fit"]
    assert fit["n_nodes"] == 2 and fit["node_columns"] == 1 and fit["df_resid"] == 6 - (1 + 2 + 1 + 1)
    assert "the 2 Ray nodes the runs ran on as a second blocking factor" in (sweep / "report" / "report.md").read_text()


@pytest.mark.ray
def test_interrupted_parallel_sweep_stops_its_jobs_and_resumes(two_nodes, tmp_path):
    from ray.job_submission import JobSubmissionClient

    matrix = tmp_path / "raypar.yaml"
    matrix.write_text(MATRIX.replace("repeats: 3", "repeats: 1").replace("name: raypar", "name: raypar"))
    results, uri = tmp_path / "results", f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = ["run", str(matrix), "--ray-address", two_nodes, "--parallel", "2", "--results", str(results),
            "--tracking-uri", uri]
    jobs = JobSubmissionClient(two_nodes)
    before = {j.submission_id for j in jobs.list_jobs()}
    proc = _cli(args)
    deadline = time.time() + 300
    while True:  # wait until both runs of the block are running as Ray jobs
        mine = [j for j in jobs.list_jobs() if j.submission_id not in before]
        if sum(str(getattr(j.status, "value", j.status)) == "RUNNING" for j in mine) == 2:
            break
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode != 0, out
    mine = [j for j in jobs.list_jobs() if j.submission_id not in before]
    statuses = [str(getattr(j.status, "value", j.status)) for j in mine]
    assert len(mine) == 2 and set(statuses) <= {"STOPPED", "SUCCEEDED"} and "STOPPED" in statuses, statuses
    sweep = _sweep(results)
    assert json.loads((sweep / "sweep.json").read_text())["status"] == "interrupted"
    proc = _cli(args)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    assert "resuming" in out
    recs = _records(results)
    assert len(recs) == 2 and all(r["status"] == "ok" for r in recs)
    assert len({r["node"]["id"] for r in recs}) == 2
