"""One verdict per comparison after a sequential sweep: the stopping look's repeated confidence interval and decision,
for every place that shows it (the report, ``summary.md``, the console's closing line, MLflow).

A sweep run with ``--sequential`` (or ``--precision``/``--budget``) decides its main effects and step-time ``expect``
claims after every block (:class:`bench.planning.sequential.EffectsStopRule`) and records every look in
``sweep.json`` (key ``sequential``, :mod:`bench.execution.blocks`). Its error control (Lan-DeMets O'Brien-Fleming
spending over the looks, Bonferroni over the comparisons) holds for the *repeated* intervals only: a fixed-sample
t interval or Holm p value of the same comparison, computed as if the number of blocks had been fixed in advance,
does not hold its nominal level after a data-dependent stop (Jennison & Turnbull 2000, sec. 1.3 and ch. 9) and can
call "significant" what the stop rule left undecided. So after a sequential sweep every view takes the figures of
the decided comparisons from :func:`view` (the last recorded look, which is the stopping look of a stopped sweep;
a repeated interval is valid at any look, so an interrupted sweep shows its latest one), and the fixed-sample figures
that remain (interactions, cell-vs-all-off speedups, claims on other metrics) carry the label :data:`NOT_COVERED`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.planning.claims import claim_name
from bench.planning.sequential import Decision, Look

#: the label of a fixed-sample figure shown beside a sequential sweep's verdicts
NOT_COVERED = "fixed-sample, not covered by the sequential error control"
#: a claim decision's verdict -> the report's claim result
CLAIM_RESULT = {"met": "met", "not_met": "not met", "undecided": "undecided"}


@dataclass
class SequentialView:
    """The verdicts of a sequential sweep: its latest look's ``decisions`` (:class:`~bench.planning.sequential.
    Decision`: log-scale estimate, repeated interval ``lo``/``hi``, relative ``change*``, verdict), the look number
    ``look`` of ``max_looks``, whether the sweep ``stopped`` there, why (``reason``), the ``method`` and the error
    rate ``alpha`` of all decisions over all looks and the ``threshold`` (relative change that matters)."""

    look: int
    max_looks: int
    stopped: bool
    reason: str
    method: str
    alpha: float | None
    threshold: float | None
    decisions: list[Decision] = field(default_factory=list)

    def by_name(self) -> dict[str, Decision]:
        """Comparison name (a model term such as ``dynamic_bsz`` or ``task_queue=2``; ``expect: <claim>``) ->
        its decision."""
        return {d.name: d for d in self.decisions}

    def heading(self) -> str:
        """One clause: which look, of how many, why it is the last, and the method and error rate."""
        state = f"stopped: {self.reason}" if self.stopped else f"not stopped yet: {self.reason}"
        method = self.method or "repeated confidence intervals"
        return (f"look {self.look} of {self.max_looks} planned, {state}; {method}; error rate {self.alpha} over all "
                f"looks and {len(self.decisions)} comparison(s), change that matters +-{(self.threshold or 0):.0%}")

    def lines(self) -> list[str]:
        """One line per comparison (:meth:`bench.planning.sequential.Decision.text`)."""
        return [d.text() for d in self.decisions]

    def to_dict(self) -> dict[str, Any]:
        return {"look": self.look, "max_looks": self.max_looks, "stopped": self.stopped, "reason": self.reason,
                "method": self.method, "alpha": self.alpha, "threshold": self.threshold,
                "decisions": [d.to_dict() for d in self.decisions], "not_covered": NOT_COVERED}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SequentialView":
        """The inverse of :meth:`to_dict` (the report's ``sequential_verdicts``)."""
        return cls(**{k: v for k, v in data.items() if k not in ("decisions", "not_covered")},
                   decisions=[Decision(**d) for d in data.get("decisions") or []])


def view(meta: dict[str, Any] | None) -> SequentialView | None:
    """The verdicts of the sweep whose ``sweep.json`` content is ``meta``: its last recorded look
    (``sequential.looks[-1]``); ``None`` for a fixed design, before the first look, and for an interleaved gate
    sweep (``code_versions``: its looks are the gate's comparisons of code versions, shown by the gate)."""
    if (meta or {}).get("code_versions"):
        return None
    seq = (meta or {}).get("sequential") or {}
    looks = seq.get("looks") or []
    if not looks:
        return None
    last = Look.from_dict(looks[-1])
    return SequentialView(look=last.look, max_looks=int(seq.get("max_looks") or last.max_looks),
                          stopped=bool(last.stop), reason=last.reason, method=seq.get("method") or "",
                          alpha=seq.get("alpha"), threshold=seq.get("threshold"), decisions=list(last.decisions))


def verdict_line(v: SequentialView) -> str:
    """The console's closing line of a sequential sweep (the same figures as its report and summary)."""
    return f"verdicts of this sequential sweep ({v.heading()}): " + "; ".join(v.lines())


def summary_lines(v: SequentialView) -> list[str]:
    """The ``summary.md`` section of a sequential sweep's verdicts (markdown lines)."""
    out = ["", "## Sequential verdicts", "", f"{v.heading()[0].upper()}{v.heading()[1:]}.", "",
           "| comparison | verdict | step time change | repeated interval |", "|---|---|---|---|"]
    for d in v.decisions:
        out.append(f"| {d.name} | {d.verdict_text()} | {d.change:+.1%} | {d.interval_text()} |")
    return out + ["", "Every other interval and p value of this sweep (the report's cell speedups and interactions, "
                      f"claims on other metrics): {NOT_COVERED}."]


def _term_from(term: dict[str, Any], d: Decision, v: SequentialView) -> None:
    """Overwrite a report term's figures with its sequential decision (estimate, repeated interval, verdict)."""
    term.update(effect=d.estimate, se=d.se, ci_low=d.lo, ci_high=d.hi, change=d.change, change_ci_low=d.change_lo,
                change_ci_high=d.change_hi, p_value=None, p_adjusted=None, significant=None, verdict=d.verdict,
                matters=d.matters, covered=True, interval=f"repeated, look {v.look} of {v.max_looks}")


def apply_to_report(data: dict[str, Any], v: SequentialView) -> None:
    """Make the report's data (:func:`bench.commands.report.build`) show ``v``'s verdicts, in place: each main-effect
    term the stop rule decided gets the look's estimate, repeated interval and verdict and loses its fixed-sample
    p values (``p_value``, ``p_adjusted``, ``significant`` = ``None``); the other terms (interactions) keep their
    figures marked ``covered: False``; each step-time claim takes the look's result and interval;
    ``sequential_verdicts`` holds ``v`` (:meth:`SequentialView.to_dict`). Recompute the article rows from the terms
    afterwards (:func:`bench.report.tables.article_rows`)."""
    got = v.by_name()
    for t in ((data.get("effects") or {}).get("fit") or {}).get("terms") or []:
        if t["name"] in got:
            _term_from(t, got[t["name"]], v)
        else:
            t.update(verdict=None, covered=False, interval=NOT_COVERED)
    for e in data.get("expectations") or []:
        d = got.get(claim_name(e)) if e.get("metric", "step_time") == "step_time" else None
        if d is None:
            e.update(covered=False, interval=NOT_COVERED)
            continue
        e.update(result=CLAIM_RESULT.get(d.verdict, d.verdict), improvement=-d.change, p_value=None, covered=True,
                 improvement_ci=[None, None] if d.lo is None else [-d.change_hi, -d.change_lo],
                 reason=f"sequential look {v.look} of {v.max_looks}: repeated interval",
                 interval=f"repeated, look {v.look} of {v.max_looks}")
    data["sequential_verdicts"] = v.to_dict()


__all__ = ["CLAIM_RESULT", "NOT_COVERED", "SequentialView", "apply_to_report", "summary_lines",
           "verdict_line", "view"]
