"""A stack: the user's software under test, as a typed value (issue 43).

A matrix may declare named stacks at its top level and use them as the levels of the ``stack`` factor::

    stacks:
      verl-0.9.0: {python: ${HOME}/venvs/verl090/bin/python}
      my-fork:
        paths: [{path: ${HOME}/src/verl, rev: 3f2a9c1}]   # that repo at that revision, first on the path
        env: {VLLM_USE_V1: "1"}
    factors: {stack: [verl-0.9.0, my-fork], dynamic_bsz: [0, 1]}

Each stack holds the interpreter its runs use (:attr:`Stack.python`; ``None``: the harness's own), the source
trees put first on their ``PYTHONPATH`` (:attr:`Stack.paths`, each optionally at a git revision of its own
repository) and the environment variables it sets (:attr:`Stack.env`). Inside the harness the factor's
levels are the stacks' positions in the factor's list (``0, 1, ...``; the first is the reference, like an
optimization's off level); :data:`STACK_FACTOR` names the factor and the run's ``BENCH_STACK`` variable
names its stack (so the stack enters the cell id only where a matrix lists the factor).

What is checked when the file is read: the shape of each stack and that every level of the factor names a
declared stack. What needs the machine (the interpreter exists, the tree is a git repository, the revision
exists, the stack imports its engine's packages) is checked before a sweep starts, by
:func:`bench.execution.stacks.open_stacks`.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bench.core.errors import did_you_mean
from bench.spec.base_checks import check_env

#: the factor whose levels are stacks (a matrix ``factors`` key beside the optimizations)
STACK_FACTOR = "stack"
#: the variable every run of a stack factor carries: its stack's name (names the cell; routes the run)
STACK_ENV = "BENCH_STACK"
#: variables a stack may not set: the harness owns them (``paths`` is how a stack changes ``PYTHONPATH``)
RESERVED_ENV = ("PYTHONPATH", STACK_ENV, "BENCH_RUN_DIR", "BENCH_PATCHES", "BENCH_CODE_VERSION")
#: the longest stack name (it appears in labels and MLflow params)
MAX_STACK_NAME = 60


class StackPath(BaseModel):
    """A source tree put first on the path of a stack's runs.

    Attributes:
        path: a folder (``${VAR}`` expanded when the matrix is read); with ``rev``, a folder inside a git
            repository (its root or a sub-folder, e.g. the folder holding a package).
        rev: a git revision of that folder's OWN repository (a sha, tag or branch); the repository is checked
            out at it, detached, into a temporary ``git worktree`` for the sweep's duration (removed after,
            however the sweep ends), and the runs import from the same sub-folder of that checkout.
            ``None``: the folder as it is.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    path: str = Field(min_length=1)
    rev: str | None = Field(None, min_length=1)


class Stack(BaseModel):
    """One stack: interpreter, source trees first on the path, environment variables.

    Attributes:
        python: the interpreter of the venv its runs use (a path to ``bin/python``); ``None``: the harness's own.
        paths: source trees put first on ``PYTHONPATH``, in order (a string is ``{path: ...}``).
        env: variables set for every process of its runs (a factor's own variables still decide their keys).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    python: str | None = Field(None, min_length=1)
    paths: list[StackPath] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("paths", mode="before")
    @classmethod
    def _paths(cls, value: Any) -> Any:
        if isinstance(value, (str, dict)):
            value = [value]
        if isinstance(value, list):
            return [{"path": v} if isinstance(v, str) else v for v in value]
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        value = check_env(value)
        bad = next((k for k in value if k in RESERVED_ENV), None)
        if bad is not None:
            raise ValueError(f"{bad}: set by the harness (allowed: any other variable; put source trees under "
                             "paths)")
        return value

    def is_harness(self) -> bool:
        """Whether the stack is the harness's own environment unchanged (no interpreter, path or variable)."""
        return self.python is None and not self.paths and not self.env


def check_stack_names(names: list[str], declared: dict[str, Any]) -> None:
    """Check the levels of the ``stack`` factor against the declared stacks.

    Raises:
        ValueError: a level that is not a string, a level twice, no level, or a name not declared under
            ``stacks`` (with the declared names).
    """
    known = ", ".join(declared) or "none declared"
    if not names:
        raise ValueError(f"factors.{STACK_FACTOR}: levels must be non-empty (allowed: names under stacks: {known})")
    for name in names:
        if not isinstance(name, str):
            raise ValueError(f"factors.{STACK_FACTOR}: level {name!r} is not a stack name (allowed: {known})")
        if name not in declared:
            raise ValueError(f"factors.{STACK_FACTOR}: unknown stack {name!r}{did_you_mean(name, list(declared))} "
                             f"(allowed: {known}; declare it under stacks)")
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise ValueError(f"factors.{STACK_FACTOR}: {twice!r} is listed twice (allowed: each stack once)")


def level_text(key: str, value: Any, stack_names: Sequence[str] = ()) -> str:
    """How factor ``key`` at ``value`` reads to a user, the one place that says it (cell labels, the report's cell
    table and effect rows, MLflow run names): the stack's name for the ``stack`` factor (``value`` a position in
    ``stack_names``, the factor's names in order), ``n/a`` for ``None`` (not applicable), else the level as is."""
    if value is None:
        return "n/a"
    if key == STACK_FACTOR and isinstance(value, int) and 0 <= value < len(stack_names):
        return str(stack_names[value])
    return str(value)


def stack_names_of(cells: Iterable[Any]) -> list[str]:
    """The ``stack`` factor's names in position order, read from cells that carry both their ``levels`` and their
    ``stack`` name (plan runs, snapshot cells; dicts or objects); ``[]`` without the factor."""
    got: dict[int, str] = {}
    for c in cells:
        levels = c.get("levels") if isinstance(c, dict) else getattr(c, "levels", None)
        name = c.get("stack") if isinstance(c, dict) else getattr(c, "stack", None)
        if name and isinstance((levels or {}).get(STACK_FACTOR), int):
            got[levels[STACK_FACTOR]] = name
    return [got.get(i, str(i)) for i in range(max(got) + 1)] if got else []


__all__ = ["MAX_STACK_NAME", "RESERVED_ENV", "STACK_ENV", "STACK_FACTOR", "Stack", "StackPath", "check_stack_names",
           "level_text", "stack_names_of"]
