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
