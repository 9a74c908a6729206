"""The gate between two stacks (issue 43): ``gate --stacks BASE CAND --matrix M`` runs the interleaved gate with
this checkout on both sides, each side's runs in its own stack (one fork server per stack), and judges it with the
interleaved gate's own decision. Bad input: one line, exit 2, nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _badinput import GOOD, box, check_refused  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[2]

#: GOOD (one cell: dynamic_bsz on) with two identical stacks declared under two names (an A/A check)
AA = GOOD.replace("factors:\n  dynamic_bsz: [off, on]\n", """\
stacks:
  a: {}
  b: {}
factors:
  dynamic_bsz: [on]
""")


@pytest.mark.parametrize("argv, expected", [
    (["--stacks", "a", "c"], ("--stacks c", "not a stack", "m.yaml", "a, b")),
    (["--stacks", "a", "a"], ("--stacks a a", "same stack", "two names")),
    (["--stacks", "a", "b", "--interleave", "HEAD"], ("--interleave HEAD --stacks a b", "one of them")),
    (["--stacks", "a", "b", "--side-by-side"], ("--side-by-side", "not with --stacks")),
    (["--stacks", "a", "b", "--metric", "throughput"], ("--metric throughput", "only step_time")),
])
def test_bad_stack_gates_are_refused_before_anything_runs(box, capsys, argv, expected):  # noqa: F811 - fixture
    (box / "m.yaml").write_text(AA)
    check_refused(box, ["gate", "--matrix", "m.yaml", "--results", "res", *argv], capsys, expected)


def test_a_stack_gate_needs_a_matrix_without_the_stack_factor_and_interleave_refuses_one(box, capsys):  # noqa: F811
    (box / "m.yaml").write_text(AA.replace("  dynamic_bsz: [on]\n", "  dynamic_bsz: [on]\n  stack: [a, b]\n"))
    check_refused(box, ["gate", "--matrix", "m.yaml", "--results", "res", "--stacks", "a", "b"], capsys,
                  ("m.yaml", "factors.stack", "allowed"))
    check_refused(box, ["gate", "--matrix", "m.yaml", "--results", "res", "--interleave", "HEAD"], capsys,
                  ("m.yaml", "factors.stack", "gate --stacks"))


def test_a_stack_gate_checks_its_stacks_on_this_machine_first(box, capsys):  # noqa: F811 - fixture
    check_refused(box, ["gate", "--results", "res", "--stacks", "a", "b"], capsys, ("gate --stacks", "--matrix"))
    (box / "m.yaml").write_text(AA.replace("b: {}", "b: {python: /nonexistent/venv/bin/python}"))
    check_refused(box, ["gate", "--matrix", "m.yaml", "--results", "res", "--stacks", "a", "b"], capsys,
                  ("m.yaml", "stacks.b.python", "does not exist"))


def _tree_repo(root: Path) -> list[str]:
    """A git repository of two commits (a source tree a stack names); returns their shas, oldest first."""
    root.mkdir()
    for i in range(2):
        (root / "mod.py").write_text(f"X = {i}\n")
        for args in (["init", "-q"] if i == 0 else []), ["add", "-A"], ["commit", "-qm", f"c{i}"]:
            if args:
                subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                               env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost",
                                    "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@localhost"})
    out = subprocess.run(["git", "-C", str(root), "rev-list", "--reverse", "HEAD"], capture_output=True, text=True)
    return out.stdout.split()


def _fork_matrix(folder: Path) -> str:
    (folder / "plain").mkdir()
    return AA.replace("  a: {}\n  b: {}\n", f"  a: {{}}\n  fork: {{paths: ['{folder / 'fork'}'], env: {{X: '1'}}}}\n"
                      f"  flat: {{paths: ['{folder / 'plain'}']}}\n")


@pytest.mark.parametrize("sides, expected", [
    (["fork@nosuch", "fork"], ("--stacks fork@nosuch", "'nosuch' is not a revision", "allowed")),
    (["@HEAD", "fork"], ("--stacks @HEAD", "NAME@REV")),
    (["fork@", "fork"], ("--stacks fork@", "NAME@REV")),
    (["nope@HEAD", "fork"], ("--stacks nope", "not a stack", "a, fork, flat")),
    (["flat@HEAD", "flat"], ("--stacks flat", "none of its paths is inside a git repository")),
])
def test_a_side_at_a_revision_of_a_stacks_tree_is_checked_first(box, capsys, sides, expected):  # noqa: F811
    _tree_repo(box / "fork")
    (box / "m.yaml").write_text(_fork_matrix(box))
    check_refused(box, ["gate", "--matrix", "m.yaml", "--results", "res", "--stacks", *sides], capsys, expected)


def test_a_side_at_a_revision_is_the_stack_with_that_tree_checked_out(tmp_path):
    """``fork@REV``: the stack ``fork`` with its tree at the commit REV names (a stack of its own, ``fork-<sha>``,
    its variables and interpreter kept); a plain name stays; the same revision twice is one stack."""
    from bench.gate.stacks import pin_stack_sides
    from bench.spec.loading import load_matrix

    c0, c1 = _tree_repo(tmp_path / "fork")
    (tmp_path / "m.yaml").write_text(_fork_matrix(tmp_path))
    m = load_matrix(tmp_path / "m.yaml")
    assert pin_stack_sides(m, ["fork@HEAD~1", "fork"]) == (f"fork-{c0[:10]}", "fork")
    pinned = m.stacks[f"fork-{c0[:10]}"]
    assert [(p.path, p.rev) for p in pinned.paths] == [(str(tmp_path / "fork"), c0)] and pinned.env == {"X": "1"}
    assert pin_stack_sides(m, ["fork@HEAD~1", f"fork@{c1}"]) == (f"fork-{c0[:10]}", f"fork-{c1[:10]}")
    assert pin_stack_sides(m, ["a", "fork"]) == ("a", "fork")


@pytest.mark.slow
def test_an_a_a_gate_between_two_identical_stacks_never_says_regression(tmp_path):
    """Two identical stacks, one fork server each, 2 blocks of the one cell (the cheapest gate the interleaved
    gate's tests run): the verdict is pass or cannot judge, never regression; each run executed in its side's stack
    (its record names it, its launcher its server), and the gate's files name both stacks."""
    (tmp_path / "m.yaml").write_text(AA.replace("  max_response_length: 24\n", "  max_response_length: 24\n"
                                                "  profile_steps: []\n  env: {OMP_NUM_THREADS: '1'}\n"))
    results, ml = tmp_path / "results", f"sqlite:///{tmp_path / 'ml.db'}"
    cmd = [sys.executable, "run_bench.py", "gate", "--results", str(results), "--tracking-uri", ml,
           "--stacks", "a", "b", "--matrix", str(tmp_path / "m.yaml"), "--blocks", "2", "--order-seed", "1"]
    res = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode in (0, 3), res.stdout + res.stderr  # pass or cannot judge, never regression (1)
    assert "gate: regression" not in res.stdout
    (sweep,) = [p for p in (results / "t").iterdir() if p.name[0].isdigit()]
    recs = [json.loads(p.read_text()) for p in sweep.glob("*/r*/record.json")]
    assert sorted((r["repeat"], r["code_version"], r["stack"]["name"]) for r in recs) == [
        (0, "baseline", "a"), (0, "candidate", "b"), (1, "baseline", "a"), (1, "candidate", "b")]
    assert all(r["status"] == "ok" for r in recs)
    servers: dict[str, set[int]] = {}
    for r in recs:
        rdir = sweep / r["cell_id"] / (f"r{r['repeat']}" + ("-baseline" if r["code_version"] == "baseline" else ""))
        launcher = json.loads((rdir / "launcher.json").read_text())
        assert launcher["launcher"] == "forkserver"
        servers.setdefault(r["stack"]["name"], set()).add(launcher["server_pid"])
    assert len(servers["a"]) == 1 and len(servers["b"]) == 1 and servers["a"] != servers["b"], servers
    meta = json.loads((sweep / "sweep.json").read_text())
    assert set(meta["stacks"]) == {"a", "b"}
    assert meta["code_versions"]["baseline"]["ref"] == "stack a"
    gate = json.loads((sweep / "gate" / "gate.json").read_text())
    assert gate["verdict"] in ("pass", "cannot judge")
    assert gate["baseline"]["kind"] == "stack" and gate["baseline"]["ref"] == "stack a"
    assert gate["candidate"]["ref"] == "stack b" and "python" in gate["candidate"]["stack"]
    md = (sweep / "gate" / "gate.md").read_text()
    assert "baseline `stack a`" in md and "vs candidate `stack b`" in md, md
    (row,) = gate["rows"]
    assert row["blocks"] == 2
