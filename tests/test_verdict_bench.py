"""Issue 17's target, on seeded simulated sweeps (benchmarks/bench_verdict.py, fewer sweeps than the benchmark):
the planned sequential sweep of full.yaml's embedded target (quiet components) decides with its error rates kept
and needs at most half the runs of the smallest fixed design with the matrix's steps that decides as often."""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import numpy as np

from bench.planning.allocation import plan_allocation, steps_range_for
from bench.planning.model import NoiseCost
from bench.planning.sequential import EffectsStopRule

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_verdict as bv  # noqa: E402
from test_planning import QUIET_EMBEDDED  # noqa: E402


def _sequential_rates(model, design, plan, *, seed: int, sweeps: int) -> dict[float, dict[str, float]]:
    """Per true effect of dynamic_bsz (0 and 2 x the 5 % threshold): :func:`bv.score` of ``sweeps`` seeded simulated
    sequential sweeps of ``plan`` with the effects' stop rule (threshold 5 %, alpha 0.05)."""
    seqs = {}
    for mult in (0.0, 2.0):
        effect = mult * math.log1p(0.05)
        rng = np.random.default_rng([seed, int(mult * 10)])
        stop = EffectsStopRule(plan.repeats, threshold=0.05, alpha=0.05)
        seqs[effect] = bv.score([bv.simulate(model, design, effect, plan.timed_steps, plan.repeats, rng, stop, 0.05,
                                             0.05) for _ in range(sweeps)], design, effect)
    return seqs


def test_fixed_designs_search_finds_the_fewest_repeats_that_decide_as_often():
    """The search returns R such that R decides at least as often as the target rates and R - 1 does not."""
    args = argparse.Namespace(seed=5, sweeps=40, alpha=0.05, threshold=0.05)
    model, design = NoiseCost(**QUIET_EMBEDDED), bv.embedded_design()
    fixed = bv.FixedDesigns(model, design, args)
    goal = {0.0: {"decided": 0.9}}
    r = fixed.smallest(goal, 8)
    assert r is not None and r > 2
    assert fixed.rates(0.0, 8, r)["decided"] >= 0.89 > fixed.rates(0.0, 8, r - 1)["decided"]
    assert fixed.rates(0.0, 8, r) is fixed.rates(0.0, 8, r)  # cached: every search sees the same sweeps


def test_planned_sequential_sweep_needs_at_most_half_the_runs_of_the_fixed_design():
    """Quiet embedded components, true effects 0 and 2 x threshold of dynamic_bsz, 40 seeded sweeps each: the
    sequential sweep of the plan (+-2.5 %) calls no false effect beyond alpha (binomial 99 % margin), never the
    wrong direction, covers the truth in at least 93 % of its intervals, and runs at most half the runs of the
    smallest fixed design (8 timed steps, R repeats) that decides as often in both scenarios."""
    args = argparse.Namespace(seed=3, sweeps=40, alpha=0.05, threshold=0.05)
    model, design = NoiseCost(**QUIET_EMBEDDED), bv.embedded_design()
    plan, ok = plan_allocation(model, design["cells"], design["factors"], precision=0.025, warmup=1, profiled=1,
                               steps_range=steps_range_for(design["timed"]))
    assert ok and plan.timed_steps >= design["timed"]
    seqs = _sequential_rates(model, design, plan, seed=3, sweeps=args.sweeps)
    for effect, s in seqs.items():
        n_null = args.sweeps * (2 if effect == 0 else 1)  # comparisons whose true effect is 0
        assert s["false"] <= 0.05 + 2.6 * math.sqrt(0.05 * 0.95 / n_null), s
        assert effect == 0 or s["wrong"] == 0.0
        assert s["coverage"] >= 0.93 and s["decided"] >= 0.95, s
    r = bv.FixedDesigns(model, design, args).smallest(seqs, design["timed"])
    assert r is not None
    for s in seqs.values():
        assert s["runs"] <= 0.5 * r * len(design["cells"]), (s["runs"], r)


def test_kept_decisions_variant_retires_decided_one_at_a_time_cells_and_keeps_its_error_rate():
    """The simulated stop-rule variant of docs/lab-notes/planning.md (``--stop-variant retire``) on verl:cpu's quiet
    components, 40 seeded sweeps at a true 2 x threshold of dynamic_bsz: once dynamic_bsz is decided its cell runs in
    no later block (fewer runs than the shipped rule on the same seed), no false effect on the three null factors
    beyond alpha (binomial 99 % margin), never the wrong direction; a fresh rule per sweep (none of one sweep's
    decisions carries into the next)."""
    model, design = bv.VERL_QUIET, bv.verl_target(Path("/nonexistent"), quiet=True)[1]
    assert bv.verl_target(Path("/nonexistent"), quiet=True)[0] is bv.VERL_QUIET
    effect, sweeps = 2 * math.log1p(0.25), 40
    got = {}
    for variant in ("shipped", "retire"):
        rng = np.random.default_rng([7, 20])
        stop = (EffectsStopRule(5, threshold=0.25, alpha=0.05) if variant == "shipped" else
                bv.KeptDecisionsRule(5, threshold=0.25, alpha=0.05, retire=True))
        res = [bv.simulate(model, design, effect, 35, 5, rng, stop, 0.05, 0.25) for _ in range(sweeps)]
        got[variant] = (bv.score(res, design, effect), res)
    s, res = got["retire"]
    assert not getattr(stop, "kept")  # the rule passed in stays empty: each sweep had its own
    assert s["false"] <= 0.05 + 2.6 * math.sqrt(0.05 * 0.95 / (3 * sweeps)) and s["wrong"] == 0.0, s
    # a sweep that stopped after k blocks with dynamic_bsz decided earlier ran fewer than 5 k runs
    assert any(r["runs"] % 5 for r in res)
    assert s["runs"] < got["shipped"][0]["runs"], (s["runs"], got["shipped"][0]["runs"])


def test_verl_cpu_with_the_in_run_probe_needs_at_most_half_the_runs_of_the_fixed_design():
    """verl:cpu's components as the harness measures them since its runs carry the in-run speed probe
    (``bv.VERL_PROBED``: run-to-run spread normalized away, the run x step noise left; the planner then buys
    precision with longer runs), threshold 5 %, true effects 0 and 2 x threshold of dynamic_bsz, 40 seeded sweeps
    each: the planned sequential sweep keeps its error rates and runs at most half the runs of the smallest fixed
    design with the matrix's 20 timed steps that decides as often. With the raw quiet components (``VERL_QUIET``) this
    did not hold (0.83-0.96, docs/lab-notes/planning.md): the probe is what brings verl:cpu within the target."""
    args = argparse.Namespace(seed=11, sweeps=40, alpha=0.05, threshold=0.05, search_sweeps=None)
    model, design = bv.verl_target(Path("/nonexistent"))
    assert model is bv.VERL_PROBED and design["timed"] == 20
    plan, ok = plan_allocation(model, design["cells"], design["factors"], precision=0.025, warmup=design["warmup"],
                               profiled=design["profiled"], steps_range=steps_range_for(design["timed"]))
    assert ok and plan.timed_steps > 4 * design["timed"]  # dear start-up, no run component: long runs
    seqs = _sequential_rates(model, design, plan, seed=11, sweeps=args.sweeps)
    for effect, s in seqs.items():
        n_null = args.sweeps * (4 if effect == 0 else 3)  # comparisons whose true effect is 0
        assert s["false"] <= 0.05 + 2.6 * math.sqrt(0.05 * 0.95 / n_null), s
        assert effect == 0 or s["wrong"] == 0.0
        assert s["coverage"] >= 0.93, s
    r = bv.FixedDesigns(model, design, args).smallest(seqs, design["timed"])
    assert r is not None
    for s in seqs.values():
        assert s["runs"] <= 0.5 * r * len(design["cells"]), (s["runs"], r, seqs)


# --- issue 30: the validity benchmark from resampled real recorded runs (benchmarks/sweep_validity.py) ---

import sweep_validity as sv  # noqa: E402

from bench.planning import sequential  # noqa: E402

FIXTURE = sv.DEFAULT_FIXTURE


def test_recorded_runs_fixture_loads_with_every_field_and_no_machine_path():
    """The committed fixture of real embedded runs (matrix/full.yaml, 2 x 2): a header naming target, machine, load
    and commit; per run cell, levels, block, order, times, status, timed steps with one speed probe each and the
    run value; complete blocks of the four cells; no path of the recording machine."""
    fix = sv.load_fixture(FIXTURE)
    h = fix["header"]
    assert h["target"] == "embedded" and h["format_version"] == sv.FORMAT_VERSION
    assert "cores" in h["machine"] and h["load_average_mean"] > 0
    assert all(len(s["commit"].removesuffix("+dirty")) == 40 and s["matrix"] == "full" and s["normalized"]
               for s in h["sweeps"])
    keys = {"cell_id", "levels", "block", "order", "start_s", "end_s", "wall_s", "status", "reason", "timed_steps",
            "step_time_s", "speed_probe_s", "value_log", "load1_per_cpu"}
    for r in fix["runs"]:
        assert keys <= set(r), keys - set(r)
        assert r["end_s"] > r["start_s"] >= 0 and set(r["levels"]) == {"rmsnorm_fused", "dynamic_bsz"}
        if r["status"] == "ok":
            assert len(r["timed_steps"]) == len(r["step_time_s"]) == len(r["speed_probe_s"]) == 8
            assert math.isclose(r["value_log"], float(np.median(np.log(np.array(r["step_time_s"])
                                                                       / np.array(r["speed_probe_s"])))), abs_tol=1e-5)
    blocks = sv.centred_blocks(fix)
    assert len(blocks) >= 5 and all(len({r["cell_id"] for r in b}) == len(b) == 4 for b in blocks)
    text = FIXTURE.read_text()
    assert not re.search(r'"/[^"]', text)  # no string of the fixture is an absolute path


def test_resampler_centres_each_cell_once_and_keeps_whole_blocks_of_one_sweep():
    """Issue 45: one scale per cell over the whole pool (its pooled scaled run values, as the real reader sees them,
    average the grand mean: no real effect left), so each recorded sweep keeps its own offset; a resampled sweep
    takes every block WHOLE (every cell's run of one recorded block, in its recorded order) from ONE recorded sweep,
    in chunks of consecutive recorded blocks (each once before any repeats), and only the runs with the changed
    factor on are slower, by exactly 1 + change."""
    fix = sv.load_fixture(FIXTURE)
    blocks = sv.centred_blocks(fix)
    per_cell: dict[str, list[float]] = {}
    per_sweep: dict[int, list[float]] = {}
    for b in blocks:
        for r in b:
            if r["status"] == "ok":
                _, y, _, _ = sequential.run_observations([sv.to_record(r, r["scale"])])
                assert math.isclose(y[0], r["value_log"] + math.log(r["scale"]), abs_tol=1e-6)
                per_cell.setdefault(r["cell_id"], []).append(y[0])
                per_sweep.setdefault(r["sweep"], []).append(y[0])
    means = [float(np.mean(v)) for v in per_cell.values()]
    raw = [float(np.mean([r["value_log"] for b in blocks for r in b if r["cell_id"] == c and r["status"] == "ok"]))
           for c in per_cell]
    assert max(means) - min(means) < 1e-4 < max(raw) - min(raw)  # the recorded cells differed; centred, they do not
    sweep_means = [float(np.mean(v)) for v in per_sweep.values()]
    assert max(sweep_means) - min(sweep_means) > 1e-3  # the sweeps' offsets stay (per-sweep centring erased them)
    assert len({r["cell_id"]: r["scale"] for b in blocks for r in b}) == len({(r["cell_id"], r["scale"])
                                                                               for b in blocks for r in b})
    rng = np.random.default_rng(4)
    by_src = {(r["sweep"], r["order"]): r for b in blocks for r in b}
    for _ in range(5):
        recs = sv.resample(rng, blocks, 12, "dynamic_bsz", 0.10)
        assert len(recs) == 12 * 4 and [r["repeat"] for r in recs] == [k for k in range(12) for _ in range(4)]
        srcs = [by_src[rec["_key"][1:3]] for rec in recs]
        assert len({s["sweep"] for s in srcs}) == 1  # one recorded sweep
        for k in range(12):
            blk = srcs[4 * k: 4 * k + 4]
            assert len({s["block"] for s in blk}) == 1  # a whole recorded block ...
            assert [s["order"] for s in blk] == sorted(s["order"] for s in blk)  # ... in its recorded order
            for rec, src in zip(recs[4 * k: 4 * k + 4], blk):
                mult = 1.10 if src["levels"]["dynamic_bsz"] == 1 else 1.0
                assert np.allclose(rec["summary"]["step_time_samples_s"], np.array(src["step_time_s"]) * src["scale"]
                                   * mult)
                assert rec["_cost_s"] >= src["wall_s"]
        n = len({s["block"] for s in by_src.values() if s["sweep"] == srcs[0]["sweep"]})
        first = [srcs[4 * k]["block"] for k in range(n)]
        assert sorted(first) == list(range(n))  # every recorded block once before any comes twice
        assert sum((b - a) % n == 1 for a, b in zip(first, first[1:])) >= n // 2  # in runs of consecutive blocks


def test_short_resampled_simulation_runs_the_real_stop_rule():
    """50 resampled sweeps of up to 3 blocks (the recorded sweeps' length: longer ones repeat blocks, issue 45) at a
    true 0 and at 2 x the 5 % threshold of dynamic_bsz, each through the shipped stop rule look by look: rates are
    shares in [0, 1], the change is called 'slower' far more often at 2T than at 0, and a sweep's wall time is its
    runs' recorded seconds (at most 3 blocks of them)."""
    fix = sv.load_fixture(FIXTURE)
    blocks = sv.centred_blocks(fix)
    block_s = max(sum(r["cost_s"] for r in b) for b in blocks)
    sequential.run_observations = sv.cached_observations
    try:
        got = {}
        for mult in (0.0, 2.0):
            rng = np.random.default_rng([9, int(mult)])
            res = [sv.sequential_sweep(sv.resample(rng, blocks, 3, "dynamic_bsz", mult * 0.05), 4, 3, 0.05, 0.05)
                   for _ in range(50)]
            got[mult] = sv.score(res, "dynamic_bsz", mult * 0.05, 0.05)
            assert all(1 <= s["blocks"] <= 3 and 0 < s["wall_s"] <= 3 * block_s + 60 for s in res)
    finally:
        sequential.run_observations = sv._RUN_OBSERVATIONS
    for s in got.values():
        for k in ("family", "error", "coverage", "decided_all", *(f"v_{v}" for v in sv.VERDICT_KEYS)):
            x = s["verdicts"][k[2:]] if k.startswith("v_") else s[k]
            assert 0.0 <= x <= 1.0, (k, x)
    assert got[2.0]["verdicts"]["slower"] >= got[0.0]["verdicts"]["slower"] + 0.3, got
    assert got[0.0]["family"] <= 0.2 and got[2.0]["coverage"] >= 0.8, got
