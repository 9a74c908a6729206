"""Reading a matrix file: strict YAML (duplicate keys refused), ``${VAR}`` expansion, ``base.KEY=VALUE``
overrides from the command line, and pydantic errors turned into one line naming file, key and line
(:func:`load_matrix`; the schema is :mod:`bench.spec.matrix`).

Every error is a :class:`~bench.core.errors.BenchError` naming the file, the key (and line where known) and
the allowed values.
"""

from __future__ import annotations

import os
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from bench.core.errors import BenchError, did_you_mean, doing
from bench.core.inputs import StrictLoader, ValueRefused, load_yaml, read_text, yaml_error_line, yaml_problem
from bench.core.paths import check_names
from bench.spec import matrix as schema
from bench.spec.expect import ExpectBlock
from bench.spec.matrix import DESIGN_TYPES, Matrix

__all__ = ["StrictLoader", "load_yaml", "load_matrix", "apply_overrides", "expand_env", "format_validation_error"]

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


def _line_of(text: str, loc: tuple[Any, ...], within: str = "") -> int | None:
    """Best-effort line number of the first key of ``loc`` in the YAML text; with ``within`` (a top-level key
    such as ``tune``), searched below that key only (``tune.timeout_s`` is not ``base.timeout_s``)."""
    start = 0
    if within:
        top = re.search(rf"^{re.escape(within)}\s*:", text, re.M)
        if top is None:
            return None
        start = top.end()
    for part in loc:
        if isinstance(part, str):
            m = re.compile(rf"^\s*{re.escape(part)}\s*:", re.M).search(text, start)
            if m:
                return text.count("\n", 0, m.start()) + 1
    return None


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that holds the last key of ``loc`` (for "did you mean" among its fields)."""
    keyed = False  # the previous part was a mapping field: this part is one of its keys, not a field
    for part in loc[:-1]:
        if keyed or not isinstance(part, str):
            keyed = False
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        ann = field.annotation
        cands = [a for a in (typing.get_args(ann) or (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        for a in typing.get_args(ann):  # list[Model]
            cands += [b for b in typing.get_args(a) if isinstance(b, type) and issubclass(b, BaseModel)]
        if not cands:
            return None
        model, keyed = cands[0], typing.get_origin(ann) is dict
    return model


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a mapping", type(None): "empty"}.get(type(value), type(value).__name__)


#: pydantic error types -> what is allowed, in our words
_EXPECTED = {"int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
             "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
             "bool_parsing": "true or false", "string_type": "a string", "list_type": "a list",
             "dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping"}


def format_validation_error(file: str | Path, exc: ValidationError, text: str = "", prefix: str = "",
                            model: type[BaseModel] = Matrix) -> str:
    """One line naming file, line (when found), dotted key, the bad value and what is allowed, for the first
    error of ``exc`` (pydantic's own wording is replaced where it names its internals)."""
    errs = exc.errors()
    err = errs[0]
    if any(e["type"] == "missing" for e in errs):  # a misspelled key is both missing and unknown: name the typo
        err = next((e for e in errs if e["type"] == "extra_forbidden"), err)
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p in DESIGN_TYPES))
    key = ".".join(str(p) for p in loc)
    if prefix:
        key = f"{prefix}.{key}" if key else prefix
    msg = err["msg"].removeprefix("Value error, ")
    bad = err.get("input")
    kind = err["type"]
    in_design = bool(loc) and loc[0] == "design"
    if kind in ("union_tag_invalid", "union_tag_not_found") or (kind == "literal_error" and in_design
                                                                  and loc[-1] == "type"):
        got = bad.get("type", bad) if isinstance(bad, dict) else bad
        msg = (f"missing 'type' (allowed: {', '.join(DESIGN_TYPES)})" if kind == "union_tag_not_found" else
               f"unknown design {got!r}{did_you_mean(got, DESIGN_TYPES)} (allowed: {', '.join(DESIGN_TYPES)})")
        key = key.removesuffix(".type") if not prefix else key
    elif kind == "extra_forbidden":
        raw_loc = err["loc"]
        if raw_loc[:1] == ("design",) and len(raw_loc) > 2 and raw_loc[1] in DESIGN_TYPES:
            holder = {typing.get_args(c.model_fields["type"].annotation)[0]: c
                      for c in typing.get_args(schema.Design)}.get(raw_loc[1])
        else:
            holder = _model_at(ExpectBlock if loc[:1] == ("expect",) else model, loc)
        allowed = getattr(holder, "allowed_keys", None)  # a model with extra keys of its own (``Base``)
        fields = (allowed() if allowed else sorted(holder.model_fields)) if holder is not None else []
        msg = "unknown key" + did_you_mean(loc[-1], fields) + (f" (allowed: {', '.join(fields)})" if fields else "")
    else:
        msg = value_message(err)
    line = _line_of(text, loc, prefix) if text else None
    where = f"{file}:{line}" if line else str(file)
    if not key:  # a check of the whole model: its message names the key itself
        return f"{where}: {msg}"
    return f"{where}: {key}: {msg}"


#: the name patterns of the schemas (matrix ``name``, ``tune.study``), in words
_PATTERN_WORDS = {r"^[A-Za-z0-9][A-Za-z0-9_.-]*$": "letters, digits, '_', '.' and '-', starting with a letter or digit"}


def value_message(err: dict[str, Any]) -> str:
    """What is wrong with a value, in the harness's words, for one pydantic error (``ValidationError.errors()``
    item): the expected type, range or size and the bad value; a check's own message as it is."""
    kind, bad, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    msg = err["msg"].removeprefix("Value error, ")
    if kind == "missing":
        return "required key missing"
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {_type_name(bad)} {_short(bad)}"
    if kind in ("too_short", "too_long"):
        n = ctx.get("min_length") if kind == "too_short" else ctx.get("max_length")
        return f"must hold {'at least' if kind == 'too_short' else 'at most'} {n} item(s), got {_short(bad)}"
    if kind == "finite_number":
        return f"must be a finite number, got {_short(bad)}"
    if kind == "string_pattern_mismatch" and ctx.get("pattern") in _PATTERN_WORDS:  # the rule, not the regex
        return f"must be {_PATTERN_WORDS[ctx['pattern']]}, got {_short(bad)}"
    if kind.startswith(("greater_than", "less_than")) or kind in ("string_too_long", "string_pattern_mismatch"):
        return f"{msg.replace('Input should be', 'must be').replace('String should', 'must')}, got {_short(bad)}"
    if kind == "literal_error":
        hint = did_you_mean(bad, re.findall(r"'([^']*)'", str(ctx.get("expected", ""))))
        return f"allowed: {msg.replace('Input should be ', '')}, got {bad!r}{hint}"
    return msg.replace("Input should be", "must be")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
        ctrl = next((c for c in ov if ord(c) < 32 or ord(c) == 127), None)
        if ctrl is not None:  # YAML would read "4\r" as 4: what was typed is not what runs
            raise BenchError(f"{file}: override {ov!r}: holds the control character {ctrl!r} (allowed: one line "
                             "of printable text, base.KEY=VALUE)")
        key, eq, value = ov.partition("=")
        parts = key.strip().split(".")
        if not eq or not all(parts) or len(parts) < 2 or parts[0] not in OVERRIDABLE:
            raise BenchError(f"{file}: override {ov!r}: expected {'|'.join(OVERRIDABLE)}.KEY=VALUE "
                             "(e.g. base.steps=4)")
        dotted = ".".join(parts)
        twice = next((g for g in given if g == dotted or g.startswith(dotted + ".") or dotted.startswith(g + ".")),
                     None)
        if twice is not None:  # the last one would win silently
            raise BenchError(f"{file}: override {ov!r}: {dotted} is set twice (also by {given[twice]!r}); "
                             "give each key once")
        try:
            parsed = load_yaml(value) if value.strip() else ""
        except ValueRefused as exc:
            raise BenchError(f"{file}: override {ov!r}: {dotted}: {exc.problem}") from None
        except yaml.YAMLError as exc:
            kind, problem = yaml_problem(exc)
            what = "value is not YAML" if kind == "malformed YAML" else kind
            raise BenchError(f"{file}: override {ov!r}: {what}: {problem}") from None
        node = raw
        for i, part in enumerate(parts[:-1]):
            if node.get(part) is None:  # absent or empty (``base:`` with nothing below) in the file
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise BenchError(f"{file}: override {ov!r}: {'.'.join(parts[:i + 1])} is not a mapping in the file")
        node[parts[-1]] = parsed
        given[dotted] = ov
    return given


def _load_matrix(path: Path, overrides: list[str] | None = None) -> Matrix:
    check_names("matrix", path)  # before any lookup: an over-long name is an OSError of every call below
    if not os.path.lexists(path):  # a near miss of an existing matrix file is named
        try:
            folder = path.parent if path.parent.is_dir() else Path(".")
            near = [str(folder / p.name) for p in (*folder.glob("*.yaml"), *folder.glob("*.yml"))]
        except OSError:
            near = []
        raise BenchError(f"{path}: cannot read matrix: no such file{did_you_mean(str(path), near)}")
    text = read_text(path, MAX_MATRIX_BYTES, "matrix")
    try:
        raw = load_yaml(text)
    except RecursionError:
        raise BenchError(f"{path}: YAML refused: nested too deeply") from None
    except yaml.YAMLError as exc:
        raise BenchError(yaml_error_line(path, text, exc)) from None
    if not isinstance(raw, dict):
        raise BenchError(f"{path}: a matrix must be a mapping with at least 'name'")
    unset = _unset_vars(raw)
    if unset is not None:
        raise BenchError(f"{path}: {unset[0]}: environment variable {unset[1]} is not set (export {unset[1]}=...)")
    given = apply_overrides(raw, overrides, path) if overrides else {}
    if isinstance(raw.get("stacks"), dict):
        raw["stacks"] = _expand_stacks(raw["stacks"], path)
    if isinstance(raw.get("design"), str):
        raw["design"] = {"type": raw["design"]}
    try:
        matrix = Matrix.model_validate(raw)
    except ValidationError as exc:
        loc = ".".join(str(p) for p in exc.errors()[0]["loc"])
        hit = next((ov for key, ov in given.items() if loc == key or loc.startswith(key + ".")), None)
        if hit is None:  # a check of the whole block (e.g. ``base``) that an override may have upset: name them all
            hit = " ".join(ov for key, ov in given.items() if key.startswith(loc + ".")) or None
        if hit is None:  # a cross-check of the model (an engine's options) names the key in its message
            hit = next((ov for key, ov in given.items() if re.search(rf"\b{re.escape(key)}\b", str(exc))), None)
        if hit is not None:  # the value came from the command line: name it, not a line of the file
            raise BenchError(format_validation_error(f"{path}: override {hit}", exc)) from None
        raise BenchError(format_validation_error(path, exc, text)) from None
    matrix.source = str(path)
    return matrix


def _expand_stacks(stacks: dict[Any, Any], file: Path) -> dict[Any, Any]:
    """``${VAR}`` expanded in every string of the ``stacks`` block (interpreter, paths, revisions, env values):
    the block names this machine's folders, as the user's shell would."""

    def walk(value: Any, key: str) -> Any:
        if isinstance(value, str):
            return expand_env(value, file=str(file), key=key, strict=True)
        if isinstance(value, dict):
            return {k: walk(v, f"{key}.{k}") for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, f"{key}[{i}]") for i, v in enumerate(value)]
        return value

    return walk(stacks, "stacks")


#: keys whose ``${VAR}`` the engines expand only at launch (a dry run shows them unexpanded, a real run refuses)
_LAUNCH_EXPANDED = ("base.model", "base.data", "base.val_data", "base.overrides", "base.env")


def _unset_vars(raw: Any, key: str = "") -> tuple[str, str] | None:
    """The first (dotted key, variable) whose ``${VAR}`` (without default) is unset, outside the keys the
    engines expand at launch (:data:`_LAUNCH_EXPANDED`): those values would be used as written."""
    if key.startswith(_LAUNCH_EXPANDED):
        return None
    if isinstance(raw, dict):
        for k, v in raw.items():
            hit = _unset_vars(v, f"{key}.{k}" if key else str(k))
            if hit:
                return hit
    elif isinstance(raw, list):
        for i, v in enumerate(raw):
            hit = _unset_vars(v, f"{key}[{i}]")
            if hit:
                return hit
    elif isinstance(raw, str):
        for m in _ENV_REF.finditer(raw):
            if m.group(1) not in os.environ and m.group(2) is None:
                return key, m.group(1)
    return None
