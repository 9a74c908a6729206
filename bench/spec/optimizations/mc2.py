"""``mc2`` (article 3.3.1): vLLM-Ascend's matmul + all-reduce fusion; an entry point of ``pyproject.toml``.

Sources (vllm-ascend snapshot to 2026-08, tags to v0.25.1rc1): PR 1926 (32a9c5f694, first in tag
v0.10.0rc1), PR 9064 (958daf8320, first in tag v0.20.2rc1: ``additional_config.enable_matmul_allreduce``,
the variable kept as a deprecated fallback), PR 12119 (2ee50f3847, first in tag v0.25.1rc1: both removed).
"""

from __future__ import annotations

from bench.spec.optimizations.base import EMBEDDED_NO_VLLM, Optimization, Requirement, on_off
from bench.spec.optimizations.versions import Bound, Revision, SwitchRange

_SWITCH = "VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE"

OPTIMIZATION = Optimization(
    key="mc2", code="mc2", section="3.3.1", acts="rollout", article_gain=0.08, article_level=1,
    title="MC2 matmul + all-reduce fusion in vLLM-Ascend tensor parallel",
    mechanisms={"verl:npu": on_off(_SWITCH, kind="env")},
    not_applicable={
        "verl:cuda": f"{_SWITCH} is a vLLM-Ascend switch; CUDA vLLM has no MC2",
        "verl:cpu": f"{_SWITCH} is a vLLM-Ascend switch; vLLM's CPU build has no MC2",
        "embedded:*": EMBEDDED_NO_VLLM + ", so no tensor-parallel all-reduce to fuse",
    },
    requires=(Requirement(setting="rollout_tp", minimum=2, reason="MC2 fuses the tensor-parallel all-reduce: it "
                          "needs rollout tensor_model_parallel_size >= 2"),),
    evidence=f"{_SWITCH} in the vLLM worker environment",
    switches={"verl:npu": (SwitchRange(
        package="vllm_ascend", switch=_SWITCH,
        since=Bound(version="0.10.0rc1", source="vllm-ascend PR 1926, first in tag v0.10.0rc1; absent in v0.9.2rc1"),
        until=Bound(version="0.25.1rc1", source="vllm-ascend PR 12119, first in tag v0.25.1rc1; still in v0.24.0rc1"),
        revisions=(Revision(package="vllm_ascend", at=Bound(version="0.20.2rc1", source="vllm-ascend PR 9064, first "
                                                             "in tag v0.20.2rc1"),
                            what=f"{_SWITCH} becomes a deprecated fallback of "
                            "additional_config.enable_matmul_allreduce (still read: the harness keeps setting it)"),),
    ),)},
)
