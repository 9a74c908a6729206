"""Code versions of an interleaved gate sweep: the baseline's checkout and the executor that runs each run
with its own version's code.

* :func:`baseline_checkout`: a git revision checked out into a temporary ``git worktree`` (detached, removed
  at the end, also on an error or Ctrl-C), or a folder holding another checkout of the harness as it is.
* :class:`VersionedExecutor`: sends a run to the executor of the version its launch names
  (``BENCH_CODE_VERSION``): by default (``shared``) ONE fork server for both versions, whose children drop the
  server's ``bench`` modules and import their own version's harness (the heavy third-party modules stay
  preloaded); side by side, one pinned server per version, started in and importing from its checkout.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterator

from bench.core.errors import BenchError, InputError
from bench.core.process import ExecResult
from bench.execution.executors import Executor, ResolvedLaunch, close_executors
from bench.execution.stacks import git_worktree
from bench.spec.launch import REPO_ROOT

#: the two versions of an interleaved gate sweep
BASELINE, CANDIDATE = "baseline", "candidate"


def _git(repo: Path, *args: str) -> str:
    res = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise BenchError(f"git {' '.join(args)} in {repo}: {(res.stderr or res.stdout).strip().splitlines()[-1:]}")
    return res.stdout.strip()


def candidate_version(repo: Path = REPO_ROOT) -> dict[str, Any]:
    """The candidate: this checkout's working tree. ``commit`` = HEAD's sha (``None`` outside git), ``dirty``:
    whether the working tree differs from it (the runs then execute uncommitted code)."""
    try:
        commit = _git(repo, "rev-parse", "HEAD")
        dirty = bool(_git(repo, "status", "--porcelain", "--untracked-files=no"))
    except (BenchError, OSError, subprocess.TimeoutExpired):
        commit, dirty = None, None
    return {"root": Path(repo).resolve(), "commit": commit, "dirty": dirty, "ref": "working tree"}


@contextlib.contextmanager
def baseline_checkout(ref: str, repo: Path = REPO_ROOT) -> Iterator[dict[str, Any]]:
    """The baseline's code for the duration of the block: ``{"root", "commit", "ref", "kind"}``.

    ``ref``: a folder holding a checkout of the harness (``bench/`` inside; used as it is, ``kind`` ``path``),
    else a git revision of ``repo`` (``HEAD``, ``main``, a sha ...; ``kind`` ``git``), checked out detached
    into a temporary ``git worktree`` that is removed (``git worktree remove --force`` and ``prune``) when the
    block ends, however it ends.

    Raises:
        BenchError: neither a harness folder nor a revision of ``repo`` (the git message).
    """
    path = Path(ref).expanduser()
    if path.is_dir() and (path / "bench" / "__init__.py").is_file():
        try:
            commit = _git(path, "rev-parse", "HEAD")
        except (BenchError, OSError):
            commit = None
        yield {"root": path.resolve(), "commit": commit, "ref": str(ref), "kind": "path"}
        return
    try:
        commit = _git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}")
    except BenchError as exc:
        raise InputError("baseline revision", f"baseline revision {ref}: neither a harness checkout folder nor a git "
                         f"revision of {repo} "
                         f"({exc})") from None
    with git_worktree(repo, commit, prefix="bench-baseline-") as tree:
        yield {"root": tree.resolve(), "commit": commit, "ref": ref, "kind": "git"}

class VersionedExecutor:
    """Sends each run to its code version's executor (by the launch's ``BENCH_CODE_VERSION``).

    Args:
        make: ``make(root) -> Executor`` for a version's checkout (a fork server importing that checkout, or a
            plain local executor); called for every version when this executor is made (and again for a version
            whose executor was closed, on its next run).
        roots: version name -> checkout folder.
        side_by_side: a :class:`bench.gate.side_by_side.SideBySide`: both versions' runs of a cell at once, each on a
            CPU of its own (``gate --side-by-side``); ``None``: one run at a time.
        shared: one executor for every version, made from this checkout (a fork server whose children import
            ``bench`` afresh from their version's checkout: ``execute(launch, code_root=...)``). Both versions'
            runs are then forked from the same process image, so whatever one server process does to its runs
            (memory layout of the preloaded modules, its CPU placement) hits both versions alike; with one server
            per version such a process-level offset would differ between the versions and pose as a change.
    """

    name = "versioned"

    def __init__(self, make: Callable[[Path], Executor], roots: dict[str, Path], side_by_side: Any = None,
                 shared: Path | None = None):
        self.make, self.roots, self.shared = make, roots, shared
        self.side = side_by_side
        if side_by_side is not None:  # the sweep's block loop runs a block's runs through it (two at once)
            self.run_block = lambda items, run_one: side_by_side.run_block(items, run_one, on_interrupt=self.close)
        # every version's executor started here, at once, in the harness's main thread: the fork servers import in
        # parallel (measured: the second version's lazy start cost 17-27 s of a 100 s gate), and a fork server dies
        # with the thread that started it (PR_SET_PDEATHSIG; the threads of a side-by-side block end with the block)
        self.executors: dict[str, Executor] = ({"shared": make(shared)} if shared is not None else
                                               {v: make(root) for v, root in roots.items()})

    def execute(self, launch: ResolvedLaunch) -> ExecResult:
        """Run ``launch`` with the executor of its version.

        Raises:
            BenchError: the launch names no known version (a plain launch has no place in a gate sweep).
        """
        version = launch.env.get("BENCH_CODE_VERSION")
        if version not in self.roots:
            raise BenchError(f"run {launch.run_dir}: code version {version!r} unknown (known: {sorted(self.roots)})")
        if self.shared is not None:
            return self._executor("shared", self.shared).execute(launch, code_root=self.roots[version])
        ex = self._executor(version, self.roots[version])
        cpu = self.side.current_cpu() if self.side is not None else None
        if cpu is None:
            return ex.execute(launch)
        pin = getattr(ex, "pin", None)
        return self.side.released(launch.run_dir, lambda: ex.execute(launch),
                                  prepare=(lambda: pin({cpu})) if pin is not None else (lambda: None))

    def _executor(self, key: str, root: Path) -> Executor:
        """The executor under ``key``, made again from ``root`` when it was closed (an interrupted side-by-side
        block, a dead server)."""
        if key not in self.executors:
            self.executors[key] = self.make(root)
        return self.executors[key]

    def close(self) -> None:
        """Close every version's executor (fork servers end)."""
        close_executors(self.executors)
