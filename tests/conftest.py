"""Set-up shared by every test module: a new sqlite MLflow store gets its schema copied, not migrated again.

MLflow builds the schema of a new sqlite store by running its alembic migrations one by one (``mlflow.store.db.
utils._initialize_tables``): about 5 s on this 2-core machine when idle, 16 s at load ~8, paid by every test that
opens a fresh ``sqlite:///`` tracking URI in the test process. Here the first such store of the session is
migrated for real, into a template file, and every later new store gets a page-for-page copy of that template
(sqlite's backup API, :meth:`sqlite3.Connection.backup`): the same tables, indexes and ``alembic_version`` MLflow's
own migrations write, so MLflow's schema check (``_verify_schema``) and everything after it run unchanged.

Only MLflow's step is replaced; the harness's own code (``bench.tracking``: opening the store, the file lock two
harnesses share, creating experiments and runs) runs as it does outside tests. Harnesses started as subprocesses
(``run_bench.py`` in tests/test_faults.py, tests/test_bad_inputs_io.py, ...) migrate their stores for real, so the
fresh-database path stays covered. ``BENCH_TEST_MIGRATE_MLFLOW=1`` turns the copy off (every store migrated).

Also marks ``registry`` every test that enumerates a registry (:mod:`_registry_tests`), for the recipe test.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

import pytest
from _registry_tests import enumerating_tests

_MODULE = "mlflow.store.db.utils"
#: folder of the session's template store (created on first use, removed at the end of the session)
_TEMPLATE: dict[str, Path] = {}


def _copying_initialize_tables(migrate):
    """Wrap MLflow's ``_initialize_tables(engine)`` (``migrate``): sqlite engines get the template's schema copied
    in; other back ends (and the template itself) are migrated by ``migrate``."""

    def initialize_tables(engine) -> None:
        if engine.dialect.name != "sqlite":
            migrate(engine)
            return
        if "db" not in _TEMPLATE:
            import sqlalchemy

            folder = Path(tempfile.mkdtemp(prefix="bench-mlflow-template-"))
            db = folder / "template.db"
            template = sqlalchemy.create_engine(f"sqlite:///{db.as_posix()}")
            try:
                migrate(template)
            finally:
                template.dispose()
            _TEMPLATE.update(folder=folder, db=db)
        src = sqlite3.connect(_TEMPLATE["db"])
        raw = engine.raw_connection()
        try:
            src.backup(raw.driver_connection)
        finally:
            raw.close()
            src.close()

    initialize_tables.migrate = migrate  # the original, for a reader of a failure
    return initialize_tables


def _patch(module) -> None:
    if not getattr(module._initialize_tables, "migrate", None):
        module._initialize_tables = _copying_initialize_tables(module._initialize_tables)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Wraps ``_initialize_tables`` the moment MLflow's ``mlflow.store.db.utils`` is imported (not before: a test
    session that never opens a store does not pay MLflow's import)."""

    def find_spec(self, name, path=None, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


def pytest_configure(config) -> None:
    if os.environ.get("BENCH_TEST_MIGRATE_MLFLOW") == "1":
        return
    if _MODULE in sys.modules:
        _patch(sys.modules[_MODULE])
    else:
        sys.meta_path.insert(0, _PatchOnImport())


def pytest_collection_modifyitems(config, items) -> None:
    """Mark ``registry`` each collected test whose function enumerates a registry (:func:`enumerating_tests`)."""
    for item in items:
        fn = getattr(item, "function", None)
        if fn is not None and fn.__name__ in enumerating_tests(Path(str(item.path))):
            item.add_marker(pytest.mark.registry)


def pytest_unconfigure(config) -> None:
    folder = _TEMPLATE.pop("folder", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
