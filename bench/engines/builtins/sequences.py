"""Sequences of prompt + response tokens and their packing into model inputs, shared by the built-in model's
warm start (:mod:`bench.engines.builtins.model`) and the embedded engine's rollout and training.

A sequence is ``prompt + response`` real tokens (no padding). A micro-batch is right-padded to its own
longest sequence, so the tokens fed to the model are ``rows x max_len`` ("padded tokens") of which
``sum(len)`` are real.
"""

from __future__ import annotations

from dataclasses import dataclass

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
