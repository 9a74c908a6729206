"""Measurement plumbing for verl runs (not an optimization): evidence that each factor took effect.

A factor can be "on" in the overrides and do nothing (FSDP2 ignored ``forward_prefetch`` in verl releases
before PR 6317). This patch counts, in the processes where the work happens, what the factors change:

``micro_batches``
    every call of verl's ``prepare_micro_batches`` (``verl/workers/engine/utils.py``, the one place the
    engine workers split a batch for a forward/backward pass): calls, sequences and micro-batches, split
    by ``use_dynamic_bsz`` (token-budget micro-batches from ``rearrange_micro_batches``) or fixed size.
``forward_prefetch``
    calls of FSDP2's ``FSDPModule.set_modules_to_forward_prefetch`` (how ``apply_fsdp2`` in
    ``verl/utils/fsdp_utils.py`` honours ``fsdp_config.forward_prefetch``) and the modules given to it.
``vllm_config``
    in vLLM's processes, the engine configuration as vLLM resolved it: ``enforce_eager``, the compilation
    mode and the custom ops (graph mode = ``enforce_eager=false`` -> vLLM compiles with inductor).
``vllm_requests``
    in vLLM's engine core, every request ``EngineCore.add_request`` receives (``vllm/v1/engine/core.py``):
    requests, prompt tokens, multimodal items (``Request.mm_features``) and the placeholder tokens they
    fill (``mm_position.get_num_embeds()``), so a VL run shows that its images reached the rollout.
``vision_forwards``
    every forward of transformers' ``Qwen3VLVisionModel`` (the vision tower of the actor and ref, or of a
    Hugging Face rollout): calls, images (rows of ``grid_thw``) and patches, so a VL run shows that its
    images reached training too.

Counters live in the process's patch report (``counters``), rewritten at most once per second and at exit.
"""

from __future__ import annotations

import atexit
import threading
import time
from types import ModuleType
from typing import Any

from bench_patches import PatchRecord, PatchRefused, replace, when_imported

NAME = "verl_evidence"
_STATE: dict[str, Any] = {"record": None, "last_write": 0.0}
_LOCK = threading.Lock()


def _counters() -> dict[str, Any]:
    rec: PatchRecord | None = _STATE["record"]
    if rec is None:
        return {}
    return rec.setdefault("counters", {})


def _flush(force: bool = False) -> None:
    rec: PatchRecord | None = _STATE["record"]
    if rec is None:
        return
    now = time.monotonic()
    if force or now - _STATE["last_write"] >= 1.0:
        _STATE["last_write"] = now
        rec["status"] = "applied"
        rec._report.write()


def _flush_at_exit() -> None:
    if _counters():
        _flush(force=True)


def _bump(group: str, _force: bool = False, **values: int) -> None:
    """Add ``values`` to the counters of ``group``; ``_force`` writes the report now (for rare events in
    processes that are killed at the end of a run, e.g. vLLM's engine core, where no exit hook runs)."""
    with _LOCK:
        c = _counters().setdefault(group, {})
        for k, v in values.items():
            c[k] = c.get(k, 0) + int(v)
    _flush(_force)


def _install_micro_batches(module: ModuleType) -> None:
    def make(original: Any) -> Any:
        def prepare_micro_batches(data: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(data, *args, **kwargs)
            try:
                from verl.utils import tensordict_utils as tu

                dynamic = bool(tu.get_non_tensor_data(data=data, key="use_dynamic_bsz", default=True))
                _bump("dynamic_bsz" if dynamic else "fixed_bsz", calls=1, sequences=len(data),
                      micro_batches=len(out[0]))
            except Exception as exc:  # evidence must never break training
                _bump("errors", **{type(exc).__name__: 1})
            return out

        return prepare_micro_batches

    if replace(module, "prepare_micro_batches", make, NAME):
        _action(f"{module.__name__}.prepare_micro_batches counted (micro-batches per pass)")


def _install_prefetch(module: ModuleType) -> None:
    def make(original: Any) -> Any:
        def set_modules_to_forward_prefetch(self: Any, modules: Any) -> Any:
            _bump("forward_prefetch", calls=1, modules=len(list(modules)))
            return original(self, modules)

        return set_modules_to_forward_prefetch

    cls = getattr(module, "FSDPModule", None)
    if cls is not None and replace(cls, "set_modules_to_forward_prefetch", make, NAME):
        _action("FSDPModule.set_modules_to_forward_prefetch counted")


def _install_vllm_config(module: ModuleType) -> None:
    def make(original: Any) -> Any:
        def __post_init__(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(self, *args, **kwargs)
            try:
                comp = self.compilation_config
                mode = getattr(comp, "mode", getattr(comp, "level", None))
                info = {
                    "enforce_eager": bool(self.model_config.enforce_eager) if self.model_config else None,
                    "compilation_mode": str(getattr(mode, "name", mode)),
                    "custom_ops": list(getattr(comp, "custom_ops", []) or []),
                }
                with _LOCK:
                    _counters()["vllm_config"] = info
                _flush(force=True)
            except Exception as exc:
                _bump("errors", **{type(exc).__name__: 1})
            return out

        return __post_init__

    cls = getattr(module, "VllmConfig", None)
    if cls is not None:
        replace(cls, "__post_init__", make, NAME)


def _install_vllm_requests(module: ModuleType) -> None:
    def make(original: Any) -> Any:
        def add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                feats = list(getattr(request, "mm_features", None) or [])
                images = [f for f in feats if getattr(f, "modality", "") == "image"]
                _bump("vllm_requests", _force=True, requests=1,
                      prompt_tokens=int(getattr(request, "num_prompt_tokens", 0) or 0),
                      mm_items=len(feats), images=len(images),
                      image_tokens=sum(int(f.mm_position.get_num_embeds()) for f in images))
            except Exception as exc:  # evidence must never break the rollout
                _bump("errors", **{type(exc).__name__: 1})
            return original(self, request, *args, **kwargs)

        return add_request

    cls = getattr(module, "EngineCore", None)
    if cls is not None and replace(cls, "add_request", make, NAME):
        _action("vllm EngineCore.add_request counted (requests, prompt tokens, images, image tokens)")


def _install_vision(module: ModuleType) -> None:
    def make(original: Any) -> Any:
        def forward(self: Any, hidden_states: Any, grid_thw: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                _bump("vision_forwards", _force=True, calls=1, images=int(grid_thw.shape[0]),
                      patches=int(hidden_states.shape[0]))
            except Exception as exc:
                _bump("errors", **{type(exc).__name__: 1})
            return original(self, hidden_states, grid_thw, *args, **kwargs)

        return forward

    cls = getattr(module, "Qwen3VLVisionModel", None)
    if cls is not None and replace(cls, "forward", make, NAME):
        _action("Qwen3VLVisionModel.forward counted (vision tower calls, images, patches)")


def _action(text: str) -> None:
    rec: PatchRecord | None = _STATE["record"]
    if rec is not None:
        rec.action(text)


def apply(mode: str | None, record: PatchRecord) -> None:
    """Arm the counters (mode ``on``, the default, or ``off``)."""
    mode = (mode or "on").lower()
    if mode not in ("on", "off"):
        raise PatchRefused(f"unknown mode {mode!r} (allowed: on, off)")
    if mode == "off":
        record.status("armed", "off: no evidence counters")
        return
    _STATE["record"] = record
    when_imported("verl.workers.engine.utils", _install_micro_batches)
    when_imported("verl.utils.fsdp_utils", _install_prefetch)
    when_imported("vllm.config", _install_vllm_config)
    when_imported("vllm.v1.engine.core", _install_vllm_requests)
    when_imported("transformers.models.qwen3_vl.modeling_qwen3_vl", _install_vision)
    atexit.register(_flush_at_exit)
    if record["status"] == "pending":
        record.status("armed")
