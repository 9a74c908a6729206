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
