"""The matrix schema: the pydantic models of the YAML that defines a sweep.

A matrix names the engine and platform, a ``base`` block of run settings, the ``factors`` (any of the
seven optimizations of :mod:`bench.spec.optimizations`, each with its levels), a ``design`` that turns
factors into cells, ``repeats`` and ``exclude`` rules. The engine names come from the registry of
engines (:mod:`bench.core.engine_registry`); ``expect`` (claims checked by the gate) is typed by
:mod:`bench.spec.expect` and validated here; ``tune`` (Optuna search) by :mod:`bench.tune.space`.

Reading the file (strict YAML, ``${VAR}`` expansion, overrides, one-line errors) is
:mod:`bench.spec.loading`. Every error is a :class:`~bench.core.errors.BenchError` naming the file, the key
(and line where known) and the allowed values.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, ValidationError

from bench.core import engine_registry  # the registry of engines (it loads their entry points on the first lookup)
from bench.core.engine_registry import engine_names
from bench.core.errors import did_you_mean
from bench.spec.base_checks import check_batch_sizes, check_env, check_override_form
from bench.spec.expect import ExpectBlock
from bench.spec.optimizations import REGISTRY, factor_keys
from bench.spec.stack import MAX_STACK_NAME, STACK_FACTOR, Stack, check_stack_names

#: upper bounds of matrix numbers (a typo such as ``repeats: 1000000000000`` is refused, not planned)
MAX_STEPS = 100_000
MAX_BATCH = 1_000_000
MAX_TOKENS = 1_048_576
MAX_REPEATS = 1000
#: longest matrix name (it becomes a folder name and part of MLflow run names)
MAX_NAME = 100
#: names the harness itself uses directly under the results folder (a matrix of that name would collide)
RESERVED_NAMES = ("logs", "baselines", "mlartifacts", "mlflow.db", "optuna.db", "latest")
#: the stores' files under the results folder and their sidecars (``mlflow.db-wal``, ``optuna.db-journal``,
#: ``mlflow.db.lock``): a matrix name may not start with these
STORE_PREFIXES = ("mlflow.db", "optuna.db")
#: suffix of the folder of ``run --smoke`` (``<matrix>-smoke``), which a matrix name must not end with
SMOKE_SUFFIX = "-smoke"
#: builtin model and data names of the multimodal (Qwen3-VL) targets (see :meth:`Base.is_multimodal`)
MULTIMODAL_BUILTINS = ("builtin:qwen3vl-tiny", "builtin:vl")
#: verl data keys that feed images or videos to the model (``data.image_key=images``)
MULTIMODAL_DATA_KEYS = ("data.image_key", "data.video_key")


_TYPE_WORDS = {dict: "a mapping", list: "a list", tuple: "a pair", int: "a number", float: "a number"}
_LEVEL_WORDS = {"off": 0, "on": 1, False: 0, True: 1, "false": 0, "true": 1}


def _level(key: str, value: Any) -> int:
    opt = REGISTRY[key]
    if isinstance(value, str) and value.lower() in _LEVEL_WORDS:
        value = _LEVEL_WORDS[value.lower()]
    elif isinstance(value, bool):
        value = _LEVEL_WORDS[value]
    if not isinstance(value, int) or value not in opt.levels:
        allowed = ", ".join(str(v) for v in opt.levels)
        raise ValueError(f"unknown level {value!r} (allowed: {allowed}, or off/on)")
    return value


def parse_cell(raw: dict[str, Any], where: str = "") -> dict[str, int]:
    """Validate a ``{factor: level}`` mapping (levels may be ints or off/on/true/false).

    Args:
        raw: the mapping from the file.
        where: key prefix for messages (``"exclude[0]"``); empty for none.

    Raises:
        ValueError: unknown factor (with the allowed keys) or level (with the allowed levels).
    """
    prefix = f"{where}: " if where else ""
    dotted = f"{where}." if where else ""
    out: dict[str, int] = {}
    for key, value in raw.items():
        if key not in REGISTRY:
            raise ValueError(f"{prefix}unknown factor {key!r}{did_you_mean(key, factor_keys())} "
                             f"(allowed: {', '.join(factor_keys())})")
        try:
            out[key] = _level(key, value)
        except ValueError as exc:
            raise ValueError(f"{dotted}{key}: {exc}") from None
    return out


class Base(BaseModel):
    """Run settings shared by every cell. Lengths in tokens, times in seconds.

    Names follow verl's ``ppo_trainer.yaml``. ``ppo_max_token_len`` / ``log_prob_max_token_len`` default
    to ``2*(P+R)`` / ``4*(P+R)`` (article 3.2.1). ``overrides`` and ``env`` are passed to every verl run
    unchanged. Every other key is the sub-block of a registered engine (``base.<options_key>``, the engine's
    :attr:`~bench.engines.base.Engine.options_key`), a mapping the engine checks (``check_options``); read it
    with :meth:`options`.
    """

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, dict[str, Any]]

    model: str | None = None
    data: str | None = None
    val_data: str | None = None
    steps: int = Field(4, ge=1, le=MAX_STEPS, strict=True)
    warmup_steps: int = Field(1, ge=0, le=MAX_STEPS, strict=True)
    profile_steps: list[StrictInt] | None = None
    train_batch_size: int = Field(8, ge=1, le=MAX_BATCH, strict=True)
    ppo_mini_batch_size: int = Field(8, ge=1, le=MAX_BATCH, strict=True)
    micro_batch_size_per_gpu: int = Field(4, ge=1, le=MAX_BATCH, strict=True)
    log_prob_micro_batch_size_per_gpu: int = Field(8, ge=1, le=MAX_BATCH, strict=True)
    max_prompt_length: int = Field(128, ge=1, le=MAX_TOKENS, strict=True)
    max_response_length: int = Field(64, ge=1, le=MAX_TOKENS, strict=True)
    ppo_max_token_len: int | None = Field(None, ge=1, le=16 * MAX_TOKENS, strict=True)
    log_prob_max_token_len: int | None = Field(None, ge=1, le=16 * MAX_TOKENS, strict=True)
    n: int = Field(4, ge=1, le=1024, strict=True)
    temperature: float = Field(1.0, gt=0, le=100, allow_inf_nan=False, strict=True)
    use_kl_loss: StrictBool = True
    seed: int = Field(0, ge=0, le=2**32 - 1, strict=True)
    timeout_s: float = Field(900, gt=0, le=30 * 86400, allow_inf_nan=False, strict=True)
    rollout_tp: int = Field(1, ge=1, le=1024, strict=True)
    n_gpus_per_node: int = Field(1, ge=1, le=1024, strict=True)
    nnodes: int = Field(1, ge=1, le=100_000, strict=True)
    gpu_memory_utilization: float = Field(0.6, gt=0, le=1, allow_inf_nan=False, strict=True)
    overrides: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _engine_blocks(cls, data: Any, handler: Any) -> "Base":
        """Other keys than fields: engines' sub-blocks (each present, default empty), else refused as unknown."""
        if isinstance(data, dict):
            keys = engine_registry.options_keys()
            bad = next((k for k in data if k not in cls.model_fields and k not in keys), None)
            if bad is not None:
                raise ValidationError.from_exception_data(
                    cls.__name__, [InitErrorDetails(type="extra_forbidden", loc=(bad,), input=data[bad])])
            data = {**data, **{k: {} for k in sorted(keys) if k not in data}}
        return handler(data)

    @classmethod
    def allowed_keys(cls) -> list[str]:
        """The keys a ``base`` block may hold: the fields and the registered engines' sub-blocks."""
        return sorted({*cls.model_fields, *engine_registry.options_keys()})

    def options(self, key: str) -> dict[str, Any]:
        """The engine sub-block ``base.<key>`` (empty when the matrix has none)."""
        return (self.__pydantic_extra__ or {}).get(key) or {}

    _env = field_validator("env")(classmethod(lambda cls, v: check_env(v)))
    _overrides = field_validator("overrides")(classmethod(lambda cls, v: check_override_form(v)))

    @model_validator(mode="after")
    def _check(self) -> "Base":
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be below steps ({self.steps})")
        if self.profile_steps is not None:
            bad = [s for s in self.profile_steps if not 1 <= s <= self.steps]
            if bad:
                raise ValueError(f"profile_steps {bad} outside 1..{self.steps}")
            twice = sorted({s for s in self.profile_steps if self.profile_steps.count(s) > 1})
            if twice:
                raise ValueError(f"profile_steps {self.profile_steps}: step(s) {twice} listed twice")
            measured = range(self.warmup_steps + 1, self.steps + 1)
            if all(s in self.profile_steps for s in measured):
                raise ValueError(f"profile_steps {self.profile_steps} leave no timed step: the measured steps "
                                 f"{self.warmup_steps + 1}..{self.steps} are all profiled (profile fewer steps, or "
                                 "raise steps)")
        check_batch_sizes(self)
        seq = self.max_prompt_length + self.max_response_length
        for key in ("ppo_max_token_len", "log_prob_max_token_len"):
            value = getattr(self, key)
            if value is not None and value < seq:
                raise ValueError(f"{key} ({value}) must be at least max_prompt_length + max_response_length "
                                 f"({seq}): one sequence must fit in a micro-batch")
        return self

    def context(self) -> dict[str, Any]:
        """Values the registry's override templates and requirements refer to (P, R, token limits ...)."""
        seq = self.max_prompt_length + self.max_response_length
        ctx = self.model_dump(exclude={"overrides", "env", *engine_registry.options_keys()})
        ctx.update(
            multimodal=int(self.is_multimodal()),
            P=self.max_prompt_length,
            R=self.max_response_length,
            ppo_max_token_len=self.ppo_max_token_len or 2 * seq,
            log_prob_max_token_len=self.log_prob_max_token_len or 4 * seq,
        )
        return ctx

    def is_multimodal(self) -> bool:
        """Whether the runs feed images or videos to a VL model (context ``multimodal``, which ``mrope_cache``
        requires): a builtin of :data:`MULTIMODAL_BUILTINS` as model or data, or one of verl's
        :data:`MULTIMODAL_DATA_KEYS` set in ``overrides``."""
        if self.model in MULTIMODAL_BUILTINS or self.data in MULTIMODAL_BUILTINS:
            return True
        return any(o.lstrip("+~").split("=", 1)[0].strip() in MULTIMODAL_DATA_KEYS for o in self.overrides)


class FullDesign(BaseModel):
    """Full factorial: every combination of every factor's levels."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["full"] = "full"


class OneAtATimeDesign(BaseModel):
    """A reference cell plus one cell per (factor, other level) changed from the reference.

    ``reference: baseline`` = all factors at their first (off) level; ``all_on`` = all at their last level.
    """

    model_config = ConfigDict(extra="forbid")
    type: Literal["one_at_a_time"]
    reference: Literal["baseline", "all_on"] = "baseline"


class FractionalDesign(BaseModel):
    """Two-level fractional factorial (pyDOE3), by ``resolution`` or explicit ``generators``."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["fractional"]
    resolution: int | None = Field(None, ge=3, le=8, strict=True)
    generators: str | None = None

    @model_validator(mode="after")
    def _one(self) -> "FractionalDesign":
        if (self.resolution is None) == (self.generators is None):
            raise ValueError("give exactly one of resolution or generators")
        if self.generators is not None and not self.generators.strip():
            raise ValueError("generators is empty (give one word per varied factor, e.g. 'a b c ab', or "
                             "resolution instead)")
        return self


class ExplicitDesign(BaseModel):
    """An explicit list of cells; factors a cell omits stay at their first level."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["explicit"]
    cells: list[dict[str, Any]] = Field(min_length=1)


Design = Union[FullDesign, OneAtATimeDesign, FractionalDesign, ExplicitDesign]
DESIGN_TYPES = ("full", "one_at_a_time", "fractional", "explicit")


class Exclude(BaseModel):
    """Drop every cell whose levels match all of ``when``."""

    model_config = ConfigDict(extra="forbid")
    when: dict[str, Any]
    reason: str = "excluded by the matrix"


class Matrix(BaseModel):
    """A validated matrix file. ``factors`` maps factor key -> list of levels (a single level = fixed)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=MAX_NAME)
    engine: str = Field(default_factory=lambda: engine_registry.default_engine())
    platform: Literal["auto", "cpu", "cuda", "npu"] = "auto"
    base: Base = Field(default_factory=Base)
    factors: dict[str, list[int]] = Field(default_factory=dict)
    design: Design = Field(default_factory=FullDesign, discriminator="type")
    repeats: int = Field(1, ge=1, le=MAX_REPEATS, strict=True)
    exclude: list[Exclude] = Field(default_factory=list)
    tune: dict[str, Any] | None = None
    #: named stacks (:class:`bench.spec.stack.Stack`), the levels of the ``stack`` factor
    stacks: dict[str, Stack] = Field(default_factory=dict)
    #: the ``stack`` factor's levels as named in the file; ``factors["stack"]`` holds their positions
    stack_levels: list[str] = Field(default_factory=list, exclude=True)
    #: claims checked by the gate (:class:`bench.spec.expect.Expect`); validated at load, stored as written
    expect: list[dict[str, Any]] = Field(default_factory=list)
    description: str = ""

    # set by the harness, never by the file: private attributes, so a file's ``source:`` or ``selected_cells:`` is an
    # unknown key (as fields with ``exclude=True`` they were taken from the file, and changed the fingerprint)
    _source: str = PrivateAttr("")
    _selected_cells: list[str] = PrivateAttr(default_factory=list)

    @property
    def source(self) -> str:
        """The matrix file it was loaded from (set by :func:`bench.spec.loading.load_matrix`; ``""`` otherwise)."""
        return self._source

    @source.setter
    def source(self, value: str) -> None:
        self._source = value

    @property
    def selected_cells(self) -> list[str]:
        """Cell ids of a ``run --cells`` subset (empty: every cell); part of the fingerprint, so a subset sweep
        neither resumes nor is resumed by the sweep of the whole matrix."""
        return self._selected_cells

    @selected_cells.setter
    def selected_cells(self, value: list[str]) -> None:
        self._selected_cells = list(value)

    @model_validator(mode="before")
    @classmethod
    def _stack_levels(cls, raw: Any) -> Any:
        """The ``stack`` factor's names -> positions (``factors.stack: [0, 1, ...]``, names in ``stack_levels``);
        every name must be declared under ``stacks``."""
        if not isinstance(raw, dict):
            return raw
        if "stack_levels" in raw:
            raise ValueError("stack_levels: unknown key (list the stacks under factors.stack)")
        factors, stacks = raw.get("factors"), raw.get("stacks")
        if stacks is not None and not isinstance(stacks, dict):
            raise ValueError(f"stacks: expected a mapping of name -> stack, got {type(stacks).__name__}")
        for name in stacks or {}:
            if not isinstance(name, str) or not name or len(name) > MAX_STACK_NAME or not all(
                    c.isalnum() or c in "_.-" for c in name):
                raise ValueError(f"stacks: name {name!r}: allowed: letters, digits, '_', '.' and '-', at most "
                                 f"{MAX_STACK_NAME} characters")
        if isinstance(factors, list) and STACK_FACTOR in factors:
            factors = {k: None for k in factors}
        if not isinstance(factors, dict) or STACK_FACTOR not in factors:
            return raw
        names = factors[STACK_FACTOR]
        if names is None:
            names = list(stacks or {})
        elif isinstance(names, dict) and set(names) <= {"levels"}:
            names = names.get("levels")
        if not isinstance(names, list):
            names = [names]
        check_stack_names(names, stacks or {})
        return {**raw, "factors": {**factors, STACK_FACTOR: list(range(len(names)))}, "stack_levels": names}

    def stack_of(self, level: int | None) -> tuple[str, Stack] | None:
        """``(name, stack)`` at position ``level`` of the ``stack`` factor; ``None`` without the factor."""
        if level is None or not self.stack_levels:
            return None
        name = self.stack_levels[level]
        return name, self.stacks[name]

    @field_validator("engine", mode="before")
    @classmethod
    def _engine(cls, value: Any) -> str:
        names = engine_names()
        if value not in names:
            allowed = " or ".join(repr(n) for n in names) if len(names) <= 2 else \
                ", ".join(repr(n) for n in names[:-1]) + f" or {names[-1]!r}"
            raise ValueError(f"allowed: {allowed}, got {value!r}{did_you_mean(value, names)}")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if value in RESERVED_NAMES or value.endswith(SMOKE_SUFFIX) or value.startswith(STORE_PREFIXES):
            raise ValueError(f"{value!r} collides with the harness's own entries under the results folder "
                             f"({', '.join(RESERVED_NAMES)}, {', '.join(p + '*' for p in STORE_PREFIXES)}, "
                             f"<matrix>{SMOKE_SUFFIX}); choose another name")
        return value

    @field_validator("factors", mode="before")
    @classmethod
    def _factors(cls, raw: Any) -> dict[str, list[int]]:
        if raw is None:  # ``factors:`` written without a value ran one cell of no factor
            raise ValueError("empty (allowed: a mapping of factor -> levels, or a list of factor names; leave the key "
                             "out for a matrix of no factor)")
        if isinstance(raw, list):  # a bare list of keys: default levels
            bad = next((k for k in raw if not isinstance(k, str)), None)
            if bad is not None:
                what = _TYPE_WORDS.get(type(bad), "a value")
                raise ValueError(f"a list of factors holds factor names only, got {what} {repr(bad)[:60]} "
                                 "(write factors as a mapping, factor: [levels], or as a list of names)")
            twice = next((k for i, k in enumerate(raw) if k in raw[:i]), None)
            if twice is not None:
                raise ValueError(f"{twice!r} is listed twice (allowed: each factor once)")
            raw = {k: None for k in raw}
        if not isinstance(raw, dict):
            raise ValueError("expected a mapping of factor -> levels")
        out: dict[str, list[int]] = {}
        for key, levels in raw.items():
            if key == STACK_FACTOR and isinstance(levels, list) and all(type(v) is int for v in levels):
                out[key] = levels  # positions in stack_levels (set by _stack_levels from the names)
                continue
            if key == STACK_FACTOR:
                raise ValueError(f"{STACK_FACTOR}: declare stacks under the top-level key stacks and list their "
                                 "names here")
            if not isinstance(key, str) or key not in REGISTRY:
                raise ValueError(f"unknown factor {key!r}{did_you_mean(key, factor_keys())} "
                                 f"(allowed: {', '.join(factor_keys())})")
            if levels is None:
                levels = list(REGISTRY[key].default_levels)
            elif isinstance(levels, dict):
                extra = [k for k in levels if k != "levels"]
                if extra:
                    raise ValueError(f"{key}.{extra[0]}: unknown key{did_you_mean(extra[0], ['levels'])} "
                                     "(allowed: levels)")
                levels = levels.get("levels", list(REGISTRY[key].default_levels))
            if not isinstance(levels, list):
                levels = [levels]
            try:
                parsed = [_level(key, v) for v in levels]
            except ValueError as exc:
                raise ValueError(f"{key}: {exc}") from None
            if len(set(parsed)) != len(parsed) or not parsed:
                raise ValueError(f"{key}: levels must be distinct and non-empty, got {levels}")
            out[key] = parsed
        return out

    @model_validator(mode="after")
    def _cells_and_excludes(self) -> "Matrix":
        if isinstance(self.design, ExplicitDesign):
            self.design.cells = [parse_cell(c, f"design.cells[{i}]") for i, c in enumerate(self.design.cells)]
            for i, cell in enumerate(self.design.cells):
                for key, level in cell.items():
                    if level not in self.factors.get(key, [level] if not self.factors else []):
                        raise ValueError(f"design.cells[{i}].{key}: {key} at {level} is not among the matrix's "
                                         f"factors and levels ({self.factors or 'none listed'}); list it under "
                                         "factors")
            seen: dict[tuple, int] = {}
            for i, cell in enumerate(self.design.cells):  # omitted factors at their first level (the class text)
                full = {**{k: v[0] for k, v in self.factors.items()}, **cell}
                key = tuple(sorted(full.items()))
                if key in seen:
                    raise ValueError(f"design.cells[{i}]: the same cell as design.cells[{seen[key]}] "
                                     f"({', '.join(f'{k}={v}' for k, v in key) or 'all off'}; a factor a cell omits "
                                     "is at its first level); list each cell once")
                seen[key] = i
        for i, rule in enumerate(self.exclude):
            rule.when = parse_cell(rule.when, f"exclude[{i}].when")
            for key, level in rule.when.items():
                if key not in self.factors:
                    raise ValueError(f"exclude[{i}].when.{key}: the matrix does not list {key} under factors "
                                     f"(factors: {', '.join(self.factors) or 'none'}); the rule would drop every "
                                     "cell or none")
                if level not in self.factors[key]:
                    raise ValueError(f"exclude[{i}].when.{key}: level {level} is not among the matrix's levels "
                                     f"{self.factors[key]}; the rule matches no cell")
                if len(self.factors[key]) == 1:
                    raise ValueError(f"exclude[{i}].when.{key}: {key} has a single level {self.factors[key]} in this "
                                     "matrix, so the rule drops every cell or none (vary the factor, or remove "
                                     f"{key} from the rule)")
        check = getattr(engine_registry.engine_class(self.engine), "check_options", None)  # the engine's sub-block
        if check is not None:
            check(self.base)
        if self.expect:  # raises pydantic's ValidationError located at expect.<i>.<key>
            for i, claim in enumerate(ExpectBlock(expect=self.expect).expect):
                self._check_uses(f"expect.{i}", claim.factor, claim.level)
        fixed = self.tune.get("fixed") if isinstance(self.tune, dict) else None
        if isinstance(fixed, dict) and self.factors:  # a tune of a matrix that lists factors: within them
            try:
                cell = parse_cell(fixed)
            except ValueError:
                cell = {}  # named by the tune block's own check (bench.tune.space), in its words
            for key, level in cell.items():
                self._check_uses("tune.fixed", key, level)
        return self

    def _check_uses(self, where: str, factor: str, level: int | None) -> None:
        """Refuse a claim or a fixed level on a factor (or level) this matrix does not list (``factor: all``
        is every listed factor)."""
        listed = ", ".join(f"{k}: {v}" for k, v in self.factors.items()) or "none"
        if factor == "all":
            return
        if factor not in self.factors:
            raise ValueError(f"{where}.{factor}: the matrix does not list {factor} under factors (factors: "
                             f"{listed}); list it, or drop it here")
        if level is not None and level not in self.factors[factor]:
            raise ValueError(f"{where}.{factor}: level {level} is not among the matrix's levels "
                             f"{self.factors[factor]} of {factor}")

    def fingerprint(self) -> str:
        """Stable 10-hex-digit hash of the matrix content (used to find the sweep to resume)."""
        data = self.model_dump(mode="json")
        if self.stack_levels:  # the factor's positions name these stacks
            data["stack_levels"] = list(self.stack_levels)
        if not self.stacks:  # a matrix without stacks keeps the fingerprint it had before stacks existed
            data.pop("stacks", None)
        if self.selected_cells:
            data["selected_cells"] = sorted(self.selected_cells)
        blob = json.dumps(data, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:10]


def base_params(base: dict[str, Any]) -> dict[str, Any]:
    """The ``base`` settings logged as MLflow params ``base.<key>`` (sweep, tune and sync alike): every key
    but ``env``, ``overrides`` and the engines' own sub-blocks (:func:`bench.core.engine_registry.options_keys`)."""
    skip = {"env", "overrides", *engine_registry.options_keys()}
    return {f"base.{k}": v for k, v in base.items() if k not in skip}

