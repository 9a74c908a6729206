"""Writing and reading the harness's own files safely: atomic writes (a reader sees the old or the new content,
never a partial file, even if the process is killed) and bounded reads of JSON files."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from bench.core.errors import BenchError
from bench.core.inputs import read_bytes

#: largest JSON file :func:`read_json` reads
MAX_JSON_BYTES = 256 << 20


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and ``os.replace``.

    A reader sees the old or the new content, never a partial file, even if the process is killed. The
    file gets the mode a plain ``open()`` would give it (``0o666`` minus the umask: 0644 under umask 022).

    Raises:
        OSError: the folder cannot be written (``ENOSPC`` when the disk is full; nothing is left behind: neither
            the temporary file nor the folders this call made for it).
    """
    path = Path(path)
    made = []  # the missing folders this call makes, deepest first
    folder = path.parent
    while not os.path.lexists(folder) and folder != folder.parent:
        made.append(folder)
        folder = folder.parent
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        for d in made:
            try:
                d.rmdir()  # empty: only what this call made (another writer's file keeps it)
            except OSError:
                break
        raise


def current_umask() -> int:
    """The process umask (read from ``/proc/self/status`` where available, else set and restored)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_json(path: Path, data: Any) -> None:
    """:func:`atomic_write_text` of ``data`` as indented JSON (non-JSON values via ``str``)."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> Any | None:
    """The JSON content of ``path``, or ``None`` when missing or unusable: not a regular file (a pipe or a
    device is never opened for a blocking read), above :data:`MAX_JSON_BYTES` (checked while reading), not
    JSON. For run records use :func:`bench.records.run_record.read_record`, which names what is wrong."""
    try:
        return json.loads(read_bytes(path, MAX_JSON_BYTES, "JSON file"))
    except (BenchError, ValueError, RecursionError):
        return None


__all__ = ["MAX_JSON_BYTES", "atomic_write_json", "atomic_write_text", "current_umask", "read_json"]
