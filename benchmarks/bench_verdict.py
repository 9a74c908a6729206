"""Time to a trustworthy verdict (issue 17): planned + sequential sweeps versus fixed blocked designs, simulated.

Not a test. For each target and each true effect (0, threshold/2, threshold, 2 x threshold of one factor; every
other factor has no effect) it simulates ``--sweeps`` sweeps (default 200) of

* **sequential**: the plan of ``--precision`` (default threshold / 2, so that every comparison can be decided
  by the last block; :func:`bench.analyze.planning.plan_allocation`) run block by block with the effects'
  stop rule (:class:`bench.analyze.sequential.EffectsStopRule`: repeated confidence intervals, O'Brien-Fleming
  spending, Bonferroni over the main effects), stopping when every main effect is decided;
* **fixed R=2, 3, 5**: the matrix's own timed steps per run and R repeats, decided once at the end with the same
  rule (one look: the plain t interval at alpha / m).

Each run's value is the median of its timed steps: log step time = cell effect + block offset (``sd_block``) +
drift (``+15 %`` over the sweep in run order, as in ``tests/drift_fake.py``) + run offset (``sd_run``) + step
noise (``sd_step``); the costs of a run (start-up, warm-up, profiled and timed steps, harness) give each
sweep's wall time. Components and costs:

* ``embedded``: measured by :func:`bench.analyze.planning_model.estimate_model` from the finished sweeps of
  ``matrix/full.yaml`` in ``--results`` (speed-normalized, as the report and the stop rule see them); the
  2 x 2 design of full.yaml on the embedded engine (4 runs per block, 8 timed steps per run);
* ``verl_cpu``: the figures of issue 17 for costs (about 80 s start-up, 1 s per timed step, 15 s for the
  first warm-up step, 2.4 s profiled, 20 s harness between runs) and, since no repeated verl:cpu sweep exists
  to measure run-to-run spread on, assumed noise (``--verl-sd-step``, ``--verl-sd-run``); the one-at-a-time
  design of matrix/verl_cpu.yaml (5 runs per block, 2 timed steps per run).

Printed per scenario and design: mean runs and wall time, share of comparisons decided, false "effect" rate
(a verdict slower/faster on a factor whose true effect is 0), wrong-direction rate, coverage of the decision
interval at the look the sweep stopped, and for the sequential design the ratio of its runs to those of the
smallest fixed design that decides at least as often (``-`` when none of 2, 3, 5 repeats does).

    python benchmarks/bench_verdict.py --results results            # about 2-4 minutes on 2 busy cores
    python benchmarks/bench_verdict.py --sweeps 400 --targets embedded
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.analyze.planning import plan_allocation  # noqa: E402
from bench.analyze.planning_model import NoiseCost, estimate_model  # noqa: E402
from bench.analyze.sequential import EffectsStopRule  # noqa: E402
from bench.planning_apply import target_key, target_sweeps  # noqa: E402

DRIFT = math.log(1.15)  # tests/drift_fake.py: +15 % over the sweep
FIXED = (2, 3, 5)


def embedded_target(results: Path) -> tuple[NoiseCost, dict[str, Any]]:
    """The noise and cost model of matrix/full.yaml's target from its finished sweeps in ``results``."""
    from bench.spec.loading import load_matrix
    from bench.spec.plan import make_plan

    m = load_matrix(ROOT / "matrix" / "full.yaml")
    plan = make_plan(m, platform="cpu", strict=False)
    key = target_key(plan.engine, plan.platform, m.base.model_dump(mode="json"))
    model = estimate_model(target_sweeps(results, key))
    if model is None:
        raise SystemExit(f"no finished sweep of matrix/full.yaml in {results}: run "
                         "`python run_bench.py matrix/full.yaml`")
    factors = ["rmsnorm_fused", "dynamic_bsz"]
    cells = [{f: r.levels[f] for f in factors} for r in plan.runs]
    return model, {"factors": factors, "cells": cells, "timed": 8, "warmup": 1, "profiled": 1, "vary": "dynamic_bsz"}


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


def verl_target(sd_step: float, sd_run: float) -> tuple[NoiseCost, dict[str, Any]]:
    """matrix/verl_cpu.yaml's one-at-a-time design with the issue's costs and the given noise."""
    factors = ["rmsnorm_fused", "dynamic_bsz", "forward_prefetch", "graph_mode"]
    cells = [{f: 0 for f in factors}] + [{f: int(f == g) for f in factors} for g in factors]
    model = NoiseCost(sd_step=sd_step, sd_run=sd_run, sd_block=0.02, startup_s=80.0, step_s=1.0,
                      warmup_step_s=8.0, profiled_step_s=2.4, harness_s=20.0, sweeps=["issue 17 figures"])
    return model, {"factors": factors, "cells": cells, "timed": 2, "warmup": 2, "profiled": 1, "vary": "dynamic_bsz"}


def simulate(model: NoiseCost, design: dict[str, Any], effect: float, n: int, repeats: int, rng: np.random.Generator,
             stop: EffectsStopRule | None, alpha: float, threshold: float) -> dict[str, Any]:
    """One sweep: blocks of the design's cells in shuffled order until the stop rule stops it (or ``repeats``
    blocks without a rule, decided once at the end). Returns runs, wall time and the last decisions."""
    cells, vary = design["cells"], design["vary"]
    total = repeats * len(cells)
    recs: list[dict[str, Any]] = []
    pos = 0
    look = None
    for k in range(repeats):
        beta = rng.normal(0, model.sd_block)
        for i in rng.permutation(len(cells)):
            c = cells[i]
            mu = effect * c.get(vary, 0) + beta + DRIFT * pos / max(total - 1, 1) + rng.normal(0, model.sd_run)
            med = float(np.median(mu + rng.normal(0, model.sd_step, n)))
            recs.append({"status": "ok", "repeat": k, "levels": c, "summary": {"step_time_samples_s": [math.exp(med)]}})
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
    half-width ``log(1 + precision)`` (``None``: more than 400)."""
    from scipy import stats as sps

    from bench.analyze.planning import design_factors

    sd = math.sqrt(model.run_var(design["timed"]))
    for r in range(2, 401):
        facs, df = design_factors(design["cells"], design["factors"], r)
        if facs and df >= 1:
            q = float(sps.t.isf(alpha / len(facs) / 2, df))
            if q * sd * max(facs.values()) <= math.log1p(precision):
                return r
    return None


def run_target(name: str, model: NoiseCost, design: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    thr, alpha = args.threshold, args.alpha
    precision = args.precision or thr / 2
    alloc, reached = plan_allocation(model, design["cells"], design["factors"], precision=precision, alpha=alpha,
                                     warmup=design["warmup"], profiled=design["profiled"])
    print(f"\n## {name}: noise (log SD) step {model.sd_step:.4f}, run {model.sd_run:.4f}, block {model.sd_block:.4f}; "
          f"cost start-up {model.startup_s:.1f} s, step {model.step_s:.2f} s, harness {model.harness_s:.1f} s "
          f"({', '.join(model.sweeps)[:120]})")
    print(f"plan for +-{precision:.1%}: {alloc.timed_steps} timed steps x up to {alloc.repeats} blocks "
          f"({'reached' if reached else 'NOT reached'}); fixed designs: {design['timed']} timed steps x {FIXED} "
          f"repeats, and the plan's steps x blocks without stopping ('fixed plan')")
    r_same = fixed_repeats_for(model, design, precision, alpha)
    if r_same:
        runs = r_same * len(design["cells"])
        wall = runs * model.run_cost(design["timed"], design["warmup"], design["profiled"]) / 60
        print(f"a fixed design with the matrix's {design['timed']} timed steps needs {r_same} repeats ({runs} runs, "
              f"{wall:.0f} min) for the same precision at one look")
    rows = []
    hdr = f"{'true effect':>12} {'design':>12} {'runs':>6} {'wall min':>9} {'decided':>8} {'false':>7} {'wrong':>7} " \
          f"{'cover':>7} {'runs/fixed':>10}"
    print(hdr)
    for mult in (0.0, 0.5, 1.0, 2.0):
        effect = mult * math.log1p(thr)
        out: dict[str, dict[str, float]] = {}
        rng = np.random.default_rng([args.seed, int(mult * 10)])
        stop = EffectsStopRule(alloc.repeats, threshold=thr, alpha=alpha)
        out["sequential"] = score([simulate(model, design, effect, alloc.timed_steps, alloc.repeats, rng, stop, alpha,
                                           thr) for _ in range(args.sweeps)], design, effect)
        for r in FIXED:
            out[f"fixed R={r}"] = score([simulate(model, design, effect, design["timed"], r, rng, None, alpha, thr)
                                         for _ in range(args.sweeps)], design, effect)
        out["fixed plan"] = score([simulate(model, design, effect, alloc.timed_steps, alloc.repeats, rng, None, alpha,
                                            thr) for _ in range(args.sweeps)], design, effect)
        seq = out["sequential"]
        match = next((k for k in (*(f"fixed R={r}" for r in FIXED), "fixed plan")
                      if out[k]["decided"] >= seq["decided"] - 0.01), None)
        ratio = seq["runs"] / out[match]["runs"] if match else None
        for k, v in out.items():
            extra = (f"{ratio:.2f} ({match})" if ratio else "- (none)") if k == "sequential" else ""
            print(f"{mult:>10.1f}xT {k:>12} {v['runs']:>6.1f} {v['wall_min']:>9.1f} {v['decided']:>8.1%} "
                  f"{v['false']:>7.1%} {v['wrong']:>7.1%} {v['coverage']:>7.1%} {extra:>10}")
            rows.append({"target": name, "effect_x_threshold": mult, "design": k, **v,
                         "runs_vs_fixed": ratio if k == "sequential" else None, "matched": match})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, default=ROOT / "results",
                   help="results folder with finished full.yaml sweeps")
    p.add_argument("--sweeps", type=int, default=200)
    p.add_argument("--threshold", type=float, default=0.05)
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--precision", type=float, default=None, help="plan precision (default threshold / 2)")
    p.add_argument("--targets", default="embedded,embedded_idle,verl_cpu")
    p.add_argument("--verl-sd-step", type=float, default=0.10)
    p.add_argument("--verl-sd-run", type=float, default=0.03)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = p.parse_args(argv)
    gc.freeze()  # statsmodels' Holm step calls gc.collect() on every fit
    t0 = time.time()
    rows = []
    for name in args.targets.split(","):
        if name == "embedded":
            model, design = embedded_target(args.results)
        elif name == "embedded_idle":
            model, design = idle_target()
        else:
            model, design = verl_target(args.verl_sd_step, args.verl_sd_run)
        rows += run_target(name, model, design, args)
    print(f"\n{args.sweeps} sweeps per scenario and design; threshold {args.threshold:.0%}, alpha {args.alpha}; "
          f"{time.time() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
