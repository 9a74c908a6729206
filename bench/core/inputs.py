"""Bounded, safe reading of every input file: regular files only, a size limit checked while reading, and YAML
with caps on nesting and on alias expansion.

Every input the harness reads (a matrix, a run config, a record, a queue file, a baseline) goes through
:func:`read_bytes` / :func:`read_text`: a pipe, a device, a socket or a folder is refused with one line
(opening uses ``O_NONBLOCK``, so a FIFO without a writer cannot block), and a file that grows past the
limit while it is read is refused at the limit (the ``stat`` size is not trusted). :func:`load_yaml`
parses with :class:`StrictLoader` (no tags execute, duplicate and non-string keys refused) and refuses a
document nested deeper than :data:`MAX_YAML_DEPTH` or whose alias expansion (the "billion laughs") would
exceed :data:`MAX_YAML_NODES` nodes, before anything is built from it.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from bench.core.errors import BenchError

#: nesting depth above which a YAML document is refused (a matrix is a few levels deep)
MAX_YAML_DEPTH = 64
#: nodes a YAML document may expand to with every alias expanded (a matrix has a few hundred; the pure-Python
#: parser composes about 10 000 nodes a second on a busy core, so the cap also bounds the time spent parsing)
MAX_YAML_NODES = 20_000
#: bytes read per ``read`` call
_CHUNK = 1 << 16


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a pipe"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_bytes(path: str | Path, limit: int, what: str = "file") -> bytes:
    """The content of the regular file ``path``, at most ``limit`` bytes.

    Args:
        path: the file (a symbolic link is followed; a dangling one is "does not exist").
        limit: maximum size in bytes, checked while reading (a file that grows is cut off and refused).
        what: how the message names the file (``"matrix"``, ``"record"``).

    Raises:
        BenchError: missing, unreadable, not a regular file (folder, pipe, device, socket), or larger than
            ``limit`` (the message names the path and what is wrong).
    """
    path = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if os.path.islink(path) and not path.exists():
            if exc.errno == errno.ELOOP:  # a -> b -> a: every link exists, none ends in a file
                raise BenchError(f"{path}: cannot read {what}: a loop of symbolic links (through "
                                 f"{os.readlink(path)}); point the link at a file") from None
            raise BenchError(f"{path}: cannot read {what}: a link to {os.readlink(path)}, which does not exist") \
                from None
        try:  # a socket cannot be opened at all (ENXIO): name what it is, not the kernel's words
            mode = os.stat(path).st_mode
        except OSError:
            mode = None
        if mode is not None and not stat.S_ISREG(mode):
            raise BenchError(f"{path}: cannot read {what}: is {_kind(mode)}, not a regular file") from None
        raise BenchError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BenchError(f"{path}: cannot read {what}: is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise BenchError(f"{path}: cannot read {what}: larger than {_size(limit)}")
        parts: list[bytes] = []
        got = 0
        while True:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                break
            got += len(chunk)
            if got > limit:
                raise BenchError(f"{path}: cannot read {what}: larger than {_size(limit)}")
            parts.append(chunk)
        return b"".join(parts)
    except OSError as exc:
        raise BenchError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read_text(path: str | Path, limit: int, what: str = "file") -> str:
    """:func:`read_bytes` decoded as UTF-8 text without NUL bytes.

    Raises:
        BenchError: as :func:`read_bytes`, or the content is not UTF-8 text or holds NUL bytes.
    """
    data = read_bytes(path, limit, what)
    if b"\x00" in data:
        raise BenchError(f"{path}: cannot read {what}: binary content (NUL bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BenchError(f"{path}: cannot read {what}: not UTF-8 text") from None


def _size(n: int) -> str:
    return f"{n // (1 << 20)} MiB" if n >= 1 << 20 else f"{n // 1024} KiB"


class YamlTooLarge(yaml.YAMLError):
    """A YAML document nested too deeply or expanding to too many nodes (``problem`` says which)."""

    def __init__(self, problem: str, mark: Any = None):
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate and non-string keys, nesting deeper than
    :data:`MAX_YAML_DEPTH`, and, while composing, a document whose size with every alias expanded exceeds
    :data:`MAX_YAML_NODES` (so an expanding file is refused as soon as it crosses the cap, not after)."""

    _depth = 0
    _total = 0
    max_nodes = MAX_YAML_NODES

    def compose_node(self, parent, index):  # noqa: D102 - PyYAML's hook, counted
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise YamlTooLarge(f"nested deeper than {MAX_YAML_DEPTH} levels", self.peek_event().start_mark)
            event = self.peek_event()
            open_anchors = self.__dict__.setdefault("_open", [])
            if isinstance(event, yaml.AliasEvent):
                if event.anchor in open_anchors:
                    raise YamlTooLarge(f"alias *{event.anchor} refers to a node that contains it (recursive)",
                                       event.start_mark)
                node = self.anchors.get(event.anchor)
                if node is not None:
                    if not hasattr(self, "_memo"):
                        self._memo: dict[int, int] = {}
                    self._total += expanded_size(node, self.max_nodes, self._memo)
            else:
                self._total += 1
            if self._total > self.max_nodes:
                raise YamlTooLarge(f"expands to more than {self.max_nodes} nodes (aliases expanded)",
                                   self.peek_event().start_mark)
            anchor = getattr(event, "anchor", None)
            if anchor is None:
                return super().compose_node(parent, index)
            open_anchors.append(anchor)
            try:
                return super().compose_node(parent, index)
            finally:
                open_anchors.pop()
        finally:
            self._depth -= 1


class ValueRefused(yaml.constructor.ConstructorError):
    """A scalar the harness refuses although YAML reads it (a YAML 1.1 number form, a lone surrogate); the
    mapping keys above it are put in front of ``problem`` as they unwind (``base.steps: ...``)."""

    keyed = False


def _construct_mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    out: dict = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, str):
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is not a string (quote it)", key_node.start_mark)
        if key in out:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        try:
            out[key] = loader.construct_object(value_node, deep=deep)
        except ValueRefused as exc:
            exc.problem = f"{key}{'.' if exc.keyed else ': '}{exc.problem}"
            exc.keyed = True
            raise
    return out


#: YAML 1.1 integer forms that YAML 1.2 (and a reader) takes for something else: octal ``010`` (8), hex ``0x2``,
#: binary ``0b11``, digits grouped with ``_`` (``1_0`` is 10); a plain decimal is ``[-+]?(0|[1-9][0-9]*)``
_DECIMAL = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
_INT_FORMS = ((re.compile(r"[-+]?0b", re.I), "a binary number"), (re.compile(r"[-+]?0x", re.I), "a hexadecimal number"),
              (re.compile(r"[-+]?0[0-9_]"), "an octal number"))


def _construct_number(loader: StrictLoader, node: yaml.ScalarNode) -> Any:
    value = loader.construct_scalar(node)
    if ":" in value:  # YAML 1.1 base 60 (``1:30`` is 90): never what a matrix means
        raise ValueRefused(
            None, None, f"{value!r} is a base-60 number in YAML 1.1 (quote it if it is text)", node.start_mark)
    tag = node.tag.rsplit(":", 1)[-1]
    number = getattr(yaml.constructor.SafeConstructor, f"construct_yaml_{tag}")(loader, node)
    if tag == "int" and not _DECIMAL.fullmatch(value):
        kind = next((k for pattern, k in _INT_FORMS if pattern.match(value)), "a number with '_'")
        raise ValueRefused(None, None, f"{value!r} is {kind} in YAML 1.1, read as {number} (write the number in "
                           "plain decimal digits, without a leading zero or '_'; quote it if it is text)",
                           node.start_mark)
    if tag == "float" and "_" in value:
        raise ValueRefused(None, None, f"{value!r} is read as {number} in YAML 1.1 ('_' dropped); write it without "
                           "'_' (quote it if it is text)", node.start_mark)
    return number


def _construct_str(loader: StrictLoader, node: yaml.ScalarNode) -> str:
    value = loader.construct_scalar(node)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # ``"\udc80"``: a lone surrogate, which no output can print
        raise ValueRefused(None, None, f"text holds a lone surrogate {value[exc.start]!r} at character {exc.start}, "
                           "which is not a character (allowed: UTF-8 text)", node.start_mark) from None
    return value


def _refuse_binary(loader: StrictLoader, node: yaml.Node) -> Any:
    raise yaml.constructor.ConstructorError(None, None, "binary values (!!binary) are not allowed", node.start_mark)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_number)
StrictLoader.add_constructor("tag:yaml.org,2002:float", _construct_number)
StrictLoader.add_constructor("tag:yaml.org,2002:binary", _refuse_binary)
StrictLoader.add_constructor("tag:yaml.org,2002:str", _construct_str)


def expanded_size(node: yaml.Node, limit: int = MAX_YAML_NODES, memo: dict[int, int] | None = None) -> int:
    """Nodes of a composed YAML document with every alias expanded (shared nodes counted at each use).

    Memoized per node, so the count costs one visit per distinct node however large the expansion.

    Raises:
        YamlTooLarge: the count exceeds ``limit``.
    """
    memo = {} if memo is None else memo

    def size(n: yaml.Node) -> int:
        if id(n) in memo:
            return memo[id(n)]
        memo[id(n)] = 1  # a recursive alias counts once (PyYAML refuses recursion at construction anyway)
        total = 1
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                total += size(k) + size(v)
                if total > limit:
                    break
        elif isinstance(n, yaml.SequenceNode):
            for v in n.value:
                total += size(v)
                if total > limit:
                    break
        memo[id(n)] = total
        if total > limit:
            raise YamlTooLarge(f"expands to more than {limit} nodes (aliases expanded)", n.start_mark)
        return total

    return size(node)


def load_yaml(text: str, max_nodes: int = MAX_YAML_NODES) -> Any:
    """Parse one YAML document with :class:`StrictLoader`, refusing it before construction when its alias
    expansion exceeds ``max_nodes`` nodes.

    Raises:
        yaml.YAMLError: malformed YAML, a duplicate or non-string key, nesting deeper than
            :data:`MAX_YAML_DEPTH` or expansion beyond ``max_nodes`` (:class:`YamlTooLarge`); the line is in
            ``problem_mark``.
    """
    loader = StrictLoader(text)
    loader.max_nodes = max_nodes
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded_size(node, max_nodes)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def yaml_error_line(path: str | Path, text: str, exc: yaml.YAMLError) -> str:
    """``path[:line]: malformed YAML: problem`` for a :class:`yaml.YAMLError` from :func:`load_yaml`."""
    mark = getattr(exc, "problem_mark", None)
    if mark is not None and mark.line >= len(text.splitlines()):  # at end of stream: where it opened
        mark = getattr(exc, "context_mark", None) or mark
    where = f"{path}:{mark.line + 1}" if mark else str(path)
    kind, problem = yaml_problem(exc)
    return f"{where}: {kind}: {problem}"


def yaml_problem(exc: yaml.YAMLError) -> tuple[str, str]:
    """``(kind, problem)`` of a :class:`yaml.YAMLError` from :func:`load_yaml`, in our words: kind "YAML
    refused" (a tag, too large, a refused value) or "malformed YAML"; PyYAML's "could not determine a
    constructor for the tag ..." becomes "tag !!python/name:... is not allowed (plain YAML only: no tags)"."""
    kind = "YAML refused" if isinstance(exc, (YamlTooLarge, ValueRefused)) else "malformed YAML"
    problem = str(getattr(exc, "problem", None) or exc)
    if problem.startswith("could not determine a constructor for the tag"):  # PyYAML's words for a tag
        tag = problem.removeprefix("could not determine a constructor for the tag").strip(" '")
        tag = tag.replace("tag:yaml.org,2002:", "!!")
        kind, problem = "YAML refused", f"tag {tag} is not allowed (plain YAML only: no tags)"
    return kind, problem


def _json_path(parts: tuple[Any, ...]) -> str:
    """``cells[0].summary.step_time_median`` from the keys and indices leading to a value."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def check_numbers(data: Any, where: str, *, signed: tuple[str, ...] = (), free: tuple[str, ...] = ()) -> None:
    """Refuse a number read back from a results file that no harness would have written: every number (a JSON
    float or integer, never a boolean) must be finite, and not negative unless its key path matches one of
    ``signed``. The one check of numbers read back from ``sweep.json``, baselines and tune results (records: the
    typed model, :class:`bench.records.run_record.RunRecord`, whose per-step metrics other than times may be NaN).

    Args:
        data: the parsed JSON document.
        where: the file, as the message names it.
        signed: :func:`fnmatch.fnmatchcase` patterns of key paths whose numbers may be negative (indices written
            ``[]``: ``history[].log_step_time.*``; ``matrix*``: anything under ``matrix``).
        free: patterns of key paths not checked at all (content the harness stores as a library gave it).

    Raises:
        BenchError: ``<where>: <key path>: <value> is not a finite number`` (or ``is negative (allowed: a number
            >= 0)``): the first offending number in document order.
    """
    import fnmatch
    import math

    def norm(parts: tuple[Any, ...]) -> str:
        return _json_path(tuple("[]" if isinstance(p, int) else p for p in parts)).replace(".[]", "[]")

    stack: list[tuple[tuple[Any, ...], Any]] = [((), data)]
    while stack:
        parts, value = stack.pop()
        if isinstance(value, dict):
            stack.extend(reversed([((*parts, str(k)), v) for k, v in value.items()]))
        elif isinstance(value, list):
            stack.extend(reversed([((*parts, i), v) for i, v in enumerate(value)]))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            key = norm(parts)
            if any(fnmatch.fnmatchcase(key, pat) for pat in free):
                continue
            if isinstance(value, float) and not math.isfinite(value):
                raise BenchError(f"{where}: {_json_path(parts)}: {value} is not a finite number (a hand-edited or "
                                 "damaged file; allowed: a finite number)")
            if value < 0 and not any(fnmatch.fnmatchcase(key, pat) for pat in signed):
                raise BenchError(f"{where}: {_json_path(parts)}: {value} is negative (a hand-edited or damaged "
                                 "file; allowed: a number >= 0)")
