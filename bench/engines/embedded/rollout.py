"""Rollout: sample ``n`` responses per prompt with Hugging Face ``generate`` (the embedded stand-in for vLLM).

Prompts are repeated ``n`` times interleaved (``p0 p0 p0 p0 p1 ...``, verl's ``DataProto.repeat(interleave=True)``),
left-padded to the longest prompt of the batch and sampled with ``temperature``, ``top_p=1`` and no top-k
(verl's rollout defaults), at most ``max_response_length`` new tokens. The response mask is verl's
``verl.utils.torch_functional.get_response_mask``: tokens up to and including the first EOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from bench.engines.builtins.data import EncodedPrompt
from bench.engines.builtins.sequences import Sequence, TokenIds


@dataclass
class Rollout:
    """The sampled batch in verl's tensor layout plus the packed sequences.

    Attributes:
        prompts: (N, P) int64, left-padded to ``max_prompt_length`` P (verl's ``prompts``).
        responses: (N, R) int64, right-padded to ``max_response_length`` R (verl's ``responses``).
        attention_mask: (N, P + R) int64 over ``[prompts, responses]``.
        response_mask: (N, R) int64, 1 up to and including the first EOS.
        seqs: the N packed sequences (prompt + response real tokens) with their images.
        prompt_index: (N,) which prompt of the batch each row samples (row // n).
    """

    prompts: torch.Tensor
    responses: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    seqs: list[Sequence]
    prompt_index: list[int]


def generate(
    model: Any,
    prompts: list[EncodedPrompt],
    n: int,
    ids: TokenIds,
    max_prompt_length: int,
    max_response_length: int,
    temperature: float,
    device: str,
) -> Rollout:
    """Sample ``n`` responses for each of ``prompts``; returns ``N = len(prompts) * n`` rows.

    Raises:
        ValueError: a prompt longer than ``max_prompt_length`` (callers check this up front).
    """
    from verl.utils.torch_functional import get_response_mask

    rows = [i for i in range(len(prompts)) for _ in range(n)]
    plens = [int(prompts[i].input_ids.shape[0]) for i in rows]
    if max(plens) > max_prompt_length:
        raise ValueError(f"prompt of {max(plens)} tokens exceeds max_prompt_length={max_prompt_length}")
    width, num = max(plens), len(rows)
    input_ids = torch.full((num, width), ids.pad, dtype=torch.long)
    attn = torch.zeros((num, width), dtype=torch.long)
    for r, i in enumerate(rows):
        input_ids[r, width - plens[r] :] = prompts[i].input_ids
        attn[r, width - plens[r] :] = 1
    kwargs: dict[str, Any] = {"input_ids": input_ids.to(device), "attention_mask": attn.to(device)}
    pix = [prompts[i].pixel_values for i in rows if prompts[i].pixel_values is not None]
    if pix:
        kwargs["pixel_values"] = torch.cat(pix).to(device)
        kwargs["image_grid_thw"] = torch.cat(
            [prompts[i].image_grid_thw for i in rows if prompts[i].image_grid_thw is not None]
        ).to(device)
        kwargs["mm_token_type_ids"] = ((input_ids == ids.image) & attn.bool()).long().to(device)
    with torch.no_grad():
        out = model.generate(
            **kwargs,
            do_sample=True,
            temperature=temperature,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_response_length,
            eos_token_id=list(ids.eos),
            pad_token_id=ids.pad,
            suppress_tokens=list(ids.vision) or None,  # a sampled <|image_pad|> breaks the next forward
        )
    gen = out[:, width:].cpu()
    responses = torch.full((num, max_response_length), ids.pad, dtype=torch.long)
    responses[:, : gen.shape[1]] = gen
    response_mask = get_response_mask(responses, eos_token=list(ids.eos), dtype=torch.long)
    # A row can only be shorter than R when it ended with EOS, so padding never enters the mask.
    prompts_t = torch.full((num, max_prompt_length), ids.pad, dtype=torch.long)
    prompt_mask = torch.zeros((num, max_prompt_length), dtype=torch.long)
    seqs = []
    for r, i in enumerate(rows):
        p, rl = plens[r], int(response_mask[r].sum())
        prompts_t[r, max_prompt_length - p :] = prompts[i].input_ids
        prompt_mask[r, max_prompt_length - p :] = 1
        seqs.append(
            Sequence(
                torch.cat([prompts[i].input_ids, responses[r, :rl]]),
                p,
                prompts[i].pixel_values,
                prompts[i].image_grid_thw,
            )
        )
    return Rollout(
        prompts=prompts_t,
        responses=responses,
        attention_mask=torch.cat([prompt_mask, response_mask], dim=1),
        response_mask=response_mask,
        seqs=seqs,
        prompt_index=rows,
    )
