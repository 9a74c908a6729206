"""``run_bench.py report SWEEP``: what each optimization buys, whether they interact, and how sure we are.

Writes into ``<sweep>/report/`` (or ``--out``) and logs on the sweep's MLflow parent run (artifacts
under ``report/``, effect metrics, tag ``bench.report``):

* ``report.md``: the tables below, with the plots linked; ``report.json``: the same numbers;
  ``effects.csv``: the model terms;
* after a sequential sweep (``--sequential``, ``--precision``, ``--budget``) each main effect and step-time claim
  shows the stopping look's repeated interval and verdict (:mod:`bench.planning.view`), without a
  fixed-sample p value; the fixed-sample figures left (interactions, cell speedups) are labelled as not covered
  by the sequential error control;
* the unit of replication is the **run**: each finished run is summarized by its value
  (:func:`bench.records.figures.run_value`: median of its timed steps, speed-normalized when every run timed the
  probe) and every interval and p value below is computed from run values, never from steps as if they
  were independent samples; the time block (repeat ``k`` of a blocked sweep) is a fixed factor;
* per cell: speedup vs the all-off cell (:func:`bench.records.figures.speedup` of the cells' geometric-mean run
  values, the same number as ``summary.md``) with a t interval and p value from the log run values and
  the pooled residual SD of the cell-means model (:func:`bench.stats.effects.run_contrast`) -> ``speedup.png``;
* main effects and two-factor interactions: OLS (statsmodels) of the log run values, factors coded +-1
  (effect = 2 x coefficient; factors with more than two levels dummy-coded vs their first level), the
  block as a factor, residual degrees of freedom stated, Holm-adjusted p values deciding "significant";
  with one run per cell, estimates only (no run-to-run variance to test against); for fractional
  designs the alias structure (pyDOE3) and which interactions are confounded -> ``effects.png``;
* phase breakdown per cell (gen, old_log_prob, ref, update_actor, other = step - those, reward and
  adv included): each phase's mean share of the timed steps times the cell's step time, so the bars add
  up to the table's step time; with the rollout share and the Free ratio -> ``phases.png``;
* the rollout long tail (article 2.6): response length min / mean / max per cell and the decode slots
  wasted waiting for the longest sample, ``1 - mean/max`` -> ``long_tail.png``;
* the article's reported gains (+30 % end to end, ~+15 % dynamic bsz, +9 % task queue, +8 % mc2)
  beside ours -> ``article.png``;
* the minimal detectable effect given the measured noise (within-run and run-to-run), for a
  two-cell comparison, a main effect, and the gate against a baseline;
* the matrix's ``expect`` claims, when it has some, judged on the runs (:func:`bench.report.tables.claims_on_runs`).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench.commands.base import Command, given, given_path
from bench.commands.report_markdown import render
from bench.core.errors import BenchError, say
from bench.core.files import atomic_write_json, atomic_write_text, read_json
from bench.gate.runs import gate_figure
from bench.gate.verdicts import check_expectations, validate_expect
from bench.planning.allocation import report_section
from bench.planning.view import apply_to_report, view
from bench.records.figures import Snapshot
from bench.records.mfu import furthest_from_peak, mlflow_metrics, sweep_phase_perf
from bench.records.results import check_output_folder, find_sweep, load_records
from bench.records.snapshot import snapshot
from bench.records.speed import normalize_snapshot
from bench.report.plots import plot_article, plot_effects, plot_long_tail, plot_phases, plot_speedup
from bench.report.tables import analyze, article_rows, claims_on_runs
from bench.report.where import where_metrics, where_section
from bench.stats.estimators import DEFAULT_ALPHA, DEFAULT_THRESHOLD, N_BOOT
from bench.tracking import NOTE, REPORT_POINTER, Tracker, mlflow_key, note, store_failure


def build(sweep: Path, results: Path, *, alpha: float = 0.05, n_boot: int = N_BOOT, seed: int = 0,
          interactions: bool = True, normalize: bool = True) -> dict[str, Any]:
    """All numbers of the report of one sweep (no files written).

    With ``normalize`` (default) and a speed probe in every run (embedded engine on CPU), step times and
    throughput are speed-normalized to the sweep's median probe time first
    (:func:`bench.records.speed.normalize_snapshot`), exactly as ``summary.md`` is. ``n_boot``/``seed`` are kept for
    the command line; the report's intervals are t intervals on runs and draw no bootstrap.
    """
    snap = snapshot(sweep, results)
    if not snap["cells"]:
        raise BenchError(f"{sweep}: the sweep's plan has no cells")
    # cells of a sweep run minutes apart: read every step time at the sweep's median machine speed
    probe_ref = normalize_snapshot(snap) if normalize else None
    stats = analyze(snap, alpha=alpha, interactions=interactions)
    meta = read_json(Path(sweep) / "sweep.json") or {}
    if meta.get("code_versions"):  # an interleaved gate sweep: the gate's own figure, by the gate's own function
        stats["mde"]["gate"] = gate_figure(load_records(sweep), threshold=DEFAULT_THRESHOLD, alpha=DEFAULT_ALPHA)
        stats["mde"]["gate_source"] = "this interleaved gate sweep (both code versions paired by block), as the gate"
    resolution = (meta.get("plan") or {}).get("resolution") or (snap.get("design") or {}).get("resolution")
    data = {
        "format": "grpo-bench-report", "format_version": 2, "created_at": time.time(), "alpha": alpha,
        "sweep": {"matrix": snap["source"]["matrix"], "sweep_id": snap["source"]["sweep_id"],
                  "sweep": snap["source"]["sweep"], "engine": snap["engine"], "platform": snap["platform"],
                  "design": stats["effects"]["design"], "repeats": snap["repeats"], "versions": snap["versions"],
                  "git_commit": snap.get("git_commit"), "resolution": resolution,
                  "parent_run_id": snap["source"].get("parent_run_id"), "order": snap.get("order")},
        "speed_normalized_to_s": probe_ref, **stats,
    }
    data["phase_perf"] = phase_perf_section(snap)  # MFU and tokens/s per device per phase (bench.records.mfu)
    # where each optimization acts: each operator category's time through the same run-level model
    data["where"] = where_section(Path(sweep), snap, stats["effects"], alpha=alpha, interactions=interactions)
    data.update(report_section(Path(sweep), meta))  # noise and cost model, the plan, sequential looks
    if snap.get("expect"):
        try:
            claims = validate_expect(snap["expect"], snap["source"].get("matrix_file") or sweep)
            found = check_expectations(snap, claims, alpha=alpha, n_boot=0, seed=seed, normalize=False)
            # the block's claims are one family: Bonferroni over its m claims, m fixed by the matrix before the data
            m = max(1, len(claims))
            data["expectations"] = claims_on_runs(snap, found, alpha / m)
            data["expectations_family"] = {"alpha": alpha, "m": m, "per_claim_alpha": alpha / m,
                                           "method": "Bonferroni over the expect block's claims"}
        except BenchError as exc:
            data["expectations_error"] = str(exc)
    if (seq := view(meta)) is not None:  # a sequential sweep: its stopping look's intervals and verdicts, not fixed
        apply_to_report(data, seq)
        data["article"] = article_rows(snap, data["cells"], data["effects"])
    return data


def phase_perf_section(snap: dict[str, Any]) -> dict[str, Any]:
    """The report's ``phase_perf``: per cell ``{"cell", "label", "phases": {phase: {"mfu", "tokens_per_s_per_device",
    "seconds"}}, "furthest_from_peak"}`` (:func:`bench.records.mfu.sweep_phase_perf`, measured seconds, not
    speed-normalized) and ``basis`` (device, peak and its source, FLOPs source, what the count leaves out)."""
    cells, basis = sweep_phase_perf(Snapshot.model_validate(snap).cells)
    return {"cells": [{"cell": c.cell_id, "label": c.label, "phases": perf,
                       "furthest_from_peak": furthest_from_peak(perf)} for c, perf in cells], "basis": basis}


#: the files :func:`write` puts into the report folder
REPORT_FILES = ("speedup.png", "effects.png", "phases.png", "long_tail.png", "article.png", "effects.csv",
                "report.json", "report.md")


def write(data: dict[str, Any], out: Path) -> list[Path]:
    """Write report.md, report.json, effects.csv and the PNG plots into ``out``; returns the files. When a write fails
    (a full disk), no temporary file is left, nor ``out`` when this call made it."""
    made = not os.path.lexists(out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        return _write(data, out)
    except BaseException:
        for tmp in out.glob(".*.tmp.png"):
            tmp.unlink(missing_ok=True)
        if made:
            shutil.rmtree(out, ignore_errors=True)  # a report folder this call began: half a report is none
        raise


def _write(data: dict[str, Any], out: Path) -> list[Path]:
    files = []
    lvl = 1 - data["alpha"]
    for name, fn in (("speedup.png", lambda p: plot_speedup(data["cells"], p, lvl)),
                     ("effects.png", lambda p: plot_effects(data["effects"], p)),
                     ("phases.png", lambda p: plot_phases(data["cells"], p)),
                     ("long_tail.png", lambda p: plot_long_tail(data["cells"], p)),
                     ("article.png", lambda p: plot_article(data["article"], p))):
        tmp = out / f".{name}.tmp.png"
        fn(tmp)
        tmp.replace(out / name)
        files.append(out / name)
    buf = io.StringIO()
    w = csv.writer(buf)
    fit = data["effects"].get("fit") or {}
    w.writerow(["term", "kind", "effect_log", "se", "ci_low", "ci_high", "p_value", "p_holm", "step_time_change",
                "aliases", "unit", "df_resid", "verdict", "interval"])
    for t in fit.get("terms") or []:  # verdict, interval: a sequential sweep's (bench.planning.view)
        w.writerow([t["name"], t["kind"], t["effect"], t["se"], t["ci_low"], t["ci_high"], t["p_value"],
                    t["p_adjusted"], t["change"], " ".join(t["aliases"]), fit.get("unit"), fit.get("df_resid"),
                    t.get("verdict") or "", t.get("interval") or f"fixed-sample t, {fit.get('level', 0.95):.0%}"])
    atomic_write_text(out / "effects.csv", buf.getvalue())
    atomic_write_json(out / "report.json", data)
    atomic_write_text(out / "report.md", render(data))
    return [out / "report.md", out / "report.json", out / "effects.csv", *files]


def log_mlflow(data: dict[str, Any], files: list[Path], tracking_uri: str) -> str | None:
    """Log the report files (artifact folder ``report``, with ``report.html`` rendered from ``report.md``),
    effect metrics, a tag and a pointer at the top of the description on the sweep's parent run; returns a
    warning text instead of raising (``None``: logged)."""
    rid = data["sweep"].get("parent_run_id")
    if not rid:
        return "the sweep has no MLflow parent run recorded; report not logged to MLflow"
    try:
        from mlflow.entities import Metric

        tr = Tracker(tracking_uri, data["sweep"]["matrix"])
        tr.log_report(rid, files)  # the files under report/, and report.html (images embedded) that the UI renders
        now = int(time.time() * 1000)
        ms = [Metric(mlflow_key(f"report.effect.{t['name']}"), float(t["change"]), now, 0)
              for t in ((data["effects"].get("fit") or {}).get("terms") or [])]
        ms += [Metric(mlflow_key(f"report.speedup.{r['cell']}"), float(r["speedup"]), now, 0)
               for r in data["cells"] if r["speedup"] is not None]
        ms += [Metric(mlflow_key(f"report.{k}"), v, now, 0) for k, v in where_metrics(data.get("where")).items()]
        ms += [Metric(mlflow_key(f"report.{k}.{r['cell']}"), v, now, 0)
               for r in (data.get("phase_perf") or {}).get("cells", []) for k, v in mlflow_metrics(r["phases"]).items()]
        for i in range(0, len(ms), 900):
            tr.client.log_batch(rid, metrics=ms[i:i + 900])
        tr.client.set_tag(rid, "bench.report", "report/report.md")
        for t in (data["effects"].get("fit") or {}).get("terms") or []:  # a sequential sweep's verdicts
            if t.get("verdict"):
                tr.client.set_tag(rid, mlflow_key(f"report.verdict.{t['name']}"), f"{t['verdict']} ({t['interval']})")
        # the parent's description points at the report (first, so that a description cut at MLflow's limit keeps it)
        current = tr.client.get_run(rid).data.tags.get(NOTE, "")
        if not current.startswith(REPORT_POINTER):
            tr.client.set_tag(rid, NOTE, note(REPORT_POINTER + ("\n\n" + current if current else "")))
    except Exception as exc:
        return f"report not logged to MLflow run {rid} at {tracking_uri}: {store_failure(exc, tracking_uri)}"
    return None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``report``."""
    p.add_argument("sweep", type=given,
                   help="the sweep: a sweep folder, a matrix name (its latest sweep) or <matrix>/<sweep id>")
    p.add_argument("--out", type=given_path, default=None, metavar="DIR",
                   help="output folder (default: <sweep>/report/)")
    p.add_argument("--alpha", type=float, default=0.05, help="intervals at 1-alpha, tests at alpha (default 0.05)")
    p.add_argument("--bootstrap", type=int, default=N_BOOT, metavar="N",
                   help=f"bootstrap resamples (default {N_BOOT}; kept for scripts: the report's intervals are t "
                        "intervals on run values and draw no bootstrap)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0; see --bootstrap)")
    p.add_argument("--no-interactions", action="store_true", help="main effects only")
    p.add_argument("--normalize", choices=("auto", "off"), default="auto",
                   help="auto (default): speed-normalize step times by the machine-speed probe when every run has "
                        "one (embedded engine on CPU); off: raw step times")


def main(args: argparse.Namespace) -> int:
    """Build and write the report; 0 on success, 2 on bad input."""
    if not 0 < args.alpha < 0.5:
        raise BenchError(f"--alpha {args.alpha}: must be in (0, 0.5)")
    sweep = find_sweep(args.sweep, args.results)
    out = Path(args.out) if args.out else sweep / "report"
    check_output_folder(out, REPORT_FILES, given=bool(args.out))  # before the analysis: nothing half-written
    data = build(sweep, args.results, alpha=args.alpha, n_boot=args.bootstrap, seed=args.seed,
                 interactions=not args.no_interactions, normalize=args.normalize == "auto")
    files = write(data, out)
    warn = log_mlflow(data, files, args.tracking_uri) if args.tracking_uri else None
    print(f"report: {out / 'report.md'} ({len(data['cells'])} cells, "
          f"{len((data['effects'].get('fit') or {}).get('terms') or [])} model terms, {len(files) - 3} plots)")
    if data["failed"]:
        print(f"note: {len(data['failed'])} cell(s) not finished, left out: " +
              ", ".join(r["cell"] for r in data["failed"]), file=sys.stderr)
    if warn:
        say(f"warning: {warn}")
    elif args.tracking_uri:
        print(f"MLflow: logged under report/ on parent run {data['sweep']['parent_run_id']}")
    return 0


class Report(Command, name="report"):
    """``report``: :func:`add_arguments`, :func:`main`."""

    setup_arguments, run = staticmethod(add_arguments), staticmethod(main)
