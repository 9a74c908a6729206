"""Checks of the folders the harness will write (``--results``, ``--out``), done before anything is written.

A path is refused when a component is longer than the file system allows (``NAME_MAX``, 255 bytes on
Linux) or the whole is longer than ``PATH_MAX``; when it, or a folder on the way, is a dangling symbolic
link, a file, a device or a pipe; when it lies in a kernel file system (``/proc``, ``/sys``, ``/dev``) or a
read-only mount; or when its nearest existing folder is not writable.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from bench.core.errors import BenchError

#: longest path component, bytes (Linux ``NAME_MAX``)
NAME_MAX = 255
#: longest path, bytes (Linux ``PATH_MAX``)
PATH_MAX = 4096
#: kernel file systems the harness never writes into
SYSTEM_ROOTS = ("/proc", "/sys", "/dev")
#: folders under :data:`SYSTEM_ROOTS` that are ordinary writable storage
SYSTEM_EXCEPTIONS = ("/dev/shm",)


def check_names(flag: str, path: Path) -> None:
    """Refuse a path with an over-long component or total length, or an empty/NUL-holding one.

    Raises:
        BenchError: naming ``flag``, the path and the limit.
    """
    text = os.fsencode(str(path))
    if not text or b"\x00" in text:
        raise BenchError(f"{flag} {str(path)!r}: not a usable path")
    if len(text) > PATH_MAX:
        raise BenchError(f"{flag} {str(path)[:60]}...: path longer than {PATH_MAX} bytes")
    for part in Path(path).parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise BenchError(f"{flag} {str(path)[:60]}...: component {part[:40]}... is longer than {NAME_MAX} "
                             "bytes")


def check_not_system(flag: str, path: str | Path, what: str = "folder") -> None:
    """Refuse a path inside a kernel file system (:data:`SYSTEM_ROOTS`, but :data:`SYSTEM_EXCEPTIONS`), as given
    or once its links are resolved: nothing there keeps what the harness writes (a sqlite store there fails only
    after minutes of retries).

    Raises:
        BenchError: naming ``flag``, the path and the file system.
    """
    absolute = Path(os.path.abspath(path))
    real = Path(os.path.realpath(absolute))
    for root in SYSTEM_ROOTS:
        for p in (absolute, real):
            inside = p == Path(root) or Path(root) in p.parents
            if inside and not any(p == Path(e) or Path(e) in p.parents for e in SYSTEM_EXCEPTIONS):
                raise BenchError(f"{flag} {path}: inside {root}, a kernel file system (choose a normal {what})")


def check_folder(flag: str, path: str | Path, *, extra: tuple[str, ...] = ()) -> None:
    """Refuse ``path`` as a folder the harness will create or write into (nothing is created).

    Args:
        flag: the option as the user wrote it (``--results``).
        path: the folder; it may not exist yet.
        extra: sub-paths the run will create below it (``<matrix name>``), checked for length too.

    Raises:
        BenchError: naming ``flag``, the path and what is wrong.
    """
    path = Path(path)
    check_names(flag, path)
    for sub in extra:
        check_names(flag, path / sub)
    absolute = Path(os.path.abspath(path))
    check_not_system(flag, path)
    probe = absolute
    chain = [absolute, *absolute.parents]
    for p in chain:  # the nearest existing entry; a dangling link on the way is refused by name
        if os.path.islink(p) and not p.exists():
            raise BenchError(f"{flag} {path}: {p} is a link to {os.readlink(p)}, which does not exist")
        if p.exists():
            probe = p
            break
    try:
        st = os.stat(probe)
    except OSError as exc:
        raise BenchError(f"{flag} {path}: cannot use {probe}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        kind = "a pipe" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or \
            stat.S_ISBLK(st.st_mode) else "a file"
        raise BenchError(f"{flag} {path}: folder is not writable ({probe} is {kind}, not a folder)")
    try:
        readonly = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
    except OSError:
        readonly = False
    if readonly or not os.access(probe, os.W_OK | os.X_OK):
        raise BenchError(f"{flag} {path}: folder is not writable ({probe}{', a read-only mount' if readonly else ''})")


def check_matrix_folder(results: str | Path, name: str) -> None:
    """Refuse ``<results>/<name>`` (where a sweep of matrix ``name`` goes) when it, or its ``latest`` entry, is
    not what the harness made there (a file, or a ``latest`` that is not a link), before anything is written.

    Raises:
        BenchError: naming the entry and what to do.
    """
    base = Path(results) / name
    if os.path.lexists(base) and not base.is_dir():
        raise BenchError(f"{base}: exists and is not a results folder (move it away)")
    latest = base / "latest"
    if os.path.lexists(latest) and not latest.is_symlink():
        raise BenchError(f"{latest}: exists and is not the 'latest' link (move it away)")
