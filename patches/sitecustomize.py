"""Applies the bench's runtime patches in every Python process of a run, then chains on.

The executors put ``patches/`` first on ``PYTHONPATH`` and list the patch specs in ``BENCH_PATCHES``
(``name`` or ``name:mode``, comma-separated), so this file runs at the start of every Python process the
run creates: verl's driver, its Ray workers, vLLM's workers. Each applied patch writes a report into
``$BENCH_RUN_DIR/patches/`` (see :mod:`bench_patches`).

Python imports only the first ``sitecustomize`` on ``sys.path``; the one this file shadows (a
distribution's or a virtual environment's) is found further down the path and executed afterwards.
Nothing here may break the interpreter: failures are printed to stderr and the process goes on.
"""

import os
import sys


def _bench_apply() -> None:
    if not os.environ.get("BENCH_PATCHES", "").strip():
        return
    try:
        import bench_patches

        bench_patches.activate_from_env()
    except Exception as exc:  # noqa: BLE001 - never break the interpreter start
        print(f"[bench patches] not applied: {type(exc).__name__}: {exc}", file=sys.stderr)


def _chain() -> None:
    """Execute the next ``sitecustomize`` on ``sys.path`` (the one this file shadows), if any."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None or os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["_bench_chained_sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001
        print(f"[bench patches] chained sitecustomize failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def _bench_versions_at_exit() -> None:
    """In a run's main process (started with ``python -m MODULE``; Ray's script-started workers are not), write
    the versions this process imported into ``$BENCH_RUN_DIR/versions.json`` when it exits normally
    (:func:`bench.core.metadata.write_run_versions`; the embedded engine writes its own before ``os._exit``).

    The main process is the run's first Python process: it puts its pid in ``BENCH_RUN_MAIN_PID``, which every
    process it starts inherits (Ray's workers, vLLM's engine processes, some started with ``python -m`` too), and
    those write nothing: a verl run's vLLM process, which imports no verl, once wrote the run's versions."""
    if not os.environ.get("BENCH_RUN_DIR"):
        return
    owner = os.environ.get("BENCH_RUN_MAIN_PID")
    if owner and owner != str(os.getpid()):
        return
    os.environ["BENCH_RUN_MAIN_PID"] = str(os.getpid())
    import atexit

    def write() -> None:
        main = sys.modules.get("__main__")
        if getattr(main, "__spec__", None) is None:
            return
        try:
            from bench.core.metadata import write_run_versions

            write_run_versions()
        except Exception:  # noqa: BLE001 - never break the interpreter's exit
            pass

    atexit.register(write)


_bench_apply()
_bench_versions_at_exit()
_chain()
