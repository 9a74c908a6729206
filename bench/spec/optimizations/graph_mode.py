"""``graph_mode`` (article 2.5): rollout graph capture instead of eager; an entry point of ``pyproject.toml``."""

from __future__ import annotations

from bench.spec.optimizations.base import EMBEDDED_NO_VLLM, Optimization, on_off
from bench.spec.optimizations.versions import VERL, Bound, SwitchRange

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
    evidence_checks={"verl:*": "bench.measure.verl_evidence:graph_mode"},
    switches={"verl:*": (SwitchRange(package=VERL, switch="actor_rollout_ref.rollout.enforce_eager",
                                     since=Bound(version="0.1", source="verl tag v0.1 (ppo_trainer.yaml)")),)},
)
