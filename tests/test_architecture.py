"""The import graph of ``bench/``: no import cycle between modules, none between the packages of ``bench/`` (an
order of packages in which every import goes downward, :func:`test_no_package_cycle`), the analysis/measurement
layers never import an engine or a command, every imported ``bench`` module exists, and no module is over the size
limit. Read statically with ``ast`` (every import, also those inside functions; imports under ``if TYPE_CHECKING:``
are for annotations only and are skipped, but count for the cycle checks that say so)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import networkx as nx
import pytest

pytestmark = pytest.mark.layout
ROOT = Path(__file__).resolve().parents[1]
#: cycles through lazy imports owned by other work, each with its reason (empty this set as they go)
KNOWN_CYCLES: set[frozenset[str]] = set()
#: modules that must not import from bench.engines or a command module (bench.cli, bench.commands.*); the packages
#: of bench/ are also in an order without a cycle (:func:`test_no_package_cycle`, issue 31), which this list refines
#: within bench.gate (whose modules below the interleaved gate import no engine)
LOWER_LAYERS = ("bench.measure", "bench.stats", "bench.report", "bench.planning", "bench.gate.verdicts",
                "bench.gate.runs", "bench.gate.stored_runs", "bench.gate.markdown", "bench.gate.stored",
                "bench.gate.baseline", "bench.records", "bench.spec.expect", "bench.core.metadata", "bench.tracking")
#: execution (sweep loop, executors, runner, fork server, Ray): never imports a command
EXECUTION = "bench.execution"
#: what to run (matrix, plan, launch, ...): no command and nothing of ``bench.engines``; engines only through their
#: registry (``bench.core.engine_registry``: the plan asks the matrix's engine, found there, to build each launch)
SPEC_LAYER = "bench.spec"
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
    assert g.has_edge("bench.engines.verl.launch", "bench.engines.verl_cpu.smoke")  # the engine's smoke cells
    assert g.has_edge("bench.spec.plan", "bench.core.engine_registry")  # the engine that builds each launch
    assert g.has_edge("bench.spec.matrix", "bench.core.engine_registry")  # the registry of engine names
    assert g.has_edge("bench.tracking.records", "bench.report.tables")  # lazy: bench.report.tables loads scipy
    assert not g.has_edge("bench.core.engine_registry", "bench.engines.base")  # the registry knows no interface


def _in(mod: str, layer: str) -> bool:
    return mod == layer or mod.startswith(layer + ".")


def test_spec_imports_no_command_and_no_engine():
    g = import_graph(typing_only=True)
    bad = [f"{mod} -> {target}" for mod in g.nodes if _in(mod, SPEC_LAYER) for target in g.successors(mod)
           if target.startswith(("bench.cli", "bench.commands")) or _in(target, "bench.engines")]
    assert bad == []


def _package(mod: str) -> str:
    """The package of ``bench/`` a module belongs to: the first two dotted parts (``bench.gate.runs`` ->
    ``bench.gate``)."""
    return ".".join(mod.split(".")[:2])


def package_graph(graph: nx.DiGraph) -> tuple[nx.DiGraph, dict[tuple[str, str], list[tuple[str, str]]]]:
    """The graph of the packages of ``bench/`` (``bench.core``, ``bench.spec``, ...; not ``bench`` itself nor the
    module ``bench.cli``) from a module graph, and for each package edge the module edges behind it."""
    mods = _modules()
    packages = {m for m, path in mods.items() if m.count(".") == 1 and path.name == "__init__.py"}
    pg = nx.DiGraph()
    pg.add_nodes_from(packages)
    behind: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for a, b in graph.edges:
        pa, pb = _package(a), _package(b)
        if pa != pb and pa in packages and pb in packages:
            pg.add_edge(pa, pb)
            behind.setdefault((pa, pb), []).append((a, b))
    return pg, behind


def test_no_package_cycle():
    """The packages of ``bench/`` have an order in which every import goes downward (typing-only imports
    included): data flows matrix -> plan -> run -> measure -> record -> decide, and a package never imports one
    that builds on it. On a failure each cycle is printed with the module imports behind each of its edges."""
    pg, behind = package_graph(import_graph(typing_only=True))
    cycles = [sorted(c) for c in nx.strongly_connected_components(pg) if len(c) > 1]
    lines = []
    for c in cycles:
        lines.append("cycle: " + ", ".join(c))
        for a, b in sorted(pg.subgraph(c).edges):
            lines += [f"  {a} -> {b}: " + "; ".join(f"{x} -> {y}" for x, y in sorted(behind[(a, b)]))]
    assert cycles == [], "package cycles:\n" + "\n".join(lines)
    order = list(nx.lexicographical_topological_sort(pg.reverse()))  # the imported first
    print("package order (each imports only those before it): " + " < ".join(p.removeprefix("bench.") for p in order))


def test_package_graph_sees_a_cycle():
    """The package check is not blind: one import upward makes a cycle, reported with the module edge behind it."""
    g = import_graph(typing_only=True)
    g.add_edge("bench.core.errors", "bench.gate.verdicts")
    pg, behind = package_graph(g)
    cycles = [c for c in nx.strongly_connected_components(pg) if len(c) > 1]
    assert any({"bench.core", "bench.gate"} <= c for c in cycles)
    assert ("bench.core.errors", "bench.gate.verdicts") in behind[("bench.core", "bench.gate")]


def test_new_layers_are_checked():
    """The packages of the layout exist and are covered by the layer rules above."""
    mods = _modules()
    for pkg in ("bench.stats", "bench.report", "bench.spec", "bench.measure", "bench.engines.verl", "bench.execution",
                "bench.commands", "bench.core", "bench.records", "bench.planning"):
        assert pkg in mods and any(m.startswith(pkg + ".") for m in mods), pkg
    assert {"bench.stats", "bench.report", "bench.measure", "bench.records", "bench.planning"} <= set(LOWER_LAYERS)


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
    """Every subcommand is a ``Command`` subclass in its own module ``bench/commands/<name>.py``, listed in
    ``bench.commands.COMMANDS`` (scanning the package finds no subcommand the table lacks), and no module
    outside ``bench/commands/`` (but the dispatcher ``bench.cli``) defines a command's
    ``add_arguments``/``setup_arguments``."""
    from bench.commands import COMMANDS, commands

    found = commands()
    assert {"run", "tune", "gate", "report", "compare", "baseline", "sync"} <= set(found)
    assert list(found) == list(COMMANDS) and list(found)[0] == "run"
    for name, cls in found.items():
        assert cls.__module__ == f"bench.commands.{name}", (name, cls.__module__)
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



def _private_cross_package_imports(sources: dict[str, str] | None = None) -> list[str]:
    """``file:line: module imports _name from other.package`` for every ``from bench.x import _name`` (and every
    ``alias._name`` read through an imported ``bench`` module) where ``x`` is another top-level package of
    ``bench/`` than the importer's: a private name is its package's own business."""
    mods = _modules()
    if sources is None:
        sources = {name: path.read_text() for name, path in mods.items()}
    out = []
    for name, text in sources.items():
        own = name.split(".")[:2]
        tree = ast.parse(text)
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bench.") and not node.level:
                for a in node.names:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                    if a.name.startswith("_") and not a.name.startswith("__") and node.module.split(".")[:2] != own:
                        out.append(f"{name}:{node.lineno}: imports {a.name} from {node.module}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("bench.") and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")
                    and aliases[node.value.id].split(".")[:2] != own):
                out.append(f"{name}:{node.lineno}: reads {node.value.id}.{node.attr} of {aliases[node.value.id]}")
    return out


def test_no_private_name_crosses_a_package():
    """No module imports (or reads through an imported module) another package's ``_private`` name: what a
    package offers others is public and documented; within a package its modules share private helpers freely."""
    bad = _private_cross_package_imports()
    assert bad == [], "private names used across packages (make them public, with a docstring):\n" + "\n".join(bad)


def test_private_name_check_is_not_blind():
    """The check above sees both forms, and lets a package's own modules share a private name."""
    src = {"bench.gate.x": "from bench.tracking.naming import _tag\nimport bench.core.files as f\nf._tmp\n",
           "bench.gate.y": "from bench.gate.markdown import _pct\n"}
    bad = _private_cross_package_imports(src)
    assert bad == ["bench.gate.x:1: imports _tag from bench.tracking.naming",
                   "bench.gate.x:3: reads f._tmp of bench.core.files"]


def test_contributing_lists_the_packages_in_their_order():
    """CONTRIBUTING's "Where things live" names every package of ``bench/`` once, each importing only packages
    listed above it (so the table a newcomer reads is the layout the code has)."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    listed = ["bench." + m for m in re.findall(r"^\| `(\w+)` \|", text.split("**Where things live.**")[1], re.M)]
    packages = {".".join(m.split(".")[:2]) for m in _modules() if m.count(".") >= 2}
    assert sorted(listed) == sorted(packages), (listed, packages)
    pg, behind = package_graph(import_graph(typing_only=True))
    upward = [(a, b, behind[(a, b)][:1]) for a, b in pg.edges() if listed.index(b) > listed.index(a)]
    assert upward == [], upward


# -- dependencies resolved at run time (issue 47) ---------------------------------------------------------------

#: a ``"module:attribute"`` string naming a bench object (what an entry point or an importlib lookup resolves)
BY_NAME = re.compile(r"^(bench(?:\.\w+)+):(\w+)$")
#: modules allowed to resolve a ``bench`` module by name, each with why (empty this as they go); never an evidence
#: check or an operator category: those are registry entries (bench.measure.evidence.CHECKS,
#: bench.measure.op_categories.RULES)
LOADS_BY_NAME = {"bench.measure.trace_pool": "the parsers of its own package, named for the forkserver's preload "
                                             "(the worker process imports them there)",
                 "bench.commands": "its own subcommand modules, imported lazily by name (the CLI's start)",
                 "bench.execution.forkserver": "the modules its caller names for preloading (trace_pool's parsers)"}


def _loads_by_name(sources: dict[str, str]) -> list[tuple[str, int, str]]:
    """``(module, line, bench module it names)`` for each ``"bench...:attr"`` string and each
    ``importlib.import_module(...)`` / ``__import__(...)`` call in ``sources`` (module -> text) of a bench module or of
    one not given as a literal (``?``): what a module resolves by name at run time, which the import graph does not
    see."""
    out = []
    for mod, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and (m := BY_NAME.match(node.value)):
                out.append((mod, node.lineno, m.group(1)))
            elif isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if name in ("import_module", "__import__"):
                    arg = node.args[0] if node.args else None
                    lit = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else "?"
                    if lit == "?" or lit == "bench" or lit.startswith("bench."):  # a library's module is not ours
                        out.append((mod, node.lineno, lit))
    return out


def _registry_owners(sources: dict[str, str]) -> dict[str, str]:
    """Entry-point group -> the module that builds its :class:`bench.core.plugins.Registry` (the first argument of
    ``Registry(...)``: a string, or a module-level name bound to one)."""
    owners = {}
    for mod, text in sources.items():
        tree = ast.parse(text)
        consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                  and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                  for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Registry" and node.args:
                arg = node.args[0]
                group = arg.value if isinstance(arg, ast.Constant) else consts.get(getattr(arg, "id", ""))
                if isinstance(group, str):
                    owners[group] = mod
    return owners


@functools.lru_cache(maxsize=1)
def _bench_sources() -> dict[str, str]:
    """Module -> source text of every module of bench/ (read once for the run-time checks)."""
    return {m: p.read_text() for m, p in _modules().items()}


@functools.lru_cache(maxsize=1)
def _bench_loads_by_name() -> tuple[tuple[str, int, str], ...]:
    return tuple(_loads_by_name(_bench_sources()))


@functools.lru_cache(maxsize=1)
def _bench_registry_owners() -> dict[str, str]:
    return _registry_owners(_bench_sources())


def _own_entry_points() -> dict[str, dict[str, str]]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("entry-points", {})


def runtime_edges(entries: dict[str, dict[str, str]] | None = None,
                  sources: dict[str, str] | None = None) -> list[tuple[str, str, str]]:
    """``(a, b, why)``: the dependencies resolved at run time, as import edges ``a -> b`` of bench modules.

    * an entry point ``name = "module:attr"`` of a group (``entries``: group -> name -> value; default this tree's
      ``pyproject.toml``): the entry's module depends on the module owning the group's registry (it implements the
      registry's protocol and is found through it; the registry never names it), ``module -> owner``;
    * a ``"bench...:attr"`` string or an ``import_module`` call in a module (``sources``: module -> text; default
      bench/): the module depends on what it names, ``holder -> named``.
    """
    owners = _bench_registry_owners()
    out = []
    for group, table in (entries if entries is not None else _own_entry_points()).items():
        for name, value in table.items():
            target = value.partition(":")[0].strip()
            if target.startswith("bench.") and group in owners:
                out.append((target, owners[group], f"entry point {group}: {name} = {value}"))
    for mod, line, named in (_bench_loads_by_name() if sources is None else _loads_by_name(sources)):
        if named.startswith("bench."):
            out.append((mod, named, f"{mod}:{line} names {named}"))
    return out


@functools.lru_cache(maxsize=1)
def _static_package_graph() -> nx.DiGraph:
    """The package graph of the import graph (typing-only imports included), built once for the run-time checks
    (read, never changed)."""
    return package_graph(import_graph(typing_only=True))[0]


def runtime_order_violations(entries: dict[str, dict[str, str]] | None = None,
                             sources: dict[str, str] | None = None) -> list[str]:
    """The run-time edges of :func:`runtime_edges` that close a cycle with the import graph's packages (typing-only
    imports included): each one said with why it exists."""
    pg = _static_package_graph()
    out = []
    for a, b, why in runtime_edges(entries, sources):
        pa, pb = _package(a), _package(b)
        if pa != pb and pa in pg and pb in pg and nx.has_path(pg, pb, pa):
            out.append(f"{pa} -> {pb} at run time ({why}), while {pb} imports {pa}")
    return out


def test_no_evidence_check_or_category_is_loaded_by_name():
    """Evidence checks and operator categories are entries of the shared Registry (entry points), never strings
    resolved with importlib: nothing in bench/ names a bench object as ``"module:attr"`` or imports a module by
    name, but the modules of :data:`LOADS_BY_NAME`; and no optimization carries such a string."""
    from bench.spec.optimizations import registry

    bad = [f"{m}:{line}: {named}" for m, line, named in _bench_loads_by_name() if m not in LOADS_BY_NAME]
    assert bad == [], "bench objects resolved by name (make them registry entries):\n" + "\n".join(bad)

    def strings(x):
        if isinstance(x, str):
            yield x
        elif isinstance(x, dict):
            for k, v in x.items():
                yield from strings(k)
                yield from strings(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                yield from strings(v)

    named = [(k, s) for k, opt in registry().items() for s in strings(opt.model_dump()) if BY_NAME.match(s)]
    assert named == []
    assert {"grpo_bench.evidence_checks", "grpo_bench.op_categories"} <= set(_bench_registry_owners())


def test_loaded_by_name_check_is_not_blind():
    """A planted module that loads an evidence check by name, either way, is found."""
    src = {"bench.measure.planted": 'import importlib\nCHECK = "bench.engines.embedded.evidence:dynamic_bsz"\n'
                                    'mod = importlib.import_module("bench.engines.embedded.evidence")\n'}
    assert _loads_by_name(src) == [("bench.measure.planted", 2, "bench.engines.embedded.evidence"),
                                   ("bench.measure.planted", 3, "bench.engines.embedded.evidence")]


def test_run_time_dependencies_follow_the_package_order():
    """Every dependency resolved at run time (entry points of every registry, names resolved by the modules of
    :data:`LOADS_BY_NAME`) goes the way the package order allows; each registry's group has an owner here."""
    from bench.core.plugins import GROUPS

    owners = _bench_registry_owners()
    assert set(GROUPS) <= set(owners), set(GROUPS) - set(owners)
    edges = runtime_edges()
    assert any(a == "bench.engines.embedded.evidence" and b == "bench.measure.evidence" for a, b, _ in edges)
    assert any(a == "bench.measure.op_categories" and b == "bench.measure.op_categories" for a, b, _ in edges)
    assert runtime_order_violations() == []


def test_run_time_order_check_is_not_blind():
    """Planted run-time dependencies against the order are found: an evidence check registered from ``spec``
    (below ``measure``, which owns the registry and imports ``spec``), and a measure module naming an engine's
    module by string (``engines`` imports ``measure``)."""
    entries = {**_own_entry_points()}
    entries["grpo_bench.evidence_checks"] = {**entries["grpo_bench.evidence_checks"],
                                             "planted": "bench.spec.optimizations.dynamic_bsz:OPTIMIZATION"}
    bad = runtime_order_violations(entries, sources={})
    assert len(bad) == 1 and bad[0].startswith("bench.spec -> bench.measure at run time (entry point "
                                               "grpo_bench.evidence_checks: planted = ")
    planted = {"bench.measure.planted": 'CHECK = "bench.engines.embedded.evidence:dynamic_bsz"\n'}
    assert runtime_order_violations({}, planted) == [
        "bench.measure -> bench.engines at run time (bench.measure.planted:1 names bench.engines.embedded.evidence), "
        "while bench.engines imports bench.measure"]
# -- issue 47 (reader seam, engine names, library errors): separate functions, appended ------------------------

#: modules of bench/engines/ that belong to no engine: what code outside bench/engines/ may import
NEUTRAL_ENGINE_MODULES = ("bench.engines", "bench.engines.base", "bench.engines.common")
NEUTRAL_ENGINE_PACKAGES = ("bench.engines.builtins",)


def engine_own_imports(graph: nx.DiGraph) -> list[str]:
    """``a -> b`` for each import edge from a module outside ``bench.engines`` to a module of one engine
    (anything under ``bench.engines`` but the neutral base, common and builtins)."""
    def own(mod: str) -> bool:
        return (mod.startswith("bench.engines.") and mod not in NEUTRAL_ENGINE_MODULES
                and not mod.startswith(tuple(p + "." for p in NEUTRAL_ENGINE_PACKAGES))
                and mod not in NEUTRAL_ENGINE_PACKAGES)

    return sorted(f"{a} -> {b}" for a, b in graph.edges
                  if a.startswith("bench.") and not _in(a, "bench.engines") and own(b))


def test_engines_are_reached_through_the_registry_only():
    """Engine names appear only in bench/engines/: outside it, no module imports an engine's own modules (the
    smoke run asks the engine's ``smoke_cells``, the bracket probe uses the shared kernel of ``builtins``);
    typing-only imports count too. Planting one such import is caught (the check is not blind)."""
    graph = import_graph(typing_only=True)
    assert engine_own_imports(graph) == []
    graph.add_edge("bench.execution.smoke", "bench.engines.verl_cpu.smoke")
    assert engine_own_imports(graph) == ["bench.execution.smoke -> bench.engines.verl_cpu.smoke"]


_FLAG_RE = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
#: library modules whose error messages still name a command-line flag, with how many (issue 47: they move to
#: :class:`bench.core.errors.InputError` and :data:`bench.commands.base.FLAGS` one by one; a count may only fall,
#: a module not listed may have none)
FLAG_MESSAGES_LEFT = {
    "bench/execution/blocks.py": 1, "bench/execution/ray_executor.py": 4, "bench/execution/ray_parallel.py": 4,
    "bench/execution/sweep.py": 1, "bench/gate/baseline.py": 1, "bench/gate/history.py": 3,
    "bench/gate/interleaved.py": 2, "bench/gate/stored.py": 1, "bench/planning/apply.py": 1,
    "bench/tracking/__init__.py": 1, "bench/tune/settings.py": 4, "bench/tune/tuner.py": 1,
}


def flag_messages(root: Path) -> dict[str, int]:
    """Per module of ``root/bench`` outside ``bench/commands/`` and ``bench/cli.py``: how many ``raise X("...")``
    have a message (a string or the literal parts of an f-string, first argument) naming a ``--flag``."""
    out: dict[str, int] = {}
    for path in sorted((root / "bench").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("bench/commands/") or rel == "bench/cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args):
                continue
            arg = node.exc.args[0]
            parts = ([arg.value] if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else
                     [v.value for v in arg.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
                     if isinstance(arg, ast.JoinedStr) else [])
            if any(_FLAG_RE.search(t) for t in parts):
                out[rel] = out.get(rel, 0) + 1
    return out


def test_library_errors_speak_in_library_terms():
    """Error messages of library modules name the input in the library's terms (``tracking URI``, ``results
    folder``, ``run order``: an InputError), and the commands map them to flags (``bench.commands.base.FLAGS``);
    the modules not moved yet may not grow, and the tracking store has none left."""
    got = flag_messages(ROOT)
    grown = {m: n for m, n in got.items() if n > FLAG_MESSAGES_LEFT.get(m, 0)}
    assert grown == {}, f"error messages naming a --flag outside bench/commands/ (raise an InputError): {grown}"
    assert "bench/tracking/store.py" not in got and "bench/records/results.py" not in got


def test_flag_message_scan_is_not_blind(tmp_path):
    (tmp_path / "bench" / "commands").mkdir(parents=True)
    (tmp_path / "bench" / "lib.py").write_text('def f(x):\n    raise ValueError(f"--cell {x}: no such cell")\n'
                                               'def g(x):\n    raise ValueError(f"cell {x}: no such cell")\n')
    (tmp_path / "bench" / "commands" / "c.py").write_text('def f(x):\n    raise ValueError(f"--cell {x}: bad")\n')
    assert flag_messages(tmp_path) == {"bench/lib.py": 1}


def test_commands_print_an_input_error_with_its_flag():
    """The mapping itself: a library's InputError reaches the user with the flag in the input's name's place."""
    from bench.commands.base import FLAGS, cli_message
    from bench.core.errors import InputError
    from bench.tracking.store import TRACKING_URI, check_tracking_uri

    with pytest.raises(InputError) as exc:
        check_tracking_uri("bogus://x", probe=False)
    assert str(exc.value).startswith("tracking URI bogus://x: unsupported scheme")
    assert cli_message(exc.value).startswith("--tracking-uri bogus://x: unsupported scheme")
    assert FLAGS[TRACKING_URI] == "--tracking-uri"
