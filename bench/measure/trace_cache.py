"""The parsed-profile cache: what a parser made of a profiler file (a torch/Ascend trace's
:class:`~bench.measure.torch_trace.TraceFree`, an Ascend ``kernel_details.csv``'s kernels per step, a
``step_trace_time.csv``'s rows) stored as JSON under the **hash of the file's content**, so that reading a run
folder again (``record`` on resume, the MLflow log of its top operators, ``sync``) never parses the same bytes
twice, whatever the file's name, inode or mtime.

Where: ``<run folder>/.trace_cache/<kind>-<digest>.json`` (beside the run's results; ``results/`` and every
``.trace_cache/`` are git-ignored). Written atomically (temporary file + ``os.replace``), so a reader sees a
whole entry or none; an unreadable or foreign entry is ignored and rewritten.

The key: :data:`HASH` of every byte of the file as stored (a ``.gz`` file: its compressed bytes), 128 bits —
``xxh3_128`` (xxhash, about 20 GB/s of CPU on this machine; ``hashlib.blake2b`` is 0.8 GB/s, it would add 2.5 s to
a 2 GB parse) or ``blake2b`` where xxhash is missing — and, in the entry's name, the parser's kind and version
(:data:`VERSIONS`, bumped whenever a parser's result for the same bytes may change, so an old entry is never
read by a parser that would compute something else).

The hash is **folded into the parse**: a parser reads the file through :class:`HashingReader`, which hashes every
raw byte as it passes, so a file met for the first time is read once (parse + hash). Only a lookup of a file
that may be cached (the cache folder holds entries) hashes the file before parsing it; a hit then costs that one
read (2 GB: about 0.5 s from the page cache), a miss one more read. ``BENCH_TRACE_CACHE=off`` disables the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from bench.measure._common import MeasureError

try:
    import xxhash

    HASH = "xxh3_128"
    _new = xxhash.xxh3_128
except ImportError:  # pragma: no cover - xxhash is a dependency; exercised by forcing it off in the tests
    HASH = "blake2b"

    def _new():
        return hashlib.blake2b(digest_size=16)

#: parser kind -> version (bump when that parser's result for the same bytes may change)
VERSIONS = {"trace": 3, "kernel_details": 1, "step_trace": 1}
#: folder name, inside a run folder
CACHE_DIR = ".trace_cache"
#: bytes read at a time by :meth:`HashingReader.digest`
BLOCK = 8 << 20


def cache_mode() -> str:
    """``BENCH_TRACE_CACHE``: ``"content"`` (default; also accepted: ``"on"``) or ``"off"``.

    Raises :class:`MeasureError` for any other value."""
    mode = os.environ.get("BENCH_TRACE_CACHE") or "content"
    if mode == "on":
        mode = "content"
    if mode not in ("content", "off"):
        raise MeasureError(f"BENCH_TRACE_CACHE must be one of content, on, off, not {mode!r}")
    return mode


def new_hasher():
    """A fresh :data:`HASH` object (``update``, ``hexdigest``)."""
    return _new()


class HashingReader:
    """A binary file that hashes every byte read from it, once: reading again after a ``seek`` back hashes only
    the bytes beyond the furthest point read (so ``seek(0)`` after peeking at the magic bytes costs nothing).

    :meth:`digest` reads what was not read yet (the parser may stop before the end: ijson at the end of the JSON
    value, a parse that fails) and returns the hash of the whole file, as :func:`content_hash` computes it."""

    def __init__(self, fh) -> None:
        self._fh = fh
        self._h = new_hasher()
        self._pos = 0
        self._done = 0  # bytes [0, _done) are hashed

    def _seen(self, data) -> None:
        end = self._pos + len(data)
        if end > self._done:
            skip = self._done - self._pos
            self._h.update(data[skip:] if skip > 0 else data)
            self._done = end
        self._pos = end

    def read(self, n: int = -1) -> bytes:
        data = self._fh.read(n)
        self._seen(data)
        return data

    def read1(self, n: int = -1) -> bytes:
        return self.read(n)

    def readinto(self, b) -> int:
        n = self._fh.readinto(b)
        with memoryview(b) as view:
            self._seen(view[:n])
        return n

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = self._fh.seek(pos, whence)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def flush(self) -> None:
        """Nothing to write."""

    def seekable(self) -> bool:
        return True

    def digest(self) -> str:
        """The content hash of the whole file (the rest is read and hashed first)."""
        self._fh.seek(self._done)
        self._pos = self._done
        while block := self._fh.read(BLOCK):
            self._seen(block)
        return self._h.hexdigest()

    def close(self) -> None:
        """Nothing: the file belongs to whoever opened it (a reader that falls back reads it again)."""

    @property
    def closed(self) -> bool:
        return self._fh.closed

    def __enter__(self) -> HashingReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_hashed(path: str | os.PathLike, what: str = "") -> tuple[Any, HashingReader]:
    """``(binary file, HashingReader over it)``: a file a parser reads through the hash (close the file when done).

    Raises:
        MeasureError: ``<path>: cannot read[ <what>]: <why>`` when it cannot be opened.
    """
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise MeasureError(f"{path}: cannot read{' ' + what if what else ''}: {exc.strerror or exc}") from exc
    return fh, HashingReader(fh)


def content_hash(path: str | os.PathLike) -> str:
    """:data:`HASH` of every byte of the file (32 hex digits; :func:`hashlib.file_digest`). Raises ``OSError``
    when it cannot be read."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, new_hasher).hexdigest()


def entry_name(kind: str, digest: str) -> str:
    """The file name of an entry: ``<kind>-v<version>-<HASH>-<digest>.json``."""
    return f"{kind}-v{VERSIONS[kind]}-{HASH}-{digest}.json"


def has_entries(cache_dir: Path | None) -> bool:
    """Whether ``cache_dir`` holds any entry (else a lookup cannot hit: the hash is only folded into the parse)."""
    if cache_dir is None:
        return False
    try:
        with os.scandir(cache_dir) as it:
            return any(e.name.endswith(".json") for e in it)
    except OSError:
        return False


def load(cache_dir: Path, kind: str, digest: str) -> dict | None:
    """The stored result of ``kind`` for the content ``digest``, ``None`` when absent or unreadable."""
    try:
        entry = json.loads((cache_dir / entry_name(kind, digest)).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("version") != VERSIONS[kind] or entry.get("digest") != digest:
        return None
    result = entry.get("result")
    return result if isinstance(result, dict) else None


def store(cache_dir: Path, kind: str, digest: str, result: dict) -> None:
    """Store a result atomically; a cache that cannot be written (read-only results) is skipped silently."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{kind}-{digest}.", suffix=".tmp", dir=cache_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"kind": kind, "version": VERSIONS[kind], "hash": HASH, "digest": digest,
                           "result": result}, fh)
            os.replace(tmp, cache_dir / entry_name(kind, digest))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        return
