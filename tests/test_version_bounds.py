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
from bench.spec.optimizations.versions import PACKAGES, STACK_ENV, stack_versions
from bench.spec.plan import make_plan, merge_mechanisms

REPO = Path(__file__).resolve().parent.parent
NPU_MATRIX = REPO / "matrix" / "qwen3vl8b_a2.yaml"
GRAPH_TQ2 = {"graph_mode": 1, "task_queue": 2}


def test_every_bound_names_its_source():
    ranges = [(k, t, r) for k, o in REGISTRY.items() for t, rs in o.switches.items() for r in rs]
    assert {k for k, _, _ in ranges} >= {"mc2", "task_queue", "graph_mode", "dynamic_bsz", "forward_prefetch",
                                         "rmsnorm_fused", "mrope_cache"}
    unconfirmed = []
    for key, target, rng in ranges:
        assert rng.switch and rng.bounds(), (key, target)
        for b in rng.bounds():
            if b.version is None:
                assert b.source.startswith("unconfirmed"), (key, target, b)
                unconfirmed.append((key, target))
            else:
                assert " PR " in f" {b.source}" or "tag v" in b.source or "docs:" in b.source, (key, target, b)
        assert all(r.package in PACKAGES and r.at.version for r in rng.revisions), (key, target)
    # the two bounds no source can give as one version, each with its written reason (issue 46)
    assert sorted(set(unconfirmed)) == [("mrope_cache", "verl:cpu"), ("task_queue", "embedded:npu"),
                                        ("task_queue", "verl:npu")]


def _revision(key: str, target: str, pr: str):
    (rng,) = REGISTRY[key].switches[target]
    (rev,) = [r for r in rng.revisions if f"PR {pr}," in r.at.source or f"PR {pr} " in r.at.source]
    return rev


@pytest.mark.parametrize(("key", "target", "pr", "package", "version"), [
    ("rmsnorm_fused", "verl:npu", "4186", "verl", "0.7.0"),
    ("rmsnorm_fused", "verl:npu", "6244", "verl", "0.8.0"),
    ("rmsnorm_fused", "verl:npu", "6777", "verl", "0.9.0"),
    ("mc2", "verl:npu", "9064", "vllm_ascend", "0.20.2rc1"),
    ("graph_mode", "verl:*", "9201", "vllm_ascend", "0.20.2rc1"),
    ("graph_mode", "verl:*", "9572", "vllm_ascend", "0.21.0rc1"),
    ("dynamic_bsz", "verl:*", "7272", "verl", "0.9.0"),
    ("forward_prefetch", "verl:*", "6317", "verl", "0.8.0"),
    ("task_queue", "verl:npu", "6562", "verl", "0.9.0"),
])
def test_revisions_inside_a_range_do_not_judge(key, target, pr, package, version):
    """Each change inside a switch's range (issue 46's facts) carries its first release, and a stack at or past it
    still reads the factor (the change does not decide whether the switch is read)."""
    rev = _revision(key, target, pr)
    assert (rev.package, rev.at.version) == (package, version) and f"tag v{version}" in rev.at.source
    engine, platform = target.split(":")
    platform = "npu" if platform == "*" else platform
    stack = {package: version, "torch_npu": "2.8.0"}
    assert not_read(key, engine, platform, stack) is None, (key, stack)


def test_rmsnorm_fused_bounds():
    (npu,) = switch_ranges("rmsnorm_fused", "verl", "npu")
    assert (npu.package, npu.since.version, npu.until) == ("transformers", "4.57.0", None)
    assert not_read("rmsnorm_fused", "verl", "npu", {"transformers": "4.56.2"}).startswith(
        "rmsnorm_fused: not read by transformers 4.56.2 (patch qwen3vl_npu_fused (transformers' Qwen3-VL classes) "
        "added in transformers v4.57.0")
    # a verl after PR 6777 (fused RMSNorm on by default on an NPU) still has the off level: the patch undoes it
    for stack in ({"transformers": "4.57.0", "verl": "0.9.1"}, {"transformers": "5.10.4", "verl": "0.9.0"}):
        assert not_read("rmsnorm_fused", "verl", "npu", stack) is None, stack
    (cuda,) = switch_ranges("rmsnorm_fused", "verl", "cuda")
    assert (cuda.switch, cuda.since.version) == ("actor_rollout_ref.model.use_liger", "0.4.0")
    assert "PR 1032" in cuda.since.source
    assert "use_liger added in verl PR 1032" in not_read("rmsnorm_fused", "verl", "cuda", {"verl": "0.3.0.post1"})
    assert not_read("rmsnorm_fused", "verl", "cuda", {"verl": "0.4.0"}) is None


def test_mrope_cache_bounds():
    (npu,) = switch_ranges("mrope_cache", "verl", "npu")
    assert (npu.since.version, npu.until.version) == ("0.11.0rc1", "0.18.0")
    assert "PR 3509" in npu.since.source and "PR 7762" in npu.until.source
    assert "added in vllm-ascend PR 3509" in not_read("mrope_cache", "verl", "npu", {"vllm_ascend": "0.11.0rc0"})
    # after vllm-ascend PR 4672 (v0.12.0rc1, the vision RoPE cache of vLLM PR 28798) the patch is still read
    for read in ("0.11.0rc1", "0.11.0", "0.12.0rc1", "0.13.0", "0.18.0rc1"):
        assert not_read("mrope_cache", "verl", "npu", {"vllm_ascend": read}) is None, read
    for gone in ("0.18.0", "0.19.1rc1", "0.23.0", "0.25.1rc1"):
        assert "removed in vllm-ascend PR 7762" in not_read("mrope_cache", "verl", "npu", {"vllm_ascend": gone})
    (cpu,) = switch_ranges("mrope_cache", "verl", "cpu")
    assert cpu.since.version is None and "fetch limit" in cpu.since.source
    assert not_read("mrope_cache", "verl", "cpu", {"vllm": "0.12.0"}) is None  # unconfirmed: never judges


def test_task_queue_level_2_bound_is_per_branch():
    (rng,) = switch_ranges("task_queue", "verl", "npu")
    assert rng.since.version is None and "v6.0.rc3" in rng.since.source and "2.1.0.post8" in rng.since.source
    for tn in ("2.1.0.post6", "2.2.0.post2", "2.8.0"):
        assert not_read("task_queue", "verl", "npu", {"torch_npu": tn}) is None, tn
    (embedded,) = switch_ranges("task_queue", "embedded", "npu")
    assert embedded.since == rng.since and embedded.revisions == ()  # verl's PR 6562 is no fact of the embedded engine
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
    assert list(plan_json(plan)["not_read"]) == ["mc2", "mrope_cache"]  # mrope_cache: vllm-ascend PR 7762 (v0.18.0)
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


@pytest.mark.parametrize(("factor", "stack", "read"), [
    ("mc2", {"vllm_ascend": "0.25.1rc1"}, {"vllm_ascend": "0.11.0"}),
    ("mrope_cache", {"vllm_ascend": "0.23.0"}, {"vllm_ascend": "0.13.0"}),  # vllm-ascend PR 7762 (v0.18.0)
])
def test_report_marks_a_factor_not_read_instead_of_an_effect(factor, stack, read):
    from drift_fake import drift_snapshot

    from bench.commands.report_markdown import render
    from bench.report.tables import analyze
    from bench.spec.plan import run_order

    cells = [{"cell_id": f"c{m}{d}", "label": f"{factor}={m} dbsz={d}", "all_off": not (m or d),
              "levels": {factor: m, "dynamic_bsz": d}} for m in (0, 1) for d in (0, 1)]
    ids = [c["cell_id"] for c in cells]
    snap = drift_snapshot(cells, run_order(ids, 2, "blocked", 5), seed=5, effects={factor: -0.1})
    snap.update(engine="verl", platform="npu", versions={**stack, "torch_npu": "2.8.0"})
    data = analyze(snap, alpha=0.05)
    fit = data["effects"]["fit"]
    assert factor not in {t["name"] for t in fit["terms"]} and "dynamic_bsz" in {t["name"] for t in fit["terms"]}
    assert {t["name"] for t in fit["not_read_terms"]} == {factor, f"dynamic_bsz:{factor}"}
    label = f"not read by vllm-ascend {stack['vllm_ascend']}"
    if factor == "mc2":  # the factor with an article figure: its article row shows no effect either
        row = next(r for r in data["article"] if r.get("factor") == "mc2")
        assert row["ours_effect"] is None and row["ours_cell"] is None and label in row["note"]
    md = render({"alpha": 0.05, "speed_normalized_to_s": None, **data,
                 "sweep": {"matrix": "m", "sweep_id": "s", "sweep": "m/s", "engine": "verl", "platform": "npu",
                           "design": "full", "repeats": 2, "versions": snap["versions"]}})
    assert f"| {factor} | not read | not read |" in md and label in md
    snap["versions"] = {**read, "torch_npu": "2.8.0"}  # a stack that reads it: measured
    assert factor in {t["name"] for t in analyze(snap, alpha=0.05)["effects"]["fit"]["terms"]}


def test_dry_run_cli_with_todays_faked_stack():
    """``python run_bench.py <matrix> --dry-run`` with today's NPU stack faked (issue 46): mrope_cache is named not
    read (vllm-ascend PR 7762), and rmsnorm_fused, whose off level verl 0.9.1 (PR 6777) makes the patch enforce,
    is measured, its off cells launching qwen3vl_npu_fused:off."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, STACK_ENV: "verl=0.9.1,vllm_ascend=0.23.0,torch_npu=2.8.0,transformers=5.10.4"}
    args = [sys.executable, str(REPO / "run_bench.py"), str(NPU_MATRIX), "--dry-run"]
    doc = json.loads(subprocess.run([*args, "--json"], env=env, capture_output=True, text=True, check=True,
                                    cwd=REPO, timeout=300).stdout)
    assert list(doc["not_read"]) == ["mrope_cache"] and "vllm-ascend PR 7762" in doc["not_read"]["mrope_cache"]
    rms = {r["levels"]["rmsnorm_fused"]: r["launch"]["patches"] for r in doc["runs"]}
    assert "qwen3vl_npu_fused:off" in rms[0] and "qwen3vl_npu_fused:on" in rms[1]
    text = subprocess.run(args, env=env, capture_output=True, text=True, check=True, cwd=REPO, timeout=300).stdout
    flat = "".join(text.split())  # rich wraps the note at the terminal's width (80 columns without one)
    assert "note:mrope_cache:notreadbyvllm-ascend0.23.0" in flat and "PR7762" in flat
    assert "rmsnorm_fused:notread" not in flat and "alwayson" not in flat


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
