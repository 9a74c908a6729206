"""The ``tune`` block of a matrix: schema, validation and the search space resolved to tokens.

Schema (every key but ``space`` optional)::

    tune:
      fixed:                         # factor levels held fixed in every trial
        dynamic_bsz: on              #   must be on (the limits act only with dynamic batch size);
        rmsnorm_fused: on            #   omitted factors take the first level the matrix gives them
      space:                         # one or both of the two verl limits
        ppo_max_token_len_per_gpu:      {low: 1, high: 8, unit: seq, log: true}
        log_prob_max_token_len_per_gpu: {low: 1024, high: 8192, step: 512}      # unit: tokens
      objective: step_time           # step_time (median, minimize) | throughput (median, maximize)
      n_trials: 12                   # finished trials the study should hold (resume runs the rest)
      timeout_s: 900                 # and/or a wall-clock budget for this invocation
      sampler: {type: tpe, seed: 0, n_startup_trials: 4}   # tpe | random | grid
      start_at_rule_of_thumb: true   # first trial = the article's 2*(P+R) / 4*(P+R) (snapped into the space)
      normalize: true                # speed-normalize the objective by the machine-speed probe (bench.records.speed)
      study: my-study                # default: the matrix name
      storage: sqlite:///results/optuna.db   # any SQLAlchemy URL, or journal:PATH (Optuna journal file)

A dimension's ``low``/``high``/``step`` are in ``unit``: ``tokens`` (absolute, integers) or ``seq``
(multiples of the longest possible sequence P+R = max_prompt_length + max_response_length). They are
converted to integer token counts (rounded) before the search; the search is always over integers.
``log: true`` samples on a log scale; ``step`` samples on a grid ``low, low+step, ...`` (``high`` is
lowered onto the grid); the two exclude each other, and neither means every integer.

A bound below P+R is refused (one-line error, exit 2): verl asserts ``max_token_len >= max_seq_len``
on padded batches, so every trial there would be infeasible by construction.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator, model_validator

from bench.core.errors import BenchError, did_you_mean
from bench.core.inputs import read_text
from bench.records.figures import SUMMARY_STEP_TIME, SUMMARY_THROUGHPUT
from bench.spec.loading import MAX_MATRIX_BYTES, format_validation_error
from bench.spec.matrix import Base, Matrix, parse_cell

#: searchable parameter (verl's name) -> the matrix ``base`` field that carries it into a run
PARAMS: dict[str, str] = {
    "ppo_max_token_len_per_gpu": "ppo_max_token_len",
    "log_prob_max_token_len_per_gpu": "log_prob_max_token_len",
}
#: objective name -> (record summary key, Optuna direction, unit for printing)
OBJECTIVES: dict[str, tuple[str, str, str]] = {
    "step_time": (SUMMARY_STEP_TIME, "minimize", "s"),
    "throughput": (SUMMARY_THROUGHPUT, "maximize", "tokens/s"),
}
STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: longest study name (a folder name under ``<results>/<matrix>/tune``, as a matrix name)
MAX_STUDY_NAME = 100


#: largest bound of a searched limit, tokens (or multiples of P+R)
MAX_BOUND = 1 << 24


class Dimension(BaseModel):
    """One searched limit. ``low``/``high``/``step`` in ``unit`` (tokens, or multiples of P+R)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    low: float = Field(gt=0, le=MAX_BOUND, strict=True)
    high: float = Field(gt=0, le=MAX_BOUND, strict=True)
    unit: Literal["tokens", "seq"] = "tokens"
    log: StrictBool = False
    step: float | None = Field(None, gt=0, le=MAX_BOUND, strict=True)

    @model_validator(mode="after")
    def _check(self) -> "Dimension":
        if self.low > self.high:
            raise ValueError(f"low ({self.low:g}) is above high ({self.high:g})")
        if self.log and self.step is not None:
            raise ValueError("log: true and step exclude each other (give one scale)")
        if self.unit == "tokens":
            for name in ("low", "high", "step"):
                v = getattr(self, name)
                if v is not None and v != int(v):
                    raise ValueError(f"{name} must be a whole number of tokens with unit: tokens, got {v:g}")
        return self


class SamplerSpec(BaseModel):
    """Sampler: ``tpe`` (default; seeded, multivariate), ``random`` or ``grid`` (every point of step spaces)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["tpe", "random", "grid"] = "tpe"
    seed: int = Field(0, ge=0, le=2**32 - 1, strict=True)
    n_startup_trials: int = Field(4, ge=1, le=100_000, strict=True)
    multivariate: bool = Field(True, strict=True)


class TuneBlock(BaseModel):
    """The validated ``tune`` block (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    fixed: dict[str, Any] = Field(default_factory=dict)
    space: dict[str, Dimension] = Field(min_length=1)
    objective: Literal["step_time", "throughput"] = "step_time"
    n_trials: int | None = Field(None, ge=1, le=100_000, strict=True)
    timeout_s: float | None = Field(None, gt=0, le=30 * 86400, strict=True)
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    start_at_rule_of_thumb: StrictBool = True
    normalize: StrictBool = True
    study: str | None = Field(None, pattern=STUDY_NAME.pattern, max_length=MAX_STUDY_NAME)
    storage: str | None = None

    @field_validator("sampler", mode="before")
    @classmethod
    def _sampler(cls, raw: Any) -> Any:
        return {"type": raw} if isinstance(raw, str) else raw

    @field_validator("space", mode="before")
    @classmethod
    def _space(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            for name in raw:
                if name not in PARAMS:
                    raise ValueError(f"unknown parameter {name!r}{did_you_mean(name, PARAMS)} "
                                     f"(allowed: {', '.join(PARAMS)})")
        return raw

    @field_validator("fixed", mode="before")
    @classmethod
    def _fixed(cls, raw: Any) -> dict[str, int]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise ValueError("expected a mapping of factor -> level")
        out = parse_cell(raw)
        if out.get("dynamic_bsz", 1) != 1:
            raise ValueError("dynamic_bsz: must be on (the token limits only act with dynamic batch size)")
        return out


@dataclass(frozen=True)
class IntDim:
    """A dimension resolved to integer tokens (what Optuna's ``suggest_int`` gets)."""

    name: str
    low: int
    high: int
    step: int = 1
    log: bool = False

    def grid(self) -> list[int]:
        """Every value of the dimension (for the grid sampler)."""
        return list(range(self.low, self.high + 1, self.step))

    def snap(self, value: float) -> int:
        """The value of the dimension nearest to ``value``."""
        v = min(max(int(round(value)), self.low), self.high)
        return self.low + int(round((v - self.low) / self.step)) * self.step if self.step > 1 else v

    def describe(self) -> str:
        scale = "log" if self.log else (f"step {self.step}" if self.step > 1 else "every integer")
        return f"{self.name} in [{self.low}, {self.high}] tokens ({scale})"


def parse_tune(matrix: Matrix, text: str | None = None) -> TuneBlock:
    """Validate ``matrix.tune``.

    Raises:
        BenchError: no ``tune`` block, or an invalid one (one line naming file, line, key).
    """
    src = matrix.source or "matrix"
    if not matrix.tune:
        raise BenchError(f"{src}: tune: missing (add a tune block with a search space; "
                         f"see matrix/tune_dynamic_bsz.yaml)")
    if text is None and matrix.source:
        try:
            text = read_text(matrix.source, MAX_MATRIX_BYTES, "matrix")
        except BenchError:
            text = ""
    try:
        return TuneBlock(**matrix.tune)
    except ValidationError as exc:
        raise BenchError(format_validation_error(src, exc, text or "", prefix="tune", model=TuneBlock)) from None


def seq_len(base: Base) -> int:
    """P+R: the longest possible sequence (prompt + response) of a run."""
    ctx = base.context()
    return int(ctx["P"]) + int(ctx["R"])


def resolve_space(block: TuneBlock, base: Base, source: str = "matrix") -> tuple[dict[str, IntDim], list[str]]:
    """The search space in integer tokens, plus notes (e.g. ``high`` lowered onto the step grid).

    Raises:
        BenchError: a bound below P+R (refused: every trial there is infeasible), or a dimension that
            rounds to nothing.
    """
    seq = seq_len(base)
    ctx = base.context()
    out: dict[str, IntDim] = {}
    notes: list[str] = []
    for name in PARAMS:
        dim = block.space.get(name)
        if dim is None:
            continue
        mult = seq if dim.unit == "seq" else 1
        low, high = int(round(dim.low * mult)), int(round(dim.high * mult))
        step = max(1, int(round(dim.step * mult))) if dim.step is not None else 1
        key = f"tune.space.{name}"
        for which, v, raw in (("low", low, dim.low), ("high", high, dim.high)):
            if v < seq:
                given = f"{raw:g} x (P+R) = {v} tokens" if dim.unit == "seq" else f"{v} tokens"
                raise BenchError(
                    f"{source}: {key}.{which}: {given} is below the longest possible sequence P+R = {seq} "
                    f"(max_prompt_length {ctx['P']} + max_response_length {ctx['R']}); verl refuses "
                    f"max_token_len < max_seq_len, so the bound is refused, not clipped: use >= {seq} tokens "
                    f"(or >= 1.0 with unit: seq)")
        if step > 1 and (high - low) % step:
            new_high = low + (high - low) // step * step
            notes.append(f"{name}: high {high} is not on the grid {low} + k*{step}: lowered to {new_high}")
            high = new_high
        out[name] = IntDim(name, low, high, step, dim.log)
    if block.sampler.type == "grid":
        logs = [d.name for d in out.values() if d.log]
        if logs:
            raise BenchError(f"{source}: tune.sampler.type: grid needs step (not log) dimensions; "
                             f"{logs[0]} has log: true (give step instead)")
        size = math.prod((d.high - d.low) // d.step + 1 for d in out.values())  # without building the grid
        if size > 10000:
            raise BenchError(f"{source}: tune.sampler.type: grid has {size} points (> 10000); give a coarser step")
    return out, notes


def limits_of(params: dict[str, int], base: Base) -> dict[str, int]:
    """Both limits of a trial in tokens: the sampled ones, and the matrix's (or the article's) for the rest."""
    ctx = base.context()
    return {name: int(params.get(name, ctx[field])) for name, field in PARAMS.items()}


def rule_of_thumb(space: dict[str, IntDim], base: Base) -> dict[str, int]:
    """The article's limits (2*(P+R), 4*(P+R), or the matrix's own) snapped into the space."""
    ctx = base.context()
    return {name: dim.snap(ctx[PARAMS[name]]) for name, dim in space.items()}


def tune_fingerprint(payload: dict[str, Any]) -> str:
    """Stable 12-hex-digit hash of the settings a study's values depend on."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]
