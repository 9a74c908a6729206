"""Errors the harness reports to the user as one line with exit code 2."""

from __future__ import annotations


class BenchError(Exception):
    """Bad input or an unusable environment: printed as one line, exit code 2, nothing half-written.

    The message names the file, the key and the allowed values where they apply.
    """

    exit_code = 2


def where(file: object, key: str | None = None, line: int | None = None) -> str:
    """Format the ``file[:line]: key:`` prefix of an error message."""
    out = str(file)
    if line is not None:
        out += f":{line}"
    if key:
        out += f": {key}"
    return out


class DiskFullError(BenchError):
    """The results folder ran out of space (or quota): one line naming the folder and the space needed.

    Exit code 1 (the sweep stopped; rerunning resumes it once space is freed).
    """

    exit_code = 1


class Terminated(KeyboardInterrupt):
    """Raised in the harness by its SIGTERM handler, so every ``finally`` and process clean-up runs."""


_STEPS: list[str] = []


class doing:  # noqa: N801 - used as ``with doing("reading x.yaml"):``
    """Context manager naming the step in progress (``"reading results/x/record.json"``).

    An unexpected error reports the innermost step, so the user learns which file or step failed
    without a traceback. Nesting is allowed; the stack unwinds with the ``with`` blocks.
    """

    def __init__(self, step: str):
        self.step = step

    def __enter__(self) -> "doing":
        _STEPS.append(self.step)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None and not hasattr(exc, "bench_step"):
            try:
                exc.bench_step = self.step  # the innermost step that saw the error
            except AttributeError:
                pass
        if _STEPS and _STEPS[-1] == self.step:
            _STEPS.pop()


def current_step() -> str | None:
    """The innermost step in progress, or ``None``."""
    return _STEPS[-1] if _STEPS else None
