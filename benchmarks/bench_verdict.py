"""Time to a trustworthy verdict (issue 17): planned + sequential sweeps versus fixed blocked designs, simulated.

Not a test. For each target and each true effect (0, threshold/2, threshold, 2 x threshold of one factor; every
other factor has no effect) it simulates ``--sweeps`` sweeps (default 200) of

* **sequential**: the plan of ``--precision`` (default threshold / 2, so that every comparison can be decided
  by the last block; :func:`bench.planning.allocation.plan_allocation`) run block by block with the effects'
  stop rule (:class:`bench.planning.sequential.EffectsStopRule`: repeated confidence intervals, O'Brien-Fleming
  spending, Bonferroni over the main effects), stopping when every main effect is decided;
* **fixed R=2, 3, 5**: the matrix's own timed steps per run and R repeats, decided once at the end with the same
  rule (one look: the plain t interval at alpha / m).

Each run's value is the median of its timed steps: log step time = cell effect + block offset (``sd_block``) +
drift (``+15 %`` over the sweep in run order, as in ``tests/drift_fake.py``) + run offset (``sd_run``) + the step
pattern every run of the sweep replays (``sd_stepidx``, drawn once per simulated sweep: same batches) + run x
step noise (``sd_step``); the costs of a run (start-up, warm-up, profiled and timed steps, harness) give each
sweep's wall time. Components and costs (:mod:`bench.planning.model`):

* ``embedded``: measured by :func:`bench.planning.model.estimate_model` from the finished sweeps of
  ``matrix/full.yaml`` in ``--results`` (speed-normalized, as the report and the stop rule see them); the
  2 x 2 design of full.yaml on the embedded engine (4 runs per block, 8 timed steps per run);
* ``verl_cpu``: measured the same way from the finished sweeps of matrix/verl_cpu.yaml's target in
  ``--results`` (any steps and repeats) or from ``--verl-sweep``; without one, :data:`VERL_PROBED` (the
  components and costs of a quiet sweep of 2026-12-03, speed-normalized by the in-run probe as every figure now
  is; ``--verl-loaded``: :data:`VERL_MEASURED`, raw, measured on 2026-12-01 under load); the one-at-a-time design
  of matrix/verl_cpu.yaml (5 runs per block, its timed steps).

``--bracket-probe SWEEP_DIR ...`` instead says whether the harness's machine-speed probe around each run
(:mod:`bench.execution.machine_probe`, the verl engine's runs) tracks the runs' speed in those sweeps: the gate's
own test (:func:`bench.gate.stored_runs.runs_probe_check`: each cell's runs centred on their own mean,
one-sided Pearson, corrected spread smaller than raw) on the log run values (median timed step) against the log
of the probe's before/after geometric mean, and against each window alone.

``--stop-variant keep`` / ``retire`` simulates the sequential design with a variant of the stop rule
(:class:`KeptDecisionsRule`: decisions kept once made; ``retire``: decided one-at-a-time cells leave the later blocks),
``--verl-quiet`` the verl target with the raw components measured on a quiet host before the in-run probe was
applied (:data:`VERL_QUIET`), ``--verl-loaded`` those measured under load (:data:`VERL_MEASURED`).

``--real SWEEP_DIR ...`` instead prints, for finished real sweeps, their runs, wall time (first run's start to
last run's end) and decisions: a sequential sweep's last look, a fixed sweep decided once at its end with the
same rule (one look, alpha shared by the main effects).

Printed per scenario and design: mean runs and wall time, share of comparisons decided, false "effect" rate
(a verdict slower/faster on a factor whose true effect is 0), wrong-direction rate, coverage of the decision
interval at the look the sweep stopped, and for the sequential design the ratio of its runs to those of the
smallest fixed design that decides at least as often (``-`` when none of 2, 3, 5 repeats does).

    python benchmarks/bench_verdict.py --results results            # about 2-4 minutes on 2 busy cores
    python benchmarks/bench_verdict.py --real results/full/20261201-201000-abc results/full/20261201-201500-def

Issue 30's validity benchmark from resampled REAL recorded runs (:mod:`sweep_validity`, docs/method.md): ``record
SWEEP_DIR...`` writes benchmarks/data/recorded_runs_<target>.json, ``resampled --plot docs/img/sweep_oc.png`` runs it.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # before numpy: the fits are small, and
    os.environ.setdefault(_var, "1")  # BLAS threads spinning on a loaded machine cost 4-5 x the CPU time

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.planning import sequential  # noqa: E402
from bench.planning.allocation import plan_allocation  # noqa: E402
from bench.planning.apply import target_key, target_sweeps  # noqa: E402
from bench.planning.model import NoiseCost, estimate_model  # noqa: E402
from bench.planning.sequential import EffectsStopRule  # noqa: E402

DRIFT = math.log(1.15)  # tests/drift_fake.py: +15 % over the sweep
FIXED = (2, 3, 5)
#: verl:cpu as measured on 2026-12-01 (docs/lab-notes/planning.md, "Noise and cost measured": matrix/verl_cpu.yaml
#: with 2 repeats x 12 steps, 8 of 10 runs, niced under a load average of 20-27; those records were not kept)
VERL_MEASURED = NoiseCost(sd_step=0.175, sd_run=0.0, sd_block=0.071, startup_s=271.0, step_s=1.33, warmup_step_s=14.4,
                          profiled_step_s=5.3, harness_s=5.6, runs=8, sd_stepidx=0.077,
                          sweeps=["verl_cpu measured 2026-12-01 under load (docs/lab-notes/planning.md; records not "
                                  "kept)"])
#: verl:cpu on a quiet host (docs/lab-notes/planning.md, "Where verl:cpu's run-to-run spread comes from", sweep 3 of
#: 2026-12-02 10:44-11:05: components and the start-up and step costs measured; those records were not kept, and
#: the warm-up, profiled-step and harness costs are the idle figures of matrix/verl_cpu.yaml's comment)
VERL_QUIET = NoiseCost(sd_step=0.137, sd_run=0.057, sd_block=0.0, startup_s=73.7, step_s=0.80, warmup_step_s=10.0,
                       profiled_step_s=2.4, harness_s=5.0, runs=10, sd_stepidx=0.055,
                       sweeps=["verl_cpu quiet host 2026-12-02 (docs/lab-notes/planning.md; records not kept)"])
#: verl:cpu as the harness measures it since its runs carry the in-run speed probe (patches/bench_patches/
#: verl_speed_probe.py; values speed-normalized, as the report, the planner and the stop rule see them): the fixed
#: sweep of matrix/verl_cpu.yaml of 2026-12-03 08:10-08:40 (10 runs x 20 timed steps, quiet; docs/lab-notes/planning.md,
#: "Real check, 2026-12-03"), as ``estimate_model`` gives it
VERL_PROBED = NoiseCost(sd_step=0.1551, sd_run=0.0049, sd_block=0.0420, startup_s=113.6, step_s=1.17,
                        warmup_step_s=11.89, profiled_step_s=3.20, harness_s=3.9, runs=10, sd_stepidx=0.1058,
                        sweeps=["verl_cpu 2026-12-03 08:10, speed-normalized by the in-run probe "
                                "(docs/lab-notes/planning.md)"])
#: the in-run probe's per-step metric before it was applied as the speed probe (patches/bench_patches/
#: verl_speed_probe.py wrote it under this name until it logged ``bench/speed_probe_s``): sweeps of that time
DRIVER_PROBE = "bench/driver_probe_s"
R_MAX = 400  # most repeats searched for the smallest fixed design reaching the same rates
_RUN_OBSERVATIONS = sequential.run_observations


def matrix_model(name: str, results: Path) -> tuple[NoiseCost | None, Any]:
    """The noise and cost model of ``matrix/<name>.yaml``'s target from its finished sweeps in ``results``
    (``None`` without one), and the matrix."""
    from bench.spec.loading import load_matrix
    from bench.spec.plan import make_plan

    m = load_matrix(ROOT / "matrix" / f"{name}.yaml")
    plan = make_plan(m, platform="cpu", strict=False)
    key = target_key(plan.engine, plan.platform, m.base.model_dump(mode="json"))
    return estimate_model(target_sweeps(results, key)), m


def timed_of(m: Any) -> int:
    """Timed steps per run of a matrix: steps - warm-up - profiled."""
    return m.base.steps - m.base.warmup_steps - len(m.base.profile_steps or [])


def embedded_target(results: Path) -> tuple[NoiseCost, dict[str, Any]]:
    """The noise and cost model of matrix/full.yaml's target from its finished sweeps in ``results``."""
    model, m = matrix_model("full", results)
    if model is None:
        raise SystemExit(f"no finished sweep of matrix/full.yaml in {results}: run "
                         "`python run_bench.py matrix/full.yaml`")
    return model, {**embedded_design(), "timed": timed_of(m)}


def idle_target() -> tuple[NoiseCost, dict[str, Any]]:
    """full.yaml on an idle machine, from issue 17's figures (step 0.19, run 0.0237 log SD; 12 runs in 232 s,
    28.1 % overhead: about 5.4 s outside steps per run, 1.3 s per step)."""
    model = NoiseCost(sd_step=0.19, sd_run=0.0237, sd_block=0.01, startup_s=3.0, step_s=1.3, warmup_step_s=1.3,
                      profiled_step_s=2.0, harness_s=2.4, sweeps=["issue 17 figures (idle machine)"])
    design = embedded_design()
    return model, design


def embedded_design() -> dict[str, Any]:
    """matrix/full.yaml's 2 x 2 design on the embedded engine (8 timed steps per run)."""
    factors = ["rmsnorm_fused", "dynamic_bsz"]
    cells = [{"rmsnorm_fused": a, "dynamic_bsz": b} for a in (0, 1) for b in (0, 1)]
    return {"factors": factors, "cells": cells, "timed": 8, "warmup": 1, "profiled": 1, "vary": "dynamic_bsz"}


def as_speed_probe(rec: dict[str, Any]) -> dict[str, Any]:
    """A copy of a verl run record whose in-run probe (``bench/driver_probe_s``) stands as the speed probe
    (``bench/speed_probe_s``) at each step, so that the model is estimated on speed-normalized values as the
    report and the stop rule would see them if that probe were applied (``--in-run-probe``)."""
    from bench.records.speed import PROBE_METRIC

    steps = {k: ({**v, PROBE_METRIC: v[DRIVER_PROBE]} if isinstance(v, dict) and DRIVER_PROBE in v
                 else v) for k, v in (rec.get("steps") or {}).items()}
    return {**rec, "steps": steps}


def verl_target(results: Path, sweep: Path | None = None, quiet: bool = False,
                in_run_probe: bool = False, loaded: bool = False) -> tuple[NoiseCost, dict[str, Any]]:
    """matrix/verl_cpu.yaml's one-at-a-time design with the model measured from the finished runs of ``sweep``
    (any status) or from the finished sweeps of its target in ``results``, else :data:`VERL_PROBED`;
    ``quiet``: :data:`VERL_QUIET` (raw) whatever else there is, ``loaded``: :data:`VERL_MEASURED` (raw);
    ``in_run_probe``: ``sweep``'s values normalized by its runs' in-run probe logged under its old name
    (:func:`as_speed_probe`; sweeps since it is the speed probe are normalized anyway)."""
    from bench.records.results import load_records

    factors = ["rmsnorm_fused", "dynamic_bsz", "forward_prefetch", "graph_mode"]
    cells = [{f: 0 for f in factors}] + [{f: int(f == g) for f in factors} for g in factors]
    model, m = matrix_model("verl_cpu", results)
    if sweep is not None:
        recs = load_records(sweep)
        if in_run_probe:
            recs = [as_speed_probe(r) for r in recs]
        model = estimate_model([(f"{sweep.parent.name}/{sweep.name}", recs)])
        if model is None:
            raise SystemExit(f"--verl-sweep {sweep}: no cell with two finished runs (no run-to-run spread)")
    if model is None:
        model = VERL_PROBED
    if quiet:
        model = VERL_QUIET
    if loaded:
        model = VERL_MEASURED
    return model, {"factors": factors, "cells": cells, "timed": timed_of(m), "warmup": m.base.warmup_steps,
                   "profiled": len(m.base.profile_steps or []), "vary": "dynamic_bsz"}


def fast_observations(records: Any) -> tuple[list[dict[str, Any]], list[float], list[int], list[str]]:
    """:func:`bench.planning.sequential.run_observations` for the simulated records of :func:`simulate` (one ok run
    value each, its log kept as ``_log``, no speed probe, no node): the same levels, log values, blocks and nodes
    without reading a record's per-step metrics (3-4 x faster for sweeps of hundreds of runs); any other record
    goes through the original."""
    if not all("_log" in r for r in records):
        return _RUN_OBSERVATIONS(records)
    return ([dict(r["levels"]) for r in records], [r["_log"] for r in records], [int(r["repeat"]) for r in records],
            ["None"] * len(records))


class KeptDecisionsRule(EffectsStopRule):
    """A variant of the effects' stop rule, simulated only (``--stop-variant keep`` / ``retire``): a main effect,
    once decided at a look, keeps that decision (the repeated intervals hold at every look at once, so the first
    deciding look may be read; Jennison & Turnbull 2000, ch. 9), and the sweep stops when every main effect has been
    decided at some look. ``retire``: in a one-at-a-time design a cell whose factor is decided runs in no later
    block (its runs inform only that comparison); the reference cell runs on."""

    def __init__(self, *args: Any, retire: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.retire, self.kept = retire, {}

    def after_block(self, records: list[dict[str, Any]], look: int) -> Any:
        from bench.planning.sequential import Look

        ds, runs, _ = self.decisions(records, look)
        out = []
        for d in ds:
            if d.name not in self.kept and d.verdict != "undecided":
                self.kept[d.name] = d
            out.append(self.kept.get(d.name, d))
        stop = bool(out) and all(d.verdict != "undecided" for d in out) or look >= self.max_looks
        return Look(look=look, max_looks=self.max_looks, stop=stop, reason="", decisions=out, line="",
                    more_blocks={}, runs=runs)


def simulate(model: NoiseCost, design: dict[str, Any], effect: float, n: int, repeats: int, rng: np.random.Generator,
             stop: EffectsStopRule | None, alpha: float, threshold: float) -> dict[str, Any]:
    """One sweep: blocks of the design's cells in shuffled order until the stop rule stops it (or ``repeats``
    blocks without a rule, decided once at the end). Returns runs, wall time and the last decisions."""
    cells, vary = design["cells"], design["vary"]
    total = repeats * len(cells)
    if isinstance(stop, KeptDecisionsRule):  # its decisions are this sweep's: a fresh rule per sweep
        stop = KeptDecisionsRule(stop.max_looks, threshold=stop.threshold, alpha=stop.alpha, retire=stop.retire)
    recs: list[dict[str, Any]] = []
    pos = 0
    look = None
    pattern = rng.normal(0, model.sd_stepidx, n)  # the batches every run of this sweep replays
    for k in range(repeats):
        beta = rng.normal(0, model.sd_block)
        if isinstance(stop, KeptDecisionsRule) and stop.retire:  # decided one-at-a-time cells leave the sweep
            live = [i for i, c in enumerate(cells) if not any(c.get(f) for f in stop.kept)]
            order = rng.permutation(live)
            meds = np.median(pattern + rng.normal(0, model.sd_step, (len(live), n)), axis=1)
        else:
            order = rng.permutation(len(cells))
            meds = np.median(pattern + rng.normal(0, model.sd_step, (len(cells), n)), axis=1)  # a run's value: median
        for i, med in zip(order, meds):
            c = cells[i]
            mu = effect * c.get(vary, 0) + beta + DRIFT * pos / max(total - 1, 1) + rng.normal(0, model.sd_run)
            recs.append({"status": "ok", "repeat": k, "levels": c, "_log": mu + float(med),
                         "summary": {"step_time_samples_s": [math.exp(mu + float(med))]}})
            pos += 1
        if stop is not None:
            look = stop.after_block(recs, k + 1)
            if look.stop:
                break
    if stop is None:
        rule = EffectsStopRule(1, threshold=threshold, alpha=alpha)
        look = rule.after_block(recs, 1)
    runs = len(recs)
    wall = runs * model.run_cost(n, design["warmup"], design["profiled"])
    return {"runs": runs, "wall_s": wall, "decisions": look.decisions}


def score(results: list[dict[str, Any]], design: dict[str, Any], effect: float) -> dict[str, float]:
    """Mean runs / wall time and the rates over the simulated sweeps of one design."""
    n_dec = n_all = false = false_n = wrong = wrong_n = cover = cover_n = 0
    for r in results:
        for d in r["decisions"]:
            truth = effect if d.name == design["vary"] else 0.0
            n_all += 1
            n_dec += d.verdict != "undecided"
            if truth == 0:
                false_n += 1
                false += d.verdict in ("slower", "faster")
            else:
                wrong_n += 1
                wrong += d.verdict == ("faster" if truth > 0 else "slower")
            if d.lo is not None:
                cover_n += 1
                cover += d.lo <= truth <= d.hi
    return {"runs": float(np.mean([r["runs"] for r in results])),
            "wall_min": float(np.mean([r["wall_s"] for r in results])) / 60,
            "decided": n_dec / max(n_all, 1), "false": false / max(false_n, 1) if false_n else float("nan"),
            "wrong": wrong / max(wrong_n, 1) if wrong_n else float("nan"),
            "coverage": cover / max(cover_n, 1) if cover_n else float("nan")}


def fixed_repeats_for(model: NoiseCost, design: dict[str, Any], precision: float, alpha: float) -> int | None:
    """Repeats a fixed design with the matrix's timed steps needs for a one-look interval (t at alpha / m) of
    half-width ``log(1 + precision)`` (``None``: more than 400). A complete block design: the blocks are
    orthogonal to the cells, so the standard-error factors scale as ``sqrt(2 / R)`` from those of 2 blocks and
    each further block adds ``cells - 1`` residual degrees of freedom."""
    from scipy import stats as sps

    from bench.planning.allocation import design_factors

    sd = math.sqrt(model.run_var(design["timed"]))
    facs2, df2 = design_factors(design["cells"], design["factors"], 2)
    if not facs2:
        return None
    for r in range(2, 401):
        df = df2 + (r - 2) * (len(design["cells"]) - 1)
        if df >= 1:
            q = float(sps.t.isf(alpha / len(facs2) / 2, df))
            if q * sd * max(facs2.values()) * math.sqrt(2 / r) <= math.log1p(precision):
                return r
    return None


def reaches(fixed: dict[str, float], seq: dict[str, float]) -> bool:
    """Whether a fixed design's simulated rates reach the sequential design's: it decides at least as often (within
    one percentage point). Its error rates (false "effect", wrong direction, coverage) are those of a one-look t
    interval at alpha / m, which holds them by construction; they are printed, not matched (matching them
    would chase the simulation noise of rates near 0: 200 sweeps give a false rate about +-1 %)."""
    return fixed["decided"] >= seq["decided"] - 0.01


class FixedDesigns:
    """Simulated rates of fixed blocked designs (``n`` timed steps per run, ``R`` repeats, decided once at the end),
    cached per ``(true effect, n, R)`` and seeded by them, so every search sees the same simulated sweeps."""

    def __init__(self, model: NoiseCost, design: dict[str, Any], args: argparse.Namespace):
        self.model, self.design, self.args = model, design, args
        self.cache: dict[tuple[float, int, int], dict[str, float]] = {}

    def rates(self, effect: float, n: int, r: int) -> dict[str, float]:
        """:func:`score` of ``args.sweeps`` simulated sweeps of the fixed design."""
        key = (effect, n, r)
        if key not in self.cache:
            a = self.args
            rng = np.random.default_rng([a.seed, int(round(effect * 1e6)), n, r])
            count = a.sweeps if r in FIXED or not getattr(a, "search_sweeps", None) else a.search_sweeps
            self.cache[key] = score([simulate(self.model, self.design, effect, n, r, rng, None, a.alpha, a.threshold)
                                     for _ in range(count)], self.design, effect)
        return self.cache[key]

    def smallest(self, scenarios: dict[float, dict[str, float]], n: int, start: int = 2) -> int | None:
        """The fewest repeats ``R`` (2 to :data:`R_MAX`) with ``n`` timed steps whose rates :func:`reaches` the
        sequential design's in every scenario (true effect -> its sequential rates): one fixed design, chosen
        before the truth is known, as a group-sequential design's average sample number is compared with the
        fixed sample size of the same power (Jennison & Turnbull 2000, ch. 1). Doubling from ``start``, then
        bisection (the decided share grows with ``R`` up to simulation noise). ``None``: not even R_MAX."""
        ok = lambda r: all(reaches(self.rates(e, n, r), seq)  # noqa: E731
                           for e, seq in scenarios.items())
        lo, hi = 1, max(2, start)
        while not ok(hi):
            if hi >= R_MAX:
                return None
            lo, hi = hi, min(2 * hi, R_MAX)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if mid >= 2 and ok(mid):
                hi = mid
            else:
                lo = mid
        return hi


def run_target(name: str, model: NoiseCost, design: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Simulate every scenario of one target; print its table and the target's check; return the rows."""
    from bench.planning.allocation import steps_range_for

    thr, alpha = args.threshold, args.alpha
    precision = args.precision or thr / 2
    alloc, reached = plan_allocation(model, design["cells"], design["factors"], precision=precision, alpha=alpha,
                                     warmup=design["warmup"], profiled=design["profiled"],
                                     steps_range=steps_range_for(design["timed"]))
    cost = lambda n: model.run_cost(n, design["warmup"], design["profiled"])  # noqa: E731
    print(f"\n## {name}: noise (log SD) run x step {model.sd_step:.4f}, shared step pattern {model.sd_stepidx:.4f}, "
          f"run {model.sd_run:.4f}, block {model.sd_block:.4f}; "
          f"cost start-up {model.startup_s:.1f} s, step {model.step_s:.2f} s, harness {model.harness_s:.1f} s "
          f"({', '.join(model.sweeps)[:120]})")
    print(f"plan for +-{precision:.1%} (as `--precision {precision}`: at least the matrix's {design['timed']} timed "
          f"steps): {alloc.timed_steps} timed steps x up to {alloc.repeats} blocks "
          f"({'reached' if reached else 'NOT reached'}; {cost(alloc.timed_steps):.0f} s per run)")
    mults = (0.0, 0.5, 1.0, 2.0)
    effects = {m: m * math.log1p(thr) for m in mults}
    out: dict[float, dict[str, dict[str, float]]] = {}
    for mult, effect in effects.items():
        rng = np.random.default_rng([args.seed, int(mult * 10)])
        stop = (EffectsStopRule(alloc.repeats, threshold=thr, alpha=alpha) if args.stop_variant == "shipped" else
                KeptDecisionsRule(alloc.repeats, threshold=thr, alpha=alpha, retire=args.stop_variant == "retire"))
        out[mult] = {"sequential": score([simulate(model, design, effect, alloc.timed_steps, alloc.repeats, rng, stop,
                                                   alpha, thr) for _ in range(args.sweeps)], design, effect)}
    fixed = FixedDesigns(model, design, args)
    seqs = {effects[m]: out[m]["sequential"] for m in mults}
    r_prec = fixed_repeats_for(model, design, precision, alpha)
    r_same = fixed.smallest(seqs, design["timed"], start=max(2, (r_prec or 8) // 2))
    r_plan = fixed.smallest(seqs, alloc.timed_steps)
    print(f"fixed designs: the matrix's {design['timed']} timed steps ({cost(design['timed']):.0f} s per run) x "
          f"{FIXED} repeats; 'fixed plan': the plan's steps x blocks without stopping; 'same': the smallest fixed "
          f"design with the matrix's steps that reaches the sequential design's decided share and error rates in "
          f"every scenario: {r_same} repeats; with the plan's steps: {r_plan} repeats ('same/plan')")
    print(f"{'true effect':>12} {'design':>16} {'runs':>6} {'wall min':>9} {'decided':>8} {'false':>7} {'wrong':>7} "
          f"{'cover':>7} {'runs/same':>9} {'wall/same':>9} {'runs/same/plan':>14}")
    rows = []
    for mult, effect in effects.items():
        o = out[mult]
        for r in FIXED:
            o[f"fixed R={r}"] = fixed.rates(effect, design["timed"], r)
        o["fixed plan"] = fixed.rates(effect, alloc.timed_steps, alloc.repeats)
        if r_same:
            o[f"same R={r_same}"] = fixed.rates(effect, design["timed"], r_same)
        if r_plan:
            o[f"same/plan R={r_plan}"] = fixed.rates(effect, alloc.timed_steps, r_plan)
        seq = o["sequential"]
        same = o.get(f"same R={r_same}")
        plan_same = o.get(f"same/plan R={r_plan}")
        ratio = seq["runs"] / same["runs"] if same else None
        wall_ratio = seq["wall_min"] / same["wall_min"] if same else None
        ratio_plan = seq["runs"] / plan_same["runs"] if plan_same else None
        for k, v in o.items():
            f = lambda x, w: f"{x:>{w}.2f}" if x is not None else f"{'-':>{w}}"  # noqa: E731
            extra = f"{f(ratio, 9)} {f(wall_ratio, 9)} {f(ratio_plan, 14)}" if k == "sequential" else ""
            print(f"{mult:>10.1f}xT {k:>16} {v['runs']:>6.1f} {v['wall_min']:>9.1f} {v['decided']:>8.1%} "
                  f"{v['false']:>7.1%} {v['wrong']:>7.1%} {v['coverage']:>7.1%} {extra}")
            rows.append({"target": name, "effect_x_threshold": mult, "design": k, **v,
                         "runs_vs_same": ratio if k == "sequential" else None,
                         "wall_vs_same": wall_ratio if k == "sequential" else None,
                         "runs_vs_same_plan": ratio_plan if k == "sequential" else None,
                         "plan": [alloc.timed_steps, alloc.repeats], "same_repeats": r_same,
                         "same_plan_repeats": r_plan})
    seq_rows = [r for r in rows if r["design"] == "sequential"]
    ratios = [r["runs_vs_same"] for r in seq_rows]
    wrongs = [r["wrong"] for r in seq_rows if r["wrong"] == r["wrong"]]
    print(f"{name}: target (runs <= 0.5 x the smallest fixed design with the matrix's steps that reaches the same "
          f"rates): {'HOLDS' if all(x is not None and x <= 0.5 for x in ratios) else 'NOT met'} "
          f"(runs ratio {', '.join('-' if x is None else f'{x:.2f}' for x in ratios)}); sequential: false "
          f"<= {max(r['false'] for r in seq_rows):.1%}, wrong <= {max([0.0, *wrongs]):.1%}, "
          f"coverage >= {min(r['coverage'] for r in seq_rows):.1%}")
    return rows


def kappa_check(model: NoiseCost, seed: int = 0, patterns: int = 300, runs: int = 200) -> None:
    """Print, for timed steps per run ``n``, the variance of a run's median between runs (one shared step pattern per
    simulated sweep, ``patterns`` sweeps of ``runs`` runs) against the planner's model
    (:meth:`NoiseCost.run_var` without ``sd_run``: ``kappa(n, rho) sd_step^2 / n``, asymptotic in ``n``)."""
    from bench.planning.model import kappa

    rng = np.random.default_rng(seed)
    print(f"\nmedian of n steps, run x step {model.sd_step:.4f}, shared pattern {model.sd_stepidx:.4f} (log SD): "
          f"variance between runs, simulated vs the planner's kappa(n, rho) sd_step^2 / n")
    print(f"{'n':>4} {'simulated':>10} {'model':>10} {'sim/model':>9} {'a mean':>10}")
    for n in (2, 3, 4, 8, 9, 15, 16, 28, 29, 50, 100, 200):
        sim = float(np.mean([np.var(np.median(rng.normal(0, model.sd_stepidx, n)
                                              + rng.normal(0, model.sd_step, (runs, n)), axis=1), ddof=1)
                             for _ in range(patterns)]))
        mod = kappa(n, model.rho) * model.sd_step ** 2 / n
        print(f"{n:>4} {sim:>10.2e} {mod:>10.2e} {sim / mod:>9.2f} {model.sd_step ** 2 / n:>10.2e}")


def real_summary(sweep_dir: Path, threshold: float, alpha: float) -> str:
    """One line per real sweep: runs (ok), wall time from the first run's start to the last run's end, timed steps
    x blocks, and the decisions (a sequential sweep's last look; a fixed sweep decided once at its end)."""
    from bench.core.files import read_json
    from bench.records.results import SWEEP, load_records

    meta = read_json(Path(sweep_dir) / SWEEP) or {}
    recs = load_records(Path(sweep_dir))
    ok = [r for r in recs if r.get("status") == "ok"]
    starts = [r["started_at"] for r in recs if r.get("started_at")]
    ends = [r["started_at"] + float(r.get("wall_s") or 0) for r in recs if r.get("started_at")]
    wall = (max(ends) - min(starts)) if starts else float("nan")
    seq = meta.get("sequential") or {}
    if seq.get("looks"):
        last = seq["looks"][-1]
        how, line = f"sequential, {len(seq['looks'])}/{seq['max_looks']} blocks", f"{last['reason']}; {last['line']}"
    else:
        blocks = len({r.get("repeat") for r in ok})
        look = EffectsStopRule(1, threshold=threshold, alpha=alpha).after_block(recs, 1)
        how, line = f"fixed, {blocks} blocks, decided once", look.line
    base = (meta.get("matrix") or {}).get("base") or {}
    return (f"{meta.get('matrix_name')}/{meta.get('sweep_id')} [{meta.get('status')}]: {len(recs)} runs "
            f"({len(ok)} ok), {wall / 60:.1f} min, {base.get('steps')} steps per run; {how}: {line}")


def bracket_summary(sweep_dirs: list[Path]) -> str:
    """Whether the bracket probe tracks the run values of these sweeps (module text), as text lines."""
    from bench.core.metadata import steal_share
    from bench.gate.stored_runs import runs_probe_check
    from bench.records.figures import run_value
    from bench.records.run_record import load_records
    from bench.records.snapshot import record_samples

    groups: dict[str, dict[str, list[tuple[float, ...]]]] = {}
    steps: list[tuple[list[float], list[float]]] = []  # per run: its timed steps' log times and log in-run probes
    for d in sweep_dirs:
        for r in load_records(d):
            mp, st = r.get("machine_probe"), record_samples(r)["step_time"]
            if r.get("status") != "ok" or not mp or not st:
                continue
            hl = r.get("host_load") or {}
            share = steal_share(hl.get("before") or {}, hl.get("after") or {})
            steal = None if share is None else -math.log1p(-min(share, 0.99))  # time lost to steal, a log factor
            inrun = driver_probes(r)
            row = (math.log(run_value(st)), math.log(mp["median_s"]), math.log(mp["before"]["median_s"]),
                   math.log(mp["after"]["median_s"]), steal,
                   math.log(float(np.median(inrun))) if inrun else None)
            if inrun:
                steps.append(([math.log(v) for v in st], [math.log(v) for v in inrun]))
            groups.setdefault(str(d), {}).setdefault(r["cell_id"], []).append(row)
    lines = [f"bracket probe over {sum(len(v) for g in groups.values() for v in g.values())} ok runs with a probe "
             f"in {len(sweep_dirs)} sweep(s); each (sweep, cell) centred on its own mean"]
    for i, what in ((1, "before/after geometric mean"), (2, "before the run"), (3, "after the run"),
                    (4, "CPU steal share over the run (-log(1 - share), from host_load)"),
                    (5, "in-run probe (median over the timed steps, timed by the driver between steps)")):
        sides = [([x[0] for x in rows], [x[i] for x in rows]) for g in groups.values() for rows in g.values()]
        if any(p is None for _, ps in sides for p in ps):
            lines.append(f"  {what}: not recorded for every run")
            continue
        lines.append(f"  {what}: {runs_probe_check(sides)['note']}")
    if steps:  # within runs: does a step's time follow the probe timed right after it (each run centred)
        xs = np.concatenate([np.asarray(a) - np.mean(a) for a, _ in steps])
        ps = np.concatenate([np.asarray(b) - np.mean(b) for _, b in steps])
        r = float(np.corrcoef(xs, ps)[0, 1]) if np.std(ps) > 0 and np.std(xs) > 0 else float("nan")
        lines.append(f"  in-run probe, step by step within runs ({len(xs)} steps of {len(steps)} runs, each run "
                     f"centred): r = {r:+.2f}; SD of a step's log time {np.std(xs):.3f}, of the probe's "
                     f"{np.std(ps):.3f}")
    return "\n".join(lines)


def driver_probes(rec: dict[str, Any]) -> list[float]:
    """The in-run probe of a verl run at each timed step (patches/bench_patches/verl_speed_probe.py:
    ``bench/speed_probe_s``, or ``bench/driver_probe_s`` in sweeps from before it was applied), aligned with
    :func:`bench.records.snapshot.record_samples`'s step times; empty unless every timed step has one."""
    from bench.records.speed import PROBE_METRIC

    by_step = {int(k): v for k, v in (rec.get("steps") or {}).items() if isinstance(v, dict)}
    timed = [by_step.get(int(s)) or {} for s in (rec.get("summary") or {}).get("timed_steps") or []]
    got = [st.get(DRIVER_PROBE, st.get(PROBE_METRIC)) for st in timed]
    return [float(v) for v in got] if got and all(isinstance(v, (int, float)) and v > 0 for v in got) else []


def main(argv: list[str] | None = None) -> int:
    if (argv if argv is not None else sys.argv[1:])[:1] in (["record"], ["resampled"]):  # issue 30 (module text)
        return __import__("sweep_validity").cli(argv if argv is not None else sys.argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, default=ROOT / "results",
                   help="results folder with finished full.yaml sweeps")
    p.add_argument("--sweeps", type=int, default=200)
    p.add_argument("--threshold", type=float, default=0.05)
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--precision", type=float, default=None, help="plan precision (default threshold / 2)")
    p.add_argument("--targets", default="embedded,embedded_idle,verl_cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--search-sweeps", type=int, default=None, metavar="N",
                   help="simulated sweeps per scenario for the search of the smallest fixed design reaching the "
                        "same rates (default --sweeps; fewer when its designs have hundreds of runs)")
    p.add_argument("--verl-sweep", type=Path, default=None, metavar="SWEEP_DIR",
                   help="verl_cpu: the model from this sweep's finished runs (any status, e.g. interrupted)")
    p.add_argument("--verl-quiet", action="store_true",
                   help="verl_cpu: the components measured on a quiet host (VERL_QUIET) instead of a sweep's")
    p.add_argument("--verl-loaded", action="store_true",
                   help="verl_cpu: the raw components measured under load on 2026-12-01 (VERL_MEASURED)")
    p.add_argument("--in-run-probe", action="store_true",
                   help="--verl-sweep: estimate the model on values normalized by the runs' in-run probe "
                        "(bench/driver_probe_s, patches/bench_patches/verl_speed_probe.py)")
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    p.add_argument("--stop-variant", choices=("shipped", "keep", "retire"), default="shipped",
                   help="the sequential design's stop rule: as shipped; 'keep': a decision once made is kept; "
                        "'retire': kept, and a decided one-at-a-time cell leaves the later blocks (simulated only)")
    p.add_argument("--real", type=Path, nargs="+", default=None, metavar="SWEEP_DIR",
                   help="print runs, wall time and decisions of these finished real sweeps instead")
    p.add_argument("--bracket-probe", type=Path, nargs="+", default=None, metavar="SWEEP_DIR",
                   help="say whether the harness's probe around each run tracks the run values of these sweeps")
    p.add_argument("--kappa-check", action="store_true",
                   help="print the simulated variance of a run's median against the planner's model, then exit")
    args = p.parse_args(argv)
    if args.kappa_check:
        kappa_check(embedded_target(args.results)[0], args.seed)
        return 0
    if args.bracket_probe:
        print(bracket_summary(args.bracket_probe))
        return 0
    if args.real:
        for d in args.real:
            print(real_summary(d, args.threshold, args.alpha))
        return 0
    gc.freeze()  # statsmodels' Holm step calls gc.collect() on every fit
    sequential.run_observations = fast_observations  # simulated records: the same values, read faster
    t0 = time.time()
    rows = []
    for name in args.targets.split(","):
        if name == "embedded":
            model, design = embedded_target(args.results)
        elif name == "embedded_idle":
            model, design = idle_target()
        else:
            model, design = verl_target(args.results, args.verl_sweep, quiet=args.verl_quiet,
                                        in_run_probe=args.in_run_probe, loaded=args.verl_loaded)
        rows += run_target(name, model, design, args)
    print(f"\n{args.sweeps} sweeps per scenario and design; threshold {args.threshold:.0%}, alpha {args.alpha}; "
          f"{time.time() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
