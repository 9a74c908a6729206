"""A fork server for Python runs: imports the heavy modules once, then forks one fresh process per run.

Starting a run of the embedded engine costs several seconds of imports (torch, transformers, verl) on 2
cores, more than the GRPO steps of a short run. The fork server pays that once per sweep: it imports
the modules named by the engine, then for each run ``fork()`` s a child that

- starts a new session (its own process group: a timeout kills the whole run),
- sends stdout/stderr to the run's ``run.log`` and ``chdir`` s into the run folder,
- replaces ``os.environ`` with exactly the run's environment (nothing leaks between runs),
- applies the run's patches (``BENCH_PATCHES``) in the child only,
- runs ``python -m <module> <args>`` through :func:`runpy.run_module` and exits with its code.

Each run is still its own process and sees pristine modules (the server never runs anything but
imports). Limits, stated in each run's ``launcher.json``: variables read *at import time* of the
preloaded modules (``OMP_NUM_THREADS``, ``TASK_QUEUE_ENABLE`` for torch_npu ...) keep the server's
values, so :class:`ForkServerExecutor` is used only for CPU runs of the embedded engine, where the engine
sets its thread count itself; everything else goes through :class:`~bench.execution.executors.LocalExecutor`.

Protocol (JSON lines): request ``{"module", "args", "env", "cwd", "log"}`` on the server's stdin; the
server answers ``{"pid": N}`` after forking, then ``{"pid": N, "status": waitstatus}`` when it ends.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.core.engine_registry import engine_classes
from bench.core.process import ExecResult
from bench.execution.executors import (
    LocalExecutor,
    ResolvedLaunch,
    _child_setup,
    _kill_group,
    die_with_parent,
    oom_kills,
    signal_reason,
)
from bench.spec.launch import REPO_ROOT


def preload_modules() -> tuple[str, ...]:
    """Modules the server imports before forking: what the runs of the engines that fork import first
    (:attr:`bench.engines.base.Engine.forkserver_preload` of every registered engine, in registry order)."""
    out: list[str] = []
    for cls in engine_classes():
        out += [m for m in getattr(cls, "forkserver_preload", ()) if m not in out]
    return tuple(out)


def _child(req: dict) -> None:
    """In the forked child: become the run, then exit with its code (never returns)."""
    code = 1
    try:
        os.setsid()
        die_with_parent(req.get("server_pid"))  # the server dies (or is killed): so does the run
        signal.signal(signal.SIGINT, signal.default_int_handler)
        fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = [req["module"], *req["args"]]
        root = REPO_ROOT
        if req.get("code_root"):  # a server shared by code versions: this run's version of the harness, fresh
            root = Path(req["code_root"])
            for name in [m for m in sys.modules if m == "bench" or m.startswith("bench.")]:
                del sys.modules[name]
            sys.path.insert(0, str(root))
        if os.environ.get("BENCH_PATCHES"):
            sys.path.insert(0, str(root / "patches"))
            import bench_patches

            bench_patches.activate_from_env()
        import runpy

        try:
            runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # noqa: BLE001 - the child must always exit
        print(f"fork server child: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(preload: list[str]) -> None:
    """Server loop (``python -m bench.execution.forkserver MODULE...``): import, then fork per request line.

    The server dies with the harness (parent-death signal) and ends quietly when the harness closes its
    pipes (``BrokenPipeError``/EOF): it never prints a traceback after the harness has gone.
    """
    die_with_parent(int(os.environ.get("BENCH_HARNESS_PID", "0")) or None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the harness's to handle
    try:
        _serve(preload)
    except (BrokenPipeError, KeyboardInterrupt, ConnectionResetError):
        pass
    finally:
        try:
            sys.stdout = open(os.devnull, "w")  # nothing to flush into a closed pipe at exit
        finally:
            os._exit(0)


def _serve(preload: list[str]) -> None:
    sys.modules.setdefault("sklearn", None)  # as the embedded CLI does: transformers never needs it here
    for name in preload:
        importlib.import_module(name)
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        req["server_pid"] = os.getpid()
        pid = os.fork()
        if pid == 0:
            _child(req)
        out.write(json.dumps({"pid": pid}) + "\n")
        out.flush()
        _, status = os.waitpid(pid, 0)
        out.write(json.dumps({"pid": pid, "status": status}) + "\n")
        out.flush()


class ForkServerExecutor:
    """Runs ``{python} -m MODULE ...`` launches as children of a warm fork server; others locally.

    Args:
        preload: modules the server imports once.
        repo_root: the checkout whose code the server imports and its runs execute (first on ``PYTHONPATH``,
            and the server's working folder, so ``python -m`` finds that ``bench``); default this harness's.
        python, paths, env: a stack's server (:class:`bench.execution.stacks.StackExecutor`): the interpreter it
            runs in (default this one), source trees before ``repo_root`` on its ``PYTHONPATH``, and its variables;
            so the preloaded modules are that stack's own.
    """

    name = "forkserver"

    def __init__(self, preload: tuple[str, ...] | None = None, eager: bool = True, repo_root: Path | None = None,
                 python: str | None = None, paths: list[str] | None = None, env: dict[str, str] | None = None):
        self.preload = preload_modules() if preload is None else preload
        self.repo_root = Path(repo_root).resolve() if repo_root is not None else REPO_ROOT
        self.python = python or sys.executable
        self.paths, self.env = list(paths or []), dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.ready = False
        self.fallback = LocalExecutor()
        if eager:  # import in the background while the harness opens MLflow and the results folder
            self._spawn()

    def _spawn(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("BENCH_PATCHES", "BENCH_RUN_DIR")}
        env.update(self.env)
        env["PYTHONPATH"] = os.pathsep.join([*self.paths, str(self.repo_root)] +
                                            ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["BENCH_HARNESS_PID"] = str(os.getpid())
        self.proc = subprocess.Popen([self.python, "-m", "bench.execution.forkserver", *self.preload],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
                                     cwd=str(self.repo_root),
                                     start_new_session=True, preexec_fn=_child_setup(os.getpid()))
        self.ready = False

    def _ensure(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self._spawn()
        if not self.ready:
            if not self.proc.stdout.readline().strip():
                self.close()
                raise RuntimeError("fork server did not start")
            self.ready = True

    def wait_ready(self) -> None:
        """Block until the server has imported its modules (started if needed); a server that does not start is
        left to :meth:`execute` (which falls back to a local process)."""
        try:
            self._ensure()
        except (OSError, RuntimeError, AttributeError):
            pass

    def pin(self, cpus: set[int]) -> None:
        """Runs forked from now on run on ``cpus`` only: the server's main thread forks them and a child inherits
        its CPU affinity (``os.sched_setaffinity``); a server that does not start is left to :meth:`execute`."""
        try:
            self._ensure()
            os.sched_setaffinity(self.proc.pid, cpus)
        except (OSError, RuntimeError, AttributeError):
            pass

    def execute(self, launch: ResolvedLaunch, code_root: Path | None = None) -> ExecResult:
        """Run through the server when the argv is ``python -m module ...``; else with a local process.

        ``code_root``: the checkout whose harness code this run executes when one server serves several code
        versions (the interleaved gate): the child drops the server's ``bench`` modules and imports ``bench`` (and
        ``patches/``) from ``code_root``; the heavy third-party modules stay preloaded, shared by both versions.
        """
        argv = launch.argv
        if (
            len(argv) < 3
            or argv[1] != "-m"
            or Path(argv[0]).name not in (Path(self.python).name, Path(sys.executable).name, "python", "python3")
        ):
            return self.fallback.execute(launch)
        env = {k: v for k, v in os.environ.items() if k not in ("BENCH_PATCHES", "BENCH_RUN_DIR")}
        env.update(launch.env)
        start = time.perf_counter()
        oom0 = oom_kills()
        root = None if code_root is None else str(code_root)
        try:
            self._ensure()
            (launch.run_dir / "launcher.json").write_text(json.dumps(
                {"launcher": "forkserver", "preloaded": list(self.preload), "server_pid": self.proc.pid,
                 "code_root": root, "python": self.python, "paths": self.paths,
                 "note": "environment replaced at fork; variables read at import time of preloaded "
                         "modules keep the fork server's values"
                         + ("; bench imported afresh from code_root" if root else "")}) + "\n")
            req = {"module": argv[2], "args": argv[3:], "env": env, "cwd": str(launch.run_dir),
                   "log": str(launch.run_dir / "run.log"), "code_root": root}
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            pid = json.loads(self.proc.stdout.readline())["pid"]
        except (OSError, ValueError, RuntimeError, KeyError):
            self.close()
            return self.fallback.execute(launch)
        start = time.perf_counter()  # the run's clock starts at its fork, not while the server imports
        deadline = start + launch.timeout_s
        fd = self.proc.stdout
        try:
            status = self._wait(fd, pid, deadline)
        except BaseException:  # the harness was interrupted: leave no run behind
            _kill_pgid(pid)
            self.close()
            raise
        if status is None:
            return ExecResult(None, True, time.perf_counter() - start, f"timed out after {launch.timeout_s:g} s")
        if status == "died":
            _kill_pgid(pid)  # its parent-death signal ends it; make sure
            self.close()
            return ExecResult(None, False, time.perf_counter() - start, "fork server died during the run")
        wall = time.perf_counter() - start
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            return ExecResult(-sig, False, wall, signal_reason(sig, oom0))
        rc = os.WEXITSTATUS(status)
        return ExecResult(rc, False, wall, "" if rc == 0 else f"exit code {rc}")

    @staticmethod
    def _wait(fd, pid: int, deadline: float):
        """The child's wait status; ``None`` after killing it at the deadline; ``"died"`` if the server died."""
        while True:
            left = deadline - time.perf_counter()
            ready, _, _ = select.select([fd], [], [], max(0.0, min(left, 1.0)))
            if ready:
                line = fd.readline()
                return json.loads(line)["status"] if line else "died"
            if left <= 0:
                _kill_pgid(pid)
                fd.readline()  # the server reaps it and reports
                return None

    def close(self) -> None:
        """Stop the server (idempotent)."""
        if self.proc is not None:
            _kill_group(self.proc)
            self.proc = None
            self.ready = False


def _kill_pgid(pid: int) -> None:
    """SIGTERM, then SIGKILL after up to 2 s, the process group ``pid`` (returns as soon as it is gone)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.05)


if __name__ == "__main__":
    serve(sys.argv[1:])
