"""The tests that run a copy of this repository copy its tracked files only (``tests/_repo_copy.py``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from _repo_copy import copy_tracked

ROOT = Path(__file__).resolve().parents[1]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_copy_tracked_copies_tracked_files_only_as_in_the_working_tree(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / ".gitignore").write_text(".venv/\n")
    _git(src, "init", "-q")
    _git(src, "add", "-A")
    _git(src, "commit", "-qm", "one")
    (src / "pkg" / "mod.py").write_text("X = 2\n")  # an uncommitted edit of a tracked file travels
    (src / "scratch.py").write_text("untracked\n")  # untracked, not ignored: stays behind
    (src / ".venv" / "bin").mkdir(parents=True)  # ignored: stays behind
    (src / ".venv" / "bin" / "python").write_text("ignored\n")

    copied = copy_tracked(src, dest)

    assert sorted(copied) == [".gitignore", "pkg/mod.py"]
    assert _files(dest) == {".gitignore", "pkg/mod.py"}
    assert (dest / "pkg" / "mod.py").read_text() == "X = 2\n"


def test_every_test_that_copies_the_repository_uses_the_helper():
    """No test lists files for a copy with ``git ls-files`` of its own (``-co`` copied untracked files too)."""
    own = [p.name for p in (ROOT / "tests").rglob("*.py")
           if p.name not in ("_repo_copy.py", Path(__file__).name) and "ls-files" in p.read_text()]
    assert own == []
    # nor copies the checkout's folder whole (a venv, results or caches inside it would travel)
    whole = [p.name for p in (ROOT / "tests").rglob("*.py")
             if p.name != Path(__file__).name and "copytree(ROOT" in p.read_text().replace(" ", "")]
    assert whole == []
