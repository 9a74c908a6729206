"""The fast reader of a chrome trace's events: the ``traceEvents`` array cut into batches at event
boundaries and each batch decoded by msgspec into a :class:`Event` struct that keeps only the seven
fields the Free ratio uses (``ph``, ``cat``, ``name``, ``pid``, ``tid``, ``ts``, ``dur``); msgspec skips
every other field (``args`` ...) in C without building it.

How a batch is cut: the bytes (plain, or gzip decompressed as a stream) are read ``chunk`` bytes at a
time; the last ``}``-``,``-``{`` separator (whitespace allowed) of the buffer is a *candidate* cut, and
``"[" + events up to the cut + "]"`` is decoded. A candidate that is not a real boundary between two
events (inside a string, or between two objects nested in an event's ``args``) always leaves that
batch unbalanced, so msgspec rejects it and the candidate before it is tried; a batch that decodes is
therefore exactly a run of whole events in file order. The end of the array is found the same way
(the ``]`` whose prefix decodes), and what follows it is checked to be the rest of the top-level object.

Anything this reader cannot explain with certainty (no ``"traceEvents": [`` near the start, an event
that is not an object or whose used fields have an odd type, a duplicate ``traceEvents`` key, a
separator search that fails ``MAX_TRIES`` times) raises :class:`Unsupported` before a result is made,
and :func:`bench.measure.trace_scan.scan_trace` then reads the whole file with the ijson path, so the
two paths always give the same result. A file cut short (a killed run) is *not* unsupported: the whole
events before the cut are yielded and :attr:`BatchReader.cut_short` is set, as ijson does.

Needs ``msgspec`` (a C extension); :data:`AVAILABLE` is ``False`` when it is missing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.measure.chrome_trace import open_binary

try:
    import msgspec

    class Event(msgspec.Struct, gc=False):
        """The used fields of one trace event (missing ones are ``None``; any JSON type is kept as is)."""

        ph: Any = None
        cat: Any = None
        name: Any = None
        pid: Any = None
        tid: Any = None
        ts: Any = None
        dur: Any = None

    _DECODE = msgspec.json.Decoder(list[Event]).decode
    _ANY = msgspec.json.Decoder().decode
    _DecodeError = msgspec.DecodeError
    _ValidationError = msgspec.ValidationError
    AVAILABLE = True
except ImportError:  # pragma: no cover - exercised by forcing the fallback in the tests
    AVAILABLE = False

#: bytes read at a time (the batch size); memory holds about two of them plus one decoded batch. 4 MB: a
#: 250 MB trace parses in 85 MB peak RSS (8 MB: 114 MB; 2 MB: 71 MB but 15 % more CPU), same CPU time as 8 MB
CHUNK = 4 << 20
#: wrong candidate cuts tried before giving up on a buffer (then more bytes are read)
MAX_TRIES = 8
#: a buffer without any usable cut larger than this (one giant event, or not an array of objects)
MAX_BUFFER = 256 << 20
#: "]" tried from the end for the close of the events array
MAX_CLOSE_TRIES = 64
#: how far into the file ``"traceEvents": [`` is looked for
HEAD_LIMIT = 64 << 20

_SEP = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')
_WS = b" \t\r\n"


class Unsupported(Exception):
    """The fast reader cannot read this file with certainty; the caller falls back to ijson."""


class BatchReader:
    """Iterate the events of one trace in batches (``list[Event]``, file order).

    Attributes (after iteration): ``cut_short``: the file ended inside the events array or the object
    around it (a truncated file), ``events``: events yielded. Raises :class:`Unsupported` (see the
    module docstring) and ``OSError``/``EOFError`` (unreadable or broken gzip) while iterating.
    """

    def __init__(self, path: str | Path, chunk: int | None = None, raw=None) -> None:
        if not AVAILABLE:
            raise Unsupported("msgspec is not installed")
        self.path = Path(path)
        self.raw = raw  # the file already open (a hashing reader), see chrome_trace.open_binary
        self.chunk = chunk or CHUNK
        self.cut_short = False
        self.events = 0

    def __iter__(self) -> Iterator[list]:
        with open_binary(self.path, self.raw) as fh:
            buf, is_object = self._head(fh)  # buf[0] is the "[" before the next event
            eof = False
            while True:
                if not eof and len(buf) < self.chunk:
                    data = self._read(fh)
                    eof = not data
                    buf += data
                    if not eof:
                        continue
                batch = self._cut(buf)
                if batch is not None:
                    self.events += len(batch)
                    yield batch
                    continue
                if not eof:
                    if len(buf) > MAX_BUFFER:
                        raise Unsupported("no event boundary in a large buffer")
                    data = self._read(fh)
                    eof = not data
                    buf += data
                    continue
                break
            last = self._tail(bytes(buf[1:]), is_object)
            if last:
                self.events += len(last)
                yield last

    def _read(self, fh) -> bytes:
        """The next bytes; ``b""`` at the end (of a gzip stream cut short too: :func:`open_binary`)."""
        return fh.read(self.chunk)

    def _head(self, fh) -> tuple[bytearray, bool]:
        """From the ``[`` that opens the events on, and whether the file is a ``{...}`` object."""
        buf = b""
        while True:
            data = self._read(fh)
            buf += data
            text = buf.lstrip(_WS)
            if text[:1] == b"[":
                return bytearray(text), False
            if text[:1] != b"{":
                raise Unsupported("not a JSON object or array (or a byte-order mark)")
            m = _KEY.search(buf)
            if m is not None:
                try:
                    head = _ANY(buf[: m.end()] + b"]}")
                except _DecodeError as exc:
                    raise Unsupported("traceEvents is not a key of the top-level object") from exc
                if not isinstance(head, dict):
                    raise Unsupported("not an object")
                return bytearray(buf[m.end() - 1:]), True
            if not data or len(buf) > HEAD_LIMIT:
                raise Unsupported("no traceEvents array near the start")

    def _cut(self, buf: bytearray) -> list | None:
        """Decode the whole events before the last real separator of ``buf`` and drop them from ``buf``.

        No copy: the separator's ``,`` is overwritten with ``]`` for the decode, then with ``[`` to open the
        rest. ``None`` (``buf`` unchanged) when no candidate separator is a real one."""
        ends: list = []
        window, step = len(buf), 1 << 16
        while not ends and window:
            window = max(0, window - step)
            step *= 2
            ends = [m.span() for m in _SEP.finditer(buf, window)]
        for start, stop in reversed(ends[-MAX_TRIES:]):
            comma = buf.index(b",", start, stop)
            buf[comma] = 0x5D  # "]"
            try:
                with memoryview(buf) as view, view[: comma + 1] as piece:
                    batch = _DECODE(piece)
            except _ValidationError as exc:
                raise Unsupported(f"an event of an unexpected shape ({exc})") from exc
            except _DecodeError:
                buf[comma] = 0x2C  # ","
                continue  # not a real boundary: try the one before
            buf[comma] = 0x5B  # "["
            del buf[:comma]
            return batch
        return None

    def _tail(self, buf: bytes, is_object: bool) -> list:
        """The events of the last piece (at most one event plus the end of the file)."""
        pos = len(buf)
        for _ in range(MAX_CLOSE_TRIES):
            pos = buf.rfind(b"]", 0, pos)
            if pos < 0:
                break
            try:
                last = _DECODE(b"[" + buf[: pos + 1])
            except _ValidationError as exc:
                raise Unsupported(f"an event of an unexpected shape ({exc})") from exc
            except _DecodeError:
                continue
            self._check_after(buf[pos + 1:], is_object)
            return last
        else:
            raise Unsupported("the end of the events array is not among the last candidates")
        # no "]" closes the array: the file was cut inside it; whole events before the cut count
        self.cut_short = True
        piece = buf.rstrip(_WS)
        if piece.endswith(b","):
            piece = piece[:-1]
        try:
            return _DECODE(b"[" + piece + b"]")
        except _ValidationError as exc:
            raise Unsupported(f"an event of an unexpected shape ({exc})") from exc
        except _DecodeError:
            if _SEP.search(piece):  # whole events may hide before the cut: the reference path finds them
                raise Unsupported("a cut piece with separators") from None
            return []  # one event begun, none whole

    def _check_after(self, after: bytes, is_object: bool) -> None:
        """What follows the events array must end the file (array) or the top-level object."""
        if not is_object:
            if after.strip(_WS):
                self.cut_short = True  # trailing garbage: ijson stops there too
            return
        try:
            rest = _ANY(b'{"traceEvents":[]' + after)
        except _DecodeError:
            self.cut_short = True  # cut (or broken) after the events: every event was read
            return
        if not isinstance(rest, dict) or b'"traceEvents"' in after:
            raise Unsupported("a second traceEvents key")
