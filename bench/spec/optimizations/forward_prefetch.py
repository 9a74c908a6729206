"""``forward_prefetch`` (article 3.2.2): FSDP forward prefetch; an entry point of ``pyproject.toml``."""

from __future__ import annotations

from bench.spec.optimizations.base import Optimization, on_off
from bench.spec.optimizations.versions import VERL, Bound, Revision, SwitchRange

OPTIMIZATION = Optimization(
    key="forward_prefetch", code="fwdpf", section="3.2.2", acts="training",
    title="FSDP forward prefetch (overlap all-gather with compute)",
    mechanisms={"verl:*": on_off("actor_rollout_ref.actor.fsdp_config.forward_prefetch",
                                 "actor_rollout_ref.ref.fsdp_config.forward_prefetch", kind="overrides")},
    not_applicable={"embedded:*": "the embedded engine trains in one process without FSDP: nothing to prefetch"},
    evidence="fsdp_config.forward_prefetch in the resolved verl config; FSDP2 ignores it in some verl versions",
    switches={"verl:*": (SwitchRange(
        package=VERL, switch="actor_rollout_ref.{actor,ref}.fsdp_config.forward_prefetch",
        since=Bound(version="0.4.1", source="verl tag v0.4.1, the first tag whose trainer config has it"),
        revisions=(Revision(package=VERL, at=Bound(version="0.8.0", source="verl PR 6317 (0f7d9aa33), first in tag "
                                                   "v0.8.0"),
                            what="read with strategy fsdp2 too (set_modules_to_forward_prefetch); before it FSDP2 "
                            "ignores it: see the verl engine's notes"),),
    ),)},
)
