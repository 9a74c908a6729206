"""A real tmpfs of a given size for disk-full tests (tests/test_faults.py, tests/test_disk_full.py): mounted at a
test's folder, skipped with the reason where mounting is not permitted, unmounted (lazily) at the end."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted_tmpfs(mnt: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (mount's syntax: ``4m``, ``24m``) at the new folder ``mnt``; yields ``mnt``.

    Raises:
        pytest.skip.Exception: the machine does not permit the mount (not root, no namespace).
    """
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({(p.stderr or p.stdout).strip() or p.returncode})")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
