"""The registry of the seven optimizations of the article, as data.

Source: the seed article "基于昇腾的多模态模型VeRL训练性能优化实践" (Qwen3-VL-8B GRPO on Atlas 800T A2,
verl 0.6.1, vLLM-Ascend 0.11.0), sections 2.5, 3.1.1-3.3.2 and the summary; mechanisms checked against
verl's ``ppo_trainer.yaml`` and vllm-ascend's ``envs.py`` (see ``FIELD_NOTES.md``).

Nothing outside this module knows what an optimization does: the planner asks :func:`resolve` for the
:class:`Mechanism` of one factor level on one engine/platform target and merges what it gets back.
Adding an eighth optimization means adding one :class:`Optimization` entry to :data:`REGISTRY`.

Targets are written ``"<engine>:<platform>"`` (``"verl:npu"``), with ``"<engine>:*"`` as a fallback.
Override strings may hold ``{placeholders}`` that the planner fills from the matrix ``base`` block and
derived values (``P`` = max prompt length, ``R`` = max response length, ``ppo_max_token_len`` ...).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


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
        evidence_checks: per target, the check that reads a finished run and judges whether the level
            took effect, as ``"module:function"`` (imported when a run is measured); the function takes
            ``(level, patch_reports, composed_config)`` and returns ``(verdict, detail)`` with verdict in
            ``confirmed | missing | contradicted | n/a`` (see :mod:`bench.measure.verl_evidence`).
        article_level: the level whose gain the article reports; the report puts that level's gain
            beside the article's (table and ``article.png``); ``None``: no article figure.
        code: a short code (a few letters, e.g. ``dbsz``) for compact cell labels (:func:`compact_label`:
            MLflow run names, whose list column shows only about 13 characters); default: ``key``.
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
    evidence_checks: dict[str, str] = Field(default_factory=dict)
    article_level: int | None = None
    code: str = ""

    @property
    def short(self) -> str:
        """The factor's short code (:attr:`code`, else :attr:`key`)."""
        return self.code or self.key

    @property
    def off(self) -> int:
        """The level that means "optimization off" (the first level)."""
        return self.levels[0]


class Conflict(BaseModel):
    """A combination of levels that must never run together (the cell is dropped as invalid)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    when: dict[str, int]
    reason: str


M = Mechanism
_DYN_ON_OVERRIDES = (
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu={ppo_max_token_len}",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={log_prob_max_token_len}",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={log_prob_max_token_len}",
)
_DYN_OFF_OVERRIDES = (
    "actor_rollout_ref.actor.use_dynamic_bsz=false",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro_batch_size_per_gpu}",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=false",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={log_prob_micro_batch_size_per_gpu}",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={log_prob_micro_batch_size_per_gpu}",
)
_NOT_NPU_TQ = "TASK_QUEUE_ENABLE is read by torch_npu's dispatcher only; there is no such queue on {platform}"
_EMBEDDED_NO_VLLM = "the embedded engine generates with Hugging Face generate in one process: there is no vLLM"

REGISTRY: dict[str, Optimization] = {
    o.key: o
    for o in [
        Optimization(
            key="rmsnorm_fused",
            code="rms",
            title="Fused RMSNorm (and SwiGLU / rotary) operators in the actor and ref",
            section="3.1.1",
            acts="training",
            mechanisms={
                "verl:npu": {0: M(patches=("qwen3vl_npu_fused:off",)), 1: M(patches=("qwen3vl_npu_fused:on",))},
                "verl:cuda": {
                    0: M(overrides=("actor_rollout_ref.model.use_liger=false",)),
                    1: M(overrides=("actor_rollout_ref.model.use_liger=true",)),
                },
                "verl:cpu": {0: M(patches=("cpu_rmsnorm:off",)), 1: M(patches=("cpu_rmsnorm:on",))},
                "embedded:*": {0: M(config={"rmsnorm_fused": False}), 1: M(config={"rmsnorm_fused": True})},
            },
            evidence="the RMSNorm forward installed in each process (patch report / run evidence)",
            evidence_checks={"verl:*": "bench.measure.verl_evidence:rmsnorm_fused"},
        ),
        Optimization(
            key="task_queue",
            code="tq",
            title="Task queue pipelined dispatch (TASK_QUEUE_ENABLE)",
            section="3.1.2",
            acts="host",
            levels=(0, 1, 2),
            default_levels=(0, 1, 2),
            article_gain=0.09,
            article_level=1,
            mechanisms={
                "verl:npu": {lv: M(env={"TASK_QUEUE_ENABLE": str(lv)}) for lv in (0, 1, 2)},
                "embedded:npu": {lv: M(env={"TASK_QUEUE_ENABLE": str(lv)}) for lv in (0, 1, 2)},
            },
            not_applicable={
                "verl:cuda": _NOT_NPU_TQ.format(platform="CUDA"),
                "verl:cpu": _NOT_NPU_TQ.format(platform="CPU"),
                "embedded:cpu": _NOT_NPU_TQ.format(platform="CPU"),
                "embedded:cuda": _NOT_NPU_TQ.format(platform="CUDA"),
            },
            evidence="TASK_QUEUE_ENABLE as seen by every process of the run",
        ),
        Optimization(
            key="dynamic_bsz",
            code="dbsz",
            title="Dynamic batch size (token-budget micro-batches)",
            section="3.2.1",
            acts="training",
            article_gain=0.15,
            article_level=1,
            mechanisms={
                "verl:*": {0: M(overrides=_DYN_OFF_OVERRIDES), 1: M(overrides=_DYN_ON_OVERRIDES)},
                "embedded:*": {
                    0: M(config={"use_dynamic_bsz": False}),
                    1: M(
                        config={
                            "use_dynamic_bsz": True,
                            "ppo_max_token_len_per_gpu": "{ppo_max_token_len}",
                            "log_prob_max_token_len_per_gpu": "{log_prob_max_token_len}",
                        }
                    ),
                },
            },
            evidence="micro-batches formed per pass and padded vs real tokens (perf/*micro_batches*)",
            evidence_checks={"verl:*": "bench.measure.verl_evidence:dynamic_bsz"},
        ),
        Optimization(
            key="forward_prefetch",
            code="fwdpf",
            title="FSDP forward prefetch (overlap all-gather with compute)",
            section="3.2.2",
            acts="training",
            mechanisms={
                "verl:*": {
                    lv: M(
                        overrides=(
                            f"actor_rollout_ref.actor.fsdp_config.forward_prefetch={str(bool(lv)).lower()}",
                            f"actor_rollout_ref.ref.fsdp_config.forward_prefetch={str(bool(lv)).lower()}",
                        )
                    )
                    for lv in (0, 1)
                },
            },
            not_applicable={
                "embedded:*": "the embedded engine trains in one process without FSDP: nothing to prefetch"
            },
            evidence="fsdp_config.forward_prefetch in the resolved verl config; FSDP2 ignores it in some verl versions",
            evidence_checks={"verl:*": "bench.measure.verl_evidence:forward_prefetch"},
        ),
        Optimization(
            key="mc2",
            code="mc2",
            title="MC2 matmul + all-reduce fusion in vLLM-Ascend tensor parallel",
            section="3.3.1",
            acts="rollout",
            article_gain=0.08,
            article_level=1,
            mechanisms={
                "verl:npu": {
                    0: M(env={"VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE": "0"}),
                    1: M(env={"VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE": "1"}),
                },
            },
            not_applicable={
                "verl:cuda": "VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE is a vLLM-Ascend switch; CUDA vLLM has no MC2",
                "verl:cpu": "VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE is a vLLM-Ascend switch; vLLM's CPU build has no MC2",
                "embedded:*": _EMBEDDED_NO_VLLM + ", so no tensor-parallel all-reduce to fuse",
            },
            requires=(
                Requirement(
                    setting="rollout_tp",
                    minimum=2,
                    reason="MC2 fuses the tensor-parallel all-reduce: it needs rollout tensor_model_parallel_size >= 2",
                ),
            ),
            evidence="VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE in the vLLM worker environment",
        ),
        Optimization(
            key="mrope_cache",
            code="mrope",
            title="MRoPE cos/sin computed once per forward and reused across layers",
            section="3.3.2",
            acts="rollout",
            mechanisms={
                "verl:npu": {0: M(), 1: M(patches=("vllm_ascend_mrope_cache",))},
                "verl:cpu": {0: M(patches=("vllm_mrope_cache:off",)), 1: M(patches=("vllm_mrope_cache:on",))},
            },
            not_applicable={
                "verl:cuda": "the patch targets vLLM-Ascend's MRotaryEmbedding (npu_rotary_mul); "
                "CUDA vLLM is not patched",
                "embedded:*": "Hugging Face Qwen3-VL already computes the rotary cos/sin once per forward and shares "
                "them across layers; there is no per-layer recomputation to cache",
            },
            requires=(
                Requirement(setting="multimodal", minimum=1, targets=("verl:cpu",), reason="MRoPE exists only in "
                            "multimodal models: use builtin:qwen3vl-tiny with builtin:vl data (or data.image_key)"),
            ),
            evidence="the patch's counters in each vLLM process: forwards served, layers that reused the "
            "forward's cos/sin (cache hits)",
            evidence_checks={"verl:*": "bench.measure.verl_evidence:mrope_cache"},
        ),
        Optimization(
            key="graph_mode",
            code="graph",
            title="Rollout graph mode (ACL graph / CUDA graph instead of eager)",
            section="2.5",
            acts="rollout",
            mechanisms={
                "verl:*": {
                    0: M(overrides=("actor_rollout_ref.rollout.enforce_eager=true",)),
                    1: M(overrides=("actor_rollout_ref.rollout.enforce_eager=false",)),
                },
            },
            not_applicable={
                "embedded:*": _EMBEDDED_NO_VLLM + "; torch.compile of Hugging Face generate recompiles for every "
                "new sequence length and costs more than a short benchmark run, so there is no faithful analog",
            },
            evidence="rollout.enforce_eager in the resolved verl config",
            evidence_checks={"verl:*": "bench.measure.verl_evidence:graph_mode"},
        ),
    ]
}

CONFLICTS: tuple[Conflict, ...] = (
    Conflict(
        when={"graph_mode": 1, "task_queue": 2},
        reason="graph mode (enforce_eager=false) cannot run with TASK_QUEUE_ENABLE=2; use level 1 "
        "(verl Ascend performance-tuning guide)",
    ),
)

FACTOR_KEYS: tuple[str, ...] = tuple(REGISTRY)


def register_optimization(opt: Optimization) -> Optimization:
    """Add ``opt`` to :data:`REGISTRY` and :data:`FACTOR_KEYS` (returns it). For an optimization kept outside
    this file (a plugin): call it before the harness's other modules are imported, since they bind
    ``FACTOR_KEYS`` at import. An optimization of the project itself is one more entry in the list above.

    Raises:
        ValueError: the key is taken.
    """
    global FACTOR_KEYS
    if opt.key in REGISTRY:
        raise ValueError(f"optimization {opt.key!r} is already registered")
    REGISTRY[opt.key] = opt
    FACTOR_KEYS = tuple(REGISTRY)
    return opt


def unregister_optimization(key: str) -> None:
    """Remove the optimization ``key`` from :data:`REGISTRY` and :data:`FACTOR_KEYS` (tests undo a toy with it)."""
    global FACTOR_KEYS
    REGISTRY.pop(key, None)
    FACTOR_KEYS = tuple(REGISTRY)


def compact_label(levels: dict[str, int | None]) -> str:
    """A cell's compact label from its factor levels: the short codes (:attr:`Optimization.short`) of the
    factors not at their off level, joined by ``+`` in registry order, with ``=<level>`` for factors of more
    than two levels (``rms+tq=1+dbsz``); ``all-off`` when none. Not-applicable (``None``) factors and
    factors not in :data:`REGISTRY` (unknown keys are shown by key) are handled; used for MLflow run names,
    where labels must differ early (``summary.md`` keeps the full labels)."""
    parts = []
    for k in [k for k in REGISTRY if k in levels] + [k for k in levels if k not in REGISTRY]:
        v, opt = levels[k], REGISTRY.get(k)
        if v is None or (opt is not None and v == opt.off) or (opt is None and not v):
            continue
        code = opt.short if opt is not None else k
        parts.append(code if opt is not None and opt.levels == (0, 1) else f"{code}={v}")
    return "+".join(parts) if parts else "all-off"


def applicability(key: str, engine: str, platform: str, context: dict[str, Any]) -> str | None:
    """Why factor ``key`` is not applicable on ``engine``/``platform`` with these settings, or ``None``.

    Args:
        key: a factor key of :data:`REGISTRY`.
        engine: ``embedded`` or ``verl``.
        platform: ``cpu``, ``cuda`` or ``npu``.
        context: planner context; requirement settings (e.g. ``rollout_tp``) are read from it.

    Raises:
        KeyError: unknown factor key.
    """
    opt = REGISTRY[key]
    for target in (f"{engine}:{platform}", f"{engine}:*"):
        if target in opt.not_applicable:
            return opt.not_applicable[target]
        if target in opt.mechanisms:
            break
    else:
        return f"{opt.title} has no mechanism on the {engine} engine on {platform}"
    for req in (r for r in opt.requires if not r.targets or f"{engine}:{platform}" in r.targets):
        value = context.get(req.setting)
        if value is None or float(value) < req.minimum:
            return f"{req.reason} (here {req.setting}={value})"
    return None


def resolve(key: str, level: int, engine: str, platform: str) -> Mechanism:
    """The :class:`Mechanism` for ``key`` at ``level`` on ``engine``/``platform``.

    Raises:
        KeyError: unknown key, or no mechanism for that target/level (call :func:`applicability` first).
    """
    opt = REGISTRY[key]
    for target in (f"{engine}:{platform}", f"{engine}:*"):
        if target in opt.mechanisms:
            return opt.mechanisms[target][level]
    raise KeyError(f"{key} has no mechanism on {engine}:{platform}")


def evidence_check(key: str, engine: str, platform: str):
    """The evidence check of factor ``key`` on ``engine``/``platform`` (a callable, see
    :attr:`Optimization.evidence_checks`), or ``None`` when the registry names none.

    Raises:
        KeyError: unknown factor key.
        ImportError / AttributeError: the named module or function does not exist.
    """
    import importlib

    opt = REGISTRY[key]
    for target in (f"{engine}:{platform}", f"{engine}:*"):
        if target in opt.evidence_checks:
            module, _, func = opt.evidence_checks[target].partition(":")
            return getattr(importlib.import_module(module), func)
    return None


def article_factors() -> list[tuple[str, int]]:
    """``(factor, level)`` of the optimizations with an article figure (:attr:`Optimization.article_level`),
    largest article gain first: the rows of the report's comparison with the article."""
    opts = [o for o in REGISTRY.values() if o.article_level is not None]
    opts.sort(key=lambda o: -(o.article_gain or 0.0))
    return [(o.key, o.article_level) for o in opts]


def conflicts_of(levels: dict[str, int]) -> list[str]:
    """Reasons why this combination of factor levels is invalid (empty list when valid)."""
    return [c.reason for c in CONFLICTS if all(levels.get(k) == v for k, v in c.when.items())]
