"""Bad input: one line on stderr naming file and key, exit code 2, nothing written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

GOOD = """\
name: t
engine: embedded
platform: cpu
factors:
  dynamic_bsz: [off, on]
"""

CASES = {
    "malformed_yaml": ("name: t\nfactors:\n  dynamic_bsz: [off, on\n", "re:m.yaml:3: malformed YAML"),
    "unknown_factor": (
        "name: t\nfactors:\n  turbo: [0, 1]\n",
        "m.yaml:2: factors: unknown factor 'turbo' (allowed: rmsnorm_fused,",
    ),
    "unknown_level": (
        "name: t\nfactors:\n  task_queue: [0, 3]\n",
        "factors: task_queue: unknown level 3 (allowed: 0, 1, 2",
    ),
    "unknown_design": (
        "name: t\ndesign: latin\n",
        "design: unknown design 'latin' (allowed: full, one_at_a_time, fractional, explicit)",
    ),
    "unknown_key": ("name: t\nbase:\n  stepz: 3\n", "base.stepz: unknown key"),
    "no_runnable_cell": (
        "name: t\nplatform: cpu\nfactors:\n  dynamic_bsz: [off, on]\nexclude:\n  - when: {dynamic_bsz: on}\n"
        "  - when: {dynamic_bsz: off}\n",
        "no runnable cell",
    ),
    # the registered engines (built-ins and plugins alike), looked up when the case runs
    "bad_engine": ("name: t\nengine: megatron\n", lambda: f"engine: allowed: {_engines()}, got 'megatron'"),
}


def _engines() -> str:
    """The registered engines as the matrix error lists them: 'a' or 'b' / 'a', 'b' or 'c'."""
    from bench.core.engine_registry import engine_names

    names = [repr(n) for n in engine_names()]
    assert {"'embedded'", "'verl'"} <= set(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" or {names[-1]}"


def run(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, str(ROOT / "run_bench.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_matrix_is_one_line_exit_2_nothing_written(tmp_path, case):
    text, expected = CASES[case]
    expected = expected() if callable(expected) else expected
    (tmp_path / "m.yaml").write_text(text)
    p = run(["m.yaml", "--results", "out"], tmp_path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    if expected.startswith("re:"):
        assert re.search(expected[3:], lines[0]), lines[0]
    else:
        assert expected in lines[0], lines[0]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m.yaml"]


def test_missing_matrix_file(tmp_path):
    p = run(["nope.yaml"], tmp_path)
    assert p.returncode == 2 and "nope.yaml: cannot read matrix" in p.stderr


def test_unwritable_results_folder(tmp_path):
    (tmp_path / "m.yaml").write_text(GOOD)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):  # root ignores mode bits: use a path under a regular file instead
            target = tmp_path / "file"
            target.write_text("x")
            results = target / "results"
        else:
            results = ro / "results"
        p = run(["m.yaml", "--results", str(results)], tmp_path)
    finally:
        ro.chmod(0o700)
    assert p.returncode == 2, p.stderr
    assert "folder is not writable" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "results").exists() and not (tmp_path / "mlflow.db").exists()


def test_dry_run_prints_plan_and_writes_nothing(tmp_path):
    p = run([str(ROOT / "matrix" / "full.yaml"), "--dry-run", "--results", "out"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert "design cells=192" in p.stdout and "dropped=32" in p.stdout
    assert "stands for 40 design cells" in p.stdout
    assert "not applicable mc2" in p.stdout
    assert "command: {python} -m bench.engines.embedded" in p.stdout
    assert "dropped 32 invalid design cell(s)" in p.stdout and "TASK_QUEUE_ENABLE=2" in p.stdout
    assert list(tmp_path.iterdir()) == []


#: libraries a CLI start that needs none of them must not import (seconds each; scipy alone 3 s on 2 cores)
HEAVY = ("scipy", "torch", "mlflow", "matplotlib", "optuna", "pandas", "statsmodels", "ray", "rich")


def imported(importtime_stderr: str) -> set[str]:
    """The top-level packages in the ``-X importtime`` report ``importtime_stderr``
    (lines ``import time: <self us> | <cumulative us> | <indent><module>``)."""
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in importtime_stderr.splitlines()
            if line.startswith("import time:") and "|" in line and not line.rstrip().endswith("imported package")}


def test_run_is_the_default_subcommand_and_help_lists_subcommands_without_heavy_imports(tmp_path):
    """``python run_bench.py --help`` lists every subcommand with its help line, and building that parser imports
    no command module and none of :data:`HEAVY` (issue 47: it imported scipy through every command module)."""
    from bench.commands import COMMANDS

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "run_bench.py"), "--help"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "{" + ",".join(COMMANDS) + "}" in p.stdout and list(COMMANDS)[0] == "run"
    listed = " ".join(p.stdout.split())
    for name, line in COMMANDS.items():
        assert f"{name} {line}" in listed, name
    mods = imported(p.stderr)
    assert {"bench", "argparse"} <= mods  # the report is read (the parser was built in this process)
    assert sorted(mods & set(HEAVY)) == []
    commands = {line.rsplit("|", 1)[1].strip() for line in p.stderr.splitlines() if "bench.commands." in line}
    assert commands <= {"bench.commands.base"}, commands
