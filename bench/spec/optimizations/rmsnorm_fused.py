"""Built-in optimization ``rmsnorm_fused``, article section 3.1.1:
Fused RMSNorm (and SwiGLU / rotary) operators in the actor and ref.

Registered by one line of ``pyproject.toml``, group ``grpo_bench.optimizations``:
``rmsnorm_fused = "bench.spec.optimizations.rmsnorm_fused:OPTIMIZATION"``.
"""

from __future__ import annotations

from bench.spec.optimizations.base import Mechanism as M
from bench.spec.optimizations.base import Optimization

OPTIMIZATION = Optimization(
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
    evidence_checks={
        "verl:*": "bench.measure.verl_evidence:rmsnorm_fused",
        "embedded:*": "bench.engines.embedded.evidence:rmsnorm_fused",
    },
)
