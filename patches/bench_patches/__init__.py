"""Runtime patches of the GRPO ablation bench, applied in every Python process of a run.

``patches/sitecustomize.py`` (first on ``PYTHONPATH`` for a run) calls :func:`activate_from_env` when
``BENCH_PATCHES`` is set: a comma-separated list of ``name`` or ``name:mode`` specs. Each name is a module
of this package (:data:`KNOWN_PATCHES`: ``qwen3vl_npu_fused``, ``vllm_ascend_mrope_cache``,
``verl_file_logger``) with ``apply(mode, record)``; it either arms post-import hooks (:func:`when_imported`)
that patch their target the moment it is imported, or raises :class:`PatchRefused` with the reason.

Evidence: every process that applies patches writes ``$BENCH_RUN_DIR/patches/<role>-<host>-<pid>.json``
(pid, process role, the patches requested, and per patch its status ``armed`` / ``applied`` /
``refused`` / ``error`` with what it patched or why not), rewritten atomically at each change, so a
killed process leaves a readable file.

Only the standard library is imported here: the hook costs nothing in processes that never import the
patched modules (Ray system processes are skipped entirely).
"""

from __future__ import annotations

import importlib
import importlib.abc
import json
import os
import socket
import sys
import threading
import time
import traceback
from types import ModuleType
from typing import Any, Callable

ENV_PATCHES = "BENCH_PATCHES"
ENV_RUN_DIR = "BENCH_RUN_DIR"
#: Patch name -> module of this package.
KNOWN_PATCHES = {
    "qwen3vl_npu_fused": "bench_patches.qwen3vl_npu_fused",
    "vllm_ascend_mrope_cache": "bench_patches.vllm_ascend_mrope_cache",
    "vllm_mrope_cache": "bench_patches.vllm_mrope_cache",
    "verl_file_logger": "bench_patches.verl_file_logger",
    "verl_cpu": "bench_patches.verl_cpu",
    "verl_evidence": "bench_patches.verl_evidence",
    "cpu_rmsnorm": "bench_patches.cpu_rmsnorm",
    "verl_speed_probe": "bench_patches.verl_speed_probe",
}
_LOCK = threading.RLock()


class PatchRefused(Exception):
    """A patch cannot be applied in this process (the message says why); the process runs unpatched."""


# --------------------------------------------------------------------------------------------- role


def _cmdline() -> list[str]:
    """The process's command line: ``sys.orig_argv`` (complete even inside sitecustomize), else /proc."""
    argv = list(getattr(sys, "orig_argv", None) or [])
    if not argv:
        try:
            with open("/proc/self/cmdline", "rb") as fh:
                argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
        except OSError:
            argv = list(getattr(sys, "argv", []) or [])
    return argv


def _proctitle() -> str:
    """What /proc shows now (Ray renames its workers ``ray::<Actor>.<method>``); empty when unknown."""
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return ""


_RAY_SYSTEM = ("ray/dashboard/", "ray/_private/log_monitor", "ray/autoscaler/", "ray/_private/runtime_env/agent",
               "ray/_private/monitor", "ray/util/client/server", "ray/scripts/scripts.py")


def process_role(argv: list[str] | None = None) -> str:
    """A short label for this process: ``driver`` (verl main_ppo), ``embedded``, ``ray-worker``,
    ``ray-system``, ``mp-child`` (multiprocessing / vLLM worker), or the script / module name."""
    argv = _cmdline() if argv is None else argv
    joined = " ".join(argv)
    if "verl.trainer.main_ppo" in joined:
        return "driver"
    if "bench.engines.embedded" in joined:
        return "embedded"
    if any(a.endswith("default_worker.py") for a in argv):
        return "ray-worker"
    if any(s in joined for s in _RAY_SYSTEM) or (len(argv) > 1 and os.path.basename(argv[1]) == "ray"):
        return "ray-system"
    if "multiprocessing" in joined and ("spawn_main" in joined or "forkserver" in joined):
        return "mp-child"
    if "multiprocessing.resource_tracker" in joined:
        return "mp-helper"
    for i, a in enumerate(argv[1:], start=1):
        if a == "-m" and i + 1 < len(argv):
            return argv[i + 1].rsplit(".", 1)[-1][:40] or "python"
        if a == "-c":
            return "python-c"
        if not a.startswith("-"):
            return os.path.basename(a)[:40] or "python"
    return "python"


# ------------------------------------------------------------------------------------------- report


class PatchRecord(dict):
    """The report entry of one patch in this process; every change rewrites the process report."""

    def __init__(self, report: "Report", name: str, mode: str | None) -> None:
        super().__init__(mode=mode, status="pending", actions=[], reason="")
        self._report = report

    def action(self, text: str) -> None:
        """Record something the patch did (``Qwen3VLTextRMSNorm.forward -> torch_npu.npu_rms_norm``)."""
        self["actions"].append(text)
        self["status"] = "applied"
        self._report.write()

    def status(self, status: str, reason: str = "") -> None:
        """Set ``armed`` / ``applied`` / ``refused`` / ``error`` (with a reason for the last two)."""
        self["status"] = status
        if reason:
            self["reason"] = reason
        self._report.write()


#: environment variables that are a factor's whole mechanism (task_queue, mc2): each report records them
ENV_EVIDENCE = ("TASK_QUEUE_ENABLE", "VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE")


class Report:
    """The per-process patch report written to ``$BENCH_RUN_DIR/patches/``."""

    def __init__(self, run_dir: str | None, requested: list[str]) -> None:
        self.role = process_role()
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.requested = requested
        self.patches: dict[str, PatchRecord] = {}
        self.started = time.time()
        self.path = None
        if run_dir:
            safe_host = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.host)[:60]
            self.path = os.path.join(run_dir, "patches", f"{self.role}-{safe_host}-{self.pid}.json")

    def record(self, name: str, mode: str | None) -> PatchRecord:
        rec = PatchRecord(self, name, mode)
        self.patches[name] = rec
        return rec

    def as_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "ppid": os.getppid(),
            "host": self.host,
            "role": self.role,
            "proctitle": _proctitle(),
            "argv": _cmdline()[:12],
            "python": sys.executable,
            "started": self.started,
            "updated": time.time(),
            "requested": self.requested,
            "patches": {k: dict(v) for k, v in self.patches.items()},
            # the factors' environment switches as this process saw them (evidence of env-only factors)
            "env": {k: os.environ[k] for k in ENV_EVIDENCE if k in os.environ},
        }

    def write(self) -> None:
        """Atomically (re)write the report; never raises (a report must not break the run)."""
        if not self.path:
            return
        with _LOCK:
            try:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                tmp = f"{self.path}.tmp{threading.get_ident()}"
                with open(tmp, "w") as fh:
                    json.dump(self.as_dict(), fh, indent=1, default=str)
                os.replace(tmp, self.path)
            except OSError:
                pass


# ---------------------------------------------------------------------------------- post-import hooks

_HOOKS: dict[str, list[Callable[[ModuleType], None]]] = {}


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds hooked modules through the other finders and runs the hooks right after the module executes."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):  # noqa: D401 - importlib protocol
        if fullname not in _HOOKS or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.discard(fullname)
        loader = getattr(spec, "loader", None) if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module, _original=original, _loader=loader):
            try:
                _original(module)
            finally:
                try:
                    del _loader.exec_module  # back to the class's method
                except AttributeError:
                    pass
            _fire(module.__name__, module)

        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):
            return spec
        return spec


_FINDER: _PostImportFinder | None = None


def _fire(name: str, module: ModuleType) -> None:
    for hook in list(_HOOKS.get(name, ())):
        try:
            hook(module)
        except Exception:  # a hook must never break the import it watches
            print(f"[bench patches] hook for {name} failed:\n{traceback.format_exc()}", file=sys.stderr)


def when_imported(module_name: str, hook: Callable[[ModuleType], None]) -> None:
    """Run ``hook(module)`` right after ``module_name`` is imported (now, if it already is)."""
    global _FINDER
    with _LOCK:
        _HOOKS.setdefault(module_name, []).append(hook)
        if _FINDER is None:
            _FINDER = _PostImportFinder()
            sys.meta_path.insert(0, _FINDER)
    module = sys.modules.get(module_name)
    if module is not None:
        _fire_one(hook, module_name, module)


def _fire_one(hook: Callable[[ModuleType], None], name: str, module: ModuleType) -> None:
    try:
        hook(module)
    except Exception:
        print(f"[bench patches] hook for {name} failed:\n{traceback.format_exc()}", file=sys.stderr)


def reset_hooks() -> None:
    """Remove every hook and the finder (tests)."""
    global _FINDER
    with _LOCK:
        _HOOKS.clear()
        if _FINDER is not None and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
        _FINDER = None


def replace(owner: Any, attr: str, make: Callable[[Any], Callable], tag: str) -> bool:
    """Replace ``owner.<attr>`` by ``make(original)``, once per ``tag``.

    The new callable gets ``__bench_patch__ = tag`` and ``__wrapped__ = original`` (so a second hook call,
    or a second patch module, sees what is installed). Returns ``False`` when ``owner`` has no such
    attribute or it is already this tag's replacement.
    """
    original = getattr(owner, attr, None)
    if original is None or getattr(original, "__bench_patch__", None) == tag:
        return False
    new = make(original)
    new.__bench_patch__ = tag
    new.__wrapped__ = original
    setattr(owner, attr, new)
    return True


# ------------------------------------------------------------------------------------------- activate

REPORT: Report | None = None


def parse_specs(text: str) -> list[tuple[str, str | None]]:
    """``"a:on, b"`` -> ``[("a", "on"), ("b", None)]`` (empty items ignored)."""
    out = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, _, mode = item.partition(":")
        out.append((name.strip(), mode.strip() or None))
    return out


def activate(specs: str, run_dir: str | None = None) -> Report:
    """Apply each patch of ``specs`` in this process; write the report into ``run_dir/patches/``.

    Unknown names, refusals and errors are recorded (and printed once to stderr), never raised.
    """
    global REPORT
    report = Report(run_dir, [s for s in (specs or "").split(",") if s.strip()])
    REPORT = report
    for name, mode in parse_specs(specs):
        rec = report.record(name, mode)
        module_name = KNOWN_PATCHES.get(name)
        if module_name is None:
            rec.status("error", f"unknown patch {name!r} (known: {', '.join(sorted(KNOWN_PATCHES))})")
            print(f"[bench patches] {rec['reason']}", file=sys.stderr)
            continue
        try:
            module = importlib.import_module(module_name)
            module.apply(mode, rec)
        except PatchRefused as exc:
            rec.status("refused", str(exc))
            print(f"[bench patches] {name}:{mode or ''} refused in {report.role} (pid {report.pid}): {exc}",
                  file=sys.stderr)
        except Exception as exc:
            rec.status("error", f"{type(exc).__name__}: {exc}")
            print(f"[bench patches] {name} failed in {report.role}: {traceback.format_exc()}", file=sys.stderr)
    report.write()
    return report


def activate_from_env(environ: dict[str, str] | None = None) -> Report | None:
    """Entry point of ``sitecustomize``: apply ``$BENCH_PATCHES`` unless this is a Ray system process."""
    environ = os.environ if environ is None else environ
    specs = environ.get(ENV_PATCHES, "")
    if not specs.strip():
        return None
    if process_role() == "ray-system":
        return None
    return activate(specs, environ.get(ENV_RUN_DIR) or None)
