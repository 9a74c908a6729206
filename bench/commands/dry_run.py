"""The ``--dry-run`` a person reads: the base launch once, then per run only what differs from it.

A matrix's runs share almost all of their launch (a verl cell has some 60 Hydra overrides, of which the
factor levels change two or three). :func:`print_dry_run` prints the base launch (the plan's first run,
the all-off reference where the design has one) in full once, what was left out of the plan and why
(factors not applicable here, merged design cells, dropped cells), then one short part per run naming
exactly the overrides, environment variables, patches and run-config keys whose value differs from the
base. :func:`print_smoke_dry_run` does the same for the CPU smoke launches of ``run --smoke``.
:func:`plan_json` / :func:`smoke_json` are everything, machine-readable (``--json``).

Changes are written as Hydra writes overrides: ``KEY=VALUE`` (another value than the base's),
``+KEY=VALUE`` (a key the base launch lacks), ``~KEY`` (a key of the base launch this run lacks). Hydra
overrides are keyed by what precedes their first ``=``; patches by their name (the part before ``:``),
valued by their level. Two shorthands keep every run's part at most a fifth of its full listing
(``tests/test_dry_run.py``): changes that differ in one dotted key segment only, with the same sign and
value, are one item in a shell's brace notation (``a.{b,c}.d=V`` for ``a.b.d=V`` and ``a.c.d=V``), and a
dotted prefix that all of a kind's items share is said once in its label (``override under
actor_rollout_ref.:``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from bench.core.engine_registry import engine_class
from bench.core.metadata import flat_run_versions
from bench.spec.launch import Launch
from bench.spec.optimizations import REGISTRY, not_read, stack_versions
from bench.spec.plan import Plan, RunOrder

#: a Hydra override token of an argv (``key=value``, ``+key=value``, ``++key=value``, ``~key``)
_OVERRIDE = re.compile(r"^(?:(?:\+\+|\+)?[A-Za-z_][\w.\-/@]*=|~[A-Za-z_][\w.\-/@]*(?:=|$))")
#: a run's changes go on its header line when the line stays this short; else one change per line
INLINE_WIDTH = 80
#: continuation lines of a run's part
INDENT = "       "
LEGEND = ("  notation: KEY=VALUE another value, +KEY=VALUE not in the base, ~KEY only in the base;",
          "  a.{b,c}.d=V both a.b.d=V and a.c.d=V; \"override under P:\" keys relative to P (P.KEY)")


@dataclass(frozen=True)
class Change:
    """One difference of a run's launch from the base launch.

    Attributes:
        kind: ``override`` (Hydra override in argv), ``command`` (the argv without overrides), ``env``,
            ``patch`` or ``config`` (a key of the engine's run config file).
        key: the override key, variable, patch name or config key.
        value: the run's value; ``None`` when the run lacks the key.
        base: the base launch's value; ``None`` when the base lacks it.
    """

    kind: str
    key: str
    value: str | None
    base: str | None

    def text(self, prefix: str = "") -> str:
        """The change in Hydra's notation: ``KEY=VALUE`` (changed), ``+KEY=VALUE`` (not in the base launch),
        ``~KEY`` (in the base launch, not in this run); patches ``NAME:LEVEL``. ``prefix`` (a leading part of
        the key, said once for a group of changes) is left out of the key."""
        sep = ":" if self.kind == "patch" else "="
        key = self.key[len(prefix):] if prefix and self.key.startswith(prefix) else self.key
        if self.value is None:
            return f"~{key}"
        item = f"{key}{sep}{self.value}" if self.value else key
        return f"+{item}" if self.base is None else item


def _value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"), sort_keys=True)


def split_argv(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """(command, overrides) of an argv: the tokens after ``-m MODULE`` that look like Hydra overrides,
    keyed by what precedes their first ``=`` (a ``~key`` removal maps to ``""``); the rest is the command."""
    command: list[str] = []
    overrides: dict[str, str] = {}
    after_module = "-m" not in argv
    for i, tok in enumerate(argv):
        if after_module and _OVERRIDE.match(tok) and not tok.startswith("-"):
            key, _, value = tok.partition("=")
            overrides[key] = value
        else:
            command.append(tok)
        if i > 0 and argv[i - 1] == "-m":
            after_module = True
    return command, overrides


def _patches(patches: list[str]) -> dict[str, str]:
    out = {}
    for p in patches:
        name, _, level = p.partition(":")
        out[name] = level or "on"
    return out


def _diff(kind: str, base: dict[str, str], run: dict[str, str]) -> list[Change]:
    keys = list(base) + [k for k in run if k not in base]
    return [Change(kind, k, run.get(k), base.get(k)) for k in keys if run.get(k) != base.get(k)]


def launch_diff(base: Launch, launch: Launch, with_config: bool = True) -> list[Change]:
    """Every difference of ``launch`` from ``base``: command, Hydra overrides, env, patches, and (with
    ``with_config``) the keys of the run config file, in that order."""
    bcmd, bover = split_argv(base.argv)
    cmd, over = split_argv(launch.argv)
    out = [] if cmd == bcmd else [Change("command", "argv", " ".join(cmd), " ".join(bcmd))]
    out += _diff("override", bover, over)
    out += _diff("env", base.env, launch.env)
    out += _diff("patch", _patches(base.patches), _patches(launch.patches))
    if with_config:
        out += _diff("config", {k: _value(v) for k, v in base.config.items()},
                     {k: _value(v) for k, v in launch.config.items()})
    return out


def _print(console: Console, text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def print_base_launch(launch: Launch, console: Console, *, with_config: bool, notes: list[str]) -> None:
    """The base launch in full: command, one Hydra override per line, env, patches, run config, notes."""
    command, overrides = split_argv(launch.argv)
    _print(console, f"  command: {' '.join(command)}")
    if overrides:
        _print(console, f"  overrides ({len(overrides)}):")
        for k, v in overrides.items():
            _print(console, f"    {k}={v}" if v or not k.startswith("~") else f"    {k}")
    _print(console, "  env: " + (" ".join(f"{k}={v}" for k, v in sorted(launch.env.items())) or "(none)"))
    _print(console, "  patches: " + (", ".join(launch.patches) or "(none)"))
    if with_config and launch.config:
        items = ", ".join(f"{k}={_value(v)}" for k, v in sorted(launch.config.items()))
        _print(console, f"  {launch.config_file}: {items}")
    for note in notes:
        _print(console, f"  note: {note}")


def _merge_braces(changes: list[Change]) -> list[tuple[str, list[Change]]]:
    """Changes that differ only in one dotted segment of their key (same sign, same value) as one brace item,
    as a shell expands it: ``actor_rollout_ref.{ref,rollout}.log_prob_use_dynamic_bsz=true``. Returns (key
    with the brace, the changes it stands for), in the order of each item's first change."""
    out: list[tuple[str, list[Change]]] = []
    done: set[int] = set()
    for i, c in enumerate(changes):
        if i in done:
            continue
        segs = c.key.split(".")
        group: list[int] = []
        for pos in range(len(segs) if len(segs) > 1 else 0):  # a key without a dot is a name, not a path
            group = [j for j, d in enumerate(changes) if j > i and j not in done and d.kind == c.kind
                     and (d.value is None) == (c.value is None) and (d.base is None) == (c.base is None)
                     and d.value == c.value and len(d.key.split(".")) == len(segs)
                     and all(a == b for k, (a, b) in enumerate(zip(d.key.split("."), segs)) if k != pos)]
            if group:
                alts = [segs[pos]] + [changes[j].key.split(".")[pos] for j in group]
                key = ".".join(segs[:pos] + ["{" + ",".join(alts) + "}"] + segs[pos + 1:])
                break
        done.update(group)
        out.append((key, [c] + [changes[j] for j in group]) if group else (c.key, [c]))
    return out


def _common_prefix(keys: list[str]) -> str:
    """The longest leading dotted part (ending in ``.``) that every key shares and none is made of alone."""
    parts = [k.split(".") for k in keys]
    n = 0
    while all(len(p) > n + 1 for p in parts) and len({p[n] for p in parts}) == 1 and "{" not in parts[0][n]:
        n += 1
    return ".".join(parts[0][:n]) + "." if n else ""


def _groups(changes: list[Change]) -> list[tuple[str, list[str]]]:
    """(label, items) per kind of change: ``override``, ``env``, ``patch``, ``config``, ``command``. Changes
    that differ in one key segment only are one brace item; when two or more items remain and their keys share
    a dotted prefix, the label says it once (``override under actor_rollout_ref.``) and the items name their
    key relative to it."""
    by_kind: dict[str, list[Change]] = {}
    for c in changes:
        by_kind.setdefault(c.kind, []).append(c)
    out = []
    for kind, cs in by_kind.items():
        merged = _merge_braces(cs)
        prefix = _common_prefix([k for k, _ in merged]) if len(merged) > 1 else ""
        if prefix:  # the items of one sub-path together (``actor.*``, then ``{ref,rollout}.*``)
            merged.sort(key=lambda m: m[0][len(prefix):].split(".")[0])
        items = [Change(kind, key, group[0].value, group[0].base).text(prefix) for key, group in merged]
        out.append((f"{kind} under {prefix}" if prefix else kind, items))
    return out


def print_changes(head: str, changes: list[Change], extra: list[str], console: Console) -> None:
    """One run's part: ``head``, then its changes grouped by kind (``override: a=1  ~b  +c=2``), filled into
    lines of at most :data:`INLINE_WIDTH` columns from the head line on, each kind after the first on a new
    line (see :func:`_groups` for the brace and prefix notation); ``extra`` lines (notes, what was left out of
    this run only) after them."""
    if not changes:
        _print(console, f"{head}: the base launch")
    else:
        lines = [f"{head}:"]
        for n, (label, items) in enumerate(_groups(changes)):
            if n or len(lines[-1]) + len(label) + 2 > INLINE_WIDTH:
                lines.append(f"{INDENT}{label}:")
            else:
                lines[-1] += f" {label}:"
            fresh = True  # the line ends with the label
            for item in items:
                sep = " " if fresh else "  "
                if len(lines[-1]) + len(sep) + len(item) <= INLINE_WIDTH:
                    lines[-1] += sep + item
                else:
                    lines.append(f"{INDENT}  {item}")
                fresh = False
        for line in lines:
            _print(console, line)
    for x in extra:
        _print(console, f"{INDENT}{x}")


def _merged(run) -> str | None:
    if len(run.cells) <= 1:
        return None
    spread = {k: sorted({c[k] for c in run.cells}) for k in run.cells[0]}
    varying = ", ".join(f"{k} in {v}" for k, v in spread.items() if len(v) > 1)
    return f"stands for {len(run.cells)} design cells that differ only in not-applicable factors ({varying})"


def not_read_factors(plan: Plan) -> dict[str, str]:
    """Per factor the plan sets, why the installed stack of its platform does not read the factor's switch
    (:func:`bench.spec.optimizations.not_read`: ``"mc2: not read by vllm-ascend X (...)"``)."""
    versions = stack_versions(plan.platform)
    keys = dict.fromkeys(k for r in plan.runs for k, v in r.levels.items() if v is not None and k in REGISTRY)
    return {k: why for k in keys if (why := not_read(k, plan.engine, plan.platform, versions))}


def print_dry_run(plan: Plan, console: Console) -> None:
    """The readable ``--dry-run`` of a plan (see the module docstring); the run order is printed apart
    (:func:`print_order`), and other parts (a run plan) are separate calls after this one."""
    with_config = engine_class(plan.engine).shows_config
    runs = plan.runs
    _print(console, f"{plan.matrix_name}: engine={plan.engine} platform={plan.platform} design cells="
                    f"{plan.design_cells} runs={len(runs)} x {plan.repeats} repeat(s) dropped={len(plan.dropped)}")
    if plan.resolution:
        _print(console, f"fractional design, resolution {plan.resolution}; aliases of main effects:")
        for line in plan.aliases[: len(plan.varied)]:
            _print(console, f"  {line}")
    if not runs:
        return
    base = runs[0]
    common_notes = [n for n in base.launch.notes if all(n in r.launch.notes for r in runs)]
    _print(console, f"\nbase launch = run 1, {base.label} ({base.cell_id}); each run below lists only what "
                    "differs from it:")
    print_base_launch(base.launch, console, with_config=with_config, notes=common_notes)

    merged = Counter(_merged(r) for r in runs)
    common_merged = next(iter(merged)) if len(merged) == 1 else None
    not_applicable = {k: w for r in runs for k, w in r.not_applicable.items()}
    left = [f"not applicable {k}: {why}" for k, why in not_applicable.items()]
    left += [f"{why}: its effect is not measured" for why in not_read_factors(plan).values()
             if why not in common_notes]
    if common_merged:
        left.append(f"merged: each run {common_merged}")
    else:
        left += [f"merged: run {i}, {r.label}, {_merged(r)}" for i, r in enumerate(runs, 1) if _merged(r)]
    for (kind, reason), n in Counter((d.kind, d.reason) for d in plan.dropped).items():
        left.append(f"dropped {n} {kind} design cell(s): {reason} (--verbose lists them)")
    _print_parts("left out, and why", left, "runs",
                 [(f"{run.label} ({run.cell_id})", launch_diff(base.launch, run.launch, with_config),
                   [f"note: {n}" for n in run.launch.notes if n not in common_notes]) for run in runs], console)


def _print_parts(heading: str, left: list[str], what: str, parts: list[tuple[str, list[Change], list[str]]],
                 console: Console) -> None:
    """What was left out (``heading`` over the lines ``left``, when any), then the numbered per-run parts
    (head, changes, extra lines) under ``what``, with the notation where a part has changes."""
    if left:
        _print(console, f"\n{heading}:")
        for x in left:
            _print(console, f"  {x}")
    _print(console, f"\n{what} (what differs from the base launch):")
    for line in LEGEND if any(changes for _, changes, _ in parts) else ():
        _print(console, line)
    width = len(str(len(parts)))
    for i, (head, changes, extra) in enumerate(parts, 1):
        print_changes(f"  {i:>{width}}. {head}", changes, extra, console)


def print_smoke_dry_run(cells: list, console: Console, *, matrix_name: str = "", steps: int = 2,
                        not_exercised: dict[str, str] | None = None) -> None:
    """The readable dry run of ``run --smoke``: the first cell's CPU launch in full, what every cell leaves
    out (and why) once, then per cell its differences and what it alone leaves out.

    Args:
        cells: :class:`bench.engines.verl_cpu.smoke.SmokeCell` list (``spec``, ``source_label``,
            ``left_out``, ``inert``).
        not_exercised: factors without effect on the CPU target, with the reason.
    """
    if not cells:
        return
    _print(console, f"{matrix_name} --smoke: {len(cells)} cell(s), each its own launch on this CPU for {steps} "
                    "step(s) with the tiny model")
    base = cells[0]
    _print(console, f"\nbase launch = smoke cell of {base.source_label} ({base.spec.cell_id}); each cell below "
                    "lists only what differs from it:")
    notes = [n for n in base.spec.launch.notes if all(n in c.spec.launch.notes for c in cells)]
    print_base_launch(base.spec.launch, console, with_config=False, notes=notes)
    def items(c) -> list[str]:  # an inert variable's value is in the launch: the item names the variable
        return c.left_out + [re.sub(r"^([A-Za-z_]\w*)=[^:]*:", r"\1:", x) for x in c.inert]

    every = [x for x in items(base) if all(x in items(c) for c in cells)]
    left = [f"not exercised on CPU: {k}: {why}" for k, why in (not_exercised or {}).items()] + every
    _print_parts("left out or inert in every cell, and why", left, "cells",
                 [(f"{c.source_label} -> smoke cell {c.spec.cell_id}",
                   launch_diff(base.spec.launch, c.spec.launch, False),
                   [f"note: {n}" for n in c.spec.launch.notes if n not in notes]
                   + [f"left out / inert: {x}" for x in items(c) if x not in every]) for c in cells], console)


def plan_json(plan: Plan, order: RunOrder | None = None) -> dict[str, Any]:
    """Everything of the plan, machine-readable (``--dry-run --json``): the plan's fields with every run's
    full launch (argv, env, patches, config, notes), the dropped cells and the run order."""
    out = plan.model_dump(mode="json")
    out["not_read"] = not_read_factors(plan)
    for run, data in zip(plan.runs, out["runs"]):
        data["label"] = run.label
    if order is not None:
        out["order"] = order.model_dump(mode="json")
    return out


def smoke_json(cells: list, *, matrix_name: str = "", steps: int = 2,
               not_exercised: dict[str, str] | None = None) -> dict[str, Any]:
    """Every smoke launch, machine-readable (``--smoke --dry-run --json``)."""
    return {"matrix_name": matrix_name, "smoke_steps": steps, "not_exercised": not_exercised or {},
            "cells": [{"source_label": c.source_label, **c.spec.model_dump(mode="json"), "left_out": c.left_out,
                       "inert": c.inert} for c in cells]}


__all__ = ["Change", "not_read_factors", "split_argv", "launch_diff", "print_dry_run", "print_smoke_dry_run",
           "print_base_launch", "print_changes", "plan_json", "smoke_json", "print_order", "print_plan"]


# -- the full listing (--verbose) and the run order ----------------------------------------------------------
def _levels(levels: dict[str, int | None]) -> str:
    return " ".join(f"{k}={'n/a' if v is None else v}" for k, v in levels.items())


def print_order(plan: Plan, order: RunOrder, console: Console) -> None:
    """The execution order of the runs (``--dry-run``): kind, seed, and per block the cells in turn."""
    labels = {r.cell_id: r.label for r in plan.runs}
    seed = (
        f", seed {order.seed} (pass --order-seed {order.seed} to run exactly this order)"
        if order.seed is not None
        else ""
    )
    console.print(f"\n[bold]run order[/]: {order.kind}{seed}; {len(order.runs)} runs", markup=True)
    for i, (cid, k) in enumerate(order.runs, 1):
        block = f"block {k} " if order.blocked() else ""
        console.print(f"  {i:>3}. {block}{labels.get(cid, cid)} ({cid}) r{k}", markup=False)


def print_plan(plan: Plan, console: Console) -> None:
    """The ``--dry-run`` listing: runs with argv/env/patches, merged cells, dropped cells and why."""
    console.print(f"[bold]{plan.matrix_name}[/]: engine={plan.engine} platform={plan.platform} "
                  f"design cells={plan.design_cells} runs={len(plan.runs)} x {plan.repeats} repeat(s) "
                  f"dropped={len(plan.dropped)}")
    if plan.resolution:
        console.print(f"fractional design, resolution {plan.resolution}; aliases of main effects:")
        for line in plan.aliases[: len(plan.varied)]:
            console.print(f"  {line}")
    na = {k: r for r in plan.runs for k, r in r.not_applicable.items()}
    for key, reason in na.items():
        console.print(f"not applicable {key}: {reason}", markup=False)
    for i, run in enumerate(plan.runs, 1):
        console.print(f"\n[bold]run {i}/{len(plan.runs)}[/] cell {run.cell_id} ({run.label})")
        console.print(f"  levels: {_levels(run.levels)}")
        if len(run.cells) > 1:
            spread = {k: sorted({c[k] for c in run.cells}) for k in run.cells[0]}
            varying = " ".join(f"{k} in {v}" for k, v in spread.items() if len(v) > 1)
            console.print(
                f"  merged {len(run.cells)} design cells that differ only in not-applicable factors: {varying}"
            )
        launch = run.launch
        console.print(f"  argv: {json.dumps(launch.argv)}", soft_wrap=True, markup=False)
        console.print(f"  env: {json.dumps(launch.env, sort_keys=True)}", soft_wrap=True, markup=False)
        console.print(f"  patches: {json.dumps(launch.patches)}", markup=False)
        if launch.config and engine_class(plan.engine).shows_config:
            console.print(f"  {launch.config_file}: {json.dumps(launch.config, sort_keys=True)}", soft_wrap=True,
                          markup=False)
        for note in launch.notes:
            console.print(f"  note: {note}", markup=False)
    for d in plan.dropped:
        console.print(f"dropped ({d.kind}) {_levels(d.cell)}: {d.reason}", markup=False)


def print_stacks(stacks: dict[str, Any], console: Console) -> None:
    """Each stack of the ``stack`` factor once: its interpreter, the folders first on the path (a revision's
    checkout, shown with the tree and revision it stands for), its variables and the versions its probe imported."""
    if not stacks:
        return
    console.print("stacks (each run of a stack uses its interpreter, paths and env):", markup=False)
    for name, st in stacks.items():
        console.print(f"  {name}: python {st.python}", markup=False, soft_wrap=True)
        for folder, tree in zip(st.paths, st.trees):
            rev = f" at {tree['rev']} ({(tree.get('commit') or '')[:12]}), checked out in {folder}" if tree.get(
                "rev") else ""
            console.print(f"    path {tree['path']}{rev}", markup=False, soft_wrap=True)
        for key, value in st.env.items():
            console.print(f"    env {key}={value}", markup=False, soft_wrap=True)
        found = flat_run_versions(st.versions)
        if found:
            console.print("    imports " + ", ".join(f"{k} {v}" for k, v in found.items()), markup=False,
                          soft_wrap=True)
