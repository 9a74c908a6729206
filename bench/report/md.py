"""Markdown pieces shared by the report (:mod:`bench.commands.report_markdown`) and the gate
(:mod:`bench.gate.markdown`): a signed percentage, an interval of two, a table's head."""

from __future__ import annotations


def pct(v: float | None) -> str:
    """A relative change as a signed percentage with one decimal (``+12.3%``); ``-`` when missing."""
    return "-" if v is None else f"{v:+.1%}"


def ci_pct(low: float | None, high: float | None) -> str:
    """An interval of two relative changes, ``[-1.0%, +3.2%]``; empty when its low end is missing."""
    return f"[{pct(low)}, {pct(high)}]" if low is not None else ""


def table_head(*columns: str) -> list[str]:
    """The first two lines of a markdown table: ``| a | b |`` and its ``|---|---|`` rule."""
    return ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
