"""The data model of an optimization (a factor of the experiment design): what each level sets per target.

Targets are written ``"<engine>:<platform>"`` (``"verl:npu"``), with ``"<engine>:*"`` as a fallback.
Override strings may hold ``{placeholders}`` that the planner fills from the matrix ``base`` block and
derived values (``P`` = max prompt length, ``R`` = max response length, ``ppo_max_token_len`` ...).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bench.spec.optimizations.versions import Lift, SwitchRange


class Mechanism(BaseModel):
    """What one level of one optimization sets for a run.

    Attributes:
        env: environment variables for every process of the run (names -> string values).
        overrides: Hydra overrides for ``verl.trainer.main_ppo`` (``key=value``; may contain
            ``{placeholders}`` filled by the planner).
        patches: runtime patch specs from ``patches/`` (``name`` or ``name:mode``) loaded in every process.
        config: keys of the embedded engine's run configuration (:class:`bench.engines.embedded.config.RunConfig`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    env: dict[str, str] = Field(default_factory=dict)
    overrides: tuple[str, ...] = ()
    patches: tuple[str, ...] = ()
    config: dict[str, Any] = Field(default_factory=dict)


class Requirement(BaseModel):
    """A condition on the run settings below which a factor is *not applicable* (not invalid).

    ``setting`` names a key of the planner's context (e.g. ``rollout_tp``); the factor applies when
    ``context[setting] >= minimum``; ``targets`` limits the condition to those ``engine:platform`` targets
    (empty: every target).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    setting: str
    minimum: float
    reason: str
    targets: tuple[str, ...] = ()


class Optimization(BaseModel):
    """One optimization of the article: a factor of the experiment design.

    Attributes:
        key: factor name used in matrix files.
        title: human title.
        section: article section the optimization comes from.
        acts: where it acts: ``rollout`` (vLLM generation), ``training`` (FSDP actor/ref) or ``host``.
        levels: allowed levels; the first is "off".
        default_levels: levels used when a matrix lists the factor without levels.
        article_gain: end-to-end gain the article reports (fraction, e.g. 0.15), ``None`` if not stated.
        mechanisms: per target, per level, what the level sets.
        not_applicable: per target, why the factor cannot be applied there.
        requires: settings the factor needs; unmet -> not applicable with the reason.
        evidence: how a run shows the factor took effect (prose).
        (the checks that read a finished run and judge whether the level took effect are entries of the
        evidence-check registry, :data:`bench.measure.evidence.CHECKS`, not fields here)
        article_level: the level whose gain the article reports; the report puts that level's gain
            beside the article's (table and ``article.png``); ``None``: no article figure.
        code: a short code (a few letters, e.g. ``dbsz``) for compact cell labels (:func:`compact_label`:
            MLflow run names, whose list column shows only about 13 characters); default: ``key``.
        switches: per target (as :attr:`mechanisms`), where the switch the levels set exists: package,
            its name there, and the releases that read it, each bound with its source
            (:class:`~bench.spec.optimizations.versions.SwitchRange`); a stack outside a range does not read
            the factor (:func:`~bench.spec.optimizations.registry.not_read`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    key: str
    title: str
    section: str
    acts: Literal["rollout", "training", "host"]
    levels: tuple[int, ...] = (0, 1)
    default_levels: tuple[int, ...] = (0, 1)
    article_gain: float | None = None
    mechanisms: dict[str, dict[int, Mechanism]] = Field(default_factory=dict)
    not_applicable: dict[str, str] = Field(default_factory=dict)
    requires: tuple[Requirement, ...] = ()
    evidence: str = ""
    article_level: int | None = None
    code: str = ""
    switches: dict[str, tuple[SwitchRange, ...]] = Field(default_factory=dict)

    @property
    def short(self) -> str:
        """The factor's short code (:attr:`code`, else :attr:`key`)."""
        return self.code or self.key

    @property
    def off(self) -> int:
        """The level that means "optimization off" (the first level)."""
        return self.levels[0]


class Conflict(BaseModel):
    """A combination of levels that must never run together (the cell is dropped as invalid), unless one of
    ``lifted`` holds for the target and the installed stack (then the cell runs with the lift's env)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    when: dict[str, int]
    reason: str
    lifted: tuple[Lift, ...] = ()


#: a reason shared by the rollout factors that the one-process embedded engine cannot have
EMBEDDED_NO_VLLM = "the embedded engine generates with Hugging Face generate in one process: there is no vLLM"


def per_level(make: Any, levels: tuple[int, ...] = (0, 1)) -> dict[int, Mechanism]:
    """``{level: make(level)}``: a factor's mechanisms on one target written once for every level
    (``make`` returns a :class:`Mechanism`, or the keyword arguments of one as a dict)."""
    out = {}
    for lv in levels:
        m = make(lv)
        out[lv] = m if isinstance(m, Mechanism) else Mechanism(**m)
    return out


#: per kind of :func:`on_off`: its (off, on) values by default
_SWITCH_VALUES = {"patches": ("off", "on"), "overrides": ("false", "true"), "config": (False, True), "env": ("0", "1")}


def on_off(*keys: str, kind: str = "patches", values: tuple[Any, Any] | None = None) -> dict[int, Mechanism]:
    """The mechanisms of an off/on switch, levels 0 and 1, setting each of ``keys`` to ``values[level]``
    (default per kind: :data:`_SWITCH_VALUES`): ``kind`` ``patches`` (specs ``"<key>:<value>"``),
    ``overrides`` (Hydra ``"<key>=<value>"``), ``config`` (run-config keys) or ``env`` (variables).
    ``on_off("cpu_rmsnorm")`` is ``{0: Mechanism(patches=("cpu_rmsnorm:off",)), 1: ...("cpu_rmsnorm:on",)}``."""
    v = values or _SWITCH_VALUES[kind]
    if kind in ("patches", "overrides"):
        sep = ":" if kind == "patches" else "="
        return per_level(lambda lv: {kind: tuple(f"{k}{sep}{v[lv]}" for k in keys)})
    return per_level(lambda lv: {kind: {k: v[lv] for k in keys}})
