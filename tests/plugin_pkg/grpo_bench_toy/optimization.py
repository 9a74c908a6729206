"""Optimization ``toy_opt``: an environment variable on engine ``toy`` (and, at no cost, on ``embedded``) and an
article figure; its evidence check is an entry of the evidence-check registry (``evidence.py``)."""

from __future__ import annotations

from bench.spec.optimizations import Mechanism, Optimization

OPTIMIZATION = Optimization(
    key="toy_opt", title="Toy optimization", section="9.9", acts="host", article_gain=0.5, article_level=1,
    mechanisms={"toy:*": {0: Mechanism(env={"TOY_OPT": "0"}), 1: Mechanism(env={"TOY_OPT": "1"})},
                "embedded:*": {0: Mechanism(env={"TOY_OPT": "0"}), 1: Mechanism(env={"TOY_OPT": "1"})}},
    evidence="TOY_OPT in the run's patch report",
)
