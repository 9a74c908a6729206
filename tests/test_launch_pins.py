"""The launches of every shipped matrix are pinned: argv, env and patches per cell, and the cell ids.

For each ``matrix/*.yaml`` the test runs the CLI as a user does (``python run_bench.py run M --dry-run --json``,
and for an engine that supports ``--smoke`` also ``--smoke --dry-run --json``), reduces the
machine-readable plan to ``{cell_id: {argv, env, patches}}`` (plus the run config where the engine's config
file is its input, ``shows_config``) and compares it with ``tests/fixtures/launch_pins.json``. A new key of
the run config (a new field at its default) is allowed; every pinned key must keep its value. The run order
(random seed), labels and notes are left out: a restructuring may change
what a person reads, not what is launched or how a cell is named.

A deliberate change of launches regenerates the fixture: ``python tests/test_launch_pins.py --regenerate``
(say so in the commit message).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PINS = REPO / "tests" / "fixtures" / "launch_pins.json"
MATRICES = sorted((REPO / "matrix").glob("*.yaml"))


def _normalize(value):
    """Machine paths out of a launch value (the repo folder, the home folder), so the pins are portable."""
    if isinstance(value, str):
        return value.replace(str(REPO), "{REPO}").replace(str(Path.home()), "{HOME}")
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalize(v) for k, v in value.items()}
    return value


#: shipped matrices whose stacks are named by variables (docs/stacks.md): both stacks get the verl CPU stack's
#: interpreter here (the launches leave it to the stack, ``{verl_python}``; the dry run probes it for real)
STACK_VARS = {"verl_cpu_stacks.yaml": ("BENCH_VERL_090_PYTHON", "BENCH_VERL_091_PYTHON")}


def _stack_env(matrix: Path) -> dict[str, str]:
    names = STACK_VARS.get(matrix.name, ())
    if not names:
        return {}
    sys.path.insert(0, str(REPO))
    from bench.engines.verl_cpu.target import verl_python

    python = verl_python()
    if python == sys.executable or not Path(python).exists():
        pytest.skip(f"{matrix.name}: the verl CPU stack is not installed (bash tools/install_verl_cpu.sh)")
    return dict.fromkeys(names, python)


def _dry_run(matrix: Path, *extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), **_stack_env(matrix)}
    out = subprocess.run(
        [sys.executable, str(REPO / "run_bench.py"), "run", str(matrix), "--dry-run", "--json", "--order-seed", "0",
         *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, f"{matrix.name} {extra}: exit {out.returncode}\n{out.stderr[-2000:]}"
    return json.loads(out.stdout)


def _cells(specs: list[dict], with_config: bool) -> dict[str, dict]:
    keys = ("argv", "env", "patches") + (("config",) if with_config else ())
    return {s["cell_id"]: _normalize({k: s["launch"][k] for k in keys}) for s in specs}


def _same_launch(want: dict, got: dict) -> bool:
    """argv, env and patches equal; the run config equal on every pinned key (a new key is a new config field
    at its default, which must not change a cell)."""
    same = all(got[k] == want[k] for k in ("argv", "env", "patches"))
    return same and all(got["config"].get(k, "<absent>") == v for k, v in want.get("config", {}).items())


def launches(matrix: Path) -> dict[str, dict]:
    """The pinned form of one matrix: ``{"runs": {cell_id: {argv, env, patches[, config]}}}`` plus ``"smoke"`` (the same
    for the ``--smoke`` cells) when the matrix's engine supports smoke runs and it has no stack factor."""
    plan = _dry_run(matrix)
    sys.path.insert(0, str(REPO))
    from bench.core.engine_registry import engine_class

    engine = engine_class(plan["engine"])
    out = {"engine": plan["engine"], "runs": _cells(plan["runs"], engine.shows_config)}
    if engine.supports_smoke and "stacks" not in plan:  # --smoke refuses a stack factor (docs/stacks.md)
        out["smoke"] = _cells(_dry_run(matrix, "--smoke")["cells"], False)
    return out


def all_launches() -> dict[str, dict]:
    """Every shipped matrix's pinned form, keyed by the matrix file name."""
    return {m.name: launches(m) for m in MATRICES}


@pytest.mark.parametrize("matrix", MATRICES, ids=[m.name for m in MATRICES])
def test_launches_and_cell_ids_are_pinned(matrix: Path) -> None:
    pins = json.loads(PINS.read_text())
    assert matrix.name in pins, f"{matrix.name} is not pinned: python tests/test_launch_pins.py --regenerate"
    want, got = pins[matrix.name], launches(matrix)
    for part in ("runs", "smoke"):
        if part not in want and part not in got:
            continue
        w, g = want.get(part, {}), got.get(part, {})
        assert sorted(g) == sorted(w), f"{matrix.name} {part}: cell ids changed: lost {sorted(set(w) - set(g))}, " \
                                       f"new {sorted(set(g) - set(w))}"
        for cid in w:
            assert _same_launch(w[cid], g[cid]), f"{matrix.name} {part} cell {cid}: launch changed"
    assert got["engine"] == want["engine"]


def test_every_pinned_matrix_is_shipped() -> None:
    pins = json.loads(PINS.read_text())
    assert sorted(pins) == sorted(m.name for m in MATRICES)


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit("usage: python tests/test_launch_pins.py --regenerate")
    PINS.parent.mkdir(parents=True, exist_ok=True)
    PINS.write_text(json.dumps(all_launches(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {PINS.relative_to(REPO)}")
