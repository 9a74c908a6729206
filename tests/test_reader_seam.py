"""A reader is a whole format (issue 47): the toy format's ``step_ops`` alone gives its operators to the op times
of "where it acts", the top operators of MLflow's profile summary and the run's categories, through the readers'
registry (no module names the format)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.measure.formats import register_reader, unregister_reader
from bench.measure.run_categories import run_categories
from bench.measure.run_ops import run_op_times
from bench.measure.top_ops import step_top_ops

PLUGIN = Path(__file__).resolve().parent / "plugin_pkg"


@pytest.fixture
def toy_run(tmp_path):
    sys.path.insert(0, str(PLUGIN))
    try:
        from grpo_bench_toy.reader import ToyTraceReader
    finally:
        sys.path.remove(str(PLUGIN))
    register_reader(ToyTraceReader())
    (tmp_path / "toy_free.txt").write_text("5 0.4\n")
    (tmp_path / "toy_ops.txt").write_text("5 toy_matmul 1 3000\n5 toy_copy 2 500\n4 toy_add 1 9\n")
    try:
        yield tmp_path
    finally:
        unregister_reader("toytrace")


def test_step_ops_feed_op_times_top_ops_and_categories(toy_run):
    sources = [{"kind": "toytrace", "source": "toy_free.txt"}]
    times = run_op_times(toy_run, {"free_ratio_detail": {"5": {"sources": sources}, "4": {"sources": sources}}})
    five = times["steps"]["5"]
    assert five["sources"] == ["toy_ops.txt"] and five["basis"] == ["cpu"]
    assert (five["category_ms"]["matmul"], five["category_ms"]["copy"]) == (3.0, 0.5)  # us -> ms, by name
    assert five["ops"] == {"toy_matmul": 3.0, "toy_copy": 0.5} and five["phases"].keys() == {"all"}
    assert times["steps"]["4"]["ops"] == {"toy_add": 0.009}
    top = step_top_ops(toy_run, 5, sources)
    assert top["source"] == "toy_ops.txt" and top["device"] == [] and top["window_ms"] is None
    assert [(o["name"], o["calls"], o["self_ms"]) for o in top["cpu"]] == [("toy_matmul", 1, 3.0), ("toy_copy", 2, 0.5)]
    cats = run_categories(toy_run)  # the default categories: the Free-ratio steps (5 only) and their operators
    assert [(s["path"], s["kind"]) for s in cats["sources"]] == [("toy_ops.txt", "toytrace")]
    assert {c: v for c, v in cats["steps"][5]["category_us"].items() if v} == {"matmul": 3000.0, "copy": 500.0}
    assert cats["steps"][5]["share"]["matmul"] == pytest.approx(3000 / 3500)


def test_a_source_of_an_unknown_format_is_a_warning(toy_run):
    times = run_op_times(toy_run, {"free_ratio_detail": {"5": {"sources": [{"kind": "nosuch", "source": "x"}]}}})
    assert times["steps"] == {} and times["warnings"] == ["step 5: x: no operator table (unreadable or no such step)"]
    assert step_top_ops(toy_run, 5, [{"kind": "nosuch", "source": "x"}]) is None
