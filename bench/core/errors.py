"""Errors the harness reports to the user as one line with exit code 2."""

from __future__ import annotations

import difflib
import errno
import sys
import threading
import unicodedata
from typing import Any


class BenchError(Exception):
    """Bad input or an unusable environment: printed as one line, exit code 2, nothing half-written.

    The message names the file, the key and the allowed values where they apply.
    """

    exit_code = 2


class InputError(BenchError):
    """Bad input named in the library's own terms: ``what`` is the input (``"tracking URI"``, or the label a
    caller passed down, e.g. a matrix key), and the message starts with it (``"<what> <value>: <what is
    wrong>"``). A command maps ``what`` to the flag the user typed (:func:`bench.commands.base.cli_message`), so no
    library module speaks in command-line flags.

    Args:
        what: the input's name, the message's first words.
        message: the whole message, starting with ``what``.

    Raises:
        ValueError: the message does not start with ``what``.
    """

    def __init__(self, what: str, message: str) -> None:
        if not message.startswith(what):
            raise ValueError(f"InputError: message {message[:60]!r} does not start with {what!r}")
        super().__init__(message)
        self.what = what


def printable(text: object) -> str:
    """``text`` safe to print on a terminal: every control or format character (Unicode categories ``Cc``, ``Cf``:
    ESC, BEL, a carriage return, a bidirectional override ...) and every lone surrogate (``Cs``) written as its Python
    escape (``\\x1b``, ``\\u202e``), so a name the user gave (a key, a file name, a sweep) can neither retitle nor
    clear the terminal nor make the line unprintable; a newline is kept (callers fold a message onto one line). The
    one escape every message the harness prints goes through (:func:`say`, the error boundary of ``bench.cli``)."""
    text = str(text)
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch != "\n" and unicodedata.category(ch) in ("Cc", "Cf", "Cs"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def say(text: object, stream: object = None) -> None:
    """Print one line of the harness's own (a warning, a note) on ``stream`` (default stderr) through
    :func:`printable`."""
    print(printable(text), file=stream or sys.stderr)


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


#: errno values that mean "no space left" (disk full, quota exceeded)
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def is_no_space(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it wraps) is an ``ENOSPC``/``EDQUOT`` error."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in NO_SPACE:
            return True
        if "No space left on device" in str(exc) or "database or disk is full" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


class Terminated(KeyboardInterrupt):
    """Raised in the harness by its SIGTERM handler, so every ``finally`` and process clean-up runs."""


_LOCAL = threading.local()


def _steps() -> list[str]:
    """The step stack of the calling thread (each thread its own: the node threads of ``--parallel`` run
    their runs' steps at the same time, :mod:`bench.execution.ray_parallel`)."""
    steps = getattr(_LOCAL, "steps", None)
    if steps is None:
        steps = _LOCAL.steps = []
    return steps


class doing:  # noqa: N801 - used as ``with doing("reading x.yaml"):``
    """Context manager naming the step in progress (``"reading results/x/record.json"``).

    An unexpected error reports the innermost step, so the user learns which file or step failed
    without a traceback. Nesting is allowed; the stack unwinds with the ``with`` blocks. Each thread has
    its own stack, so steps of concurrent threads never mix.
    """

    def __init__(self, step: str):
        self.step = step

    def __enter__(self) -> "doing":
        _steps().append(self.step)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None and not hasattr(exc, "bench_step"):
            try:
                exc.bench_step = self.step  # the innermost step that saw the error
            except AttributeError:
                pass
        steps = _steps()
        if steps and steps[-1] == self.step:
            steps.pop()


def current_step() -> str | None:
    """The innermost step in progress in the calling thread, or ``None``."""
    steps = _steps()
    return steps[-1] if steps else None


def did_you_mean(word: Any, allowed: Any) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``allowed`` to ``word`` (difflib ratio >= 0.6), else ``''``."""
    if not isinstance(word, str):
        return ""
    hit = difflib.get_close_matches(word, [str(a) for a in allowed], n=1)
    return f" (did you mean {hit[0]!r}?)" if hit else ""


def clip_words(text: Any, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters: when longer, cut at the last space before the limit
    and marked with ``...``; where that space would drop more than half of the room (a long path or word after a
    short head: ``r0 bad_input: /a/very/long/path...``), the long word is cut at the limit instead."""
    flat = " ".join(str(text).split())
    if len(flat) <= limit:
        return flat
    room = max(limit - 3, 1)
    cut = flat.rfind(" ", 0, room + 1)
    return (flat[:cut] if cut > room // 2 else flat[:room]).rstrip(" ,;:") + "..."
