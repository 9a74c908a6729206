"""The report's PNG plots (matplotlib, Agg backend): speedup, effects, phases, long tail, article gains, and a
baseline history's series with its change points (:func:`plot_history`, the ``history`` command).

Each ``plot_*`` function draws from the report's data (:func:`bench.report.tables.analyze`) into one file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

#: the stacked phases of the phase plot and their colours
PLOT_PHASES = ("gen", "old_log_prob", "ref", "update_actor", "other")
PHASE_COLORS = {"gen": "#4c72b0", "old_log_prob": "#dd8452", "ref": "#55a868", "update_actor": "#c44e52",
                "other": "#9d9d9d"}

def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_speedup(rows: list[dict[str, Any]], path: Path, level: float) -> None:
    plt = _plt()
    rs = [r for r in rows if r["speedup"] is not None]
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(rs) + 2), 3.8))
    x = np.arange(len(rs))
    sp = np.array([r["speedup"] for r in rs])
    lo = np.array([r["speedup_ci"][0] if r["speedup_ci"][0] is not None else r["speedup"] for r in rs])
    hi = np.array([r["speedup_ci"][1] if r["speedup_ci"][1] is not None else r["speedup"] for r in rs])
    ax.bar(x, sp, color=["#55a868" if s >= 1 else "#c44e52" for s in sp])
    ax.errorbar(x, sp, yerr=[sp - lo, hi - sp], fmt="none", ecolor="black", capsize=4)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(x, [r["cell"] for r in rs], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("speedup vs all-off (x)")
    ax.set_title(f"Speedup per cell ({level:.0%} CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_effects(eff: dict[str, Any], path: Path) -> None:
    plt = _plt()
    terms = (eff.get("fit") or {}).get("terms") or []
    fig, ax = plt.subplots(figsize=(6.5, max(2.5, 0.45 * len(terms) + 1.2)))
    y = np.arange(len(terms))[::-1]
    ch = np.array([100 * t["change"] for t in terms])
    lo = np.array([100 * t["change_ci_low"] if t["change_ci_low"] is not None else 100 * t["change"] for t in terms])
    hi = np.array([100 * t["change_ci_high"] if t["change_ci_high"] is not None else 100 * t["change"] for t in terms])
    ax.barh(y, ch, color=["#4c72b0" if t["kind"] != "interaction" else "#8172b2" for t in terms])
    ax.errorbar(ch, y, xerr=[ch - lo, hi - ch], fmt="none", ecolor="black", capsize=3)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(y, [t["name"] for t in terms], fontsize=8)
    ax.set_xlabel("step time change, low -> high level (%)  (negative = faster)")
    lvl = (eff.get("fit") or {}).get("level", 0.95)
    unit = (eff.get("fit") or {}).get("unit", "run")
    ax.set_title(f"Main effects and interactions\n(OLS on log {unit} step time, {lvl:.0%} CI)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_phases(rows: list[dict[str, Any]], path: Path) -> None:
    plt = _plt()
    rs = [r for r in rows if r["status"] == "ok" and r["step_time_s"]]
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(rs) + 2.5), 4.2))
    x = np.arange(len(rs))
    bottom = np.zeros(len(rs))
    for p in PLOT_PHASES:
        vals = []
        for r in rs:
            ph = r["phases"]
            if p == "other":
                v = sum(ph.get(q) or 0.0 for q in ("other", "reward", "adv"))
            else:
                v = ph.get(p) or 0.0
            vals.append(max(v, 0.0))
        ax.bar(x, vals, bottom=bottom, label=p, color=PHASE_COLORS[p])
        bottom += np.array(vals)
    for i, r in enumerate(rs):
        txt = []
        if r["rollout_share"] is not None:
            txt.append(f"roll {r['rollout_share']:.0%}")
        if r["free_ratio"] is not None:
            txt.append(f"Free {r['free_ratio']:.0%}")
        ax.text(i, bottom[i] * 1.01, "\n".join(txt), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [r["cell"] for r in rs], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("seconds per step (phase share x step time)")
    ax.set_ylim(0, max(bottom.max() if len(bottom) else 1, 1e-9) * 1.25)
    ax.set_title("Phase breakdown per cell (rollout share, Free ratio above)")
    ax.legend(fontsize=7, loc="upper left", ncols=5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_long_tail(rows: list[dict[str, Any]], path: Path) -> None:
    plt = _plt()
    rs = [r for r in rows if r["status"] == "ok" and r["response_length_max"] is not None]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(max(7, 1.2 * len(rs) + 3), 3.8))
    x = np.arange(len(rs))
    mean = np.array([r["response_length_mean"] or 0 for r in rs])
    mx = np.array([r["response_length_max"] or 0 for r in rs])
    mn = np.array([r["response_length_min"] if r["response_length_min"] is not None else m for r, m in zip(rs, mean)])
    a1.errorbar(x, mean, yerr=[mean - mn, mx - mean], fmt="o", capsize=5)
    a1.set_xticks(x, [r["cell"] for r in rs], rotation=30, ha="right", fontsize=8)
    a1.set_ylabel("response length (tokens)")
    a1.set_title("Response length: min / mean / max")
    waste = [100 * (r["long_tail_waste"] or 0) for r in rs]
    a2.bar(x, waste, color="#dd8452")
    a2.set_xticks(x, [r["cell"] for r in rs], rotation=30, ha="right", fontsize=8)
    a2.set_ylabel("% of decode slots idle (1 - mean/max)")
    a2.set_title("Long-tail waste")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_article(arts: list[dict[str, Any]], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    x = np.arange(len(arts))
    w = 0.28
    art = [100 * (a["article"] or 0) for a in arts]
    cell = [100 * a["ours_cell"] if a["ours_cell"] is not None else np.nan for a in arts]
    effv = [100 * a["ours_effect"] if a["ours_effect"] is not None else np.nan for a in arts]
    ax.bar(x - w, art, w, label="article (Ascend A2, Qwen3-VL-8B)", color="#9d9d9d")
    ax.bar(x, cell, w, label="ours: cell vs all-off", color="#4c72b0")
    ax.bar(x + w, effv, w, label="ours: OLS main effect", color="#55a868")
    for i, a in enumerate(arts):
        if a["ours_cell"] is None and a["ours_effect"] is None:
            ax.text(i + w / 2, 1, "not measured", ha="center", fontsize=7, rotation=90, va="bottom")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(x, [a.get("factor") or "end to end" for a in arts], fontsize=8)
    ax.set_ylabel("performance gain (%)")
    ax.set_title("Article's reported gains vs this sweep")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_history(values: list[float], positions: list[int], points: list[dict[str, Any]], path: Path, *, title: str,
                 ylabel: str, labels: list[str] | None = None) -> None:
    """One history series (``values`` as shown, at ``positions`` in the history) with its change points: a dashed
    line before each point's save and each segment's mean as a horizontal line (``points``: dicts with ``index``,
    the first value of the new level, and ``change``/``change_low``/``change_high`` as printed). ``labels``: a
    tick label per value (a short commit), shown when there are at most 30."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.28 * len(values) + 2), 3.8))
    x = np.arange(len(values))
    ax.plot(x, values, "o-", color="#4c72b0", ms=4, lw=1)
    cuts = [0, *sorted(p["index"] for p in points), len(values)]
    for a, b in zip(cuts, cuts[1:]):
        ax.hlines(float(np.mean(values[a:b])), a - 0.3, b - 0.7, color="#55a868", lw=2)
    for p in points:
        ax.axvline(p["index"] - 0.5, color="#c44e52", ls="--", lw=1.2)
        ax.annotate(f" {p['change']:+.1f} [{p['change_low']:+.1f}, {p['change_high']:+.1f}]", (p["index"] - 0.5, 0.97),
                    xycoords=("data", "axes fraction"), ha="left", va="top", fontsize=8, color="#c44e52")
    if labels is not None and len(values) <= 30:
        ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
    else:
        ax.set_xticks(x[:: max(1, len(x) // 15)], [str(positions[i]) for i in x[:: max(1, len(x) // 15)]])
        ax.set_xlabel("save (position in the baseline's history)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
