"""A real verl sweep on this CPU: ``run_bench.py --ray-address`` launches ``verl.trainer.main_ppo`` twice
(dynamic bsz off and on) as jobs on a real local Ray head started from the verl stack's own ``ray``, through the
runner, the patches, verl's file logger and profiler, the measurements, MLflow and the report. Needs the verl CPU
stack (``tools/install_verl_cpu.sh``; ``.ci/run`` installs it); about 4 minutes on 2 cores.

The same target without a cluster (a local process per run) is CI's VL run (tests/test_verl_cpu_vl_e2e.py); one
sweep here covers the Ray job path and the text sweep, each verl run costing about 100 s of start-up on 2 cores.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import _verl_stack as verl_stack
import pytest
import yaml

from bench.engines.verl_cpu.target import verl_python

ROOT = Path(__file__).resolve().parent.parent
PY = verl_python()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.heavy,
    pytest.mark.skipif(not verl_stack.has("verl", "vllm"), reason=verl_stack.NOT_INSTALLED),
]


def _matrix(tmp_path: Path) -> Path:
    m = yaml.safe_load((ROOT / "matrix" / "verl_cpu.yaml").read_text())
    m["name"] = "verl_cpu_ci"
    m["base"].update(steps=3, warmup_steps=1, profile_steps=[3], timeout_s=900)
    m["factors"] = {"dynamic_bsz": ["off", "on"]}
    m["design"] = "full"
    m["repeats"] = 1  # one run per cell here (the matrix's default repeats are for verdicts, docs/planning.md)
    path = tmp_path / "verl_cpu_ci.yaml"
    path.write_text(yaml.safe_dump(m))
    return path


@pytest.mark.ray
def test_real_verl_sweep_on_cpu_as_ray_jobs(tmp_path):
    """Each run a job on an existing Ray cluster (``--ray-address``): the cluster is started from the verl
    stack's own ``ray`` (its workers must run that Python) with logical GPU slots for the rank."""
    from _rayhead import start_head
    from mlflow import MlflowClient

    from bench.execution.executors import run_processes

    results = tmp_path / "results"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BENCH_PATCHES", "BENCH_RUN_DIR"))}
    gen = start_head({"RAY_AUTH_MODE": "disabled"}, ray_bin=Path(PY).parent / "ray", cpus=8, gpus=1)
    address = next(gen)
    try:
        argv = [sys.executable, str(ROOT / "run_bench.py"), str(_matrix(tmp_path)), "--results", str(results),
                "--tracking-uri", uri, "--ray-address", address]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    finally:
        gen.close()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]

    sweep = (results / "verl_cpu_ci" / "latest").resolve()
    records = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/r0/record.json"))]
    assert len(records) == 2 and all(r["status"] == "ok" for r in records), [r.get("reason") for r in records]
    by_level = {r["levels"]["dynamic_bsz"]: r for r in records}
    for level, rec in by_level.items():
        rdir = sweep / rec["cell_id"] / "r0"
        # verl's own file logger wrote the JSONL: one line per step, verl's metric names
        lines = [json.loads(x) for x in (rdir / "metrics.jsonl").read_text().splitlines()]
        assert [x["step"] for x in lines] == [1, 2, 3]
        assert {"timing_s/gen", "timing_s/step", "perf/throughput", "timing_s/update_actor"} <= set(lines[0]["data"])
        # verl's torch profiler traced step 3; the Free ratio (host basis on CPU) comes from that trace
        traces = list((rdir / "profile").glob("*step3*.json.gz"))
        assert traces and json.loads(gzip.open(traces[0]).read())["traceEvents"]
        assert set(rec["free_ratio"]) == {"3"} and 0.0 < rec["free_ratio"]["3"] < 1.0
        assert rec["free_ratio_detail"]["3"]["sources"][0]["basis"] == "cpu"
        assert rec["summary"]["timed_steps"] == [2] and 0 < rec["summary"]["rollout_share_median"] < 1
        # verl's driver timed the speed probe after every step (patch verl_speed_probe); the record names its kernel
        assert all(0 < x["data"]["bench/speed_probe_s"] < 1 for x in lines)
        assert rec["evidence"]["speed_probe"]["enabled"] and rec["evidence"]["speed_probe"]["spec"].startswith("matmul")
        # evidence per factor from the run's processes
        assert rec["evidence_verdicts"]["dynamic_bsz"] == "confirmed", rec["evidence"]
        kind = "token-budget" if level else "fixed-size"
        assert kind in rec["evidence"]["dynamic_bsz"]
        assert rec["levels"]["task_queue"] is None and "task_queue" not in rec["evidence_verdicts"]  # n/a: no check
        # the verl CPU workarounds and the factor patches report from the worker processes
        reports = [json.loads(p.read_text()) for p in (rdir / "patches").glob("*.json")]
        roles = {r["role"] for r in reports if r["patches"].get("verl_cpu", {}).get("status") == "applied"}
        assert {"driver", "ray-worker"} <= roles
        # each run was a Ray job that joined the cluster instead of starting one of its own
        log = (rdir / "run.log").read_text()
        assert "Ray job bench-" in log and "SUCCEEDED" in log
        actions = [a for p in (rdir / "patches").glob("driver-*.json")
                   for a in json.loads(p.read_text())["patches"]["verl_cpu"]["actions"]]
        assert any(a.startswith("ray_init_existing: joining the cluster") for a in actions), actions
        # the config verl composed
        cfg = yaml.safe_load((rdir / "hydra" / ".hydra" / "config.yaml").read_text())
        assert cfg["actor_rollout_ref"]["actor"]["use_dynamic_bsz"] is bool(level)
        # a Ray job may run on another node: the harness times no machine-speed probe around it (bench.execution
        # .runner._bracket_probe, local executor only); the verl driver's own probe between steps is asserted above
        assert "machine_probe" not in rec
    # MFU and tokens/s per device per phase against this machine's measured matmul peak (issue 46): the Ray job
    # ran on the loopback head, this machine; FLOPs by verl's counter from the model's config.json
    peak = json.loads((sweep / "sweep.json").read_text())["machine_peak"]["fp32_flops"]
    for rec in records:
        basis, perf = rec["summary"]["mfu_basis"], rec["summary"]["phase_perf"]
        assert basis["peak_flops"] == peak > 0 and basis["model_type"] == "qwen3", basis
        assert basis["flops_source"].startswith("verl.utils.flops_counter"), basis
        assert {"gen", "old_log_prob", "update_actor"} <= set(perf), perf
        for phase, v in perf.items():
            assert 0 < v["mfu"] < 1 and v["tokens_per_s_per_device"] > 0, (phase, v)
            step = rec["steps"][str(rec["summary"]["timed_steps"][0])]
            assert v["tokens_per_s_per_device"] == pytest.approx(
                step["perf/total_num_tokens"] / step[f"timing_s/{phase}"])  # one timed step: its own value
    assert "## MFU and tokens/s per device, per phase" in (sweep / "summary.md").read_text()
    # token-budget micro-batches differ from fixed-size ones: the factor changed the work
    micro = {lv: int(r["evidence"]["dynamic_bsz"].split(" into ")[1].split()[0]) for lv, r in by_level.items()}
    assert micro[0] != micro[1]
    # nothing of the runs outlives them (Ray head, raylet, workers, vLLM engine)
    assert not [p for r in records for p in run_processes(sweep / r["cell_id"] / "r0")]

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("verl_cpu_ci")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("bench.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("bench.kind") == "cell"]
    assert len(parents) == 1 and len(children) == 2
    assert all(c.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for c in children)
    assert all(c.data.tags["evidence.dynamic_bsz"].startswith("confirmed") for c in children)
    assert all(0 < c.data.metrics["perf/mfu/gen"] < 1 and c.data.metrics["perf/tokens_per_s_per_device/gen"] > 0
               for c in children)
    arts = {a.path for a in client.list_artifacts(children[0].info.run_id)}
    assert {"metrics.jsonl", "evidence.json", "verl_config", "patch_reports"} <= arts
    assert [a.path for a in client.list_artifacts(children[0].info.run_id, "verl_config")] == [
        "verl_config/config.yaml", "verl_config/hydra.yaml", "verl_config/overrides.yaml"]

    argv = [sys.executable, str(ROOT / "run_bench.py"), "report", "verl_cpu_ci", "--results", str(results),
            "--tracking-uri", uri]
    rep = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert rep.returncode == 0, rep.stdout[-2000:] + rep.stderr[-2000:]
    report = (sweep / "report" / "report.md").read_text()
    assert "| dynamic_bsz |" in report and "| all-off |" in report
    assert "## MFU and tokens/s per device, per phase" in report and "furthest from peak" in report
