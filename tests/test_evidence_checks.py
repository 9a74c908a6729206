"""Evidence checks: every built-in factor has one on every engine and platform where it applies, and the
embedded engine's checks confirm what a real embedded sweep did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.core.engine_registry import engine_names
from bench.measure.evidence import FinishedRun, env_check, evidence_check, factor_evidence
from bench.spec.optimizations import applicability, registry
from bench.spec.plan import ID_BASIS_FACTORS

ROOT = Path(__file__).resolve().parents[1]


def test_every_builtin_factor_has_a_check_wherever_it_applies():
    context = {"rollout_tp": 8}  # every requirement met: the factor applies wherever a mechanism exists
    missing = [f"{key} on {engine}:{platform}" for key in sorted(ID_BASIS_FACTORS) for engine in engine_names()
               for platform in ("cpu", "cuda", "npu")
               if applicability(key, engine, platform, context) is None and evidence_check(key, engine, platform)
               is None]
    assert missing == []
    assert ID_BASIS_FACTORS <= set(registry())


def test_env_check_reads_what_each_process_recorded(tmp_path):
    (tmp_path / "patches").mkdir()
    for i, value in enumerate(["1", "1"]):
        (tmp_path / "patches" / f"w-{i}.json").write_text(json.dumps({"env": {"TASK_QUEUE_ENABLE": value}}))
    run = FinishedRun(tmp_path, "verl", "npu")
    assert env_check("TASK_QUEUE_ENABLE", 1, run) == ("confirmed", "TASK_QUEUE_ENABLE=1 in 2 process(es)")
    assert env_check("TASK_QUEUE_ENABLE", 2, run)[0] == "contradicted"
    assert env_check("VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE", 1, run)[0] == "missing"
    assert factor_evidence(tmp_path, {"task_queue": 1, "mc2": None}, "verl", "npu") == {
        "task_queue": {"verdict": "confirmed", "detail": "TASK_QUEUE_ENABLE=1 in 2 process(es)"},
        "mc2": {"verdict": "n/a", "detail": "not applicable on this target"}}


@pytest.mark.slow
def test_a_real_embedded_sweep_confirms_its_factors(tmp_path):
    matrix = (ROOT / "matrix" / "smoke.yaml").read_text().replace("  dynamic_bsz: [off, on]",
                                                                  "  dynamic_bsz: [off, on]\n  rmsnorm_fused: [on]")
    (tmp_path / "m.yaml").write_text(matrix)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), "run", "m.yaml", "--results",
                           str(tmp_path / "results"), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = [json.loads(p.read_text()) for p in (tmp_path / "results").rglob("record.json")]
    assert len(records) == 2
    for rec in records:
        assert rec["evidence_verdicts"] == {"rmsnorm_fused": "confirmed", "dynamic_bsz": "confirmed"}, \
            rec["evidence"]
        mode = "token-budget" if rec["levels"]["dynamic_bsz"] else "fixed-size"
        assert rec["evidence"]["dynamic_bsz"].startswith(f"confirmed: {mode} micro-batches: ")
        assert "torch.nn.functional.rms_norm" in rec["evidence"]["rmsnorm_fused"]
