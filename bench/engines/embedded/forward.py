"""Model forward on a micro-batch of variable-length sequences: packing and per-token log-probs.

A sequence is ``prompt + response`` real tokens (no padding). A micro-batch is right-padded to its own
longest sequence, so the tokens fed to the model are ``rows x max_len`` ("padded tokens") of which
``sum(len)`` are real. Log-probs come back in verl's response layout: ``(rows, R)`` with the log-prob
of response token ``t`` at column ``t`` and zeros past each response (``R`` = max response length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Sequence:
    """One rollout sequence.

    Attributes:
        input_ids: (L,) int64, prompt tokens then response tokens (response includes its EOS if any).
        prompt_len: number of prompt tokens P (>= 1).
        pixel_values: (patches, D) float tensor of the prompt's images, or ``None``.
        image_grid_thw: (images, 3) int64, or ``None``.
    """

    input_ids: torch.Tensor
    prompt_len: int
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None

    @property
    def response_len(self) -> int:
        return int(self.input_ids.shape[0]) - self.prompt_len


@dataclass(frozen=True)
class TokenIds:
    """Special token ids the engine needs: ``pad``, ``image`` (``<|image_pad|>``), ``eos`` (list), and
    ``vision``: the vision placeholders (image/video pad, vision start/end) a response must never contain —
    Qwen3-VL's forward counts every ``<|image_pad|>`` in the sequence as an image slot, so a sampled one
    fails the next training forward ("Image features and image tokens do not match")."""

    pad: int
    image: int | None
    eos: tuple[int, ...]
    vision: tuple[int, ...] = ()


def pack(seqs: list[Sequence], ids: TokenIds, device: torch.device | str) -> dict[str, torch.Tensor]:
    """Right-pad ``seqs`` to their longest length and build the model inputs.

    Returns ``input_ids`` and ``attention_mask`` of shape (rows, max_len), plus ``pixel_values``,
    ``image_grid_thw`` and ``mm_token_type_ids`` (0 text, 1 image; needed by Qwen3-VL to build MRoPE
    positions) when any sequence has images.
    """
    n, width = len(seqs), max(int(s.input_ids.shape[0]) for s in seqs)
    input_ids = torch.full((n, width), ids.pad, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    for i, s in enumerate(seqs):
        length = int(s.input_ids.shape[0])
        input_ids[i, :length] = s.input_ids
        attention_mask[i, :length] = 1
    out = {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device)}
    pix = [s.pixel_values for s in seqs if s.pixel_values is not None]
    if pix:
        out["pixel_values"] = torch.cat(pix).to(device)
        out["image_grid_thw"] = torch.cat([s.image_grid_thw for s in seqs if s.image_grid_thw is not None]).to(device)
        out["mm_token_type_ids"] = ((input_ids == ids.image) & attention_mask.bool()).long().to(device)
    return out


def response_log_probs(
    model: Any,
    seqs: list[Sequence],
    ids: TokenIds,
    response_width: int,
    temperature: float,
    device: torch.device | str,
) -> torch.Tensor:
    """Log-probabilities of each response token under ``model``: (rows, response_width) float32.

    As verl's actor (``verl/workers/engine/fsdp/transformer_impl.py``) the logits are divided by the
    rollout temperature before the log-softmax; the per-token log-prob is verl's
    ``verl.utils.torch_functional.logprobs_from_logits``. Gradients flow when called with grad enabled.
    """
    from verl.utils.torch_functional import logprobs_from_logits

    inputs = pack(seqs, ids, device)
    logits = model(**inputs, use_cache=False).logits  # (rows, L, V)
    logits = logits[:, :-1].float() / temperature
    token_lp = logprobs_from_logits(logits, inputs["input_ids"][:, 1:])  # (rows, L-1): lp of token t+1
    out = torch.zeros((len(seqs), response_width), dtype=token_lp.dtype, device=token_lp.device)
    for i, s in enumerate(seqs):
        r = s.response_len
        out[i, :r] = token_lp[i, s.prompt_len - 1 : s.prompt_len - 1 + r]
    return out
