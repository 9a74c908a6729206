"""The typed result model and the run-level statistics (issue 11): one definition of each statistic,
run-level tests checked against scipy, baselines validated on load."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from _sweeps import EMBEDDED_CELLS, make_sweep
from scipy import stats as sps

from bench.core.errors import BenchError
from bench.gate.baseline import load_baseline
from bench.records.figures import Snapshot, cell_stats, cell_value, run_value, speedup
from bench.records.snapshot import snapshot
from bench.stats.effects import cell_means_residual, fit_effects, run_contrast


def test_run_value_cell_value_and_speedup():
    assert run_value([3.0, 1.0, 2.0, 10.0]) == 2.5 and run_value([]) is None
    assert cell_value([1.0, 4.0]) == pytest.approx(2.0)  # geometric mean of the runs
    assert cell_value([0.0, 0.2]) == pytest.approx(0.1)  # a ratio that can be 0: arithmetic mean
    assert cell_value([None]) is None
    assert speedup(2.0, 1.6) == pytest.approx(1.25) and speedup(2.0, None) is None


def test_cell_stats_of_a_snapshot_use_the_run_medians(tmp_path):
    sweep = make_sweep(tmp_path, "m", EMBEDDED_CELLS, repeats=3, steps=6)
    m = Snapshot.model_validate(snapshot(sweep, tmp_path))
    st = cell_stats(m)
    for c in m.cells:
        runs = [float(np.median(r.samples.step_time)) for r in c.ok_repeats()]
        assert [v for _, v in st[c.cell_id]["runs"]] == runs
        assert st[c.cell_id]["value"] == pytest.approx(math.exp(np.mean(np.log(runs))))
    ref = next(c for c in m.cells if c.all_off)
    for c in m.cells:
        assert st[c.cell_id]["speedup"] == pytest.approx(st[ref.cell_id]["value"] / st[c.cell_id]["value"])


def test_run_contrast_is_the_pooled_t_test():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.0, 0.05, 4), rng.normal(0.08, 0.05, 4)
    sd, df = cell_means_residual([[(0, x) for x in a], [(0, x) for x in b]], blocked=False)
    assert df == 6
    con = run_contrast(a, b, sd, df, alpha=0.05)
    t = sps.ttest_ind(b, a, equal_var=True)
    assert con.p_value == pytest.approx(t.pvalue, rel=1e-9)
    assert con.diff == pytest.approx(b.mean() - a.mean())
    ci = t.confidence_interval(0.95)
    assert (con.ci_low, con.ci_high) == pytest.approx((ci.low, ci.high), rel=1e-9)
    # no variance estimated: estimate only
    none = run_contrast([0.1], [0.2], None, 0)
    assert none.diff == pytest.approx(0.1) and none.p_value is None and none.ci_low is None


def test_blocks_absorb_a_shift_shared_by_every_cell_of_a_block():
    rng = np.random.default_rng(1)
    shift = {0: 0.0, 1: 0.10, 2: 0.20}  # the machine slows down block by block
    cells = [[(k, mu + shift[k] + rng.normal(0, 0.005)) for k in range(3)] for mu in (0.0, 0.02, 0.04)]
    sd_b, df_b = cell_means_residual(cells, blocked=True)
    sd_u, df_u = cell_means_residual(cells, blocked=False)
    assert (df_b, df_u) == (4, 6)
    assert sd_b < 0.01 < 0.05 < sd_u


def test_fit_effects_on_runs_with_blocks_and_holm():
    import itertools

    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(2)
    obs, y, blocks = [], [], []
    for k in range(3):
        for a, b in itertools.product((0, 1), repeat=2):
            obs.append({"a": a, "b": b})
            blocks.append(k)
            y.append(0.1 * a + 0.03 * k + rng.normal(0, 0.01))
    fit = fit_effects(obs, y, ["a", "b"], alpha=0.05, blocks=blocks)
    assert fit.unit == "run" and fit.n_blocks == 3 and fit.df_resid == 12 - 6 and fit.replicated
    t = {x.name: x for x in fit.terms}
    assert t["a"].ci_low < 0.1 < t["a"].ci_high and t["a"].significant
    adj = multipletests([x.p_value for x in fit.terms], method="holm")[1]
    assert [x.p_adjusted for x in fit.terms] == pytest.approx(list(adj))
    # a factor that changes only between blocks cannot be told from the machine's drift
    conf = fit_effects([{"a": int(k >= 1), "b": b} for k, b in zip(blocks, [o["b"] for o in obs])], y, ["a", "b"],
                       blocks=blocks)
    assert conf.not_estimable.get("a") == "confounded with the time blocks"


def test_baseline_is_validated_against_the_model_on_load(tmp_path):
    bad = {"format": "grpo-bench-baseline", "format_version": 1, "engine": "embedded", "platform": "cpu",
           "source": {}, "cells": [{"key": "x", "label": "all-off", "levels": {}, "status": "ok", "repeats": []}]}
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "b.json").write_text(json.dumps(bad))
    with pytest.raises(BenchError, match=r"b\.json: cells\.0\.cell_id: Field required"):
        load_baseline("b", tmp_path)
