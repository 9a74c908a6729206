"""Acceptance of the gate on real embedded GRPO sweeps (issue 6): a slowdown of about 10 % of a step,
injected as a sleep inside the update phase, is caught (exit 1); an identical rerun passes (exit 0).

One cell, eight repeats of 12 timed steps per sweep (the matrix of ``benchmarks/bench_gate.py``, whose
real mode measures the false-alarm and detection rates of exactly this setup); three sweeps in all.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from bench.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from bench_gate import gate_matrix  # noqa: E402  (the benchmark's matrix: rates measured there hold here)


def cpu_pressure() -> str:
    """``/proc/pressure/cpu`` (how often tasks waited for a CPU) for failure messages."""
    try:
        return open("/proc/pressure/cpu").readline().strip()
    except OSError:
        return "unknown"


#: sweeps per claim: one, plus one confirmation when the first verdict is wrong (see the test's docstring)
ATTEMPTS = 2


@pytest.mark.slow
def test_real_slowdown_is_caught_and_identical_rerun_passes(tmp_path):
    """A 10 % slowdown exits 1 and an identical rerun exits 0, each on real embedded sweeps.

    Measured with exactly this matrix (``benchmarks/bench_gate.py real``, 10 + 10 + 10 sweeps on the
    development VM): the gate flagged 0 of 90 identical pairs (95 % CI up to 4 %) and missed 3 of 100
    10 % slowdowns (see README). A single-shot CI check with those odds would be red about one run in
    twenty for no reason, so each claim gets one confirmation sweep when its first verdict is wrong, as
    a performance engineer would rerun before believing either; both sweeps must be wrong (odds
    well under 1 %) for the test to fail. The gate's verdict logic itself is covered by tests/test_gate.py
    and tests/test_speed.py on synthetic samples.
    """
    results = tmp_path / "results"
    common = ["--results", str(results), "--tracking-uri", f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"]

    def run(matrix: dict, *extra: str) -> int:
        path = tmp_path / f"{matrix['name']}.yaml"
        path.write_text(yaml.safe_dump(matrix, sort_keys=False))
        return main(["run", str(path), *extra, *common])

    def gate(name: str) -> tuple[int, dict]:
        rc = main(["gate", "--baseline", "ci", "--candidate", name, *common])
        return rc, json.loads((results / name / "latest" / "gate" / "gate.json").read_text())

    assert run(gate_matrix("gate_ci")) == 0
    assert main(["baseline", "save", "gate_ci", "--name", "ci", *common]) == 0
    base = json.loads((results / "baselines" / "ci.json").read_text())
    samples = [t for r in base["cells"][0]["repeats"] for t in r["samples"]["step_time"]]
    assert len(samples) == 96
    probes = [p for r in base["cells"][0]["repeats"] for p in r["samples"]["speed_probe"]]
    assert len(probes) == 96 and all(0 < p < 1 for p in probes)
    delay = 0.10 * float(np.median(samples))

    # candidate: the same cell with the update phase slowed by ~10 % of a step
    seen = []
    for attempt in range(ATTEMPTS):
        assert run(gate_matrix("gate_ci_slow", delay), *(["--force"] if attempt else [])) == 0
        rc, verdict = gate("gate_ci_slow")
        row = verdict["rows"][0]
        seen.append((rc, row["verdict"], row.get("change"), row.get("raw_change"), row.get("speed_change")))
        if rc == 1:
            break
    assert rc == 1 and row["verdict"] == "regression" and row["change"] > 0.05 and row["normalized"], (
        f"injected {delay:.3f} s (10 % of a step) not caught in {ATTEMPTS} sweeps: "
        f"(exit, verdict, change, raw change, machine) = {seen}; CPU pressure {cpu_pressure()}")
    assert "update_delay_s" in " ".join(verdict["notes"])

    # an identical rerun of the baseline's matrix passes
    seen = []
    for attempt in range(ATTEMPTS):
        assert run(gate_matrix("gate_ci"), "--force") == 0
        rc, verdict = gate("gate_ci")
        row = verdict["rows"][0]
        seen.append((rc, row["verdict"], row.get("change"), row.get("raw_change"), row.get("speed_change")))
        if rc == 0:
            break
    assert rc == 0 and row["verdict"] in ("unchanged", "improvement"), (
        f"identical rerun flagged in {ATTEMPTS} sweeps: (exit, verdict, change, raw change, machine) = {seen}; "
        f"CPU pressure {cpu_pressure()}")
