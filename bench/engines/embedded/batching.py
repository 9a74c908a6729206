"""Micro-batching of a pass over sequences: fixed size, or dynamic by token budget (verl ``use_dynamic_bsz``).

- fixed: consecutive chunks of ``micro_batch_size`` sequences, as verl's ``DataProto.split``.
- dynamic: verl's ``verl.utils.seqlen_balancing.rearrange_micro_batches`` on the real sequence lengths
  (``attention_mask.sum(-1)``): the fewest micro-batches whose token sum stays within ``max_token_len``,
  balanced by verl's workload estimate (Karmarkar-Karp partitioning).

Each micro-batch is fed to the model right-padded to its own longest sequence, so it costs
``rows x max_len`` "padded tokens" of which ``sum(len)`` are real (:func:`stats`).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.core.errors import BenchError


class InfeasibleError(BenchError):
    """A setting that can never run (e.g. a token budget below the longest sequence): exit 2, kind infeasible."""

    kind = "infeasible"


@dataclass(frozen=True)
class PassStats:
    """Micro-batching of one pass: ``num_micro_batches``, ``padded_tokens`` (sum of rows x longest), ``real_tokens``."""

    num_micro_batches: int
    padded_tokens: int
    real_tokens: int


def fixed_micro_batches(n: int, micro_batch_size: int) -> list[list[int]]:
    """Indices ``0..n-1`` in consecutive chunks of ``micro_batch_size`` (last one may be shorter)."""
    return [list(range(i, min(i + micro_batch_size, n))) for i in range(0, n, micro_batch_size)]


def dynamic_micro_batches(seq_lens: list[int], max_token_len: int, setting: str = "max_token_len") -> list[list[int]]:
    """Partition sequences of lengths ``seq_lens`` (tokens) into micro-batches of at most ``max_token_len`` tokens.

    Calls verl's ``rearrange_micro_batches`` (``verl/utils/seqlen_balancing.py``) on a
    ``(n, max(seq_lens))`` right-padded attention mask; returns its index lists (micro-batch order as verl
    returns it, balanced workloads at both ends).

    Raises:
        InfeasibleError: ``max_token_len`` below the longest sequence (verl asserts the same); the message
            names the setting, its value and the sequence length.
    """
    import torch
    from tensordict import TensorDict
    from verl.utils.seqlen_balancing import rearrange_micro_batches

    longest = max(seq_lens)
    if max_token_len < longest:
        raise InfeasibleError(
            f"{setting}={max_token_len} is below the longest sequence ({longest} tokens): "
            "a sequence cannot be split across micro-batches"
        )
    n = len(seq_lens)
    lens = torch.tensor(seq_lens)
    mask = (torch.arange(longest).unsqueeze(0) < lens.unsqueeze(1)).long()
    batch = TensorDict({"input_ids": mask.clone(), "attention_mask": mask}, batch_size=[n])
    _, partitions = rearrange_micro_batches(batch, max_token_len=max_token_len)
    return [list(map(int, p)) for p in partitions]


def stats(partitions: list[list[int]], seq_lens: list[int]) -> PassStats:
    """Micro-batch count, padded tokens (each micro-batch padded to its longest sequence) and real tokens."""
    padded = sum(len(p) * max(seq_lens[i] for i in p) for p in partitions if p)
    real = sum(seq_lens[i] for p in partitions for i in p)
    return PassStats(len([p for p in partitions if p]), padded, real)
