"""Extensions found by lookup: the entry points of the harness's four registries, built-ins and plugins alike.

Groups (``[project.entry-points."<group>"]`` of a ``pyproject.toml``), each entry ``name = "module:attribute"``:

* ``grpo_bench.engines``: an engine class (:class:`bench.engines.base.Engine`);
* ``grpo_bench.readers``: a trace or metrics reader (:class:`bench.measure.formats.Reader` subclass or instance);
* ``grpo_bench.optimizations``: an :class:`bench.spec.optimizations.Optimization`;
* ``grpo_bench.stat_tests``: a two-sample test (:class:`bench.analyze.stat_tests.StatTest` subclass or instance).

The harness's own entries come from the ``pyproject.toml`` beside the ``bench`` package when the harness runs
from a source tree (so a checkout, or a copy of it, sees exactly its own registration lines whatever copy is
pip-installed; Python >= 3.11, whose ``tomllib`` reads it), else from its installed distribution's
metadata. Every other installed distribution (``importlib.metadata``: site-packages, a ``--target`` folder
on ``sys.path``, an editable install) adds its entries after them: a plugin package works with the
unchanged ``python run_bench.py``.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Callable

from bench.core.errors import BenchError

#: this project's distribution name (its own entries are read from the source tree when there is one)
DIST = "grpo-ablation-bench"
GROUPS = ("grpo_bench.engines", "grpo_bench.readers", "grpo_bench.optimizations", "grpo_bench.stat_tests")
SOURCE_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _own_entries(group: str) -> list[md.EntryPoint]:
    if SOURCE_PYPROJECT.is_file() and sys.version_info >= (3, 11):  # tomllib; Python 3.10 reads the metadata
        import tomllib

        project = tomllib.loads(SOURCE_PYPROJECT.read_text()).get("project", {})
        if _norm(project.get("name", "")) == DIST:
            table = project.get("entry-points", {}).get(group, {})
            return [md.EntryPoint(name=k, value=v, group=group) for k, v in table.items()]
    try:
        return list(md.distribution(DIST).entry_points.select(group=group))
    except md.PackageNotFoundError:
        return []


def entry_points(group: str) -> list[md.EntryPoint]:
    """The entry points of ``group``: this project's first (in the order its ``pyproject.toml`` lists them),
    then those of every other installed distribution (by distribution name, then entry order)."""
    own = _own_entries(group)
    others = [ep for ep in md.entry_points(group=group) if ep.dist is None or _norm(ep.dist.name) != DIST]
    others.sort(key=lambda ep: _norm(ep.dist.name) if ep.dist is not None else "")
    seen: set[tuple[str, str]] = set()
    out = []
    for ep in own + others:
        if (ep.name, ep.value) not in seen:
            seen.add((ep.name, ep.value))
            out.append(ep)
    return out


def load(group: str) -> list[tuple[str, Any]]:
    """``(name, object)`` of every entry point of ``group`` (see :func:`entry_points`), each loaded.

    Raises:
        BenchError: an entry point that cannot be loaded (one line naming the group, the entry and the error).
    """
    out = []
    for ep in entry_points(group):
        try:
            out.append((ep.name, ep.load()))
        except Exception as exc:  # a broken plugin is named, never a traceback
            dist = f" (distribution {ep.dist.name})" if ep.dist is not None else ""
            raise BenchError(f"entry point {group}: {ep.name} = {ep.value}{dist}: cannot load: "
                             f"{type(exc).__name__}: {exc}") from None
    return out


def instance(obj: Any) -> Any:
    """``obj()`` when an entry point names a class, else ``obj`` (readers and tests may be either)."""
    return obj() if isinstance(obj, type) else obj


def fill(group: str, early: list[Any], put: Callable[[Any], Any]) -> None:
    """Fill a registry of instances: ``put`` each object of ``group``'s entry points (built-ins, then plugins,
    classes instantiated), then each of ``early`` (those registered at run time before the first lookup)."""
    for _name, obj in load(group):
        put(instance(obj))
    for item in early:
        put(item)


class LiveView(Mapping[str, Any]):
    """A live read-only mapping over a registry read through ``lookup`` (a function returning the registry's
    dict): every access asks ``lookup`` again, so a module may import the view once and still see what is
    registered later (``REGISTRY`` of the optimizations, ``TESTS`` of the statistical tests)."""

    def __init__(self, lookup: Callable[[], dict[str, Any]], name: str) -> None:
        self._lookup, self._name = lookup, name

    def __getitem__(self, key: str) -> Any:
        return self._lookup()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._lookup()))

    def __len__(self) -> int:
        return len(self._lookup())

    def __repr__(self) -> str:
        return f"{self._name}({', '.join(self._lookup())})"
