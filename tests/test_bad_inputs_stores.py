"""Stores and library errors in our words (issue 33): a store of the other kind (an MLflow database given as the
Optuna storage and the reverse), a damaged SQLite file, another application's database, a sqlite Optuna storage in
a missing folder, a socket as the matrix, and a YAML tag in an override. Each through the real entry point
(:func:`_badinput.check_refused`: exit 2, one line naming the flag or file and what to do, nothing written, the
store file unchanged byte for byte, no library wording).
"""
# ruff: noqa: F811 - the fixtures box and sweep_box come from _badinput; tests take them as parameters

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

import pytest
from _badinput import GOOD, TUNE, box, check_refused, sweep_box  # noqa: F401 - fixtures

from bench.tracking.store import sqlite_kind


def _mlflow_db(path: Path) -> Path:
    """A real MLflow tracking store (the experiment list read once creates and migrates it)."""
    from mlflow import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


def _optuna_db(path: Path) -> Path:
    """A real Optuna storage with one study."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    optuna.create_study(storage=f"sqlite:///{path}", study_name="s")
    return path


def _other_db(path: Path) -> Path:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE invoices (id INTEGER)")
    con.commit()
    con.close()
    return path


def _damaged(src: Path, dst: Path) -> Path:
    """The first 20,000 bytes of a real store: a truncated copy (sqlite: 'database disk image is malformed')."""
    dst.write_bytes(src.read_bytes()[:20000])
    return dst


def test_sqlite_kind_tells_the_stores_apart(tmp_path):
    """The classifier the checks use, on real files of each kind."""
    ml = _mlflow_db(tmp_path / "ml.db")
    assert sqlite_kind(ml) == "mlflow"
    assert sqlite_kind(_optuna_db(tmp_path / "opt.db")) == "optuna"
    assert sqlite_kind(_other_db(tmp_path / "o.db")) == "other: invoices"
    assert sqlite_kind(_damaged(ml, tmp_path / "t.db")).startswith("damaged: ")
    sqlite3.connect(tmp_path / "empty.db").close()
    assert sqlite_kind(tmp_path / "empty.db") is None


def _unchanged(path: Path, before: bytes) -> None:
    assert path.read_bytes() == before, f"{path.name} was changed"


def test_mlflow_store_given_as_optuna_storage(box, capsys):
    """Optuna used to create its tables inside the MLflow database, then fail with its own schema text."""
    db = _mlflow_db(box / "ml.db")
    before = db.read_bytes()
    (box / "m.yaml").write_text(TUNE)
    check_refused(box, ["tune", "m.yaml", "--results", "res", "--storage", "sqlite:///ml.db"], capsys,
                  ("--storage sqlite:///ml.db", "ml.db is an MLflow tracking store, not an Optuna storage",
                   "sqlite:///<results>/optuna.db"))
    _unchanged(db, before)


def test_mlflow_store_named_in_the_matrix_as_tune_storage(box, capsys):
    db = _mlflow_db(box / "ml.db")
    (box / "m.yaml").write_text(TUNE + "  storage: sqlite:///ml.db\n")
    check_refused(box, ["run", "m.yaml", "--dry-run"], capsys,
                  ("m.yaml", "tune.storage", "ml.db is an MLflow tracking store, not an Optuna storage"))
    assert sqlite_kind(db) == "mlflow"


@pytest.mark.parametrize("command", ["run", "report"])
def test_optuna_storage_given_as_tracking_uri(sweep_box, capsys, command):
    """MLflow used to say "Can't locate revision identified by ..." (alembic's words)."""
    db = _optuna_db(sweep_box / "opt.db")
    before = db.read_bytes()
    (sweep_box / "m.yaml").write_text(GOOD)
    argv = (["run", "m.yaml", "--results", "res2"] if command == "run" else ["report", "synth", "--results", "res"])
    check_refused(sweep_box, [*argv, "--tracking-uri", "sqlite:///opt.db"], capsys,
                  ("--tracking-uri sqlite:///opt.db", "opt.db is an Optuna storage, not an MLflow tracking store",
                   "sqlite:///<results>/mlflow.db"))
    _unchanged(db, before)


@pytest.mark.parametrize("flag", ["--tracking-uri", "--storage"])
def test_damaged_store(box, capsys, flag):
    """A truncated store: sqlite's "database disk image is malformed", named as damaged with what to do."""
    db = _damaged(_mlflow_db(box / "ml.db"), box / "t.db")
    (box / "ml.db").unlink()
    before = db.read_bytes()
    if flag == "--storage":
        (box / "m.yaml").write_text(TUNE)
        argv = ["tune", "m.yaml", "--results", "res", "--storage", "sqlite:///t.db"]
    else:
        (box / "m.yaml").write_text(GOOD)
        argv = ["run", "m.yaml", "--results", "res", "--tracking-uri", "sqlite:///t.db"]
    check_refused(box, argv, capsys, (f"{flag} sqlite:///t.db", "t.db is damaged (", "restore it from a copy"))
    _unchanged(db, before)


def test_another_applications_database(box, capsys):
    db = _other_db(box / "app.db")
    before = db.read_bytes()
    (box / "m.yaml").write_text(GOOD)
    check_refused(box, ["run", "m.yaml", "--results", "res", "--tracking-uri", "sqlite:///app.db"], capsys,
                  ("app.db is a SQLite database of something else (tables invoices)", "give another file"))
    _unchanged(db, before)


def test_sqlite_optuna_storage_in_a_missing_folder(box, capsys):
    """sqlite used to say "unable to open database file"; the journal storage already named the folder."""
    (box / "m.yaml").write_text(TUNE)
    check_refused(box, ["tune", "m.yaml", "--results", "res", "--storage", "sqlite:///nofolder/o.db"], capsys,
                  ("--storage sqlite:///nofolder/o.db", "folder nofolder does not exist"))


def test_socket_as_matrix(box, capsys):
    """The docs promise a socket is named as one (the kernel said "No such device or address")."""
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(box / "m.yaml"))
        check_refused(box, ["run", "m.yaml", "--dry-run"], capsys, ("m.yaml: cannot read matrix: is a socket",))
    finally:
        s.close()


def test_yaml_tag_in_an_override(box, capsys):
    (box / "m.yaml").write_text(GOOD)
    check_refused(box, ["run", "m.yaml", "--dry-run", "base.steps=!!python/name:os.system"], capsys,
                  ("override 'base.steps=!!python/name:os.system'", "tag !!python/name:os.system is not allowed"))
