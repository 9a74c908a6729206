"""``graph_mode`` (article 2.5): rollout graph capture instead of eager; an entry point of ``pyproject.toml``."""

from __future__ import annotations

from bench.spec.optimizations.base import EMBEDDED_NO_VLLM, Optimization, on_off
from bench.spec.optimizations.versions import VERL, Bound, Revision, SwitchRange

OPTIMIZATION = Optimization(
    key="graph_mode", code="graph", section="2.5", acts="rollout",
    title="Rollout graph mode (ACL graph / CUDA graph instead of eager)",
    mechanisms={"verl:*": on_off("actor_rollout_ref.rollout.enforce_eager", kind="overrides",
                                 values=("true", "false"))},  # level 1: graph mode on, eager off
    not_applicable={
        "embedded:*": EMBEDDED_NO_VLLM + "; torch.compile of Hugging Face generate recompiles for every "
        "new sequence length and costs more than a short benchmark run, so there is no faithful analog",
    },
    evidence="rollout.enforce_eager in the resolved verl config",
    switches={"verl:*": (SwitchRange(
        package=VERL, switch="actor_rollout_ref.rollout.enforce_eager",
        since=Bound(version="0.1", source="verl tag v0.1 (ppo_trainer.yaml)"),
        revisions=(  # vllm-ascend snapshot: 7372661359 and 1bb58b5ff1; what graph mode means on an NPU, not whether
            Revision(package="vllm_ascend", at=Bound(version="0.20.2rc1", source="vllm-ascend PR 9201, first in "
                                                     "tag v0.20.2rc1"),
                     what="on an NPU the graph backend is npugraph_ex instead of torchair (enforce_eager=false "
                     "still turns it on)"),
            Revision(package="vllm_ascend", at=Bound(version="0.21.0rc1", source="vllm-ascend PR 9572, first in "
                                                     "tag v0.21.0rc1"),
                     what="cudagraph_mode FULL_AND_PIECEWISE supported on an NPU"),
        ),
    ),)},
)
