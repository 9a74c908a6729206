"""Factor ``rmsnorm_fused`` on the ``verl:cpu`` target: fused vs unfused RMSNorm in every process.

The article (3.1.1) swaps the RMSNorm forward of the actor and ref for one fused NPU operator
(``torch_npu.npu_rms_norm``). On a CPU the same contrast is torch's fused ``F.rms_norm`` against the
decomposed reference (``x.pow(2).mean(-1)``, ``rsqrt``, two multiplies: five kernels and two temporaries):

actor / ref (Hugging Face ``Qwen3RMSNorm`` and Qwen3-VL's text RMSNorm)
    ``on``: ``forward`` -> ``F.rms_norm`` in fp32 (one fused kernel), cast back, times the weight;
    ``off``: Hugging Face's own decomposed forward, left as it is.
rollout (vLLM's ``RMSNorm`` custom op)
    ``on``: vLLM's own ``rms_norm`` / ``fused_add_rms_norm`` operators, left as they are;
    ``off``: ``RMSNorm.forward_native`` replaced by the decomposed reference (the residual add done
    first, as vLLM's fused-add operator does). Note: with graph mode on, vLLM compiles the forward with
    inductor, which fuses the decomposed ops again — an interaction the sweep can measure.

Each process that imports one of the targets records what it did in its patch report, so a run shows
``applied`` in the actor/ref workers and in vLLM's processes.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from bench_patches import PatchRecord, PatchRefused, replace, when_imported

NAME = "cpu_rmsnorm"
HF_TARGETS = {
    "transformers.models.qwen3.modeling_qwen3": "Qwen3RMSNorm",
    "transformers.models.qwen3_vl.modeling_qwen3_vl": "Qwen3VLTextRMSNorm",
}
VLLM_TARGET = "vllm.model_executor.layers.layernorm"
_STATE: dict[str, Any] = {"record": None, "mode": "on"}


def fused_forward(self: Any, hidden_states: Any) -> Any:
    """``Qwen3RMSNorm.forward`` with one fused ``F.rms_norm`` (fp32 inside, as Hugging Face computes)."""
    import torch.nn.functional as F

    dtype = hidden_states.dtype
    eps = getattr(self, "variance_epsilon", getattr(self, "eps", 1e-6))
    out = F.rms_norm(hidden_states.float(), (hidden_states.shape[-1],), eps=eps)
    return self.weight * out.to(dtype)


def decomposed_rms_norm(x: Any, weight: Any, eps: float) -> Any:
    """The reference RMSNorm in separate torch ops: ``w * x / sqrt(mean(x^2) + eps)`` in fp32."""
    import torch

    dtype = x.dtype
    xf = x.float()
    var = xf.pow(2).mean(dim=-1, keepdim=True)
    out = (xf * torch.rsqrt(var + eps)).to(dtype)
    return out * weight if weight is not None else out


def _hf_hook(class_name: str):
    def install(module: ModuleType) -> None:
        cls = getattr(module, class_name, None)
        if cls is None:
            return
        if _STATE["mode"] == "off":
            _action(f"{module.__name__}.{class_name}.forward: Hugging Face's decomposed RMSNorm (off)")
        elif replace(cls, "forward", lambda original: _delegate(fused_forward), NAME):
            _action(f"{module.__name__}.{class_name}.forward -> torch.nn.functional.rms_norm (fused, on)")

    return install


def _delegate(fn: Any) -> Any:
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(self, *args, **kwargs)

    return forward


def _decomposed_native(original: Any) -> Any:
    def forward_native(self: Any, x: Any, residual: Any = None) -> Any:
        weight = self.weight.data if getattr(self, "has_weight", True) else None
        if residual is None:
            return decomposed_rms_norm(x, weight, self.variance_epsilon)
        residual = x + residual
        return decomposed_rms_norm(residual, weight, self.variance_epsilon), residual

    return forward_native


def _vllm_hook(module: ModuleType) -> None:
    cls = getattr(module, "RMSNorm", None)
    if cls is None:
        return
    if _STATE["mode"] == "on":
        _action(f"{module.__name__}.RMSNorm: vLLM's own rms_norm / fused_add_rms_norm operators (on)")
    elif replace(cls, "forward_native", _decomposed_native, NAME):
        cls.forward_cpu = cls.forward_native
        _action(f"{module.__name__}.RMSNorm.forward_native/forward_cpu -> decomposed torch ops (off)")


def _action(text: str) -> None:
    rec: PatchRecord | None = _STATE["record"]
    if rec is not None:
        rec.action(text)


def apply(mode: str | None, record: PatchRecord) -> None:
    """Arm the hooks for ``on`` (fused) or ``off`` (decomposed); see the module docstring."""
    mode = (mode or "on").lower()
    if mode not in ("on", "off"):
        raise PatchRefused(f"unknown mode {mode!r} (allowed: on, off)")
    _STATE.update(record=record, mode=mode)
    for module_name, class_name in HF_TARGETS.items():
        when_imported(module_name, _hf_hook(class_name))
    when_imported(VLLM_TARGET, _vllm_hook)
    if record["status"] == "pending":
        record.status("armed")
