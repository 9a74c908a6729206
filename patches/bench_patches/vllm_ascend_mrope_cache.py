"""Article 3.3.2: MRoPE cos/sin computed once per forward (first layer) and reused, with npu_rotary_mul.

Target: vllm-ascend 0.11.0's ``vllm_ascend.ops.rotary_embedding.AscendMRotaryEmbedding.forward_oot``
(registered as the out-of-tree ``MRotaryEmbedding``). For Qwen3-VL (``mrope_section`` [24, 20, 20],
interleaved) it falls back to vLLM's ``MRotaryEmbedding.forward_native``, which in *every* decoder layer
gathers ``cos_sin_cache[positions]``, re-interleaves the T/H/W sections and rotates with small ops
(the ViewCopy / AI-CPU share the article measured).

The patched ``forward_oot``:

- when ``forward_context.is_first_layer`` is set (vllm-ascend sets it ``True`` at the start of each
  forward in ``set_ascend_forward_context``), gathers and interleaves cos/sin once, stores them on the
  rotary module as ``[1, num_tokens, 1, rotary_dim]`` and clears the flag; later layers of the same
  forward reuse them;
- rotates the rotary part of query and key with one ``torch_npu.npu_rotary_mul`` each (``half`` mode,
  i.e. NeoX style) instead of ``apply_rotary_emb`` small ops.

Left to the original method: non-NeoX layouts, ``mrope_section == [16, 24, 24]`` without interleaving
(vllm-ascend's fused ``npu_mrope`` path for Qwen2.5-VL), and tensors not on an NPU. The patch must be
in place before vLLM builds the model (``forward_oot`` is bound when each layer is created), which the
import hook guarantees. The counters (:data:`STATS`) go into the process's patch report as ``counters``.
"""

from __future__ import annotations

import atexit
import importlib.util
import sys
import time
from types import ModuleType
from typing import Any, Callable

from bench_patches import PatchRecord, PatchRefused, when_imported

NAME = "vllm_ascend_mrope_cache"
TARGET_MODULE = "vllm_ascend.ops.rotary_embedding"
TARGET_CLASS = "AscendMRotaryEmbedding"
#: Device types on which the patched path runs (tests add "cpu" with a stand-in torch_npu).
FUSED_DEVICE_TYPES = {"npu"}
#: Counters of the patched path (evidence; tests).
STATS = {"computed": 0, "reused": 0, "fallback": 0}
_STATE: dict[str, Any] = {"record": None, "no_flag_noted": False, "last_write": 0.0}


def _report_stats(force: bool = False) -> None:
    """Copy :data:`STATS` into the patch report as ``counters`` (at most once a second, and at exit): the
    evidence ``bench.measure.verl_evidence.mrope_cache`` reads."""
    rec: PatchRecord | None = _STATE["record"]
    now = time.monotonic()
    if rec is None or not (force or now - _STATE["last_write"] >= 1.0):
        return
    _STATE["last_write"] = now
    rec["counters"] = dict(STATS)
    rec._report.write()


def _torch_npu():
    import torch_npu  # noqa: PLC0415

    return torch_npu


def _forward_context():
    try:
        from vllm.forward_context import get_forward_context

        return get_forward_context()
    except Exception:  # outside a forward (or another vLLM layout): no cache, still correct
        return None


def interleave_mrope(x, mrope_section: list[int]):
    """T/H/W cos or sin ``[3, num_tokens, rotary_dim // 2]`` -> ``[num_tokens, rotary_dim // 2]``, laid out
    ``THWTHW...TT`` (Qwen3-VL's interleaved MRoPE, as vLLM's ``apply_interleaved_rope``)."""
    import torch

    channels = torch.arange(x.shape[-1], device=x.device)
    is_height = (channels % 3 == 1) & (channels < mrope_section[1] * 3)
    is_width = (channels % 3 == 2) & (channels < mrope_section[2] * 3)
    out = torch.where(is_height, x[1], x[0])
    return torch.where(is_width, x[2], out)


def compute_cos_sin(rope, positions, query):
    """cos/sin for ``positions`` as ``[1, num_tokens, 1, rotary_dim]`` (NeoX halves repeated)."""
    import torch

    cache = rope.cos_sin_cache
    if cache.device != query.device or cache.dtype != query.dtype:
        cache = cache.to(device=query.device, dtype=query.dtype)
        rope.cos_sin_cache = cache
    cos, sin = cache[positions].chunk(2, dim=-1)
    if positions.ndim == 2:
        section = list(rope.mrope_section)
        if getattr(rope, "mrope_interleaved", False):
            cos, sin = interleave_mrope(cos, section), interleave_mrope(sin, section)
        else:
            cos = torch.cat([m[i] for i, m in enumerate(cos.split(section, dim=-1))], dim=-1)
            sin = torch.cat([m[i] for i, m in enumerate(sin.split(section, dim=-1))], dim=-1)
    cos = cos.repeat(1, 2).unsqueeze(0).unsqueeze(-2).contiguous()
    sin = sin.repeat(1, 2).unsqueeze(0).unsqueeze(-2).contiguous()
    return cos, sin


def _rotate(rope, x, num_tokens: int, cos, sin):
    import torch

    shape = x.shape
    x = x.view(num_tokens, -1, rope.head_size)
    rot = x[..., : rope.rotary_dim]
    rest = x[..., rope.rotary_dim:]
    rot = _torch_npu().npu_rotary_mul(rot.unsqueeze(0), cos, sin).squeeze(0)
    return torch.cat((rot, rest), dim=-1).reshape(shape)


def make_forward_oot(original: Callable) -> Callable:
    """The cached ``forward_oot`` wrapping vllm-ascend's ``original``."""

    def forward_oot(self, positions, query, key=None, *args, **kwargs):
        section = list(getattr(self, "mrope_section", None) or [])
        interleaved = bool(getattr(self, "mrope_interleaved", False))
        if (
            args or kwargs or key is None
            or not getattr(self, "is_neox_style", True)
            or query.device.type not in FUSED_DEVICE_TYPES
            or (positions.ndim == 2 and not section)
            or (section == [16, 24, 24] and not interleaved)
        ):
            STATS["fallback"] += 1
            return original(self, positions, query, key, *args, **kwargs)
        num_tokens = positions.shape[-1]
        ctx = _forward_context()
        first = getattr(ctx, "is_first_layer", None) if ctx is not None else None
        cached = getattr(self, "_bench_cos_sin", None)
        stale = (
            cached is None
            or cached[0].shape[1] != num_tokens
            or cached[0].device != query.device
            or cached[0].dtype != query.dtype
        )
        if first is None or first or stale:
            cached = compute_cos_sin(self, positions, query)
            self._bench_cos_sin = cached
            STATS["computed"] += 1
            if first:
                ctx.is_first_layer = False
            elif first is None and not _STATE["no_flag_noted"]:
                _STATE["no_flag_noted"] = True
                rec = _STATE["record"]
                if rec is not None:
                    rec.action("forward context has no is_first_layer: cos/sin computed in every layer "
                               "(npu_rotary_mul still used)")
        else:
            STATS["reused"] += 1
        _report_stats()
        cos, sin = cached
        return _rotate(self, query, num_tokens, cos, sin), _rotate(self, key, num_tokens, cos, sin)

    forward_oot.__bench_patch__ = NAME
    forward_oot.__wrapped__ = original
    return forward_oot


def _install(module: ModuleType) -> None:
    cls = getattr(module, TARGET_CLASS, None)
    rec: PatchRecord | None = _STATE["record"]
    if cls is None:
        if rec is not None:
            rec.status("error", f"{module.__name__} has no {TARGET_CLASS}: this vllm-ascend is not the "
                                "0.11.x layout the patch targets")
        return
    current = cls.__dict__.get("forward_oot")
    if current is None or getattr(current, "__bench_patch__", None) == NAME:
        return
    cls.forward_oot = make_forward_oot(current)
    if rec is not None:
        rec.action(f"{module.__name__}.{TARGET_CLASS}.forward_oot -> cos/sin cached per forward + "
                   "torch_npu.npu_rotary_mul")


def apply(mode: str | None, record: PatchRecord) -> None:
    """Arm the hook (mode ``on``, the default; ``off`` does nothing).

    Raises:
        PatchRefused: no torch_npu or no vllm-ascend in this Python, or an unknown mode.
    """
    mode = (mode or "on").lower()
    if mode not in ("on", "off"):
        raise PatchRefused(f"unknown mode {mode!r} (allowed: on, off)")
    if mode == "off":
        record.status("armed", "off: vllm-ascend's MRotaryEmbedding left as is")
        return
    if importlib.util.find_spec("torch_npu") is None:
        raise PatchRefused(f"needs torch_npu for npu_rotary_mul, and it is not installed for {sys.executable}")
    if importlib.util.find_spec("vllm_ascend") is None:
        raise PatchRefused(f"vllm-ascend is not installed for {sys.executable}: no MRotaryEmbedding to patch")
    _STATE["record"] = record
    when_imported(TARGET_MODULE, _install)
    atexit.register(lambda: STATS["computed"] and _report_stats(force=True))
    if record["status"] == "pending":
        record.status("armed")
