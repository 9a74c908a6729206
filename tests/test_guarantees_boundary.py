"""Failures at the boundary with a library or the file system, in our words and before anything is written
(issue 48): ``--ray-address 'not a url'`` got Ray's text; a ``.lock`` that is a folder was blamed on the results
folder; a sqlite tracking URI in a missing folder silently made the folders and a new store (a typo started a new
history); an unset ``${VAR}`` in ``base.model`` was shown by ``--dry-run`` with no note.
"""
# ruff: noqa: F811 - the fixtures come from _badinput; tests take them as parameters

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from _badinput import GOOD, TUNE, box  # noqa: F401 - fixtures
from _cli import ROOT, cli


@pytest.mark.parametrize("command", ["run", "tune"])
def test_a_malformed_ray_address_is_refused_in_our_words(box, command):
    (box / "m.yaml").write_text(TUNE if command == "tune" else GOOD)
    cli(box, [command, "m.yaml", "--results", "res", "--ray-address", "not a url"],
        ("--ray-address not a url: not a Ray address", "allowed: http://HOST:PORT"))


def test_a_lock_that_is_a_folder_is_named(box):
    (box / "m.yaml").write_text(GOOD)
    (box / "res" / "t" / ".lock").mkdir(parents=True)
    cli(box, ["run", "m.yaml", "--results", "res"], ("res/t/.lock: exists and is not the harness's lock file",
                                                     "a folder"))


def test_a_sqlite_store_in_a_missing_folder_is_refused(box):
    """Decided: refused (as an Optuna storage is), unless the folder is ``--results``, which the harness makes."""
    (box / "m.yaml").write_text(GOOD)
    cli(box, ["run", "m.yaml", "--results", "res", "--tracking-uri", "sqlite:///typo/mlflow.db"],
        ("--tracking-uri sqlite:///typo/mlflow.db: folder typo does not exist", "create it"))


def test_a_store_in_the_results_folder_to_be_made_is_accepted(box):
    (box / "m.yaml").write_text(GOOD)
    proc = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), "run", "m.yaml", "--dry-run", "--results",
                           "new", "--tracking-uri", "sqlite:///new/ml.db"], cwd=box, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert not (box / "new").exists()


def test_an_unset_variable_in_base_model_gets_a_note_in_a_dry_run(box, monkeypatch):
    monkeypatch.delenv("BENCH_TEST_SURELY_UNSET_VAR", raising=False)
    (box / "m.yaml").write_text(GOOD.replace("  steps: 3\n", "  steps: 3\n  model: ${BENCH_TEST_SURELY_UNSET_VAR}/m\n"))
    env = {k: v for k, v in os.environ.items() if k != "BENCH_TEST_SURELY_UNSET_VAR"}
    proc = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), "run", "m.yaml", "--dry-run"], cwd=box,
                          capture_output=True, text=True, env={**env, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert "note: base.model: has an unset variable; left as written (a real run stops on it)" in proc.stdout
    assert "model=${BENCH_TEST_SURELY_UNSET_VAR}/m" in proc.stdout


def _broken_store(box) -> tuple[str, str]:
    """A real MLflow sqlite store under ``res/`` holding the sweep's parent run, whose metric tables are then
    dropped (a store corrupted after the sweep began: every metric write fails inside SQLAlchemy)."""
    import sqlite3

    code = ("import sys; from bench.tracking import Tracker; t = Tracker(sys.argv[1], 'synth'); "
            "print(t.client.create_run(t.experiment_id).info.run_id)")
    uri = f"sqlite:///{box / 'res' / 'mlflow.db'}"
    (box / "res").mkdir(exist_ok=True)
    out = subprocess.run([sys.executable, "-c", code, uri], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=box)
    with sqlite3.connect(box / "res" / "mlflow.db") as con:
        con.execute("drop table latest_metrics")
    return uri, out.stdout.split()[-1]


def test_a_store_that_fails_after_opening_is_named_in_our_words(box):
    """A corrupted ``mlflow.db``: MLflow's SQL statement and SQLAlchemy's traceback (logged by
    ``mlflow.store.db.utils`` before it raises) never reach the console; the warning says what the store did."""
    from _sweeps import EMBEDDED_CELLS, make_sweep

    uri, rid = _broken_store(box)
    make_sweep(box / "res", "synth", EMBEDDED_CELLS[:2], repeats=2, parent_run_id=rid)
    proc = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), "report", "synth", "--results", "res",
                           "--tracking-uri", uri], cwd=box, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    for frag in ("[SQL", "Traceback", "sqlalche", "ERROR mlflow", "OperationalError"):
        assert frag not in text, text
    assert "report not logged to MLflow" in text and "is not a usable MLflow database" in text, text


def test_the_system_metrics_logger_stays_off_the_console_when_its_store_fails(box):
    """MLflow's system-metrics thread logs every failed flush with the SQL INSERT (issue 48: five ERROR lines
    before the harness's own last line on a full disk); the harness's monitor keeps it off the console."""
    uri, rid = _broken_store(box)
    code = ("import sys, time; import bench.tracking as bt; bt.SYSTEM_METRICS_INTERVAL_S = 0.2; "
            "t = bt.Tracker(sys.argv[1], 'synth'); m = t.monitor_system(sys.argv[2]); assert m is not None; "
            "time.sleep(1.5); bt.stop_monitor(m); print('stopped')")
    proc = subprocess.run([sys.executable, "-c", code, uri, rid], capture_output=True, text=True, cwd=box,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "stopped", proc.stdout + proc.stderr
    assert proc.stderr.strip() == "", proc.stderr
