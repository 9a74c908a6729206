"""bench.stats (estimators, stat_tests, effects, power): the two-sample comparison, the verdict rule,
OLS effects, noise and MDE."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from bench.stats.effects import fit_effects
from bench.stats.estimators import hl_shift, min_attainable_p, min_samples_for
from bench.stats.power import mde_from_se, noise_components
from bench.stats.stat_tests import compare, verdict


def test_hodges_lehmann_and_exact_p_limits():
    assert hl_shift(np.array([1.0, 2.0, 3.0]), np.array([2.0, 3.0, 4.0])) == 1.0
    assert min_attainable_p(6, 6) == pytest.approx(2 / 924)
    assert min_attainable_p(4, 4) == pytest.approx(2 / 70)
    assert min_samples_for(0.01) == 5 and min_samples_for(0.05) == 4


def test_compare_recovers_a_ten_percent_change_with_interval():
    rng = np.random.default_rng(0)
    base = [np.exp(rng.normal(np.log(2.0), 0.02, 5)) for _ in range(2)]
    cand = [np.exp(rng.normal(np.log(2.2), 0.02, 5)) for _ in range(2)]
    c = compare(base, cand, alpha=0.01, n_boot=500)
    assert c.n_base == c.n_cand == 10 and c.runs_base == 2
    assert 0.08 < c.change < 0.12 and c.ci_low < c.change < c.ci_high and c.ci_low > 0.05
    assert c.p_value == pytest.approx(2 / math.comb(20, 10))  # complete separation, exact test
    same = compare(base, base, alpha=0.01, n_boot=200)
    assert same.change == 0 and same.p_value == 1.0


def test_paired_compare_uses_step_differences():
    rng = np.random.default_rng(3)
    work = rng.normal(0, 0.3, 10)
    base = [np.exp(np.log(1.0) + work + rng.normal(0, 0.01, 10))]
    cand = [np.exp(np.log(1.1) + work + rng.normal(0, 0.01, 10))]
    p = compare(base, cand, alpha=0.01, n_boot=300, paired=True)
    u = compare(base, cand, alpha=0.01, n_boot=300)
    assert p.test.startswith("wilcoxon") and u.test == "mann-whitney u"
    assert 0.08 < p.change < 0.12 and p.p_value == pytest.approx(2 / 2 ** 10) and p.min_p == pytest.approx(2 / 2 ** 10)
    assert p.ci_low > 0.05 and p.se < u.se
    assert u.p_value > 0.1  # the workload spread hides the shift from the unpaired test
    # groups that do not align fall back to unpaired
    assert compare(base, [cand[0][:9]], paired=True).test == "mann-whitney u"


def test_compare_linear_scale_for_zero_values_and_empty():
    c = compare([[0.0, 0.1, 0.2]], [[0.1, 0.2, 0.3]], alpha=0.05, n_boot=100)
    assert c.scale == "linear" and c.change == pytest.approx(1.0)
    e = compare([[]], [[1.0]], alpha=0.05)
    assert e.change is None and e.n_base == 0


def test_verdict_needs_threshold_and_significance():
    assert verdict(0.10, 0.001, threshold=0.05, alpha=0.01) == "regression"
    assert verdict(0.10, 0.02, threshold=0.05, alpha=0.01) == "unchanged"  # not significant
    assert verdict(0.03, 1e-9, threshold=0.05, alpha=0.01) == "unchanged"  # below threshold
    assert verdict(-0.10, 0.001, threshold=0.05, alpha=0.01) == "improvement"
    assert verdict(-0.10, 0.001, threshold=0.05, alpha=0.01, higher_is_better=True) == "regression"
    assert verdict(None, 0.0, threshold=0.05, alpha=0.01) == "unchanged"


def _simulate(cells, effects, interactions, sd, reps=3, steps=5, seed=0):
    rng = np.random.default_rng(seed)
    obs, y = [], []
    for cell in cells:
        x = {k: 1.0 if v else -1.0 for k, v in cell.items()}
        mu = math.log(2.0) + sum(e * x[k] / 2 for k, e in effects.items())
        mu += sum(e * x[a] * x[b] / 2 for (a, b), e in interactions.items())
        for _ in range(reps * steps):
            obs.append(dict(cell))
            y.append(mu + rng.normal(0, sd))
    return obs, y


def test_full_factorial_recovers_main_effects_and_interaction():
    factors = ["a", "b", "c"]
    cells = [dict(zip(factors, lv)) for lv in itertools.product([0, 1], repeat=3)]
    eff = {"a": -0.15, "b": 0.05, "c": 0.0}
    inter = {("a", "b"): 0.08}
    obs, y = _simulate(cells, eff, inter, sd=0.03)
    fit = fit_effects(obs, y, factors, alpha=0.05)
    terms = {t.name: t for t in fit.terms}
    assert set(terms) == {"a", "b", "c", "a:b", "a:c", "b:c"} and not fit.not_estimable
    for name, true in [("a", -0.15), ("b", 0.05), ("c", 0.0), ("a:b", 0.08), ("a:c", 0.0), ("b:c", 0.0)]:
        t = terms[name]
        assert t.ci_low <= true <= t.ci_high, (name, t)
    assert terms["a"].p_value < 1e-6 and terms["a:b"].p_value < 1e-6
    assert terms["a"].change == pytest.approx(math.expm1(terms["a"].effect))
    assert fit.residual_sd == pytest.approx(0.03, rel=0.25)


def test_fractional_design_states_aliases():
    import pyDOE3

    x = pyDOE3.fracfact("a b c abc")  # 2^(4-1), resolution IV: d = abc
    factors = ["a", "b", "c", "d"]
    cells = [{f: int(v > 0) for f, v in zip(factors, row)} for row in x]
    obs, y = _simulate(cells, {"a": -0.2, "b": 0.0, "c": 0.1, "d": -0.05}, {}, sd=0.02)
    fit = fit_effects(obs, y, factors, alpha=0.05)
    terms = {t.name: t for t in fit.terms}
    for name, true in [("a", -0.2), ("b", 0.0), ("c", 0.1), ("d", -0.05)]:
        assert terms[name].ci_low <= true <= terms[name].ci_high
    # three alias pairs of two-factor interactions: ab=cd, ac=bd, ad=bc
    assert fit.not_estimable == {"b:c": "aliased with a:d", "b:d": "aliased with a:c", "c:d": "aliased with a:b"}
    assert terms["a:b"].aliases == ["c:d"]


def test_one_at_a_time_has_no_interactions_and_multilevel_is_dummy_coded():
    cells = [{"a": 0, "b": 0}, {"a": 1, "b": 0}, {"a": 0, "b": 1}]
    obs, y = _simulate(cells, {"a": -0.1, "b": 0.2}, {}, sd=0.01)
    fit = fit_effects(obs, y, ["a", "b"])
    assert [t.name for t in fit.terms] == ["a", "b"] and "a:b" in fit.not_estimable
    rng = np.random.default_rng(1)
    obs = [{"tq": lv} for lv in (0, 1, 2) for _ in range(10)]
    y = [math.log(2.0) + {0: 0.0, 1: -0.09, 2: -0.12}[o["tq"]] + rng.normal(0, 0.01) for o in obs]
    fit = fit_effects(obs, y, ["tq"])
    terms = {t.name: t for t in fit.terms}
    assert set(terms) == {"tq=1", "tq=2"} and terms["tq=1"].kind == "level"
    assert terms["tq=1"].ci_low < -0.09 < terms["tq=1"].ci_high
    with pytest.raises(ValueError, match="observations"):
        fit_effects([{"a": 0}, {"a": 1}], [0.0, 1.0], ["a"])


def test_noise_components_and_mde():
    rng = np.random.default_rng(2)
    cells = []
    for _ in range(6):
        runs = []
        for _ in range(4):
            off = rng.normal(0, 0.03)
            runs.append(np.exp(np.log(2.0) + off + rng.normal(0, 0.02, 6)))
        cells.append(runs)
    n = noise_components(cells)
    assert n.sd_step == pytest.approx(0.02, rel=0.2)
    assert n.sd_run == pytest.approx(0.03, rel=0.5)
    assert n.steps_per_run == 6 and n.runs_per_cell == 4
    assert n.run_mean_sd() == pytest.approx(math.sqrt(n.sd_run ** 2 + n.sd_step ** 2 / 6))
    small, big = mde_from_se(0.01, alpha=0.05), mde_from_se(0.02, alpha=0.05)
    assert 0 < small < big
    assert mde_from_se(0.01, alpha=0.01, threshold=0.05) > 0.05
    # a tiny alpha on 1 df (gate --alpha 1e-6 at its 2nd block) is "cannot see any change", not OverflowError
    assert mde_from_se(0.2, alpha=1e-6 / 2, df=1) == math.inf
