"""A stored baseline's history as series, and their change points: what ``run_bench.py history NAME`` computes.

``baseline save SWEEP --name NAME --force`` appends one entry per saved sweep to the baseline's ``history``
(:func:`bench.gate.baseline.history_entry`, the last :data:`bench.gate.baseline.HISTORY_KEEP`). Each entry holds, per
cell, the log step time (every entry) and, since issue 44, the cell's figures (:func:`cell_figures`), the sweep's
commit, matrix, the saving machine (:func:`machine_of`) and the software stack (:func:`stack_of`).

**A series** (:func:`build_series`) is one metric of one cell over the saves of one (matrix, machine, stack): a
series never mixes machines or stacks. A history whose saves come from several is split (and the note says so in
one line); asked for one series (``--cell`` and one ``--metric``) it is refused (:class:`BenchError`) unless
``--machine``/``--stack`` pick one. An entry saved before these fields existed has machine, stack and matrix
unknown (``None``) and forms a group of its own.

**Change points** (:func:`analyse`): :func:`bench.stats.changepoints.detect` on each series, each at
``alpha / m`` over the ``m`` series of the call (Bonferroni; ``m`` is fixed by the cells, metrics and groups before
any value is read), so the chance that a history without any change shows one anywhere is at most ``alpha``. A
series shorter than :func:`bench.stats.changepoints.min_saves` (``alpha / m``) is not judged (listed as short).

Metrics (:data:`METRICS`): ``step_time`` (log of the cell's value, the geometric mean of its runs' median timed
step: a shift is shown as a percent change), ``step_time_normalized`` (the same, speed-probe normalized),
``throughput`` (log, percent) and ``rollout_share``, ``free_ratio`` (means of the runs' medians; a shift in
percentage points).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.core.errors import BenchError, InputError, did_you_mean

#: metric -> (scale, unit of a shift): ``log`` (shift in %), ``share`` (shift in percentage points)
METRICS: dict[str, str] = {"step_time": "log", "step_time_normalized": "log", "throughput": "log",
                           "rollout_share": "share", "free_ratio": "share"}
#: the recorded versions (:func:`bench.core.metadata.versions`) that are the harness's own tools, not the stack
#: that trains: every other recorded version (verl, torch, transformers, vLLM, torch_npu, vllm-ascend, CANN) makes
#: a save's stack until a stack names itself (``stack`` a string)
HARNESS_PACKAGES = ("mlflow", "optuna")
#: the machine fields that identify a machine (of :func:`bench.core.metadata.machine`)
MACHINE_KEYS = ("hostname", "arch", "cpu", "cpu_count")


def machine_of(machine: dict[str, Any] | None) -> dict[str, Any] | None:
    """The identifying part of a machine description (:data:`MACHINE_KEYS`), ``None`` when unknown."""
    if not isinstance(machine, dict):
        return None
    out = {k: machine.get(k) for k in MACHINE_KEYS if machine.get(k) is not None}
    return out or None


def stack_of(versions: dict[str, Any] | None) -> dict[str, str] | None:
    """The stack of a save: the versions its sweep recorded less :data:`HARNESS_PACKAGES`, ``None`` when none."""
    out = {k: str(v) for k, v in sorted((versions or {}).items()) if k not in HARNESS_PACKAGES and v} \
        if isinstance(versions, dict) else {}
    return out or None


def machine_id(entry: dict[str, Any]) -> str | None:
    """One line naming the machine of a history entry (``host (cpu, N CPUs)``), ``None`` when unknown."""
    m = entry.get("machine")
    if not isinstance(m, dict) or not m:
        return None
    return f"{m.get('hostname', '?')} ({m.get('cpu') or m.get('arch') or '?'}, {m.get('cpu_count', '?')} CPUs)"


def stack_id(entry: dict[str, Any]) -> str | None:
    """One line naming the stack of a history entry: a named stack as it is, versions as ``pkg ver, ...``,
    ``None`` when unknown (entries without one are one stack)."""
    s = entry.get("stack")
    if isinstance(s, str) and s:
        return s
    if isinstance(s, dict) and s:
        return ", ".join(f"{k} {v}" for k, v in sorted(s.items()))
    return None


def cell_figures(cell: dict[str, Any]) -> dict[str, Any]:
    """A snapshot cell's figures for its history entry: ``label``, ``runs`` (ok runs with step-time samples),
    ``step_time_s`` and ``throughput`` (geometric mean of the runs' medians, :func:`bench.records.figures.cell_value`),
    ``rollout_share`` and ``free_ratio`` (arithmetic mean of the runs' medians); ``None`` where no run has samples."""
    from bench.records.figures import cell_value, run_value  # deferred: keeps this module light for baseline.py

    ok = [r for r in cell.get("repeats") or [] if r.get("status", "ok") == "ok"]

    def values(metric: str) -> list[float]:
        return [v for v in (run_value((r.get("samples") or {}).get(metric)) for r in ok) if v is not None and v > 0]

    out: dict[str, Any] = {"label": cell.get("label"), "runs": len(values("step_time"))}
    for m in ("step_time", "throughput"):
        out["step_time_s" if m == "step_time" else m] = cell_value(values(m)) if values(m) else None
    for m in ("rollout_share", "free_ratio"):
        vs = values(m)
        out[m] = sum(vs) / len(vs) if vs else None
    return out


def _value(entry: dict[str, Any], key: str, metric: str) -> float | None:
    """The value of ``metric`` for cell ``key`` in a history entry on the series' scale (log for a time or rate)."""
    if metric in ("step_time", "step_time_normalized"):
        v = (entry.get("log_step_time" if metric == "step_time" else "log_step_time_normalized") or {}).get(key)
        return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None
    v = ((entry.get("cells") or {}).get(key) or {}).get(metric)
    if not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    if METRICS[metric] == "log":
        return math.log(v) if v > 0 else None
    return float(v)


@dataclass
class Series:
    """One metric of one cell over the saves of one (matrix, machine, stack): ``values`` on the metric's scale
    (:data:`METRICS`), ``saves`` the matching history entries' ``{"position", "sweep", "git_commit",
    "created_at"}`` (``position``: 1-based place in the baseline's history), in save order."""

    matrix: str | None
    cell: str
    label: str
    machine: str | None
    stack: str | None
    metric: str
    values: list[float] = field(default_factory=list)
    saves: list[dict[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        """``label · metric`` with matrix, machine and stack where known."""
        matrix = f"matrix {self.matrix}" if self.matrix else None
        return " · ".join(x for x in (self.label, self.metric, matrix, self.machine, self.stack) if x)


def _pick(entries: list[dict[str, Any]], flag: str, wanted: str | None, ident) -> list[dict[str, Any]]:
    """The entries whose identity (``ident``) is ``wanted`` (``None``: all); refuses an unknown value."""
    if wanted is None:
        return entries
    known = sorted({ident(e) or "unknown" for e in entries})
    out = [e for e in entries if (ident(e) or "unknown") == wanted
           or (flag == "--machine" and (e.get("machine") or {}).get("hostname") == wanted)]
    if not out:
        raise BenchError(f"{flag} {wanted!r}: no save of this history has it{did_you_mean(wanted, known)} "
                         f"(allowed: {'; '.join(known)})")
    return out


def build_series(baseline: dict[str, Any], metrics: list[str], *, cell: str | None = None,
                 machine: str | None = None, stack: str | None = None) -> tuple[list[Series], str | None]:
    """Every series of the baseline's history (:class:`Series`, in the order cells, groups, metrics first appear)
    and a one-line note when the saves come from several (matrix, machine, stack) groups (else ``None``).

    ``cell``: a cell's label or key; ``machine``: a machine line of :func:`machine_id` or a hostname; ``stack``: a
    line of :func:`stack_id` (``unknown`` for saves without one).

    Raises:
        BenchError: an unknown metric, cell, machine or stack (naming the allowed values); one series asked for
            (``cell`` and one metric) whose saves come from several machines or stacks.
    """
    name = baseline.get("name") or Path(str(baseline.get("_path", "baseline"))).stem
    for m in metrics:
        if m not in METRICS:
            raise InputError("metric", f"metric {m!r}: unknown{did_you_mean(m, list(METRICS))} "
                             f"(allowed: {', '.join(METRICS)})")
    position = {id(e): i for i, e in enumerate(baseline.get("history") or [], start=1)}  # 1 = the oldest kept
    entries = [e for e in baseline.get("history") or [] if isinstance(e, dict)]
    entries = _pick(_pick(entries, "--machine", machine, machine_id), "--stack", stack, stack_id)
    labels: dict[str, str] = {c["key"]: c["label"] for c in baseline.get("cells") or []}
    for e in entries:
        for k, fig in (e.get("cells") or {}).items():
            if isinstance(fig, dict) and fig.get("label"):
                labels.setdefault(k, fig["label"])
    keys: list[str] = []
    for e in entries:
        for k in [*(e.get("log_step_time") or {}), *(e.get("cells") or {})]:
            if k not in keys:
                keys.append(k)
    if cell is not None:
        chosen = [k for k in keys if k == cell or labels.get(k) == cell]
        if not chosen:
            known = [labels.get(k, k) for k in keys]
            raise InputError("cell", f"cell {cell!r}: no such cell in baseline {name}'s history"
                             f"{did_you_mean(cell, known)} (allowed: {', '.join(known) or 'none'})")
        keys = chosen
    groups: list[tuple] = []
    for e in entries:
        g = (e.get("matrix"), machine_id(e), stack_id(e))
        if g not in groups:
            groups.append(g)
    if cell is not None and len(metrics) == 1 and len(groups) > 1:
        raise BenchError(f"history {name}: --cell {cell} --metric {metrics[0]} asks for one series, but its saves come "
                         f"from {len(groups)} (matrix, machine, stack) groups: {_describe(groups)}; a series never "
                         "mixes them: pick one with --machine or --stack, or leave --cell out to see them split")
    out = []
    for k in keys:
        for g in groups:
            for m in metrics:
                s = Series(matrix=g[0], cell=k, label=labels.get(k, k), machine=g[1], stack=g[2], metric=m)
                for e in entries:
                    if (e.get("matrix"), machine_id(e), stack_id(e)) == g and (v := _value(e, k, m)) is not None:
                        s.values.append(v)
                        s.saves.append({"position": position[id(e)], "sweep": e.get("sweep"),
                                        "git_commit": e.get("git_commit"), "created_at": e.get("created_at")})
                if s.values:
                    out.append(s)
    note = (f"history {name}: saves from {len(groups)} (matrix, machine, stack) groups, split into separate series "
            f"(a series never mixes them): {_describe(groups)}") if len(groups) > 1 else None
    return out, note


def _describe(groups: list[tuple]) -> str:
    """``matrix X on machine M with stack S | ...`` of each group (unknown parts named so)."""
    return " | ".join(f"matrix {g[0] or 'unknown'} on {g[1] or 'an unknown machine'} with "
                      f"{g[2] or 'an unknown stack'}" for g in groups)


def analyse(baseline: dict[str, Any], metrics: list[str], alpha: float, *, cell: str | None = None,
            machine: str | None = None, stack: str | None = None, fail_on_new: int | None = None) -> dict[str, Any]:
    """Change points of every series of a baseline's history (see the module). Returns ``{"name", "alpha",
    "family", "alpha_series", "min_saves", "permutations", "note", "series": [...], "short": [...], "new": [...]}``:
    per judged series its identity, ``scale``, ``values``, ``saves`` and ``points`` (``index`` in the series,
    ``position`` in the history, ``shift``/``low``/``high`` on the series' scale, ``change``/``change_low``/
    ``change_high`` as shown: percent for a log metric, percentage points for a share, ``p``, ``before``, ``after``);
    ``short``: the series with too few saves; ``new``: the points in the last ``fail_on_new`` saves of a series.

    Raises:
        BenchError: see :func:`build_series`; ``fail_on_new`` below 1; no series with enough saves (naming how
            many the test needs).
    """
    from bench.stats.changepoints import detect, min_saves, permutations_for  # deferred: loads numpy, ruptures

    name = baseline.get("name") or Path(str(baseline.get("_path", "baseline"))).stem
    if fail_on_new is not None and fail_on_new < 1:
        raise InputError("saves to check", f"saves to check {fail_on_new}: allowed 1 or more (the number of last "
                         "saves to check)")
    series, note = build_series(baseline, metrics, cell=cell, machine=machine, stack=stack)
    m = len(series)
    if not m:
        raise BenchError(f"history {name}: no saved sweep holds {', '.join(metrics)} (its history has "
                         f"{len(baseline.get('history') or [])} saves; `baseline save SWEEP --name {name} --force` "
                         "appends one)")
    a = alpha / m
    need = min_saves(a)
    judged = [s for s in series if len(s.values) >= need]
    if not judged:
        longest = max(len(s.values) for s in series)
        raise BenchError(f"history {name}: {longest} saves in its longest series; the change-point test at alpha "
                         f"{alpha:g} over {m} series ({a:.3g} each) needs at least {need} saves of one machine and "
                         f"stack (save more sweeps with `baseline save SWEEP --name {name} --force`, or narrow "
                         "--metric/--cell)")
    out: dict[str, Any] = {"name": name, "alpha": alpha, "family": m, "alpha_series": a, "min_saves": need,
                           "permutations": permutations_for(a), "note": note, "series": [], "new": [],
                           "short": [{"series": s.name, "saves": len(s.values)} for s in series if s not in judged],
                           "group": None}
    one = note is None  # one (matrix, machine, stack): said once, not in every series' name
    if one:
        out["group"] = {"matrix": series[0].matrix, "machine": series[0].machine, "stack": series[0].stack}
    for i, s in enumerate(judged):
        det = detect(s.values, a, seed=i)
        pts = []
        for cp in det.points:
            show = (lambda v: 100 * math.expm1(v)) if METRICS[s.metric] == "log" else (lambda v: 100 * v)
            pts.append({"index": cp.index, "position": s.saves[cp.index]["position"], "save": s.saves[cp.index],
                        "shift": cp.shift, "low": cp.low, "high": cp.high, "change": show(cp.shift),
                        "change_low": show(cp.low), "change_high": show(cp.high), "p": cp.p, "before": cp.before,
                        "after": cp.after})
        row = {"name": f"{s.label} · {s.metric}" if one else s.name, "matrix": s.matrix, "cell": s.cell,
               "label": s.label, "machine": s.machine, "stack": s.stack, "metric": s.metric,
               "scale": METRICS[s.metric], "values": s.values, "saves": s.saves,
               "points": pts, "tested": det.tested}
        out["series"].append(row)
        if fail_on_new is not None:
            out["new"] += [{"series": row["name"], **p} for p in pts if p["index"] >= len(s.values) - fail_on_new]
    return out


def describe_point(row: dict[str, Any], p: dict[str, Any]) -> str:
    """One line for a change point: where (save, commit, date), the change with its interval, p, the saves used."""
    unit = " %" if row["scale"] == "log" else " points"
    sv = p["save"]
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(sv["created_at"])) if sv.get("created_at") else "date unknown"
    commit = (sv.get("git_commit") or "commit unknown")[:12]
    return (f"save {p['position']} ({commit}, {when} UTC, sweep {sv.get('sweep')}): {p['change']:+.1f}{unit} "
            f"[{p['change_low']:+.1f}, {p['change_high']:+.1f}] (p {p['p']:.2g}; {p['before']} saves before, "
            f"{p['after']} after)")


def display_values(row: dict[str, Any]) -> list[float]:
    """A series' values as shown: seconds (the normalized ratio, tokens/s) for a log metric, percent for a share."""
    return [math.exp(v) for v in row["values"]] if row["scale"] == "log" else [100 * v for v in row["values"]]


def log_mlflow(result: dict[str, Any], tracking_uri: str, files: dict[str, Path]) -> str | None:
    """Log the history to MLflow: a parent run ``history NAME`` (tags ``bench.kind=history``, ``bench.baseline``;
    params alpha, family; the result as ``history.json``), and per series a child run whose metric (the series'
    metric, step = position in the history) is the series as shown, with its change points as a tag and its PNG
    (``files``: series name -> path). Returns a warning instead of raising (``None``: logged)."""
    from bench.tracking import Tracker, store_failure  # deferred: MLflow is imported only when a store is given

    matrix = next((r["matrix"] for r in result["series"] if r["matrix"]), None) or "default"
    try:
        tr = Tracker(tracking_uri, matrix)
        rid = tr.start_parent(f"history {result['name']}", {"bench.kind": "history", "bench.baseline": result["name"]},
                              {"alpha": result["alpha"], "family": result["family"],
                               "alpha_series": result["alpha_series"]})
        for row in result["series"]:
            pts = "; ".join(describe_point(row, p) for p in row["points"]) or "none"
            shown = display_values(row)
            tr.log_child(rid, row["name"][:240], params={"cell": row["label"], "metric": row["metric"],
                                                         "machine": row["machine"] or "unknown",
                                                         "stack": row["stack"] or "unknown"},
                         tags={"bench.kind": "history-series", "bench.change_points": pts},
                         series={row["metric"]: [(s["position"], v) for s, v in zip(row["saves"], shown)]},
                         summary={"change_points": len(row["points"])},
                         artifacts=[files[row["name"]]] if row["name"] in files else [], status="ok")
        tr.finish_parent(rid, metrics={"change_points": sum(len(r["points"]) for r in result["series"])},
                         artifacts=[], status="FINISHED")
        tr.client.log_dict(rid, {k: v for k, v in result.items()}, "history.json")
    except Exception as exc:  # MLflow is a mirror: a store that fails must not lose the printed result
        return f"history not logged to MLflow at {tracking_uri}: {store_failure(exc, tracking_uri)}"
    return None
