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

Parallel runs (README's test command: ``pytest -n 2 --dist loadgroup --no-loadscope-reorder``, pytest-xdist): each
test module is one xdist group, so a module's fixtures (a sweep, a Ray head, a venv) are built once, by one worker;
every module with a heavy test (marked ``heavy``, ``ray`` or ``browser``: it starts verl:cpu, vLLM, a Ray head or
Chromium) joins the one group ``heavy``, sent first to one worker, so that no two heavy process trees run at once
while the other worker takes the light modules. ``BENCH_TEST_HEAVY_LOCK=PATH``: each heavy test also holds a file
lock on ``PATH`` from its set-up to its tear-down (a machine shared with other test suites). A plain ``pytest``
(no ``-n``, or ``-p no:xdist``) runs the tests in their usual order, one at a time.
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

#: markers of a test that starts a heavy process tree (verl:cpu, vLLM, a Ray head or node, the browser check)
HEAVY_MARKS = ("heavy", "ray", "browser")
#: the xdist group of every module that holds a heavy test
HEAVY_GROUP = "heavy"
#: the modules that hold a heavy test (set at collection)
_HEAVY_MODULES = pytest.StashKey[set]()

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


def is_heavy(item: pytest.Item) -> bool:
    """Whether ``item`` starts a heavy process tree (one of :data:`HEAVY_MARKS`)."""
    return any(item.get_closest_marker(m) is not None for m in HEAVY_MARKS)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items) -> None:
    """Mark ``registry`` each collected test whose function enumerates a registry (:func:`enumerating_tests`); under
    ``--dist loadgroup`` group the tests by module, the modules with a heavy test in :data:`HEAVY_GROUP`, first."""
    for item in items:
        fn = getattr(item, "function", None)
        if fn is not None and fn.__name__ in enumerating_tests(Path(str(item.path))):
            item.add_marker(pytest.mark.registry)
    heavy = {item.path for item in items if is_heavy(item)}
    config.stash[_HEAVY_MODULES] = heavy
    if not getattr(config.option, "loadgroup", False):  # set by xdist on its workers under --dist loadgroup
        return
    root = Path(str(config.rootpath))
    for item in items:
        group = HEAVY_GROUP if item.path in heavy else Path(str(item.path)).relative_to(root).as_posix()
        item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: item.path not in heavy)  # stable: the heavy group is the first work unit


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``BENCH_TEST_HEAVY_LOCK=PATH``, each test of a module that holds a heavy test (:func:`is_heavy`) runs
    holding a file lock on ``PATH`` (set-up, call and tear-down, so a module's Ray head too); otherwise nothing
    changes."""
    path = os.environ.get("BENCH_TEST_HEAVY_LOCK")
    if not path or item.path not in item.config.stash.get(_HEAVY_MODULES, set()):
        yield
        return
    from filelock import FileLock

    with FileLock(path):
        yield


def pytest_unconfigure(config) -> None:
    folder = _TEMPLATE.pop("folder", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
