"""The one :class:`bench.core.plugins.Registry` behind the four extension kinds: the same order, the same duplicate
policy and the same live view for engines, readers, optimizations and statistical tests."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from bench.core import engine_registry, plugins
from bench.core.errors import BenchError
from bench.core.plugins import Registry, same_extension
from bench.measure import formats
from bench.spec import optimizations
from bench.stats import stat_tests


class ToyEngine:
    name = "embedded"  # a builtin's name, another class


class ToyReader(formats.Reader):
    name = "jsonl"


class ToyTest(stat_tests.StatTest):
    name = stat_tests.UNPAIRED


def _other_optimization():
    held = optimizations.registry()["graph_mode"]
    return held.model_copy(update={"title": held.title + " (a plugin's copy)"})


#: per registry: (the Registry, a builtin name, a clashing object under that name)
KINDS = {
    "engines": (engine_registry.ENGINES, "embedded", ToyEngine),
    "readers": (formats.REGISTRY, "jsonl", ToyReader()),
    "optimizations": (optimizations.OPTIMIZATIONS, "graph_mode", None),
    "stat_tests": (stat_tests.REGISTRY, stat_tests.UNPAIRED, ToyTest()),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_registry_has_the_one_duplicate_policy(kind):
    reg, name, clash = KINDS[kind]
    clash = _other_optimization() if clash is None else clash
    before = reg.names()
    held = reg.get(name)
    # the same extension again (a second import, an equal value) changes nothing, not even the order
    assert reg.register(held) is held
    assert reg.names() == before
    # another extension under a taken name is refused, naming the name
    with pytest.raises(ValueError, match=rf"name '{name}' is already registered"):
        reg.register(clash)
    assert reg.get(name) is held and reg.names() == before


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_registry_puts_run_time_registrations_last_and_undoes_them(kind):
    reg, name, _ = KINDS[kind]
    held = reg.get(name)
    if kind == "engines":
        toy = type("LateEngine", (), {"name": "late_toy"})
    elif kind == "optimizations":
        toy = held.model_copy(update={"key": "late_toy"})
    else:
        toy = type(held)()
        toy.name = "late_toy"
    before = reg.names()
    reg.register(toy)
    try:
        assert reg.names() == [*before, "late_toy"]
        assert reg.view("V")["late_toy"] is toy
    finally:
        reg.unregister("late_toy")
    assert reg.names() == before


def test_public_lookups_read_the_registry():
    # the kind-specific functions are the registry read another way, never a copy that drifts
    assert engine_registry.engine_names() == engine_registry.ENGINES.names()
    assert [r.name for r in formats.readers()] == formats.REGISTRY.names()
    assert list(optimizations.FACTOR_KEYS) == optimizations.OPTIMIZATIONS.names()
    assert list(stat_tests.TESTS) == stat_tests.REGISTRY.names()
    # and each starts with its entry points in their order (built-ins, then plugins: never a hard-coded count)
    for reg, _, _ in KINDS.values():
        loaded = [ep.load() for ep in plugins.entry_points(reg.group)]
        held = list(reg.items().values())[:len(loaded)]
        assert len(loaded) >= 2 and len(held) == len(loaded), reg.group
        assert all(h is x or type(h) is x for h, x in zip(held, loaded)), reg.group


def test_same_extension():
    assert same_extension(ToyEngine, ToyEngine)
    assert not same_extension(ToyEngine, ClashEngine)  # classes: by module and qualified name
    assert same_extension(ToyReader(), ToyReader())  # instances without value equality: by class
    assert not same_extension(ToyReader(), formats.REGISTRY.get("jsonl"))
    held = optimizations.registry()["graph_mode"]
    assert same_extension(held, held.model_copy())  # value objects: by value
    assert not same_extension(held, _other_optimization())
    assert not same_extension(ToyEngine, ToyEngine())


def test_a_name_registered_before_the_first_lookup_comes_after_the_entry_points(monkeypatch):
    eps = [md.EntryPoint(name="a", value=f"{__name__}:ToyEngine", group="g.test"),
           md.EntryPoint(name="b", value=f"{__name__}:LateA", group="g.test")]
    monkeypatch.setattr(plugins, "entry_points", lambda group: eps if group == "g.test" else [])
    reg: Registry[type] = Registry("g.test", "engine", lambda c: getattr(c, "name", None), instantiate=False)
    reg.register(LateB)  # before the first lookup
    assert reg.names() == ["embedded", "late_a", "late_b"]


def test_an_entry_point_clash_is_one_line(monkeypatch):
    eps = [md.EntryPoint(name="a", value=f"{__name__}:ToyEngine", group="g.test"),
           md.EntryPoint(name="b", value=f"{__name__}:ClashEngine", group="g.test")]
    monkeypatch.setattr(plugins, "entry_points", lambda group: eps if group == "g.test" else [])
    reg: Registry[type] = Registry("g.test", "engine", lambda c: getattr(c, "name", None), instantiate=False)
    with pytest.raises(BenchError) as err:
        reg.names()
    assert str(err.value) == (f"entry point g.test: b: engine name 'embedded' is already registered by "
                              f"{__name__}.ToyEngine")


class LateA:
    name = "late_a"


class LateB:
    name = "late_b"


class ClashEngine:
    name = "embedded"
