"""Checks of the folders the harness will write (``--results``, ``--out``), done before anything is written.

A path is refused when a component is longer than the file system allows (``NAME_MAX``, 255 bytes on
Linux) or the whole is longer than ``PATH_MAX``; when it, or a folder on the way, is a dangling symbolic
link, a file, a device or a pipe; when it lies in a kernel file system (``/proc``, ``/sys``, ``/dev``) or a
read-only mount; or when its nearest existing folder is not writable.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from bench.core.errors import BenchError, InputError

#: longest path component, bytes (Linux ``NAME_MAX``)
NAME_MAX = 255
#: longest path, bytes (Linux ``PATH_MAX``)
PATH_MAX = 4096
#: kernel file systems the harness never writes into
SYSTEM_ROOTS = ("/proc", "/sys", "/dev")
#: folders under :data:`SYSTEM_ROOTS` that are ordinary writable storage
SYSTEM_EXCEPTIONS = ("/dev/shm",)


def limits(path: str | Path) -> tuple[int, int]:
    """``(longest name, longest path)`` in bytes on the file system that holds ``path``: ``os.pathconf``'s
    ``PC_NAME_MAX`` and ``PC_PATH_MAX`` of its nearest existing folder, else :data:`NAME_MAX` and :data:`PATH_MAX`."""
    folder = Path(os.path.abspath(path))
    while not os.path.isdir(folder) and folder.parent != folder:
        folder = folder.parent
    out = []
    for name, default in (("PC_NAME_MAX", NAME_MAX), ("PC_PATH_MAX", PATH_MAX)):
        try:
            value = os.pathconf(folder, name)
        except (OSError, ValueError):
            value = -1
        out.append(value if value > 0 else default)
    return out[0], out[1]


def check_names(flag: str, path: Path, shown: object = None) -> None:
    """Refuse a path with an over-long component or total length (:func:`limits` of its file system), or an
    empty/NUL-holding one; ``shown``: how the message names the value (default: the path).

    Raises:
        BenchError: naming ``flag``, the path and the limit.
    """
    shown = str(path) if shown is None else str(shown)
    text = os.fsencode(str(path))
    if not text or b"\x00" in text:
        raise InputError(flag, f"{flag} {shown!r}: not a usable path")
    name_max, path_max = limits(path)
    if len(text) > path_max:
        raise InputError(flag, f"{flag} {shown[:60]}...: path longer than {path_max} bytes")
    for part in Path(path).parts:
        if len(os.fsencode(part)) > name_max:
            raise InputError(flag, f"{flag} {shown[:60]}...: component {part[:40]}... is longer than {name_max} "
                             "bytes (the file system's limit)")


def resolve_path(flag: str, path: str | Path, shown: object = None) -> Path:
    """The one resolver of a path the harness opens or creates (a store, a results or output folder, a baseline, a
    study, a matrix), before anything is written: names within the file system's limits (:func:`check_names`, also
    once the links are resolved), every symbolic link on the way followed, and a dangling one or a loop of links
    refused by name (a dangling ``mlflow.db`` passed ``Path.exists`` checks, then MLflow retried for 100 s).

    Args:
        flag: the option or key as the user wrote it (``--tracking-uri``).
        path: the path; it, or its tail, may not exist yet.
        shown: how the message names the value (a URI rather than its path); default the path.

    Returns:
        The absolute path with every link resolved.

    Raises:
        BenchError: ``<flag> <shown>: <what is wrong>``.
    """
    shown = str(path) if shown is None else str(shown)
    check_names(flag, Path(path), shown)
    current = Path(os.path.abspath(path))
    walked = Path(current.anchor)
    for part in current.parts[1:]:
        walked = walked / part
        if os.path.islink(walked):
            try:
                walked = Path(os.path.realpath(walked, strict=True))
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise InputError(flag, f"{flag} {shown}: {walked} is a loop of symbolic links") from None
                raise InputError(flag, f"{flag} {shown}: {walked} is a link to {os.readlink(walked)}, which does not "
                                 "exist (remove the link or create its target)") from None
        elif not os.path.lexists(walked):
            walked = walked.joinpath(*current.parts[len(walked.parts):])
            break
    check_names(flag, walked, shown)
    return walked


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
                raise InputError(flag, f"{flag} {path}: inside {root}, a kernel file system (choose a normal {what})")


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
    resolve_path(flag, path)  # a dangling link or a loop on the way is refused by name
    probe = absolute
    for p in [absolute, *absolute.parents]:  # the nearest existing entry
        if p.exists():
            probe = p
            break
    try:
        st = os.stat(probe)
    except OSError as exc:
        raise InputError(flag, f"{flag} {path}: cannot use {probe}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        kind = "a pipe" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or \
            stat.S_ISBLK(st.st_mode) else "a file"
        raise InputError(flag, f"{flag} {path}: folder is not writable ({probe} is {kind}, not a folder)")
    try:
        readonly = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
    except OSError:
        readonly = False
    if readonly or not os.access(probe, os.W_OK | os.X_OK):
        ro = ", a read-only mount" if readonly else ""
        raise InputError(flag, f"{flag} {path}: folder is not writable ({probe}{ro})")


def check_matrix_folder(results: str | Path, name: str) -> None:
    """Refuse ``<results>/<name>`` (where a sweep of matrix ``name`` goes) when it, its ``latest`` entry or its
    ``.lock`` is not what the harness made there (a file, a ``latest`` that is not a link, a ``.lock`` that is not a
    regular file), before anything is written.

    Raises:
        BenchError: naming the entry and what to do.
    """
    base = Path(results) / name
    if os.path.lexists(base) and not base.is_dir():
        raise BenchError(f"{base}: exists and is not a results folder (move it away)")
    latest = base / "latest"
    if os.path.lexists(latest) and not latest.is_symlink():
        raise BenchError(f"{latest}: exists and is not the 'latest' link (move it away)")
    lock = base / ".lock"
    if os.path.lexists(lock) and not os.path.isfile(lock):  # a folder there was blamed on the results folder
        kind = "a folder" if lock.is_dir() else "a link or a special file"
        raise BenchError(f"{lock}: exists and is not the harness's lock file ({kind}; move it away)")
