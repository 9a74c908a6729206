"""Optimization ``toy_opt``: an environment variable on engine ``toy`` (and, at no cost, on ``embedded``), its
evidence check and an article figure."""

from __future__ import annotations

from bench.spec.optimizations import Mechanism, Optimization


def toy_check(level: int, run) -> tuple[str, str]:
    """Evidence of ``toy_opt``: the mode its patch report names (``run``: a finished run,
    :class:`bench.measure.evidence.FinishedRun`)."""
    modes = [((r.get("patches") or {}).get("toy_opt") or {}).get("mode") for r in run.reports]
    if not modes:
        return "missing", "no toy_opt report"
    want = "on" if level else "off"
    return ("confirmed" if modes[0] == want else "contradicted"), f"toy_opt mode {modes[0]}"


OPTIMIZATION = Optimization(
    key="toy_opt", title="Toy optimization", section="9.9", acts="host", article_gain=0.5, article_level=1,
    mechanisms={"toy:*": {0: Mechanism(env={"TOY_OPT": "0"}), 1: Mechanism(env={"TOY_OPT": "1"})},
                "embedded:*": {0: Mechanism(env={"TOY_OPT": "0"}), 1: Mechanism(env={"TOY_OPT": "1"})}},
    evidence="TOY_OPT in the run's patch report", evidence_checks={"toy:*": f"{__name__}:toy_check"},
)
