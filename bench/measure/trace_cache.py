"""The parsed-trace cache: a trace's Free-ratio result (:class:`~bench.measure.torch_trace.TraceFree`) stored
as JSON under a key of the trace file, so that reading a run folder again (``record`` on resume, a
report or gate that re-measures) never parses the same bytes twice.

Where: ``<run folder>/.trace_cache/<key>.json`` (beside the run's results; ``results/`` and every
``.trace_cache/`` are git-ignored). Written atomically (temporary file + ``os.replace``), so a reader sees
a whole entry or none; an unreadable or foreign entry is ignored and rewritten.

The key (:func:`cache_key`), ``blake2b`` (128 bits) of:

* :data:`PARSER_VERSION` (bumped whenever the Free-ratio rules or the stored fields change, so old
  entries are never read by a parser that would compute something else);
* the file's size, ``st_mtime_ns``, inode and device;
* the first and the last :data:`EDGE_BYTES` bytes of the file.

Why this is safe without hashing every byte: a profiler writes a trace once and closes it; any later write
to the file sets ``st_mtime_ns`` (nanoseconds) and appending changes the size; replacing the file (a new
export, ``mv``, ``cp`` over it through a temporary) gives it a new inode. The head and the tail cover what
differs between two exports of the same run (the first events' timestamps, the trace's end) on a
file system whose timestamps are coarse (seconds on some network mounts) and which reuses an inode at once.
What it does not catch: a program that rewrites bytes in the middle of a file, keeps its size and resets its
mtime (``touch -d``); ``cache_key(path, full=True)`` (``BENCH_TRACE_CACHE=content``) hashes every byte
for such a case (about 1 GB/s), and ``BENCH_TRACE_CACHE=off`` disables the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from bench.measure._common import MeasureError

#: bump when the parser's result for the same bytes may change
PARSER_VERSION = 1
#: bytes hashed at each end of the file by the cheap key
EDGE_BYTES = 1 << 20
#: folder name, inside a run folder
CACHE_DIR = ".trace_cache"


def cache_mode() -> str:
    """``BENCH_TRACE_CACHE``: ``"stat"`` (default: the cheap key), ``"content"`` (hash every byte) or ``"off"``.

    Raises :class:`MeasureError` for any other value."""
    mode = os.environ.get("BENCH_TRACE_CACHE") or "stat"
    if mode not in ("stat", "content", "off"):
        raise MeasureError(f"BENCH_TRACE_CACHE must be one of stat, content, off, not {mode!r}")
    return mode


def cache_key(path: str | os.PathLike, full: bool = False) -> str:
    """The cache key of a trace file (32 hex digits; see the module docstring for what it covers).

    ``full``: hash every byte (and not the inode/mtime) instead of the two ends. Raises ``OSError`` when
    the file cannot be read."""
    p = Path(path)
    h = hashlib.blake2b(digest_size=16)
    with open(p, "rb") as fh:
        st = os.fstat(fh.fileno())
        if full:
            h.update(f"v{PARSER_VERSION} content {st.st_size}\n".encode())
            while block := fh.read(1 << 20):
                h.update(block)
            return h.hexdigest()
        h.update(f"v{PARSER_VERSION} {st.st_size} {st.st_mtime_ns} {st.st_ino} {st.st_dev}\n".encode())
        h.update(fh.read(EDGE_BYTES))
        if st.st_size > EDGE_BYTES:
            fh.seek(max(EDGE_BYTES, st.st_size - EDGE_BYTES))
            h.update(fh.read(EDGE_BYTES))
    return h.hexdigest()


def load(cache_dir: Path, key: str) -> dict | None:
    """The stored result for ``key`` (the ``TraceFree.to_dict()`` form), ``None`` when absent or unreadable."""
    try:
        entry = json.loads((cache_dir / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("version") != PARSER_VERSION or entry.get("key") != key:
        return None
    trace = entry.get("trace")
    return trace if isinstance(trace, dict) else None


def store(cache_dir: Path, key: str, trace: dict) -> None:
    """Store a result atomically; a cache that cannot be written (read-only results) is skipped silently."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=cache_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"version": PARSER_VERSION, "key": key, "trace": trace}, fh)
            os.replace(tmp, cache_dir / f"{key}.json")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        return
