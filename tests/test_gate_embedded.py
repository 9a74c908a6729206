"""The gate against a stored baseline on real embedded GRPO sweeps (issue 6, issue 18): a slowdown of about 10 % of
a step, injected as a sleep inside the update phase, is never passed and an identical rerun is never called a
regression; "cannot judge" is accepted where the machine was busy (recorded CPU pressure) or where the
baseline's measured sweep-to-sweep offset keeps the gate from seeing 10 % (its own figure says so).

One cell, eight repeats of 12 timed steps per sweep (the matrix of ``benchmarks/bench_gate.py``); the baseline is
saved from two sweeps (so it carries a measured sweep-to-sweep figure), four sweeps in all (plus confirmations).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from bench.analyze.gate import EXIT_CANNOT_JUDGE
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
#: CPU pressure (PSI some avg60, %, highest recorded around the runs) above which the machine counts as busy
#: for this test: other work waited for a CPU a tenth of the time or more (an idle machine reads 0-2 %)
BUSY_PSI = 10.0


def recorded_pressure(results: Path, sweep: str) -> float:
    """Highest CPU pressure recorded around the runs of the baseline and of the candidate's latest sweep."""
    from bench.analyze.snapshot import cpu_pressure, snapshot

    base = json.loads((results / "baselines" / "ci.json").read_text())
    vals = [cpu_pressure(base), cpu_pressure(snapshot(results / sweep / "latest"))]
    return max((v for v in vals if v is not None), default=0.0)


@pytest.mark.slow
def test_real_slowdown_is_caught_and_identical_rerun_passes(tmp_path):
    """A 10 % slowdown is never passed and an identical rerun is never called a regression, on real
    embedded sweeps; on a quiet machine the slowdown exits 1 and the rerun exits 0.

    Measured with exactly this matrix (``benchmarks/bench_gate.py real``, 10 + 10 + 10 sweeps on the
    development VM): the gate flagged 0 of 90 identical pairs (95 % CI up to 4 %) and missed 3 of 100
    10 % slowdowns (see docs/figures.md). A single-shot CI check with those odds would be red about one run in
    twenty for no reason, so each claim gets one confirmation sweep when its first verdict is wrong, as
    a performance engineer would rerun before believing either; both sweeps must be wrong (odds
    well under 1 %) for the test to fail.

    On a busy machine (another job competing for the CPUs) step times scatter by tens of percent and the
    gate's correct answer is "noisy" (exit 3: cannot judge): the test accepts it when the CPU pressure
    recorded around the runs says the machine was busy (:data:`BUSY_PSI`), and asserts only the
    direction there: the slowdown is never "unchanged"/"improvement", the rerun never "regression".
    The gate's verdict logic itself is covered by tests/test_gate.py and tests/test_speed.py on
    synthetic samples.
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

    # the baseline saved from two sweeps of the same code: it measures how far a sweep moves from the next, and
    # the gate allows for that (bench.analyze.gate_stored): without it an identical rerun whose sweep ran a few
    # percent slower would be called a regression (an earlier version of this test was flaky for that reason)
    for i in range(2):
        assert run(gate_matrix("gate_ci"), *(["--force"] if i else [])) == 0
        assert main(["baseline", "save", "gate_ci", "--name", "ci", *(["--force"] if i else []), *common]) == 0
    base = json.loads((results / "baselines" / "ci.json").read_text())
    assert base["sweep_to_sweep"]["sweeps"] == 2 and base["sweep_to_sweep"]["sd_log"] is not None
    samples = [t for r in base["cells"][0]["repeats"] for t in r["samples"]["step_time"]]
    assert len(samples) == 96  # the latest save: 8 runs x 12 timed steps
    probes = [p for r in base["cells"][0]["repeats"] for p in r["samples"]["speed_probe"]]
    assert len(probes) == 96 and all(0 < p < 1 for p in probes)
    delay = 0.10 * float(np.median(samples))

    # candidate: the same cell with the update phase slowed by ~10 % of a step
    seen = []
    for attempt in range(ATTEMPTS):
        assert run(gate_matrix("gate_ci_slow", delay), *(["--force"] if attempt else [])) == 0
        rc, verdict = gate("gate_ci_slow")
        row = verdict["rows"][0]
        psi = recorded_pressure(results, "gate_ci_slow")
        seen.append((rc, row["verdict"], row.get("change"), row.get("raw_change"), row.get("speed_change"), psi))
        if rc == 1 or (row["verdict"] == "noisy" and psi > BUSY_PSI):
            break
    why = (f"injected {delay:.3f} s (10 % of a step) in {ATTEMPTS} sweeps: (exit, verdict, change, raw change, "
           f"machine, recorded PSI) = {seen}; CPU pressure now {cpu_pressure()}")
    assert row["verdict"] not in ("unchanged", "improvement"), "slowdown passed: " + why
    if row["verdict"] == "noisy":  # busy, or the measured sweep-to-sweep offset hides 10 %: it says so
        assert rc == EXIT_CANNOT_JUDGE and (psi > BUSY_PSI or row["mde"] > 0.10), "noisy on a quiet machine: " + why
    else:
        assert rc == 1 and row["verdict"] == "regression" and row["change"] > 0.05, why
        assert "update_delay_s" in " ".join(verdict["notes"])

    # an identical rerun of the baseline's matrix passes
    seen = []
    for attempt in range(ATTEMPTS):
        assert run(gate_matrix("gate_ci"), "--force") == 0
        rc, verdict = gate("gate_ci")
        row = verdict["rows"][0]
        psi = recorded_pressure(results, "gate_ci")
        seen.append((rc, row["verdict"], row.get("change"), row.get("raw_change"), row.get("speed_change"), psi))
        if rc == 0 or (row["verdict"] == "noisy" and psi > BUSY_PSI):
            break
    why = (f"identical rerun in {ATTEMPTS} sweeps: (exit, verdict, change, raw change, machine, recorded PSI) = "
           f"{seen}; CPU pressure now {cpu_pressure()}")
    assert row["verdict"] != "regression", "identical rerun flagged: " + why
    if row["verdict"] == "noisy":
        assert rc == EXIT_CANNOT_JUDGE and (psi > BUSY_PSI or row["mde"] > 0.10), "noisy on a quiet machine: " + why
    else:
        assert rc == 0 and row["verdict"] in ("unchanged", "improvement"), why
