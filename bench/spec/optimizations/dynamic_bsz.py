"""``dynamic_bsz`` (article 3.2.1): verl's token-budget micro-batches; an entry point of ``pyproject.toml``."""

from __future__ import annotations

from bench.spec.optimizations.base import Mechanism as M
from bench.spec.optimizations.base import Optimization
from bench.spec.optimizations.versions import VERL, Bound, Revision, SwitchRange

_DYN_ON_OVERRIDES = (
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu={ppo_max_token_len}",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={log_prob_max_token_len}",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={log_prob_max_token_len}",
)
_DYN_OFF_OVERRIDES = (
    "actor_rollout_ref.actor.use_dynamic_bsz=false",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro_batch_size_per_gpu}",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=false",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={log_prob_micro_batch_size_per_gpu}",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={log_prob_micro_batch_size_per_gpu}",
)
_EMBEDDED_ON = {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": "{ppo_max_token_len}",
                "log_prob_max_token_len_per_gpu": "{log_prob_max_token_len}"}

OPTIMIZATION = Optimization(
    key="dynamic_bsz", code="dbsz", section="3.2.1", acts="training", article_gain=0.15, article_level=1,
    title="Dynamic batch size (token-budget micro-batches)",
    mechanisms={"verl:*": {0: M(overrides=_DYN_OFF_OVERRIDES), 1: M(overrides=_DYN_ON_OVERRIDES)},
                "embedded:*": {0: M(config={"use_dynamic_bsz": False}), 1: M(config=_EMBEDDED_ON)}},
    evidence="micro-batches formed per pass and padded vs real tokens (perf/*micro_batches*)",
    switches={"verl:*": (SwitchRange(
        package=VERL, switch="actor_rollout_ref.actor.use_dynamic_bsz",
        since=Bound(version="0.2", source="verl tag v0.2, the first tag whose trainer config has use_dynamic_bsz"),
        revisions=(Revision(package=VERL, at=Bound(version="0.9.0", source="verl PR 7272 (87c68d212), first in tag "
                                                   "v0.9.0"),
                            what="{actor,ref}.pad_to_length pads each packed micro-batch to a multiple of "
                            "pad_to_length_bucket tokens; default false, and the levels leave it so"),),
    ),)},
)
