"""False alarms and detection of the ``history`` command's change points, on histories resampled from REAL recorded
runs (issue 44; docs/history.md).

Not a test. Data: ``benchmarks/data/recorded_runs_embedded.json``, the 24 runs of two real sweeps of
``matrix/full.yaml`` (4 cells, 8 timed steps a run, each run's step times and speed probes; docs/method.md). A
simulated **save** draws, for every cell, ``--runs`` of that cell's recorded runs with replacement
(:func:`resampled_snapshot`), builds the snapshot a ``baseline save`` reads (the real shape, checked by the real
reader) and turns it into a history entry with the real :func:`bench.gate.baseline.history_entry`. A **history** is
``--saves`` such saves (:func:`resampled_baseline`: a baseline file's content, history included); a planted step
multiplies every step time of the saves from ``--step-at`` on by ``1 + --step`` (all cells). Each history goes
through the real analysis (:func:`bench.gate.history.analyse`: every cell's series at ``alpha / cells``).

Figures: the **false-alarm rate** (flat histories with any change point, over all cells: the family-wise rate the
method promises to keep at most alpha), the per-series false-alarm rate, and for the planted step the rate at which
each cell's series shows a change point exactly at the step's save (and within one save of it), with Wilson 95 %
intervals.

    python benchmarks/history_false_alarms.py --histories 200 --saves 20 --runs 6 --step-at 10
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gate.baseline import history_entry, sweep_to_sweep  # noqa: E402
from bench.gate.history import analyse  # noqa: E402
from bench.records.snapshot import FORMAT, FORMAT_VERSION, check_snapshot, levels_key  # noqa: E402

POOL = Path(__file__).resolve().parent / "data" / "recorded_runs_embedded.json"
#: the start of the resampled histories' dates (a save a day)
T0 = 1_796_000_000.0


def load_pool(path: Path = POOL) -> dict[str, Any]:
    """The recorded runs by cell: ``{"header": ..., "cells": {label: {"levels", "runs": [(step_times, probes)]}}}``
    (ok runs only; step times of the timed steps, seconds; probes: the speed probe at each, or empty)."""
    data = json.loads(Path(path).read_text())
    cells: dict[str, Any] = {}
    for r in data["runs"]:
        if r.get("status") != "ok" or not r.get("step_time_s"):
            continue
        c = cells.setdefault(r["label"], {"levels": r["levels"], "cell_id": r["cell_id"], "runs": []})
        c["runs"].append((list(r["step_time_s"]), list(r.get("speed_probe_s") or [])))
    return {"header": data["header"], "cells": cells}


def resampled_snapshot(pool: dict[str, Any], rng: np.random.Generator, runs: int, factor: float,
                       save: int) -> dict[str, Any]:
    """One simulated saved sweep in the snapshot shape (:func:`bench.records.snapshot.snapshot`'s): per cell
    ``runs`` recorded runs drawn with replacement, their step times times ``factor`` (the probes unchanged)."""
    head = pool["header"]["sweeps"][0]
    cells = []
    for label, c in pool["cells"].items():
        reps = []
        for k in range(runs):
            st, pr = c["runs"][int(rng.integers(len(c["runs"])))]
            reps.append({"repeat": k, "status": "ok", "steps": list(range(2, 2 + len(st))), "workload": [],
                         "samples": {"step_time": [factor * v for v in st], "throughput": [], "rollout_share": [],
                                     "free_ratio": [], "speed_probe": list(pr)}})
        cells.append({"key": levels_key(c["levels"]), "cell_id": c["cell_id"], "label": label, "levels": c["levels"],
                      "status": "ok", "repeats": reps})
    snap = {"format": FORMAT, "format_version": FORMAT_VERSION, "engine": head["engine"], "platform": head["platform"],
            "versions": head["versions"], "git_commit": hashlib.sha1(f"save {save}".encode()).hexdigest(),
            "source": {"matrix": head["matrix"], "sweep": f"{head['matrix']}/resampled-{save:03d}"},
            "repeats": runs, "cells": cells, "created_at": T0 + 86400.0 * save,
            "machine": {"hostname": "recorded", "arch": "x86_64", "cpu": pool["header"]["machine"], "cpu_count": 2}}
    check_snapshot(snap, "resampled snapshot")
    return snap


def resampled_baseline(pool: dict[str, Any], rng: np.random.Generator, *, saves: int, runs: int,
                       step_at: int | None = None, step: float = 0.10, name: str = "nightly") -> dict[str, Any]:
    """A baseline file's content after ``saves`` resampled saves (``baseline save --force`` each time): the last
    snapshot, ``name``, ``history`` (:func:`bench.gate.baseline.history_entry` of each save) and ``sweep_to_sweep``.
    ``step_at``: the 0-based save from which step times are ``1 + step`` times longer (``None``: flat)."""
    history = []
    snap: dict[str, Any] = {}
    for i in range(saves):
        snap = resampled_snapshot(pool, rng, runs, 1.0 + step if step_at is not None and i >= step_at else 1.0, i)
        history.append(history_entry(snap))
    return {**snap, "name": name, "note": "resampled from benchmarks/data/recorded_runs_embedded.json",
            "history": history, "sweep_to_sweep": sweep_to_sweep(history[-20:])}


def wilson(k: int, n: int) -> tuple[float, float]:
    """Wilson 95 % interval of a rate ``k / n`` (Wilson 1927)."""
    z = 1.959963984540054
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def rates(pool: dict[str, Any], *, histories: int, saves: int, runs: int, step_at: int, step: float, alpha: float,
          metric: str, seed: int) -> dict[str, Any]:
    """Flat and stepped histories through :func:`bench.gate.history.analyse`; the counts and rates."""
    flat_any = flat_series = exact = near = cells_n = covered = 0
    per_cell: dict[str, list[int]] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    for h in range(histories):
        flat = analyse(resampled_baseline(pool, np.random.default_rng([seed, h, 0]), saves=saves, runs=runs),
                       [metric], alpha)
        n_pts = [len(s["points"]) for s in flat["series"]]
        flat_any += any(n_pts)
        flat_series += sum(1 for n in n_pts if n)
        stepped = analyse(resampled_baseline(pool, np.random.default_rng([seed, h, 1]), saves=saves, runs=runs,
                                             step_at=step_at, step=step), [metric], alpha)
        for s in stepped["series"]:
            idx = [p["index"] for p in s["points"]]
            cells_n += 1
            exact += step_at in idx
            near += any(abs(i - step_at) <= 1 for i in idx)
            per_cell.setdefault(s["label"], []).append(int(step_at in idx))
            covered += any(p["index"] == step_at and p["low"] <= math.log1p(step) <= p["high"] for p in s["points"])
    series_n = histories * len(pool["cells"])
    return {"histories": histories, "saves": saves, "runs_per_save": runs, "step_at": step_at, "step": step,
            "alpha": alpha, "metric": metric, "cells": len(pool["cells"]),
            "false_alarm_any": flat_any / histories, "false_alarm_any_ci": wilson(flat_any, histories),
            "false_alarm_series": flat_series / series_n, "false_alarm_series_ci": wilson(flat_series, series_n),
            "found_exact": exact / cells_n, "found_exact_ci": wilson(exact, cells_n),
            "found_within_1": near / cells_n, "found_within_1_ci": wilson(near, cells_n),
            "interval_covers": covered / max(1, exact),
            "found_exact_by_cell": {k: sum(v) / len(v) for k, v in per_cell.items()},
            "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def main(argv: list[str] | None = None) -> int:
    """Print the figures (and write them as JSON with ``--json FILE``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--histories", type=int, default=200)
    ap.add_argument("--saves", type=int, default=20)
    ap.add_argument("--runs", type=int, default=6, help="recorded runs drawn per cell and save")
    ap.add_argument("--step-at", type=int, default=10, help="0-based save where the planted step starts")
    ap.add_argument("--step", type=float, default=0.10)
    ap.add_argument("--alpha", type=float, default=0.01)
    ap.add_argument("--metric", default="step_time")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    pool = load_pool()
    r = rates(pool, histories=a.histories, saves=a.saves, runs=a.runs, step_at=a.step_at, step=a.step, alpha=a.alpha,
              metric=a.metric, seed=a.seed)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    r.update(machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs", load1_end=load)
    pct = lambda x: f"{100 * x:.1f} %"  # noqa: E731
    ci = lambda c: f"[{100 * c[0]:.1f}, {100 * c[1]:.1f}]"  # noqa: E731
    print(f"{a.histories} flat and {a.histories} stepped histories of {a.saves} saves, {a.runs} resampled runs per "
          f"cell and save, {r['cells']} cells, metric {a.metric}, alpha {a.alpha} over the cells")
    print(f"false alarms: any change point in a flat history {pct(r['false_alarm_any'])} {ci(r['false_alarm_any_ci'])};"
          f" per series {pct(r['false_alarm_series'])} {ci(r['false_alarm_series_ci'])}")
    print(f"a +{100 * a.step:.0f} % step at save {a.step_at}: found exactly there in {pct(r['found_exact'])} "
          f"{ci(r['found_exact_ci'])} of the series, within one save in {pct(r['found_within_1'])} "
          f"{ci(r['found_within_1_ci'])}; its interval covers +{100 * a.step:.0f} % in {pct(r['interval_covers'])} of "
          "those; exactly, by cell: " + ", ".join(f"{k} {pct(v)}" for k, v in r["found_exact_by_cell"].items()))
    print(f"time: {r['wall_s']:.0f} s wall, {r['cpu_s']:.0f} s CPU; machine {r['machine']}, load average {load:.1f}")
    if a.json:
        a.json.write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
