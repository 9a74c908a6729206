"""Designs and planning: cell counts, invalid cells, fractional resolution, merging of n/a factors."""

from __future__ import annotations

import numpy as np
import pytest

from bench.spec.design import expand
from bench.spec.matrix import Matrix
from bench.spec.optimizations import CONFLICTS, FACTOR_KEYS, REGISTRY, applicability
from bench.spec.plan import make_plan

#: the seven optimizations of the article, built in, first in the registry (entry points in pyproject order)
ARTICLE = ("rmsnorm_fused", "task_queue", "dynamic_bsz", "forward_prefetch", "mc2", "mrope_cache", "graph_mode")
#: every registered factor at its first two levels (off, on): 0/1 for the article's seven
BINARY = {k: list(REGISTRY[k].levels[:2]) for k in FACTOR_KEYS}


def _applicable(m: Matrix, platform: str) -> list[str]:
    """The registered factors applicable to ``m`` on ``platform`` (registry order)."""
    return [k for k in FACTOR_KEYS if applicability(k, m.engine, platform, m.base.context()) is None]


def test_registry_has_the_seven_optimizations_as_data():
    assert tuple(FACTOR_KEYS)[:7] == ARTICLE  # a new optimization (CONTRIBUTING's recipe) comes after them
    assert {REGISTRY[k].section for k in ARTICLE} == {"3.1.1", "3.1.2", "3.2.1", "3.2.2", "3.3.1", "3.3.2", "2.5"}
    assert all(REGISTRY[k].key == k for k in FACTOR_KEYS)
    assert REGISTRY["task_queue"].levels == (0, 1, 2)
    assert all(BINARY[k] == [0, 1] for k in ARTICLE)
    assert CONFLICTS[0].when == {"graph_mode": 1, "task_queue": 2}


def test_full_design_of_binary_factors_is_2_to_the_k_cells_none_invalid():
    k = len(FACTOR_KEYS)
    m = Matrix(name="t", engine="verl", platform="npu", factors=BINARY)
    assert len(expand(m).cells) == 2**k
    plan = make_plan(m, "npu", strict=False)
    # task_queue at 0/1 never meets the graph-mode conflict (which needs TASK_QUEUE_ENABLE=2);
    # at rollout TP 1 mc2 is not applicable, so its two levels merge: 2^6 = 64 runs of the article's seven
    applicable = _applicable(m, "npu")
    assert [f for f in ARTICLE if f not in applicable] == ["mc2"]
    assert plan.design_cells == 2**k and plan.dropped == []
    assert len(plan.runs) == 2 ** len(applicable)
    assert all(r.levels["mc2"] is None and len(r.cells) == 2 ** (k - len(applicable)) for r in plan.runs)


def test_full_design_with_task_queue_level_2_drops_graph_mode_conflicts():
    k = len(FACTOR_KEYS)
    m = Matrix(name="t", engine="verl", platform="npu", factors={**BINARY, "task_queue": [0, 2]},
               base={"rollout_tp": 2})
    plan = make_plan(m, "npu", strict=False)
    # graph_mode=1 with task_queue=2 fixes 2 factors -> 2^(k-2) invalid cells (32 of the article's 128)
    assert plan.design_cells == 2**k
    assert len(plan.dropped) == 2 ** (k - 2) and {d.kind for d in plan.dropped} == {"invalid"}
    assert all(d.cell["graph_mode"] == 1 and d.cell["task_queue"] == 2 for d in plan.dropped)
    # at rollout TP 2 all seven apply on verl:npu: 128 - 32 = 96 runs of the article's seven
    applicable = _applicable(m, "npu")
    assert set(ARTICLE) <= set(applicable)
    assert len(plan.runs) == 2 ** len(applicable) - 2 ** (len(applicable) - 2)


def test_default_levels_give_3_times_2_to_the_6_cells_and_a_sixth_invalid():
    m = Matrix(name="t", factors=list(FACTOR_KEYS))
    defaults = {k: REGISTRY[k].default_levels for k in FACTOR_KEYS}
    assert defaults["task_queue"] == (0, 1, 2) and all(defaults[k] == (0, 1) for k in ARTICLE if k != "task_queue")
    cells = int(np.prod([len(v) for v in defaults.values()]))
    assert len(expand(m).cells) == cells  # 3 * 2^6 = 192 for the article's seven
    plan = make_plan(m, "cpu")
    # graph_mode=1 with task_queue=2: one of 2 x one of 3 levels -> 32 of 192
    assert len(plan.dropped) == cells // (len(defaults["graph_mode"]) * len(defaults["task_queue"]))


def test_one_at_a_time_is_one_plus_k_cells_each_differing_in_one_factor():
    k = len(FACTOR_KEYS)
    m = Matrix(name="t", factors=BINARY, design={"type": "one_at_a_time"})
    cells = expand(m).cells
    assert len(cells) == 1 + k  # 8 for the article's seven
    assert cells[0] == {f: lv[0] for f, lv in BINARY.items()}
    changed = [[f for f in FACTOR_KEYS if c[f] != cells[0][f]] for c in cells[1:]]
    assert changed == [[f] for f in FACTOR_KEYS]  # each factor once, alone, at its other level
    assert all(c[f] == BINARY[f][1] for c, (f,) in zip(cells[1:], changed))
    m2 = Matrix(name="t", factors=BINARY, design={"type": "one_at_a_time", "reference": "all_on"})
    cells2 = expand(m2).cells
    assert cells2[0] == {f: lv[-1] for f, lv in BINARY.items()} and len(cells2) == 1 + k


def test_fractional_is_resolution_iv_and_balanced():
    k = len(FACTOR_KEYS)
    m = Matrix(name="t", factors=BINARY, design={"type": "fractional", "resolution": 4})
    d = expand(m)
    n = len(d.cells)
    assert d.resolution == 4
    # resolution IV needs at least 2k runs, a power of two: 16 for the article's seven (of 128)
    assert n & (n - 1) == 0 and 2 * k <= n < 2**k
    if k == len(ARTICLE):
        assert n == 16
    x = np.array([[1 if c[f] == BINARY[f][1] else -1 for f in FACTOR_KEYS] for c in d.cells])
    assert (x.sum(axis=0) == 0).all()  # every factor balanced
    assert (x.T @ x == n * np.eye(k)).all()  # main effects orthogonal
    # resolution IV: no main effect aliased with a two-factor interaction
    for a in range(k):
        for i in range(k):
            for j in range(i + 1, k):
                if a not in (i, j):
                    assert abs(x[:, a] @ (x[:, i] * x[:, j])) < n
    assert d.aliases[0].startswith(f"{FACTOR_KEYS[0]} = ")


def test_not_applicable_factors_merge_on_the_embedded_engine():
    k = len(FACTOR_KEYS)
    m = Matrix(name="t", factors=BINARY)
    plan = make_plan(m, "cpu")
    applicable = _applicable(m, "cpu")
    # of the article's seven, rmsnorm_fused x dynamic_bsz apply on the embedded engine: 4 runs of 32 cells
    assert [f for f in ARTICLE if f in applicable] == ["rmsnorm_fused", "dynamic_bsz"]
    assert len(plan.runs) == 2 ** len(applicable)
    assert [len(r.cells) for r in plan.runs] == [2 ** (k - len(applicable))] * len(plan.runs)
    assert set(plan.runs[0].not_applicable) == set(FACTOR_KEYS) - set(applicable)
    assert {"task_queue", "forward_prefetch", "mc2", "mrope_cache", "graph_mode"} <= set(plan.runs[0].not_applicable)
    assert len({r.cell_id for r in plan.runs}) == len(plan.runs)
    # the same configuration hashes to the same cell id on every planning
    assert [r.cell_id for r in make_plan(m, "cpu").runs] == [r.cell_id for r in plan.runs]


def test_mc2_not_applicable_at_tp1_applicable_at_tp2():
    assert "tensor_model_parallel_size >= 2" in applicability("mc2", "verl", "npu", {"rollout_tp": 1})
    assert applicability("mc2", "verl", "npu", {"rollout_tp": 2}) is None
    assert applicability("task_queue", "verl", "cuda", {}) is not None


def test_exclude_rules_and_no_runnable_cell():
    from bench.core.errors import BenchError

    m = Matrix(name="t", factors={"dynamic_bsz": [0, 1]}, exclude=[{"when": {"dynamic_bsz": 1}, "reason": "x"}])
    plan = make_plan(m, "cpu")
    assert len(plan.runs) == 1 and plan.dropped[0].reason == "x"
    m2 = Matrix(name="t", factors={"dynamic_bsz": [0, 1]}, exclude=[{"when": {}}])
    with pytest.raises(BenchError, match="no runnable cell"):
        make_plan(m2, "cpu")
