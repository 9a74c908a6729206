"""The gate against a stored baseline on real embedded GRPO sweeps (issue 6, issue 18): a slowdown of about 10 % of
a step, injected as a sleep inside the update phase, is never passed and an identical rerun is never called a
regression; "cannot judge" is accepted, with estimates pointing the right way where the machine was quiet
(recorded CPU pressure).

One cell, eight repeats of 12 timed steps per sweep (the matrix of ``benchmarks/bench_gate.py``); the baseline is
saved from two sweeps (so it carries a measured sweep-to-sweep figure), then one sweep per claim: four sweeps in all
(about a minute each on a 2-core machine). Each claim is asserted on its one sweep: an earlier version ran a
confirmation sweep whenever the first verdict was not the decided right one, but asserted on the last sweep only,
so a first sweep's wrong verdict went unchecked, and on a quiet machine (where the gate, allowing for the sweep
offset, cannot judge) it ran six sweeps instead of four.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from bench.cli import main
from bench.gate.verdicts import EXIT_CANNOT_JUDGE

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_gate import gate_matrix  # noqa: E402  (the benchmark's matrix: rates measured there hold here)


def cpu_pressure() -> str:
    """``/proc/pressure/cpu`` (how often tasks waited for a CPU) for failure messages."""
    try:
        return open("/proc/pressure/cpu").readline().strip()
    except OSError:
        return "unknown"


#: CPU pressure (PSI some avg60, %, highest recorded around the runs) above which the machine counts as busy
#: for this test: other work waited for a CPU a tenth of the time or more (an idle machine reads 0-2 %)
BUSY_PSI = 10.0
#: runs per sweep and timed steps per run: smaller than the benchmark's 8 x 12 to fit the suite's budget (4 sweeps
#: of 16 runs instead of 32); fewer steps widen the intervals, so a verdict the test forbids stays as unlikely
#: (the gate's error rates hold at every size) and "cannot judge" comes more often
SIZE = {"repeats": 4, "timed_steps": 8}


def recorded_pressure(results: Path, sweep: str) -> float:
    """Highest CPU pressure recorded around the runs of the baseline and of the candidate's latest sweep."""
    from bench.records.snapshot import cpu_pressure, snapshot

    base = json.loads((results / "baselines" / "ci.json").read_text())
    vals = [cpu_pressure(base), cpu_pressure(snapshot(results / sweep / "latest"))]
    return max((v for v in vals if v is not None), default=0.0)


@pytest.mark.slow
def test_stored_gate_never_passes_a_slowdown_nor_flags_a_rerun(tmp_path):
    """A 10 % slowdown is never passed and an identical rerun is never called a regression, on real
    embedded sweeps against a stored baseline; a decided verdict is the right one, and where the gate cannot
    judge, its estimate points the right way.

    A stored baseline carries a sweep-to-sweep offset that a gate against it must allow for (measured over the
    baseline's saves, on the scale the gate compares: speed-normalized where the probe is applied). On this VM
    whole sweeps move by a few percent even after normalization (CI saw an identical rerun at +3.8 % and +5.8 %
    in two sweeps, the probe unmoved), so "cannot judge" (exit 3) is a correct answer on a quiet machine too,
    and a rerun passes only when its sweep landed within about 3 % of the baseline's. What the test
    pins on every machine: the slowdown is never "unchanged"/"improvement" and the rerun never "regression";
    a decided slowdown is a regression beyond 5 % naming the injected delay, a decided rerun exits 0. On a quiet
    machine (recorded CPU pressure under :data:`BUSY_PSI`) an undecided gate's interval must still hold the truth:
    the slowdown's change above 0 and its 99 % interval holding +10 %, the rerun's interval holding 0 (a gate
    overconfident about its sweep offset fails there). Measured here after the scale fix: slowdowns +13.9 %
    [+0.2, +29.3] and +10.2 % [-2.9, +25.2], reruns +2.9 % [-10.0, +17.7] and +6.9 % [-6.0, +21.7], all "cannot
    judge" (the gate saw 17-18 %; sweeps of 8 runs x 12 steps then, :data:`SIZE` since). One sweep per claim,
    every verdict asserted (module text).
    How often the stored gate decides is a rate, measured by ``benchmarks/bench_gate.py real`` (docs/gate.md);
    for a verdict in CI, the interleaved gate (tests/gate/test_gate_interleaved_e2e.py).
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
    # the gate allows for that (bench.gate.stored_runs): without it an identical rerun whose sweep ran a few
    # percent slower would be called a regression (an earlier version of this test was flaky for that reason)
    for i in range(2):
        assert run(gate_matrix("gate_ci", **SIZE), *(["--force"] if i else [])) == 0
        assert main(["baseline", "save", "gate_ci", "--name", "ci", *(["--force"] if i else []), *common]) == 0
    base = json.loads((results / "baselines" / "ci.json").read_text())
    assert base["sweep_to_sweep"]["sweeps"] == 2 and base["sweep_to_sweep"]["sd_log"] is not None
    samples = [t for r in base["cells"][0]["repeats"] for t in r["samples"]["step_time"]]
    assert len(samples) == SIZE["repeats"] * SIZE["timed_steps"]  # the latest save: every timed step of every run
    probes = [p for r in base["cells"][0]["repeats"] for p in r["samples"]["speed_probe"]]
    assert len(probes) == len(samples) and all(0 < p < 1 for p in probes)
    delay = 0.10 * float(np.median(samples))

    # candidate: the same cell with the update phase slowed by ~10 % of a step
    assert run(gate_matrix("gate_ci_slow", delay, **SIZE)) == 0
    rc, verdict = gate("gate_ci_slow")
    row = verdict["rows"][0]
    psi = recorded_pressure(results, "gate_ci_slow")
    why = (f"injected {delay:.3f} s (10 % of a step): exit {rc}, verdict {row['verdict']}, change {row.get('change')},"
           f" raw change {row.get('raw_change')}, machine {row.get('speed_change')}, recorded PSI {psi}; "
           f"CPU pressure now {cpu_pressure()}")
    assert row["verdict"] not in ("unchanged", "improvement"), "slowdown passed: " + why
    if row["verdict"] == "noisy":
        assert rc == EXIT_CANNOT_JUDGE and "cannot judge" in row["reason"], why
        if psi <= BUSY_PSI:  # quiet: the estimate points the right way and the interval reaches the injected 10 %
            assert row["change"] > 0 and row["ci_low"] <= 0.10 <= row["ci_high"], "slowdown misjudged, quiet: " + why
    else:
        assert rc == 1 and row["verdict"] == "regression" and row["change"] > 0.05, why
        assert "update_delay_s" in " ".join(verdict["notes"])

    # an identical rerun of the baseline's matrix passes
    assert run(gate_matrix("gate_ci", **SIZE), "--force") == 0
    rc, verdict = gate("gate_ci")
    row = verdict["rows"][0]
    psi = recorded_pressure(results, "gate_ci")
    why = (f"identical rerun: exit {rc}, verdict {row['verdict']}, change {row.get('change')}, raw change "
           f"{row.get('raw_change')}, machine {row.get('speed_change')}, recorded PSI {psi}; "
           f"CPU pressure now {cpu_pressure()}")
    assert row["verdict"] != "regression", "identical rerun flagged: " + why
    if row["verdict"] == "noisy":
        assert rc == EXIT_CANNOT_JUDGE and "cannot judge" in row["reason"], why
        if psi <= BUSY_PSI:  # quiet: the interval holds the truth, no change
            assert row["ci_low"] <= 0 <= row["ci_high"], "rerun misjudged on a quiet machine: " + why
    else:
        assert rc == 0 and row["verdict"] in ("unchanged", "improvement"), why
