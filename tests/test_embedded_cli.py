"""Embedded engine CLI: bad input exits 2 with one line on stderr and a ``failure.json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def run_cli(tmp_path: Path, config: dict | None) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "bench.engines.embedded", "--out", str(out)]
    if config is not None:
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
        argv += ["--config", str(tmp_path / "run.yaml")]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    failure = json.loads((out / "failure.json").read_text()) if (out / "failure.json").exists() else {}
    return proc, failure


def assert_one_line(proc: subprocess.CompletedProcess, failure: dict, kind: str) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert failure["kind"] == kind
    assert failure["reason"] in lines[0] and "\n" not in failure["reason"]
    return lines[0]


def test_missing_model_path(tmp_path):
    proc, failure = run_cli(tmp_path, {"model": str(tmp_path / "no-such-model")})
    line = assert_one_line(proc, failure, "bad_input")
    assert "model path not found" in line and "no-such-model" in line


def test_dataset_missing_required_column_is_named(tmp_path):
    pytest.importorskip("pyarrow")
    from bench.engines.builtins import data

    rows = data.generate_rows("builtin:text", n=4)
    for r in rows:
        del r["data_source"]
    data.write_parquet(rows, tmp_path / "d.parquet")
    proc, failure = run_cli(tmp_path, {"data": str(tmp_path / "d.parquet")})
    line = assert_one_line(proc, failure, "bad_input")
    assert "missing required column 'data_source'" in line


def test_unknown_device(tmp_path):
    proc, failure = run_cli(tmp_path, {"device": "tpu"})
    line = assert_one_line(proc, failure, "bad_input")
    assert "device" in line and "'cpu', 'cuda' or 'npu'" in line


def test_cuda_requested_but_absent(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    proc, failure = run_cli(tmp_path, {"device": "cuda"})
    line = assert_one_line(proc, failure, "bad_input")
    assert "cuda requested" in line


@pytest.mark.slow
def test_token_limit_below_longest_sequence_is_infeasible(tmp_path):
    pytest.importorskip("verl")
    cfg = {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 100}
    proc, failure = run_cli(tmp_path, cfg)
    line = assert_one_line(proc, failure, "infeasible")
    # e.g. "ppo_max_token_len_per_gpu=100 is below the longest sequence of 154 tokens (longest prompt 90 + ...)"
    assert "ppo_max_token_len_per_gpu=100 is below the longest sequence of " in line
    assert "max_response_length 64" in line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_unknown_config_key(tmp_path):
    proc, failure = run_cli(tmp_path, {"stepz": 3})
    line = assert_one_line(proc, failure, "bad_input")
    assert "stepz" in line
