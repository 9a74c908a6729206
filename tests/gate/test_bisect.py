"""``run_bench.py bisect`` (:mod:`bench.gate.bisect`): its search rule, its bad input through the CLI, and one real
bisection of a small git repository holding this harness, interrupted after its first probe and resumed.

The search rule is checked exhaustively on every first-slower position of small ranges (the probe count never
exceeds the ``k`` the alpha was split over, the commit named is the planted one, a probe that cannot judge stops
it with the range that still holds the answer). The real bisection: commits good (as is) -> slow (the
embedded engine's update phase sleeps as long as its step took before it, :func:`_repo_copy.plant_slowdown`: about
+60-80 %, beyond ``--max-mde``, so both probes decide in a few blocks however busy the machine) -> neutral; bad =
neutral. Its two probes (bad vs good: slower; slow vs good: slower, and its parent is good, so that pair needs no
re-confirmation) run through ``python run_bench.py bisect``; the first invocation is interrupted (Ctrl-C) once the
first probe is kept, and the same command finishes: the first probe is not run again, the slow commit is named, no
worktree is left behind. A "not slower" probe and the final pair's re-confirmation are covered by the search rule's
tests and measured by ``benchmarks/bisect_tries.py`` (docs/bisect.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _badinput import GOOD, box, check_refused  # noqa: F401 - box is a fixture
from _repo_copy import copy_tracked, git, plant_slowdown, short_gate_matrix

from bench.gate.bisect import NOT_SLOWER, SLOWER, probe_alpha, search

ROOT = Path(__file__).resolve().parents[2]

#: the real bisection's matrix: one embedded cell, short runs (the interleaved gate's real tests')
MATRIX = short_gate_matrix("bis", repeats=4)


@pytest.mark.parametrize("n", range(1, 10))
def test_search_names_the_first_slower_commit_within_its_k_probes(n):
    k, _ = probe_alpha(n, 0.05)
    for first in range(1, n + 2):  # n + 1: no commit is slower
        calls = []

        def judge(i_base, i, role):
            calls.append((i_base, i, role))
            return SLOWER if first <= i and i_base < first else NOT_SLOWER

        res = search(n, judge)
        assert len(calls) <= k, (n, first, calls)
        if first == n + 1:
            assert res["outcome"] == "none" and calls == [(0, n, "range")]
        else:
            assert res["outcome"] == "found" and res["hi"] == first, (n, first, res)
            if first > 1:  # the final pair is probed itself
                assert calls[-1] == (first - 1, first, "confirm")


def test_search_stops_at_a_probe_that_cannot_judge_and_names_the_range():
    calls = []

    def judge(i_base, i, role):
        calls.append(i)
        return {8: SLOWER, 4: NOT_SLOWER}.get(i, "cannot judge")

    assert search(8, judge) == {"outcome": "cannot judge", "lo": 4, "hi": 8, "last": None}
    assert calls == [8, 4, 6]
    # slower than good but not than its parent: no single commit is named
    res = search(2, lambda i_base, i, role: SLOWER if (i_base, i) != (1, 2) and i == 2 else NOT_SLOWER)
    assert res["outcome"] == "cannot judge" and (res["lo"], res["hi"]) == (1, 2)


def test_alpha_is_split_over_the_most_probes():
    assert probe_alpha(1, 0.05) == (2, 0.025)
    assert probe_alpha(8, 0.05) == (5, 0.01)
    assert probe_alpha(9, 0.06) == (6, 0.01)


def _tiny_repo(root: Path, side_branch: bool = False) -> Path:
    """A git repository with three commits of a file tree that has ``bench/__init__.py`` (enough for refusals)."""
    root.mkdir()
    (root / "bench").mkdir()
    (root / "bench/__init__.py").write_text("")
    git(root, "init", "-q", "-b", "main")
    for i in range(3):
        (root / "f.txt").write_text(str(i))
        git(root, "add", "-A")
        git(root, "commit", "-qm", f"c{i}")
    if side_branch:
        git(root, "checkout", "-q", "-b", "side", "HEAD~1")
        (root / "g.txt").write_text("side")
        git(root, "add", "-A")
        git(root, "commit", "-qm", "side")
        git(root, "checkout", "-q", "main")
        git(root, "merge", "-q", "--no-ff", "-m", "merge", "side")
    return root


@pytest.mark.parametrize("case", ["unknown_good", "unknown_bad", "same", "not_ancestor", "not_git", "no_folder",
                                  "side_branch", "no_harness", "budget", "alpha", "blocks", "no_matrix",
                                  "corrupt_state"])
def test_bisect_bad_input_is_one_line_exit_2_nothing_written(box, capsys, case):  # noqa: F811 - the fixture
    repo = _tiny_repo(box / "repo", side_branch=case == "side_branch")
    (box / "m.yaml").write_text(GOOD)
    (box / "plain").mkdir()
    argv = {"unknown_good": (["--good", "nosuch", "--bad", "HEAD"], ("--good nosuch", "unknown revision")),
            "unknown_bad": (["--good", "HEAD~1", "--bad", "v9"], ("--bad v9", "unknown revision")),
            "same": (["--good", "HEAD", "--bad", "main"], ("the same commit",)),
            "not_ancestor": (["--good", "HEAD", "--bad", "HEAD~2"], ("not an ancestor",)),
            "not_git": (["--good", "HEAD~1", "--bad", "HEAD", "--repo", str(box / "plain")], ("not a git",)),
            "no_folder": (["--good", "HEAD~1", "--bad", "HEAD", "--repo", str(box / "gone")], ("not a folder",)),
            "side_branch": (["--good", "side", "--bad", "main"], ("first-parent",)),
            "no_harness": (["--good", "HEAD~2", "--bad", "HEAD"], ("holds no harness",)),
            "budget": (["--good", "HEAD~1", "--bad", "HEAD", "--budget", "soon"], ("--budget",)),
            "alpha": (["--good", "HEAD~1", "--bad", "HEAD", "--alpha", "0.7"], ("--alpha",)),
            "blocks": (["--good", "HEAD~1", "--bad", "HEAD", "--blocks", "1"], ("--blocks",)),
            "no_matrix": (["--good", "HEAD~1", "--bad", "HEAD", "--matrix", "none.yaml"], ("none.yaml",)),
            "corrupt_state": (["--good", "HEAD~1", "--bad", "HEAD"], ("bisect.json", "not a bisect state file")),
            }[case]
    if case == "corrupt_state":  # a state file that is not one: refused before any probe runs
        good, bad = git(repo, "rev-parse", "HEAD~1", "HEAD").split()
        state = box / "results" / "bisect" / f"t-{good[:10]}-{bad[:10]}" / "bisect.json"
        state.parent.mkdir(parents=True)
        state.write_text("{not json")
    if case == "no_harness":
        git(repo, "rm", "-q", "-r", "bench")
        git(repo, "commit", "-qm", "no harness")
    repo_flag = [] if "--repo" in argv[0] else ["--repo", str(repo)]
    matrix = [] if "--matrix" in argv[0] else ["--matrix", "m.yaml"]
    check_refused(box, ["bisect", *argv[0], *repo_flag, *matrix], capsys, argv[1])


def _bisect(repo: Path, results: Path, tmp: Path) -> list[str]:
    return [sys.executable, str(ROOT / "run_bench.py"), "bisect", "--repo", str(repo), "--good", "HEAD~2", "--bad",
            "HEAD", "--matrix", str(tmp / "m.yaml"), "--results", str(results), "--blocks", "6", "--alpha", "0.45",
            "--threshold", "0.2", "--max-mde", "1.0", "--order-seed", "5"]


@pytest.mark.slow
def test_bisect_names_the_planted_commit_and_resumes_after_an_interrupt(tmp_path):
    repo = tmp_path / "repo"
    copy_tracked(ROOT, repo)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "good")
    plant_slowdown(repo, relative=1.0)  # +60-80 % of a step, however busy the machine
    git(repo, "commit", "-qam", "slow")
    (repo / "README.md").write_text((repo / "README.md").read_text() + "\n<!-- neutral -->\n")
    git(repo, "commit", "-qam", "neutral")
    neutral, slow = git(repo, "rev-parse", "HEAD", "HEAD~1").split()
    (tmp_path / "m.yaml").write_text(MATRIX)
    results = tmp_path / "results"
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "GITHUB_STEP_SUMMARY")}
    env["PYTHONPATH"] = str(ROOT)
    cmd = _bisect(repo, results, tmp_path)
    # 1st invocation: Ctrl-C once the first probe is kept
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 900
        while not list(results.glob("bisect/*/bisect.json")) and time.time() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out1, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out1
    assert len(git(repo, "worktree", "list").strip().splitlines()) == 1, "temporary worktree left behind"
    (state,) = results.glob("bisect/*/bisect.json")
    first = json.loads(state.read_text())["probes"]
    assert [(p["commit"], p["verdict"]) for p in first.values()] == [(neutral, SLOWER)], out1
    kept = {p: p.read_text() for p in state.parent.glob("probes/*/bis/*/*/r*/record.json")}
    # 2nd invocation, the same command: the first probe is taken from the state, the bisection finishes
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"bisect: first slower commit {slow} 'slow'" in res.stdout, res.stdout
    assert "probe 1 (range): " in res.stdout and "(finished earlier)" in res.stdout
    good = git(repo, "rev-parse", "HEAD~2").strip()
    # the state file's keys are sorted: the probes' order is their finishing time
    probes = sorted(json.loads(state.read_text())["probes"].values(), key=lambda p: p["finished_unix"])
    assert [(p["role"], p["base"], p["commit"], p["verdict"]) for p in probes] == [
        ("range", good, neutral, SLOWER), ("search", good, slow, SLOWER)]
    assert all(p["ci_low"] > 0 and p["change"] > 0.2 for p in probes)  # slower: beyond the threshold
    for p, text in kept.items():  # the first probe's runs were not run again
        assert p.read_text() == text
    assert len(git(repo, "worktree", "list").strip().splitlines()) == 1


def test_the_range_is_the_first_parent_line_a_merge_counts_once(tmp_path):
    from bench.gate.bisect import resolve_range

    repo = _tiny_repo(tmp_path / "repo", side_branch=True)  # c0 c1 c2 on main, side off c1, merged into main
    rng = resolve_range(repo, "HEAD~3", "HEAD")
    line = git(repo, "rev-parse", "HEAD~2", "HEAD~1", "HEAD").split()
    assert rng.commits == tuple(line) and rng.good == git(repo, "rev-parse", "HEAD~3").strip()
    assert rng.subjects[line[-1]] == "merge" and rng.at(0) == rng.good and rng.at(3) == rng.bad


@pytest.mark.parametrize("case", ["unknown", "no_git", "other_repo"])
def test_bisect_of_a_stacks_tree_bad_input_is_one_line_exit_2_nothing_written(box, capsys, case):  # noqa: F811
    tree = _tiny_repo(box / "tree")
    (box / "plain").mkdir()
    other = _tiny_repo(box / "other")
    (box / "m.yaml").write_text(GOOD + f"stacks:\n  fork: {{paths: ['{tree}']}}\n"
                                f"  flat: {{paths: ['{box / 'plain'}']}}\n")
    argv, expected = {
        "unknown": (["--stack", "nope"], ("--stack nope", "not a stack", "fork, flat")),
        "no_git": (["--stack", "flat"], ("--stack flat", "none of its paths is inside a git repository")),
        "other_repo": (["--stack", "fork", "--repo", str(other)], ("--repo", "not the git repository", str(tree))),
    }[case]
    check_refused(box, ["bisect", "--good", "HEAD~1", "--bad", "HEAD", "--matrix", "m.yaml", *argv], capsys, expected)
    assert len(git(tree, "worktree", "list").strip().splitlines()) == 1


#: appended to a stack tree's copy of verl's ``core_algos.py`` at the planted commit: each GRPO advantage call sleeps
#: as long as the step before it took (about +100 % of a step, however busy the machine)
PLANTED_VERL = """

import time as _bench_time
_bench_grpo = compute_grpo_outcome_advantage
_bench_last = [None]


def compute_grpo_outcome_advantage(*args, **kwargs):  # planted by tests/gate/test_bisect.py
    if _bench_last[0] is not None:
        _bench_time.sleep(_bench_time.perf_counter() - _bench_last[0])
    out = _bench_grpo(*args, **kwargs)
    _bench_last[0] = _bench_time.perf_counter()
    return out
"""


@pytest.mark.slow
def test_bisect_over_a_stacks_verl_tree_names_the_planted_commit(tmp_path):
    """``bisect --stack fork``: the commits walked are those of the stack's source tree (a copy of the installed
    verl in a git repository: good, slow (the GRPO advantage sleeps), neutral), each probe a gate between the stack
    at the base's and at the commit's revision (``fork@<sha>``); the harness is this checkout."""
    import shutil
    from importlib.util import find_spec

    fork = tmp_path / "fork"
    shutil.copytree(Path(find_spec("verl").origin).parent, fork / "verl", ignore=shutil.ignore_patterns("__pycache__"))
    git(fork, "init", "-q")
    git(fork, "add", "-A")
    git(fork, "commit", "-qm", "good")
    algos = fork / "verl" / "trainer" / "ppo" / "core_algos.py"
    algos.write_text(algos.read_text() + PLANTED_VERL)
    git(fork, "commit", "-qam", "slow")
    (fork / "NOTES.md").write_text("neutral\n")
    git(fork, "add", "-A")
    git(fork, "commit", "-qm", "neutral")
    good, slow, neutral = git(fork, "rev-parse", "HEAD~2", "HEAD~1", "HEAD").split()
    (tmp_path / "m.yaml").write_text(MATRIX + f"stacks:\n  fork: {{paths: ['{fork}']}}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "GITHUB_STEP_SUMMARY")}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, str(ROOT / "run_bench.py"), "bisect", "--stack", "fork", "--good", "HEAD~2", "--bad",
           "HEAD", "--matrix", str(tmp_path / "m.yaml"), "--results", str(tmp_path / "results"), "--blocks", "6",
           "--alpha", "0.45", "--threshold", "0.2", "--max-mde", "1.0", "--order-seed", "5"]
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"bisect: first slower commit {slow} 'slow'" in res.stdout, res.stdout
    assert f"of stack fork's tree {fork}" in res.stdout, res.stdout
    (state,) = (tmp_path / "results").glob("bisect/bis-*-fork/bisect.json")
    probes = sorted(json.loads(state.read_text())["probes"].values(), key=lambda p: p["finished_unix"])
    assert [(p["role"], p["base"], p["commit"], p["verdict"]) for p in probes] == [
        ("range", good, neutral, SLOWER), ("search", good, slow, SLOWER)]
    assert all(p["ci_low"] > 0 and p["change"] > 0.2 for p in probes)
    # each probe: the stack twice (fork-<sha>), its tree checked out at the two revisions; each run imported verl
    # from its own side's checkout (a temporary worktree, not the folder itself)
    recs = [json.loads(p.read_text()) for p in (state.parent / "probes" / f"{good[:10]}-{slow[:10]}").rglob(
        "record.json")]
    sides = {r["stack"]["name"]: r["stack"]["trees"][0]["commit"] for r in recs}
    assert sides == {f"fork-{good[:10]}": good, f"fork-{slow[:10]}": slow}, sides
    files = [r["run_versions"]["packages"]["verl"]["file"] for r in recs]
    assert len(recs) >= 4 and not any(f.startswith(str(fork)) for f in files), files
    assert len(git(fork, "worktree", "list").strip().splitlines()) == 1, "temporary worktree left behind"
