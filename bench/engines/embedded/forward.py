"""Model forward on a micro-batch of variable-length sequences (packed by
:func:`bench.engines.builtins.sequences.pack`): per-token log-probs. Log-probs come back in verl's response
layout: ``(rows, R)`` with the log-prob of response token ``t`` at column ``t`` and zeros past each response
(``R`` = max response length).
"""

from __future__ import annotations

from typing import Any

import torch

from bench.engines.builtins.sequences import Sequence, TokenIds, pack


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
