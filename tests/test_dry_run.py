"""The dry run a person reads (issue 23): the base launch once, then per run only what differs from it.

For every shipped matrix (and the ``--smoke`` launches of every verl matrix) the CLI is run three ways:
``--dry-run`` (readable), ``--dry-run --verbose`` (every run's whole launch, the listing the dry run printed
before) and ``--dry-run --json`` (everything, machine-readable). The readable per-run part is at most a fifth
of the verbose one: in lines per run (as a terminal of 80 columns shows them; all runs of the matrix
together) and in characters, and it names exactly the Hydra
overrides, environment variables, patches and run-config keys whose value differs from the base launch,
as computed here from the JSON independently of the printer.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from bench.cli import main

ROOT = Path(__file__).resolve().parent.parent
MATRICES = sorted(p.name for p in (ROOT / "matrix").glob("*.yaml"))
SMOKE = [m for m in MATRICES if "engine: verl" in (ROOT / "matrix" / m).read_text()]
WIDTH = 80  # a terminal's columns (rich's default without a terminal): a 3,800-character argv is 48 lines


def _cli(capsys, *args: str) -> str:
    assert main(["run", *args, "--order-seed", "1"]) == 0
    return capsys.readouterr().out


def _screen_lines(lines: list[str]) -> int:
    return sum(max(1, math.ceil(len(ln) / WIDTH)) for ln in lines)


def _sections(lines: list[str], head: re.Pattern, body: str) -> list[list[str]]:
    """Sections that start at a line matching ``head`` and go on while lines start with ``body``."""
    out: list[list[str]] = []
    current: list[str] | None = None
    for ln in lines:
        if head.match(ln):
            current = [ln]
            out.append(current)
        elif current is not None and ln.startswith(body):
            current.append(ln)
        else:
            current = None
    return out


def _readable_parts(text: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(("runs (what differs", "cells (what differs")))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), len(lines))
    return _sections(lines[start + 1:end], re.compile(r"^  +\d+\. "), "       ")


def _launch_keys(launch: dict, with_config: bool) -> dict[str, str]:
    """Independent of bench.commands.dry_run: overrides (argv tokens after ``-m MODULE`` holding ``=``), env,
    patches by name, run-config keys."""
    argv = launch["argv"]
    after = argv.index("-m") + 2 if "-m" in argv else 0
    out = {f"{t.split('=', 1)[0]}": t.split("=", 1)[1] for t in argv[after:] if "=" in t and not t.startswith("-")}
    out.update({k: v for k, v in launch["env"].items()})
    out.update({p.split(":")[0]: (p.split(":") + ["on"])[1] for p in launch["patches"]})
    if with_config:
        out.update({k: json.dumps(v, sort_keys=True) for k, v in launch["config"].items()})
    return out


def _check_parts(parts: list[list[str]], launches: list[dict], ids: list[str], with_config: bool, where: str) -> None:
    assert len(parts) == len(launches), where
    base = _launch_keys(launches[0], with_config)
    every = set(base)
    for launch in launches:
        every |= set(_launch_keys(launch, with_config))
    for part, launch, cell_id in zip(parts, launches, ids):
        keys = _launch_keys(launch, with_config)
        differ = {k for k in every if keys.get(k) != base.get(k)}
        head = part[0].split(cell_id, 1)[1]  # the run's label may read like a key
        rest = [ln for ln in part[1:] if not ln.strip().startswith(("note:", "left out", "merged:"))]
        text = "\n".join([head, *rest])
        named = {k for k in every if re.search(rf"(?<![\w.])[+~]?{re.escape(k)}(?![\w.])", text)}
        assert named == differ, f"{where}: {part[0]}: names {sorted(named)}, differs in {sorted(differ)}"


@pytest.mark.parametrize("name", MATRICES)
def test_dry_run_shows_the_base_once_and_per_run_only_what_differs(name, capsys):
    path = str(ROOT / "matrix" / name)
    readable = _cli(capsys, path, "--dry-run")
    verbose = _cli(capsys, path, "--dry-run", "--verbose")
    data = json.loads(_cli(capsys, path, "--dry-run", "--json"))

    runs = data["runs"]
    assert runs and data["order"]["runs"]  # everything, machine-readable: every launch and the run order
    parts = _readable_parts(readable)
    old = _sections(verbose.splitlines(), re.compile(r"^run \d+/\d+ cell "), "  ")
    assert len(parts) == len(old) == len(runs)
    for new, before, run in zip(parts, old, runs):
        assert run["cell_id"] in new[0] and run["label"] in new[0]
    # lines per run (the matrix's per-run parts together, as a terminal shows them)
    assert sum(map(_screen_lines, parts)) * 5 <= sum(map(_screen_lines, old)), (name, parts)
    assert sum(len("\n".join(p)) for p in parts) * 5 <= sum(len("\n".join(p)) for p in old), name  # characters
    assert "the base launch" in parts[0][0]
    _check_parts(parts, [r["launch"] for r in runs], [r["cell_id"] for r in runs], data["engine"] == "embedded", name)
    # the base launch is printed once, in full
    cmd = " ".join(t for t in runs[0]["launch"]["argv"] if "=" not in t or t.startswith("-"))
    assert readable.count("command: ") == 1 and cmd.split()[0] in readable
    for key in runs[0]["launch"]["env"]:
        assert readable.count(f"{key}=") >= 1
    # what was left out, and why
    for run in runs:
        for factor, why in run["not_applicable"].items():
            assert f"not applicable {factor}: {why}" in readable
    for d in data["dropped"]:
        assert d["reason"] in readable


@pytest.mark.parametrize("name", SMOKE)
def test_smoke_dry_run_shows_the_base_once_and_per_cell_only_what_differs(name, capsys):
    path = str(ROOT / "matrix" / name)
    readable = _cli(capsys, path, "--smoke", "--dry-run")
    verbose = _cli(capsys, path, "--smoke", "--dry-run", "--verbose")
    data = json.loads(_cli(capsys, path, "--smoke", "--dry-run", "--json"))

    cells = data["cells"]
    parts = _readable_parts(readable)
    old = _sections(verbose.splitlines(), re.compile(r"^\S.* -> smoke cell \w+$"), "  ")
    assert len(parts) == len(old) == len(cells)
    for new, before, cell in zip(parts, old, cells):
        assert cell["cell_id"] in new[0] and cell["source_label"] in new[0]
    # lines per run (the matrix's per-run parts together, as a terminal shows them)
    assert sum(map(_screen_lines, parts)) * 5 <= sum(map(_screen_lines, old)), (name, parts)
    assert sum(len("\n".join(p)) for p in parts) * 5 <= sum(len("\n".join(p)) for p in old), name  # characters
    _check_parts(parts, [c["launch"] for c in cells], [c["cell_id"] for c in cells], False, f"{name} --smoke")
    # every left-out override is said once with its reason; per cell only what that cell alone leaves out
    for cell in cells:
        for x in cell["left_out"]:
            assert x in readable
    assert all(x in readable for x in data["not_exercised"].values())
