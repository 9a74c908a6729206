"""The interleaved gate end to end, as a user runs it (the CLI), with two real code versions: a temporary git
repository holding this harness with two commits, the second one slower (a sleep in the embedded engine's
update phase) and leaving a marker file in its run folder. ``gate --interleave HEAD~1`` runs both in one
blocked sweep; the first invocation is interrupted after its first runs and the same command resumes it.

Checks: each run executed its own version's code (the marker is in every candidate run folder and in no
baseline one: the baseline's fork server imported the baseline's checkout), both versions of the cell in every
block, the temporary worktree is gone after the interruption and at the end, the resumed sweep is the same
sweep and kept the first invocation's records, the candidate is slower in the paired estimate (a direction,
not a timing figure), and the report of the gate sweep shows the gate's own "smallest change it can see".
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
from _repo_copy import SLOW_PATCH, copy_tracked, short_gate_matrix

ROOT = Path(__file__).resolve().parents[2]

MATRIX = short_gate_matrix("gate_e2e", repeats=2)



CPUS_SEEN = ('        import os as _os\n'
             '        open("cpus_seen", "a").write(" ".join(map(str, sorted(_os.sched_getaffinity(0)))) + "\\n")\n')


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _make_repo(dst: Path) -> Path:
    """This harness (its tracked files as they are in the working tree) in a fresh git repo: commit 1 as it is,
    commit 2 slower with a marker."""
    copy_tracked(ROOT, dst)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    os.environ.update(env)
    step = dst / "bench/engines/embedded/step.py"  # both commits: each run writes the CPUs the kernel lets it use
    step.write_text(step.read_text().replace(SLOW_PATCH[0], SLOW_PATCH[0] + CPUS_SEEN, 1))
    _git(dst, "init", "-q")
    _git(dst, "add", "-A")
    _git(dst, "commit", "-qm", "fast")
    step = dst / "bench/engines/embedded/step.py"
    text = step.read_text()
    assert text.count(SLOW_PATCH[0]) == 1
    step.write_text(text.replace(*SLOW_PATCH))
    _git(dst, "commit", "-qam", "slow")
    return dst


def _interrupt_when(cmd: list[str], repo: Path, env: dict, results: Path, name: str, count: int) -> tuple[int, str]:
    """Start the gate and send it Ctrl-C once ``count`` run folders hold ``name``; its exit code and output.

    Ctrl-C reaches the harness as in a terminal, also when pytest itself was started in the background (a shell
    starts background jobs with SIGINT ignored, and an ignored signal stays ignored across exec)."""
    proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 400
        while len(list(results.glob(f"gate_e2e/2*/*/r*/{name}"))) < count and time.time() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out


@pytest.mark.slow
def test_interleaved_gate_with_a_git_revision_as_baseline_resumes(tmp_path):
    repo = _make_repo(tmp_path / "repo")
    (tmp_path / "m.yaml").write_text(MATRIX)
    results, ml = tmp_path / "results", f"sqlite:///{tmp_path / 'ml.db'}"
    cmd = [sys.executable, "run_bench.py", "gate", "--results", str(results), "--tracking-uri", ml,
           "--interleave", "HEAD~1", "--matrix", str(tmp_path / "m.yaml"), "--blocks", "2", "--order-seed", "3"]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    # 1st invocation: interrupted (Ctrl-C) once two runs have finished
    rc1, out1 = _interrupt_when(cmd, repo, env, results, "record.json", 2)
    assert rc1 == 130, out1
    assert len(_git(repo, "worktree", "list").strip().splitlines()) == 1, "temporary worktree left behind"
    (sweep,) = [p for p in (results / "gate_e2e").iterdir() if p.name[0].isdigit()]
    first = {p: p.read_text() for p in sweep.glob("*/r*/record.json")}
    assert len(first) >= 2
    # 2nd invocation, same command: resumes the same sweep
    res = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode in (1, 3), res.stdout + res.stderr  # slower: regression, or too few blocks to judge
    assert len(_git(repo, "worktree", "list").strip().splitlines()) == 1
    assert [p for p in (results / "gate_e2e").iterdir() if p.name[0].isdigit()] == [sweep]
    for p, text in first.items():
        assert p.read_text() == text, f"{p} rerun on resume"
    meta = json.loads((sweep / "sweep.json").read_text())
    assert meta["code_versions"]["baseline"]["commit"] == _git(repo, "rev-parse", "HEAD~1").strip()
    assert len(meta["invocations"]) == 1 and meta["status"] == "complete"
    recs = [json.loads(p.read_text()) for p in sweep.glob("*/r*/record.json")]
    assert sorted((r["repeat"], r["code_version"]) for r in recs) == [
        (0, "baseline"), (0, "candidate"), (1, "baseline"), (1, "candidate")]
    assert all(r["status"] == "ok" for r in recs)
    # every run executed its own version's code
    for r in recs:
        marker = Path(r["_dir"] if "_dir" in r else sweep / r["cell_id"] /
                      (f"r{r['repeat']}" + ("-baseline" if r["code_version"] == "baseline" else ""))) \
            / "code_marker_slow_commit"
        assert marker.exists() == (r["code_version"] == "candidate"), (r["code_version"], marker)
        if marker.exists():
            assert str(repo) in marker.read_text()
        # both versions forked from one server (its children import their own version's harness)
        launcher = json.loads((marker.parent / "launcher.json").read_text())
        assert launcher["launcher"] == "forkserver"
        assert (Path(launcher["code_root"]) == repo) == (r["code_version"] == "candidate"), launcher
    served: dict[int, set[str]] = {}  # one server per invocation (interrupted + resumed: two), each for both versions
    for p in sweep.glob("*/r*/launcher.json"):
        data = json.loads(p.read_text())
        served.setdefault(data["server_pid"], set()).add(data["code_root"])
    assert len(served) <= 2 and any(len(roots) == 2 for roots in served.values()), served
    gate = json.loads((sweep / "gate" / "gate.json").read_text())
    (row,) = gate["rows"]
    assert row["blocks"] == 2 and row["raw_change"] > 0.2, row  # 0.6 s more per ~0.5 s step
    # the report of the gate sweep: its "smallest change the gate can see" is the gate's own figure
    rep = subprocess.run([sys.executable, "run_bench.py", "report", "--results", str(results), "--tracking-uri", ml,
                          str(sweep)], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    data = json.loads(next(sweep.glob("report/report.json")).read_text())
    assert data["mde"]["gate"] == pytest.approx(row["mde"], rel=1e-12)


@pytest.mark.slow
def test_side_by_side_gate_runs_both_versions_at_once_on_two_cpus_and_resumes(tmp_path):
    """``--side-by-side``: in every block the baseline's and the candidate's run overlap in time, each pinned to
    its own CPU (``affinity.json``, and the CPU set the run's own process saw, ``os.sched_getaffinity``), the CPUs
    swapped between the two blocks; interrupted during block 1 (Ctrl-C), the same command resumes it, and the
    runs of block 0 are kept; each run executed its own version's code."""
    import os as _os

    if len(_os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    repo = _make_repo(tmp_path / "repo")
    (tmp_path / "m.yaml").write_text(MATRIX)
    results, ml = tmp_path / "results", f"sqlite:///{tmp_path / 'ml.db'}"
    cmd = [sys.executable, "run_bench.py", "gate", "--results", str(results), "--tracking-uri", ml,
           "--interleave", "HEAD~1", "--matrix", str(tmp_path / "m.yaml"), "--blocks", "2", "--order-seed", "5",
           "--side-by-side"]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    rc1, out1 = _interrupt_when(cmd, repo, env, results, "affinity.json", 4)  # block 1's runs have started
    assert rc1 == 130, out1
    (sweep,) = [p for p in (results / "gate_e2e").iterdir() if p.name[0].isdigit()]
    first = {p: p.read_text() for p in sweep.glob("*/r*/record.json")}
    assert {p.parent.name for p in first} <= {"r0", "r0-baseline", "r1", "r1-baseline"}
    res = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode in (1, 3), res.stdout + res.stderr
    for p, text in first.items():
        assert p.read_text() == text, f"{p} rerun on resume"
    recs = {(r["repeat"], r["code_version"]): r for r in
            (json.loads(p.read_text()) | {"_dir": str(p.parent)} for p in sweep.glob("*/r*/record.json"))}
    assert sorted(recs) == [(0, "baseline"), (0, "candidate"), (1, "baseline"), (1, "candidate")]
    cpus = {}
    for (k, v), r in recs.items():
        assert r["status"] == "ok", r.get("reason")
        assert (Path(r["_dir"]) / "code_marker_slow_commit").exists() == (v == "candidate")
        cpus[k, v] = json.loads((Path(r["_dir"]) / "affinity.json").read_text())["cpus"]
        seen = set((Path(r["_dir"]) / "cpus_seen").read_text().split("\n")) - {""}
        assert seen == {str(cpus[k, v][0])}, (k, v, seen)  # pinned: the run itself saw one CPU, its own
    for k in (0, 1):
        b, c = recs[k, "baseline"], recs[k, "candidate"]
        assert max(b["started_at"], c["started_at"]) < min(b["finished_at"], c["finished_at"]), "runs did not overlap"
        assert cpus[k, "baseline"] != cpus[k, "candidate"]
    assert cpus[0, "baseline"] == cpus[1, "candidate"], cpus  # swapped between the blocks of a pair
    gate = json.loads((sweep / "gate" / "gate.json").read_text())
    assert gate["settings"]["side_by_side"]["cpus"] == sorted({c for v in cpus.values() for c in v})
    (row,) = gate["rows"]
    assert row["blocks"] == 2, row
    psi = max(h.get("cpu_pressure_avg60") or 0.0 for r in recs.values() for h in (r["host_load"] or {}).values())
    if psi < 40:  # a direction, on a machine that was not starved (at 99 % pressure a niced run waits seconds
        assert row["raw_change"] > 0.2, row  # for a CPU and the 0.6 s sleep is lost in that; measured -19 % there)
