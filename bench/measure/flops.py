"""Model FLOPs of a run's steps, from the model's config through verl's own FLOPs counter.

The counter is ``verl.utils.flops_counter`` (verl 0.9.1: ``ESTIMATE_FUNC`` maps a config's ``model_type`` to an
estimate function ``f(config, tokens_sum, batch_seqlens, delta_time) -> TFLOP/s``; ``FlopsCounter`` picks the
config it reads). Nothing of it is rewritten here: :func:`training_flops` calls the function verl's
``FlopsCounter.estimate_flops`` would call, with ``delta_time = 1`` s, so its result x 1e12 is FLOPs. It is not
called through ``estimate_flops`` itself because that also asks the torch device for its name (its peak table),
which in the harness process would initialise CUDA/NPU; the peaks live in :mod:`bench.records.mfu`.

What verl counts (``_estimate_qwen2_flops``, the dense Qwen2/Qwen3/Llama/Mistral estimate; the VL and MoE ones
have the same shape): ``6 * N_dense * tokens + 6 * sum(seqlen^2) * head_dim * heads * layers``, with ``N_dense``
the matmul parameters per token (q, k, v, o and the three SwiGLU matrices of each layer, plus the embedding and
the LM head, ``2 * vocab * hidden``) and the second term the causal attention scores and values. It is a
*training* step: forward (2 FLOPs per multiply-add) plus backward (twice the forward), Kaplan et al. 2020's
``6N``. verl <= 0.6 counted the attention term with 12 (non-causal); the installed verl decides.

What it leaves out (docs/mfu.md): the vision tower of a VL model unless ``images_seqlens`` is given (the
harness does not know the image token counts: never passed), norms, activations, rotary embeddings, softmax,
the optimizer step, recomputation under activation checkpointing, and padding tokens; a ``model_type`` verl
has no function for gives no FLOPs (never 0).

Sequence lengths: verl's step metrics give the batch's mean prompt and response lengths and the total token
count (``compute_data_metrics``, ``compute_throughout_metrics``), not each sequence's length, so
:func:`step_seqlens` takes ``n = total / (prompt mean + response mean)`` sequences of the mean length. The
dense term is exact; the attention term is a lower bound (Jensen: ``n * mean^2 <= sum(len^2)``), small for
short sequences.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: the file an engine writes into its run folder: the model's HF config (``PretrainedConfig.to_dict()``)
MODEL_CONFIG_FILE = "model_config.json"
#: the composed verl config key of the actor's model folder (its ``config.json`` is read when local)
VERL_MODEL_PATH = ("actor_rollout_ref", "model", "path")
#: what verl's counter leaves out, as the report says it
LEFT_OUT = ("vision tower (no image token counts passed)", "norms, activations, rotary, softmax",
            "optimizer step", "activation recomputation", "padding tokens")


def _as_config(config: Mapping[str, Any] | Any) -> Any:
    """A ``transformers.PretrainedConfig`` of a config dict (``model_type`` key required); others returned as is."""
    if not isinstance(config, Mapping):
        return config
    from transformers import AutoConfig

    rest = {k: v for k, v in config.items() if k != "model_type"}
    return AutoConfig.for_model(str(config["model_type"]), **rest)


def estimate_function(config: Mapping[str, Any] | Any) -> tuple[Any, Any] | None:
    """``(verl's estimate function, the config it reads)`` for a model config (dict or ``PretrainedConfig``), or
    ``None`` when verl has no function for its ``model_type`` (or verl is not installed)."""
    try:
        from verl.utils import flops_counter as fc
    except ImportError:
        return None
    cfg = _as_config(config)
    func = fc.ESTIMATE_FUNC.get(getattr(cfg, "model_type", None))
    if func is None:
        return None
    # FlopsCounter decides which config the function reads (verl 0.6: the text_config; 0.9.1: the whole config)
    return func, fc.FlopsCounter(cfg).config


def training_flops(config: Mapping[str, Any] | Any, batch_seqlens: Sequence[float]) -> float | None:
    """FLOPs of one training pass (forward + backward) over sequences of ``batch_seqlens`` tokens, by verl's counter.

    Args:
        config: the model's HF config (a dict with ``model_type``, or a ``PretrainedConfig``).
        batch_seqlens: valid tokens of each sequence (prompt + response).

    Returns FLOPs (not TFLOPs), or ``None`` when verl has no estimate for the model type. Formula and source:
    the module docstring (``verl.utils.flops_counter.ESTIMATE_FUNC[model_type]`` at ``delta_time=1``, x 1e12).
    """
    got = estimate_function(config)
    if got is None:
        return None
    func, cfg = got
    seqlens = [float(s) for s in batch_seqlens]
    return float(func(cfg, sum(seqlens), seqlens, 1.0)) * 1e12


def step_seqlens(row: Mapping[str, Any]) -> list[float] | None:
    """The sequence lengths of one step from its verl metrics: ``n`` sequences of the mean length, ``n =
    perf/total_num_tokens / (prompt_length/mean + response_length/mean)`` rounded (at least 1); ``None`` when a
    metric is missing. Tokens."""
    try:
        total = float(row["perf/total_num_tokens"])
        length = float(row["prompt_length/mean"]) + float(row["response_length/mean"])
    except (KeyError, TypeError, ValueError):
        return None
    if not (total > 0 and length > 0):
        return None
    n = max(1, round(total / length))
    return [total / n] * n


def flops_by_step(config: Mapping[str, Any] | Any, by_step: Mapping[int, Mapping[str, Any]]) -> dict[int, float]:
    """Training FLOPs of each step's batch (:func:`training_flops` of :func:`step_seqlens`); steps without the
    token metrics, or a model type verl does not count, left out."""
    out: dict[int, float] = {}
    if estimate_function(config) is None:
        return out
    for step, row in by_step.items():
        lens = step_seqlens(row)
        if lens is not None and (f := training_flops(config, lens)) is not None:
            out[int(step)] = f
    return out


def _dig(tree: Any, keys: Sequence[str]) -> Any:
    for k in keys:
        if not isinstance(tree, Mapping):
            return None
        tree = tree.get(k)
    return tree


def load_model_config(run_dir: str | Path, composed: Mapping[str, Any] | None = None) -> tuple[dict | None, str]:
    """The model's HF config for a finished run and where it came from.

    ``<run_dir>/model_config.json`` (:data:`MODEL_CONFIG_FILE`, written by the engine), else ``config.json`` of
    the composed verl config's ``actor_rollout_ref.model.path`` when that is a local folder. Returns
    ``(config dict or None, source text)``; never raises.
    """
    try:
        got = json.loads((Path(run_dir) / MODEL_CONFIG_FILE).read_text())
    except (OSError, ValueError):
        got = None
    if isinstance(got, dict) and got.get("model_type"):
        return got, MODEL_CONFIG_FILE
    model_path = _dig(composed, VERL_MODEL_PATH) if composed else None
    if isinstance(model_path, str):
        try:
            got = json.loads((Path(model_path) / "config.json").read_text())
        except (OSError, ValueError):
            return None, f"{'.'.join(VERL_MODEL_PATH)}={model_path}: no readable config.json"
        if isinstance(got, dict) and got.get("model_type"):
            return got, f"{'.'.join(VERL_MODEL_PATH)}/config.json"
    return None, "no model config found"
