"""Issue 45: the gate's validity benchmark keeps the real dependence and is not blind. It resamples WHOLE recorded
interleaved gates of unchanged code (``benchmarks/pools/gate_aa_embedded.json``, real runs of ``matrix/gate.yaml`` on
this project's 2-core machine under load; :mod:`real_pools`), so a per-gate version offset reaches the gate; the old
resampling (every gate centred on its own mean, blocks drawn independently) erased it. Every simulated gate runs the
real stop rule look by look (:func:`real_pools.gate_family`)."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import real_pools as rp  # noqa: E402

POOL = rp.POOLS / "gate_aa_embedded.json"


@pytest.fixture(scope="module")
def pool() -> dict:
    return rp.load_pool(POOL)


def _bound(p: float, n: int) -> float:
    """``p`` plus 2.5 Monte Carlo standard errors of a share over ``n`` replications."""
    return p + 2.5 * math.sqrt(p * (1 - p) / n)


def test_the_gate_pool_holds_whole_recorded_gates_with_their_order_and_no_machine_path(pool):
    h = pool["header"]
    assert h["kind"] == "gate" and h["target"] == "embedded:cpu" and "cores" in h["machine"]
    assert len(pool["gates"]) >= 3 and h["blocks"] == sum(len(g["blocks"]) for g in pool["gates"])
    for g in pool["gates"]:
        assert [b["block"] for b in g["blocks"]] == sorted(b["block"] for b in g["blocks"])
        for b in g["blocks"]:
            assert sorted(r["version"] for r in b["runs"]) == ["baseline", "candidate"]
            for r in b["runs"]:
                assert r["status"] != "ok" or len(r["step_time_s"]) == len(r["timed_steps"]) == 6
    ratios = [[rp.block_ratio(b) for b in g["blocks"]] for g in pool["gates"]]
    means = [float(np.mean([x for x in r if x is not None])) for r in ratios]
    assert max(means) - min(means) > 0.005  # recorded gates differ in their offset: nothing was centred
    assert not re.search(r'"/[^"]', POOL.read_text())  # no string of the pool is an absolute path


def test_a_simulated_gate_takes_whole_blocks_of_one_recorded_gate(pool):
    """Every cell and block of a simulated gate comes from ONE recorded gate, both runs of a block from one recorded
    block (as recorded, failed runs too), no recorded block twice within the recorded length, and only the candidate
    is slower, by exactly 1 + change."""
    rng = np.random.default_rng(1)
    n = min(len(g["blocks"]) for g in pool["gates"])
    for _ in range(5):
        recs = rp.gate_records(rng, pool, blocks=n, cells=2, change=0.10)
        assert len({r["_src"][0] for r in recs}) == 1
        for c in ("c0", "c1"):
            mine = [r for r in recs if r["cell_id"] == c]
            per_block = {}
            for r in mine:
                per_block.setdefault(r["repeat"], set()).add(r["_src"])
                g, i = r["_src"]
                src = next(x for x in pool["gates"][g]["blocks"][i]["runs"] if x["version"] == r["code_version"])
                mult = 1.10 if r["code_version"] == "candidate" else 1.0
                assert r["status"] == src["status"]
                assert np.allclose(r["summary"]["step_time_samples_s"], np.array(src["step_time_s"]) * mult)
            assert all(len(v) == 1 for v in per_block.values()) and len(per_block) == n
            assert len({next(iter(v)) for v in per_block.values()}) == n


def test_the_benchmark_sees_a_planted_per_gate_offset(pool):
    """A per-gate version offset of +-40 % (log) planted in the recorded gates, about twice a recorded gate's block
    SD under load (the code still the same on both sides): resampling whole gates, the gate's intervals miss the
    truth 0 in far more than alpha of the gates; the old resampling (each gate centred, blocks independent) gives
    exactly what it gives without the offset: it cannot see it."""
    planted = rp.plant_offsets(pool, [0.4, -0.4])
    kw = dict(reps=60, cells=1, looks=5, alpha=0.05, threshold=0.05, seed=3, stop=False)
    whole, whole0 = rp.gate_family(planted, **kw), rp.gate_family(pool, **kw)
    assert whole["interval"] > _bound(0.05, kw["reps"]) + 0.3 and whole["interval"] > whole0["interval"] + 0.3, whole
    old, old0 = rp.gate_family(planted, independent=True, **kw), rp.gate_family(pool, independent=True, **kw)
    assert (old["interval_k"], old["false_k"]) == (old0["interval_k"], old0["false_k"]), (old, old0)


def test_family_error_at_a_true_zero_holds_over_all_looks_with_the_covariate_never_switched(pool):
    """2 cells, a probe tracking the real block noise at r = 0.9, every look of 8: the share of gates with any
    interval missing 0 and with any false verdict stays within alpha (+2.5 Monte Carlo SE); the covariate is fitted
    at every look of every cell from 3 blocks, also at the looks where the pre-issue-45 rule (a paired t on the probe,
    p < 0.01) switched it off, which exist here: that rule would fail this test."""
    got = rp.gate_family(pool, reps=40, cells=2, looks=8, alpha=0.05, threshold=0.05, rho=0.9, seed=45,
                         stop=False)
    assert got["interval"] <= _bound(0.05, got["n"]) and got["false"] <= _bound(0.05, got["n"]), got
    assert got["cell_looks"] == 40 * 2 * 6 and got["unfitted"] == 0, got
    assert got["probe_t"] >= 1, got


def test_a_failed_run_in_the_pool_reaches_the_real_comparison_as_missing_data(pool):
    """A recorded failed run stays failed in the simulated gate: the real comparison leaves its block out and names
    it (one failure: missing data, not a regression)."""
    from bench.gate.runs import paired_comparison

    failed = rp.plant_offsets(pool, [0.0])
    g = failed["gates"][0]
    n = len(g["blocks"])
    run = next(r for r in g["blocks"][1]["runs"] if r["version"] == "candidate")
    run.update(status="failed", failure_kind="timeout")
    failed["gates"] = [g]
    recs = rp.gate_records(np.random.default_rng(0), failed, blocks=n, cells=1)
    assert sum(r["status"] != "ok" for r in recs) == 1
    row = paired_comparison(recs, threshold=0.05, alpha=0.05)["rows"][0]
    assert row["blocks"] == n - 1 and "left out (a run failed" in row["reason"] and row["verdict"] != "failed"
