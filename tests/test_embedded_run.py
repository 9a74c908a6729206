"""Embedded engine end to end: ``python -m bench.engines.embedded --out DIR [--config RUN.yaml]`` on CPU.

Two real runs (module fixtures): the default run (3 steps, profiled steps 2-3) and a text-only run with
dynamic bsz, fused RMSNorm and an injected update delay. The builtin model is built on first use into
``$BENCH_CACHE_DIR`` (default ``<repo>/.cache``) and reused afterwards.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")
if importlib.util.find_spec("verl") is None:  # found, not imported: the tests import it (seconds)
    pytest.skip("could not import 'verl': not installed", allow_module_level=True)
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor")
REQUIRED = [
    *(f"timing_s/{p}" for p in (*PHASES, "step", "step_cpu")),
    "perf/total_num_tokens",
    "perf/throughput",
    "perf/time_per_step",
    "perf/cpu_memory_used_gb",
    *(f"response_length/{k}" for k in ("mean", "max", "min", "clip_ratio")),
    *(f"prompt_length/{k}" for k in ("mean", "max", "min")),
    "critic/score/mean",
    *(f"critic/advantages/{k}" for k in ("mean", "max", "min")),
    *(f"actor/{k}" for k in ("pg_loss", "grad_norm", "kl_loss", "pg_clipfrac", "ppo_kl")),
    *(
        f"perf/{p}/{k}"
        for p in ("old_log_prob", "ref", "update_actor")
        for k in ("num_micro_batches", "padded_tokens", "real_tokens")
    ),
]


def run_engine(out: Path, config: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run the CLI in a fresh interpreter (as the harness does)."""
    argv = [sys.executable, "-m", "bench.engines.embedded", "--out", str(out)]
    if config is not None:
        cfg_path = out.parent / f"{out.name}.yaml"
        cfg_path.write_text(yaml.safe_dump(config))
        argv += ["--config", str(cfg_path)]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("embedded") / "default"
    proc = run_engine(out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


@pytest.fixture(scope="module")
def factors_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("embedded") / "factors"
    cfg = {
        "data": "builtin:text",
        "steps": 2,
        "warmup_steps": 0,
        "profile_steps": [],
        "use_dynamic_bsz": True,
        "ppo_max_token_len_per_gpu": 200,
        "log_prob_max_token_len_per_gpu": 400,
        "rmsnorm_fused": True,
        "update_delay_s": 0.5,
    }
    proc = run_engine(out, cfg)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


# --------------------------------------------------------------------------- default run


def test_default_run_writes_the_run_folder_and_prints_the_breakdown(default_run):
    out, proc = default_run
    for name in ("metrics.jsonl", "run_config.yaml", "engine.log", "evidence.json"):
        assert (out / name).is_file(), name
    assert not (out / "failure.json").exists()
    assert "phase breakdown" in proc.stdout
    for p in PHASES:
        assert re.search(rf"^\s+{p}\s+\d+\.\d+ s\s+\d+\.\d %$", proc.stdout, re.M), p
    cfg = yaml.safe_load((out / "run_config.yaml").read_text())
    assert cfg["steps"] == 3 and cfg["max_prompt_length"] == 96 and cfg["max_response_length"] == 64
    assert cfg["ppo_max_token_len_per_gpu"] == 2 * (96 + 64)
    assert cfg["log_prob_max_token_len_per_gpu"] == 4 * (96 + 64)


def test_metrics_jsonl_is_byte_for_byte_verl_file_logger(default_run, tmp_path, monkeypatch):
    from verl.utils.tracking import FileLogger

    out, _ = default_run
    ours = (out / "metrics.jsonl").read_bytes()
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(set(r) == {"step", "data"} for r in rows)

    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "verl.jsonl"))
    fl = FileLogger(project_name="p", experiment_name="e")
    for r in rows:
        fl.log(data=r["data"], step=r["step"])
    fl.finish()
    assert (tmp_path / "verl.jsonl").read_bytes() == ours


def test_every_step_has_verls_metric_names_and_consistent_values(default_run):
    out, _ = default_run
    for row in read_jsonl(out / "metrics.jsonl"):
        d = row["data"]
        missing = [k for k in REQUIRED if k not in d]
        assert not missing, missing
        assert "perf/max_memory_allocated_gb" not in d  # CPU run
        # verl metric_utils.compute_throughout_metrics: tokens / (step time * n_gpus), n_gpus = 1
        assert math.isclose(d["perf/throughput"], d["perf/total_num_tokens"] / d["timing_s/step"], rel_tol=1e-9)
        assert d["perf/time_per_step"] == d["timing_s/step"]
        assert sum(d[f"timing_s/{p}"] for p in PHASES) <= d["timing_s/step"] + 1e-6
        # process CPU seconds of the step (user + sys, all threads): some, and no more than every core for the step
        assert 0 < d["timing_s/step_cpu"] <= d["timing_s/step"] * (os.cpu_count() or 1)
        # every token of the batch goes through each pass once
        for p in ("old_log_prob", "ref", "update_actor"):
            assert d[f"perf/{p}/real_tokens"] == d["perf/total_num_tokens"]
            assert d[f"perf/{p}/padded_tokens"] >= d[f"perf/{p}/real_tokens"]
        # fixed micro-batches: 32 sequences / 8 (log-prob) and / 4 (update)
        assert d["perf/old_log_prob/num_micro_batches"] == 4 and d["perf/ref/num_micro_batches"] == 4
        assert d["perf/update_actor/num_micro_batches"] == 8
        assert 0.0 <= d["critic/score/mean"] <= 1.0
        assert abs(d["critic/advantages/mean"]) < 1.0


def test_response_lengths_of_the_default_model_are_spread_below_the_max(default_run):
    out, _ = default_run
    rows = [r["data"] for r in read_jsonl(out / "metrics.jsonl")]
    assert all(d["response_length/min"] < 64 for d in rows)
    assert all(d["response_length/clip_ratio"] < 0.5 for d in rows)
    assert all(d["response_length/max"] - d["response_length/min"] >= 10 for d in rows)
    assert all(d["prompt_length/max"] > d["prompt_length/min"] for d in rows)


def test_trace_holds_one_profiler_step_window_per_profiled_step(default_run):
    import orjson

    out, _ = default_run
    files = sorted((out / "trace").iterdir())
    assert [f.name for f in files] == ["steps_2-3.json"]
    raw = files[0].read_bytes()
    assert not raw.startswith(b"\x1f\x8b") and raw.lstrip()[:1] == b"{"  # plain JSON, not gzip
    events = orjson.loads(raw)["traceEvents"]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert sorted(e["name"] for e in steps) == ["ProfilerStep#2", "ProfilerStep#3"]
    assert all(e["ph"] == "X" and e["dur"] > 0 for e in steps)
    phases = {e["name"] for e in events if str(e.get("name", "")).startswith("phase/")}
    assert phases == {f"phase/{p}" for p in PHASES}
    assert sum(1 for e in events if e.get("cat") == "cpu_op") > 1000


def test_evidence_records_what_was_in_effect(default_run):
    import torch
    import transformers
    import verl

    out, _ = default_run
    ev = json.loads((out / "evidence.json").read_text())
    assert (ev["device"], ev["torch"], ev["transformers"], ev["verl"]) == (
        "cpu",
        torch.__version__,
        transformers.__version__,
        verl.__version__,
    )
    assert ev["model"]["class"] == "Qwen3VLForConditionalGeneration"
    assert ev["rmsnorm_fused"]["enabled"] is False
    assert ev["rmsnorm_fused"]["installed_forward"] == ["Qwen3VLTextRMSNorm.forward"]
    assert ev["dynamic_bsz"]["enabled"] is False
    assert ev["dynamic_bsz"]["micro_batches"] == {"old_log_prob": [4] * 3, "ref": [4] * 3, "update_actor": [8] * 3}
    assert ev["profiler"]["files"] == ["steps_2-3.json"] and ev["profiler"]["steps"] == [2, 3]
    assert ev["data"]["multimodal"] is True


# --------------------------------------------------------------------------- factors on


def test_fused_rmsnorm_dynamic_bsz_and_delay_take_effect(factors_run):
    out, _ = factors_run
    ev = json.loads((out / "evidence.json").read_text())
    rms = ev["rmsnorm_fused"]
    assert rms["enabled"] and rms["forward"] == "torch.nn.functional.rms_norm" and rms["modules"] == 17
    assert rms["installed_forward"] == ["torch.nn.functional.rms_norm"]
    assert ev["data"]["multimodal"] is False
    assert not (out / "trace").exists() and ev["profiler"]["files"] == []

    rows = [r["data"] for r in read_jsonl(out / "metrics.jsonl")]
    assert len(rows) == 2
    limits = {"old_log_prob": 400, "ref": 400, "update_actor": 200}
    for d in rows:
        assert d["timing_s/update_actor"] >= 0.5
        # the injected delay sleeps: wall time, not CPU time (torch on 1 intra-op thread here, and a busy machine only
        # widens the gap)
        assert d["timing_s/step"] - d["timing_s/step_cpu"] >= 0.4, d
        for p, limit in limits.items():
            real, mbs = d[f"perf/{p}/real_tokens"], d[f"perf/{p}/num_micro_batches"]
            assert mbs >= math.ceil(real / limit)  # a budget of `limit` tokens per micro-batch
            assert d[f"perf/{p}/padded_tokens"] >= real
    assert ev["dynamic_bsz"]["micro_batches"]["update_actor"] == [
        int(d["perf/update_actor/num_micro_batches"]) for d in rows
    ]
    assert ev["update_delay_s"] == {"enabled": True, "seconds": 0.5, "phase": "update_actor"}
