"""Executors run one resolved launch and report how it ended; they know nothing of engines or factors.

- :class:`LocalExecutor` (default): a child process in its own process group and session, so
  environment variables and patches never leak between runs and a timeout kills the whole tree.

Process hygiene: every process the harness starts (a run, the fork server) gets a parent-death signal
(``PR_SET_PDEATHSIG`` = SIGKILL, :func:`die_with_parent`), so a harness killed even by SIGKILL leaves no
run behind; SIGTERM/SIGINT unwind the harness, which kills the run's process group. A resumed sweep
first ends whatever still runs in its folders (:func:`kill_strays`). A run killed by a signal is
labelled with it ("killed by signal 9 (SIGKILL)"); "out of memory" only with evidence: the cgroup's
``oom_kill`` counter rose during the run (:func:`oom_kills`).
- :class:`bench.execution.ray_executor.RayJobExecutor`: a job on an existing Ray cluster (``--ray-address``).

Runs go one after another: benchmark runs must not share devices. The one exception,
:class:`bench.execution.ray_parallel.RayNodesExecutor` (``--parallel``), runs the runs of one block at once on
distinct nodes of a Ray cluster, one run per node.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bench.core.process import ExecResult
from bench.spec.launch import REPO_ROOT, machine_placeholders

#: Folder of runtime patches (``patches/`` at the repository root).
PATCHES_DIR = REPO_ROOT / "patches"


@dataclass
class ResolvedLaunch:
    """A launch with placeholders filled: ready to execute.

    Attributes:
        argv: command list.
        env: the variables this run adds (``BENCH_*``, ``PYTHONPATH`` and the factor/base variables);
            the local executor layers them over the harness's environment, Ray puts them in ``runtime_env``.
        run_dir: absolute run folder; ``run.log`` there receives stdout and stderr.
        timeout_s: wall-clock limit, seconds.
    """

    argv: list[str]
    env: dict[str, str]
    run_dir: Path
    timeout_s: float


class Executor(Protocol):
    """Runs a :class:`ResolvedLaunch` to completion (blocking) and returns an :class:`ExecResult`."""

    name: str

    def execute(self, launch: ResolvedLaunch) -> ExecResult:
        """Run it; stdout/stderr go to ``launch.run_dir / "run.log"``."""
        ...


def resolve_launch(argv: list[str], env: dict[str, str], patches: list[str], run_dir: Path, timeout_s: float,
                   python: str = sys.executable, repo_root: Path | None = None, paths: list[str] | None = None,
                   placeholders: dict[str, str] | None = None) -> ResolvedLaunch:
    """Fill ``{run_dir}`` and the :func:`machine_placeholders`, and add the variables every run gets.

    ``BENCH_RUN_DIR`` = the run folder; ``BENCH_PATCHES`` = comma-separated patch specs, with
    ``patches/`` first on ``PYTHONPATH`` so its ``sitecustomize`` applies them in every Python process of
    the run (Ray workers and vLLM included) and writes what it patched into the run folder.
    ``repo_root``: the checkout whose code the run executes (first on ``PYTHONPATH``, ``{repo}``, its
    ``patches/``); default this harness's own (:data:`REPO_ROOT`). An interleaved gate gives the baseline's.
    A stack's run (:mod:`bench.execution.stacks`): ``python`` its interpreter, ``paths`` its source trees (on
    ``PYTHONPATH`` after ``patches/``, before ``repo_root``), ``placeholders`` the engine's interpreter placeholders.
    """
    run_dir = Path(run_dir).resolve()
    root = Path(repo_root).resolve() if repo_root is not None else REPO_ROOT
    fill = {"run_dir": str(run_dir), **machine_placeholders(python), **(placeholders or {}), "repo": str(root)}

    def _fill(text: str) -> str:  # only the known placeholders: verl overrides may hold other braces
        for key, value in fill.items():
            text = text.replace("{" + key + "}", value)
        return text

    out_env = {k: _fill(v) for k, v in env.items()}
    out_env["BENCH_RUN_DIR"] = str(run_dir)
    paths = [*(paths or []), str(root)]
    if patches:
        out_env["BENCH_PATCHES"] = ",".join(patches)
        paths.insert(0, str(root / "patches"))
    existing = env.get("PYTHONPATH") or os.environ.get("PYTHONPATH", "")
    out_env["PYTHONPATH"] = os.pathsep.join(paths + ([existing] if existing else []))
    return ResolvedLaunch(argv=[_fill(a) for a in argv], env=out_env, run_dir=run_dir, timeout_s=timeout_s)


_PR_SET_PDEATHSIG = 1


def close_executors(executors: dict[str, Any]) -> None:
    """Close each executor of ``executors`` that has a ``close()`` (fork servers end), then empty the dict: the one
    way a dispatcher over several executors (per code version, per stack) ends them."""
    for ex in executors.values():
        close = getattr(ex, "close", None)
        if close is not None:
            close()
    executors.clear()


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux ``PR_SET_PDEATHSIG``).

    Call it in a child right after ``fork`` (``preexec_fn``); if the parent is already gone
    (``getppid() != parent_pid``) the process exits at once. A no-op where ``prctl`` is unavailable.
    """
    prctl = _prctl()
    if prctl is None:
        return
    prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


_PRCTL: list = []


def _prctl():
    """libc's ``prctl`` (looked up once, in the parent: a forked child only calls it), or ``None``."""
    if not _PRCTL:
        try:
            _PRCTL.append(ctypes.CDLL(None, use_errno=True).prctl)
        except (OSError, AttributeError):
            _PRCTL.append(None)
    return _PRCTL[0]


def _child_setup(parent_pid: int):
    _prctl()  # resolve before fork

    def setup() -> None:
        die_with_parent(parent_pid)

    return setup


def oom_kills() -> int | None:
    """The ``oom_kill`` counter of this process's cgroup (v2 ``memory.events``; ``None`` where absent)."""
    try:
        rel = next((ln.split(":", 2)[2] for ln in open("/proc/self/cgroup").read().splitlines()
                    if ln.startswith("0::")), "/")
    except OSError:
        rel = "/"
    for path in (Path("/sys/fs/cgroup") / rel.lstrip("/") / "memory.events", Path("/sys/fs/cgroup/memory.events")):
        try:
            for line in path.read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        except (OSError, ValueError):
            continue
    return None


def signal_reason(sig: int, oom_before: int | None) -> str:
    """``killed by signal N (NAME)``; with ``: out of memory (...)`` only when the cgroup's OOM counter rose."""
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = "unknown"
    why = f"killed by signal {sig} ({name})"
    after = oom_kills()
    if sig == signal.SIGKILL and oom_before is not None and after is not None and after > oom_before:
        why += f": out of memory (cgroup oom_kill counter {oom_before} -> {after})"
    return why


def kill_strays(folder: Path, grace_s: float = 3.0) -> list[int]:
    """End every run process (and its process group) that a killed harness left in ``folder``; returns
    the PIDs ended.

    A run process is one whose environment has ``BENCH_RUN_DIR`` inside ``folder`` (runs started by
    :class:`LocalExecutor` and their children), or a fork-server child (command line ``bench.execution.forkserver``)
    working inside ``folder``. Anything else (a shell ``cd``-ed into the folder), processes of other
    users, and this process and its ancestors are never touched.
    """
    import psutil

    root = str(Path(folder).resolve())

    def inside(path: str) -> bool:
        return bool(path) and (path == root or path.startswith(root + os.sep))

    found = _scan(lambda proc, env_dir: inside(env_dir) or (
        inside(proc.cwd()) and "bench.execution.forkserver" in " ".join(proc.cmdline())))
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    for proc in found:
        try:
            pgid = os.getpgid(proc.pid)
            if pgid in mine or pgid == os.getpgrp():
                proc.kill()
            else:
                os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess, OSError):
            continue
    psutil.wait_procs(found, timeout=grace_s)
    return [p.pid for p in found]


class LocalExecutor:
    """Runs each launch as a local child process (new session; the whole group is killed on timeout)."""

    name = "local"

    def execute(self, launch: ResolvedLaunch) -> ExecResult:
        """Run the command with stdout+stderr to ``run.log``; kill the process group at the timeout."""
        # the harness's own patch list / run folder (a nested sweep) never leak into a run
        env = {k: v for k, v in os.environ.items() if k not in ("BENCH_PATCHES", "BENCH_RUN_DIR")}
        env.update(launch.env)
        log = launch.run_dir / "run.log"
        start = time.perf_counter()
        oom0 = oom_kills()
        with open(log, "ab") as fh:
            try:
                proc = subprocess.Popen(
                    launch.argv, env=env, cwd=launch.run_dir, stdout=fh, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_child_setup(os.getpid()),
                )
            except OSError as exc:
                return ExecResult(None, False, 0.0, f"cannot start {launch.argv[0]}: {exc.strerror}")
            try:
                rc = proc.wait(timeout=launch.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                _note_leftovers(launch.run_dir, reap_run_processes(launch.run_dir))
                return ExecResult(None, True, time.perf_counter() - start, f"timed out after {launch.timeout_s:g} s")
            except BaseException:
                _kill_group(proc)  # the harness itself was interrupted: leave no orphan behind
                reap_run_processes(launch.run_dir)
                raise
        wall = time.perf_counter() - start
        _note_leftovers(launch.run_dir, reap_run_processes(launch.run_dir))
        if rc < 0:
            return ExecResult(rc, False, wall, signal_reason(-rc, oom0))
        return ExecResult(rc, False, wall, "" if rc == 0 else f"exit code {rc}")


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM then SIGKILL the child's process group (waits up to 5 s after each)."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _scan(match) -> list:
    """This user's processes (not this one nor its ancestors) for which ``match(proc, bench_run_dir)`` holds,
    ``bench_run_dir`` being the ``BENCH_RUN_DIR`` of the process's environment ('' when it has none)."""
    import psutil

    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for proc in psutil.process_iter(["pid", "uids"]):
        if proc.pid in mine:
            continue
        try:
            if proc.info["uids"] is not None and proc.info["uids"].real != os.getuid():
                continue
            try:
                env_dir = proc.environ().get("BENCH_RUN_DIR", "")
            except (psutil.AccessDenied, OSError):
                env_dir = ""
            if match(proc, env_dir):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def run_processes(run_dir: Path) -> list:
    """Live processes that belong to the run in ``run_dir``: every process whose environment has
    ``BENCH_RUN_DIR`` equal to it (the variable every process of a run inherits, including the Ray
    head, raylet and workers and vLLM engines that a verl run starts in sessions of their own)."""
    target = str(Path(run_dir).resolve())
    return _scan(lambda proc, env_dir: env_dir == target)


def reap_run_processes(run_dir: Path, grace_s: float = 5.0) -> list[str]:
    """End every process of the run (:func:`run_processes`) that outlived it: SIGTERM, then SIGKILL after
    ``grace_s`` seconds. Returns ``"name(pid)"`` of each process it ended."""
    import psutil

    procs = run_processes(run_dir)
    if not procs:
        return []
    names = []
    for p in procs:
        try:
            names.append(f"{p.name()}({p.pid})")
            p.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return names


def _note_leftovers(run_dir: Path, names: list[str]) -> None:
    if not names:
        return
    try:
        with open(Path(run_dir) / "run.log", "a") as fh:
            fh.write(
                f"\n[bench] ended {len(names)} process(es) of this run that outlived it: {', '.join(names[:20])}\n"
            )
    except OSError:
        pass
