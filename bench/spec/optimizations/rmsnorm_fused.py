"""``rmsnorm_fused`` (article 3.1.1): fused RMSNorm operators; an entry point of ``pyproject.toml``."""

from __future__ import annotations

from bench.spec.optimizations.base import Optimization, on_off
from bench.spec.optimizations.versions import VERL, Bound, SwitchRange

OPTIMIZATION = Optimization(
    key="rmsnorm_fused", code="rms", section="3.1.1", acts="training",
    title="Fused RMSNorm (and SwiGLU / rotary) operators in the actor and ref",
    mechanisms={"verl:npu": on_off("qwen3vl_npu_fused"), "verl:cpu": on_off("cpu_rmsnorm"),
                "verl:cuda": on_off("actor_rollout_ref.model.use_liger", kind="overrides"),
                "embedded:*": on_off("rmsnorm_fused", kind="config")},
    evidence="the RMSNorm forward installed in each process (patch report / run evidence)",
    evidence_checks={"verl:*": "bench.measure.verl_evidence:rmsnorm_fused",
                     "embedded:*": "bench.engines.embedded.evidence:rmsnorm_fused"},
    switches={
        "verl:npu": (SwitchRange(package="transformers",
                                 switch="patch qwen3vl_npu_fused (transformers' Qwen3-VL classes)",
                                 since=Bound(source="unconfirmed: the first transformers release with Qwen3-VL "
                                             "was not checked"),
                                 note="newer verl patches NPU fused ops in by default (apply_npu_fsdp_patches, "
                                 "FIELD_NOTES; release unconfirmed): the off level must be enforced"),),
        "verl:cuda": (SwitchRange(package=VERL, switch="actor_rollout_ref.model.use_liger",
                                  since=Bound(source="unconfirmed: the first verl release with use_liger was not "
                                              "checked")),),
    },
)
