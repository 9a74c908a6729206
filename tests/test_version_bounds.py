"""Version-aware factors (issue 32): the version ranges of every factor's switch carry their sources, a
stack outside a range does not read the factor (dry run names it, the report never shows its effect as
measured), and the graph-mode / task-queue-2 conflict follows the installed verl."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from bench.commands.dry_run import plan_json, print_dry_run
from bench.core.errors import BenchError
from bench.engines.verl.launch import VerlEngine
from bench.engines.verl.notes import mc2_note
from bench.spec.loading import load_matrix
from bench.spec.optimizations import (
    CONFLICTS,
    REGISTRY,
    conflict_lifts,
    conflicts_of,
    not_read,
    resolve,
    switch_ranges,
)
from bench.spec.optimizations.versions import STACK_ENV, stack_versions
from bench.spec.plan import make_plan, merge_mechanisms

REPO = Path(__file__).resolve().parent.parent
NPU_MATRIX = REPO / "matrix" / "qwen3vl8b_a2.yaml"
GRAPH_TQ2 = {"graph_mode": 1, "task_queue": 2}
#: the terms of a 2x2 sweep of mc2 and dynamic_bsz that involve mc2 (main effect, interaction)
NOT_READ_TERMS = {"mc2", "dynamic_bsz:mc2"}


def test_every_bound_names_its_source():
    ranges = [(k, t, r) for k, o in REGISTRY.items() for t, rs in o.switches.items() for r in rs]
    assert {k for k, _, _ in ranges} >= {"mc2", "task_queue", "graph_mode", "dynamic_bsz", "forward_prefetch"}
    for key, target, rng in ranges:
        assert rng.switch and rng.bounds(), (key, target)
        for b in rng.bounds():
            if b.version is None:
                assert b.source.startswith("unconfirmed"), (key, target, b)
            else:
                assert " PR " in f" {b.source}" or "tag v" in b.source, (key, target, b)
    lifts = [lift for c in CONFLICTS for lift in c.lifted]
    assert lifts and all("PR " in lift.since.source and lift.since.version for lift in lifts)


def test_mc2_range_is_the_checked_one():
    (rng,) = switch_ranges("mc2", "verl", "npu")
    assert (rng.package, rng.switch) == ("vllm_ascend", "VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE")
    assert (rng.since.version, rng.until.version) == ("0.10.0rc1", "0.25.1rc1")
    assert "PR 12119" in rng.until.source and "PR 1926" in rng.since.source
    why = not_read("mc2", "verl", "npu", {"vllm_ascend": "0.25.1rc1"})
    assert why.startswith("mc2: not read by vllm-ascend 0.25.1rc1 (VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE removed in "
                          "vllm-ascend PR 12119")
    assert "added in vllm-ascend PR 1926" in not_read("mc2", "verl", "npu", {"vllm_ascend": "0.9.2rc1"})
    for read in ("0.10.0rc1", "0.11.0", "0.24.0rc1", "0.24.0"):
        assert not_read("mc2", "verl", "npu", {"vllm_ascend": read}) is None, read
    assert not_read("mc2", "verl", "npu", {}) is None  # unknown version: cannot tell, not "not read"
    assert mc2_note({"vllm_ascend": "0.26.0+npu"}).startswith("mc2: not read by vllm-ascend 0.26.0+npu")


def test_stack_versions_npu_needs_the_npu_stack_and_env_fakes_it(monkeypatch):
    monkeypatch.delenv(STACK_ENV, raising=False)
    assert stack_versions("npu", {"verl": "0.9.1", "torch": "2.13.0"}) == {}
    assert stack_versions("npu", {"verl": "0.9.1", "torch_npu": "2.8.0"}) == {"verl": "0.9.1", "torch_npu": "2.8.0"}
    assert stack_versions("cpu", {"verl": "0.9.1", "mlflow": "3.7"}) == {"verl": "0.9.1"}
    monkeypatch.setenv(STACK_ENV, "vllm-ascend=0.25.1rc1, verl=0.9.1")
    assert stack_versions("npu", {"verl": "0.6.1"}) == {"vllm_ascend": "0.25.1rc1", "verl": "0.9.1"}
    assert stack_versions("npu", {}, env=False) == {}
    monkeypatch.setenv(STACK_ENV, "vllm_ascend")
    with pytest.raises(BenchError, match=STACK_ENV):
        stack_versions("npu", {})


def _dry_run_text(plan) -> str:
    buf = io.StringIO()
    print_dry_run(plan, Console(file=buf, width=200))
    return buf.getvalue()


def test_dry_run_names_mc2_not_read_with_a_faked_vllm_ascend(monkeypatch):
    monkeypatch.setenv(STACK_ENV, "vllm_ascend=0.25.1rc1")
    plan = make_plan(load_matrix(NPU_MATRIX), strict=False)
    text = _dry_run_text(plan)
    assert "mc2: not read by vllm-ascend 0.25.1rc1 (VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE removed in vllm-ascend " \
           "PR 12119" in text
    assert list(plan_json(plan)["not_read"]) == ["mc2"]
    monkeypatch.setenv(STACK_ENV, "vllm_ascend=0.11.0")
    plan = make_plan(load_matrix(NPU_MATRIX), strict=False)
    assert "not read by" not in _dry_run_text(plan) and plan_json(plan)["not_read"] == {}


def test_graph_mode_task_queue_2_follows_the_installed_verl(monkeypatch):
    old, new = {"verl": "0.8.0", "torch_npu": "2.8.0"}, {"verl": "0.9.0", "torch_npu": "2.8.0"}
    assert conflicts_of(GRAPH_TQ2) and conflicts_of(GRAPH_TQ2, "verl", "npu", old)
    assert conflicts_of(GRAPH_TQ2, "verl", "npu", new) == []
    assert conflicts_of(GRAPH_TQ2, "verl", "cuda", new)  # VLLM_ASCEND_TASK_QUEUE_ENABLE: verl's NPU platform only
    assert conflicts_of({"graph_mode": 1, "task_queue": 1}, "verl", "npu", old) == []
    ((env, note),) = conflict_lifts(GRAPH_TQ2, "verl", "npu", new)
    assert env == {"VLLM_ASCEND_TASK_QUEUE_ENABLE": "1"} and "verl 0.9.0" in note and "PR 6562" in note
    assert conflict_lifts(GRAPH_TQ2, "verl", "npu", old) == []

    base = load_matrix(NPU_MATRIX).base
    levels = {"graph_mode": 1, "task_queue": 2}
    mech = merge_mechanisms([resolve(k, v, "verl", "npu") for k, v in levels.items()])
    monkeypatch.setenv(STACK_ENV, "verl=0.9.1,torch_npu=2.8.0")
    launch = VerlEngine().build(base, mech, "npu", levels, strict=False)
    assert launch.env["TASK_QUEUE_ENABLE"] == "2" and launch.env["VLLM_ASCEND_TASK_QUEUE_ENABLE"] == "1"
    monkeypatch.setenv(STACK_ENV, "verl=0.8.0,torch_npu=2.8.0")
    assert "VLLM_ASCEND_TASK_QUEUE_ENABLE" not in VerlEngine().build(base, mech, "npu", levels, strict=False).env


def test_report_marks_mc2_not_read_instead_of_an_effect():
    from drift_fake import drift_snapshot

    from bench.commands.report_markdown import render
    from bench.report.tables import analyze
    from bench.spec.plan import run_order

    cells = [{"cell_id": f"c{m}{d}", "label": f"mc2={m} dbsz={d}", "all_off": not (m or d),
              "levels": {"mc2": m, "dynamic_bsz": d}} for m in (0, 1) for d in (0, 1)]
    ids = [c["cell_id"] for c in cells]
    snap = drift_snapshot(cells, run_order(ids, 2, "blocked", 5), seed=5, effects={"mc2": -0.1})
    snap.update(engine="verl", platform="npu", versions={"vllm_ascend": "0.25.1rc1", "torch_npu": "2.8.0"})
    data = analyze(snap, alpha=0.05)
    fit = data["effects"]["fit"]
    assert "mc2" not in {t["name"] for t in fit["terms"]} and "dynamic_bsz" in {t["name"] for t in fit["terms"]}
    assert {t["name"] for t in fit["not_read_terms"]} == NOT_READ_TERMS
    row = next(r for r in data["article"] if r.get("factor") == "mc2")
    assert row["ours_effect"] is None and row["ours_cell"] is None
    assert "not read by vllm-ascend 0.25.1rc1" in row["note"]
    md = render({"alpha": 0.05, "speed_normalized_to_s": None, **data,
                 "sweep": {"matrix": "m", "sweep_id": "s", "sweep": "m/s", "engine": "verl", "platform": "npu",
                           "design": "full", "repeats": 2, "versions": snap["versions"]}})
    assert "| mc2 | not read | not read |" in md
    snap["versions"] = {"vllm_ascend": "0.11.0", "torch_npu": "2.8.0"}  # a stack that reads it: measured
    assert "mc2" in {t["name"] for t in analyze(snap, alpha=0.05)["effects"]["fit"]["terms"]}


def test_preflight_refuses_an_mc2_sweep_the_stack_does_not_read(monkeypatch):
    import importlib.util

    from bench.spec.launch import Launch

    if importlib.util.find_spec("verl") is None:  # preflight first checks that verl is installed
        pytest.skip("verl is not installed")
    matrix = load_matrix(NPU_MATRIX)
    launch = Launch(argv=["{python}", "-m", "verl.trainer.main_ppo"], env={"VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE": "1"})
    monkeypatch.setenv(STACK_ENV, "vllm_ascend=0.25.1rc1")
    with pytest.raises(BenchError, match=r"factors\.mc2: not read by vllm-ascend 0\.25\.1rc1 .*PR 12119"):
        VerlEngine().preflight(matrix, [launch], "npu")
