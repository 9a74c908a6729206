"""Pieces the engines share (neutral ground, so no engine imports another): profiled steps, devices, cache.

Nothing here imports torch at module level: planning and ``--dry-run`` stay light.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from bench.spec.matrix import Base


def default_cache_dir() -> Path:
    """Where engines build and cache models and data: ``$BENCH_CACHE_DIR``, else ``<repo root>/.cache``
    (git-ignored); the ``{bench_cache}`` launch placeholder."""
    env = os.environ.get("BENCH_CACHE_DIR")
    return Path(env).expanduser() if env else Path(__file__).resolve().parents[2] / ".cache"


def default_profile_steps(base: Base) -> list[int]:
    """The steps run under the profiler: ``base.profile_steps``, or the last step only (so earlier measured
    steps are timed without profiler overhead); none when the last step is the only measured one (a step plan
    always leaves a timed step: the only measured step is timed, not profiled). Step numbers are 1-based."""
    if base.profile_steps is not None:
        return list(base.profile_steps)
    return [base.steps] if base.steps - base.warmup_steps >= 2 else []


def device_available(platform: str) -> bool:
    """Whether torch sees at least one device of ``platform`` (``cpu`` always; ``cuda``; ``npu`` via torch_npu).

    A broken driver stack counts as no device (never raises).
    """
    if platform == "cpu":
        return True
    try:
        import torch

        if platform == "cuda":
            return bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)
        if platform == "npu" and importlib.util.find_spec("torch_npu") is not None:
            import torch_npu  # noqa: F401

            return bool(torch.npu.is_available())
    except Exception:  # a broken driver stack counts as no device
        return False
    return False
