"""The two sides of a gate between stacks (``gate --stacks BASE CAND --matrix M``, issue 43).

The interleaved gate (:mod:`bench.gate.interleaved`) compares a baseline and a candidate run by run in one
blocked sweep. Here both sides run this checkout's harness, and each side's runs execute in its own stack
(:mod:`bench.spec.stack`: interpreter, source trees, variables), declared under the matrix's ``stacks:``:
:func:`stack_sides` checks the two names and gives each code version the stack it names (key ``stack``, read by
:meth:`bench.execution.sweep.Sweep._run_one`); :func:`stack_executor` starts ONE fork server per stack, both
started the same way (:class:`bench.execution.stacks.StackExecutor`), so neither side has a start-up path the
other lacks. The comparison and its decision are the interleaved gate's own (:class:`GateStopRule`); nothing
here judges.

Two sides with the same name would share one fork server and be one stack: refused. An A/A check declares
the same stack twice under two names (``a: {}``, ``b: {}``): two servers, started alike.

A side may be **a stack at a revision of its own tree**, ``NAME@REV`` (:func:`pin_stack_sides`): the stack ``NAME``
with the source tree whose git repository the revision belongs to (:func:`stack_tree`) checked out at ``REV``; its
interpreter, other trees and variables as declared. ``gate --stacks fork@v0.9.0 fork`` compares a verl fork's tag
with its working tree, ``bisect --stack fork`` probes two commits of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.core.errors import BenchError, InputError
from bench.execution.executors import Executor, LocalExecutor
from bench.execution.forkserver import ForkServerExecutor
from bench.execution.stacks import OpenStack, StackExecutor, git
from bench.gate.versions import BASELINE, CANDIDATE
from bench.spec.matrix import Matrix
from bench.spec.stack import MAX_STACK_NAME, STACK_FACTOR, Stack, StackPath

#: the input naming a stack whose tree is bisected or pinned (a command prints its flag: bench.commands.base.FLAGS)
STACK = "stack"
#: the input naming the gate's two sides (``--stacks`` on the command line)
SIDES = "stacks"
#: ``NAME@REV``: a side that is a stack at a revision of its source tree
REV_SEP = "@"


def stack_tree(matrix: Matrix, stack: str, repo: Path | None = None, label: str = STACK) -> tuple[int, Path, Path]:
    """``(i, folder, repository)``: the source tree of the matrix's stack ``stack`` whose commits a bisection walks or
    a pinned side checks out: its ``paths[i]``, the first one inside a git repository, or the one in ``repo``.

    Raises:
        InputError: (starting with ``label``) ``stack`` not declared under ``stacks:``, none of its paths in a git
            repository; (``repository``) ``repo`` not the repository of one of them. One line each.
    """
    where = matrix.source or matrix.name
    if stack not in matrix.stacks:
        raise InputError(label, f"{label} {stack}: not a stack of {where} (allowed: the names under its key stacks: "
                         f"{', '.join(matrix.stacks) or 'none declared'})")
    trees = []
    for i, sp in enumerate(matrix.stacks[stack].paths):
        folder = Path(sp.path).expanduser()
        top = git(folder, "rev-parse", "--show-toplevel") if folder.is_dir() else None
        if top is not None and top.returncode == 0:
            trees.append((i, folder.absolute(), Path(top.stdout.strip()).resolve()))
    if repo is not None:
        want = Path(repo).expanduser().resolve()
        hit = [t for t in trees if want in (t[2], t[1].resolve())]
        if not hit:
            allowed = ", ".join(str(t[2]) for t in trees) or "none: no path of it is in a git repository"
            raise InputError("repository", f"repository {repo}: not the git repository of a source tree of stack "
                             f"{stack} (allowed: {allowed})")
        return hit[0]
    if not trees:
        raise InputError(label, f"{label} {stack}: none of its paths is inside a git repository (allowed: a stack "
                         "whose source tree is a git checkout, e.g. paths: [{path: ~/verl-fork}])")
    return trees[0]


def pinned_name(stack: str, sha: str) -> str:
    """The name of the stack ``stack`` pinned at commit ``sha``: ``NAME-<sha 10>`` (``NAME`` cut so that it stays
    within :data:`bench.spec.stack.MAX_STACK_NAME`)."""
    return f"{stack[:MAX_STACK_NAME - 11]}-{sha[:10]}"


def pin_stack_sides(matrix: Matrix, names: tuple[str, str] | list[str], repo: Path | None = None,
                    label: str = SIDES) -> tuple[str, str]:
    """The gate's two side names with each ``NAME@REV`` replaced by a stack of its own, added to ``matrix.stacks`` (in
    memory; the sweep records it): ``NAME`` with its tree (:func:`stack_tree`, ``repo`` picks one) at the commit
    ``REV`` resolves to, named :func:`pinned_name`. A name without ``@`` is returned as it is.

    Raises:
        InputError: (starting with ``label``) an empty name or revision, an unknown revision of the tree's repository,
            a pinned name that the matrix already declares otherwise; :func:`stack_tree`'s.
    """
    if len(names) != 2:  # check_stack_sides names it
        return tuple(names)  # type: ignore[return-value]
    out = []
    for text in names:
        name, sep, rev = str(text).partition(REV_SEP)
        if not sep:
            out.append(name)
            continue
        if not name or not rev:
            raise InputError(label, f"{label} {text}: a side at a revision is NAME@REV (allowed: a stack of the matrix "
                             "and a commit, tag or branch of its source tree)")
        i, folder, top = stack_tree(matrix, name, repo, label=label)
        res = git(top, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
        if res.returncode != 0 or not res.stdout.strip():
            raise InputError(label, f"{label} {text}: {rev!r} is not a revision of {top} (allowed: a commit, tag or "
                             "branch there)")
        sha = res.stdout.strip()
        decl = matrix.stacks[name]
        paths = list(decl.paths)
        paths[i] = StackPath(path=str(folder), rev=sha)
        pinned = Stack(python=decl.python, paths=paths, env=dict(decl.env))
        new = pinned_name(name, sha)
        if new in matrix.stacks and matrix.stacks[new] != pinned:
            raise InputError(label, f"{label} {text}: the matrix declares a stack named {new} already (allowed: "
                             "rename that stack)")
        matrix.stacks[new] = pinned
        out.append(new)
    return out[0], out[1]


def check_stack_sides(matrix: Matrix, names: tuple[str, str] | list[str]) -> tuple[str, str]:
    """``(baseline, candidate)`` stack names, checked against ``matrix`` before anything runs.

    Raises:
        BenchError: not two names, a name not declared under ``stacks:``, the same name twice, or a matrix that
            lists the ``stack`` factor itself (one line naming ``--stacks`` or the matrix key).
    """
    where = matrix.source or matrix.name
    declared = ", ".join(matrix.stacks) or "none declared"
    if len(names) != 2:
        raise InputError(SIDES, f"{SIDES} {' '.join(names)}: give two stack names, BASELINE CANDIDATE")
    for n in names:
        if n not in matrix.stacks:
            raise InputError(SIDES, f"{SIDES} {n}: not a stack of {where} (allowed: the names under its key stacks: "
                             f"{declared})")
    if names[0] == names[1]:
        raise InputError(SIDES, f"{SIDES} {names[0]} {names[1]}: the same stack on both sides (allowed: two different "
                         "names; for an A/A check declare the same stack twice under two names, e.g. a: {} and b: {})")
    if STACK_FACTOR in matrix.factors:
        raise BenchError(f"{where}: factors.stack: a gate between stacks puts the two stacks on its two sides "
                         "(allowed: a matrix that does not list the stack factor)")
    return names[0], names[1]


def stack_sides(candidate: dict[str, Any], names: tuple[str, str]) -> dict[str, dict[str, Any]]:
    """The gate's two code versions, both this checkout (``candidate``, :func:`bench.gate.versions.candidate_version`)
    in a stack of their own: ``{"baseline": {..., "ref": "stack BASE", "kind": "stack", "stack": BASE},
    "candidate": {..., "ref": "stack CAND", "kind": "stack", "stack": CAND}}``."""
    return {side: {**candidate, "ref": f"stack {name}", "kind": "stack", "stack": name}
            for side, name in zip((BASELINE, CANDIDATE), names)}


def stack_executor(stacks: dict[str, OpenStack], fork: bool) -> Executor:
    """One fork server per stack, each in its stack's interpreter with its paths and variables (``fork``), else a
    fresh process per run (the launch carries the stack's interpreter, paths and variables)."""
    if not fork:
        return LocalExecutor()
    return StackExecutor(lambda st: ForkServerExecutor(python=st.python, paths=st.paths, env=st.env), stacks)


__all__ = ["check_stack_sides", "pin_stack_sides", "pinned_name", "stack_executor", "stack_sides", "stack_tree"]
