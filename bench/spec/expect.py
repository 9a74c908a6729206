"""The matrix ``expect`` block: claims about a factor's effect that the gate checks within a sweep.

Typed here (not in the gate) so that loading a matrix validates its claims before anything runs;
:func:`bench.gate.verdicts.check_expectations` finds the cells each claim compares and
:func:`bench.report.tables.claims_on_runs` judges them on the runs (:func:`bench.stats.decide.judge_claim`), for the
report and the gate alike.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from bench.core.errors import did_you_mean
from bench.spec.metrics import METRICS
from bench.spec.optimizations import REGISTRY, factor_keys


class Expect(BaseModel):
    """One claim about a factor's effect, checked within a sweep.

    ``factor`` at ``level`` (default: its last level in the matrix) improves ``metric`` by at least
    ``at_least`` (and at most ``at_most``), as a fraction, against the reference ``vs``:

    * ``vs: all_off``: the cell with only this factor changed from the all-off cell, against the
      all-off cell (``factor: all``: the all-on cell against the all-off cell, the article's end to end);
    * ``vs: all_on``: the all-on cell against the all-on cell with this factor off.

    Improvement = relative decrease for lower-is-better metrics (``step_time``: ``1 - cell/ref``),
    relative increase for ``throughput``. Judged on the runs (:func:`bench.stats.decide.judge_claim`): met when the
    interval of the improvement lies within the bounds, not met when it lies outside them, else cannot judge.
    """

    model_config = ConfigDict(extra="forbid")
    factor: str
    level: int | None = Field(None, strict=True)
    metric: Literal["step_time", "throughput", "rollout_share", "free_ratio"] = "step_time"
    at_least: float | None = Field(None, gt=-1.0, lt=10.0, strict=True, allow_inf_nan=False)
    at_most: float | None = Field(None, gt=-1.0, lt=10.0, strict=True, allow_inf_nan=False)
    vs: Literal["all_off", "all_on"] = "all_off"
    name: str = ""

    @field_validator("factor")
    @classmethod
    def _factor(cls, v: str) -> str:
        if v != "all" and v not in REGISTRY:
            raise ValueError(f"unknown factor {v!r}{did_you_mean(v, factor_keys())} (allowed: all, "
                             f"{', '.join(factor_keys())})")
        return v

    @field_validator("level")
    @classmethod
    def _level(cls, v: int | None, info: ValidationInfo) -> int | None:
        f = info.data.get("factor")
        if v is not None and f in REGISTRY and v not in REGISTRY[f].levels:
            raise ValueError(f"level {v} of {f} unknown (allowed: {', '.join(map(str, REGISTRY[f].levels))})")
        return v

    @model_validator(mode="after")
    def _check(self) -> "Expect":
        if self.at_least is None and self.at_most is None:
            raise ValueError("give at_least and/or at_most (fractions, e.g. at_least: 0.10)")
        if self.at_least is not None and self.at_most is not None and self.at_most < self.at_least:
            raise ValueError(f"at_most ({self.at_most}) is below at_least ({self.at_least})")
        if self.factor == "all" and (self.vs != "all_off" or self.level is not None):
            raise ValueError("factor: all compares the all-on cell with the all-off cell (vs: all_off, no level)")
        return self

    def describe(self) -> str:
        """Human text of the claim."""
        if self.name:
            return self.name
        m = METRICS[self.metric]
        verb = "raises" if m.higher_is_better else "lowers"
        bounds = []
        if self.at_least is not None:
            bounds.append(f"at least {self.at_least:.0%}")
        if self.at_most is not None:
            bounds.append(f"at most {self.at_most:.0%}")
        who = (
            "all factors on"
            if self.factor == "all"
            else f"{self.factor}" + (f"={self.level}" if self.level is not None else "")
        )
        return f"{who} {verb} {m.title} by {' and '.join(bounds)} vs {self.vs.replace('_', '-')}"


class ExpectBlock(BaseModel):
    """The ``expect`` list of a matrix (validated as one block, so errors read ``expect.<i>.<key>``)."""

    expect: list[Expect] = Field(default_factory=list)
