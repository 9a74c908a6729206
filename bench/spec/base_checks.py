"""Checks of the matrix ``base`` block that are not ranges: batch sizes that divide as verl requires, the form
of ``env`` and ``overrides`` (used by :class:`bench.spec.matrix.Base`; each raises ``ValueError`` naming the key,
the bad value and what is allowed)."""

from __future__ import annotations

import re
from typing import Any

#: an environment variable name (POSIX): what ``base.env`` keys may be
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_batch_sizes(base: Any) -> None:
    """Batch-size divisibility as verl requires it (``ray_trainer`` and the FSDP workers' asserts).

    With world = ``n_gpus_per_node * nnodes``: ``train_batch_size`` is a multiple of
    ``ppo_mini_batch_size``; ``train_batch_size * n`` and ``ppo_mini_batch_size * n`` are multiples of
    the world size; the per-GPU mini-batch ``ppo_mini_batch_size * n / world`` is a multiple of
    ``micro_batch_size_per_gpu``.

    Raises:
        ValueError: naming the keys and values that do not divide.
    """
    world = base.n_gpus_per_node * base.nnodes
    if base.train_batch_size % base.ppo_mini_batch_size:
        raise ValueError(f"ppo_mini_batch_size ({base.ppo_mini_batch_size}) must divide train_batch_size "
                         f"({base.train_batch_size})")
    if (base.train_batch_size * base.n) % world:
        raise ValueError(f"train_batch_size * n ({base.train_batch_size * base.n}) must be a multiple of "
                         f"n_gpus_per_node * nnodes ({world})")
    mini = base.ppo_mini_batch_size * base.n
    if mini % world:
        raise ValueError(f"ppo_mini_batch_size * n ({mini}) must be a multiple of n_gpus_per_node * nnodes ({world})")
    if (mini // world) % base.micro_batch_size_per_gpu:
        raise ValueError(f"micro_batch_size_per_gpu ({base.micro_batch_size_per_gpu}) must divide the per-GPU "
                         f"mini-batch ppo_mini_batch_size * n / (n_gpus_per_node * nnodes) ({mini // world})")


def check_env(env: dict[str, str]) -> dict[str, str]:
    """``base.env``: keys are variable names (:data:`ENV_NAME`), values hold no NUL byte (``exec`` refuses one).

    Raises:
        ValueError: naming the key and what is allowed.
    """
    for key, value in env.items():
        if not ENV_NAME.fullmatch(key):
            raise ValueError(f"{key!r} is not a variable name (allowed: letters, digits and '_', not starting with "
                             "a digit)")
        if "\x00" in value:
            raise ValueError(f"{key}: holds a NUL byte (not allowed in an environment variable)")
    return env


def check_override_form(overrides: list[str]) -> list[str]:
    """``base.overrides``: each entry has Hydra's form ``KEY=VALUE``, ``+KEY=VALUE``, ``++KEY=VALUE`` or ``~KEY``
    on one line (the verl engine checks keys and values against verl's config at launch).

    Raises:
        ValueError: naming the entry and the allowed forms.
    """
    for i, ov in enumerate(overrides):
        key = ov.split("=", 1)[0].strip().lstrip("+~")
        ctrl = next((c for c in ov if ord(c) < 32 or ord(c) == 127), None)
        if ctrl is not None:  # a carriage return or tab would reach verl's command line as part of a value
            raise ValueError(f"entry {i}: {ov!r} holds the control character {ctrl!r} (allowed: one line of "
                             "printable text, KEY=VALUE, +KEY=VALUE, ~KEY)")
        if not key or ("=" not in ov and not ov.startswith("~")):
            raise ValueError(f"entry {i}: {ov!r} is not a Hydra override (allowed: KEY=VALUE, +KEY=VALUE, ~KEY)")
    return overrides
