"""Bad inputs of issue 33 still open after the fourth pass, each through the real entry point
(:func:`_badinput.check_refused`: exit 2, one stderr line naming file or key and what to do, nothing written, no
library wording): ``base.embedded`` settings a factor would silently override, ``tune --ray-address`` at a closed
port (it made an empty results folder), a locked store (library wording after sqlite's busy wait), a baseline of no
cell and a gate with no matching cell (the files were not named), the ``+driver`` sqlite form as tracking URI, a
``sweep.json`` planning more runs than any sweep holds, and a boolean ``expect`` level.
"""
# ruff: noqa: F811 - the fixtures box and sweep_box come from _badinput; tests take them as parameters

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
from _badinput import GOOD, TUNE, box, check_refused, edit_json, sweep_box  # noqa: F401 - fixtures

from bench.cli import main


@pytest.mark.parametrize("key", ["rmsnorm_fused", "use_dynamic_bsz"])
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_embedded_setting_a_factor_sets_is_refused(box, capsys, key, dry):
    """The factor's level used to win silently, the cell id unchanged."""
    text = GOOD.replace("factors:\n", f"  embedded: {{{key}: true}}\nfactors:\n") + "  rmsnorm_fused: [off, on]\n"
    (box / "m.yaml").write_text(text)
    check_refused(box, ["run", "m.yaml", "--results", "res", *(["--dry-run"] if dry else [])], capsys,
                  (f"m.yaml: base.embedded.{key}", "set in each cell by the optimizations' levels",
                   "dynamic_bsz, rmsnorm_fused", "remove it from base.embedded"))


def test_embedded_setting_of_an_unlisted_optimization_is_refused(box, capsys):
    """An optimization not under ``factors`` is held off in every cell: ``base.embedded.rmsnorm_fused: true`` was
    silently turned off."""
    (box / "m.yaml").write_text(GOOD.replace("factors:\n", "  embedded: {rmsnorm_fused: true}\nfactors:\n"))
    check_refused(box, ["run", "m.yaml", "--dry-run"], capsys,
                  ("base.embedded.rmsnorm_fused", "one not under factors is held off", "list the optimization"))


def test_tune_at_a_closed_ray_port_writes_nothing(box, capsys):
    """Was an empty ``res/`` made before the Ray job server was tried."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (box / "m.yaml").write_text(TUNE)
    check_refused(box, ["tune", "m.yaml", "--results", "res", "--ray-address", f"127.0.0.1:{port}"], capsys,
                  (f"--ray-address 127.0.0.1:{port}", "cannot reach"), cap_s=120)


def _hold_lock(db) -> subprocess.Popen:
    """A process holding an exclusive sqlite lock on ``db`` until killed (another writer mid-transaction)."""
    code = ("import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(600)")
    p = subprocess.Popen([sys.executable, "-c", code, str(db)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"
    return p


def test_locked_tracking_store_is_named(box, capsys):
    """Was "cannot open MLflow store: (sqlite3.OperationalError) database is locked" (SQLAlchemy's words)."""
    subprocess.run([sys.executable, "-c", "import sys; from mlflow import MlflowClient; "
                    "MlflowClient(tracking_uri=sys.argv[1]).search_experiments()", f"sqlite:///{box / 'ml.db'}"],
                   check=True, capture_output=True)
    before = (box / "ml.db").read_bytes()
    (box / "m.yaml").write_text(GOOD)
    (box / "res").mkdir()  # the results folder exists: its sweep lock is the only file the refusal may add
    holder = _hold_lock(box / "ml.db")
    try:
        start = time.monotonic()
        rc = main(["run", "m.yaml", "--results", "res", "--tracking-uri", "sqlite:///ml.db"])
        wall = time.monotonic() - start
    finally:
        holder.kill()
        holder.wait()
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1, err
    assert "ml.db stays locked by another process" in err[0] and "rerun when it is done" in err[0], err[0]
    assert "OperationalError" not in err[0]
    assert (box / "ml.db").read_bytes() == before
    assert not list((box / "res").rglob("*.json")) and wall < 60


def test_baseline_of_no_cell_is_refused(sweep_box, capsys):
    """A hand-edited baseline with ``cells: []``: the gate said "no matching cells (baseline: ; candidate: ...)"
    without naming a file."""
    assert main(["baseline", "save", "synth", "--name", "b", "--results", "res"]) == 0
    capsys.readouterr()
    edit_json(sweep_box / "res" / "baselines" / "b.json", lambda d: d.update(cells=[]))
    for argv in (["gate", "--candidate", "synth", "--baseline", "b"], ["baseline", "show", "b"]):
        check_refused(sweep_box, [*argv, "--results", "res"], capsys,
                      ("baselines/b.json", "not a valid baseline", "cells"))


def test_no_matching_cells_names_both_sides(sweep_box, capsys):
    """Cells of the baseline that the candidate does not have: the message names the baseline and the sweep."""
    assert main(["baseline", "save", "synth", "--name", "b", "--results", "res"]) == 0
    capsys.readouterr()

    def other_levels(d):
        for c in d["cells"]:
            c["key"] = "x" + c["key"]
    edit_json(sweep_box / "res" / "baselines" / "b.json", other_levels)
    line = check_refused(sweep_box, ["gate", "--candidate", "synth", "--baseline", "b", "--results", "res",
                                     "--no-expect"], capsys, ("no matching cells", "baseline b", "candidate "),
                         code=2)
    assert "synth" in line


def test_driver_form_of_sqlite_as_tracking_uri_is_checked(box, capsys):
    """``sqlite+pysqlite:///m.yaml`` skipped every sqlite check and wrote MLflow's tables into the matrix."""
    (box / "m.yaml").write_text(GOOD)
    check_refused(box, ["run", "m.yaml", "--results", "res", "--tracking-uri", "sqlite+pysqlite:///m.yaml"],
                  capsys, ("--tracking-uri sqlite+pysqlite:///m.yaml", "m.yaml is not a SQLite database"))


def test_sweep_planning_more_runs_than_any_sweep_holds(sweep_box, capsys):
    """200,000 planned runs: ``report`` took 47 s and 1 GB and printed 2,000 characters of labels."""
    sweep = next((sweep_box / "res" / "synth").glob("2*"))

    def many(d):
        run = d["plan"]["runs"][0]
        d["plan"]["runs"] = [dict(run, repeat=i) for i in range(200_000)]
    edit_json(sweep / "sweep.json", many)
    line = check_refused(sweep_box, ["report", "synth", "--results", "res"], capsys, ("sweep.json", "plan.runs"),
                         cap_s=30)
    assert len(line) < 400


def test_boolean_expect_level_is_refused(box, capsys):
    (box / "m.yaml").write_text(GOOD + "expect:\n  - {factor: dynamic_bsz, level: true, at_least: 0.1}\n")
    check_refused(box, ["run", "m.yaml", "--dry-run"], capsys, ("m.yaml", "expect", "level"))


def test_locked_optuna_storage_is_named(box, capsys):
    """Optuna's storage locked by another writer: one line in our words (sqlite's busy wait, then refused)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(storage=f"sqlite:///{box / 'o.db'}", study_name="other")
    (box / "m.yaml").write_text(TUNE)
    (box / "res").mkdir()
    holder = _hold_lock(box / "o.db")
    try:
        rc = main(["tune", "m.yaml", "--results", "res", "--storage", "sqlite:///o.db",
                   "--tracking-uri", f"sqlite:///{box / 'res' / 'ml.db'}"])
    finally:
        holder.kill()
        holder.wait()
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip() and not ln.startswith("[")]
    assert rc == 2 and err, err
    assert "--storage sqlite:///o.db" in err[-1] and "locked by another process" in err[-1], err


def test_sequential_stopped_after_zero_is_refused(sweep_box, capsys):
    """``stopped_after: 0`` was read as 1 (``or 1``) and the report written (the fresh trial of issue 33)."""
    sweep = next((sweep_box / "res" / "synth").glob("2*"))
    edit_json(sweep / "sweep.json", lambda d: d.update(sequential={"stopped_after": 0, "looks": []}))
    check_refused(sweep_box, ["report", "synth", "--results", "res"], capsys,
                  ("sweep.json", "sequential.stopped_after 0", "an integer >= 1"))


@pytest.mark.parametrize("field, value", [("history", "yesterday"), ("sweep_to_sweep", "x")])
def test_baseline_history_and_offset_have_a_schema(sweep_box, capsys, field, value):
    """A text ``history`` crashed ``baseline save --force`` (TypeError) and was used by the gate; a text
    ``sweep_to_sweep`` crashed the gate (AttributeError); both with a crash log (the fresh trial of issue 33)."""
    assert main(["baseline", "save", "synth", "--name", "b", "--results", "res"]) == 0
    capsys.readouterr()
    edit_json(sweep_box / "res" / "baselines" / "b.json", lambda d: d.update({field: value}))
    for argv in (["gate", "--candidate", "synth", "--baseline", "b", "--no-expect"], ["baseline", "show", "b"],
                 ["baseline", "save", "synth", "--name", "b", "--force"]):
        check_refused(sweep_box, [*argv, "--results", "res"], capsys, ("baselines/b.json", "not a valid baseline",
                                                                        field))


NEAR_MISSES = {
    "expect_factor": (GOOD + "expect:\n  - {factor: dynamic, at_least: 0.1}\n", "did you mean 'dynamic_bsz'?"),
    "sampler_type": (TUNE.replace("  n_trials: 2\n", "  n_trials: 2\n  sampler: {type: tpee}\n"),
                     "did you mean 'tpe'?"),
}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
def test_near_misses_get_a_did_you_mean(box, capsys, case):
    """The docs promise "did you mean" for a near miss of a factor and a sampler type (the fresh trial of issue 33:
    a factor under ``expect`` and ``tune.sampler.type`` had none)."""
    text, hint = NEAR_MISSES[case]
    (box / "m.yaml").write_text(text)
    check_refused(box, ["run", "m.yaml", "--dry-run"], capsys, ("m.yaml", hint))


def test_a_loop_of_links_is_named_as_one(box, capsys):
    """``a.yaml -> b.yaml -> a.yaml`` was called "a link to b.yaml, which does not exist" (the fresh trial)."""
    (box / "a.yaml").symlink_to("b.yaml")
    (box / "b.yaml").symlink_to("a.yaml")
    check_refused(box, ["run", "a.yaml", "--dry-run"], capsys, ("a.yaml", "a loop of symbolic links"))


def test_baseline_name_given_empty_is_not_read_as_missing(sweep_box, capsys):
    check_refused(sweep_box, ["baseline", "save", "synth", "--name", "", "--results", "res"], capsys,
                  ("--name ''", "empty"))


def test_a_tune_key_is_located_in_the_tune_block(box, capsys):
    """``tune.timeout_s: -5`` was reported at the line of ``base.timeout_s`` (the first key of that name)."""
    text = TUNE.replace("  max_response_length: 24\n", "  max_response_length: 24\n  timeout_s: 300\n") + \
        "  timeout_s: -5\n"
    (box / "m.yaml").write_text(text)
    line = text.splitlines().index("  timeout_s: -5") + 1
    check_refused(box, ["tune", "m.yaml", "--results", "res"], capsys, (f"m.yaml:{line}: tune.timeout_s",))


def test_an_engine_option_given_as_override_names_the_override(box, capsys):
    """``base.embedded.lr=2`` was blamed on the matrix file, which has no ``base.embedded``."""
    (box / "m.yaml").write_text(GOOD)
    check_refused(box, ["run", "m.yaml", "--dry-run", "base.embedded.lr=2"], capsys,
                  ("m.yaml: override base.embedded.lr=2", "base.embedded.lr", "less than or equal to 1"))
