"""Sequential decisions: decide each comparison after every block, stop the sweep when all are decided.

Method (:data:`METHOD`): **repeated confidence intervals** (Jennison & Turnbull 1989, *JRSS B* 51:305;
*Group Sequential Methods*, 2000, ch. 9) with **Lan-DeMets O'Brien-Fleming alpha spending** over the
planned maximum number of looks ``K`` (Lan & DeMets 1983, *Biometrika* 70:659, spending function
``alpha(t) = 2 - 2 Phi(z_{alpha/2} / sqrt(t))``). Look ``k`` (after ``k`` complete blocks) has the
information fraction ``t_k = k / K`` (equal blocks of runs); its two-sided boundary ``c_k`` is found by
the recursive numerical integration of Armitage, McPherson & Rowe (1969) (:func:`obf_boundaries`), so
that ``P(|Z_j| >= c_j for some j <= K) = alpha`` under a true value. The repeated interval at look ``k``
is ``estimate +- q_k * se`` with ``q_k`` the quantile of Student's t on the run-level fit's residual
degrees of freedom at the boundary's nominal level ``1 - Phi(c_k)`` (the "significance level"
translation of Jennison & Turnbull 2000, sec. 11.4, for a variance estimated at each look). The
intervals hold the true value at *every* look simultaneously with probability about ``1 - alpha``, so
any decision read off them, at any look, keeps its error rate (checked by simulation in
``benchmarks/bench_verdict.py`` and ``tests/planning/test_sequential.py``).

Why not a confidence sequence (Howard & Ramdas 2021; the mSPRT of Johari, Pekelis & Walsh 2017):
they are valid for unboundedly many looks, which costs width; a sweep plans its maximum of blocks, has few
runs per look and estimates its variance on 3-20 degrees of freedom, where a t-based sequence is very wide.
O'Brien-Fleming spending keeps almost all of ``alpha`` for the last looks (the final interval is barely wider
than the fixed design's), and a look where the budget ends the sweep spends the rest (:func:`obf_boundaries`).

Decision (:func:`decide`) for one comparison on the log scale (log of the step-time ratio; positive =
slower), interval ``[lo, hi]`` and threshold ``h = log(1 + threshold)``:

* ``slower`` when ``lo > 0``, ``faster`` when ``hi < 0``: the interval excludes 0, the direction is
  fixed (``matters`` says whether the whole interval is beyond ``+-h``: ``True``; inside: ``False``;
  straddling: ``None``);
* ``no_change`` ("no effect that matters") when ``-h < lo <= 0 <= hi < h``;
* ``undecided`` otherwise (or when no interval can be formed: no residual degree of freedom).

With ``m`` comparisons decided together each gets ``alpha / m`` (Bonferroni), so the chance that any
decision of a sweep is wrong stays below ``alpha``.

The sweep side: :class:`StopRule` (``after_block(records, look) -> Look``) is called by
:mod:`bench.execution.sweep` after each complete block; :class:`EffectsStopRule` decides the main effects of
the run-level model of :func:`bench.stats.effects.fit_effects`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from bench.planning.boundaries import critical_value, obf_boundaries, obf_spending
from bench.planning.claims import claim_decisions
from bench.records.snapshot import record_samples
from bench.stats.effects import fit_effects

METHOD = ("repeated confidence intervals, Lan-DeMets O'Brien-Fleming alpha spending over the planned looks by the "
          "information reached, t boundaries calibrated for the degrees of freedom available (Jennison & Turnbull "
          "2000, ch. 9; bench.planning.boundaries)")
VERDICTS = ("slower", "faster", "no_change", "undecided", "met", "not_met")  # met/not_met: expect claims


@dataclass
class Decision:
    """The decision on one comparison at one look (log scale: log of the step-time ratio, > 0 slower).

    ``lo``/``hi``: the repeated confidence interval (``None`` when no interval can be formed);
    ``change*``: the same as relative changes (``exp - 1``); ``threshold``: the relative change that
    matters (e.g. 0.05); ``alpha``: this comparison's share of the error rate; ``matters``: for
    ``slower``/``faster``, whether the whole interval is beyond the threshold (``None``: not known yet);
    ``final``: the look ended the sweep before its planned last look and spent all the alpha left.
    """

    name: str
    verdict: str
    estimate: float
    se: float | None
    df: float
    lo: float | None
    hi: float | None
    threshold: float
    alpha: float
    look: int
    max_looks: int
    method: str = METHOD
    matters: bool | None = None
    change: float = 0.0
    change_lo: float | None = None
    change_hi: float | None = None
    final: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def verdict_text(self) -> str:
        """The verdict in words: ``slower, beyond the threshold``, ``no change``, ``undecided``, ``not met``."""
        size = {True: ", beyond the threshold", False: ", within the threshold", None: ""}[self.matters]
        return self.verdict.replace("_", " ") + (size if self.verdict in ("slower", "faster") else "")

    def interval_text(self) -> str:
        """The repeated interval as relative changes, ``[+1.0%, +5.2%]`` (an end beyond +1000 % as ``>+1000%``)."""
        end = lambda v: ">+1000%" if v > 10 else f"{v:+.1%}"  # noqa: E731
        return "no interval" if self.lo is None else f"[{end(self.change_lo)}, {end(self.change_hi)}]"

    def text(self) -> str:
        """One line: ``name: verdict, +3.1 % [+1.0, +5.2] %`` (:meth:`verdict_text`, :meth:`interval_text`)."""
        return f"{self.name}: {self.verdict_text()} ({self.change:+.1%} {self.interval_text()})"


def decide(estimate: float, se: float | None, df: float, *, threshold: float, alpha: float, look: int,
           max_looks: int, name: str = "", final: bool = False, info: tuple[float, ...] | None = None,
           runs: int | None = None) -> Decision:
    """Decide one comparison at ``look`` (1-based) of ``max_looks`` from its log-scale ``estimate`` and
    standard error ``se`` on ``df`` degrees of freedom (rules in the module text).

    Args:
        threshold: the relative change that matters (0.05 = 5 %); compared on the log scale.
        alpha: the error rate of this comparison over all looks (two-sided).
        final: the budget ends the sweep at this look: it spends all the alpha left (:func:`critical_value`).
        info: information fractions of looks ``1 .. look`` (the share of the planned runs that had finished, and
            succeeded, by each look); ``None``: equal blocks. ``runs``: observations in the fit now. Both go to
            :func:`critical_value`, which calibrates the boundary for the degrees of freedom available.

    Raises:
        ValueError: ``threshold`` not in [0, 1).
    """
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold {threshold}: must be a fraction in [0, 1)")
    h = math.log1p(threshold)
    q = (critical_value(df, alpha=alpha, look=look, max_looks=max_looks, final=final,
                        info=None if info is None else tuple(info), runs=runs)
         if se is not None and se >= 0 else None)
    d = Decision(name=name, verdict="undecided", estimate=float(estimate), se=se, df=float(df), lo=None, hi=None,
                 threshold=threshold, alpha=alpha, look=look, max_looks=max_looks, change=math.expm1(estimate),
                 final=bool(final and look < max_looks))
    if q is None or not math.isfinite(q) or not math.isfinite(estimate):
        return d
    d.lo, d.hi = estimate - q * se, estimate + q * se
    d.change_lo, d.change_hi = math.expm1(max(min(d.lo, 50.0), -50.0)), math.expm1(max(min(d.hi, 50.0), -50.0))
    if d.lo > 0 or d.hi < 0:
        d.verdict = "slower" if d.lo > 0 else "faster"
        near, far = sorted((abs(d.lo), abs(d.hi)))
        d.matters = True if near > h else (False if far < h else None)
    elif -h < d.lo and d.hi < h:
        d.verdict = "no_change"
    return d


def blocks_to_decide(d: Decision, runs_now: int, runs_per_block: int, *, limit: int = 100) -> int | None:
    """How many more blocks would likely decide ``d`` if its estimate and residual SD stayed as they are:
    the standard error shrinks as ``sqrt(runs_now / runs)``, degrees of freedom grow by the block's runs
    minus one (its block term), and the interval uses the last planned look's quantile (a rough guide). ``0`` when
    decided; ``None`` when not within ``limit`` blocks or without a standard error."""
    if d.verdict != "undecided":
        return 0
    if d.se is None or d.se <= 0 or runs_now < 1:
        return None
    h = math.log1p(d.threshold)
    need = max(abs(d.estimate), h - abs(d.estimate))  # half-width that excludes 0 or fits inside +-h
    for m in range(1, limit + 1):
        runs = runs_now + m * runs_per_block
        df = d.df + m * (runs_per_block - 1)
        q = critical_value(df, alpha=d.alpha, look=d.max_looks, max_looks=d.max_looks)  # the plan's last look
        if q is not None and q * d.se * math.sqrt(runs_now / runs) < need:
            return m
    return None


@dataclass
class Look:
    """What a :class:`StopRule` says after a complete block: ``stop`` or go on, the per-comparison
    ``decisions``, ``line`` (one human sentence), ``more_blocks`` (comparison -> blocks that would
    likely decide it, ``None`` = not within 100). JSON-ready via :meth:`to_dict`."""

    look: int
    max_looks: int
    stop: bool
    reason: str
    decisions: list[Decision] = field(default_factory=list)
    line: str = ""
    more_blocks: dict[str, int | None] = field(default_factory=dict)
    runs: int = 0

    def undecided(self) -> list[str]:
        """Names of the comparisons not decided yet."""
        return [d.name for d in self.decisions if d.verdict == "undecided"]

    def to_dict(self) -> dict[str, Any]:
        return {"look": self.look, "max_looks": self.max_looks, "stop": self.stop, "reason": self.reason,
                "decisions": [d.to_dict() for d in self.decisions], "line": self.line,
                "more_blocks": self.more_blocks, "runs": self.runs}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Look":
        """The inverse of :meth:`to_dict`."""
        return cls(look=data["look"], max_looks=data["max_looks"], stop=data["stop"], reason=data["reason"],
                   decisions=[Decision(**d) for d in data.get("decisions") or []], line=data.get("line", ""),
                   more_blocks=data.get("more_blocks") or {}, runs=data.get("runs", 0))


class StopRule(Protocol):
    """Called by the sweep after each complete block (``look`` = 1-based number of complete blocks) with
    the run records finished so far (``record.json`` dicts, any status); returns a :class:`Look`."""

    max_looks: int

    def after_block(self, records: list[dict[str, Any]], look: int) -> Look: ...


def log_step_samples(rec: dict[str, Any], normalize: bool) -> list[float]:
    """Log timed-step times of one run record; with ``normalize``, each divided by the speed probe of its step
    (:mod:`bench.records.speed`: the machine's speed at that step; the constant reference cancels in every effect)."""
    got = record_samples(rec)
    x = [float(v) for v in got["step_time"]]
    if normalize:
        p = got["speed_probe"]
        return [math.log(a / b) for a, b in zip(x, p) if a > 0 and b and b > 0] if len(p) == len(x) else []
    return [math.log(a) for a in x if a > 0]


def probed(records: Sequence[dict[str, Any]]) -> bool:
    """Whether every ok record has a speed probe at each timed step (then values are speed-normalized, as the
    report's are)."""
    ok = [r for r in records if r.get("status") == "ok"]
    return bool(ok) and all(len(record_samples(r)["speed_probe"]) == len(record_samples(r)["step_time"]) > 0
                            for r in ok)


def run_observations(records: Sequence[dict[str, Any]]
                     ) -> tuple[list[dict[str, Any]], list[float], list[int], list[str]]:
    """Per ok record with timed steps: its factor levels, the log of its run value (median timed step,
    :func:`bench.records.figures.run_value`; speed-normalized when every run has the probe, :func:`probed`), its block
    (= repeat) and its node (Ray node id, ``"None"`` for a local run; a blocking factor of the model when the
    runs ran on several nodes, ``--parallel``)."""
    norm = probed(records)
    obs, y, blocks, nodes = [], [], [], []
    for r in records:
        if r.get("status") != "ok":
            continue
        logs = log_step_samples(r, norm)
        if not logs:
            continue
        obs.append(dict(r.get("levels") or {}))
        y.append(float(np.median(logs)))
        blocks.append(int(r.get("repeat", 0)))
        nodes.append(str((r.get("node") or {}).get("id")))
    return obs, y, blocks, nodes


def information(blocks: Sequence[int], look: int, per_block: int, max_looks: int) -> tuple[float, ...] | None:
    """Information fractions ``t_1 .. t_look`` from the runs that finished and succeeded: ``t_j`` = runs of blocks
    ``0 .. j - 1`` in the fit over the plan's ``per_block x max_looks`` runs, so a failed run lowers the
    information of its look and of every later one (Jennison & Turnbull 2000, sec. 7.2: error spending by the
    information actually reached). ``None`` when every block so far is complete (then ``t_j = j / max_looks``:
    the equal-blocks boundaries). At the last planned look all the alpha left is spent anyway.

    Args:
        blocks: the 0-based block (repeat) of each observation in the fit.
        per_block: runs a complete block has (> 0); ``max_looks``: the plan's maximum of blocks (> 0).
    """
    if per_block <= 0 or max_looks <= 0 or look < 1:
        return None
    counts = [sum(1 for b in blocks if b < j) for j in range(1, look + 1)]
    if all(c == per_block * j for j, c in zip(range(1, look + 1), counts)):
        return None
    total = per_block * max_looks
    return tuple(max(min(c / total, 1.0), 1e-6) for c in counts)


class EffectsStopRule:
    """Decide every main effect of the run-level model after each block; stop when all are decided or
    ``max_looks`` blocks ran.

    The model is :func:`bench.stats.effects.fit_effects` on the log run values with the block (and the
    Ray node, when the runs ran on several) as fixed factors and the two-factor interactions (as the report
    fits it); each main effect (each level
    of a factor with more than two levels) is decided by :func:`decide` at ``alpha / m`` for ``m``
    main-effect terms. Run values are speed-normalized when every run carries the speed probe (as in the
    report), else raw; the block factor absorbs drift between blocks either way.

    Args:
        max_looks: the planned maximum number of blocks (the plan's repeats).
        threshold: relative change that matters (0.05 = 5 %).
        alpha: error rate of all decisions of the sweep over all looks.
        interactions: fit two-factor interactions (as the report does).
        claims: the matrix's ``expect`` claims; those on step time are decided too
            (:func:`bench.planning.claims.claim_decisions`: met / not_met / undecided).
    """

    def __init__(self, max_looks: int, *, threshold: float = 0.05, alpha: float = 0.05, interactions: bool = True,
                 claims: Sequence[dict[str, Any]] = ()):
        self.max_looks, self.threshold, self.alpha, self.interactions = int(max_looks), threshold, alpha, interactions
        self.claims = [c for c in claims if c.get("metric", "step_time") == "step_time"]

    def decisions(self, records: Sequence[dict[str, Any]], look: int) -> tuple[list[Decision], int, int]:
        """The decisions at ``look``, the number of runs used and the runs per block."""
        obs, y, blocks, nodes = run_observations(records)
        factors = [f for f in sorted({k for o in obs for k in o})
                   if len({o.get(f) for o in obs if o.get(f) is not None}) > 1]
        if not factors:
            return [], len(y), 1
        obs = [{f: o.get(f) for f in factors} for o in obs]
        per_block = max(1, len({tuple(sorted(o.items())) for o in obs}))
        try:
            fit = fit_effects(obs, y, factors, alpha=self.alpha, interactions=self.interactions,
                              blocks=blocks if len(set(blocks)) > 1 else None, replicated=True, adjust=False,
                              nodes=nodes)
        except ValueError:
            fit = None
        names = [f for f in factors]
        out = []
        terms = {t.name: t for t in fit.terms} if fit is not None else {}
        mains = [t for t in terms.values() if t.kind in ("main", "level")] if terms else []
        m = max(1, (len(mains) or len(names)) + len(self.claims))
        info = information(blocks, look, per_block, self.max_looks)
        for t in mains:
            out.append(decide(t.effect, t.se, fit.df_resid, threshold=self.threshold, alpha=self.alpha / m,
                              look=look, max_looks=self.max_looks, name=t.name, info=info, runs=len(y)))
        if not mains:  # no fit yet (too few runs): every factor undecided
            out = [Decision(name=f, verdict="undecided", estimate=0.0, se=None, df=0.0, lo=None, hi=None,
                            threshold=self.threshold, alpha=self.alpha / m, look=look, max_looks=self.max_looks)
                   for f in names]
        if self.claims:
            a = self.alpha / m
            q = lambda df: critical_value(df, alpha=a, look=look, max_looks=self.max_looks,  # noqa: E731
                                          info=info if mains else None, runs=len(y))
            out += [Decision(**f, threshold=self.threshold, alpha=a, look=look, max_looks=self.max_looks)
                    for f in claim_decisions(obs, y, blocks, self.claims, quantile=q, alpha=a)]
        return out, len(y), per_block

    def after_block(self, records: list[dict[str, Any]], look: int) -> Look:
        """See :class:`StopRule`."""
        ds, runs, per_block = self.decisions(records, look)
        more = {d.name: blocks_to_decide(d, runs, per_block) for d in ds}
        open_ = [d.name for d in ds if d.verdict == "undecided"]
        if ds and not open_:
            stop, reason = True, f"every comparison decided after {look} block(s)"
        elif look >= self.max_looks:
            stop, reason = True, f"planned maximum of {self.max_looks} block(s) reached"
        else:
            stop, reason = False, f"{len(open_)} of {len(ds)} comparison(s) undecided"
        line = f"look {look}/{self.max_looks}: " + "; ".join(d.text() for d in ds)
        if stop and open_:
            line += ". Undecided: " + ", ".join(
                f"{n} (about {more[n]} more block(s))" if more[n] else f"{n} (not within 100 more blocks)"
                for n in open_)
        return Look(look=look, max_looks=self.max_looks, stop=stop, reason=reason, decisions=ds, line=line,
                    more_blocks=more, runs=runs)


__all__ = ["METHOD", "VERDICTS", "Decision", "EffectsStopRule", "Look", "StopRule", "blocks_to_decide",
           "critical_value", "decide", "information", "obf_boundaries", "obf_spending", "log_step_samples", "probed",
           "run_observations"]
