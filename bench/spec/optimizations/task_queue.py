"""Built-in optimization ``task_queue``, article section 3.1.2:
Task queue pipelined dispatch (TASK_QUEUE_ENABLE).

Registered by one line of ``pyproject.toml``, group ``grpo_bench.optimizations``:
``task_queue = "bench.spec.optimizations.task_queue:OPTIMIZATION"``.
"""

from __future__ import annotations

from bench.spec.optimizations.base import Mechanism as M
from bench.spec.optimizations.base import Optimization

_NOT_NPU_TQ = "TASK_QUEUE_ENABLE is read by torch_npu's dispatcher only; there is no such queue on {platform}"

OPTIMIZATION = Optimization(
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
    evidence_checks={
        "verl:npu": "bench.measure.evidence:task_queue",
        "embedded:npu": "bench.engines.embedded.evidence:task_queue",
    },
)
