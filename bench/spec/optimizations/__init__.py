"""The optimizations of the article, as data: one module per built-in optimization, one registry.

Source: the seed article "基于昇腾的多模态模型VeRL训练性能优化实践" (Qwen3-VL-8B GRPO on Atlas 800T A2,
verl 0.6.1, vLLM-Ascend 0.11.0), sections 2.5, 3.1.1-3.3.2 and the summary; mechanisms checked against
verl's ``ppo_trainer.yaml`` and vllm-ascend's ``envs.py`` (see ``FIELD_NOTES.md``).

:mod:`~bench.spec.optimizations.base` holds the model (:class:`Optimization`, :class:`Mechanism` ...),
:mod:`~bench.spec.optimizations.registry` the lookup (:func:`registry`, :func:`factor_keys`, :func:`resolve`
...), and each built-in its own module (``rmsnorm_fused.py`` ...), registered by an entry point
(``grpo_bench.optimizations`` in ``pyproject.toml``).
"""

from bench.spec.optimizations.base import Conflict, Mechanism, Optimization, Requirement
from bench.spec.optimizations.registry import (
    CONFLICTS,
    FACTOR_KEYS,
    OPTIMIZATIONS,
    REGISTRY,
    applicability,
    article_factors,
    compact_label,
    conflict_lifts,
    conflicts_of,
    factor_keys,
    not_read,
    register_optimization,
    registry,
    resolve,
    switch_ranges,
    unregister_optimization,
)
from bench.spec.optimizations.versions import stack_versions

__all__ = ["CONFLICTS", "FACTOR_KEYS", "OPTIMIZATIONS", "REGISTRY", "Conflict", "Mechanism", "Optimization",
           "Requirement",
           "applicability", "article_factors", "compact_label", "conflict_lifts", "conflicts_of",
           "factor_keys", "not_read", "register_optimization", "registry", "resolve", "stack_versions",
           "switch_ranges", "unregister_optimization"]
