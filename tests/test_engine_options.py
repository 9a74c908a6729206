"""An engine's own settings come from the matrix through the engine (its ``options_key`` and ``check_options``),
not from a field of ``Base``; and every built-in factor has an evidence check on every target it applies to."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bench.engines import engine_class, engine_names, register, unregister
from bench.engines.base import EngineBase
from bench.spec.matrix import Base


class WithOptions(EngineBase):
    name = "with_options"
    options_key = "with_options"


class Knobs(BaseModel):
    """The schema of a toy engine's ``base.knobs`` block."""

    model_config = ConfigDict(extra="forbid")
    work: int = Field(1, ge=1)


class WithSchema(EngineBase):
    name = "with_schema"
    options_key = "knobs"
    options_model = Knobs


def test_base_holds_exactly_the_registered_engines_blocks():
    assert "embedded" not in Base.model_fields  # no engine's block is a field of Base
    keys = {engine_class(n).options_key for n in engine_names()} - {None}
    assert Base().model_dump().keys() >= keys and all(Base().options(k) == {} for k in keys)
    with pytest.raises(ValidationError) as err:
        Base.model_validate({"with_options": {"a": 1}})
    assert err.value.errors()[0]["loc"] == ("with_options",) and err.value.errors()[0]["type"] == "extra_forbidden"
    register(WithOptions)
    try:
        base = Base.model_validate({"with_options": {"a": 1}})
        assert base.options("with_options") == {"a": 1} and "with_options" in Base.allowed_keys()
        with pytest.raises(ValidationError) as err:
            Base.model_validate({"with_options": [1]})
        assert err.value.errors()[0]["loc"] == ("with_options",) and err.value.errors()[0]["type"] == "dict_type"
    finally:
        unregister("with_options")


def test_the_default_check_is_the_engines_options_model(tmp_path):
    """An engine that declares ``options_model`` gets its block checked by the inherited ``check_options``, with
    errors that name ``base.<key>.<field>``; through ``load_matrix`` they are one line naming the file."""
    from bench.core.errors import BenchError
    from bench.spec.loading import load_matrix

    register(WithSchema)
    try:
        WithSchema.check_options(Base.model_validate({"knobs": {"work": 3}}))
        with pytest.raises(ValueError, match=r"^base\.knobs\.work: must be greater than or equal to 1, got 0$"):
            WithSchema.check_options(Base.model_validate({"knobs": {"work": 0}}))
        unknown = r"^base\.knobs\.wrk: unknown key \(did you mean 'work'\?\) \(allowed: work\)$"
        with pytest.raises(ValueError, match=unknown):
            WithSchema.check_options(Base.model_validate({"knobs": {"wrk": 2}}))
        EngineBase.check_options(Base())  # no schema: nothing to check
        matrix = tmp_path / "m.yaml"
        matrix.write_text("name: m\nengine: with_schema\nplatform: cpu\nbase:\n  knobs: {work: 0}\n")
        with pytest.raises(BenchError) as err:
            load_matrix(matrix)
        assert str(err.value).startswith(str(matrix)) and str(err.value).endswith(
            "base.knobs.work: must be greater than or equal to 1, got 0")
    finally:
        unregister("with_schema")


def test_every_engine_capability_is_read_somewhere():
    """No dead capability on the interface: every public attribute of ``EngineBase`` is read (``x.attr``, or named
    as a string as in ``capability(engine, "attr")``) by some module of bench/; a class body that sets it does not
    count."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "bench"
    read: set[str] = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                read.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                read.add(node.value)
    capabilities = {k for k in vars(EngineBase) if not k.startswith("_")}
    assert {"options_key", "options_model", "forkserver_preload", "startup_text"} <= capabilities
    assert sorted(capabilities - read) == []
