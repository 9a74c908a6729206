"""The ``rmsnorm_fused`` optimization: swap the forward of the text RMSNorm modules for a fused kernel.

The article (section 3.1.1) patches Qwen3-VL's RMSNorm to ``torch_npu.npu_rms_norm`` on Ascend; verl does
the same in ``verl/models/transformers/npu_patch.py``. Here the fused forward is
``torch_npu.npu_rms_norm`` on NPU and ``torch.nn.functional.rms_norm`` (one ATen op instead of
pow/mean/rsqrt/mul) on CPU and CUDA. The swap is per module instance, so an eager copy of the same model
(e.g. the reference) can stay unpatched and the two can be compared.
"""

from __future__ import annotations

import types
from typing import Any

import torch

TEXT_RMSNORM_CLASSES = ("Qwen3VLTextRMSNorm", "Qwen3VLMoeTextRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")


def fused_forward_name(device: str) -> str:
    """Dotted name of the fused RMSNorm op used on ``device`` (``cpu`` | ``cuda`` | ``npu``)."""
    return "torch_npu.npu_rms_norm" if device == "npu" else "torch.nn.functional.rms_norm"


def _forward_torch(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` via ``torch.nn.functional.rms_norm``; output in the input dtype.

    Same math as ``Qwen3VLTextRMSNorm.forward`` (transformers ``modeling_qwen3_vl.py``), which computes
    in float32 and multiplies the weight after casting back; here the kernel runs in the input dtype.
    """
    return torch.nn.functional.rms_norm(
        hidden_states, (hidden_states.shape[-1],), self.weight.to(hidden_states.dtype), self.variance_epsilon
    )


def _forward_npu(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """``torch_npu.npu_rms_norm(x, weight, epsilon)[0]`` as in verl's ``npu_patch.py``."""
    import torch_npu

    return torch_npu.npu_rms_norm(hidden_states, self.weight, epsilon=self.variance_epsilon)[0]


def text_rmsnorm_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``(name, module)`` of the language-model RMSNorm modules (vision-tower modules excluded)."""
    return [
        (name, mod)
        for name, mod in model.named_modules()
        if type(mod).__name__ in TEXT_RMSNORM_CLASSES and ".visual." not in f".{name}."
    ]


def install_fused_rmsnorm(model: torch.nn.Module, device: str) -> dict[str, Any]:
    """Replace ``forward`` of every text RMSNorm module of ``model`` by the fused op for ``device``.

    Returns evidence: ``{"enabled": True, "forward": <op name>, "modules": <count>, "classes": [...]}``.

    Raises:
        RuntimeError: no text RMSNorm module found (the factor would silently do nothing).
    """
    mods = text_rmsnorm_modules(model)
    if not mods:
        raise RuntimeError(
            f"rmsnorm_fused: no module of class {'/'.join(TEXT_RMSNORM_CLASSES)} in {type(model).__name__}"
        )
    fwd = _forward_npu if device == "npu" else _forward_torch
    for _, mod in mods:
        mod.forward = types.MethodType(fwd, mod)
    return {
        "enabled": True,
        "forward": fused_forward_name(device),
        "modules": len(mods),
        "classes": sorted({type(m).__name__ for _, m in mods}),
    }


def describe_eager(model: torch.nn.Module) -> dict[str, Any]:
    """Evidence when the factor is off: the eager forward and how many modules use it."""
    mods = text_rmsnorm_modules(model)
    classes = sorted({type(m).__name__ for _, m in mods})
    return {
        "enabled": False,
        "forward": ", ".join(f"{c}.forward" for c in classes) or "none",
        "modules": len(mods),
        "classes": classes,
    }


def installed_forward(module: torch.nn.Module) -> str:
    """Which forward a module runs now: the fused op's name or ``<Class>.forward`` (eager)."""
    fwd = module.__dict__.get("forward")
    if fwd is not None and getattr(fwd, "__func__", None) is _forward_torch:
        return "torch.nn.functional.rms_norm"
    if fwd is not None and getattr(fwd, "__func__", None) is _forward_npu:
        return "torch_npu.npu_rms_norm"
    return f"{type(module).__name__}.forward"
