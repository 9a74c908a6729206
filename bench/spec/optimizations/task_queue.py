"""``task_queue`` (article 3.1.2): torch_npu's pipelined dispatch queue; an entry point of ``pyproject.toml``."""

from __future__ import annotations

from bench.spec.optimizations.base import Optimization, per_level
from bench.spec.optimizations.versions import Bound, SwitchRange

#: torch_npu reads TASK_QUEUE_ENABLE; the release that added level 2 was not found in the stored sources
_TQ_RANGE = SwitchRange(package="torch_npu", switch="TASK_QUEUE_ENABLE", since=Bound(
    source="unconfirmed: the first torch_npu release with levels 0/1/2 was not found in the searchable sources"),
    note="verl PR 6562 (first in tag v0.9.0): VLLM_ASCEND_TASK_QUEUE_ENABLE, when set, is the rollout "
    "servers' TASK_QUEUE_ENABLE")

_NOT_NPU_TQ = "TASK_QUEUE_ENABLE is read by torch_npu's dispatcher only; there is no such queue on {}"
_ENV = per_level(lambda lv: {"env": {"TASK_QUEUE_ENABLE": str(lv)}}, (0, 1, 2))

OPTIMIZATION = Optimization(
    key="task_queue", code="tq", section="3.1.2", acts="host", article_gain=0.09, article_level=1,
    title="Task queue pipelined dispatch (TASK_QUEUE_ENABLE)", levels=(0, 1, 2), default_levels=(0, 1, 2),
    mechanisms={"verl:npu": _ENV, "embedded:npu": _ENV},
    not_applicable={target: _NOT_NPU_TQ.format(target.partition(":")[2].upper())
                    for target in ("verl:cuda", "verl:cpu", "embedded:cpu", "embedded:cuda")},
    evidence="TASK_QUEUE_ENABLE as seen by every process of the run",
    evidence_checks={"verl:npu": "bench.measure.evidence:task_queue",
                     "embedded:npu": "bench.engines.embedded.evidence:task_queue"},
    switches={target: (_TQ_RANGE,) for target in ("verl:npu", "embedded:npu")},
)
