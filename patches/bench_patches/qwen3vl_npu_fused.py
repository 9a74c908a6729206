"""Article 3.1.1: NPU fused operators for the Qwen3-VL text model (actor and ref forward/backward).

Modes (``BENCH_PATCHES=qwen3vl_npu_fused:on`` / ``:off``):

- ``on``: in ``transformers.models.qwen3_vl.modeling_qwen3_vl``, ``Qwen3VLTextRMSNorm.forward`` ->
  ``torch_npu.npu_rms_norm``, ``Qwen3VLTextMLP.forward`` -> ``torch_npu.npu_swiglu`` on the concatenated
  gate/up projections, ``apply_rotary_pos_emb`` -> ``torch_npu.npu_rotary_mul``; in the MoE variant
  (``qwen3_vl_moe``) the RMSNorm and the rotary. Refused (with the reason) when ``torch_npu`` is not
  installed. Tensors that are not on an NPU take the eager path.
- ``off``: the eager forwards of transformers, *enforced*: verl applies its own NPU patch set to the
  Qwen3-VL classes (at ``import verl`` in 0.7.x, verl PR 4186; from the FSDP engine's
  ``apply_npu_fsdp_patches`` in 0.8.x, PR 6244, skipped only when ``use_liger`` is set, which skips every
  model's NPU patch; from the per-model ``NPU_PATCHES['qwen3_vl']`` in 0.9.x, PR 6777), so after each of
  verl's patch points the original forwards are put back, and the report says what was restored. Only
  the Qwen3-VL targets below are touched: verl's NPU patches of other models stay.

Evidence: besides each change, every process that imports a Qwen3-VL modeling module records the state of
its RMSNorm forward at that import and after each of verl's patch points, as an action
``transformers.models.<...>.Qwen3VLTextRMSNorm.forward: <state> (<when>)`` with state ``eager`` (transformers'
own forward), ``fused torch_npu.npu_rms_norm`` (this patch's) or ``other <module.qualname>``; the last one is
what the process ran (:func:`bench.measure.verl_evidence.rmsnorm_fused` reads it).

The originals are captured the moment the modeling module is imported (before anything can replace
them); if it was imported and replaced before this patch ran, a pristine copy of the module is executed
privately to recover them.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any, Callable

from bench_patches import PatchRecord, PatchRefused, when_imported

NAME = "qwen3vl_npu_fused"
QWEN3_VL = "transformers.models.qwen3_vl.modeling_qwen3_vl"
QWEN3_VL_MOE = "transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe"
#: Modules whose import (or whose ``apply_npu_patches``) may replace the Qwen3-VL forwards.
VERL_PATCHERS = ["verl.models.transformers.npu_patch"]
#: Device types on which the fused forwards call torch_npu (tests add "cpu" with a stand-in torch_npu).
FUSED_DEVICE_TYPES = {"npu"}

# (module, owner class or None for a module attribute, attribute, kind of fused replacement or None)
TARGETS: list[tuple[str, str | None, str, str | None]] = [
    (QWEN3_VL, "Qwen3VLTextRMSNorm", "forward", "rms_norm"),
    (QWEN3_VL, "Qwen3VLTextMLP", "forward", "swiglu"),
    (QWEN3_VL, None, "apply_rotary_pos_emb", "rotary"),
    (QWEN3_VL_MOE, "Qwen3VLMoeTextRMSNorm", "forward", "rms_norm"),
    (QWEN3_VL_MOE, None, "apply_rotary_pos_emb", "rotary"),
    (QWEN3_VL_MOE, None, "Qwen3VLMoeTextSparseMoeBlock", None),  # verl swaps the MoE block class: restore only
]
_OPS = {"rms_norm": "torch_npu.npu_rms_norm", "swiglu": "torch_npu.npu_swiglu", "rotary": "torch_npu.npu_rotary_mul"}

_ORIGINALS: dict[tuple[str, str | None, str], Any] = {}
_STATE: dict[str, Any] = {"mode": None, "record": None}


# ------------------------------------------------------------------------------------ fused forwards


def _torch_npu():
    import torch_npu  # noqa: PLC0415 - imported where first needed (NPU processes only)

    return torch_npu


def _make_rms_norm(original: Callable) -> Callable:
    def forward(self, hidden_states):
        if hidden_states.device.type not in FUSED_DEVICE_TYPES:
            return original(self, hidden_states)
        x = hidden_states if hidden_states.dtype == self.weight.dtype else hidden_states.to(self.weight.dtype)
        return _torch_npu().npu_rms_norm(x, self.weight, epsilon=self.variance_epsilon)[0]

    forward.__bench_patch__ = f"{NAME}:rms_norm"
    return forward


def _make_swiglu(original: Callable) -> Callable:
    def forward(self, x):
        act = getattr(getattr(self, "config", None), "hidden_act", "silu")
        if x.device.type not in FUSED_DEVICE_TYPES or act not in ("silu", "swish"):
            return original(self, x)
        import torch

        gate_up = torch.cat((self.gate_proj(x), self.up_proj(x)), dim=-1)
        return self.down_proj(_torch_npu().npu_swiglu(gate_up, dim=-1))

    forward.__bench_patch__ = f"{NAME}:swiglu"
    return forward


def _make_rotary(original: Callable) -> Callable:
    import inspect

    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None

    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        if q.device.type not in FUSED_DEVICE_TYPES or signature is None:
            return original(q, k, cos, sin, *args, **kwargs)
        bound = signature.bind(q, k, cos, sin, *args, **kwargs)
        unsqueeze_dim = bound.arguments.get("unsqueeze_dim", 1)
        npu = _torch_npu()
        cos = cos.unsqueeze(unsqueeze_dim)
        sin = sin.unsqueeze(unsqueeze_dim)
        return npu.npu_rotary_mul(q, cos, sin).to(q.dtype), npu.npu_rotary_mul(k, cos, sin).to(k.dtype)

    apply_rotary_pos_emb.__bench_patch__ = f"{NAME}:rotary"
    return apply_rotary_pos_emb


_FACTORIES = {"rms_norm": _make_rms_norm, "swiglu": _make_swiglu, "rotary": _make_rotary}


# ------------------------------------------------------------------------------- originals / install


def _get(module: ModuleType, owner: str | None, attr: str) -> Any:
    obj = getattr(module, owner) if owner else module
    return obj.__dict__.get(attr) if owner else getattr(obj, attr, None)


def _set(module: ModuleType, owner: str | None, attr: str, value: Any) -> None:
    setattr(getattr(module, owner) if owner else module, attr, value)


def _is_pristine(module_name: str, value: Any) -> bool:
    return value is not None and getattr(value, "__module__", None) == module_name and not hasattr(
        value, "__bench_patch__"
    )


def _pristine_copy(module_name: str) -> ModuleType | None:
    """Execute a private copy of the modeling module (not registered in ``sys.modules``)."""
    import importlib.machinery

    parent_name, _, _ = module_name.rpartition(".")
    parent = sys.modules.get(parent_name)
    # the path finder directly: the post-import hook must not fire for this private copy
    spec = importlib.machinery.PathFinder.find_spec(module_name, getattr(parent, "__path__", None))
    if spec is None or spec.loader is None:
        return None
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    return copy


def _capture(module: ModuleType) -> None:
    """Remember the eager objects of ``module`` (recovering them from a pristine copy if replaced)."""
    name = module.__name__
    fresh: ModuleType | None = None
    for mod_name, owner, attr, _ in TARGETS:
        if mod_name != name or (mod_name, owner, attr) in _ORIGINALS:
            continue
        if owner and not hasattr(module, owner):
            continue
        value = _get(module, owner, attr)
        if not _is_pristine(name, value):
            fresh = fresh or _pristine_copy(name)
            if fresh is None:
                continue
            value = _get(fresh, owner, attr)
            rec = _STATE["record"]
            if rec is not None:
                rec.action(f"recovered the eager {owner + '.' if owner else ''}{attr} from a pristine copy of {name}")
        if value is not None:
            _ORIGINALS[(mod_name, owner, attr)] = value


def _label(owner: str | None, attr: str) -> str:
    return f"{owner}.{attr}" if owner else attr


def enforce(reason: str) -> list[str]:
    """Put the wanted forwards (fused for ``on``, eager for ``off``) in every loaded target; returns changes."""
    mode = _STATE["mode"]
    rec: PatchRecord | None = _STATE["record"]
    changes = []
    for mod_name, owner, attr, kind in TARGETS:
        module = sys.modules.get(mod_name)
        original = _ORIGINALS.get((mod_name, owner, attr))
        if module is None or original is None or (owner and not hasattr(module, owner)):
            continue
        current = _get(module, owner, attr)
        if mode == "on" and kind is not None:
            if getattr(current, "__bench_patch__", None) == f"{NAME}:{kind}":
                continue
            _set(module, owner, attr, _FACTORIES[kind](original))
            changes.append(f"{mod_name.rsplit('.', 1)[-1]}.{_label(owner, attr)} -> {_OPS[kind]} ({reason})")
        else:
            if current is original:
                continue
            was = getattr(current, "__qualname__", repr(current))
            was_mod = getattr(current, "__module__", "?")
            _set(module, owner, attr, original)
            changes.append(
                f"restored eager {mod_name.rsplit('.', 1)[-1]}.{_label(owner, attr)} (was {was_mod}.{was}; {reason})"
            )
    if rec is not None:
        for change in changes:
            rec.action(change)
    return changes


#: the text between a RMSNorm target and its state in a state action (``<module>.<Class>.forward: <state> (...)``)
STATE_SEP = ".forward: "


def rms_norm_state(module: ModuleType, owner: str) -> str:
    """What ``owner.forward`` of ``module`` is now: ``eager`` (the captured transformers forward), ``fused
    torch_npu.npu_rms_norm`` (this patch's) or ``other <module.qualname>`` (someone else's, e.g. verl's)."""
    current = _get(module, owner, "forward")
    if getattr(current, "__bench_patch__", None) == f"{NAME}:rms_norm":
        return f"fused {_OPS['rms_norm']}"
    if current is not None and current is _ORIGINALS.get((module.__name__, owner, "forward")):
        return "eager"
    return f"other {getattr(current, '__module__', '?')}.{getattr(current, '__qualname__', repr(current))}"


def record_state(when: str) -> None:
    """Record, for every loaded Qwen3-VL modeling module, what its RMSNorm forward is now (an action
    ``<module>.<Class>.forward: <state> (<when>)``, see :func:`rms_norm_state`)."""
    rec: PatchRecord | None = _STATE["record"]
    if rec is None:
        return
    for mod_name, owner, _attr, kind in TARGETS:
        module = sys.modules.get(mod_name)
        if kind != "rms_norm" or module is None or owner is None or not hasattr(module, owner):
            continue
        rec.action(f"{mod_name}.{owner}{STATE_SEP}{rms_norm_state(module, owner)} ({when})")


def _on_modeling_import(module: ModuleType) -> None:
    _capture(module)
    when = f"at import of {module.__name__}"
    enforce(when)
    record_state(when)


def _wrap_patcher_function(module: ModuleType, attr: str) -> None:
    fn = getattr(module, attr, None)
    if fn is None or getattr(fn, "__bench_wrapped__", False):
        return

    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            when = f"after {module.__name__}.{attr}()"
            enforce(when)
            record_state(when)

    wrapper.__bench_wrapped__ = True
    wrapper.__wrapped__ = fn
    wrapper.__name__ = getattr(fn, "__name__", attr)
    setattr(module, attr, wrapper)


def _on_patcher_import(module: ModuleType) -> None:
    """verl's NPU patch module: undo what its import did, and re-enforce after each of its patch calls."""
    when = f"after import of {module.__name__}"
    if enforce(when):
        record_state(when)
    _wrap_patcher_function(module, "apply_npu_patches")
    table = getattr(module, "NPU_PATCHES", None)
    if isinstance(table, dict):
        for key, fn in list(table.items()):
            if str(key).startswith("qwen3_vl") and not getattr(fn, "__bench_wrapped__", False):
                def wrapped(_fn=fn, _key=key):
                    try:
                        return _fn()
                    finally:
                        when = f"after verl NPU_PATCHES[{_key!r}]"
                        enforce(when)
                        record_state(when)

                wrapped.__bench_wrapped__ = True
                table[key] = wrapped
    for attr in ("_patch_qwen3_vl", "_patch_qwen3_vl_moe"):
        _wrap_patcher_function(module, attr)


def watch_patcher(module_name: str) -> None:
    """Also treat ``module_name`` as a module that may replace the Qwen3-VL forwards (tests, forks)."""
    if module_name not in VERL_PATCHERS:
        VERL_PATCHERS.append(module_name)
    when_imported(module_name, _on_patcher_import)


def apply(mode: str | None, record: PatchRecord) -> None:
    """Arm the hooks for ``mode`` (``on`` or ``off``; default ``on``).

    Raises:
        PatchRefused: ``on`` without ``torch_npu``, or an unknown mode.
    """
    mode = (mode or "on").lower()
    if mode not in ("on", "off"):
        raise PatchRefused(f"unknown mode {mode!r} (allowed: on, off)")
    if mode == "on" and importlib.util.find_spec("torch_npu") is None:
        raise PatchRefused(
            "mode 'on' needs torch_npu (the Ascend PyTorch adapter) for npu_rms_norm / npu_swiglu / "
            f"npu_rotary_mul, and it is not installed for {sys.executable}; this process keeps the eager "
            "Qwen3-VL forwards (on CUDA the fused path is Liger: actor_rollout_ref.model.use_liger=true)"
        )
    _STATE.update(mode=mode, record=record)
    for module_name in (QWEN3_VL, QWEN3_VL_MOE):
        when_imported(module_name, _on_modeling_import)
    for module_name in list(VERL_PATCHERS):
        when_imported(module_name, _on_patcher_import)
    if record["status"] == "pending":
        record.status("armed")
