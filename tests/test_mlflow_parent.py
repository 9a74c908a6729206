"""The sweep's MLflow parent (issue 23): ``cells.json`` rounded for reading with the report's intervals, and a
parent closed by ``sync`` after an outage exactly as an undisturbed sweep closes it.

A real sqlite MLflow store read back with MLflow's client; the sweeps run :mod:`drift_fake`'s executor (no
GRPO steps); the outage is the store refusing the parent's final update once, as a server that went away.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from drift_fake import DriftExecutor
from test_run_order import small_full

from bench.cli import main


def _client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(uri)


def _parent(uri: str):
    client = _client(uri)
    exp = client.get_experiment_by_name("full")
    [parent] = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("bench.kind") == "sweep"]
    return parent


def _cells(uri: str, run_id: str, dst: Path) -> list[dict]:
    table = json.loads(Path(_client(uri).download_artifacts(run_id, "cells.json", str(dst))).read_text())
    return [dict(zip(table["columns"], row)) for row in table["data"]]


def _four_digits(v) -> bool:
    return v is None or not isinstance(v, float) or v == float(f"{v:.4g}")


def test_cells_json_is_rounded_and_carries_the_reports_speedup_intervals(tmp_path, monkeypatch):
    monkeypatch.setattr("bench.commands.run.make_executor", lambda *a, **k: DriftExecutor(8, seed=7))
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"
    common = ["--results", str(tmp_path / "res"), "--tracking-uri", uri]
    assert main(["run", str(small_full(tmp_path, repeats=2)), "--order-seed", "3", *common]) == 0
    assert main(["report", "full", *common]) == 0
    sweep = (tmp_path / "res" / "full" / "latest").resolve()
    report = {c["cell_id"]: c for c in json.loads((sweep / "report" / "report.json").read_text())["cells"]}
    summary = {r["cell_id"]: r for r in csv.DictReader((sweep / "summary.csv").open())}

    rows = _cells(uri, _parent(uri).info.run_id, tmp_path / "dl")
    assert len(rows) == 4
    with_interval = 0
    for r in rows:
        assert all(_four_digits(v) for v in r.values()), r  # at most 4 significant digits
        s, rep = summary[r["cell id"]], report[r["cell id"]]
        for col, key in (("step time s", "step_time_s"), ("speedup", "speedup"), ("tokens/s", "throughput"),
                         ("rollout share", "rollout_share")):
            assert r[col] == float(f"{float(s[key]):.4g}"), (col, r, s[key])
        low, high = rep["speedup_ci"]
        assert (r["speedup low"], r["speedup high"]) == (float(f"{low:.4g}"), float(f"{high:.4g}")), (r, rep)
        assert r["speedup low"] <= r["speedup"] <= r["speedup high"]
        with_interval += r["speedup low"] != r["speedup high"]  # the all-off cell's is [1, 1]
    assert with_interval == 3


@pytest.mark.parametrize("when", ["finish_parent", "start_parent"])
def test_sync_after_an_outage_closes_the_parent_as_an_undisturbed_sweep(tmp_path, monkeypatch, when):
    """The store goes away when the sweep closes its parent (the parent stays RUNNING), or when it starts
    (no parent, every upload queued): ``sync`` then leaves the parent as the undisturbed sweep's."""
    from bench.tracking import Tracker

    path = small_full(tmp_path, repeats=2)
    monkeypatch.setattr("bench.commands.run.make_executor", lambda *a, **k: DriftExecutor(8, seed=7))
    calm = f"sqlite:///{(tmp_path / 'calm.db').as_posix()}"
    assert main(["run", str(path), "--order-seed", "3", "--results", str(tmp_path / "calm"),
                 "--tracking-uri", calm]) == 0

    # the same sweep, but the store goes away once
    real = getattr(Tracker, when)
    calls = []

    def outage(self, *a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("tracking server went away")
        return real(self, *a, **k)

    monkeypatch.setattr(Tracker, when, outage)
    hit = f"sqlite:///{(tmp_path / 'hit.db').as_posix()}"
    common = ["--results", str(tmp_path / "hit"), "--tracking-uri", hit]
    assert main(["run", str(path), "--order-seed", "3", *common]) == 0
    sweep = (tmp_path / "hit" / "full" / "latest").resolve()
    assert (sweep / "mlflow_queue.json").exists()
    if when == "finish_parent":
        assert _parent(hit).info.status == "RUNNING"
    assert main(["sync", "full", *common]) == 0
    assert not (sweep / "mlflow_queue.json").exists() and len(calls) == 2

    a, b = _parent(calm), _parent(hit)
    assert a.info.status == b.info.status == "FINISHED"
    arts = [sorted(f.path for f in _client(u).list_artifacts(p.info.run_id)) for u, p in ((calm, a), (hit, b))]
    assert arts[0] == arts[1] and "cells.json" in arts[1], arts
    keys = [{k for k in p.data.metrics if not k.startswith("system/")} for p in (a, b)]
    assert keys[0] == keys[1] and "harness_overhead_share" in keys[1]
    assert {k: v for k, v in a.data.tags.items() if k.startswith("bench.") and k != "bench.sweep_id"} == \
           {k: v for k, v in b.data.tags.items() if k.startswith("bench.") and k != "bench.sweep_id"}
    assert {k: v for k, v in a.data.params.items()} == {k: v for k, v in b.data.params.items()}
    # the table: the same cells and columns as the undisturbed sweep's, the values of the synced sweep's folder
    ca, cb = _cells(calm, a.info.run_id, tmp_path / "da"), _cells(hit, b.info.run_id, tmp_path / "db")
    assert [list(r) for r in ca] == [list(r) for r in cb]
    assert [r["label"] for r in ca] == [r["label"] for r in cb]
    summary = {r["cell_id"]: r for r in csv.DictReader((sweep / "summary.csv").open())}
    for r in cb:
        assert r["step time s"] == float(f"{float(summary[r['cell id']]['step_time_s']):.4g}")
        assert math.isfinite(r["speedup low"]) and math.isfinite(r["speedup high"])


def test_sync_to_another_store_closes_the_parent_it_creates(tmp_path, monkeypatch):
    """A finished sweep synced to a store that never saw it (no queue, no parent there): ``sync`` creates the
    parent, uploads every run and closes the parent as FINISHED with the sweep's status (issue 33: it stayed
    RUNNING); a sweep marked ``running`` in sweep.json is left open (another harness may still be at it)."""
    import json

    path = small_full(tmp_path, repeats=2)
    monkeypatch.setattr("bench.commands.run.make_executor", lambda *a, **k: DriftExecutor(8, seed=7))
    first = f"sqlite:///{(tmp_path / 'first.db').as_posix()}"
    assert main(["run", str(path), "--order-seed", "3", "--results", str(tmp_path / "r"), "--tracking-uri", first]) == 0
    other = f"sqlite:///{(tmp_path / 'other.db').as_posix()}"
    assert main(["sync", "full", "--results", str(tmp_path / "r"), "--tracking-uri", other]) == 0
    p = _parent(other)
    assert p.info.status == "FINISHED" and p.data.tags["bench.status"] == "complete"
    runs = _client(other).search_runs([p.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = "
                                      f"'{p.info.run_id}'")
    assert len(runs) == 8
    sweep = (tmp_path / "r" / "full" / "latest").resolve()
    meta = json.loads((sweep / "sweep.json").read_text())
    meta["status"] = "running"
    (sweep / "sweep.json").write_text(json.dumps(meta))
    third = f"sqlite:///{(tmp_path / 'third.db').as_posix()}"
    assert main(["sync", "full", "--results", str(tmp_path / "r"), "--tracking-uri", third]) == 0
    assert _parent(third).info.status == "RUNNING"
