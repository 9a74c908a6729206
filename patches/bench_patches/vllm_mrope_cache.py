"""Factor ``mrope_cache`` on vLLM's own MRoPE (``verl:cpu``; any vLLM whose MRoPE runs ``forward_native``).

The article (3.3.2) found that for Qwen3-VL vLLM computes the MRoPE cos/sin in *every* decoder layer:
vLLM 0.27.1's ``vllm/model_executor/layers/rotary_embedding/mrope.py`` ``MRotaryEmbedding.forward_native``
(which ``forward_cpu`` calls) gathers ``cos_sin_cache[positions]`` for the ``[3, num_tokens]`` T/H/W
positions, splits it into cos and sin and re-lays the sections out (``apply_interleaved_rope``: a clone
and two strided copies each for Qwen3-VL's interleaved MRoPE) before rotating query and key. The
positions are the same for every layer of one forward, and ``get_rope`` hands every layer the same
module instance, so the layers 2..L redo layer 1's work. The article's fix: compute cos/sin once per
forward and reuse them in every layer.

``on``
    ``MRotaryEmbedding.forward_native`` -> the same computation with the cos/sin of the first layer of a
    forward kept on the rotary module and reused by the later layers. A forward is recognised by the
    objects vLLM passes: the forward context (``vllm.forward_context``, a new object per forward), the
    positions tensor (the same object for every layer of a forward) and its version counter (bumped by an
    in-place update). The rotation itself is vLLM's own (``apply_rotary_emb.forward_native``), so query
    and key are bit-for-bit those of the unpatched module (``tests/test_vllm_mrope_cache.py``).
``off``
    vLLM's own ``forward_native`` runs in every layer; the wrapper only counts, so both levels carry the
    same bookkeeping and the ``off`` run still shows that vLLM's MRoPE was reached.

Left to vLLM's own code: while ``torch.compile`` traces the model (graph mode: inductor compiles vLLM's own
forward; a Python-side cache has no place in a compiled graph, and the traced path has no side effects, so
``fullgraph`` tracing sees no break; nothing is counted there), and, counted as ``fallback``, calls with
``offsets`` or without a key and 2-D positions on a module without ``mrope_section``. The patch must be
in place before vLLM builds the model (``CustomOp`` binds its forward method when each layer is
created), which the import hook guarantees.

Evidence: the process's patch report carries ``counters`` = ``{"forwards": cos/sin computations (one per
forward), "hits": layers that reused them, "layer_calls", "tokens": tokens of the forwards, "fallback":
{reason: calls}}``, rewritten at most once a second (a timer writes the last change) and at exit.
"""

from __future__ import annotations

import atexit
import threading
import time
from types import ModuleType
from typing import Any, Callable

from bench_patches import PatchRecord, PatchRefused, replace, when_imported

NAME = "vllm_mrope_cache"
TARGET_MODULE = "vllm.model_executor.layers.rotary_embedding.mrope"
TARGET_CLASS = "MRotaryEmbedding"
#: Attribute of the rotary module holding the cached ``(key, cos, sin)`` (set through ``__dict__``:
#: ``nn.Module.__setattr__`` is slow).
CACHE_ATTR = "_bench_mrope_cos_sin"
_STATE: dict[str, Any] = {"record": None, "mode": "on", "last_write": 0.0, "timer": None}
_LOCK = threading.Lock()
#: Counters of this process (also in the patch report).
STATS: dict[str, Any] = {"forwards": 0, "hits": 0, "layer_calls": 0, "tokens": 0, "fallback": {}}


# ------------------------------------------------------------------------------------------ evidence


def _write() -> None:
    rec: PatchRecord | None = _STATE["record"]
    if rec is None:
        return
    with _LOCK:
        _STATE["last_write"] = time.monotonic()
        _STATE["timer"] = None
        rec["counters"] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in STATS.items()}
        rec["status"] = "applied"
    rec._report.write()


def _changed() -> None:
    """Write the counters now if the last write is a second old, else once a second from now."""
    if _STATE["record"] is None:
        return
    if time.monotonic() - _STATE["last_write"] >= 1.0:
        _write()
        return
    with _LOCK:
        if _STATE["timer"] is not None:
            return
        timer = threading.Timer(1.0, _write)
        timer.daemon = True
        _STATE["timer"] = timer
    timer.start()


def _fallback(reason: str) -> None:
    fb = STATS["fallback"]
    fb[reason] = fb.get(reason, 0) + 1
    _changed()


# --------------------------------------------------------------------------------------- computation


def _forward_context() -> Any:
    """vLLM's current forward context (a new object per forward; ``None`` outside one or in another layout,
    where the positions tensor and its version alone key the cache)."""
    module = _STATE.get("forward_context_module")
    if module is None:
        try:
            import vllm.forward_context as module
        except Exception:
            module = False
        _STATE["forward_context_module"] = module
    return getattr(module, "_forward_context", None) if module else None


def cos_sin(rope: Any, positions: Any, query: Any) -> tuple[Any, Any]:
    """cos and sin of ``positions`` exactly as vLLM's ``MRotaryEmbedding.forward_native`` builds them.

    Args:
        rope: the ``MRotaryEmbedding`` (its ``cos_sin_cache`` ``[max_positions, rotary_dim]``,
            ``mrope_section`` ``[t, h, w]`` summing to ``rotary_dim // 2``, ``mrope_interleaved``).
        positions: ``[num_tokens]`` (text) or ``[3, num_tokens]`` (T/H/W) token positions (int64).
        query: the query (its dtype and device pick the cache's).

    Returns:
        ``(cos, sin)``, each ``[num_tokens, rotary_dim // 2]``.
    """
    import torch
    from vllm.model_executor.layers.rotary_embedding.mrope import apply_interleaved_rope

    cache = rope._match_cos_sin_cache_dtype(query)
    cos, sin = cache[positions].chunk(2, dim=-1)
    if positions.ndim == 2:
        section = rope.mrope_section
        if rope.mrope_interleaved:
            cos, sin = apply_interleaved_rope(cos, section), apply_interleaved_rope(sin, section)
        else:
            cos = torch.cat([m[i] for i, m in enumerate(cos.split(section, dim=-1))], dim=-1)
            sin = torch.cat([m[i] for i, m in enumerate(sin.split(section, dim=-1))], dim=-1)
    return cos, sin


def _rotate(rope: Any, x: Any, num_tokens: int, cos: Any, sin: Any) -> Any:
    """vLLM's rotation of the rotary part of ``x`` ``[num_tokens, heads * head_size]`` (as forward_native)."""
    import torch

    shape = x.shape
    x = x.view(num_tokens, -1, rope.head_size)
    rot = rope.apply_rotary_emb.forward_native(x[..., : rope.rotary_dim], cos, sin)
    return torch.cat((rot, x[..., rope.rotary_dim:]), dim=-1).reshape(shape)


def version_of(tensor: Any) -> int | None:
    """The tensor's version counter (bumped by every in-place update); ``None`` for an inference tensor
    (``torch.inference_mode``), which has none: the forward context and the tensor object then key alone."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def _same_forward(entry: tuple | None, ctx: Any, positions: Any) -> bool:
    """Whether the cache ``entry`` (``(ctx, positions, version, ...)``) was made in this forward."""
    return (entry is not None and entry[0] is ctx and entry[1] is positions
            and entry[2] == version_of(positions))


def cached_cos_sin(rope: Any, positions: Any, query: Any) -> tuple[Any, Any, bool]:
    """``(cos, sin, hit)``: the cos/sin of this forward, computed by its first layer and kept on ``rope``."""
    ctx = _forward_context()
    entry = rope.__dict__.get(CACHE_ATTR)
    if _same_forward(entry, ctx, positions) and entry[3] == query.dtype and entry[4] == query.device:
        return entry[5], entry[6], True
    cos, sin = cos_sin(rope, positions, query)
    rope.__dict__[CACHE_ATTR] = (ctx, positions, version_of(positions), query.dtype, query.device, cos, sin)
    return cos, sin, False


def _new_forward_seen(rope: Any, positions: Any) -> bool:
    """``off``: whether this layer call starts a forward (its key is kept, no cos/sin)."""
    ctx = _forward_context()
    if _same_forward(rope.__dict__.get(CACHE_ATTR), ctx, positions):
        return False
    rope.__dict__[CACHE_ATTR] = (ctx, positions, version_of(positions))
    return True


def _why_fallback(rope: Any, positions: Any, key: Any, offsets: Any) -> str | None:
    import torch

    if torch.compiler.is_compiling():
        return "compiling"
    if offsets is not None:
        return "offsets"
    if key is None:
        return "no_key"
    if positions.ndim == 2 and not getattr(rope, "mrope_section", None):
        return "no_mrope_section"
    return None


def make_forward_native(original: Callable) -> Callable:
    """The counting (``off``) or caching (``on``) ``forward_native`` around vLLM's ``original``."""

    def forward_native(self: Any, positions: Any, query: Any, key: Any = None, offsets: Any = None) -> Any:
        why = _why_fallback(self, positions, key, offsets)
        if why is not None:
            if why != "compiling":  # nothing with side effects while dynamo traces (fullgraph: no graph break)
                _fallback(why)
            return original(self, positions, query, key, offsets)
        STATS["layer_calls"] += 1
        if _STATE["mode"] == "off":
            if _new_forward_seen(self, positions):
                STATS["forwards"] += 1
                STATS["tokens"] += int(positions.shape[-1])
            _changed()
            return original(self, positions, query, key, offsets)
        cos, sin, hit = cached_cos_sin(self, positions, query)
        if hit:
            STATS["hits"] += 1
        else:
            STATS["forwards"] += 1
            STATS["tokens"] += int(positions.shape[-1])
        _changed()
        num_tokens = positions.shape[-1]
        return _rotate(self, query, num_tokens, cos, sin), _rotate(self, key, num_tokens, cos, sin)

    return forward_native


def _install(module: ModuleType) -> None:
    cls = getattr(module, TARGET_CLASS, None)
    rec: PatchRecord | None = _STATE["record"]
    if cls is None or "forward_native" not in cls.__dict__:
        if rec is not None:
            rec.status("error", f"{module.__name__} has no {TARGET_CLASS}.forward_native: not the vLLM 0.27 "
                                "layout the patch targets")
        return
    if replace(cls, "forward_native", make_forward_native, NAME) and rec is not None:
        what = ("cos/sin computed once per forward, reused by every layer (on)" if _STATE["mode"] == "on"
                else "vLLM's own per-layer cos/sin, counted (off)")
        rec.action(f"{module.__name__}.{TARGET_CLASS}.forward_native -> {what}")


def apply(mode: str | None, record: PatchRecord) -> None:
    """Arm the hook for ``on`` (cached) or ``off`` (vLLM's own, counted); see the module docstring.

    Raises:
        PatchRefused: an unknown mode.
    """
    mode = (mode or "on").lower()
    if mode not in ("on", "off"):
        raise PatchRefused(f"unknown mode {mode!r} (allowed: on, off)")
    _STATE.update(record=record, mode=mode)
    when_imported(TARGET_MODULE, _install)
    atexit.register(lambda: STATS["layer_calls"] and _write())
    if record["status"] == "pending":
        record.status("armed")
