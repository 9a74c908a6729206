"""Measurement plumbing for verl runs (not an optimization): a file logger that keeps every step.

verl's ``FileLogger`` (``trainer.logger=[...,file]``, written to ``$VERL_FILE_LOGGER_PATH``) is the
bench's source of per-step metrics. In verl 0.6.x it writes ``json.dumps({"step": s, "data": d})`` to a
buffered text file: a numpy / torch scalar in the metrics raises ``TypeError`` (the step is lost or the
run dies), and lines still in the buffer are lost when a run is killed. Newer releases use orjson on an
unbuffered file, where this patch changes nothing.

The wrapped ``FileLogger.log`` calls verl's own ``log`` (same format), retries once with numpy / torch
values turned into plain Python numbers if it raised ``TypeError``, and flushes the file after each step.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from bench_patches import PatchRecord, PatchRefused, when_imported

NAME = "verl_file_logger"
TARGET_MODULE = "verl.utils.tracking"
_STATE: dict[str, Any] = {"record": None}


def plain(value: Any) -> Any:
    """``value`` with numpy / torch scalars and arrays turned into Python numbers and lists."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    for attr in ("item", "tolist"):
        fn = getattr(value, attr, None)
        if callable(fn):
            try:
                return plain(fn())
            except (TypeError, ValueError, RuntimeError):
                continue
    return str(value)


def _install(module: ModuleType) -> None:
    cls = getattr(module, "FileLogger", None)
    rec: PatchRecord | None = _STATE["record"]
    if cls is None:
        if rec is not None:
            rec.status("error", f"{module.__name__} has no FileLogger")
        return
    original = cls.__dict__.get("log")
    if original is None or getattr(original, "__bench_patch__", None) == NAME:
        return

    def log(self, data, step):
        try:
            original(self, data, step)
        except TypeError:
            original(self, plain(data), plain(step))
        fp = getattr(self, "fp", None)
        if fp is not None and hasattr(fp, "flush"):
            fp.flush()

    log.__bench_patch__ = NAME
    log.__wrapped__ = original
    cls.log = log
    if rec is not None:
        rec.action(f"{module.__name__}.FileLogger.log: numpy/torch scalars made plain on TypeError; "
                   "flushed after every step")


def apply(mode: str | None, record: PatchRecord) -> None:
    """Arm the hook on ``verl.utils.tracking`` (mode ``on``, the default, or ``off``)."""
    mode = (mode or "on").lower()
    if mode not in ("on", "off"):
        raise PatchRefused(f"unknown mode {mode!r} (allowed: on, off)")
    if mode == "off":
        record.status("armed", "off: verl's FileLogger left as is")
        return
    _STATE["record"] = record
    when_imported(TARGET_MODULE, _install)
    if record["status"] == "pending":
        record.status("armed")
