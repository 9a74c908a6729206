"""Built-in optimization ``forward_prefetch``, article section 3.2.2:
FSDP forward prefetch (overlap all-gather with compute).

Registered by one line of ``pyproject.toml``, group ``grpo_bench.optimizations``:
``forward_prefetch = "bench.spec.optimizations.forward_prefetch:OPTIMIZATION"``.
"""

from __future__ import annotations

from bench.spec.optimizations.base import Mechanism as M
from bench.spec.optimizations.base import Optimization

OPTIMIZATION = Optimization(
    key="forward_prefetch",
    code="fwdpf",
    title="FSDP forward prefetch (overlap all-gather with compute)",
    section="3.2.2",
    acts="training",
    mechanisms={
        "verl:*": {
            lv: M(
                overrides=(
                    f"actor_rollout_ref.actor.fsdp_config.forward_prefetch={str(bool(lv)).lower()}",
                    f"actor_rollout_ref.ref.fsdp_config.forward_prefetch={str(bool(lv)).lower()}",
                )
            )
            for lv in (0, 1)
        },
    },
    not_applicable={
        "embedded:*": "the embedded engine trains in one process without FSDP: nothing to prefetch"
    },
    evidence="fsdp_config.forward_prefetch in the resolved verl config; FSDP2 ignores it in some verl versions",
    evidence_checks={"verl:*": "bench.measure.verl_evidence:forward_prefetch"},
)
