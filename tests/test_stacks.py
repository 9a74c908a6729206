"""Stacks (issue 43): the typed value, the ``stack`` factor, the checks before anything runs, the executor per
stack and the versions each run records."""

from __future__ import annotations

from pathlib import Path

import pytest
from _badinput import GOOD, box, check_refused  # noqa: F401 - fixtures

from bench.spec.loading import load_matrix
from bench.spec.optimizations import compact_label
from bench.spec.plan import make_plan
from bench.spec.stack import STACK_ENV, Stack

#: GOOD with two stacks (the harness's own, and one adding a variable) crossed with dynamic_bsz
TWO = GOOD.replace("factors:\n  dynamic_bsz: [off, on]\n", """\
stacks:
  a: {}
  b: {env: {BENCH_TEST_STACK_VAR: "1"}}
factors:
  stack: [a, b]
  dynamic_bsz: [off, on]
""")


def test_stack_factor_crosses_with_an_optimization_and_names_the_cell(tmp_path):
    (tmp_path / "m.yaml").write_text(TWO)
    m = load_matrix(tmp_path / "m.yaml")
    assert m.stack_levels == ["a", "b"] and m.factors["stack"] == [0, 1]
    assert m.stacks["b"] == Stack(env={"BENCH_TEST_STACK_VAR": "1"})
    plan = make_plan(m, strict=False)
    got = sorted((r.stack, r.levels["dynamic_bsz"], r.launch.env[STACK_ENV]) for r in plan.runs)
    assert got == [("a", 0, "a"), ("a", 1, "a"), ("b", 0, "b"), ("b", 1, "b")]
    assert len({r.cell_id for r in plan.runs}) == 4
    # the stack's name at every level (never its position), the reference too; MLflow's compact names likewise
    assert {r.label for r in plan.runs} == {"a", "dynamic_bsz+a", "b", "dynamic_bsz+b"}
    assert {compact_label(r.levels, r.stack) for r in plan.runs} == {"a", "dbsz+a", "b", "dbsz+b"}
    # the stack's variables are applied at launch, not in the launch (the cell id names the stack, not its settings)
    assert all("BENCH_TEST_STACK_VAR" not in r.launch.env for r in plan.runs)
    # two identical stacks (an A/A comparison) are still two cells
    (tmp_path / "aa.yaml").write_text(TWO.replace('b: {env: {BENCH_TEST_STACK_VAR: "1"}}', "b: {}"))
    aa = make_plan(load_matrix(tmp_path / "aa.yaml"), strict=False)
    assert len({r.cell_id for r in aa.runs}) == 4
    # the stack's position in the factor is the level; the first is the reference
    assert [r.stack for r in plan.runs if r.is_all_off()] == ["a"]


def test_stack_paths_expand_variables_and_accept_a_bare_string(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_TEST_TREE", str(tmp_path / "tree"))
    text = TWO.replace("b: {env", "b: {paths: '${BENCH_TEST_TREE}', env")
    (tmp_path / "m.yaml").write_text(text)
    m = load_matrix(tmp_path / "m.yaml")
    assert [p.path for p in m.stacks["b"].paths] == [str(tmp_path / "tree")]
    assert m.stacks["b"].paths[0].rev is None


@pytest.mark.parametrize("text, expected", [
    (TWO.replace("stack: [a, b]", "stack: [a, c]"), ("m.yaml", "factors.stack", "unknown stack 'c'", "a, b")),
    (TWO.replace("stack: [a, b]", "stack: [a, a]"), ("m.yaml", "factors.stack", "twice")),
    (TWO.replace('env: {BENCH_TEST_STACK_VAR: "1"}', 'env: {PYTHONPATH: "/x"}'),
     ("m.yaml", "stacks.b.env", "PYTHONPATH", "paths")),
    (TWO.replace('b: {env', 'b: {pythn: x, env'), ("m.yaml", "stacks.b.pythn", "unknown key", "python")),
])
def test_bad_stack_declarations_are_refused_at_load(box, capsys, text, expected):  # noqa: F811 - fixture
    (box / "m.yaml").write_text(text)
    check_refused(box, ["run", "m.yaml", "--dry-run"], capsys, expected)


@pytest.mark.parametrize("argv", [["run", "m.yaml", "--smoke", "--dry-run"], ["tune", "m.yaml"]])
def test_commands_that_do_not_run_stacks_yet_refuse_the_stack_factor(box, capsys, argv):  # noqa: F811 - fixture
    (box / "m.yaml").write_text(TWO)
    check_refused(box, argv, capsys, ("m.yaml", "factors.stack", "not"))


def test_a_matrix_without_stacks_keeps_its_fingerprint(tmp_path):
    (tmp_path / "m.yaml").write_text(GOOD)
    m = load_matrix(tmp_path / "m.yaml")
    assert "stacks" not in __import__("json").dumps(m.model_dump(mode="json")) or m.stacks == {}
    assert m.fingerprint() == load_matrix(Path(tmp_path / "m.yaml")).fingerprint()


def _git(repo: Path, *args: str) -> str:
    import subprocess

    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def broken_repo(tmp_path_factory):
    """A git repository (outside the working folder) whose HEAD holds a ``verl`` package that fails to import."""
    repo = tmp_path_factory.mktemp("fork")
    (repo / "verl").mkdir()
    (repo / "verl" / "__init__.py").write_text("raise ImportError('planted: this verl cannot be imported')\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "broken verl")
    return repo


def _with_b(folder: Path, stack_b: str) -> None:
    (folder / "m.yaml").write_text(TWO.replace('b: {env: {BENCH_TEST_STACK_VAR: "1"}}', f"b: {stack_b}"))


@pytest.mark.parametrize("mode", [["--dry-run"], ["--results", "res"]])
def test_bad_stacks_on_this_machine_are_refused_before_anything_runs(box, capsys, broken_repo, mode):  # noqa: F811
    import tempfile

    leftovers = lambda: sorted(Path(tempfile.gettempdir()).glob("bench-stack-*"))  # noqa: E731
    before = leftovers()
    cases = [
        ("{python: /nonexistent/venv/bin/python}", ("m.yaml", "stacks.b.python", "does not exist")),
        (f"{{paths: [{{path: '{box}', rev: HEAD}}]}}", ("m.yaml", "stacks.b.paths[0].rev", "not inside a git")),
        (f"{{paths: [{{path: '{broken_repo}', rev: no-such-rev}}]}}",
         ("m.yaml", "stacks.b.paths[0].rev", "'no-such-rev' is not a revision")),
        # the revision is checked out, the probe fails: the worktree goes with the refusal
        (f"{{paths: [{{path: '{broken_repo}', rev: HEAD}}]}}",
         ("m.yaml", "stacks.b", "cannot import verl", "planted")),
    ]
    for stack_b, expected in cases:
        _with_b(box, stack_b)
        # the last case imports the planted verl tree in a probe: bounded by a run's start-up, not a refusal's
        check_refused(box, ["run", "m.yaml", *mode], capsys, expected, cap_s=300)
    assert leftovers() == before
    assert len(_git(broken_repo, "worktree", "list").splitlines()) == 1


#: seconds the planted slowdown adds to each call of verl's GRPO advantage function (once per step)
PLANTED_S = 2.0


@pytest.mark.slow
def test_a_stack_with_a_slowed_verl_tree_is_slower_and_each_run_records_its_own_imports(tmp_path):
    """Two stacks on the embedded engine: ``a`` the harness's own, ``b`` with a copy of the installed verl first on
    the path whose GRPO advantage function sleeps :data:`PLANTED_S` per call. One sweep, 2 cells x 2 blocks (the
    fewest that give the report's interval; a sleep, not CPU work, so the load of the machine cannot hide it)."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    from importlib.util import find_spec

    verl_dir = Path(find_spec("verl").origin).parent
    tree = tmp_path / "tree"
    shutil.copytree(verl_dir, tree / "verl", ignore=shutil.ignore_patterns("__pycache__"))
    algos = tree / "verl" / "trainer" / "ppo" / "core_algos.py"
    algos.write_text(algos.read_text() + f"""

import time as _bench_time
_bench_grpo = compute_grpo_outcome_advantage


def compute_grpo_outcome_advantage(*args, **kwargs):  # planted by tests/test_stacks.py
    _bench_time.sleep({PLANTED_S})
    return _bench_grpo(*args, **kwargs)
""")
    text = GOOD.replace("factors:\n  dynamic_bsz: [off, on]\n", f"""\
stacks:
  a: {{}}
  b: {{paths: ['{tree}']}}
factors:
  stack: [a, b]
repeats: 2
""")
    (tmp_path / "m.yaml").write_text(text)
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("MLFLOW_TRACKING_URI", None)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def bench(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(root / "run_bench.py"), *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=1200)

    dry = bench("run", "m.yaml", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count(f"path {tree}") == 1 and "stacks (" in dry.stdout
    res = bench("run", "m.yaml", "--results", "res", "--tracking-uri", uri)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    sweep = (tmp_path / "res" / "t" / "latest").resolve()
    recs = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/r*/record.json"))]
    assert len(recs) == 4 and all(r["status"] == "ok" for r in recs)
    for rec in recs:
        name = rec["stack"]["name"]
        verl = rec["run_versions"]["packages"]["verl"]
        assert verl["imported"] and verl["version"] and rec["run_versions"]["python"] == rec["stack"]["python"]
        assert rec["run_versions"]["packages"]["torch"]["imported"]
        assert verl["file"].startswith(str(tree)) == (name == "b"), (name, verl["file"])
        assert rec["stack"]["paths"] == ([str(tree)] if name == "b" else [])
    summary = (sweep / "summary.md").read_text()
    assert "| stack | versions (each run's own) |" in summary and "verl " in summary
    report = bench("report", str(sweep))
    assert report.returncode == 0, report.stderr
    data = json.loads((sweep / "report" / "report.json").read_text())
    fit = data["effects"]["fit"]
    terms = {t["name"]: t for t in fit["terms"]}
    # every place a user reads a stack level shows its name: the cells, the stack column, the effect row
    assert sorted(c["cell"] for c in data["cells"]) == ["a", "b"] and data["effects"]["stack_levels"] == ["a", "b"]
    assert terms["stack"]["label"] == "stack (b vs a)" and "0 = a, 1 = b" in fit["coding"]["stack"]
    # a stack is not an optimization: the article's end-to-end row compares none here (it kept "all-on" = stack b)
    e2e = data["article"][0]
    assert e2e["ours_cell"] is None and "no optimization varies" in e2e["note"] and "stack a" in e2e["note"], e2e
    md = (sweep / "report" / "report.md").read_text()
    assert "| a | a |" in md and "| b | b |" in md and "| stack (b vs a) |" in md, md
    # b (level 1) against a: log step time, +2 s on a step of 1-5 s. With 2 blocks the interval has 1 residual
    # degree of freedom (t = 12.7): present, but too wide to exclude 0 under load; the point estimate must show b slower
    stack = terms["stack"]
    assert stack["ci_low"] is not None and stack["ci_low"] < stack["effect"] < stack["ci_high"], stack
    assert stack["effect"] > 0, stack
    median = {n: [r["summary"]["step_time_median_s"] for r in recs if r["stack"]["name"] == n] for n in "ab"}
    assert min(median["b"]) > PLANTED_S and sum(median["b"]) > sum(median["a"]), median
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("t")
    kids = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("bench.kind") == "cell"]
    assert sorted(r.data.params["factor.stack"] for r in kids) == ["a", "a", "b", "b"]
    assert sorted(r.info.run_name for r in kids) == ["a r0", "a r1", "b r0", "b r1"]
    assert all(r.data.tags.get("run_version.verl") for r in kids)
    from_tree = sorted(r.data.tags["run_version.verl.file"].startswith(str(tree)) for r in kids)
    assert from_tree == [False, False, True, True]


def test_a_run_started_with_python_m_records_its_imports_at_exit(tmp_path):
    """The verl engine's runs (fresh ``python -m`` processes with ``patches/`` first on the path) write their own
    versions through ``sitecustomize`` when they exit; a script-started process (a Ray worker) writes none."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "patches"), str(root)]),
           "BENCH_RUN_DIR": str(tmp_path)}
    script = tmp_path / "worker.py"
    script.write_text("import json\n")
    subprocess.run([sys.executable, str(script)], env=env, check=True, cwd=tmp_path)
    assert not (tmp_path / "versions.json").exists()
    subprocess.run([sys.executable, "-m", "bench.spec.stack"], env=env, check=True, cwd=tmp_path)
    got = json.loads((tmp_path / "versions.json").read_text())
    assert got["python"] == sys.executable
    torch = got["packages"]["torch"]  # installed here, not imported by that process
    assert torch["imported"] is False and torch["dist"] and torch["file"] is None

    # a `python -m` process the main process starts (verl's vLLM engine is one) writes nothing, even when it ends
    # first: only the run's main process records what the run imported
    (tmp_path / "versions.json").unlink()
    (tmp_path / "bench_child_mod.py").write_text("import json\n")
    (tmp_path / "bench_main_mod.py").write_text(
        "import os, subprocess, sys\n"
        "subprocess.run([sys.executable, '-m', 'bench_child_mod'], check=True)\n"
        "print('after child', os.path.exists(os.path.join(os.environ['BENCH_RUN_DIR'], 'versions.json')))\n")
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)
    out = subprocess.run([sys.executable, "-m", "bench_main_mod"], env=env, check=True, cwd=tmp_path,
                         capture_output=True, text=True).stdout
    assert out.strip() == "after child False" and (tmp_path / "versions.json").is_file()


def test_a_stack_level_reads_as_its_name_in_every_label():
    from bench.report.tables import _stack_term_label
    from bench.spec.stack import level_text, stack_names_of

    cells = [{"levels": {"stack": 2, "dynamic_bsz": 0}, "stack": "c"}, {"levels": {"stack": 0}, "stack": "a"},
             {"levels": {"stack": 1}, "stack": "b"}, {"levels": {"dynamic_bsz": 1}}]
    names = stack_names_of(cells)
    assert names == ["a", "b", "c"] and stack_names_of([{"levels": {"dynamic_bsz": 1}}]) == []
    assert [level_text("stack", i, names) for i in (0, 2, None)] == ["a", "c", "n/a"]
    assert level_text("dynamic_bsz", 1, names) == "1"
    assert _stack_term_label("stack", ["a", "b"]) == "stack (b vs a)"
    assert _stack_term_label("dynamic_bsz:stack", ["a", "b"]) == "dynamic_bsz:stack (b vs a)"
    assert _stack_term_label("stack=2", names) == "stack=c (vs a)"


def test_the_stack_executor_waits_for_every_stacks_server_before_the_first_run(tmp_path):
    """Two real fork servers (each preloading only ``json``: cheap): the first run (stack ``a``) starts only when
    ``b``'s server has imported too, so no first-block run shares the CPUs with another stack's imports; the run is
    forked from ``a``'s server and leaves ``b``'s server running and idle."""
    import json
    import sys

    from bench.execution.executors import ResolvedLaunch
    from bench.execution.forkserver import ForkServerExecutor
    from bench.execution.stacks import OpenStack, StackExecutor

    stacks = {n: OpenStack(name=n, python=sys.executable, paths=[], env={}) for n in ("a", "b")}
    ex = StackExecutor(lambda st: ForkServerExecutor(preload=("json",), python=st.python), stacks)
    try:
        assert not any(e.ready for e in ex.executors.values())
        run = tmp_path / "r0"
        run.mkdir()
        res = ex.execute(ResolvedLaunch([sys.executable, "-m", "platform"], {STACK_ENV: "a"}, run, 60.0))
        assert res.returncode == 0, (run / "run.log").read_text()
        assert ex.executors["b"].ready and ex.executors["b"].proc.poll() is None
        assert json.loads((run / "launcher.json").read_text())["server_pid"] == ex.executors["a"].proc.pid
        assert (run / "run.log").read_text().strip()  # platform printed its line
    finally:
        ex.close()
    assert all(e.proc is None for e in ex.executors.values())
#: the shipped matrix of two verl releases, each in its own venv, crossed with dynamic_bsz (docs/stacks.md)
VERL_STACKS = Path(__file__).resolve().parent.parent / "matrix" / "verl_cpu_stacks.yaml"
#: the variables naming its two interpreters
VERL_STACK_VARS = ("BENCH_VERL_090_PYTHON", "BENCH_VERL_091_PYTHON")


def test_the_shipped_verl_stacks_matrix_plans_two_venvs_crossed_with_dynamic_bsz(monkeypatch):
    """The verl engine builds the cells of a ``stack`` factor (it once looked the stack up as an optimization);
    each venv comes from its variable, the launches leave the interpreter to the stack (``{verl_python}``)."""
    for i, var in enumerate(VERL_STACK_VARS):
        monkeypatch.setenv(var, f"/venvs/v{i}/bin/python")
    m = load_matrix(VERL_STACKS)
    assert m.engine == "verl" and m.stack_levels == ["verl-0.9.0", "verl-0.9.1"] and m.repeats == 2
    assert [m.stacks[n].python for n in m.stack_levels] == ["/venvs/v0/bin/python", "/venvs/v1/bin/python"]
    plan = make_plan(m, "cpu", strict=False)
    got = sorted((r.stack, r.levels["dynamic_bsz"]) for r in plan.runs)
    assert got == [("verl-0.9.0", 0), ("verl-0.9.0", 1), ("verl-0.9.1", 0), ("verl-0.9.1", 1)]
    assert len({r.cell_id for r in plan.runs}) == 4
    assert all(r.launch.argv[0] == "{verl_python}" and "/venvs/" not in " ".join(r.launch.argv) for r in plan.runs)
    dyn = {r.levels["dynamic_bsz"]: "actor_rollout_ref.actor.use_dynamic_bsz=true" in r.launch.argv for r in plan.runs}
    assert dyn == {0: False, 1: True}
    assert {r.label for r in plan.runs} == {"verl-0.9.0", "verl-0.9.1", "dynamic_bsz+verl-0.9.0",
                                            "dynamic_bsz+verl-0.9.1"}


def test_the_shipped_verl_stacks_matrix_without_its_variables_is_refused(box, capsys, monkeypatch):  # noqa: F811
    for var in VERL_STACK_VARS:
        monkeypatch.delenv(var, raising=False)
    check_refused(box, ["run", str(VERL_STACKS), "--dry-run"], capsys,
                  ("verl_cpu_stacks.yaml", "stacks.verl-0.9.0.python", "BENCH_VERL_090_PYTHON"))


def test_the_import_probe_applies_its_engines_runtime_patches(tmp_path):
    """The probe imports as a run does: ``patches/`` first on the path and ``BENCH_PATCHES`` set (the verl CPU stack
    cannot import verl's trainer without the ``verl_cpu`` patch's torchvision workaround); here a patch name that
    does not exist, whose refusal only ``patches/sitecustomize.py`` prints."""
    import sys

    from bench.engines.base import capability
    from bench.execution.stacks import OpenStack, probe, probe_result

    assert capability("verl", "stack_probe_patches")("cpu") == ("verl_cpu",)
    assert capability("embedded", "stack_probe_patches")("cpu") == ()
    stack = OpenStack(name="a", python=sys.executable, paths=[], env={})
    proc = probe(stack, ("json",), ("bench_no_such_patch",))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "unknown patch 'bench_no_such_patch'" in err
    assert probe_result("m.yaml", "a", probe(stack, ("json",)))["python"] == sys.executable
