"""Optuna search vs an exhaustive grid over the same space of dynamic-bsz token limits (embedded engine).

Not a test. Real GRPO runs on the embedded engine, through the same ``tune`` machinery as
``run_bench.py tune`` (``bench.tune.Tuner``):

1. **grid**: every point of a step-scale space (default 5 x 5 = 25 points over 1..13 x (P+R) for both
   limits) with Optuna's GridSampler, one real run per point;
2. **search**: TPE (seeded, the article's rule of thumb as trial 0) on the same space with at most a
   quarter of the grid's runs, real runs;
3. **recheck**: the grid's best point and the search's pick re-run ``--recheck`` times each, interleaved,
   so that one lucky grid run cannot decide the comparison (and the spread of re-runs of one point shows
   the machine's run-to-run noise);
4. **replay** (no new runs, said as such): TPE again for many seeds, its trials answered from the grid's
   measured values (every point of the space is a grid point), to show the spread over seeds; next to
   random sampling's exact odds.

Step times are speed-normalized as the tuner does (``bench.records.speed``: each step time divided by the
machine-speed probe timed around it, at the grid study's reference probe time), so the grid's points,
the search's trials and the rechecks are read at one machine speed.

"Within 3%": a point whose *grid-measured* step time is <= 1.03 x the grid's best. For the real search
the script reports when its best-so-far point (chosen by its own measurements) became such a point, and
also when its own measured best first came within 3% of the grid's best (noisier: its own lucky draws).

    python benchmarks/bench_tune.py                       # ~14 min on 2 cores (25 + 6 + 8 runs of ~20 s)
    python benchmarks/bench_tune.py --levels 4 --high 10  # 16-point grid
    python benchmarks/bench_tune.py --results out/bt      # elsewhere; rerunning resumes both studies

Results: ``<results>/bench_tune/bench_tune.json`` plus the usual tune outputs per study.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.commands.tune import ConsoleView  # noqa: E402
from bench.core.files import atomic_write_json, read_json  # noqa: E402
from bench.spec.loading import load_matrix  # noqa: E402
from bench.tune import PROBE_REF, Tuner, make_sampler, resolve_settings  # noqa: E402
from bench.tune.report import CONSTRAINT, is_infeasible  # noqa: E402
from bench.tune.space import PARAMS, rule_of_thumb  # noqa: E402

SOURCE = ROOT / "matrix" / "tune_dynamic_bsz.yaml"
LOAD: list[float] = []  # 1-minute load average at each trial start and end


def bench_matrix(path: Path, levels: int, high: float, steps: int, search_runs: int, seed: int) -> Path:
    """The benchmark's matrix: tune_dynamic_bsz.yaml with a step-scale space of ``levels`` points per limit."""
    raw = yaml.safe_load(SOURCE.read_text())
    raw["name"] = "bench_tune"
    raw["base"]["steps"] = steps
    step = (high - 1.0) / (levels - 1)
    dim = {"low": 1.0, "high": high, "unit": "seq", "step": step}
    raw["tune"]["space"] = {k: dict(dim) for k in PARAMS}
    raw["tune"]["n_trials"] = search_runs
    raw["tune"]["sampler"] = {"type": "tpe", "seed": seed, "n_startup_trials": 3}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def executor(settings):
    """The executor ``run_bench.py tune`` would use (the fork server for embedded CPU runs)."""
    from bench.commands.run import make_executor

    return make_executor(argparse.Namespace(spawn=False, ray_address=None), settings.matrix.engine, settings.platform)


def run_study(matrix_path: Path, results: Path, study: str, sampler: str | None, n_trials: int | None):
    m = load_matrix(matrix_path)
    if sampler == "grid":
        m.tune["sampler"] = {"type": "grid"}
        m.tune["n_trials"] = None
    s = resolve_settings(m, results=results, tracking_uri=f"sqlite:///{results}/mlflow.db", study=study,
                         storage=f"sqlite:///{results}/optuna.db", n_trials=n_trials)
    results.mkdir(parents=True, exist_ok=True)
    view = ConsoleView()

    def on_event(kind, data):  # sample the machine's load: other processes on the cores add noise to step times
        if kind in ("launch", "trial"):
            LOAD.append(os.getloadavg()[0])
        view(kind, data)

    out = Tuner(s, executor=executor(s), on_event=on_event).run()
    import optuna

    return s, optuna.load_study(study_name=study, storage=f"sqlite:///{results}/optuna.db"), out


def run_time(trials) -> float:
    """Seconds the trials took (start to end of each; also right when the study was resumed, not rerun)."""
    return sum((t.datetime_complete - t.datetime_start).total_seconds() for t in trials
               if t.datetime_complete and t.datetime_start)


def point(t) -> tuple[int, int]:
    return tuple(int(t.params[k]) for k in PARAMS)


def first_within(values: list[float | None], target: float) -> int | None:
    """1-based index of the first value <= target."""
    for i, v in enumerate(values, 1):
        if v is not None and v <= target:
            return i
    return None


def replay(settings, grid: dict, seeds: int, budget: int, target: float) -> dict:
    """TPE answered from the grid's measurements (no runs): runs needed per seed."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    needed = []
    for seed in range(seeds):
        block = settings.block.model_copy(update={"sampler": settings.block.sampler.model_copy(update={"seed": seed})})
        study = optuna.create_study(direction=settings.direction, sampler=make_sampler(block, settings.space))
        study.enqueue_trial(rule_of_thumb(settings.space, settings.matrix.base))
        best_pts: list[float | None] = []

        def objective(trial):
            p = tuple(trial.suggest_int(k, d.low, d.high, step=d.step, log=d.log) for k, d in settings.space.items())
            kind, value = grid[p]
            if kind == "feasible":
                trial.set_constraint(CONSTRAINT, 0.0)
                return value
            if kind == "infeasible":
                trial.set_constraint(CONSTRAINT, 1.0)
                raise optuna.TrialPruned()
            return float("nan")

        n = len(grid)
        for _ in range(n):
            study.optimize(objective, n_trials=1)
            try:
                best_pts.append(grid[point(study.best_trial)][1])
            except ValueError:
                best_pts.append(None)
            if best_pts[-1] is not None and best_pts[-1] <= target:
                break
        needed.append(first_within(best_pts, target) or n + 1)
    within_budget = sum(k <= budget for k in needed)
    return {"seeds": seeds, "runs_needed": needed, "median": statistics.median(needed),
            "mean": statistics.mean(needed), "share_within_budget": within_budget / seeds}


def norm_value(rec: dict, key: str, ref: float | None) -> float | None:
    """A run's median step time, speed-normalized to probe time ``ref`` (as the tuner does), or raw without a probe."""
    from bench.records.snapshot import record_samples
    from bench.records.speed import normalized_median

    if rec.get("status") != "ok":
        return None
    smp = record_samples(rec)
    value = normalized_median(smp["step_time"], smp["speed_probe"], ref, "step_time") if ref else None
    return value if value is not None else (rec.get("summary") or {}).get(key)


def recheck(settings, points: dict[str, tuple[int, int]], repeats: int, out_dir: Path,
            ref: float | None = None) -> dict[str, list]:
    """Interleaved re-runs (A, B, A, B ...) of a few points: the same drift and contention hit both."""
    from bench.execution.runner import execute_spec
    from bench.tune import trial_spec

    ex = executor(settings)
    vals: dict[str, list] = {k: [] for k in points}
    for i in range(repeats):
        for label, p in points.items():
            limits = dict(zip(PARAMS, p))
            rdir = out_dir / "recheck" / f"{label}-{i}"
            rec = read_json(rdir / "record.json")
            if not rec or rec.get("status") != "ok":
                spec = trial_spec(settings.matrix, settings.cell, limits, settings.platform)
                rec = execute_spec(spec, rdir, 0, ex, settings.matrix.base.warmup_steps)
            v = norm_value(rec, settings.objective_key, ref)
            vals[label].append(v)
            print(f"recheck {label} {limits}: {v if v is None else round(v, 3)}", flush=True)
    getattr(ex, "close", lambda: None)()
    return vals


def random_odds(n: int, good: int, k: int) -> float:
    """P(at least one of ``good`` points among ``k`` distinct random draws of ``n``)."""
    if good == 0:
        return 0.0
    return 1.0 - math.comb(n - good, k) / math.comb(n, k) if k <= n - good else 1.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument("--levels", type=int, default=5, help="grid points per limit (default 5: 25 runs)")
    ap.add_argument("--high", type=float, default=13.0, help="upper bound in multiples of P+R (default 13)")
    ap.add_argument("--steps", type=int, default=11, help="GRPO steps per run (1 warm-up; default 11)")
    ap.add_argument("--seed", type=int, default=0, help="TPE seed of the real search")
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--replay-seeds", type=int, default=50)
    ap.add_argument("--recheck", type=int, default=4,
                    help="interleaved re-runs of the grid's best and the search's best point (0: skip)")
    args = ap.parse_args()

    t0 = time.perf_counter()
    results = args.results.resolve()
    out_dir = results / "bench_tune"
    grid_n = args.levels ** 2
    budget = grid_n // 4
    mpath = bench_matrix(out_dir / "bench_tune.yaml", args.levels, args.high, args.steps, budget, args.seed)
    tag = f"l{args.levels}-h{args.high:g}-s{args.steps}"

    print(f"== grid: {grid_n} real runs ==", flush=True)
    gs, gstudy, _ = run_study(mpath, results, f"grid-{tag}", "grid", None)
    grid_wall = run_time(gstudy.trials)
    grid = {}
    for t in gstudy.trials:
        if not t.state.is_finished() or t.user_attrs.get("interrupted"):
            continue
        kind = "feasible" if t.values and not is_infeasible(t) else ("infeasible" if is_infeasible(t) else "failed")
        grid[point(t)] = (kind, t.value if kind == "feasible" else None)
    feasible = {p: v for p, (k, v) in grid.items() if k == "feasible"}
    if len(grid) < grid_n or not feasible:
        print(f"grid incomplete ({len(grid)} of {grid_n} points) or without a feasible point: rerun to resume")
        return 1
    best_p = min(feasible, key=feasible.get)
    best = feasible[best_p]
    target = best * (1 + args.tolerance)
    good = sorted(p for p, v in feasible.items() if v <= target)

    # noise: IQR / median of the timed steps within a run; and the rollout (gen) phase across runs, which the
    # token limits do not touch (same prompts, same seed), so its spread between grid runs is pure noise
    noise, gens, psi = [], [], []
    for t in gstudy.trials:
        rec = read_json(gs.study_dir / t.user_attrs.get("run_dir", "-") / "record.json") or {}
        s = rec.get("summary") or {}
        if s.get("step_time_iqr_s") is not None and s.get("step_time_median_s"):
            noise.append(s["step_time_iqr_s"] / s["step_time_median_s"])
        gen = (s.get("phase_median_s") or {}).get("gen")
        if gen:
            gens.append(gen)
        for when in ("before", "after"):
            v = ((rec.get("host_load") or {}).get(when) or {}).get("cpu_pressure_avg10")
            if v is not None:
                psi.append(v)

    print(f"\n== search: TPE seed {args.seed}, at most {budget} real runs (a quarter of the grid) ==", flush=True)
    ss, sstudy, _ = run_study(mpath, results, f"search-{tag}-seed{args.seed}", None, budget)
    trials = [t for t in sstudy.trials if t.state.is_finished() and not t.user_attrs.get("interrupted")][:budget]
    search_wall = run_time(trials)
    # each study normalizes to its own first trial's probe time: put the search's values in the grid's units
    g_ref, s_ref = gstudy.user_attrs.get(PROBE_REF), sstudy.user_attrs.get(PROBE_REF)
    scale = g_ref / s_ref if g_ref and s_ref else 1.0
    own_best, oracle_best = [], []
    running = None
    for t in trials:
        if t.values and not is_infeasible(t) and (running is None or t.value < running.value):
            running = t
        own_best.append(running.value * scale if running else None)
        oracle_best.append(feasible.get(point(running)) if running else None)
    k_oracle = first_within(oracle_best, target)
    k_own = first_within(own_best, target)
    # the run at which the search's final pick was first measured (what the recheck then re-measures)
    k_pick = next((i for i, t in enumerate(trials, 1) if running is not None and point(t) == point(running)), None)

    rc: dict = {}
    if args.recheck and running is not None:
        pts = {"grid_best": best_p, "search_best": point(running)}
        if pts["grid_best"] == pts["search_best"]:
            pts = {"grid_best": best_p}
        print(f"\n== recheck: {', '.join(f'{k} {v}' for k, v in pts.items())}, {args.recheck} interleaved "
              f"real runs each ==", flush=True)
        vals = recheck(ss, pts, args.recheck, out_dir, g_ref)
        med = {k: statistics.median([x for x in v if x is not None]) for k, v in vals.items() if any(v)}
        rc = {"runs": vals, "median": med,
              "search_vs_grid": (med["search_best"] / med["grid_best"] - 1) if len(med) == 2 else 0.0,
              "same_point_spread": {k: max(x for x in v if x) / min(x for x in v if x) - 1 for k, v in vals.items()
                                    if sum(x is not None for x in v) > 1}}

    print(f"\n== replay: TPE over {args.replay_seeds} seeds answered from the grid's measurements (no runs) ==",
          flush=True)
    rep = replay(ss, grid, args.replay_seeds, budget, target)

    levels = sorted({p[0] for p in grid})
    lp_levels = sorted({p[1] for p in grid})
    print("\ngrid median step time (s); rows ppo_max_token_len_per_gpu, columns log_prob_max_token_len_per_gpu")
    print(f"{'':>8}" + "".join(f"{c:>9}" for c in lp_levels))
    for r in levels:
        cells = []
        for c in lp_levels:
            kind, v = grid[(r, c)]
            mark = "*" if (r, c) in good else " "
            cells.append(f"{v:8.3f}{mark}" if kind == "feasible" else f"{kind[:8]:>9}")
        print(f"{r:>8}" + "".join(cells))
    print("(* = within 3% of the grid's best)")

    summary = {
        "space": {k: d.describe() for k, d in gs.space.items()},
        "steps_per_run": args.steps, "tolerance": args.tolerance,
        "grid": {"size": grid_n, "best_point": dict(zip(PARAMS, best_p)), "best_step_time_s": best,
                 "points_within_tolerance": len(good), "wall_s": grid_wall,
                 "speed_probe_ref_s": g_ref,
                 "median_run_noise_iqr_over_median": statistics.median(noise) if noise else None,
                 "gen_phase_s_min_median_max": [min(gens), statistics.median(gens), max(gens)] if gens else None,
                 "cpu_pressure_avg10_median_max": [statistics.median(psi), max(psi)] if psi else None},
        "search": {"sampler": f"tpe seed {args.seed}, n_startup_trials 3, rule of thumb first", "budget": budget,
                   "runs": len(trials), "wall_s": search_wall,
                   "trials": [{"number": t.number, "point": dict(zip(PARAMS, point(t))), "state": t.state.name,
                               "value": t.value if t.values else None,
                               "grid_value": feasible.get(point(t))} for t in trials],
                   "runs_to_within_tolerance_by_grid_value": k_oracle,
                   "runs_to_within_tolerance_by_own_measurement": k_own,
                   "best_point": dict(zip(PARAMS, point(running))) if running else None,
                   "best_own_value": running.value if running else None,
                   "best_point_grid_value": feasible.get(point(running)) if running else None},
        "recheck": rc,
        "replay": {**rep, "random_sampling_share_within_budget": random_odds(grid_n, len(good), budget)},
        "target_met": k_oracle is not None and k_oracle <= budget,
        "search_pick_found_at_run": k_pick,
        # the grid's single-run minimum is partly a lucky draw; the interleaved recheck re-measures both picks
        "target_met_by_recheck": bool(rc) and len(rc.get("median", {})) == 2 and rc["search_vs_grid"] <= args.tolerance
                                 and k_pick is not None and k_pick <= budget,
        "load_average_1min": {"median": statistics.median(LOAD) if LOAD else None, "max": max(LOAD, default=None),
                              "cores": os.cpu_count()},
        "wall_s": time.perf_counter() - t0,
    }
    if not LOAD:  # nothing ran now (resumed, cached): keep the load seen when the runs were made
        summary["load_average_1min"] = (read_json(out_dir / "bench_tune.json") or {}).get("load_average_1min")
    atomic_write_json(out_dir / "bench_tune.json", summary)

    print(f"\ngrid: {grid_n} runs in {grid_wall:.0f} s; best {best:.3f} s at ppo={best_p[0]} log_prob={best_p[1]}; "
          f"{len(good)} of {grid_n} points within {args.tolerance:.0%}; median per-run step-time IQR/median "
          f"{summary['grid']['median_run_noise_iqr_over_median']:.1%}")
    if psi:
        print(f"CPU pressure (PSI some avg10, % of time a task waited for a CPU) around the grid's runs: median "
              f"{statistics.median(psi):.0f}%, max {max(psi):.0f}%")
    if gens:
        print(f"noise floor: the rollout phase, which the limits do not touch, took {min(gens):.2f} .. "
              f"{statistics.median(gens):.2f} .. {max(gens):.2f} s (min .. median .. max) across the grid's runs: "
              f"{max(gens) / min(gens) - 1:.0%} between its fastest and slowest run")
    print(f"search (real runs): {len(trials)} runs in {search_wall:.0f} s; best-so-far point within "
          f"{args.tolerance:.0%} of the grid's best (by its grid value) after "
          f"{k_oracle if k_oracle else 'never (within ' + str(len(trials)) + ')'} run(s); by its own measurement after "
          f"{k_own if k_own else 'never'}; budget {budget} = a quarter of the grid -> "
          f"{'TARGET MET' if summary['target_met'] else 'target missed'}")
    if rc:
        sv = rc["search_vs_grid"]
        spread = ", ".join(f"{k} {v:.0%}" for k, v in rc["same_point_spread"].items())
        gb = rc["runs"].get("grid_best") or []
        if gb and any(gb):
            print(
                f"the grid's best point re-measured: median {statistics.median([x for x in gb if x]):.3f} s "
                "vs its grid "
                f"run {best:.3f} s ({statistics.median([x for x in gb if x]) / best - 1:+.1%}: the grid's minimum is "
                "partly a lucky draw)"
            )
        print(f"recheck ({args.recheck} interleaved real runs per point): medians "
              + ", ".join(f"{k} {v:.3f} s" for k, v in rc["median"].items())
              + f"; search's pick vs grid's pick {sv:+.1%} ({'within' if sv <= args.tolerance else 'outside'} "
              f"{args.tolerance:.0%}); max/min - 1 over re-runs of the same point: {spread}")
        print(f"by the recheck: the search's pick (found at run {k_pick} of {len(trials)}, budget {budget} of a "
              f"{grid_n}-point grid) is {sv:+.1%} vs the grid's pick -> "
              f"{'TARGET MET' if summary['target_met_by_recheck'] else 'target missed'} (by re-measured medians)")
    print(f"replay (grid values, no new runs): TPE needed median {rep['median']:g} / mean {rep['mean']:.1f} runs over "
          f"{rep['seeds']} seeds; within {budget} runs in {rep['share_within_budget']:.0%} of seeds "
          f"(random sampling: {summary['replay']['random_sampling_share_within_budget']:.0%})")
    if LOAD:
        print(f"machine load (1-min average at trial starts/ends): median {statistics.median(LOAD):.1f}, max "
              f"{max(LOAD):.1f} on {os.cpu_count()} cores (above the core count, other processes shared the cores "
              f"and the step times carry their noise)")
    print(f"written: {out_dir / 'bench_tune.json'}; wall of this invocation {summary['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
