"""Conveniences of the command line: ``--version``, ``run --cells PATTERN``, ``base.KEY=VALUE`` overrides."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from bench.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_version_prints_package_version_and_git_sha(capsys):
    from bench import __version__

    assert main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    sha = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if sha.returncode == 0:
        assert re.fullmatch(rf"run_bench\.py {re.escape(__version__)} \(git {sha.stdout.strip()}(\+dirty)?\)", out), out
    else:
        assert out == f"run_bench.py {__version__}"


def test_version_without_git_and_through_the_entry_point(monkeypatch, capsys, tmp_path):
    import bench.tracking
    from bench import __version__

    monkeypatch.setattr(bench.tracking, "git_commit", lambda: "unknown")
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"run_bench.py {__version__}\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), "--version"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith(f"run_bench.py {__version__}") and p.stderr == ""
    assert list(tmp_path.iterdir()) == []  # writes nothing
