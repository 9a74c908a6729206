"""Extensions found by lookup: the entry points of the harness's registries, built-ins and plugins alike.

Groups (``[project.entry-points."<group>"]`` of a ``pyproject.toml``), each entry ``name = "module:attribute"``:

* ``grpo_bench.engines``: an engine class (:class:`bench.engines.base.Engine`);
* ``grpo_bench.readers``: a trace or metrics reader (:class:`bench.measure.formats.Reader` subclass or instance);
* ``grpo_bench.optimizations``: an :class:`bench.spec.optimizations.Optimization`;
* ``grpo_bench.stat_tests``: a two-sample test (:class:`bench.stats.stat_tests.StatTest` subclass or instance);
* ``grpo_bench.evidence_checks``: an evidence check (:class:`bench.measure.evidence.EvidenceCheck`);
* ``grpo_bench.op_categories``: a set of operator-category rules (:class:`bench.measure.op_categories.CategoryRules`).

Each registry is one :class:`Registry`: entry points loaded on the first lookup, run-time registrations after
them, one duplicate policy (:func:`same_extension`) and one live view.

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
from typing import Any, Callable, Generic, TypeVar

from bench.core.errors import BenchError

T = TypeVar("T")

#: this project's distribution name (its own entries are read from the source tree when there is one)
DIST = "grpo-ablation-bench"
GROUPS = ("grpo_bench.engines", "grpo_bench.readers", "grpo_bench.optimizations", "grpo_bench.stat_tests",
          "grpo_bench.evidence_checks", "grpo_bench.op_categories")
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


def _origin(obj: Any) -> tuple[str, str]:
    cls = obj if isinstance(obj, type) else type(obj)
    return cls.__module__, cls.__qualname__


def same_extension(held: Any, new: Any) -> bool:
    """The one duplicate policy of every registry: whether ``new`` may take the name ``held`` has.

    True for the same object; for classes, the same module and qualified name (a module imported twice, a
    reload); for value objects (a type defining ``__eq__``: pydantic models, dataclasses), equal values; for
    other instances, the same class. Anything else under a taken name is a clash (:meth:`Registry.register`
    raises)."""
    if held is new:
        return True
    if isinstance(held, type) or isinstance(new, type):
        return isinstance(held, type) and isinstance(new, type) and _origin(held) == _origin(new)
    if type(new).__eq__ is not object.__eq__:
        return bool(held == new)
    return _origin(held) == _origin(new)


class Registry(Generic[T]):
    """One registry of extensions (engines, readers, optimizations, statistical tests): name -> object.

    Order: the entry points of ``group`` (:func:`entry_points`: built-ins first, then plugins), loaded on the
    first lookup so importing a registry costs nothing, then :meth:`register` calls in call order (those made
    before the first lookup included). Registering a name again with the same extension
    (:func:`same_extension`) replaces it in place; another extension under a taken name raises.

    Args:
        group: the entry-point group, e.g. ``grpo_bench.engines``.
        kind: what an entry is called in messages (``engine``, ``reader``, ``optimization``, ``test``).
        name_of: the registry key of an object (its ``name`` or ``key`` attribute).
        instantiate: an entry point naming a class registers an instance of it (readers, tests); False keeps
            classes (engines).
        check: called with each object before it is registered; raises ``ValueError`` for a wrong kind.
    """

    def __init__(self, group: str, kind: str, name_of: Callable[[T], Any], *, instantiate: bool = True,
                 check: Callable[[Any], None] | None = None) -> None:
        self.group, self.kind, self._name_of, self._instantiate, self._check = group, kind, name_of, instantiate, check
        self._items: dict[str, T] = {}
        self._loaded = False

    def _name(self, obj: Any) -> str:
        name = self._name_of(obj)
        if not isinstance(name, str) or not name:
            label = obj.__name__ if isinstance(obj, type) else type(obj).__name__
            raise ValueError(f"{self.kind} {label} has no name")
        return name

    def _put(self, obj: T) -> T:
        if self._check is not None:
            self._check(obj)
        name = self._name(obj)
        held = self._items.get(name)
        if held is not None and not same_extension(held, obj):
            mod, qual = _origin(held)
            if _origin(obj) == (mod, qual):  # a value object of the same class with other values
                raise ValueError(f"{self.kind} name {name!r} is already registered with other values")
            raise ValueError(f"{self.kind} name {name!r} is already registered by {mod}.{qual}")
        self._items[name] = obj  # a dict keeps the place of a replaced key
        return obj

    def items(self) -> dict[str, T]:
        """The registry itself, name -> object, in registry order (loads the entry points on the first call).
        Read it, do not change it.

        Raises:
            BenchError: an entry point that cannot be loaded, is of the wrong kind or clashes with another.
        """
        if not self._loaded:
            self._loaded = True  # before loading: an entry point's module may look the registry up
            early = list(self._items.values())
            self._items.clear()
            for name, obj in load(self.group):
                try:
                    self._put(instance(obj) if self._instantiate else obj)
                except ValueError as exc:
                    raise BenchError(f"entry point {self.group}: {name}: {exc}") from None
            for obj in early:
                self._put(obj)
        return self._items

    def names(self) -> list[str]:
        """The registered names, in registry order."""
        return list(self.items())

    def get(self, name: str) -> T:
        """The object registered as ``name``.

        Raises:
            KeyError: unknown name.
        """
        return self.items()[name]

    def register(self, obj: T) -> T:
        """Add ``obj`` under its name (returns it); seen by every later lookup, whenever it is called.

        Raises:
            ValueError: no name, the wrong kind, or the name is held by another extension.
        """
        self.items()
        return self._put(obj)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests undo a toy extension with it); an unknown name is ignored."""
        self.items().pop(name, None)

    def view(self, label: str) -> "LiveView":
        """A live read-only mapping over this registry (:class:`LiveView`) shown as ``label``."""
        return LiveView(self.items, label)


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
