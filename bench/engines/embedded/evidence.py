"""The evidence checks of the embedded engine: what its one process wrote into ``evidence.json``.

Each check is ``check(level, run) -> (verdict, detail)`` (:mod:`bench.measure.evidence`; ``run.own_evidence``
is the run's ``evidence.json``, written by :func:`bench.engines.embedded.run.run` after the last step). No
torch here: checks run in the harness after the run.
"""

from __future__ import annotations

from typing import Any

from bench.measure.evidence import EvidenceCheck, FinishedRun, env_check


def _section(run: FinishedRun, key: str) -> dict[str, Any] | None:
    got = run.own_evidence.get(key)
    return got if isinstance(got, dict) else None


def rmsnorm_fused(level: int, run: FinishedRun) -> tuple[str, str]:
    """The forward installed in the text RMSNorm modules at the end of the run: the fused op when on, each
    class's own ``forward`` when off."""
    ev = _section(run, "rmsnorm_fused")
    if ev is None:
        return "missing", "evidence.json has no rmsnorm_fused section (the run did not finish)"
    installed = [str(f) for f in ev.get("installed_forward") or []]
    if not installed:
        return "missing", f"no text RMSNorm module found ({ev.get('modules', 0)} modules)"
    fused = [f for f in installed if not f.endswith(".forward")]
    detail = f"{ev.get('modules', '?')} RMSNorm modules run {', '.join(installed)}"
    if level:
        return ("confirmed" if fused and len(fused) == len(installed) else "contradicted"), detail
    return ("confirmed" if not fused else "contradicted"), detail


def dynamic_bsz(level: int, run: FinishedRun) -> tuple[str, str]:
    """Token-budget micro-batches when on (the run's ``dynamic_bsz.enabled`` and its micro-batch counts)."""
    ev = _section(run, "dynamic_bsz")
    if ev is None:
        return "missing", "evidence.json has no dynamic_bsz section (the run did not finish)"
    counts = {p: sum(v) for p, v in (ev.get("micro_batches") or {}).items() if isinstance(v, list)}
    if not any(counts.values()):
        return "missing", "no micro-batch was counted"
    mode = "token-budget" if ev.get("enabled") else "fixed-size"
    detail = f"{mode} micro-batches: " + ", ".join(f"{p} {n}" for p, n in counts.items())
    return ("confirmed" if bool(ev.get("enabled")) == bool(level) else "contradicted"), detail


def task_queue(level: int, run: FinishedRun) -> tuple[str, str]:
    """``TASK_QUEUE_ENABLE`` as the run's process saw it (read by torch_npu's dispatcher on an NPU)."""
    return env_check("TASK_QUEUE_ENABLE", level, run)


#: the embedded engine's checks (entry points of ``grpo_bench.evidence_checks``)
RMSNORM_FUSED = EvidenceCheck("rmsnorm_fused", "embedded:*", rmsnorm_fused)
DYNAMIC_BSZ = EvidenceCheck("dynamic_bsz", "embedded:*", dynamic_bsz)
TASK_QUEUE_NPU = EvidenceCheck("task_queue", "embedded:npu", task_queue)
