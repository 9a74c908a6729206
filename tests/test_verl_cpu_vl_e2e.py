"""A real VL verl run on this CPU (CI's VL run): ``run_bench.py matrix/verl_cpu_vl.yaml`` launches
``verl.trainer.main_ppo`` on the tiny Qwen3-VL (``builtin:qwen3vl-tiny``) with image prompts (``builtin:vl``),
through the runner, the patches, verl's file logger and profiler, the measurements, MLflow and the report.
The run is the matrix's ``mrope_cache`` cell (cell a16e97746568: the MRoPE cache on in vLLM, every other factor
off), so it also shows the cache acting in the vLLM process, and the Free ratio, phases and rollout long tail
of a VL run in the record and the report.

How the test knows the images took part (the evidence counters of ``bench_patches.verl_evidence``):

- rollout: vLLM's engine core received requests carrying image items, and their prompt token counts include
  the image placeholder tokens those items fill (``vllm_requests``);
- training: the Qwen3-VL vision tower ran forwards over the images in the actor/ref worker
  (``vision_forwards``).

Needs the verl CPU stack with torchvision (``tools/install_verl_cpu.sh``; ``.ci/run`` installs it); about
6-8 minutes on 2 cores (one run: start-up about 3-4 minutes, then 3 steps).
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
_READY = verl_stack.has("verl", "vllm", "torchvision")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.heavy,
    pytest.mark.skipif(not _READY, reason="the verl CPU stack with torchvision is not installed "
                                          "(bash tools/install_verl_cpu.sh)"),
]


def _counters(rdir: Path) -> list[tuple[str, dict]]:
    out = []
    for path in (rdir / "patches").glob("*.json"):
        rep = json.loads(path.read_text())
        out.append((rep["role"], rep["patches"].get("verl_evidence", {}).get("counters") or {}))
    return out


def test_real_vl_verl_run_on_cpu(tmp_path):
    from mlflow import MlflowClient

    from bench.execution.executors import run_processes

    m = yaml.safe_load((ROOT / "matrix" / "verl_cpu_vl.yaml").read_text())
    m["name"] = "verl_cpu_vl_ci"
    # one run: the VL matrix's mrope_cache cell (the cache on in vLLM's MRoPE, every other factor off)
    m["factors"] = {"rmsnorm_fused": ["off"], "mrope_cache": ["on"]}
    m["design"] = "full"
    matrix = tmp_path / "verl_cpu_vl_ci.yaml"
    matrix.write_text(yaml.safe_dump(m))
    results = tmp_path / "results"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BENCH_PATCHES", "BENCH_RUN_DIR"))}
    argv = [sys.executable, str(ROOT / "run_bench.py"), str(matrix), "--results", str(results), "--tracking-uri", uri]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=2400)  # run limit 1800 s + MLflow
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]

    sweep = (results / "verl_cpu_vl_ci" / "latest").resolve()
    (rec,) = [json.loads(p.read_text()) for p in sweep.glob("*/r0/record.json")]
    assert rec["status"] == "ok", rec.get("reason")
    rdir = sweep / rec["cell_id"] / "r0"
    lines = [json.loads(x) for x in (rdir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    assert {"timing_s/gen", "timing_s/step", "timing_s/update_actor", "prompt_length/mean"} <= set(lines[0]["data"])
    traces = list((rdir / "profile").glob("*step3*.json.gz"))
    assert traces and json.loads(gzip.open(traces[0]).read())["traceEvents"]
    assert 0.0 < rec["free_ratio"]["3"] < 1.0 and 0 < rec["summary"]["rollout_share_median"] < 1
    # a local verl run: the harness timed the machine-speed probe right before and right after it (bench.execution)
    mp = rec["machine_probe"]
    assert mp["spec"].startswith("bracket:matmul") and mp["before"]["reps"] >= 5 and mp["after"]["reps"] >= 5
    assert mp["before"]["at"] < rec["started_at"] < mp["after"]["at"]
    assert mp["before"]["min_s"] <= mp["before"]["median_s"] <= mp["before"]["max_s"] and 0 < mp["median_s"] < 1
    # the phases and the rollout long tail, as for a text run
    phases = rec["summary"]["phase_median_s"]
    assert all(phases[p] > 0 for p in ("gen", "old_log_prob", "ref", "update_actor")), phases
    assert 0 <= rec["summary"]["long_tail_waste_median"] < 1 and rec["summary"]["response_length_max"] > 0
    # mrope_cache: the vLLM processes computed cos/sin once per forward and the other layers reused them
    assert rec["evidence_verdicts"]["mrope_cache"] == "confirmed", rec["evidence"]
    mrope = rec["evidence"]["mrope_cache"]  # "confirmed: vllm_mrope_cache: F forwards, H of C layer calls reused"
    forwards, hits = int(mrope.split("vllm_mrope_cache: ")[1].split()[0]), int(mrope.split(" forwards, ")[1].split()[0])
    assert forwards > 0 and hits == 3 * forwards, mrope  # the tiny model's 4 layers: 3 reuse the first's

    counters = _counters(rdir)
    # the rollout: 3 steps x 4 prompts x n=2 requests, every one with its image; 64-128 px images in
    # 16-px patches merged 2x2 fill 4-16 placeholder tokens each, all inside the prompt token counts
    vllm = [c["vllm_requests"] for _, c in counters if "vllm_requests" in c]
    assert vllm, counters
    req = {k: sum(c[k] for c in vllm) for k in vllm[0]}
    assert req["requests"] >= 3 * 4 and req["images"] == req["requests"] == req["mm_items"]
    assert 4 * req["images"] <= req["image_tokens"] <= 16 * req["images"]
    assert req["prompt_tokens"] > req["image_tokens"]
    # training: the vision tower of the actor/ref ran over images (old log-prob, ref, update per step)
    vision = [c["vision_forwards"] for role, c in counters if "vision_forwards" in c and role == "ray-worker"]
    assert vision and sum(v["images"] for v in vision) >= 3 * 4 * 2 and sum(v["patches"] for v in vision) > 0
    # the torchvision workaround acted in the processes that loaded the processor
    reports = [json.loads(p.read_text()) for p in (rdir / "patches").glob("*.json")]
    tv = {r["role"] for r in reports
          if any(a.startswith("torchvision_op_schemas") for a in r["patches"].get("verl_cpu", {}).get("actions", []))}
    assert {"driver", "ray-worker"} <= tv
    assert not run_processes(rdir)

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("verl_cpu_vl_ci")
    cells = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("bench.kind") == "cell"]
    assert len(cells) == 1 and cells[0].data.tags["evidence.rmsnorm_fused"].startswith("confirmed")
    rep = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), "report", "verl_cpu_vl_ci", "--results",
                          str(results), "--tracking-uri", uri], capture_output=True, text=True, env=env, timeout=600)
    assert rep.returncode == 0, rep.stdout[-2000:] + rep.stderr[-2000:]
    report = (sweep / "report" / "report.md").read_text()
    phase_part, tail_part = report.split("## Phases, rollout share, Free ratio")[1].split("## Rollout long tail")
    row = f"| {rec['label']} |"
    assert row in phase_part and row in tail_part.split("## ")[0] and "%" in tail_part.split(row)[1].split("\n")[0]
