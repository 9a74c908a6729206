"""The matrix's ``expect`` claims as comparisons of a sequential sweep
(:class:`bench.planning.sequential.EffectsStopRule`).

A step-time claim (:class:`bench.spec.expect.Expect`) compares two cells: the cell with only ``factor`` changed from
the all-off cell against the all-off cell (``vs: all_off``; ``factor: all``: the all-on cell), or the all-on
cell against the all-on cell with ``factor`` off (``vs: all_on``). Its difference of mean log run values and
standard error come from the cell-means model with the block (:func:`bench.stats.effects.cell_means_residual`,
:func:`bench.stats.effects.run_contrast`), its repeated interval from
:func:`bench.planning.sequential.critical_value` (passed in by the stop rule). With the improvement
``1 - cell / reference``:

* ``met`` when the whole interval of the improvement lies within ``[at_least, at_most]`` (missing bound:
  unbounded);
* ``not_met`` when it lies entirely below ``at_least`` or entirely above ``at_most``;
* ``undecided`` otherwise.

Claims on other metrics are left to the gate and the report (not decided here).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, Callable, Sequence

from bench.spec.optimizations import REGISTRY


def _cells(obs: Sequence[dict[str, Any]], y: Sequence[float], blocks: Sequence[int]) -> dict[tuple, list]:
    out: dict[tuple, list] = {}
    for o, v, b in zip(obs, y, blocks):
        out.setdefault(tuple(sorted((k, v2) for k, v2 in o.items() if v2 is not None)), []).append((b, v))
    return out


def _pair(claim: dict[str, Any], levels: list[dict[str, Any]]) -> tuple[dict, dict] | None:
    """(cell levels, reference levels) of a claim among the observed cells' levels, or ``None``."""
    keys = sorted({k for lv in levels for k, v in lv.items() if v is not None})
    off = {k: REGISTRY[k].off if k in REGISTRY else 0 for k in keys}
    on = {k: max(lv[k] for lv in levels if lv.get(k) is not None) for k in keys}
    f = claim["factor"]
    if f == "all":
        return on, off
    if f not in keys:
        return None
    level = claim.get("level") if claim.get("level") is not None else on[f]
    if claim.get("vs", "all_off") == "all_off":
        return {**off, f: level}, off
    return on, {**on, f: off[f]}


def claim_name(claim: dict[str, Any]) -> str:
    """The name of a claim's decision: ``expect: <the claim's name>``, else ``expect: <factor> vs <all_off|all_on>``."""
    return "expect: " + (claim.get("name") or f"{claim['factor']} vs {claim.get('vs', 'all_off')}")


def claim_decisions(obs: Sequence[dict[str, Any]], y: Sequence[float], blocks: Sequence[int],
                    claims: Sequence[dict[str, Any]], *, quantile: Callable[[float], float | None], alpha: float
                    ) -> list[dict[str, Any]]:
    """Per step-time claim, the fields of a :class:`bench.planning.sequential.Decision` (``name``, ``verdict``
    ``met`` / ``not_met`` / ``undecided``, ``estimate``, ``se``, ``df``, ``lo``/``hi`` of the log ratio cell /
    reference, ``change*``); ``quantile(df)`` is the look's multiplier of the standard error
    (:func:`bench.planning.sequential.critical_value`); ``alpha`` is this claim's share (for the contrast)."""
    from bench.stats.effects import cell_means_residual, run_contrast  # deferred: bench.stats.effects loads scipy

    cells = _cells(obs, y, blocks)
    sd, df = cell_means_residual(list(cells.values()), blocked=len(set(blocks)) > 1) if cells else (None, 0)
    levels = [dict(k) for k in cells]
    out = []
    for c in claims:
        if c.get("metric", "step_time") != "step_time":
            continue
        name = claim_name(c)
        d = SimpleNamespace(name=name, verdict="undecided", estimate=0.0, se=None, df=float(df), lo=None, hi=None,
                            change=0.0, change_lo=None, change_hi=None)
        pair = _pair(c, levels)
        key = (lambda lv: tuple(sorted(lv.items()))) if pair else None
        if pair and key(pair[0]) in cells and key(pair[1]) in cells:
            con = run_contrast([v for _, v in cells[key(pair[1])]], [v for _, v in cells[key(pair[0])]], sd, df,
                               alpha=alpha)
            d.estimate, d.se, d.change = con.diff, con.se, math.expm1(con.diff)
            q = quantile(df) if con.se is not None else None
            if q is not None and math.isfinite(q):
                d.lo, d.hi = con.diff - q * con.se, con.diff + q * con.se
                d.change_lo, d.change_hi = math.expm1(min(d.lo, 50.0)), math.expm1(min(d.hi, 50.0))
                imp_lo, imp_hi = -d.change_hi, -d.change_lo  # improvement = 1 - cell / reference
                lo_b = c.get("at_least") if c.get("at_least") is not None else -math.inf
                hi_b = c.get("at_most") if c.get("at_most") is not None else math.inf
                if lo_b <= imp_lo and imp_hi <= hi_b:
                    d.verdict = "met"
                elif imp_hi < lo_b or imp_lo > hi_b:
                    d.verdict = "not_met"
        out.append(vars(d))
    return out
