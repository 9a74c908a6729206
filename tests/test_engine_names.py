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
NOT_ENGINES = {("bench/metadata.py", "verl"): "the Python package whose version a run records"}


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
    from bench.engines import engine_names

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
