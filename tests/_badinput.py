"""The promise every bad-input case checks (issue 21): exit 2 (or the documented code), exactly one stderr
line naming the file or key, no traceback, nothing created or changed under the working folder (results,
MLflow and Optuna stores included), no process left running, and a wall-clock cap.

Cases run in-process through :func:`bench.cli.main` (the error boundary of ``run_bench.py``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from bench.cli import main

#: seconds one bad-input case may take (refusals happen before anything runs)
CAP_S = 30.0

#: a valid small embedded matrix the bad-input cases start from (also tests/test_bad_inputs.py's)
GOOD = """\
name: t
engine: embedded
platform: cpu
base:
  steps: 3
  warmup_steps: 1
  train_batch_size: 4
  n: 2
  ppo_mini_batch_size: 4
  micro_batch_size_per_gpu: 2
  max_prompt_length: 128
  max_response_length: 24
factors:
  dynamic_bsz: [off, on]
"""
#: GOOD with a small ``tune`` block (dynamic bsz fixed on, one token limit searched), for the tune and storage cases
TUNE = GOOD.replace("factors:\n  dynamic_bsz: [off, on]\n", "factors:\n  dynamic_bsz: [on]\n") + """\
tune:
  fixed: {dynamic_bsz: on}
  space:
    ppo_max_token_len_per_gpu: {low: 1, high: 4, unit: seq}
  n_trials: 2
"""
#: fragments that only a library's own wording would contain (never shown to the user)
LIBRARY_TEXT = ("Unable to extract tag", "Input should be a valid dictionary", "Generators are not valid",
                "exceeded maximum size", "validation error for", "pydantic", "For further information visit",
                "Traceback", "sqlalchemy", "yaml.constructor", "Input should be", "after validation",
                "could not determine a constructor", "Can't load plugin", "maintenance mode", "tag:yaml.org")


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``folder``: relative path -> (size, mtime ns) (links not followed)."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(root) / name
            try:
                st = p.lstat()
            except OSError:
                continue
            out[str(p.relative_to(folder))] = (st.st_size, st.st_mtime_ns)
    return out


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def check_refused(box: Path, argv: list[str], capsys, expected: str | tuple[str, ...] = "", code: int = 2,
                  cap_s: float = CAP_S) -> str:
    """Run ``argv`` in ``box``; assert the promise (module docstring); returns the one stderr line.

    ``expected``: fragment(s) the line must contain (the file or key it names, what is allowed).
    """
    before, kids = tree(box), _children()
    start = time.monotonic()
    rc = main(argv)
    wall = time.monotonic() - start
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == code, f"exit {rc}, stderr: {err}"
    assert len(lines) == 1, err
    for frag in LIBRARY_TEXT:
        assert frag not in out + err, f"library text {frag!r} in: {err}"
    for frag in (expected,) if isinstance(expected, str) else expected:
        assert frag in lines[0], lines[0]
    after = tree(box)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert not changed, f"files created or changed: {changed}"
    left = _children() - kids
    assert not left, f"processes left running: {left}"
    assert wall < cap_s, f"took {wall:.1f} s"
    return lines[0]


def base(**kv: object) -> str:
    """:data:`GOOD` with ``base`` keys set (values written as YAML text)."""
    out = []
    for line in GOOD.splitlines():
        if line.startswith("  ") and line.strip().split(":")[0] in kv:
            continue
        out.append(line)
        if line == "base:":
            out += [f"  {k}: {v}" for k, v in kv.items()]
    return "\n".join(out) + "\n"


@pytest.fixture()
def box(tmp_path, monkeypatch):
    """A fresh working folder; no MLflow variable, no job summary, the test variable unset."""
    monkeypatch.chdir(tmp_path)
    for var in ("MLFLOW_TRACKING_URI", "GITHUB_STEP_SUMMARY", "BENCH_TEST_SURELY_UNSET_VAR"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


@pytest.fixture()
def sweep_box(box):
    """A results folder with a real-shaped synthetic sweep ``synth`` (_sweeps.make_sweep: 2 cells x 2
    repeats)."""
    from _sweeps import EMBEDDED_CELLS, make_sweep

    make_sweep(box / "res", "synth", EMBEDDED_CELLS[:2], repeats=2, seed=1)
    return box


def edit_json(path: Path, fn) -> None:
    """Rewrite the JSON file ``path`` with ``fn`` applied to its content (in place)."""
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def give_specs(sweep: Path) -> None:
    """A synthetic sweep has no ``spec.json``: give each cell one, as a real sweep has (for ``sync``)."""
    meta = json.loads((sweep / "sweep.json").read_text())
    for run in meta["plan"]["runs"]:
        spec = {k: run[k] for k in ("cell_id", "levels", "cells", "not_applicable")}
        spec.update(engine="embedded", platform="cpu", launch={"argv": ["true"]}, timeout_s=60.0)
        (sweep / run["cell_id"] / "spec.json").write_text(json.dumps(spec))
