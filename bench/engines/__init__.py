"""Engines turn a planned cell into a launch; this package re-exports their registry (name -> engine class,
:mod:`bench.core.engine_registry`).

Engines are found by lookup: the entry points of the group ``grpo_bench.engines`` (:mod:`bench.core.plugins`:
the built-ins in ``pyproject.toml``, then those of installed plugin packages) are loaded on the first
lookup, so importing this package stays free of torch, verl and the engines' own imports; :func:`register`
adds a class at run time (a decorator). Every question about an engine is asked of its class (the
capabilities of :class:`bench.engines.base.Engine`), never of its name.

Adding an engine: one module with a class implementing :class:`bench.engines.base.Engine` and one entry
point line (see ``CONTRIBUTING.md``).
"""

from __future__ import annotations

from bench.core.engine_registry import (
    GROUP,
    default_engine,
    engine_class,
    engine_classes,
    engine_names,
    engines_with,
    get_engine,
    options_keys,
    register,
    unregister,
)

__all__ = ["GROUP", "default_engine", "engine_class", "engine_classes", "engine_names", "engines_with", "get_engine",
           "options_keys", "register", "unregister"]
