"""No engine name outside ``bench/engines/``: code asks an engine's class (its capabilities), never its name.

Scanned statically (``ast``): every string literal of ``bench/`` outside ``bench/engines/`` that is exactly the
name of a registered engine (or of an engine package, ``verl_cpu``). The optimizations' mechanism tables are
keyed by targets (``"verl:npu"``), which are data, not names compared in code, and are not matched.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: literals that name something else than an engine, each with what it names
NOT_ENGINES = {("bench/core/metadata.py", "verl"): "the Python package whose version a run records",
               ("bench/spec/optimizations/versions.py", "verl"): "the Python package a factor's switch range names"}


def engine_literals(root: Path, names: set[str]) -> list[str]:
    """``file:line: 'name'`` for each string literal in ``root/bench`` (outside ``bench/engines``) equal to one
    of ``names``."""
    out = []
    for path in sorted((root / "bench").rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[:2] == ("bench", "engines"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names \
                    and (str(rel), node.value) not in NOT_ENGINES:
                out.append(f"{rel}:{node.lineno}: {node.value!r}")
    return out


def _names() -> set[str]:
    from bench.core.engine_registry import engine_names

    packages = {p.name for p in (ROOT / "bench" / "engines").iterdir() if p.is_dir() and not p.name.startswith("_")}
    return set(engine_names()) | packages


def test_no_engine_name_outside_engines():
    assert engine_literals(ROOT, _names()) == []


def test_the_scan_finds_a_name(tmp_path):
    """The scan is not blind: a comparison with an engine's name in a module of bench/ is found."""
    (tmp_path / "bench" / "engines").mkdir(parents=True)
    (tmp_path / "bench" / "x.py").write_text('def f(spec):\n    return spec["engine"] == "verl"\n')
    (tmp_path / "bench" / "engines" / "y.py").write_text('NAME = "verl"\n')
    assert engine_literals(tmp_path, {"verl", "embedded"}) == ["bench/x.py:2: 'verl'"]


def engine_crossings(graph, families: dict[str, tuple[str, ...]]) -> list[str]:
    """``a -> b`` for each import edge of ``graph`` from a module of one engine family to a module of another
    (``families``: engine -> the module prefixes that are its code)."""
    def family(mod: str) -> str | None:
        return next((f for f, prefixes in families.items() if mod.startswith(prefixes)), None)

    return sorted(f"{a} -> {b}" for a, b in graph.edges if family(a) and family(b) and family(a) != family(b))


def test_no_engine_imports_another_engines_internals():
    """The verl engine (``verl``, its ``verl:cpu`` target) and the embedded engine share the built-in tiny model
    and data through the neutral ``bench.engines.builtins`` (and ``bench.engines.common``), never each other's
    modules; typing-only imports count too."""
    from test_architecture import import_graph

    families = {"embedded": ("bench.engines.embedded",), "verl": ("bench.engines.verl",)}
    graph = import_graph(typing_only=True)
    assert {"bench.engines.builtins.model", "bench.engines.builtins.data"} <= set(graph.nodes)
    assert engine_crossings(graph, families) == []
    graph.add_edge("bench.engines.verl_cpu.assets", "bench.engines.embedded.checkpoint")  # the check is not blind
    assert engine_crossings(graph, families) == ["bench.engines.verl_cpu.assets -> bench.engines.embedded.checkpoint"]
