"""The dry run a person reads (issue 23): the base launch once, then per run only what differs from it.

For every shipped matrix (and the ``--smoke`` launches of every verl matrix) the CLI is run three ways:
``--dry-run`` (readable), ``--dry-run --verbose`` (every run's whole launch, the listing the dry run printed
before) and ``--dry-run --json`` (everything, machine-readable). For EVERY run (cell) the readable part is
at most a fifth of its part of the verbose listing, in lines as a terminal of 80 columns shows them and in
characters, and it names exactly the Hydra overrides, environment variables, patches and run-config keys
whose value differs from the base launch, as computed here from the JSON and read back from the printed
notation independently of the printer.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import sys
from pathlib import Path

import pytest

from bench.cli import main

ROOT = Path(__file__).resolve().parent.parent
#: the shipped matrices, less those with a ``stack`` factor: their dry run opens and probes each stack's interpreter
#: (about a minute per dry run on 2 busy cores; verl_cpu_stacks.yaml's are named by variables), and --smoke refuses
#: them; tests/test_launch_pins.py dry-runs them once, tests/test_stacks.py checks their plan
MATRICES = sorted(p.name for p in (ROOT / "matrix").glob("*.yaml")
                  if "\nstacks:" not in (ROOT / "matrix" / p.name).read_text())
SMOKE = [m for m in MATRICES if "engine: verl" in (ROOT / "matrix" / m).read_text()]
WIDTH = 80  # a terminal's columns (rich's default without a terminal): a 3,800-character argv is 48 lines


def _cli(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["run", *args, "--order-seed", "1"]) == 0
    return out.getvalue()


def _dry_runs(name: str, smoke: bool) -> tuple[str, list[list[str]], list[list[str]], dict]:
    """(readable dry run, its per-run parts, the same runs' parts of the verbose listing, the JSON document)."""
    args = [str(ROOT / "matrix" / name), *(["--smoke"] if smoke else []), "--dry-run"]
    readable, verbose = _cli(*args), _cli(*args, "--verbose")
    head = re.compile(r"^\S.* -> smoke cell \w+$" if smoke else r"^run \d+/\d+ cell ")
    return readable, _readable_parts(readable), _sections(verbose.splitlines(), head, "  "), json.loads(
        _cli(*args, "--json"))


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


#: a kind of change and its items in a run's part: ``override: a=1  ~b``, ``override under P: x=1  +y.z=2``
_LABEL = re.compile(r"(?:^|\s)(override|env|patch|config|command)(?: under (\S+))?:(?=\s|$)")


def _named(text: str) -> set[str]:
    """The whole keys a run's part names, read from its notation (independently of the printer): items are
    separated by two spaces or a line break, ``+``/``~`` lead, ``a.{b,c}.d`` stands for ``a.b.d`` and
    ``a.c.d``, a label ``KIND under P:`` puts ``P`` before its items' keys."""
    out: set[str] = set()
    labels = list(_LABEL.finditer(text))
    for m, nxt in zip(labels, labels[1:] + [None]):
        body = text[m.end():nxt.start() if nxt else len(text)]
        for item in filter(None, (x.strip() for x in re.split(r"\s{2,}|\n", body))):
            key = re.split(r"[=:]" if m.group(1) == "patch" else "=", item.lstrip("+~"), maxsplit=1)[0]
            brace = re.search(r"\{([^}]*)\}", key)
            alts = [key[:brace.start()] + a + key[brace.end():] for a in brace.group(1).split(",")] if brace else [key]
            out |= {(m.group(2) or "") + k for k in alts}
    return out


def _check_parts(parts: list[list[str]], launches: list[dict], ids: list[str], with_config: bool, where: str) -> None:
    assert len(parts) == len(launches), where
    base = _launch_keys(launches[0], with_config)
    for part, launch, cell_id in zip(parts, launches, ids):
        keys = _launch_keys(launch, with_config)
        differ = {k for k in set(base) | set(keys) if keys.get(k) != base.get(k)}
        head = part[0].split(cell_id, 1)[1]  # the run's label may read like a key
        rest = [ln for ln in part[1:] if not ln.strip().startswith(("note:", "left out", "merged:"))]
        named = _named("\n".join([head.removeprefix("):"), *rest])) if differ else set()
        assert named == differ, f"{where}: {part[0]}: names {sorted(named)}, differs in {sorted(differ)}"
        if not differ:
            assert head.endswith("the base launch"), f"{where}: {part[0]}"


def _check_fifth(parts: list[list[str]], old: list[list[str]], where: str) -> None:
    """Per run: its readable part is at most a fifth of its old listing, in lines at 80 columns and in
    characters."""
    for new, before in zip(parts, old):
        assert _screen_lines(new) * 5 <= _screen_lines(before), (where, new, _screen_lines(before))
        assert len("\n".join(new)) * 5 <= len("\n".join(before)), (where, new)


@pytest.mark.parametrize("name", MATRICES)
def test_dry_run_shows_the_base_once_and_per_run_only_what_differs(name):
    readable, parts, old, data = _dry_runs(name, smoke=False)
    runs = data["runs"]
    assert runs and data["order"]["runs"]  # everything, machine-readable: every launch and the run order
    assert len(parts) == len(old) == len(runs)
    for new, before, run in zip(parts, old, runs):
        assert run["cell_id"] in new[0] and run["label"] in new[0]
    _check_fifth(parts, old, name)
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
def test_smoke_dry_run_shows_the_base_once_and_per_cell_only_what_differs(name):
    readable, parts, old, data = _dry_runs(name, smoke=True)
    cells = data["cells"]
    assert len(parts) == len(old) == len(cells)
    for new, before, cell in zip(parts, old, cells):
        assert cell["cell_id"] in new[0] and cell["source_label"] in new[0]
    _check_fifth(parts, old, f"{name} --smoke")
    _check_parts(parts, [c["launch"] for c in cells], [c["cell_id"] for c in cells], False, f"{name} --smoke")
    # every left-out override is said once with its reason; per cell only what that cell alone leaves out
    for cell in cells:
        for x in cell["left_out"]:
            assert x in readable
    assert all(x in readable for x in data["not_exercised"].values())


def print_table() -> None:
    """The figures of docs/figures.md ("The dry run"): per shipped matrix (and ``--smoke``), lines per run at 80
    columns, readable against verbose, for the run where the ratio is largest, and for the whole dry run."""
    print("| matrix | runs | worst run | its lines, verbose | its lines, readable | ratio | whole, verbose | "
          "whole, readable |\n|---|---|---|---|---|---|---|---|")
    for name in MATRICES:
        for smoke in (False, True) if name in SMOKE else (False,):
            readable, parts, old, _ = _dry_runs(name, smoke)
            verbose = _cli(str(ROOT / "matrix" / name), *(["--smoke"] if smoke else []), "--dry-run", "--verbose")
            new_n, old_n, head = max(((_screen_lines(n), _screen_lines(o), n[0]) for n, o in zip(parts, old)),
                                     key=lambda t: t[0] / t[1])
            label = re.sub(r"^\s*\d+\. |:.*$", "", head)
            print(f"| `{name}{' --smoke' if smoke else ''}` | {len(parts)} | {label} | {old_n} | {new_n} | "
                  f"{new_n / old_n:.2f} | {_screen_lines(verbose.splitlines())} | "
                  f"{_screen_lines(readable.splitlines())} |")


if __name__ == "__main__":  # python tests/test_dry_run.py: the table of docs/figures.md
    sys.exit(print_table())
