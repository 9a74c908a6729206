"""Built-in optimization ``mrope_cache``, article section 3.3.2:
MRoPE cos/sin computed once per forward and reused across layers.

Registered by one line of ``pyproject.toml``, group ``grpo_bench.optimizations``:
``mrope_cache = "bench.spec.optimizations.mrope_cache:OPTIMIZATION"``.
"""

from __future__ import annotations

from bench.spec.optimizations.base import Mechanism as M
from bench.spec.optimizations.base import Optimization, Requirement

OPTIMIZATION = Optimization(
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
)
