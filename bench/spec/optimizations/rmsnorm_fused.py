"""``rmsnorm_fused`` (article 3.1.1): fused RMSNorm operators; an entry point of ``pyproject.toml``.

Sources of the bounds (issue 46), read in the stored snapshots:

- verl (``verl-project/verl``, snapshot to 2026-08-22, tags to v0.9.0): the commits of PR 4186 (37ec0138d,
  first in tag v0.7.0: ``import verl`` on an NPU replaces ``Qwen3VLTextRMSNorm.forward`` and
  ``Qwen3VLTextMLP.forward``; v0.6.1's ``npu_patch.py`` has no Qwen3-VL), PR 6244 (067479edd, first in tag
  v0.8.0: ``apply_npu_fsdp_patches`` returns early when ``model.use_liger`` is set, so ``use_liger`` skips
  *every* NPU patch) and PR 6777 (c5a9ed569, first in tag v0.9.0: the per-model ``NPU_PATCHES`` table and
  ``apply_npu_patches``); ``use_liger`` in ``ppo_trainer.yaml`` from PR 1032 (5ba1dbc60, first in tag v0.4.0;
  the FSDP workers read ``model.get('use_liger')`` since PR 133, tag v0.2, but a plain override of a key the
  config lacks fails).
- transformers: Qwen3-VL first in v4.57.0 (the Transformers docs page ``model_doc/qwen3_vl``: added
  2025-09-15; Qwen's model card, huggingface.co/Qwen/Qwen3-VL-2B-Thinking commit 8b5ad6b, installs
  ``transformers==4.57.0`` once "V4.57.0 is released"). The tag itself was not read: the transformers
  snapshot is over the fetch limit.

There is an honest off level on every verl: after each of verl's patch points above (the import, the FSDP
engine's ``apply_npu_patches`` and each ``NPU_PATCHES['qwen3_vl*']`` entry) the patch ``qwen3vl_npu_fused:off``
puts the eager transformers forwards of the Qwen3-VL classes back, and only those (``use_liger`` would drop
every NPU patch of every model); ``tests/test_patches.py`` runs it against the installed verl's
``NPU_PATCHES``. So the factor is never "always on" here.
"""

from __future__ import annotations

from bench.spec.optimizations.base import Optimization, on_off
from bench.spec.optimizations.versions import VERL, Bound, Revision, SwitchRange

#: verl's own NPU patch of the Qwen3-VL classes, release by release (what ``qwen3vl_npu_fused:off`` undoes)
VERL_NPU_PATCH_REVISIONS = (
    Revision(package=VERL, at=Bound(version="0.7.0", source="verl PR 4186, first in tag v0.7.0; absent in v0.6.1"),
             what="import verl on an NPU replaces Qwen3VLTextRMSNorm/Qwen3VLTextMLP forwards with "
             "torch_npu fused ones; the off level restores the eager forwards after that import"),
    Revision(package=VERL, at=Bound(version="0.8.0", source="verl PR 6244, first in tag v0.8.0"),
             what="the FSDP engine applies the NPU patches (apply_npu_fsdp_patches) and skips every one of them "
             "when model.use_liger is set; the off level re-enforces the eager forwards after it"),
    Revision(package=VERL, at=Bound(version="0.9.0", source="verl PR 6777, first in tag v0.9.0"),
             what="per-model NPU_PATCHES table applied by apply_npu_patches (fused RMSNorm on by default on an "
             "NPU); the off level wraps NPU_PATCHES['qwen3_vl'] and ['qwen3_vl_moe'] only"),
)

OPTIMIZATION = Optimization(
    key="rmsnorm_fused", code="rms", section="3.1.1", acts="training",
    title="Fused RMSNorm (and SwiGLU / rotary) operators in the actor and ref",
    mechanisms={"verl:npu": on_off("qwen3vl_npu_fused"), "verl:cpu": on_off("cpu_rmsnorm"),
                "verl:cuda": on_off("actor_rollout_ref.model.use_liger", kind="overrides"),
                "embedded:*": on_off("rmsnorm_fused", kind="config")},
    evidence="the RMSNorm forward installed in each process (patch report / run evidence)",
    switches={
        "verl:npu": (SwitchRange(package="transformers",
                                 switch="patch qwen3vl_npu_fused (transformers' Qwen3-VL classes)",
                                 since=Bound(version="4.57.0", source="transformers v4.57.0, the first release with "
                                             "Qwen3-VL (docs: model_doc/qwen3_vl, added 2025-09-15; Qwen's model "
                                             "card commit 8b5ad6b); the tag was not read (snapshot over the limit)"),
                                 revisions=VERL_NPU_PATCH_REVISIONS,
                                 note="verl fuses the Qwen3-VL RMSNorm itself on an NPU from v0.7.0 on: the off "
                                 "level is enforced by the patch (the eager forwards put back after each of verl's "
                                 "patch points), not by a verl switch"),),
        "verl:cuda": (SwitchRange(package=VERL, switch="actor_rollout_ref.model.use_liger",
                                  since=Bound(version="0.4.0", source="verl PR 1032, first in tag v0.4.0, the first "
                                              "tag whose ppo_trainer.yaml has model.use_liger")),),
    },
)
