"""Where a study lives: the Optuna storage (:func:`open_storage`, a SQLAlchemy URL or ``journal:PATH``) and
the settings a study was made with (its ``setting.*`` user attributes: :func:`flatten`, :func:`study_settings`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bench.core.errors import BenchError, DiskFullError
from bench.core.paths import check_folder, resolve_path
from bench.records.results import is_no_space
from bench.tracking.store import DB_DRIVERS, check_database, discard_half_made, in_memory, sqlite_path
from bench.tune.block import parse_block  # the block as tune reads it (its own settings too)
from bench.tune.space import resolve_space

FP_ATTR = "bench_fingerprint"
SETTINGS_ATTR = "bench_settings"  # studies made before the settings were split into keys: one JSON value
#: prefix of the study user attributes that hold the settings a study's values depend on, one key each
SETTINGS_PREFIX = "setting."


def default_storage(results: Path) -> str:
    """``sqlite:///<results>/optuna.db``."""
    return f"sqlite:///{Path(results).as_posix()}/optuna.db"


def redact(url: str) -> str:
    """The storage URL without a password (for logs and MLflow tags)."""
    if url.startswith("journal:"):
        return url
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1] if "@" in url else url


#: what an Optuna storage may be, for messages
ALLOWED_STORAGES = "sqlite:///PATH, journal:PATH, or a database server URL (postgresql://, mysql://)"


def check_storage(url: str, where: str = "--storage", results: str | Path | None = None) -> None:
    """Check an Optuna storage URL without writing anything: not in memory; ``journal:PATH`` a regular file or
    absent, in a folder the harness may write (:func:`bench.core.paths.check_folder`); a SQLAlchemy URL of a known
    database with its driver installed, a sqlite file that is a database (:func:`bench.tracking.store.check_database`)
    in a folder that exists or is ``results`` (the results folder, made before the storage is opened).

    Raises:
        BenchError: naming ``where``, the URL and what is wrong.
    """
    if not url.strip() or "\x00" in url:
        raise BenchError(f"{where} {url!r}: empty or not a URL (allowed: {ALLOWED_STORAGES})")
    if in_memory(url):
        raise BenchError(f"{where} {url}: an in-memory database keeps no study after this process (trials would "
                         "be lost); use sqlite:///PATH, journal:PATH or a database server")
    if url.startswith("journal:"):
        path = Path(url.removeprefix("journal:").removeprefix("//"))
        resolve_path(where, path, url)
        if os.path.lexists(path) and not path.is_file():
            raise BenchError(f"{where} {url}: {path} is not a regular file (a journal is a file)")
        check_folder(where, path.parent)
        return
    if "://" not in url:
        raise BenchError(f"{where} {url}: not a URL (allowed: {ALLOWED_STORAGES})")
    dialect = url.split("://", 1)[0].lower().partition("+")[0]
    if dialect not in ("sqlite", *DB_DRIVERS):
        raise BenchError(f"{where} {redact(url)}: unsupported storage (allowed: {ALLOWED_STORAGES})")
    db = sqlite_path(url)
    if db is not None and not in_memory(url):
        resolve_path(where, db, redact(url))  # before any lookup: a name too long, a dangling link
    made = results is not None and os.path.abspath(db.parent if db else "") == os.path.abspath(results)
    if db is not None and not in_memory(url) and not made and not db.parent.is_dir():  # sqlite: "unable to open..."
        raise BenchError(f"{where} {redact(url)}: cannot open Optuna storage: folder {db.parent} does not exist "
                         "(create it, or give a sqlite file in an existing folder)")
    check_database(url, where, "optuna")


def check_tune_block(matrix: Any) -> None:
    """A matrix's ``tune`` block as every command checks it, as ``tune`` does: its schema
    (:func:`bench.tune.space.parse_tune`), its search space resolved against the matrix's P+R
    (:func:`bench.tune.space.resolve_space`: bounds below P+R, a grid sampler on a log scale or too large)
    and the storage it names (:func:`check_storage`).

    Raises:
        BenchError: naming the file, the key and what is wrong.
    """
    block = parse_block(matrix)
    resolve_space(block, matrix.base, matrix.source or "matrix")
    if block.storage:
        check_storage(block.storage, f"{matrix.source or 'matrix'}: tune.storage:")


def open_storage(url: str, where: str = "--storage") -> Any:
    """An Optuna storage: ``journal:PATH`` (journal file) or any SQLAlchemy URL (RDB), already checked by
    :func:`check_storage` (kind of store, folder).

    Raises:
        BenchError: the storage cannot be opened (bad URL, missing driver, unwritable/absent folder).
    """
    import optuna

    db = sqlite_path(url) if not url.startswith("journal:") else None
    fresh = db is not None and not db.exists()
    try:
        if url.startswith("journal:"):
            from optuna.storages import JournalStorage
            from optuna.storages.journal import JournalFileBackend

            path = Path(url.removeprefix("journal:").removeprefix("//"))
            if not path.parent.is_dir():
                raise OSError(f"folder {path.parent} does not exist")
            return JournalStorage(JournalFileBackend(str(path)))
        if "://" not in url:
            raise ValueError("not a URL (give e.g. sqlite:///results/optuna.db, postgresql://..., or journal:PATH)")
        return optuna.storages.RDBStorage(url, skip_table_creation=False)
    except BenchError:
        raise
    except BaseException as exc:  # sqlalchemy / driver import errors come in many classes
        if isinstance(exc, KeyboardInterrupt):
            raise
        if is_no_space(exc):
            if fresh:  # the storage this call began to create is half made: none is better (rerun makes it)
                discard_half_made(db)
            raise DiskFullError(f"{where} {redact(url)}: disk full while creating the Optuna storage (nothing kept); "
                                "free some space and rerun") from None
        if "database is locked" in str(exc):  # sqlite waited its busy timeout
            raise BenchError(f"{where} {redact(url)}: the database stays locked by another process (another tune or "
                             "optuna-dashboard writing it); rerun when it is done, or give another storage") from None
        msg = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise BenchError(f"{where} {redact(url)}: cannot open Optuna storage: {msg}") from None


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{prefix + "a.b": 1}``: one key per leaf (lists stay values)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def study_settings(attrs: dict[str, Any]) -> dict[str, Any]:
    """The flattened settings a study was made with (its ``setting.*`` user attributes, or the single
    ``bench_settings`` value of an older study); keys without the prefix."""
    flat = {k[len(SETTINGS_PREFIX):]: v for k, v in attrs.items() if k.startswith(SETTINGS_PREFIX)}
    return flat or flatten(attrs.get(SETTINGS_ATTR) or {})


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys where two JSON-like values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            out += _diff(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else str(k))
        return out
    return (
        []
        if json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)
        else [prefix or "(root)"]
    )
