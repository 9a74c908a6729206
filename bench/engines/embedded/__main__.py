"""CLI: ``python -m bench.engines.embedded --out DIR [--config RUN.yaml]``.

Exit codes: 0 success; 2 bad input (``failure.json`` kind ``bad_input``) or an infeasible setting
(kind ``infeasible``); 1 any other failure (kind ``oom`` for out-of-memory, else ``error``). On failure
one line goes to stderr and ``DIR/failure.json`` = ``{"kind": ..., "reason": ...}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path

T_START = time.perf_counter()

# transformers imports scikit-learn (with scipy) at start-up only for the candidate heuristics of assisted
# generation, which this engine never uses: about 1.2 s of a ~13 s start-up on 2 cores. A ``None`` entry
# in sys.modules makes importlib.util.find_spec report it absent, so transformers skips it. Only in this
# CLI process; importing the package as a library changes nothing.
sys.modules.setdefault("sklearn", None)


def classify(exc: BaseException) -> tuple[str, int, str]:
    """``(kind, exit code, one-line reason)`` of an exception raised by a run."""
    from bench.core.errors import BenchError  # deferred: after T_START (start-up clock) and the sklearn stub

    reason = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, BenchError):
        return getattr(exc, "kind", "bad_input"), 2, reason
    oom_types: tuple[type, ...] = (MemoryError,)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "OutOfMemoryError"):
        oom_types += (torch.OutOfMemoryError,)
    if isinstance(exc, oom_types) or (isinstance(exc, RuntimeError) and "out of memory" in reason.lower()):
        return "oom", 1, f"{type(exc).__name__}: {reason}"[:500]
    return "error", 1, f"{type(exc).__name__}: {reason}"[:500]


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, and turn failures into ``failure.json`` + exit code."""
    ap = argparse.ArgumentParser(prog="python -m bench.engines.embedded", description="Embedded GRPO engine")
    ap.add_argument("--out", required=True, type=Path, help="run folder to write")
    ap.add_argument("--config", type=Path, default=None, help="run config YAML (default run without it)")
    args = ap.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("failure.json", "evidence.json", "metrics.jsonl"):
        (out / stale).unlink(missing_ok=True)
    for old in (out / "trace").glob("steps_*.json") if (out / "trace").is_dir() else ():
        old.unlink()

    from .run import setup_logging  # deferred: after T_START (start-up clock) and the sklearn stub

    setup_logging(out)
    log = logging.getLogger("bench.embedded")
    try:
        from .config import load_run_config  # deferred: after T_START (start-up clock) and the sklearn stub
        from .run import run, write_resolved_config  # deferred: after T_START (start-up clock) and the sklearn stub

        cfg = load_run_config(args.config)
        write_resolved_config(cfg, out)
        run(cfg, out, T_START)
        return 0
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - every failure is reported the same way
        kind, code, reason = classify(exc)
        log.error("%s: %s\n%s", kind, reason, "".join(traceback.format_exception(exc)))
        (out / "failure.json").write_text(json.dumps({"kind": kind, "reason": reason}) + "\n")
        print(f"embedded engine: {kind}: {reason}", file=sys.stderr, flush=True)
        return code
    finally:  # what this process imported, read in it (a stack's own interpreter and source trees show here)
        from bench.core.metadata import write_run_versions  # deferred: after T_START (start-up clock)

        write_run_versions(out)


def _exit_now(code: int) -> None:
    """Flush everything this engine wrote, then leave without interpreter finalization.

    Every output is closed by then (metrics via ``Tracking.finish``, traces exported, logs flushed
    here). Tearing down torch, transformers, verl and Ray modules takes 1.5-3 s on 2 cores and adds
    nothing to the run folder.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main())
