"""``report.md``'s section "Where each optimization acts", rendered from the report's ``where`` section
(:func:`bench.report.where.where_section`) through :func:`bench.report.where.where_metrics`, so the printed
figures are the ones ``report.json`` and MLflow hold."""

from __future__ import annotations

from typing import Any

from bench.report.where import shown_rows, where_metrics


def fmt_ms(v: float | None) -> str:
    """A change in ms per step as printed (``+1.234``); ``-`` for none."""
    return "-" if v is None else f"{v:+.3f}"


def fmt_pct(v: float | None) -> str:
    """A change in % as printed (``+12.3 %``); ``-`` for none."""
    return "-" if v is None else f"{v:+.1f} %"


def where_lines(section: dict[str, Any] | None, level: float) -> list[str]:
    """The section's markdown lines (empty list when the report has no ``where`` section)."""
    if not section:
        return []
    L = ["## Where each optimization acts", ""]
    L.append(f"Each operator category's time ({section['unit']}, from the trace each run kept) through the report's "
             "run-level model (same runs, blocks and intervals as the step time, on the ms scale): change from the "
             "factor's low to its high level, % of the mean at the low level, sorted by size; *moves*: the "
             f"{level:.0%} interval excludes 0. Runs with a trace: {section['runs']}.")
    if section.get("platform_note"):
        L += ["", f"On this platform: {section['platform_note']}"]
    if section.get("note"):
        L += ["", section["note"]]
    if section.get("absent"):
        L += ["", f"No operator of these categories in any run's trace (0 ms, nothing to compare): "
                  f"{', '.join(section['absent'])}."]
    m = where_metrics(section)
    for term, rows in shown_rows(section).items():
        L += ["", f"### {term}", "",
              f"| category | low level ms | change ms [{level:.0%} CI] | change % [CI] | moves |",
              "|---|---|---|---|---|"]
        for r in rows:
            k = f"where.{term}.{r['series']}."
            ms = [m.get(k + f) for f in ("change_ms", "ci_low_ms", "ci_high_ms")]
            pc = [m.get(k + f) for f in ("change_pct", "ci_low_pct", "ci_high_pct")]
            base = "-" if r["base_ms"] is None else f"{r['base_ms']:.3f}"
            L.append(f"| {r['series']} | {base} | {fmt_ms(ms[0])} [{fmt_ms(ms[1])}, {fmt_ms(ms[2])}] | "
                     f"{fmt_pct(pc[0])} [{fmt_pct(pc[1])}, {fmt_pct(pc[2])}] | {'yes' if r['moves'] else 'no'} |")
    for d in section.get("diffs") or []:
        L += ["", f"Trace diff `{d['factor']}={d['level']}` cell vs the base cell (median over runs, ms per step; "
              "top by absolute change):", "", "| operator | status | base ms | cell ms | change ms |",
              "|---|---|---|---|---|"]
        for o in d["ops"]:
            ch = m.get(f"where.diff.{d['factor']}={d['level']}.{o['op'][:120]}.change_ms")
            L.append(f"| `{o['op'][:80]}` | {o['status']} | {o['base_ms']:.3f} | {o['cell_ms']:.3f} | {fmt_ms(ch)} |")
    return L + [""]
