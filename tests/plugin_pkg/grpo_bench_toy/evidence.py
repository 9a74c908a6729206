"""The evidence check of ``toy_opt`` on engine ``toy``: an entry of the evidence-check registry
(:data:`bench.measure.evidence.CHECKS`, group ``grpo_bench.evidence_checks``)."""

from __future__ import annotations

from bench.measure.evidence import EvidenceCheck, FinishedRun


def toy_check(level: int, run: FinishedRun) -> tuple[str, str]:
    """Evidence of ``toy_opt``: the mode its patch report names (``run``: a finished run)."""
    modes = [((r.get("patches") or {}).get("toy_opt") or {}).get("mode") for r in run.reports]
    if not modes:
        return "missing", "no toy_opt report"
    want = "on" if level else "off"
    return ("confirmed" if modes[0] == want else "contradicted"), f"toy_opt mode {modes[0]}"


TOY_OPT = EvidenceCheck("toy_opt", "toy:*", toy_check)
