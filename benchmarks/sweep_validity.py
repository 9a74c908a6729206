"""Validity of sweeps from resampled real recorded runs (issue 30): the helper of ``bench_verdict.py --resampled``.

Not a test. Two steps:

* **record** (:func:`extract_runs`): the runs of finished real sweeps, read with the harness's own readers
  (:func:`bench.records.results.load_records`, :func:`bench.records.snapshot.record_samples`,
  :func:`bench.planning.sequential.log_step_samples`), written as a small JSON fixture
  (``benchmarks/data/recorded_runs_<target>.json``): per run its cell and levels, block, order in the sweep,
  start and end (seconds from the sweep's first start), every step's time, the timed steps with their speed
  probes, the run value (log median timed step, speed-normalized when every run has the probe, as the report and
  the stop rule read it), status and reason, and the host load around it.
* **simulate** (:func:`validity`): per true change of one factor (0, T/2, T, 1.5T, 2T of the threshold T; every
  other factor 0), ``sweeps`` simulated sweeps, each block built by drawing, for every cell, one of that cell's
  recorded runs with replacement (:func:`centred_blocks`: every cell's runs scaled so that its recorded run values
  average the grand mean, which removes the real effects; each run keeps its probes, its step pattern, its duration
  and its failure; :func:`resample` says why runs and not whole blocks are drawn), then multiplying the step times
  of the runs with the factor on by ``1 + change``
  (:func:`resample`). The records go through the real decision code: the planned sequential design
  (:func:`bench.planning.allocation.plan_allocation` on the model :func:`bench.planning.model.estimate_model`
  measures from the same recorded runs, then :class:`bench.planning.sequential.EffectsStopRule` look by look) and
  fixed designs of R blocks (the same rule at one look, and the report's fit
  :func:`bench.stats.effects.fit_effects` with its Holm-adjusted p values and 95 % intervals). A sweep's wall
  time = the recorded durations of its resampled runs + the recorded gap before the next run (harness) + the stop
  rule's own time at each look, measured here.
"""

from __future__ import annotations

import gc
import itertools
import math
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from real_pools import moving_blocks  # benchmarks/ (this script's folder) is on sys.path

from bench.planning import sequential
from bench.planning.sequential import EffectsStopRule

_RUN_OBSERVATIONS = sequential.run_observations

FORMAT_VERSION = 1
_SERIAL = itertools.count()  # one number per centred_blocks call: the observation cache's keys never mix fixtures
STEP = "timing_s/step"
VERDICT_KEYS = ("slower", "faster", "no_change", "undecided")


def _probe_metric() -> str:
    from bench.records.speed import PROBE_METRIC

    return PROBE_METRIC


def extract_runs(sweep_dirs: Sequence[Path], target: str) -> dict[str, Any]:
    """The fixture of the runs of ``sweep_dirs`` (finished sweeps of one matrix and target): a header (target,
    matrices, sweep ids, UTC date, commit, machine, mean load average) and one dict per run (module text); no
    path of this machine. Times in seconds, ``value_log`` = log of the run value (``None`` for a failed run)."""
    from bench.core.files import read_json
    from bench.planning.sequential import log_step_samples, probed
    from bench.records.results import SWEEP, load_records
    from bench.records.snapshot import record_samples

    runs: list[dict[str, Any]] = []
    sweeps, loads = [], []
    for si, d in enumerate(sweep_dirs):
        meta = read_json(Path(d) / SWEEP) or {}
        recs = sorted(load_records(Path(d)), key=lambda r: r.get("started_at") or 0)
        norm = probed(recs)
        t0 = min(float(r["started_at"]) for r in recs if r.get("started_at"))
        sweeps.append({"sweep": si, "matrix": meta.get("matrix_name"), "sweep_id": meta.get("sweep_id"),
                       "commit": meta.get("git_commit"), "engine": meta.get("engine"), "platform": meta.get("platform"),
                       "versions": meta.get("versions") or {}, "normalized": norm,
                       "started_utc": datetime.fromtimestamp(t0, timezone.utc).strftime("%Y-%m-%d %H:%M")})
        for i, r in enumerate(recs):
            s = r.get("summary") or {}
            got = record_samples(r)
            logs = log_step_samples(r, norm) if r.get("status") == "ok" else []
            hl = r.get("host_load") or {}
            load = [(hl.get(w) or {}).get("load1_per_cpu") for w in ("before", "after")]
            loads += [v * (os.cpu_count() or 1) for v in load if isinstance(v, (int, float))]
            start = float(r.get("started_at") or t0) - t0
            runs.append({
                "sweep": si, "order": i, "cell_id": r.get("cell_id"), "label": r.get("label"),
                "levels": {k: v for k, v in (r.get("levels") or {}).items() if v is not None},
                "block": int(r.get("repeat", 0)), "start_s": round(start, 3),
                "end_s": round(start + float(r.get("wall_s") or 0.0), 3),
                "wall_s": round(float(r.get("wall_s") or 0), 3),
                "status": r.get("status"), "reason": r.get("reason") or "", "failure_kind": r.get("failure_kind"),
                "startup_s": (r.get("timing") or {}).get("startup_s"),
                "timed_steps": [int(t) for t in s.get("timed_steps") or []],
                "measured_steps": s.get("measured_steps"), "profiled_steps": s.get("profiled_steps") or [],
                "steps_s": {k: round(float(v[STEP]), 6) for k, v in (r.get("steps") or {}).items()
                            if isinstance(v, dict) and isinstance(v.get(STEP), (int, float))},
                "step_time_s": [round(float(v), 9) for v in got["step_time"]],
                "speed_probe_s": [round(float(v), 9) for v in got["speed_probe"]],
                "value_log": round(float(np.median(logs)), 9) if logs else None,
                "load1_per_cpu": load})
    cpu = next((ln.split(":", 1)[1].strip() for ln in _cpuinfo() if ln.startswith("model name")), platform.machine())
    header = {"format_version": FORMAT_VERSION, "target": target, "sweeps": sweeps,
              "machine": f"{os.cpu_count()} cores, {cpu}", "load_average_mean": round(float(np.mean(loads)), 2)
              if loads else None, "runs": len(runs),
              "value": "log median timed step, divided by the speed probe of its step when every run has one"}
    return {"header": header, "runs": runs}


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def load_fixture(path: Path) -> dict[str, Any]:
    """A fixture written by :func:`extract_runs`.

    Raises:
        SystemExit: (exit 2) the file is missing, not JSON, or of another ``format_version``.
    """
    import json

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{path}: cannot read the recorded runs ({exc})") from None
    if (data.get("header") or {}).get("format_version") != FORMAT_VERSION or not data.get("runs"):
        raise SystemExit(f"{path}: header.format_version must be {FORMAT_VERSION}, with runs")
    return data


def to_record(run: dict[str, Any], scale: float = 1.0, repeat: int | None = None,
              all_steps: bool = False) -> dict[str, Any]:
    """A run record (the ``record.json`` fields the readers use) from a fixture run, its timed steps' times
    multiplied by ``scale``, in block ``repeat`` (default its own); ``all_steps``: also the warm-up and profiled
    steps (for :func:`bench.planning.model.estimate_model`'s costs)."""
    probe = _probe_metric()
    steps: dict[str, dict[str, float]] = {k: {STEP: v} for k, v in run["steps_s"].items()} if all_steps else {}
    probes = run["speed_probe_s"] or [None] * len(run["step_time_s"])
    for t, st, p in zip(run["timed_steps"], run["step_time_s"], probes):
        steps[str(t)] = {STEP: st * scale} if p is None else {STEP: st * scale, probe: p}
    return {"cell_id": run["cell_id"], "label": run["label"], "levels": dict(run["levels"]),
            "repeat": run["block"] if repeat is None else repeat, "status": run["status"],
            "started_at": run["start_s"], "wall_s": run["wall_s"], "timing": {"startup_s": run["startup_s"]},
            "summary": {"timed_steps": run["timed_steps"],
                        "step_time_samples_s": [v * scale for v in run["step_time_s"]],
                        "measured_steps": run["measured_steps"], "profiled_steps": run["profiled_steps"]},
            "steps": steps}


def recorded_model(fix: dict[str, Any]) -> Any:
    """The planner's noise and cost model of the recorded runs (:func:`bench.planning.model.estimate_model`,
    one entry per recorded sweep)."""
    from bench.planning.model import estimate_model

    by_sweep: dict[int, list[dict[str, Any]]] = {}
    for r in fix["runs"]:
        by_sweep.setdefault(r["sweep"], []).append(to_record(r, all_steps=True))
    return estimate_model([(f"recorded sweep {k}", v) for k, v in sorted(by_sweep.items())])


def centred_blocks(fix: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The complete recorded blocks (every cell of the sweep present, failed runs included), each its runs in
    recorded order, in recorded order of sweep and block, each run with ``scale``: ``exp(grand mean - its cell's
    mean)``, ONE factor per cell over the whole pool (the mean of its ok runs' ``value_log`` over every recorded
    sweep moved to the grand mean), so that no real effect is left while each sweep's offset and its sweep x cell
    departures stay as recorded (issue 45: the old per-sweep centring erased them), and ``cost_s``: its duration
    plus the recorded gap before the next run of its sweep (the harness's time between runs; the sweep's last run:
    the median gap)."""
    runs, serial = fix["runs"], next(_SERIAL)
    means: dict[str, list[float]] = {}
    for r in runs:
        if r["status"] == "ok" and r["value_log"] is not None:
            means.setdefault(r["cell_id"], []).append(r["value_log"])
    grand = float(np.mean([np.mean(v) for v in means.values()])) if means else 0.0
    gaps: dict[tuple[int, int], float] = {}
    for s in {r["sweep"] for r in runs}:
        seq = sorted((r for r in runs if r["sweep"] == s), key=lambda r: r["order"])
        for a, b in zip(seq, seq[1:]):
            gaps[(s, a["order"])] = max(0.0, b["start_s"] - a["end_s"])
    med_gap = float(np.median(list(gaps.values()))) if gaps else 0.0
    cells = {s: {r["cell_id"] for r in runs if r["sweep"] == s} for s in {r["sweep"] for r in runs}}
    blocks: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in runs:
        m = means.get(r["cell_id"])
        scale = math.exp(grand - float(np.mean(m))) if m else 1.0
        blocks.setdefault((r["sweep"], r["block"]), []).append(
            {**r, "scale": scale, "cost_s": r["wall_s"] + gaps.get((r["sweep"], r["order"]), med_gap), "src": serial})
    return [sorted(v, key=lambda r: r["order"]) for k, v in sorted(blocks.items())
            if {r["cell_id"] for r in v} == cells[k[0]]]


def resample(rng: np.random.Generator, blocks: list[list[dict[str, Any]]], n_blocks: int, factor: str,
             change: float) -> list[dict[str, Any]]:
    """Records of one simulated sweep of ``n_blocks`` blocks, the real dependence kept (issue 45): ONE recorded sweep
    drawn at random (its offset, its machine state, its failures), then a moving-block bootstrap of its complete
    blocks (:func:`real_pools.moving_blocks`: chunks of consecutive recorded blocks, so drift and serial correlation
    within a chunk stay; every recorded block once before any comes twice), each block WHOLE: every cell's recorded
    run of that block, in the recorded order, failed runs included (the real reader leaves them out). The timed
    steps of a run with ``factor`` on (level 1) take ``1 + change`` times as long. Each record carries ``_cost_s``
    (wall seconds it took) and ``_key`` (its source run and scale).

    A simulated sweep longer than its recorded sweep repeats recorded blocks; with a pool of few blocks per sweep
    (``recorded_runs_embedded.json``: 3) such ties make later intervals too narrow, so the figures of
    ``docs/method.md`` come from ``benchmarks/pools/sweep_small4_embedded.json`` (10 blocks a sweep)."""
    by_sweep: dict[int, list[list[dict[str, Any]]]] = {}
    for b in blocks:
        by_sweep.setdefault(b[0]["sweep"], []).append(b)
    sweeps = sorted(by_sweep)
    mine = by_sweep[sweeps[int(rng.integers(0, len(sweeps)))]]
    out = []
    for k, i in enumerate(moving_blocks(rng, len(mine), n_blocks)):
        for r in mine[i]:
            mult = (1.0 + change) if r["levels"].get(factor) == 1 else 1.0
            rec = to_record(r, r["scale"] * mult, repeat=k)
            rec["_cost_s"], rec["_key"] = r["cost_s"], (r["src"], r["sweep"], r["order"], r["scale"] * mult)
            out.append(rec)
    return out


def cached_observations(records: Sequence[dict[str, Any]]
                        ) -> tuple[list[dict[str, Any]], list[float], list[int], list[str]]:
    """:func:`bench.planning.sequential.run_observations`, the real function, called once per recorded run and scale
    (:func:`resample`'s ``_key``) instead of once per record per look: a run's levels, log value and node are those
    of its source run at that scale; its block is the record's own. The whole list goes through the original when
    a record has no ``_key`` or when the runs do not all share one normalization choice
    (:func:`bench.planning.sequential.probed` of each ok run alone), so the choice stays the set's."""
    if not all("_key" in r for r in records):
        return _RUN_OBSERVATIONS(records)
    got = []
    for r in records:
        c = _OBS_CACHE.get(r["_key"])
        if c is None:
            one = _RUN_OBSERVATIONS([r])
            c = _OBS_CACHE[r["_key"]] = (one, sequential.probed([r]) if r.get("status") == "ok" else None)
        got.append((r, c))
    if len({p for _, (_, p) in got if p is not None}) > 1:
        return _RUN_OBSERVATIONS(records)
    obs, y, blocks, nodes = [], [], [], []
    for r, ((o, v, _, n), _) in got:
        if v:
            obs.append(dict(o[0]))
            y.append(v[0])
            blocks.append(int(r["repeat"]))
            nodes.append(n[0])
    return obs, y, blocks, nodes


_OBS_CACHE: dict[tuple[int, int, int, float], Any] = {}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial share ``k / n`` (Wilson 1927), 95 % by default."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, c - h), min(1.0, c + h)


def sequential_sweep(recs: list[dict[str, Any]], per_block: int, max_looks: int, threshold: float,
                     alpha: float) -> dict[str, Any]:
    """Run ``recs`` (``max_looks`` blocks of ``per_block`` runs) block by block through the shipped stop rule until
    it stops. Returns blocks used, wall seconds (the runs' recorded costs + the rule's own time), the stopping
    look's decisions and every decision seen at any look (for the family error over all looks)."""
    rule = EffectsStopRule(max_looks, threshold=threshold, alpha=alpha)
    seen: list[Any] = []
    t_rule = 0.0
    look = None
    for k in range(1, max_looks + 1):
        t = time.perf_counter()
        look = rule.after_block(recs[: k * per_block], k)
        t_rule += time.perf_counter() - t
        seen += look.decisions
        if look.stop:
            break
    used = recs[: look.look * per_block]
    return {"blocks": look.look, "wall_s": sum(r["_cost_s"] for r in used) + t_rule, "decisions": look.decisions,
            "seen": seen}


def fixed_sweep(recs: list[dict[str, Any]], threshold: float, alpha: float) -> dict[str, Any]:
    """A fixed design decided once at its end: the stop rule at one look (plain t interval at ``alpha / m``) and
    the report's fit (:func:`bench.stats.effects.fit_effects` as ``report`` calls it: block factor,
    interactions, Holm-adjusted p values, ``1 - alpha`` intervals). Returns wall seconds, the decisions and the
    report's terms (name, effect, ci_low, ci_high, significant)."""
    from bench.stats.effects import fit_effects

    look = EffectsStopRule(1, threshold=threshold, alpha=alpha).after_block(recs, 1)
    obs, y, blocks, nodes = sequential.run_observations(recs)
    factors = sorted({k for o in obs for k in o if len({p.get(k) for p in obs}) > 1})
    fit = fit_effects([{f: o[f] for f in factors} for o in obs], y, factors, alpha=alpha, interactions=True,
                      blocks=blocks if len(set(blocks)) > 1 else None, unit="run", replicated=True, nodes=nodes)
    terms = [(t.name, t.effect, t.ci_low, t.ci_high, bool(t.significant)) for t in fit.terms]
    return {"blocks": len(set(blocks)), "wall_s": sum(r["_cost_s"] for r in recs), "decisions": look.decisions,
            "seen": look.decisions, "terms": terms}


def score(sweeps: list[dict[str, Any]], factor: str, change: float, threshold: float) -> dict[str, Any]:
    """Per-sweep rates of one design at one true change (log truth ``log(1 + change)`` for ``factor``, 0 for
    every other main effect): ``family`` = share of sweeps with any 'slower'/'faster' verdict on a factor whose
    truth is 0 at any look (at ``change`` 0: every factor, the changed one included; ``k``/``n`` kept for the
    Wilson interval); ``verdicts`` = share of each final verdict
    on ``factor``; ``power`` = share deciding ``factor`` in the right direction; ``error`` = share deciding it in
    the wrong direction, or 'no change' when ``change >= threshold``; ``decided_all`` = share of sweeps with every
    main effect decided at the end; ``coverage`` = share of the final intervals of
    all main effects holding their truth; ``report_family`` / ``report_coverage``: the same for the report's
    fit (any significant term other than ``factor``'s; its 95 % intervals) where the design has it; mean
    blocks and wall seconds."""
    truth = math.log1p(change)
    rfam_all = change == 0
    n = len(sweeps)
    fam = err = cov = cov_n = rfam = rcov = rcov_n = done = 0
    counts = dict.fromkeys(VERDICT_KEYS, 0)
    right = "slower" if change > 0 else "faster" if change < 0 else None
    for s in sweeps:  # at a true 0 every factor's truth is 0: a verdict on the changed factor is false too
        fam += any(d.verdict in ("slower", "faster") for d in s["seen"] if d.name != factor or change == 0)
        done += bool(s["decisions"]) and all(d.verdict != "undecided" for d in s["decisions"])
        mine = next((d for d in s["decisions"] if d.name == factor), None)
        v = mine.verdict if mine is not None else "undecided"
        counts[v] += 1
        err += (change != 0 and v == ("faster" if change > 0 else "slower")) or (
            change >= threshold - 1e-12 and v == "no_change")
        for d in s["decisions"]:
            if d.lo is not None:
                cov_n += 1
                cov += d.lo <= (truth if d.name == factor else 0.0) <= d.hi
        for name, eff, lo, hi, sig in s.get("terms") or ():
            if lo is not None and name in {d.name for d in s["decisions"]}:
                rcov_n += 1
                rcov += lo <= (truth if name == factor else 0.0) <= hi
        if s.get("terms"):
            rfam += any(sig for name, _, _, _, sig in s["terms"] if name != factor or rfam_all)
    out = {"n": n, "family_k": fam, "family": fam / n, "family_ci": wilson(fam, n),
           "decided_all": done / n, "verdicts": {k: v / n for k, v in counts.items()},
           "power": counts[right] / n if right else float("nan"),
           "error": err / n, "error_ci": wilson(err, n), "coverage": cov / cov_n if cov_n else float("nan"),
           "blocks": float(np.mean([s["blocks"] for s in sweeps])),
           "wall_s": float(np.mean([s["wall_s"] for s in sweeps]))}
    if any(s.get("terms") for s in sweeps):
        out.update(report_family=rfam / n, report_family_ci=wilson(rfam, n),
                   report_coverage=rcov / rcov_n if rcov_n else float("nan"))
    return out


def design_of(blocks: list[list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The cells (levels of the varied factors, one dict per cell) and varied factors of the recorded design."""
    levels = {r["cell_id"]: r["levels"] for r in blocks[0]}
    factors = sorted(f for f in {k for lv in levels.values() for k in lv}
                     if len({lv.get(f) for lv in levels.values()}) > 1)
    return [{f: levels[c][f] for f in factors} for c in sorted(levels)], factors


MULTS = (0.0, 0.5, 1.0, 1.5, 2.0)


def validity(fix: dict[str, Any], *, sweeps: int = 1000, threshold: float = 0.05, alpha: float = 0.05,
             factor: str = "dynamic_bsz", seed: int = 0, precision: float | None = None, r_max: int = 30,
             fixed_sweeps: int | None = None, log: Any = print, fixed: bool = True) -> dict[str, Any]:
    """The validity benchmark on the recorded runs of ``fix`` (module text): the plan (``precision``, default
    ``threshold / 2``, at the recorded timed steps per run), ``sweeps`` sequential sweeps per true change of
    ``factor`` in :data:`MULTS` x threshold, fixed designs of the plan's maximum of blocks, and the smallest fixed
    design (2 to ``r_max`` blocks, ``fixed_sweeps`` sweeps each, default ``sweeps``) whose power at 2T reaches the
    sequential design's (within one Monte Carlo standard error) at a family false-effect rate at 0 of at most
    ``alpha`` (within one such error). Returns ``{"plan", "rows", "fixed_r", "model"}`` (rows: one per design and
    change, the :func:`score` dicts plus ``design`` and ``mult``); ``log`` gets the printed lines."""

    sequential.run_observations = cached_observations  # the real reader, once per recorded run and scale
    gc.freeze()  # statsmodels' Holm step calls gc.collect() on every fit
    try:
        return _validity(fix, sweeps, threshold, alpha, factor, seed, precision, r_max, fixed_sweeps, log, fixed)
    finally:
        sequential.run_observations = _RUN_OBSERVATIONS


def _validity(fix: dict[str, Any], sweeps: int, threshold: float, alpha: float, factor: str, seed: int,
              precision: float | None, r_max: int, fixed_sweeps: int | None, log: Any,
              with_fixed: bool = True) -> dict[str, Any]:
    from bench.planning.allocation import plan_allocation

    blocks = centred_blocks(fix)
    cells, factors = design_of(blocks)
    if factor not in factors:
        raise SystemExit(f"--factor {factor}: not varied in the recorded runs (varied: {', '.join(factors)})")
    per = len(cells)
    timed = int(np.median([len(r["timed_steps"]) for b in blocks for r in b]))
    model = recorded_model(fix)
    ok = [r for b in blocks for r in b if r["status"] == "ok"]
    prof = int(np.median([len(r["profiled_steps"]) for r in ok]))
    warm = int(np.median([len(r["steps_s"]) - len(r["timed_steps"]) for r in ok])) - prof
    alloc, reached = plan_allocation(model, cells, factors, precision=precision or threshold / 2, alpha=alpha,
                                     warmup=max(0, warm), profiled=prof, steps_range=(timed, timed))
    K = alloc.repeats
    log(f"{len(fix['runs'])} recorded runs, {len(blocks)} complete blocks of {per} cells ({', '.join(factors)}), "
        f"{timed} timed steps a run; model: run x step {model.sd_step:.4f}, run {model.sd_run:.4f}, block "
        f"{model.sd_block:.4f} (log SD); plan for +-{(precision or threshold / 2):.1%} at {timed} timed steps: up "
        f"to {K} blocks ({'reached' if reached else 'NOT reached'}); threshold {threshold:.0%}, alpha {alpha}, "
        f"change of {factor}, {sweeps} sweeps a row, seed {seed}")
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    for mult in MULTS:
        change = mult * threshold
        rng = np.random.default_rng([seed, int(mult * 10)])
        res = [sequential_sweep(resample(rng, blocks, K, factor, change), per, K, threshold, alpha)
               for _ in range(sweeps)]
        rows.append({"design": "sequential", "mult": mult, **score(res, factor, change, threshold)})
        log(_line(rows[-1]) + f"  [{time.time() - t0:.0f} s]")
    model_out = {"sd_step": model.sd_step, "sd_run": model.sd_run, "sd_block": model.sd_block,
                 "sd_stepidx": model.sd_stepidx}
    if not with_fixed:
        return {"plan": {"timed_steps": timed, "max_blocks": K, "reached": reached}, "rows": rows, "fixed_r": {},
                "model": model_out}
    cache: dict[tuple[int, float], dict[str, Any]] = {}
    nf = fixed_sweeps or sweeps

    def fixed(r: int, mult: float) -> dict[str, Any]:
        if (r, mult) not in cache:
            rng = np.random.default_rng([seed, 1000 + r, int(mult * 10)])
            res = [fixed_sweep(resample(rng, blocks, r, factor, mult * threshold), threshold, alpha) for _ in range(nf)]
            cache[(r, mult)] = {"design": f"fixed R={r}", "mult": mult, **score(res, factor, mult * threshold,
                                                                                threshold)}
        return cache[(r, mult)]

    seq = {r["mult"]: r for r in rows}
    se = lambda p, n: math.sqrt(max(p * (1 - p), 1e-4) / n)  # noqa: E731
    powerful = lambda r: (fixed(r, 2.0)["power"] >= seq[2.0]["power"] - se(seq[2.0]["power"], sweeps)  # noqa: E731
                          and fixed(r, 0.0)["family"] <= alpha + se(alpha, nf))
    decides = lambda r: powerful(r) and all(  # noqa: E731
        fixed(r, m)["decided_all"] >= seq[m]["decided_all"] - se(seq[m]["decided_all"], sweeps) for m in (0.0, 2.0))
    found = {"power": _smallest(powerful, r_max), "decided": _smallest(decides, r_max)}
    for r in dict.fromkeys([K, *(v for v in found.values() if v)]):
        for mult in MULTS:
            rows.append(fixed(r, mult))
            log(_line(rows[-1]))
    for what, r_f in found.items():
        for row in rows[: len(MULTS)]:
            row[f"wall_vs_fixed_{what}"] = row["wall_s"] / fixed(r_f, row["mult"])["wall_s"] if r_f else None
        how = "as powerful at 2T" if what == "power" else "as powerful and deciding every effect as often (0, 2T)"
        log(f"smallest fixed design {how} with family false effects <= alpha: "
            + (f"R={r_f} blocks ({fixed(r_f, 2.0)['wall_s'] / 60:.1f} min); sequential wall / fixed wall: "
               + ", ".join(f"{r['mult']:.1f}T {r[f'wall_vs_fixed_{what}']:.2f}" for r in rows[: len(MULTS)])
               if r_f else f"none up to {r_max} blocks") + f"  [{time.time() - t0:.0f} s]")
    return {"plan": {"timed_steps": timed, "max_blocks": K, "reached": reached}, "rows": rows, "fixed_r": found,
            "model": {"sd_step": model.sd_step, "sd_run": model.sd_run, "sd_block": model.sd_block,
                      "sd_stepidx": model.sd_stepidx}}


def _smallest(ok: Any, r_max: int) -> int | None:
    """The fewest blocks R in 2..``r_max`` with ``ok(R)`` (doubling, then bisection; ``ok`` is taken as monotone up
    to simulation noise); ``None`` when not even ``r_max``."""
    lo, hi = 1, 2
    while not ok(hi) and hi < r_max:
        lo, hi = hi, min(2 * hi, r_max)
    if not ok(hi):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if mid >= 2 and ok(mid) else (mid, hi)
    return hi


def _line(r: dict[str, Any]) -> str:
    lo, hi = r["family_ci"]
    v = r["verdicts"]
    rep = (f" report-fit family {r['report_family']:.1%}, cover {r['report_coverage']:.1%};"
           if "report_family" in r else "")
    return (f"{r['design']:>12} {r['mult']:.1f}T: family false effect {r['family']:.1%} [{lo:.1%}, {hi:.1%}]; "
            f"{' '.join(f'{k} {x:.1%}' for k, x in v.items())}; all decided {r['decided_all']:.1%}; "
            f"error {r['error']:.1%}; cover "
            f"{r['coverage']:.1%};{rep} blocks {r['blocks']:.1f}, wall {r['wall_s'] / 60:.1f} min")


def plot_oc(rows: list[dict[str, Any]], threshold: float, alpha: float, path: Path) -> None:
    """The operating characteristic of the sequential design: the probability of each verdict on the changed
    factor against its true change, plus the family false-effect rate (other factors), as a small PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seq = [r for r in rows if r["design"] == "sequential"]
    xs = [r["mult"] * threshold for r in seq]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for k, mk in zip(VERDICT_KEYS, "o^sx"):
        ax.plot(xs, [r["verdicts"][k] for r in seq], mk + "-", label=k.replace("_", " "))
    ax.plot(xs, [r["family"] for r in seq], "k.:", label="any false effect (others)")
    ax.axhline(alpha, ls=":", c="grey")
    ax.axvline(threshold, ls="--", c="lightgrey")
    ax.set_xlabel("true change of the factor (step time)")
    ax.set_ylabel("probability (per sweep)")
    ax.xaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


DEFAULT_FIXTURE = Path(__file__).resolve().parent / "data" / "recorded_runs_embedded.json"


def cli(argv: list[str]) -> int:
    """``bench_verdict.py record SWEEP_DIR... [--target NAME] [--out FILE]`` writes the fixture;
    ``bench_verdict.py resampled [--fixture FILE] [--sweeps N] [--plot PNG] [--json FILE] ...`` runs the validity
    benchmark. Bad input: one line naming the file or option, exit 2, nothing written."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="bench_verdict.py", description="validity of sweeps from resampled real runs")
    sub = p.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="write finished sweeps' runs as a fixture")
    rec.add_argument("sweep_dirs", type=Path, nargs="+")
    rec.add_argument("--target", default="embedded")
    rec.add_argument("--out", type=Path, default=None, help="default benchmarks/data/recorded_runs_<target>.json")
    sim = sub.add_parser("resampled", help="the validity benchmark (module text of benchmarks/sweep_validity.py)")
    sim.add_argument("--fixture", type=Path, default=DEFAULT_FIXTURE)
    sim.add_argument("--sweeps", type=int, default=1000)
    sim.add_argument("--fixed-sweeps", type=int, default=None, help="sweeps per fixed design (default --sweeps)")
    sim.add_argument("--threshold", type=float, default=0.05)
    sim.add_argument("--alpha", type=float, default=0.05)
    sim.add_argument("--precision", type=float, default=None, help="plan precision (default threshold / 2)")
    sim.add_argument("--factor", default="dynamic_bsz", help="the factor whose change is injected")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--plot", type=Path, default=None, help="write the OC curve here (PNG)")
    sim.add_argument("--json", type=Path, default=None, help="also write the rows here")
    sim.add_argument("--sequential-only", action="store_true",
                     help="the sequential rows only (no fixed designs, no search for the equal fixed design)")
    a = p.parse_args(argv)
    if a.cmd == "record":
        missing = [str(d) for d in a.sweep_dirs if not (d / "sweep.json").is_file()]
        if missing:
            print(f"record: not a sweep folder (no sweep.json): {', '.join(missing)}")
            return 2
        out = a.out or DEFAULT_FIXTURE.with_name(f"recorded_runs_{a.target}.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(extract_runs(a.sweep_dirs, a.target), indent=None, separators=(",", ":")) + "\n")
        print(f"wrote {out}")
        return 0
    if a.sweeps < 1 or not 0 < a.alpha < 1 or not 0 < a.threshold < 1:
        print("resampled: --sweeps must be >= 1, --alpha and --threshold in (0, 1)")
        return 2
    fix = load_fixture(a.fixture)
    h = fix["header"]
    print(f"fixture {a.fixture.name}: target {h['target']}, {h['machine']}, load average {h['load_average_mean']}, "
          + "; ".join(f"{s['matrix']}/{s['sweep_id']} {s['started_utc']} UTC commit {str(s['commit'])[:9]}"
                      for s in h["sweeps"]))
    t0 = time.time()
    out = validity(fix, sweeps=a.sweeps, threshold=a.threshold, alpha=a.alpha, factor=a.factor, seed=a.seed,
                   precision=a.precision, fixed_sweeps=a.fixed_sweeps, fixed=not a.sequential_only)
    print(f"{time.time() - t0:.0f} s on {os.cpu_count()} cores, load average now {os.getloadavg()[0]:.1f}")
    if a.plot:
        plot_oc(out["rows"], a.threshold, a.alpha, a.plot)
        print(f"plot: {a.plot}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0
