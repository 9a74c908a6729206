"""``rmsnorm_fused`` (article 3.1.1): fused RMSNorm operators; an entry point of ``pyproject.toml``."""

from __future__ import annotations

from bench.spec.optimizations.base import Optimization, on_off

OPTIMIZATION = Optimization(
    key="rmsnorm_fused", code="rms", section="3.1.1", acts="training",
    title="Fused RMSNorm (and SwiGLU / rotary) operators in the actor and ref",
    mechanisms={"verl:npu": on_off("qwen3vl_npu_fused"), "verl:cpu": on_off("cpu_rmsnorm"),
                "verl:cuda": on_off("actor_rollout_ref.model.use_liger", kind="overrides"),
                "embedded:*": on_off("rmsnorm_fused", kind="config")},
    evidence="the RMSNorm forward installed in each process (patch report / run evidence)",
    evidence_checks={"verl:*": "bench.measure.verl_evidence:rmsnorm_fused",
                     "embedded:*": "bench.engines.embedded.evidence:rmsnorm_fused"},
)
