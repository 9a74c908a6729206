"""The stacks of a sweep on this machine: checked, checked out and probed before anything runs
(:func:`open_stacks`), and each stack's runs executed in its own interpreter (:class:`StackExecutor`).

A matrix's stacks (:mod:`bench.spec.stack`) name interpreters, source trees and git revisions of this
machine. Before a sweep (or a ``--dry-run``) writes anything, :func:`open_stacks` checks, per stack, in the
order of the ``stack`` factor: the interpreter exists and is executable; each source tree is a folder; a tree
with a ``rev`` lies inside a git repository and the revision exists there; then it checks each revision out
(detached, ``git worktree add``, into a temporary folder removed with ``git worktree remove --force`` and
``prune`` when the block ends, however it ends) and runs the stack's interpreter with its paths and variables
to ``import`` the packages its engine needs (:meth:`bench.engines.base.EngineBase.stack_packages`); the probe
also reads the versions that interpreter imports. Each failure is one :class:`~bench.core.errors.BenchError`
naming the matrix file and the key (``stacks.<name>.python``, ``stacks.<name>.paths[i].rev`` ...).

Runs: :func:`bench.execution.runner.execute_spec` gives a stack's run its interpreter (``{python}`` and the
engine's interpreter placeholders, e.g. the verl engine's ``{verl_python}``), its source trees first on
``PYTHONPATH`` (after ``patches/``, before the harness's checkout) and its variables under the launch's own
(a factor still decides its own variables). A run started as a fresh process (:class:`LocalExecutor`) needs
nothing more. A run forked from a warm server must not fork from a server that imported torch/verl from
another interpreter or path: :class:`StackExecutor` starts ONE fork server per stack, in that stack's
interpreter with its paths and variables, the way the side-by-side gate starts one pinned server per code
version (:class:`~bench.execution.forkserver.ForkServerExecutor` with ``repo_root``; here with ``python``,
``paths`` and ``env``), and sends each run to its stack's server by the launch's ``BENCH_STACK``. One server
per stack (not plain subprocesses) keeps the fork server's saving (the imports, several seconds per run on 2
cores) for every stack alike, so the stack comparison is not also a comparison of start-up paths.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from bench.core.errors import BenchError
from bench.core.process import ExecResult
from bench.engines.base import capability
from bench.execution.executors import PATCHES_DIR, Executor, ResolvedLaunch, close_executors
from bench.spec.launch import REPO_ROOT
from bench.spec.matrix import Matrix
from bench.spec.stack import STACK_ENV, Stack

#: seconds the import probe of one stack may take (torch + transformers + verl on a loaded 2-core machine)
PROBE_TIMEOUT_S = 300.0


@dataclass
class OpenStack:
    """A stack ready for its runs: absolute interpreter, the folders put first on the path (a revision's
    checkout in place of its tree), its variables, and what the probe found.

    Attributes:
        name: the stack's name in the matrix.
        python: the interpreter (absolute path); the harness's own when the stack names none.
        paths: folders first on ``PYTHONPATH``, in order.
        env: the stack's variables.
        trees: per declared source tree ``{"path", "rev", "commit"}`` (``commit``: the revision's sha, or the
            tree's HEAD when it is a git checkout used as it is, else ``None``).
        versions: what the probe's process imported (:func:`bench.core.metadata.run_versions`).
        harness: the stack is the harness's own environment unchanged (its runs may share the harness's executor).
    """

    name: str
    python: str
    paths: list[str]
    env: dict[str, str]
    trees: list[dict[str, Any]] = field(default_factory=list)
    versions: dict[str, Any] = field(default_factory=dict)
    harness: bool = False

    def describe(self) -> dict[str, Any]:
        """What ``sweep.json`` and ``--dry-run`` show of the stack: interpreter, trees, variables, versions."""
        return {"python": self.python, "paths": self.paths, "trees": self.trees, "env": self.env,
                "versions": self.versions}


def git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    """``git -C repo ARGS`` (output captured as text, 120 s at most); the caller reads its return code."""
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)


@contextlib.contextmanager
def git_worktree(repo: Path, commit: str, prefix: str = "bench-tree-") -> Iterator[Path]:
    """``repo`` checked out at ``commit``, detached, into a temporary ``git worktree`` (its folder yielded),
    removed when the block ends, however it ends (``worktree remove --force --force``, also a worktree an interrupted
    add left locked; the folder; ``worktree prune``).

    Raises:
        BenchError: ``git worktree add`` failed (git's last line).
    """
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    tree = tmp / "tree"
    try:
        res = git(repo, "worktree", "add", "--detach", str(tree), commit)
        if res.returncode != 0:
            raise BenchError(f"git worktree add {commit} in {repo}: "
                             f"{((res.stderr or res.stdout).strip().splitlines() or [''])[-1]}")
        yield tree
    finally:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            # twice --force: an add cut short (Ctrl-C while git checks out) leaves the worktree locked, which one
            # --force does not remove and prune skips
            git(repo, "worktree", "remove", "--force", "--force", str(tree))
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            git(repo, "worktree", "prune")


def _check_python(where: str, name: str, stack: Stack) -> str:
    import sys

    if stack.python is None:
        return sys.executable
    py = Path(stack.python).expanduser()
    if not py.is_file() or not os.access(py, os.X_OK):
        raise BenchError(f"{where}: stacks.{name}.python: {stack.python} "
                         f"{'is not an executable file' if py.exists() else 'does not exist'} (allowed: the "
                         "interpreter of a virtual environment, e.g. <venv>/bin/python)")
    return str(py.absolute())  # not resolved: a venv's bin/python is a link to the base interpreter


def _check_tree(where: str, key: str, path: str, rev: str | None) -> tuple[Path, Path | None, str | None]:
    """``(folder, repository root or None, commit or None)`` of one source tree."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise BenchError(f"{where}: {key}.path: {path} is not a folder (allowed: a source tree to put first on "
                         "the path)")
    top = git(folder, "rev-parse", "--show-toplevel")
    if rev is None:
        head = git(folder, "rev-parse", "HEAD") if top.returncode == 0 else None
        return folder.resolve(), None, head.stdout.strip() if head is not None and head.returncode == 0 else None
    if top.returncode != 0:
        raise BenchError(f"{where}: {key}.rev: {rev}: {path} is not inside a git repository (allowed: rev only "
                         "for a tree in a git repository; leave rev out to use the folder as it is)")
    commit = git(folder, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if commit.returncode != 0:
        raise BenchError(f"{where}: {key}.rev: {rev!r} is not a revision of the repository {top.stdout.strip()} "
                         "(allowed: a commit, tag or branch there)")
    return folder.resolve(), Path(top.stdout.strip()).resolve(), commit.stdout.strip()


def stack_launch_env(stack: OpenStack, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a process of ``stack`` starts with: ``base`` (default this process's) without the run's
    own variables, the stack's variables over it, its trees then the harness's checkout first on ``PYTHONPATH``."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in ("BENCH_PATCHES", "BENCH_RUN_DIR")}
    env.update(stack.env)
    rest = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join([*stack.paths, str(REPO_ROOT), *([rest] if rest else [])])
    return env


def probe(stack: OpenStack, packages: tuple[str, ...], patches: tuple[str, ...] = ()) -> subprocess.Popen:
    """Start the import probe of ``stack`` (its interpreter, paths and variables): imports ``packages`` in order,
    then prints :func:`bench.core.metadata.run_versions` as JSON; on the first import that fails, prints
    ``{"failed": name, "error": ...}`` and exits 3. Read it with :func:`probe_result`.

    ``patches``: runtime patch specs the probe applies as a run of its engine does (``patches/`` first on the
    path, ``BENCH_PATCHES``; :meth:`bench.engines.base.EngineBase.stack_probe_patches`), so that it imports
    what a run can; no run folder, so no patch report is written."""
    code = ("import importlib, json, sys\n"
            "sys.modules.setdefault('sklearn', None)\n"
            f"for name in {list(packages)!r}:\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "    except BaseException as exc:\n"
            "        print(json.dumps({'failed': name, 'error': f'{type(exc).__name__}: {exc}'[:300]}))\n"
            "        sys.exit(3)\n"
            "from bench.core.metadata import run_versions\n"
            "print(json.dumps(run_versions()))\n")
    env = stack_launch_env(stack)
    if patches:
        env["PYTHONPATH"] = os.pathsep.join([str(PATCHES_DIR), env["PYTHONPATH"]])
        env["BENCH_PATCHES"] = ",".join(patches)
    return subprocess.Popen([stack.python, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tempfile.gettempdir(), start_new_session=True)


def probe_result(where: str, name: str, proc: subprocess.Popen, timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """The versions the probe read, or one line naming what the stack cannot import.

    Raises:
        BenchError: an import failed, the interpreter failed, or the probe ran past ``timeout_s``.
    """
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, 9)
        proc.communicate()
        raise BenchError(f"{where}: stacks.{name}: importing its engine's packages took over {timeout_s:g} s") from None
    last = (out.strip().splitlines() or [""])[-1]
    try:
        got = json.loads(last)
    except ValueError:
        got = None
    if isinstance(got, dict) and got.get("failed"):
        raise BenchError(f"{where}: stacks.{name}: cannot import {got['failed']} with its interpreter, paths and "
                         f"env: {' '.join(str(got.get('error')).split())}")
    if proc.returncode != 0 or not isinstance(got, dict):
        tail = ((err or out).strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise BenchError(f"{where}: stacks.{name}: its interpreter could not run the import probe: {tail[:300]}")
    return got


@contextlib.contextmanager
def open_stacks(matrix: Matrix, platform: str, names: list[str] | None = None) -> Iterator[dict[str, OpenStack]]:
    """The matrix's stacks of the ``stack`` factor (or the declared stacks ``names``, e.g. the two sides of a gate
    between stacks, :mod:`bench.gate.stacks`), checked, checked out and probed (module docstring), for the
    duration of the block; ``{}`` for a matrix without the factor and no ``names``. Every worktree made here is
    removed when the block ends, also when a check fails half-way.

    Raises:
        BenchError: one line naming the matrix file and the key of the first problem.
    """
    names = list(matrix.stack_levels) if names is None else names
    if not names:
        yield {}
        return
    where = matrix.source or matrix.name
    packages = tuple(capability(matrix.engine, "stack_packages")(platform))
    patches = tuple(capability(matrix.engine, "stack_probe_patches")(platform))
    with contextlib.ExitStack() as trees:
        out: dict[str, OpenStack] = {}
        for name in names:
            stack = matrix.stacks[name]
            python = _check_python(where, name, stack)
            paths, meta = [], []
            for i, sp in enumerate(stack.paths):
                folder, repo, commit = _check_tree(where, f"stacks.{name}.paths[{i}]", sp.path, sp.rev)
                if repo is not None:  # the same sub-folder of the revision's checkout
                    checkout = trees.enter_context(git_worktree(repo, commit, prefix=f"bench-stack-{name}-"))
                    folder = checkout / folder.relative_to(repo)
                paths.append(str(folder))
                meta.append({"path": sp.path, "rev": sp.rev, "commit": commit})
            out[name] = OpenStack(name=name, python=python, paths=paths, env=dict(stack.env), trees=meta,
                                  harness=stack.is_harness())
        procs = {name: probe(s, packages, patches) for name, s in out.items()}  # in parallel: each imports for seconds
        try:
            for name, proc in procs.items():
                out[name].versions = probe_result(where, name, proc)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, 9)
                    proc.communicate()
        yield out


class StackExecutor:
    """Sends each run to its stack's executor (by the launch's ``BENCH_STACK``): one fork server per stack,
    started in the stack's interpreter with its paths and variables (module docstring).

    Args:
        make: ``make(stack) -> Executor`` (e.g. a :class:`~bench.execution.forkserver.ForkServerExecutor` with
            the stack's ``python``, ``paths`` and ``env``); called for every stack here, at once, so the servers
            import in parallel, and again for a stack whose executor was closed.
        stacks: the open stacks by name.
    """

    name = "stacks"

    def __init__(self, make: Callable[[OpenStack], Executor], stacks: dict[str, OpenStack]):
        self.make, self.stacks = make, stacks
        self.executors: dict[str, Executor] = {n: make(s) for n, s in stacks.items()}
        self.warm = False

    def execute(self, launch: ResolvedLaunch) -> ExecResult:
        """Run ``launch`` with its stack's executor. Before the first run, every stack's server is waited for
        (``wait_ready``): the first run would otherwise share the 2 cores with the other stacks' servers still
        importing torch, transformers and verl, a slowdown of one side in the first block only, which no block
        cancels (one shared server, as ``gate --interleave`` has, never has it).

        Raises:
            BenchError: the launch names no stack of this sweep.
        """
        name = launch.env.get(STACK_ENV)
        if name not in self.stacks:
            raise BenchError(f"run {launch.run_dir}: stack {name!r} unknown (known: {sorted(self.stacks)})")
        if not self.warm:
            for ex in self.executors.values():
                getattr(ex, "wait_ready", lambda: None)()
            self.warm = True
        if name not in self.executors:
            self.executors[name] = self.make(self.stacks[name])
        return self.executors[name].execute(launch)

    def close(self) -> None:
        """Close every stack's executor (fork servers end)."""
        close_executors(self.executors)


__all__ = ["OpenStack", "PROBE_TIMEOUT_S", "StackExecutor", "git", "git_worktree", "open_stacks", "probe",
           "probe_result", "stack_launch_env"]
