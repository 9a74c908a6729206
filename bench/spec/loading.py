"""Reading a matrix file: strict YAML (duplicate keys refused), ``${VAR}`` expansion, ``base.KEY=VALUE``
overrides from the command line, and pydantic errors turned into one line naming file, key and line
(:func:`load_matrix`; the schema is :mod:`bench.spec.matrix`).

Every error is a :class:`~bench.errors.BenchError` naming the file, the key (and line where known) and
the allowed values.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from bench.errors import BenchError, doing
from bench.spec.matrix import DESIGN_TYPES, Matrix

#: matrix files above this size are refused (a matrix is a page of YAML)
MAX_MATRIX_BYTES = 1 << 20

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(value: str, *, file: str, key: str, strict: bool) -> str:
    """Replace ``${VAR}`` / ``${VAR:-default}`` in ``value`` from the environment.

    With ``strict`` an unset variable without default raises; otherwise it is left as ``${VAR}``.

    Raises:
        BenchError: ``strict`` and a variable is unset (message names file, key and variable).
    """

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        if strict:
            raise BenchError(f"{file}: {key}: environment variable {name} is not set (export {name}=...)")
        return m.group(0)

    return _ENV_REF.sub(sub, value)


def _line_of(text: str, loc: tuple[Any, ...]) -> int | None:
    """Best-effort line number of the first key of ``loc`` in the YAML text."""
    for part in loc:
        if isinstance(part, str):
            m = re.search(rf"^\s*{re.escape(part)}\s*:", text, re.M)
            if m:
                return text.count("\n", 0, m.start()) + 1
    return None


def format_validation_error(file: str | Path, exc: ValidationError, text: str = "", prefix: str = "") -> str:
    """One line naming file, line (when found), dotted key and pydantic's message for the first error."""
    err = exc.errors()[0]
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p in DESIGN_TYPES))
    key = ".".join(str(p) for p in loc) or "(root)"
    if prefix:
        key = f"{prefix}.{key}"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "union_tag_invalid" or (err["type"] == "literal_error" and "type" in key):
        bad = err.get("input")
        bad = bad.get("type", bad) if isinstance(bad, dict) else bad
        msg = f"unknown design {bad!r} (allowed: {', '.join(DESIGN_TYPES)})"
    elif err["type"] == "literal_error":
        msg = f"{msg.replace('Input should be', 'allowed:')}, got {err.get('input')!r}"
    elif err["type"] == "extra_forbidden":
        msg = "unknown key"
    line = _line_of(text, loc) if text else None
    where = f"{file}:{line}" if line else str(file)
    return f"{where}: {key}: {msg}"


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys and non-string keys in mappings (no tags execute)."""


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
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(text: str) -> Any:
    """Parse YAML with :class:`StrictLoader`.

    Raises:
        yaml.YAMLError: malformed YAML, a duplicate or non-string key (with its line in ``problem_mark``).
    """
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass


def load_matrix(path: str | Path, overrides: list[str] | None = None) -> Matrix:
    """Read and validate a matrix YAML file.

    ``design`` may be written as a bare string (``design: full``). ``overrides``: Hydra-style
    ``base.KEY=VALUE`` strings from the command line (:func:`apply_overrides`), applied to the file's
    content before it is validated by the same model, so a bad value is refused exactly as in the file.

    Raises:
        BenchError: unreadable file, malformed YAML (with line), invalid content (file, key, allowed values),
            or a malformed or invalid override (naming it and the key).
    """
    with doing(f"reading the matrix {path}"):
        return _load_matrix(Path(path), list(overrides or []))


#: top-level keys that ``KEY=VALUE`` overrides may set (below them, any key the model allows)
OVERRIDABLE = ("base",)


def apply_overrides(raw: dict[str, Any], overrides: list[str], file: str | Path) -> dict[str, str]:
    """Set each ``base.KEY[.SUBKEY]=VALUE`` of ``overrides`` in the raw matrix mapping ``raw`` (in place).

    VALUE is read as YAML (``4`` is a number, ``true`` a boolean, ``[1, 2]`` a list, ``''`` an empty
    string). Returns {dotted key: the override as given}, to name it in validation errors.

    Raises:
        BenchError: not ``KEY=VALUE``, a key outside ``base.*``, a value that is not YAML, or a key whose
            parent is not a mapping in the file.
    """
    given: dict[str, str] = {}
    for ov in overrides:
        key, eq, value = ov.partition("=")
        parts = key.strip().split(".")
        if not eq or not all(parts) or len(parts) < 2 or parts[0] not in OVERRIDABLE:
            raise BenchError(f"{file}: override {ov!r}: expected {'|'.join(OVERRIDABLE)}.KEY=VALUE "
                             "(e.g. base.steps=4)")
        try:
            parsed = load_yaml(value) if value.strip() else ""
        except yaml.YAMLError as exc:
            raise BenchError(
                f"{file}: override {ov!r}: value is not YAML: {getattr(exc, 'problem', None) or exc}"
            ) from None
        node = raw
        for i, part in enumerate(parts[:-1]):
            if node.get(part) is None:  # absent or empty (``base:`` with nothing below) in the file
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise BenchError(f"{file}: override {ov!r}: {'.'.join(parts[:i + 1])} is not a mapping in the file")
        node[parts[-1]] = parsed
        given[".".join(parts)] = ov
    return given


def _load_matrix(path: Path, overrides: list[str] | None = None) -> Matrix:
    try:
        if path.is_dir():
            raise BenchError(f"{path}: cannot read matrix: is a folder")
        if path.exists() and path.stat().st_size > MAX_MATRIX_BYTES:
            raise BenchError(f"{path}: cannot read matrix: larger than {MAX_MATRIX_BYTES // 1024} KiB")
        text = path.read_text()
    except OSError as exc:
        raise BenchError(f"{path}: cannot read matrix: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise BenchError(f"{path}: cannot read matrix: not UTF-8 text") from None
    if "\x00" in text:
        raise BenchError(f"{path}: cannot read matrix: binary content (NUL bytes)")
    try:
        raw = load_yaml(text)
    except RecursionError:
        raise BenchError(f"{path}: malformed YAML: nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        if mark is not None and mark.line >= len(text.splitlines()):  # at end of stream: where it opened
            mark = getattr(exc, "context_mark", None) or mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise BenchError(f"{where}: malformed YAML: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(raw, dict):
        raise BenchError(f"{path}: a matrix must be a mapping with at least 'name'")
    given = apply_overrides(raw, overrides, path) if overrides else {}
    if isinstance(raw.get("design"), str):
        raw["design"] = {"type": raw["design"]}
    try:
        matrix = Matrix.model_validate(raw)
    except ValidationError as exc:
        loc = ".".join(str(p) for p in exc.errors()[0]["loc"])
        hit = next((ov for key, ov in given.items() if loc == key or loc.startswith(key + ".")), None)
        if hit is None:  # a check of the whole block (e.g. ``base``) that an override may have upset: name them all
            hit = " ".join(ov for key, ov in given.items() if key.startswith(loc + ".")) or None
        if hit is not None:  # the value came from the command line: name it, not a line of the file
            raise BenchError(format_validation_error(f"{path}: override {hit}", exc)) from None
        raise BenchError(format_validation_error(path, exc, text)) from None
    matrix.source = str(path)
    return matrix
