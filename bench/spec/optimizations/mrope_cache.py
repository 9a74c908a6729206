"""Built-in optimization ``mrope_cache``, article section 3.3.2:
MRoPE cos/sin computed once per forward and reused across layers.

Registered by one line of ``pyproject.toml``, group ``grpo_bench.optimizations``:
``mrope_cache = "bench.spec.optimizations.mrope_cache:OPTIMIZATION"``.
"""

from __future__ import annotations

from bench.spec.optimizations.base import Mechanism as M
from bench.spec.optimizations.base import Optimization

OPTIMIZATION = Optimization(
    key="mrope_cache",
    code="mrope",
    title="MRoPE cos/sin computed once per forward and reused across layers",
    section="3.3.2",
    acts="rollout",
    mechanisms={
        "verl:npu": {0: M(), 1: M(patches=("vllm_ascend_mrope_cache",))},
    },
    not_applicable={
        "verl:cuda": "the patch targets vLLM-Ascend's MRotaryEmbedding (npu_rotary_mul); "
        "CUDA vLLM is not patched",
        "verl:cpu": "the verl CPU target serves a text Qwen3 (no MRoPE): vLLM's CPU build pins torch "
        "2.13.0+cpu and no torchvision that loads beside it is reachable, and transformers' Qwen3-VL "
        "processor needs torchvision",
        "embedded:*": "Hugging Face Qwen3-VL already computes the rotary cos/sin once per forward and shares "
        "them across layers; there is no per-layer recomputation to cache",
    },
    evidence="patch report of the vLLM worker processes",
    evidence_checks={"verl:npu": "bench.measure.evidence:mrope_cache"},
)
