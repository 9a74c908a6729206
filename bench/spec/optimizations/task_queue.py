"""``task_queue`` (article 3.1.2): torch_npu's pipelined dispatch queue; an entry point of ``pyproject.toml``."""

from __future__ import annotations

from bench.spec.optimizations.base import Optimization, per_level
from bench.spec.optimizations.versions import VERL, Bound, Revision, SwitchRange

#: torch_npu reads TASK_QUEUE_ENABLE. Level 2 (``Repository::ReadQueue`` polls ``task_queue_enable == 2``,
#: ``OptionsManager`` reads the value as a level) was read in the Ascend/pytorch snapshot: first in the tags
#: v6.0.rc3-pytorch2.1.0 / -pytorch2.3.1 / -pytorch2.4.0 (torch_npu 2.1.0.post8, 2.3.1.post2, 2.4.0), absent
#: in v6.0.rc2-pytorch2.1.0 / 2.2.0 / 2.3.1 (2.1.0.post6, 2.2.0.post2, 2.3.1: a boolean, any non-zero value is
#: "on"). torch_npu versions each follow their torch branch, so no single PEP 440 version separates them
#: (2.2.0.post2 > 2.1.0.post8 has no level 2): the bound stays without a version and never judges.
_TQ_SINCE = Bound(source="unconfirmed as one version: level 2 first in Ascend Extension for PyTorch tag v6.0.rc3 "
                  "(torch_npu 2.1.0.post8, 2.3.1.post2, 2.4.0), absent in v6.0.rc2 (2.1.0.post6, 2.2.0.post2, "
                  "2.3.1); per-branch versions do not order across branches")
_TQ_RANGE = SwitchRange(package="torch_npu", switch="TASK_QUEUE_ENABLE", since=_TQ_SINCE)
#: on verl, the same switch, with verl's own rollout level from verl 0.9.0 on
_TQ_RANGE_VERL = SwitchRange(package="torch_npu", switch="TASK_QUEUE_ENABLE", since=_TQ_SINCE, revisions=(
    Revision(package=VERL, at=Bound(version="0.9.0", source="verl PR 6562, first in tag v0.9.0"),
             what="VLLM_ASCEND_TASK_QUEUE_ENABLE, when set, is the rollout servers' TASK_QUEUE_ENABLE (not split "
             "automatically: the harness sets it only where graph_mode=1 meets task_queue=2)"),))

_NOT_NPU_TQ = "TASK_QUEUE_ENABLE is read by torch_npu's dispatcher only; there is no such queue on {}"
_ENV = per_level(lambda lv: {"env": {"TASK_QUEUE_ENABLE": str(lv)}}, (0, 1, 2))

OPTIMIZATION = Optimization(
    key="task_queue", code="tq", section="3.1.2", acts="host", article_gain=0.09, article_level=1,
    title="Task queue pipelined dispatch (TASK_QUEUE_ENABLE)", levels=(0, 1, 2), default_levels=(0, 1, 2),
    mechanisms={"verl:npu": _ENV, "embedded:npu": _ENV},
    not_applicable={target: _NOT_NPU_TQ.format(target.partition(":")[2].upper())
                    for target in ("verl:cuda", "verl:cpu", "embedded:cpu", "embedded:cuda")},
    evidence="TASK_QUEUE_ENABLE as seen by every process of the run",
    switches={"verl:npu": (_TQ_RANGE_VERL,), "embedded:npu": (_TQ_RANGE,)},
)
