"""Engines turn a planned cell into a launch; this package holds their registry (name -> engine class).

Built-in engines: ``embedded`` (one-process GRPO, :mod:`bench.engines.embedded_launch`) and ``verl``
(``verl.trainer.main_ppo``, :mod:`bench.engines.verl`). Each engine module registers its class with the
:func:`register` decorator (one line); the modules listed in :data:`ENGINE_MODULES` are imported on the
first lookup, so importing this package stays free of torch, verl and the engines' own imports.

Adding an engine: one module with a class implementing :class:`bench.engines.base.Engine`, decorated
with ``@register``, and its module name appended to :data:`ENGINE_MODULES` (see ``CONTRIBUTING.md``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from bench.engines.base import Engine

#: modules of the built-in engines, imported on the first lookup (each registers its engine class)
ENGINE_MODULES: list[str] = ["bench.engines.embedded_launch", "bench.engines.verl.launch"]

_ENGINES: dict[str, type] = {}
_loaded: list[str] = []
E = TypeVar("E", bound=type)


def register(cls: E) -> E:
    """Register an engine class under its ``name`` attribute (a class decorator; returns ``cls``).

    Raises:
        ValueError: ``cls`` has no string ``name``, or another class already holds that name.
    """
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"engine class {cls.__name__} has no name")
    held = _ENGINES.get(name)
    if held is not None and held.__qualname__ != cls.__qualname__:
        raise ValueError(f"engine name {name!r} is already registered by {held.__module__}.{held.__qualname__}")
    _ENGINES[name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove the engine called ``name`` (tests that register a toy engine undo it with this)."""
    _ENGINES.pop(name, None)


def _load_builtin() -> None:
    for module in ENGINE_MODULES:
        if module not in _loaded:
            importlib.import_module(module)
            _loaded.append(module)


def engine_names() -> list[str]:
    """Names of the registered engines, built-in ones first (in :data:`ENGINE_MODULES` order)."""
    _load_builtin()

    def rank(name: str) -> int:
        module = _ENGINES[name].__module__
        return ENGINE_MODULES.index(module) if module in ENGINE_MODULES else len(ENGINE_MODULES)

    return sorted(_ENGINES, key=rank)  # stable: registered order within each rank


def engine_class(name: str) -> type:
    """The class registered as ``name``.

    Raises:
        KeyError: unknown engine name (the matrix schema already refuses it, naming the allowed ones).
    """
    _load_builtin()
    return _ENGINES[name]


def get_engine(name: str) -> Engine:
    """A new instance of the engine called ``name`` (``embedded``, ``verl`` or a registered one).

    Raises:
        KeyError: unknown engine name.
    """
    return engine_class(name)()


def engines_with(capability: str) -> list[str]:
    """Names of the registered engines whose class attribute ``capability`` is true (e.g. ``supports_smoke``)."""
    return [n for n in engine_names() if getattr(_ENGINES[n], capability, False)]
