"""The import graph of ``bench/``: no import cycle, the analysis/measurement layers never import an
engine or a command, every imported ``bench`` module exists, and no module is over the size limit. Read
statically with ``ast`` (every import, also those inside functions; imports under ``if TYPE_CHECKING:``
are for annotations only and are skipped)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
#: cycles through lazy imports owned by other work, each with its reason (empty this set as they go)
KNOWN_CYCLES: set[frozenset[str]] = set()
#: modules that must not import from bench.engines or a command module (bench.cli, bench.commands.*).
#: Not yet an order of packages: bench.core.progress imports bench.engines.base, and bench.records is
#: imported by bench.measure, bench.spec and bench.engines while it imports them (issue 31)
LOWER_LAYERS = ("bench.measure", "bench.analyze", "bench.planning", "bench.gate.verdicts", "bench.gate.runs",
                "bench.gate.stored_runs", "bench.gate.markdown", "bench.gate.stored", "bench.gate.baseline",
                "bench.records", "bench.spec.expect", "bench.core.metadata", "bench.tracking")
#: execution (sweep loop, executors, runner, fork server, Ray): never imports a command
EXECUTION = "bench.execution"
#: what to run (matrix, plan, ...): no command, and engines only through their registry and interface
#: (``bench.engines``, ``bench.engines.base``: the plan asks the matrix's engine to build each launch)
SPEC_LAYER = "bench.spec"
ENGINE_INTERFACE = ("bench.engines", "bench.engines.base")
#: the most lines a module of bench/ may have: modules hold one concept and stay near 400 lines as a guideline;
#: one may pass it where splitting would cut a concept (issue 31), never this hard limit
MAX_LINES = 600
#: modules other work is editing now, allowed over MAX_LINES until it is merged (then split them, and
#: empty this set)
OVERSIZE_ALLOWED: set[str] = set()


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / "bench").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, package: str, typing_only: bool = False) -> list[str]:
    """Dotted names imported anywhere in ``tree`` (``from x import y`` gives ``x`` and ``x.y``); imports under
    ``if TYPE_CHECKING:`` only with ``typing_only``."""
    out: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not typing_only:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.append(base)
            out.extend(f"{base}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def import_graph(typing_only: bool = False) -> nx.DiGraph:
    """Edges module -> bench module it imports (names resolved to the longest existing module); with
    ``typing_only`` also the imports made for annotations only (under ``if TYPE_CHECKING:``)."""
    mods = _modules()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target in _imports(ast.parse(path.read_text()), package, typing_only):
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name:
                g.add_edge(name, target)
    return g


def test_no_import_cycle():
    cycles = [c for c in nx.simple_cycles(import_graph()) if frozenset(c) not in KNOWN_CYCLES]
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_import_cycle_through_typing_only_imports():
    """Annotations-only imports (``if TYPE_CHECKING:``) count too: a cycle through them is a layering error
    that only does not fail at run time."""
    cycles = [c for c in nx.simple_cycles(import_graph(typing_only=True)) if frozenset(c) not in KNOWN_CYCLES]
    assert cycles == [], "import cycles (typing-only imports included): " + "; ".join(" -> ".join(c) for c in cycles)


def test_known_cycles_still_exist():
    """An allowed cycle that is gone must leave KNOWN_CYCLES (the list shrinks, never hides a new one)."""
    found = {frozenset(c) for c in nx.simple_cycles(import_graph())}
    assert KNOWN_CYCLES <= found


def test_lower_layers_import_no_engine_and_no_command():
    g = import_graph()
    bad = []
    for mod in g.nodes:
        if not any(mod == low or mod.startswith(low + ".") for low in LOWER_LAYERS):
            continue
        for target in g.successors(mod):
            if target == "bench.engines" or target.startswith(("bench.engines.", "bench.cli", "bench.commands")):
                bad.append(f"{mod} -> {target}")
    assert bad == []


def test_graph_sees_imports():
    """The walker is not blind: known edges are found (a lazy one inside a function included)."""
    g = import_graph()
    assert g.has_edge("bench.commands.run", "bench.engines")
    assert g.has_edge("bench.spec.plan", "bench.engines.base")
    assert g.has_edge("bench.spec.matrix", "bench.engines")  # the registry of engine names
    assert g.has_edge("bench.records.summary", "bench.analyze.tables")  # lazy: bench.analyze.tables loads scipy
    assert not g.has_edge("bench.engines", "bench.engines.base")  # TYPE_CHECKING only


def _in(mod: str, layer: str) -> bool:
    return mod == layer or mod.startswith(layer + ".")


def test_spec_imports_no_command_and_no_concrete_engine():
    g = import_graph()
    bad = [f"{mod} -> {target}" for mod in g.nodes if _in(mod, SPEC_LAYER) for target in g.successors(mod)
           if target.startswith(("bench.cli", "bench.commands"))
           or (_in(target, "bench.engines") and target not in ENGINE_INTERFACE)]
    assert bad == []


def test_new_layers_are_checked():
    """The packages of the layout exist and are covered by the layer rules above."""
    mods = _modules()
    for pkg in ("bench.analyze", "bench.spec", "bench.measure", "bench.engines.verl", "bench.execution",
                "bench.commands", "bench.core", "bench.records", "bench.planning"):
        assert pkg in mods and any(m.startswith(pkg + ".") for m in mods), pkg
    assert {"bench.analyze", "bench.measure", "bench.records", "bench.planning"} <= set(LOWER_LAYERS)


def test_every_bench_import_resolves():
    """Every ``bench...`` module imported in bench/, tests/ and benchmarks/ exists in this tree (a stale path
    after a move would otherwise be found only when that line runs)."""
    mods = _modules()
    bad = []
    for folder in ("bench", "tests", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT)
            package = ".".join(rel.with_suffix("").parts[:-1])
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        parts = package.split(".")
                        base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                    names = [base]
                else:
                    continue
                bad += [f"{rel}:{node.lineno}: {n}" for n in names if n.startswith("bench.") and n not in mods]
    assert bad == []


def _top_level_names(tree: ast.Module) -> set[str] | None:
    """Names a module defines at its top level (defs, classes, assignments, imports, also inside top-level
    if/try blocks); ``None`` when it has a module ``__getattr__`` (anything may resolve)."""
    names: set[str] = set()
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
            for h in getattr(node, "handlers", []):
                todo += h.body
    return names


def test_every_name_imported_from_bench_exists():
    """``from bench.x import name``: ``name`` is defined in ``bench.x`` (or is its submodule), also for imports
    inside functions, which run only when that code path does (a moved helper once made every MLflow upload
    of a sweep fail with an ImportError that the tracker took for an outage)."""
    mods = _modules()
    defined = {m: _top_level_names(ast.parse(p.read_text())) for m, p in mods.items()}
    bad = []
    for folder in ("bench", "tests", "benchmarks", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT)
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.ImportFrom) and not node.level and (node.module or "") in defined):
                    continue
                have = defined[node.module]
                if have is None:
                    continue
                bad += [f"{rel}:{node.lineno}: {node.module} has no {a.name}" for a in node.names
                        if a.name != "*" and a.name not in have and f"{node.module}.{a.name}" not in mods]
    assert bad == []


def test_no_module_over_the_size_limit():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / "bench").rglob("*.py")}
    over = {f: n for f, n in sizes.items() if n > MAX_LINES and f not in OVERSIZE_ALLOWED}
    assert over == {}, f"modules over {MAX_LINES} lines: {over}"


def test_execution_imports_no_command():
    g = import_graph()
    bad = [f"{mod} -> {target}" for mod in g.nodes if _in(mod, EXECUTION) for target in g.successors(mod)
           if target.startswith(("bench.cli", "bench.commands"))]
    assert bad == []


def test_every_command_is_a_command_module():
    """Every subcommand is a ``Command`` subclass in its own module of ``bench/commands/`` (found by scanning
    the package, asv-style), and no module outside ``bench/commands/`` (but the dispatcher ``bench.cli``)
    defines a command's ``add_arguments``/``setup_arguments``."""
    from bench.commands import commands

    found = commands()
    assert {"run", "tune", "gate", "report", "compare", "baseline", "sync"} <= set(found)
    assert list(found)[0] == "run"
    for name, cls in found.items():
        assert cls.__module__.startswith("bench.commands."), (name, cls.__module__)
    modules = {cls.__module__ for cls in found.values()}
    assert len(modules) == len(found), "one module per subcommand"
    outside = []
    for mod, path in _modules().items():
        if mod.startswith("bench.commands") or mod == "bench.cli":
            continue
        tree = ast.parse(path.read_text())
        outside += [f"{mod}.{n.name}" for n in tree.body if isinstance(n, ast.FunctionDef)
                    and n.name in ("setup_arguments", "add_arguments")]
    assert outside == [], outside


#: processes of their own with their own command line (a run's process), not parts of the harness's commands
OWN_ENTRY_POINTS = {"bench.engines.embedded.__main__"}


def test_no_argparse_below_the_commands():
    """Commands turn arguments into typed options: no module below ``bench/commands/`` and ``bench.cli`` imports
    ``argparse`` (a namespace passed down would carry every flag of every command), but a process's own
    ``__main__``."""
    bad = []
    for mod, path in _modules().items():
        if _in(mod, "bench.commands") or mod == "bench.cli" or mod in OWN_ENTRY_POINTS:
            continue
        bad += [f"{mod}:{n.lineno}" for n in ast.walk(ast.parse(path.read_text()))
                if isinstance(n, (ast.Import, ast.ImportFrom))
                and any(a.name == "argparse" for a in n.names) | ((getattr(n, "module", "") or "") == "argparse")]
    assert bad == [], bad


def _function_level_bench_imports() -> list[tuple[str, int, str]]:
    """``(file, line, first line)`` of every import of a ``bench`` module (relative ones included) made inside a
    function or method of bench/; imports under ``if TYPE_CHECKING:`` are for annotations only and are skipped."""
    out = []
    for mod, path in _modules().items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        lines = path.read_text().splitlines()
        rel = str(path.relative_to(ROOT))

        def visit(node: ast.AST, in_function: bool) -> None:
            if isinstance(node, ast.If) and _is_type_checking(node):
                for child in node.orelse:
                    visit(child, in_function)
                return
            in_function = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if in_function and isinstance(node, (ast.Import, ast.ImportFrom)):
                names = _imports(node, package)
                if any(n == "bench" or n.startswith("bench.") for n in names):
                    out.append((rel, node.lineno, lines[node.lineno - 1]))
                return
            for child in ast.iter_child_nodes(node):
                visit(child, in_function)

        visit(ast.parse("\n".join(lines)), False)
    return out


def test_function_level_bench_imports_say_why():
    """A ``bench`` module is imported at the top of the module that uses it; one imported inside a function says
    why on the import's (first) line: ``# deferred: <reason>`` (the module loads a heavy or optional library the
    caller does not load, a name clash, an initialization order)."""
    found = _function_level_bench_imports()
    print(f"function-level bench imports: {len(found)}")
    bad = []
    for rel, line, text in found:
        comment = text[text.index("#"):] if "#" in text else ""
        if not comment.startswith("# deferred:") or not comment.removeprefix("# deferred:").strip():
            bad.append(f"{rel}:{line}: {text.strip()}")
    assert bad == [], "function-level bench imports without '# deferred: <reason>' (move them to the top of " \
        "the module, or say why they stay):\n" + "\n".join(bad)

