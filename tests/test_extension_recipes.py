"""The four recipes of CONTRIBUTING.md applied literally, and the same four extensions as a plugin package.

Recipes: a copy of the repository gets, for each recipe, its one new file (the files of the toy plugin,
``tests/plugin_pkg/grpo_bench_toy/``, copied where the recipe says) and its one line under the recipe's
entry-point group in ``pyproject.toml``; then, on that copy, through the CLI: two sweeps of the toy engine
(the toy reader's Free ratio, the toy optimization's evidence), a report (the article figure beside ours, the
toy format's operators in "where it acts"), a
gate with the toy statistical test; every test that enumerates a registry and the layout tests, run from a
virtual environment inside the copy; and a new embedded config field at its default plus the new optimization
leave every shipped matrix's launches and cell ids as pinned (the copy's own ``tests/test_launch_pins.py``).
The copy is a git checkout of its own and each recipe's ``git add`` is run as the recipe says.

Plugin: ``tests/plugin_pkg`` installed with pip into a temporary folder (``--target``), found through its
entry points by the unchanged ``python run_bench.py`` of this checkout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
from _repo_copy import copy_tracked, tracked_files

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "tests" / "plugin_pkg"
PINS = ROOT / "tests" / "fixtures" / "launch_pins.json"
MATRIX = """name: toy
engine: toy
platform: cpu
base:
  steps: 5
  warmup_steps: 1
  profile_steps: [5]
  toy: {work: 1}
factors:
  toy_opt: [0, 1]
repeats: 2
"""
#: (file of the toy plugin, where its recipe puts it, the recipe's entry-point group, the registration line)
RECIPES = [
    ("engine.py", "bench/engines/toy.py", "grpo_bench.engines", 'toy = "bench.engines.toy:ToyEngine"'),
    ("reader.py", "bench/measure/toytrace.py", "grpo_bench.readers",
     'toytrace = "bench.measure.toytrace:ToyTraceReader"'),
    ("optimization.py", "bench/spec/optimizations/toy_opt.py", "grpo_bench.optimizations",
     'toy_opt = "bench.spec.optimizations.toy_opt:OPTIMIZATION"'),
    ("evidence.py", "bench/engines/toy_evidence.py", "grpo_bench.evidence_checks",
     '"toy_opt@toy" = "bench.engines.toy_evidence:TOY_OPT"'),
    ("welch.py", "bench/stats/toy_welch.py", "grpo_bench.stat_tests",
     'toy_welch = "bench.stats.toy_welch:ToyWelchTest"'),
]
NEW_CONFIG_FIELD = "    toy_field: int = 0  # a new run-config field (recipe test)\n"


def add_entry_point(pyproject: str, group: str, line: str) -> str:
    """``pyproject`` with ``line`` appended to the table ``[project.entry-points."<group>"]`` (as a person adds it)."""
    head = f'[project.entry-points."{group}"]\n'
    start = pyproject.index(head) + len(head)
    end = pyproject.find("\n\n", start)
    end = len(pyproject) if end < 0 else end
    return pyproject[:end] + "\n" + line + pyproject[end:]


def git(cwd: Path, *args: str) -> None:
    """``git ARGS`` in ``cwd`` (a fixed identity, so a commit needs no user configuration)."""
    subprocess.run(["git", "-c", "user.name=recipe", "-c", "user.email=recipe@localhost", *args], cwd=cwd,
                   check=True, capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A copy of the repository, a git checkout of its own, with the four recipes applied literally (the new file,
    its entry-point line, ``git add`` of the file) and one new embedded config field."""
    dest = tmp_path_factory.mktemp("repo")
    copy_tracked(ROOT, dest)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "copy")
    pyproject = (dest / "pyproject.toml").read_text()
    for src, target, group, line in RECIPES:
        shutil.copy2(PLUGIN / "grpo_bench_toy" / src, dest / target)
        pyproject = add_entry_point(pyproject, group, line)
        git(dest, "add", target)  # as the recipe says: a copy of the checkout sees tracked files only
    (dest / "pyproject.toml").write_text(pyproject)
    assert set(t for _, t, _, _ in RECIPES) <= set(tracked_files(dest))
    config = dest / "bench" / "engines" / "embedded" / "config.py"
    text = config.read_text()
    anchor = "    seed: int = Field(0, ge=0, le=2**32 - 1, strict=True)\n"
    assert anchor in text
    config.write_text(text.replace(anchor, anchor + NEW_CONFIG_FIELD))
    return dest


def bench(*args: str, cwd: Path, pythonpath: list[Path]) -> subprocess.CompletedProcess:
    """``python run_bench.py ARGS`` of the checkout ``pythonpath[0]``, run in ``cwd``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, pythonpath))}
    return subprocess.run([sys.executable, str(pythonpath[0] / "run_bench.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def sweep_report_gate(work: Path, pythonpath: list[Path]) -> None:
    """Two toy sweeps, a report and a gate with the toy test, through the CLI; asserts what each extension adds."""
    (work / "toy.yaml").write_text(MATRIX)
    common = ["--results", str(work / "results"), "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}"]

    def run(*args: str) -> subprocess.CompletedProcess:
        return bench(*args, cwd=work, pythonpath=pythonpath)

    dry = run("run", "toy.yaml", "--dry-run", "--verbose", "--order-seed", "1", *common)
    assert dry.returncode == 0, dry.stderr
    assert "toy_opt=1" in dry.stdout and "run_config.yaml" in dry.stdout  # shows_config: the toy's config
    assert '"work": 1' in dry.stdout or "work: 1" in dry.stdout  # the engine's own sub-block of base
    (work / "bad.yaml").write_text(MATRIX.replace("{work: 1}", "{wrk: 1}"))
    bad_options = run("run", "bad.yaml", "--dry-run", *common)
    assert bad_options.returncode == 2
    assert bad_options.stderr.strip().endswith("base.toy: unknown key 'wrk' (allowed: work)"), bad_options.stderr

    first = run("run", "toy.yaml", *common)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    sweep_a = (work / "results" / "toy" / "latest").resolve()
    records = [json.loads(p.read_text()) for p in sweep_a.rglob("record.json")]
    assert len(records) == 4 and all(r["status"] == "ok" for r in records)
    for rec in records:  # the toy format's Free ratio, the toy optimization's evidence from the registry
        assert rec["free_ratio"] == {"5": 0.25 if rec["levels"]["toy_opt"] else 0.4}
        assert rec["evidence_verdicts"] == {"toy_opt": "confirmed"}
        assert rec["summary"]["free_ratio_median"] == (0.25 if rec["levels"]["toy_opt"] else 0.4)

    rep = run("report", str(sweep_a), *common)
    assert rep.returncode == 0, rep.stderr[-2000:]
    md = next(sweep_a.rglob("report.md")).read_text()
    row = next(line for line in md.splitlines() if line.startswith("| Toy optimization (9.9)"))
    assert row.split(" | ")[1] == "+50.0%"  # the article figure of the registry entry, beside ours
    # the toy format's operators (its reader's step_ops) in "where it acts": every run's, by category and op
    where = md[md.index("## Where each optimization acts"):]
    assert "Runs with a trace: 4." in where, where[:2000]
    assert "| matmul |" in where and "| copy |" in where, where[:2000]
    assert "Trace diff `toy_opt=1`" in where and "| `toy_matmul` |" in where, where[:2000]

    second = run("run", "toy.yaml", "--force", *common)
    assert second.returncode == 0, second.stderr[-2000:]
    sweep_b = (work / "results" / "toy" / "latest").resolve()
    assert sweep_b != sweep_a
    out = work / "gate-out"
    gate = run("gate", "--baseline", str(sweep_a), "--candidate", str(sweep_b), "--test", "toy welch",
               "--bootstrap", "200", "--out", str(out), *common)
    assert gate.returncode in (0, 1, 3), gate.stdout[-2000:] + gate.stderr[-2000:]
    result = json.loads(next(p for p in sorted(out.rglob("*.json"))).read_text())
    assert result["settings"]["test"] == "toy welch t (two-sided)"
    assert {r["test"] for r in result["rows"] if r.get("test")} == {"toy welch"}

    bad = run("gate", "--baseline", str(sweep_a), "--candidate", str(sweep_b), "--test", "no such test", *common)
    assert bad.returncode == 2 and "--test no such test: unknown test (allowed: mann-whitney u" in bad.stderr
    assert "toy welch" in bad.stderr


def test_recipes_applied_literally_run_through_the_cli(repo, tmp_path):
    sweep_report_gate(tmp_path, [repo])


def inner_venv(venv: Path) -> Path:
    """A virtual environment at ``venv`` (``python -m venv``, as a user makes one) that sees the packages of the
    environment running this test, whatever it is; returns its python.

    ``--system-site-packages`` would not do: a venv made from a venv's python exposes the *base* interpreter's
    site-packages, which on a fresh machine hold none of the project's packages. Instead a ``.pth`` file in the
    new venv's site-packages adds each site folder of this process (:func:`site.getsitepackages`, and the user
    site when this process uses it) with :func:`site.addsitedir`, so their own ``.pth`` files (editable
    installs) count too; the new venv's own site-packages stay first.

    Raises:
        subprocess.CalledProcessError: ``venv`` could not be created.
    """
    if not venv.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    own = subprocess.run([str(py), "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                         capture_output=True, text=True, timeout=120).stdout.strip()
    outer = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        outer.append(site.getusersitepackages())
    lines = [f"import site; site.addsitedir({d!r})" for d in outer if os.path.isdir(d)]
    (Path(own) / "_outer_environment.pth").write_text("\n".join(lines) + "\n")
    return py


def test_registry_enumerating_tests_and_the_layout_hold_on_the_copy(repo):
    """On the copy, from a virtual environment created inside it (:func:`inner_venv`, seeing this environment's
    packages): every test that enumerates a registry (marked ``registry`` by tests/conftest.py) and the layout
    tests pass with the four extensions registered, and the venv is neither collected nor copied by a test."""
    venv = repo / ".venv"
    py = inner_venv(venv)
    env = {**os.environ, "PYTHONPATH": str(repo)}
    where = subprocess.run([str(py), "-c", "import bench, sys; print(bench.__file__); print(sys.prefix)"],
                           cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert where.stdout.split() == [str(repo / "bench" / "__init__.py"), str(venv)], where.stdout + where.stderr
    proc = subprocess.run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "registry or layout",
                           "--ignore", "tests/test_extension_recipes.py", "tests"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
    assert int(summary.split(" passed")[0].split()[-1]) >= 40, summary  # the registry tests and the layout tests


def test_launch_pins_survive_a_new_optimization_and_config_field(repo, tmp_path):
    """With ``toy_opt`` registered (it applies to the embedded engine: an env var at each level) and a new
    embedded run-config field at its default, the copy's own ``tests/test_launch_pins.py`` passes: every shipped
    matrix keeps its argv, env, patches, run config and cell ids, since no shipped matrix lists ``toy_opt``."""
    listed = tmp_path / "listed.yaml"  # the additions reach a launch where a matrix lists them: not a blind test
    listed.write_text((repo / "matrix" / "smoke.yaml").read_text().replace(
        "  dynamic_bsz: [off, on]\n", "  dynamic_bsz: [off, on]\n  toy_opt: [0, 1]\n"))
    proc = bench("run", str(listed), "--dry-run", "--json", "--order-seed", "0", cwd=tmp_path, pythonpath=[repo])
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = json.loads(proc.stdout)["runs"]
    assert sorted(r["launch"]["env"]["TOY_OPT"] for r in runs) == ["0", "0", "1", "1"]
    assert all(r["launch"]["config"]["toy_field"] == 0 for r in runs)
    pins = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_launch_pins.py"],
                          cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}, capture_output=True, text=True,
                          timeout=1200)
    assert pins.returncode == 0, pins.stdout[-4000:]
    summary = pins.stdout.strip().splitlines()[-1]
    counts = {w: int(n) for n, w in re.findall(r"(\d+) (passed|skipped|failed|error)", summary)}
    # one test per shipped matrix and one more; a stack matrix whose interpreters the copy lacks is skipped there
    n_tests = len(list((repo / "matrix").glob("*.yaml"))) + 1
    assert counts.get("passed", 0) + counts.get("skipped", 0) == n_tests, summary
    assert counts.get("skipped", 0) <= 1 and "failed" not in counts and "error" not in counts, summary


def test_plugin_package_works_with_the_unchanged_cli(tmp_path):
    site, src = tmp_path / "site", tmp_path / "plugin_pkg"
    shutil.copytree(PLUGIN, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--no-index", "--target", str(site), str(src)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert pip.returncode == 0, pip.stderr[-2000:]
    assert next(site.glob("grpo_bench_toy-*.dist-info"))
    sweep_report_gate(tmp_path, [ROOT, site])


def test_unknown_engine_is_one_line_naming_the_allowed_ones(tmp_path):
    from bench.engines import engine_names

    names = engine_names()
    allowed = " or ".join(repr(n) for n in names) if len(names) <= 2 else \
        ", ".join(repr(n) for n in names[:-1]) + f" or {names[-1]!r}"
    (tmp_path / "m.yaml").write_text(MATRIX.replace("engine: toy", "engine: sglang"))
    proc = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), "m.yaml", "--dry-run"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith(f"m.yaml:2: engine: allowed: {allowed}, got 'sglang'")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_registering_after_import_is_seen_everywhere():
    """Registries are read through functions: an optimization, reader, test and engine registered after the
    planner, the measuring code and the gate were imported are seen by them; unregistering removes them."""
    sys.path.insert(0, str(PLUGIN))
    try:
        from grpo_bench_toy.engine import ToyEngine
        from grpo_bench_toy.optimization import OPTIMIZATION
        from grpo_bench_toy.reader import ToyTraceReader
        from grpo_bench_toy.welch import ToyWelchTest
    finally:
        sys.path.remove(str(PLUGIN))
    from bench.engines import engine_names, register, unregister
    from bench.measure import READERS, readers
    from bench.spec import optimizations
    from bench.spec.loading import load_matrix
    from bench.spec.optimizations import FACTOR_KEYS, factor_keys
    from bench.spec.plan import make_plan
    from bench.stats import stat_tests as stats

    before = (engine_names(), [r.name for r in readers()], factor_keys(), list(stats.tests()))
    optimizations.register_optimization(OPTIMIZATION)
    stats.register_test(ToyWelchTest())
    from bench.measure.formats import register_reader, unregister_reader

    register_reader(ToyTraceReader())
    register(ToyEngine)
    try:
        assert engine_names()[: len(before[0])] == before[0] and engine_names()[-1] == "toy"
        assert [r.name for r in READERS][-1] == "toytrace"
        assert FACTOR_KEYS[-1] == "toy_opt" and "toy_opt" in FACTOR_KEYS  # the live view, imported before
        assert ("toy_opt", 1) == optimizations.article_factors()[0]  # largest article gain first
        assert stats.compare([[1.0, 1.1, 1.2]], [[2.0, 2.1, 2.2]], test="toy welch").test == "toy welch"
        plan = make_plan(load_matrix(ROOT / "matrix" / "smoke.yaml"), "cpu", strict=False)
        assert all(r.levels["toy_opt"] == 0 for r in plan.runs)
    finally:
        unregister("toy")
        unregister_reader("toytrace")
        optimizations.unregister_optimization("toy_opt")
        stats.unregister_test("toy welch")
    assert (engine_names(), [r.name for r in readers()], factor_keys(), list(stats.tests())) == before
