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
"""

from __future__ import annotations

from typing import Any

from bench.core.errors import BenchError
from bench.execution.executors import Executor, LocalExecutor
from bench.execution.forkserver import ForkServerExecutor
from bench.execution.stacks import OpenStack, StackExecutor
from bench.gate.versions import BASELINE, CANDIDATE
from bench.spec.matrix import Matrix
from bench.spec.stack import STACK_FACTOR


def check_stack_sides(matrix: Matrix, names: tuple[str, str] | list[str]) -> tuple[str, str]:
    """``(baseline, candidate)`` stack names, checked against ``matrix`` before anything runs.

    Raises:
        BenchError: not two names, a name not declared under ``stacks:``, the same name twice, or a matrix that
            lists the ``stack`` factor itself (one line naming ``--stacks`` or the matrix key).
    """
    where = matrix.source or matrix.name
    declared = ", ".join(matrix.stacks) or "none declared"
    if len(names) != 2:
        raise BenchError(f"--stacks {' '.join(names)}: give two stack names, BASELINE CANDIDATE")
    for n in names:
        if n not in matrix.stacks:
            raise BenchError(f"--stacks {n}: not a stack of {where} (allowed: the names under its key stacks: "
                             f"{declared})")
    if names[0] == names[1]:
        raise BenchError(f"--stacks {names[0]} {names[1]}: the same stack on both sides (allowed: two different "
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


__all__ = ["check_stack_sides", "stack_executor", "stack_sides"]
