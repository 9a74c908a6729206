"""Acceptance of the gate on real embedded GRPO sweeps (issue 6): a slowdown of about 10 % of a step,
injected as a sleep inside the update phase, is caught (exit 1); an identical rerun passes (exit 0).

One cell, two repeats of 20 timed steps per sweep (the matrix of ``benchmarks/bench_gate.py``, whose
real mode measures the false-alarm and detection rates of exactly this setup); three sweeps in all.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from bench.cli import main


def gate_matrix(name: str, delay_s: float = 0.0, timed_steps: int = 20) -> dict:
    """Same as ``benchmarks/bench_gate.py:gate_matrix``: one embedded cell, two repeats, every measured step timed."""
    m = {
        "name": name, "engine": "embedded", "platform": "cpu",
        "base": {"steps": timed_steps + 1, "warmup_steps": 1, "profile_steps": [], "train_batch_size": 4, "n": 2,
                 "ppo_mini_batch_size": 4, "micro_batch_size_per_gpu": 2, "max_prompt_length": 160,
                 "max_response_length": 24, "timeout_s": 300, "seed": 0},
        "factors": {"dynamic_bsz": ["on"]}, "repeats": 2,
    }
    # one intra-op thread: on 2 cores shared with the harness (and maybe other jobs) two threads jitter
    m["base"]["env"] = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if delay_s:
        m["base"]["embedded"] = {"update_delay_s": round(float(delay_s), 4)}
    return m


def cpu_pressure() -> str:
    """``/proc/pressure/cpu`` (how often tasks waited for a CPU) for failure messages."""
    try:
        return open("/proc/pressure/cpu").readline().strip()
    except OSError:
        return "unknown"


def skip_if_too_noisy(rc: int, row: dict) -> None:
    """Skip (with the reason) when the gate itself refused to judge: the runs scattered too much.

    When runs of the same cell differ by about as much as the slowdown to find (other jobs on the
    CPUs; on a shared 2-core VM even a quiet one: about 9 % from one run to the next, measured by
    benchmarks/bench_gate.py), the gate answers exit 2 "too noisy to judge" instead of a verdict. That
    refusal is what it should do (the statistics are covered by tests/test_gate.py); this test then has
    nothing to show. Any other outcome is asserted.
    """
    if rc == 2 and row.get("verdict") == "noisy":
        pytest.skip(f"runs too scattered to time a 10 % slowdown here: {row['reason'][:110]}; "
                    f"CPU pressure {cpu_pressure()}")


@pytest.mark.slow
def test_real_slowdown_is_caught_and_identical_rerun_passes(tmp_path):
    results = tmp_path / "results"
    common = ["--results", str(results), "--tracking-uri", f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"]

    def run(matrix: dict, *extra: str) -> int:
        path = tmp_path / f"{matrix['name']}.yaml"
        path.write_text(yaml.safe_dump(matrix, sort_keys=False))
        return main(["run", str(path), *extra, *common])

    assert run(gate_matrix("gate_ci")) == 0
    assert main(["baseline", "save", "gate_ci", "--name", "ci", *common]) == 0
    base = json.loads((results / "baselines" / "ci.json").read_text())
    samples = [t for r in base["cells"][0]["repeats"] for t in r["samples"]["step_time"]]
    assert len(samples) == 40
    delay = 0.10 * float(np.median(samples))

    # candidate: the same cell with the update phase slowed by ~10 % of a step
    assert run(gate_matrix("gate_ci_slow", delay)) == 0
    rc = main(["gate", "--baseline", "ci", "--candidate", "gate_ci_slow", *common])
    verdict = json.loads((results / "gate_ci_slow" / "latest" / "gate" / "gate.json").read_text())
    row = verdict["rows"][0]
    skip_if_too_noisy(rc, row)
    assert rc == 1 and row["verdict"] == "regression" and row["change"] > 0.05, (
        f"injected {delay:.3f} s (10 % of a step) not caught: {row}; CPU pressure {cpu_pressure()} "
        "(the gate needs a machine that other jobs leave mostly idle; see benchmarks/bench_gate.py)")
    assert "update_delay_s" in " ".join(verdict["notes"])

    # an identical rerun of the baseline's matrix passes
    assert run(gate_matrix("gate_ci"), "--force") == 0
    rc = main(["gate", "--baseline", "ci", "--candidate", "gate_ci", *common])
    verdict = json.loads((results / "gate_ci" / "latest" / "gate" / "gate.json").read_text())
    skip_if_too_noisy(rc, verdict["rows"][0])
    assert rc == 0, f"identical rerun flagged: {verdict['rows']}; CPU pressure {cpu_pressure()}"
    assert verdict["rows"][0]["verdict"] in ("unchanged", "improvement")
