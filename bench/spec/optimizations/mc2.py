"""Built-in optimization ``mc2``, article section 3.3.1:
MC2 matmul + all-reduce fusion in vLLM-Ascend tensor parallel.

Registered by one line of ``pyproject.toml``, group ``grpo_bench.optimizations``:
``mc2 = "bench.spec.optimizations.mc2:OPTIMIZATION"``.
"""

from __future__ import annotations

from bench.spec.optimizations.base import EMBEDDED_NO_VLLM, Optimization, Requirement
from bench.spec.optimizations.base import Mechanism as M

OPTIMIZATION = Optimization(
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
        "embedded:*": EMBEDDED_NO_VLLM + ", so no tensor-parallel all-reduce to fuse",
    },
    requires=(
        Requirement(
            setting="rollout_tp",
            minimum=2,
            reason="MC2 fuses the tensor-parallel all-reduce: it needs rollout tensor_model_parallel_size >= 2",
        ),
    ),
    evidence="VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE in the vLLM worker environment",
    evidence_checks={"verl:npu": "bench.measure.evidence:mc2"},
)
