"""Which tests enumerate a registry (issue 31): the tests whose answer changes when a CONTRIBUTING recipe adds an
optimization, an engine, a profiler format (reader) or a statistical test.

A test function enumerates a registry when its source names one of :data:`ENUMERATORS` (``FACTOR_KEYS``,
``REGISTRY``, ``engine_names``, ...) or a module-level name or helper function of its module whose source does
(``BINARY = {k: ... for k in FACTOR_KEYS}``), and so on (a table of cases built by such a helper).
``tests/conftest.py`` marks every such test ``registry``; the recipe test (``tests/test_extension_recipes.py``)
runs ``pytest -m registry`` on its copy of the repository with the recipes applied, so a test that hard-codes
seven factors or two engines turns red there.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

#: names through which a test reads a registry's contents
ENUMERATORS = re.compile(r"\b(FACTOR_KEYS|factor_keys|REGISTRY|registry\(\)|article_factors|engine_names|"
                         r"READERS|readers\(\)|stat_tests|stats\.tests\(\))")


@functools.cache
def enumerating_tests(path: Path) -> frozenset[str]:
    """The names of the top-level ``test_*`` functions of the test module ``path`` that enumerate a registry
    (see the module docstring); empty for a file that does not parse."""
    src = Path(path).read_text()
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return frozenset()
    derived: set[str] = set()
    while True:  # names derived from a registry, and names derived from those (a table of cases built by a helper)
        more = set(derived)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                continue
            seg = ast.get_source_segment(src, node) or ""
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if not (ENUMERATORS.search(seg) or used & derived):
                continue
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                more |= {t.id for t in targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.FunctionDef):
                more.add(node.name)
        if more == derived:
            break
        derived = more
    out = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if ENUMERATORS.search(ast.get_source_segment(src, node) or "") or used & derived:
                out.add(node.name)
    return frozenset(out)
