"""One place decides (issue 47): the stored gate, the interleaved gate and the sweep report's claims reach their
verdicts through :mod:`bench.stats.decide`, and the same runs fed through each path give the same verdict.

The runs are **recorded runs** (``benchmarks/data/recorded_runs_embedded.json``: the 6 ok runs of the ``all-off``
cell over two real sweeps of ``matrix/full.yaml``, every timed step), each run's log steps centred on the mean run
value and scaled to a quiet machine's run spread (the recording machine was loaded; at its spread no path decides
anything, as ``tests/gate/test_baseline_offset_df.py`` does). The baseline's run ``k`` is recorded run ``k``; the
candidate's is recorded run ``k + 1`` (another run, so no two sides are equal) times ``1 + change``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import bench.stats.decide as decide_mod
from bench.gate.runs import paired_comparison
from bench.gate.verdicts import compare_snapshots
from bench.report.tables import claims_on_runs
from bench.stats.decide import Evidence, decide_change, gate_outcome

POOL = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "recorded_runs_embedded.json"
ALPHA, THRESHOLD, MAX_MDE, RUN_SD = 0.05, 0.05, 0.10, 0.02


def _recorded_steps() -> list[np.ndarray]:
    """Log step times of the recorded ``all-off`` runs, centred and scaled to a run SD of :data:`RUN_SD`."""
    runs = [r for r in json.loads(POOL.read_text())["runs"] if r["status"] == "ok" and r["label"] == "all-off"]
    logs = [np.log(r["step_time_s"]) for r in runs]
    m = np.mean([np.median(x) for x in logs])
    scale = RUN_SD / float(np.std([np.median(x) for x in logs], ddof=1))
    return [(x - m) * scale for x in logs]


def _sides(change: float) -> tuple[list[list[float]], list[list[float]]]:
    """Per run, the step times (s) of the baseline and of the candidate (``change`` slower)."""
    logs = _recorded_steps()
    n = len(logs)
    base = [list(2.0 * np.exp(logs[k])) for k in range(n)]
    cand = [list(2.0 * (1 + change) * np.exp(logs[(k + 1) % n])) for k in range(n)]
    return base, cand


def _cell(label: str, runs: list[list[float]]) -> dict:
    reps = [{"repeat": k, "status": "ok", "samples": {"step_time": s, "throughput": [], "rollout_share": [],
                                                       "free_ratio": []}} for k, s in enumerate(runs)]
    return {"key": f"cell={label}", "cell_id": label, "label": label, "levels": {"x": int(label == "cand")},
            "status": "ok", "failures": [], "missing_repeats": [], "repeats": reps}


def _snap(cells: list[dict]) -> dict:
    return {"format": "grpo-bench-snapshot", "format_version": 1, "engine": "embedded", "platform": "cpu",
            "source": {"sweep": "s"}, "cells": cells, "base": {}, "versions": {}, "name": "b", "_kind": "baseline"}


def _stored(base: list, cand: list) -> str:
    """The stored gate's comparison (``gate --baseline``): the same levels on both sides, a baseline that measured
    a small sweep-to-sweep offset on 10 degrees of freedom."""
    b, c = _cell("base", base), _cell("base", cand)
    s2s = {"sd_log": 0.005, "df": 10, "sweeps": 11}
    res = compare_snapshots(_snap([b]), _snap([c]), metrics=["step_time"], threshold=THRESHOLD, alpha=ALPHA,
                            n_boot=0, seed=0, pairing=False, max_mde=MAX_MDE, normalize=False, test=None, s2s=s2s)
    return res["verdict"]


def _interleaved(base: list, cand: list) -> str:
    """The interleaved gate's comparison: block ``k`` holds baseline run ``k`` and candidate run ``k``."""
    recs = []
    for k, (sb, sc) in enumerate(zip(base, cand)):
        for version, steps in (("baseline", sb), ("candidate", sc)):
            timed = list(range(2, 2 + len(steps)))
            recs.append({"cell_id": "c", "repeat": k, "code_version": version, "status": "ok", "label": "all-off",
                         "summary": {"timed_steps": timed, "step_time_samples_s": steps},
                         "steps": {str(s): {"timing_s/step": x} for s, x in zip(timed, steps)}})
    return paired_comparison(recs, threshold=THRESHOLD, alpha=ALPHA, max_mde=MAX_MDE, normalize=False)["verdict"]


def _report(base: list, cand: list) -> str:
    """The sweep report's claims: "the candidate is not slower than the baseline by more than the threshold"
    (``at_least: -threshold`` improvement), judged on the same runs; the gate's outcome of that claim."""
    claim = {"claim": "cand vs base", "metric": "step_time", "cell": "cand", "reference": "base",
             "at_least": -THRESHOLD, "at_most": None, "comparison": {}, "result": "cannot judge"}
    out = claims_on_runs(_snap([_cell("base", base), _cell("cand", cand)]), [claim], ALPHA)
    return gate_outcome([], [out[0]["result"]]).verdict


@pytest.mark.parametrize("change,expected", [(0.30, "regression"), (0.0, "pass")])
def test_the_same_runs_get_the_same_verdict_through_each_path(change, expected):
    base, cand = _sides(change)
    assert [_stored(base, cand), _interleaved(base, cand), _report(base, cand)] == [expected] * 3


def test_every_gate_verdict_goes_through_the_one_decision(monkeypatch):
    """A change to the one function changes both gates: a decision that never calls a regression passes the +30 %
    runs in the stored and the interleaved gate alike."""
    calls = []

    def never(ev: Evidence):
        calls.append(ev)
        return decide_change(ev).__class__("unchanged", True, False, False)

    import bench.gate.runs as runs_mod
    import bench.gate.stored_runs as stored_mod
    monkeypatch.setattr(runs_mod, "decide_change", never)
    monkeypatch.setattr(stored_mod, "decide_change", never)
    base, cand = _sides(0.30)
    assert _stored(base, cand) == "pass" and _interleaved(base, cand) == "pass"
    assert len(calls) >= 2 and all(isinstance(e, Evidence) and e.threshold == THRESHOLD for e in calls)


def test_decide_change_rules_on_their_edges():
    thr = math.log1p(THRESHOLD)
    seen = {"threshold": THRESHOLD, "alpha": ALPHA, "mde": 0.06, "max_mde": MAX_MDE}
    assert decide_change(Evidence(estimate=thr + 0.01, lo=0.001, hi=0.2, **seen)).verdict == "regression"
    # the interval touches 0: not a regression, and not unchanged either (its top is beyond max_mde)
    assert decide_change(Evidence(estimate=thr + 0.01, lo=-0.001, hi=0.2, **seen)).verdict == "noisy"
    # it cannot see max_mde: never a verdict
    blind = dict(seen, mde=0.12)
    assert decide_change(Evidence(estimate=0.3, lo=0.2, hi=0.4, **blind)).verdict == "noisy"
    assert decide_change(Evidence(estimate=0.0, lo=-0.02, hi=0.02, **seen)).verdict == "unchanged"
    vetoed = decide_change(Evidence(estimate=0.3, lo=0.2, hi=0.4, robust=decide_mod.Robust(False, False), **seen))
    assert vetoed.verdict == "noisy" and vetoed.slower
    # the per-step rule: no interval, no power rule, p < alpha
    step = {"threshold": THRESHOLD, "alpha": ALPHA, "scale": "relative"}
    assert decide_change(Evidence(estimate=0.06, p_value=0.01, **step)).verdict == "regression"
    assert decide_change(Evidence(estimate=0.06, p_value=0.2, **step)).verdict == "unchanged"
    assert decide_change(Evidence(estimate=-0.06, p_value=0.01, **step)).verdict == "improvement"
    with pytest.raises(ValueError, match="scale"):
        decide_change(Evidence(estimate=0.0, threshold=THRESHOLD, alpha=ALPHA, scale="linear"))  # type: ignore[arg-type]
    assert gate_outcome(["unchanged", "noisy"]).verdict == "cannot judge"
    assert gate_outcome(["unchanged"], ["not met"]).exit_code == 1
    assert gate_outcome([], empty="cannot judge").exit_code == 3 and gate_outcome([]).exit_code == 0
