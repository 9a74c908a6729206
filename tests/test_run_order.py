"""Run order (issue 11): blocked, seeded-random by default; recorded in sweep.json and on the MLflow parent;
printed by the dry run; a resumed sweep finishes the planned order. Runs are faked (:mod:`drift_fake`);
planning, the sweep, records and MLflow are the real code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from drift_fake import DriftExecutor

from bench.cli import main
from bench.core.errors import BenchError
from bench.execution.sweep import Sweep
from bench.spec.loading import load_matrix
from bench.spec.plan import make_plan, run_order

ROOT = Path(__file__).resolve().parent.parent


def small_full(tmp_path: Path, repeats: int = 3) -> Path:
    """matrix/full.yaml (4 runs on the embedded engine) with 4 steps per run."""
    m = yaml.safe_load((ROOT / "matrix" / "full.yaml").read_text())
    m["base"].update(steps=4, profile_steps=[4])
    m["repeats"] = repeats
    path = tmp_path / "full.yaml"
    path.write_text(yaml.safe_dump(m, sort_keys=False))
    return path


def test_blocked_order_holds_every_spec_once_per_block_and_follows_the_seed():
    ids = [f"c{i}" for i in range(6)]
    o = run_order(ids, 3, "blocked", 11)
    assert len(o.runs) == 18 and o.seed == 11
    for k in range(3):
        block = o.runs[6 * k:6 * (k + 1)]
        assert {r for r, _ in block} == set(ids) and {kk for _, kk in block} == {k}
    assert run_order(ids, 3, "blocked", 11).runs == o.runs
    assert run_order(ids, 3, "blocked", 12).runs != o.runs
    # shuffled: the blocks are not all in plan order
    assert any([r for r, _ in o.runs[6 * k:6 * (k + 1)]] != ids for k in range(3))
    seq = run_order(ids, 2, "sequential")
    assert seq.seed is None and seq.runs == [(c, k) for c in ids for k in range(2)]
    with pytest.raises(BenchError, match="allowed: blocked, sequential"):
        run_order(ids, 2, "random", 1)


def test_dry_run_prints_the_blocked_order_and_its_seed(tmp_path, capsys):
    path = small_full(tmp_path)
    assert main(["run", str(path), "--dry-run", "--order-seed", "5", "--results", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "run order: blocked, seed 5" in out
    plan = make_plan(load_matrix(path), strict=False)
    expect = run_order([r.cell_id for r in plan.runs], 3, "blocked", 5).runs
    listed = [line.split("(")[1].split(")")[0] for line in out.splitlines() if ". block " in line]
    assert listed == [c for c, _ in expect]
    assert main(["run", str(path), "--dry-run", "--order", "sequential", "--results", str(tmp_path / "r")]) == 0
    assert "run order: sequential; 12 runs" in capsys.readouterr().out
    # bad input: one line naming the option and the allowed values, exit 2
    assert main(["run", str(path), "--dry-run", "--order", "shuffled"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--order" in err[0] and "'blocked', 'sequential'" in err[0]


def test_sweep_runs_the_planned_order_records_the_seed_and_resume_finishes_it(tmp_path):
    from mlflow import MlflowClient

    path = small_full(tmp_path)
    matrix = load_matrix(path)
    plan = make_plan(matrix)
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    first = DriftExecutor(12, stop_after=5)
    with pytest.raises(KeyboardInterrupt):
        Sweep(matrix, plan, tmp_path / "res", uri, executor=first, order="blocked", order_seed=42).run()
    planned = run_order([r.cell_id for r in plan.runs], 3, "blocked", 42).runs
    assert first.calls == planned[:5]
    sweep = next((tmp_path / "res" / "full").glob("2*"))
    meta = json.loads((sweep / "sweep.json").read_text())
    assert meta["order"]["kind"] == "blocked" and meta["order"]["seed"] == 42
    assert [tuple(r) for r in meta["order"]["runs"]] == planned
    # resumed without a seed (and even asking for another order): the planned order's unfinished runs
    events = []
    second = DriftExecutor(12)
    out = Sweep(matrix, plan, tmp_path / "res", uri, executor=second, order="sequential",
                on_event=lambda kind, data: events.append((kind, data))).run()
    assert second.calls == planned[5:]
    assert out.executed == 7 and out.skipped == 5 and out.sweep_dir == sweep
    assert any(k == "warn" and "planned order (blocked, seed 42)" in d["message"] for k, d in events)
    parent = MlflowClient(uri).get_run(out.parent_run_id)
    assert parent.data.params["order"] == "blocked" and parent.data.params["order_seed"] == "42"
    assert parent.data.tags["bench.order_seed"] == "42"
    # the parent run carries the summary's speedups
    rows = {r["label"]: r for r in out.rows}
    assert parent.data.metrics["speedup.dynamic_bsz"] == pytest.approx(rows["dynamic_bsz"]["speedup"])
