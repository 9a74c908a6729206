"""Built-in optimization ``graph_mode``, article section 2.5:
Rollout graph mode (ACL graph / CUDA graph instead of eager).

Registered by one line of ``pyproject.toml``, group ``grpo_bench.optimizations``:
``graph_mode = "bench.spec.optimizations.graph_mode:OPTIMIZATION"``.
"""

from __future__ import annotations

from bench.spec.optimizations.base import EMBEDDED_NO_VLLM, Optimization
from bench.spec.optimizations.base import Mechanism as M

OPTIMIZATION = Optimization(
    key="graph_mode",
    code="graph",
    title="Rollout graph mode (ACL graph / CUDA graph instead of eager)",
    section="2.5",
    acts="rollout",
    mechanisms={
        "verl:*": {
            0: M(overrides=("actor_rollout_ref.rollout.enforce_eager=true",)),
            1: M(overrides=("actor_rollout_ref.rollout.enforce_eager=false",)),
        },
    },
    not_applicable={
        "embedded:*": EMBEDDED_NO_VLLM + "; torch.compile of Hugging Face generate recompiles for every "
        "new sequence length and costs more than a short benchmark run, so there is no faithful analog",
    },
    evidence="rollout.enforce_eager in the resolved verl config",
    evidence_checks={"verl:*": "bench.measure.verl_evidence:graph_mode"},
)
