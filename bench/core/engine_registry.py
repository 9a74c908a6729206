"""The registry of engines (name -> engine class): the lookup every layer asks about an engine.

Engines are found by lookup: the entry points of the group ``grpo_bench.engines`` (:mod:`bench.core.plugins`:
the built-ins in ``pyproject.toml``, then those of installed plugin packages) are loaded on the first
lookup, so importing this module stays free of torch, verl and the engines' own imports; :func:`register`
adds a class at run time (a decorator). The registry is a :class:`bench.core.plugins.Registry`.
Every question about an engine is asked of its class (the
capabilities of :class:`bench.engines.base.Engine`), never of its name. The public names are re-exported by
:mod:`bench.engines` (``bench.engines.register``, ``bench.engines.engine_names`` ...).
"""

from __future__ import annotations

from typing import Any, TypeVar

from bench.core.plugins import Registry

GROUP = "grpo_bench.engines"
#: the engines by name (classes, not instances), on :class:`bench.core.plugins.Registry`
ENGINES: Registry[type] = Registry(GROUP, "engine", lambda cls: getattr(cls, "name", None), instantiate=False)
E = TypeVar("E", bound=type)


def register(cls: E) -> E:
    """Register an engine class under its ``name`` attribute (a class decorator; returns ``cls``).

    Raises:
        ValueError: ``cls`` has no string ``name``, or another class already holds that name.
    """
    return ENGINES.register(cls)


def unregister(name: str) -> None:
    """Remove the engine called ``name`` (tests that register a toy engine undo it with this)."""
    ENGINES.unregister(name)


def engine_names() -> list[str]:
    """Names of the registered engines: those of entry points first (built-ins, then plugins), then those
    registered at run time (:func:`register`)."""
    return ENGINES.names()


def engine_class(name: str) -> type:
    """The class registered as ``name``.

    Raises:
        KeyError: unknown engine name (the matrix schema already refuses it, naming the allowed ones).
    """
    return ENGINES.get(name)


def get_engine(name: str) -> Any:
    """A new instance of the engine called ``name`` (any registered one): a :class:`bench.engines.base.Engine`
    (not imported here: the registry imports nothing of the engines' interface, not even for annotations).

    Raises:
        KeyError: unknown engine name.
    """
    return engine_class(name)()


def engines_with(capability: str) -> list[str]:
    """Names of the registered engines whose class attribute ``capability`` is true (e.g. ``supports_smoke``)."""
    return [n for n, cls in ENGINES.items().items() if getattr(cls, capability, False)]


def engine_classes() -> list[type]:
    """The registered engine classes, in :func:`engine_names` order."""
    return list(ENGINES.items().values())


def default_engine() -> str:
    """The engine a matrix without ``engine:`` uses: the first registered one (the first entry point)."""
    return engine_names()[0]


def options_keys() -> set[str]:
    """The keys under a matrix's ``base`` that hold some engine's own settings (:attr:`Engine.options_key`)."""
    return {c.options_key for c in engine_classes() if getattr(c, "options_key", None)}
