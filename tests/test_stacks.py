"""Stacks (issue 43): the typed value, the ``stack`` factor, the checks before anything runs, the executor per
stack and the versions each run records."""

from __future__ import annotations

from pathlib import Path

import pytest
from _badinput import GOOD, box, check_refused  # noqa: F401 - fixtures

from bench.spec.loading import load_matrix
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
    assert {r.label for r in plan.runs} == {"all-off", "dynamic_bsz", "b", "dynamic_bsz+b"}
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
        check_refused(box, ["run", "m.yaml", *mode], capsys, expected)
    assert leftovers() == before
    assert len(_git(broken_repo, "worktree", "list").splitlines()) == 1
