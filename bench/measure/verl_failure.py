"""Why a verl run failed, read from its log: one kind and one line a performance engineer can act on.

A real ``main_ppo`` run fails in a few typical ways, told apart here from ``run.log`` (driver output plus
the Ray workers' lines it forwards) and from how the process ended:

``config``
    Hydra or verl refused the configuration: Hydra's "Could not override" / "Key ... is not in struct",
    OmegaConf's ``ConfigAttributeError`` / ``ConfigKeyError`` / ``ValidationError``, verl's
    ``validate_config`` assertions. The reason is the first error line and, when the line names a key,
    the override of the launch that set it.
``startup_timeout``
    the run hit its start-up limit before any training step finished (typical: a vLLM engine that died
    while starting, after which ``main_ppo`` waits forever).
``timeout``
    the run hit its wall-clock limit after training had started.
``oom``
    out of memory with evidence in the log: torch's ``OutOfMemoryError`` / "out of memory", Ray's
    memory monitor ("running low on memory"), vLLM's KV-cache shortage.
``worker_died``
    a Ray actor or worker process died (``ActorDiedError``, "The actor died unexpectedly", a
    ``DataLoader``/vLLM worker "killed by signal").
``crash``
    anything else: the last exception line of the log.
"""

from __future__ import annotations

import re

_CONFIG = re.compile(
    r"(Could not override '[^']+'|Key '[^']+' is not in struct|Error merging override|"
    r"ConfigAttributeError|ConfigKeyError|omegaconf\.errors\.\w+|ValidationError|"
    r"MissingMandatoryValue|Could not load '[^']+'|In '[^']+': Could not find|\[validate_config\]|"
    r"mismatched input|no viable alternative at input)"
)
_OOM = re.compile(r"(OutOfMemoryError|out of memory|running low on memory|"
                  r"No available memory for the cache blocks|Insufficient memory|Cannot allocate memory)", re.I)
_DIED = re.compile(r"(ActorDiedError|The actor died unexpectedly|RayActorError|Worker exit type: SYSTEM_ERROR|"
                   r"worker \(pid \d+\) is killed by signal|killed by signal|WorkerCrashedError|"
                   r"EngineDeadError|Engine core initialization failed)")
_EXC_LINE = re.compile(r"^(?:\S+ pid=\d+\)\s*)?((?:[A-Za-z_][\w.]*)(?:Error|Exception|Exit|Interrupt)\b.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_KEY_IN_LINE = re.compile(r"(?:override|Key|key) '([A-Za-z0-9_.+~]+)'")


def _clean(line: str) -> str:
    line = _ANSI.sub("", line).strip()
    return re.sub(r"^\((?:[\w]+ )?pid=\d+(?:, ip=[\d.]+)?\)\s*", "", line)


def _first(pattern: re.Pattern, lines: list[str]) -> str | None:
    for line in lines:
        if pattern.search(line):
            return _clean(line)
    return None


def first_exception_line(lines: list[str]) -> str | None:
    """The first ``SomethingError: message`` line of a log: the root cause that a later
    "see root cause above" points to."""
    for line in lines:
        c = _clean(line)
        m = _EXC_LINE.match(c)
        if m and not c.startswith("Traceback"):
            return m.group(1)[:400]
    return None


def last_exception_line(lines: list[str]) -> str | None:
    """The last ``SomethingError: message`` line of a log (ANSI colours and Ray's actor prefix removed)."""
    for line in reversed(lines):
        c = _clean(line)
        m = _EXC_LINE.match(c)
        if m and not c.startswith("Traceback"):
            return m.group(1)[:400]
    return None


def culprit_override(line: str, overrides: list[str]) -> str | None:
    """The override of ``overrides`` whose key the error ``line`` names (``None`` if none matches)."""
    keys = _KEY_IN_LINE.findall(line)
    for key in keys:
        bare = key.lstrip("+~")
        for o in overrides:
            okey = o.split("=", 1)[0].lstrip("+~")
            if okey == bare or okey.endswith("." + bare) or bare.endswith("." + okey):
                return o
    return None


def classify(log_text: str, *, timed_out: bool = False, steps_done: int = 0, returncode: int | None = None,
             overrides: list[str] | None = None) -> tuple[str, str] | None:
    """``(kind, reason)`` of a failed verl run (see the module docstring), or ``None`` when the log says
    nothing the generic classification would not say better.

    Args:
        log_text: the run's ``run.log`` (or its tail).
        timed_out: the executor killed the run at a time limit.
        steps_done: training steps in the metrics JSONL (0 = training never started).
        returncode: the process's exit code (negative: killed by that signal).
        overrides: the launch's Hydra overrides (to name the one a config error is about).
    """
    lines = [ln for ln in log_text.splitlines() if ln.strip()]
    if timed_out:
        if steps_done == 0:
            last = last_exception_line(lines)
            return "startup_timeout", "no training step finished before the time limit" + (
                f" (last error in the log: {last})" if last else "")
        return "timeout", f"timed out after {steps_done} finished step(s)"
    oom = _first(_OOM, lines)
    if oom:
        return "oom", oom[:400]
    cfg = _first(_CONFIG, lines)
    if cfg and steps_done == 0:
        culprit = culprit_override(cfg, overrides or [])
        return "config", cfg[:400] + (f" (override {culprit})" if culprit else "")
    died = _first(_DIED, lines)
    if died:
        cause = first_exception_line(lines)
        return "worker_died", died[:300] + (f"; first error: {cause}" if cause and cause not in died else "")
    last = last_exception_line(lines)
    if last:
        return "crash", last
    return None
