"""Designs and planning: cell counts, invalid cells, fractional resolution, merging of n/a factors."""

from __future__ import annotations

import numpy as np
import pytest

from bench.spec.design import expand
from bench.spec.matrix import Matrix
from bench.spec.optimizations import CONFLICTS, FACTOR_KEYS, REGISTRY, applicability
from bench.spec.plan import make_plan

BINARY = {k: [0, 1] for k in FACTOR_KEYS}


def test_registry_has_the_seven_optimizations_as_data():
    assert FACTOR_KEYS == ("rmsnorm_fused", "task_queue", "dynamic_bsz", "forward_prefetch", "mc2",
                           "mrope_cache", "graph_mode")
    assert {o.section for o in REGISTRY.values()} == {"3.1.1", "3.1.2", "3.2.1", "3.2.2", "3.3.1", "3.3.2", "2.5"}
    assert REGISTRY["task_queue"].levels == (0, 1, 2)
    assert CONFLICTS[0].when == {"graph_mode": 1, "task_queue": 2}


def test_full_design_of_seven_binary_factors_is_128_cells_none_invalid():
    m = Matrix(name="t", engine="verl", platform="npu", factors=BINARY)
    assert len(expand(m).cells) == 128
    plan = make_plan(m, "npu", strict=False)
    # task_queue at 0/1 never meets the graph-mode conflict (which needs TASK_QUEUE_ENABLE=2);
    # at rollout TP 1 mc2 is not applicable, so its two levels merge: 64 runs
    assert plan.design_cells == 128 and plan.dropped == []
    assert len(plan.runs) == 64
    assert all(r.levels["mc2"] is None and len(r.cells) == 2 for r in plan.runs)


def test_full_design_with_task_queue_level_2_drops_graph_mode_conflicts():
    m = Matrix(name="t", engine="verl", platform="npu", factors={**BINARY, "task_queue": [0, 2]},
               base={"rollout_tp": 2})
    plan = make_plan(m, "npu", strict=False)
    # 128 cells; graph_mode=1 with task_queue=2 fixes 2 factors -> 2^5 = 32 invalid cells
    assert plan.design_cells == 128
    assert len(plan.dropped) == 32 and {d.kind for d in plan.dropped} == {"invalid"}
    assert all(d.cell["graph_mode"] == 1 and d.cell["task_queue"] == 2 for d in plan.dropped)
    assert len(plan.runs) == 96


def test_default_levels_give_192_cells_and_32_invalid():
    m = Matrix(name="t", factors=list(FACTOR_KEYS))
    assert len(expand(m).cells) == 3 * 2**6
    plan = make_plan(m, "cpu")
    assert len(plan.dropped) == 32


def test_one_at_a_time_is_eight_cells_each_differing_in_one_factor():
    m = Matrix(name="t", factors=BINARY, design={"type": "one_at_a_time"})
    cells = expand(m).cells
    assert len(cells) == 8
    assert cells[0] == {k: 0 for k in FACTOR_KEYS}
    assert sorted(sum(c.values()) for c in cells) == [0] + [1] * 7
    m2 = Matrix(name="t", factors=BINARY, design={"type": "one_at_a_time", "reference": "all_on"})
    cells2 = expand(m2).cells
    assert cells2[0] == {k: 1 for k in FACTOR_KEYS} and len(cells2) == 8


def test_fractional_is_16_cells_resolution_iv_and_balanced():
    m = Matrix(name="t", factors=BINARY, design={"type": "fractional", "resolution": 4})
    d = expand(m)
    assert len(d.cells) == 16 and d.resolution == 4
    x = np.array([[c[k] * 2 - 1 for k in FACTOR_KEYS] for c in d.cells])
    assert (x.sum(axis=0) == 0).all()  # every factor balanced
    assert (x.T @ x == 16 * np.eye(7)).all()  # main effects orthogonal
    # resolution IV: no main effect aliased with a two-factor interaction
    for k in range(7):
        for i in range(7):
            for j in range(i + 1, 7):
                if k not in (i, j):
                    assert abs(x[:, k] @ (x[:, i] * x[:, j])) < 16
    assert d.aliases[0].startswith("rmsnorm_fused = ")


def test_not_applicable_factors_merge_on_the_embedded_engine():
    m = Matrix(name="t", factors=BINARY)
    plan = make_plan(m, "cpu")
    assert len(plan.runs) == 4  # rmsnorm_fused x dynamic_bsz
    assert sorted(len(r.cells) for r in plan.runs) == [32, 32, 32, 32]
    assert set(plan.runs[0].not_applicable) == {"task_queue", "forward_prefetch", "mc2", "mrope_cache", "graph_mode"}
    assert len({r.cell_id for r in plan.runs}) == 4
    # the same configuration hashes to the same cell id on every planning
    assert [r.cell_id for r in make_plan(m, "cpu").runs] == [r.cell_id for r in plan.runs]


def test_mc2_not_applicable_at_tp1_applicable_at_tp2():
    assert "tensor_model_parallel_size >= 2" in applicability("mc2", "verl", "npu", {"rollout_tp": 1})
    assert applicability("mc2", "verl", "npu", {"rollout_tp": 2}) is None
    assert applicability("task_queue", "verl", "cuda", {}) is not None


def test_exclude_rules_and_no_runnable_cell():
    from bench.errors import BenchError

    m = Matrix(name="t", factors={"dynamic_bsz": [0, 1]}, exclude=[{"when": {"dynamic_bsz": 1}, "reason": "x"}])
    plan = make_plan(m, "cpu")
    assert len(plan.runs) == 1 and plan.dropped[0].reason == "x"
    m2 = Matrix(name="t", factors={"dynamic_bsz": [0, 1]}, exclude=[{"when": {}}])
    with pytest.raises(BenchError, match="no runnable cell"):
        make_plan(m2, "cpu")
