"""What the verl engine tells about a run beyond its argv: why a factor would have no effect with the
installed verl / vllm-ascend (:func:`forward_prefetch_note`, :func:`not_read_notes`, :func:`mc2_note`). What
the patches did in a finished run is read by :func:`bench.measure.patch_reports.patch_evidence`.
"""

from __future__ import annotations

import re

from bench.engines.verl.config import VerlConfigError, installed_verl_version, read_release_file
from bench.spec.optimizations import not_read
from bench.spec.optimizations.versions import stack_versions

#: First vllm-ascend release with ``VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE`` (tags v0.10.0rc1 on; absent in v0.9.x);
#: the whole range, with the release that removed it (vllm-ascend PR 12119), is data of the ``mc2`` optimization
#: (:attr:`bench.spec.optimizations.base.Optimization.switches`).
MC2_MIN_VLLM_ASCEND = "0.10.0"


def _fsdp_strategy(overrides: list[str]) -> str:
    strategy = "fsdp"  # verl's default for actor and ref (0.6.x - 0.9.x)
    for o in overrides:
        key, _, value = o.partition("=")
        if re.fullmatch(r"\+*actor_rollout_ref\.(actor|ref)\.(fsdp_config\.)?strategy", key):
            strategy = value.strip().strip("'\"")
    return strategy


def fsdp2_honours_forward_prefetch(fsdp_utils_source: str | None) -> bool | None:
    """Whether verl's FSDP2 wrapper (``apply_fsdp2`` in ``verl/utils/fsdp_utils.py``) reads ``forward_prefetch``.

    FSDP1 takes ``forward_prefetch`` as a constructor argument in every verl release; FSDP2's
    ``fully_shard`` has no such argument, and verl ignored the setting there until it started calling
    ``set_modules_to_forward_prefetch`` (verl PR 6317). ``None`` when the source is unavailable.
    """
    if not fsdp_utils_source:
        return None
    m = re.search(r"^def apply_fsdp2\(.*?(?=^def |\Z)", fsdp_utils_source, re.S | re.M)
    if not m:
        return None
    return "forward_prefetch" in m.group(0)


def forward_prefetch_note(overrides: list[str], verl_version: str | None = None) -> str | None:
    """Why ``forward_prefetch`` would do nothing with this verl and these overrides, or ``None``."""
    if _fsdp_strategy(overrides) != "fsdp2":
        return None
    try:
        source = read_release_file("utils/fsdp_utils.py", verl_version)
        label = verl_version or installed_verl_version()
    except VerlConfigError:
        return ("forward_prefetch: strategy fsdp2, and verl is not installed here to check whether its FSDP2 "
                "wrapper honours fsdp_config.forward_prefetch (verl releases before PR 6317 ignore it)")
    honoured = fsdp2_honours_forward_prefetch(source)
    if honoured is False:
        return (f"forward_prefetch: verl {label} with strategy fsdp2 ignores fsdp_config.forward_prefetch "
                "(apply_fsdp2 never reads it; honoured from verl PR 6317 on, or with strategy fsdp): "
                "this factor has no effect in these runs")
    if honoured is None:
        return f"forward_prefetch: cannot tell whether verl {label}'s FSDP2 wrapper honours forward_prefetch"
    return None


def not_read_notes(levels: dict[str, int | None], platform: str,
                   versions: dict[str, str] | None = None) -> list[str]:
    """One line per factor of ``levels`` (not ``None``) whose switch the stack on ``platform`` does not read
    (:func:`bench.spec.optimizations.not_read`; ``versions`` default: the installed stack, which
    ``BENCH_STACK_VERSIONS`` can fake)."""
    if versions is None:
        versions = stack_versions(platform)
    return [n for k, v in levels.items() if v is not None and (n := not_read(k, "verl", platform, versions))]


def mc2_note(versions: dict[str, str] | None = None) -> str | None:
    """Why ``VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE`` would be ignored by the vllm-ascend on ``npu``
    (before v0.10.0rc1, or from vllm-ascend PR 12119 on), or ``None``: ``"mc2: not read by vllm-ascend X (...)"``."""
    notes = not_read_notes({"mc2": 1}, "npu", versions)
    return notes[0] if notes else None
