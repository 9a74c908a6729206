"""False-alarm and detection rates of the regression gate (``bench.gate.stored``) at its default settings.

Not a test. Three modes:

``interleaved`` (the gate CI uses): ``--tries`` interleaved gates (``gate --interleave HEAD --matrix M --force``,
default ``matrix/gate.yaml``; ``--matrix matrix/full.yaml`` for the main matrix) of unchanged code and as many
with an injected slowdown of one cell (``--slowdown`` 0.10: CPU work added at the start of the update phase of
each training step where ``cfg.<--when>`` holds, for 10 % of that step's own time: self-calibrating), alternating,
in a clone of this repository (the candidate = its working tree, the baseline = its HEAD). Prints each gate's
verdict, blocks and wall time, the pass / regression rates with Wilson intervals and the measured noise (SD of
a block's log ratio) with the blocks the gate needs at that noise. Tries are logged to
``<results>/interleaved_tries.jsonl``; a rerun continues.

``real``: runs the gate matrix (:func:`gate_matrix`: the embedded engine, one cell, eight repeats of 12
timed steps, one intra-op thread; the same matrix as the CI test ``tests/gate/test_gate_embedded.py``) as
``--sweeps`` identical
sweeps, plus as many with an injected update-phase delay of 5 % and of 10 % of the first sweep's
median step time (``base.embedded.update_delay_s``), interleaved (identical, 5 %, 10 %, identical ...)
so that the machine's load drifts over all three kinds alike. Then every identical sweep is gated
against every other identical sweep (false alarm = the gate does not pass) and every identical sweep
is the baseline of every delayed sweep (detected = verdict regression). Also prints the noise of the
sweeps: step-to-step spread, sweep-to-sweep spread of the median, and the CPU pressure
(``/proc/pressure/cpu``, "some avg60") around each sweep. The pairs share sweeps, so the rates have
fewer independent trials than pairs; the Wilson intervals printed use the number of pairs.

``synthetic``: simulates ``--trials`` gates with a noise model of log step time = step workload
(the same in every run: same seed) + sweep offset + run offset + step noise, with the spreads
estimated from the sweeps of a ``real`` run (``--from DIR``) or given (``--sd-step``, ``--sd-run``,
``--sd-sweep``, ``--sd-work``).
Gives tight figures for a noise level and shows how the rates move with it.

The real mode evaluates the gate at its defaults (unpaired, speed-normalized: ``bench.records.speed``), with
``--pairing auto``, and without normalization; the synthetic mode paired and unpaired (its samples have
no probe); all at the default threshold (5 %) and alpha (0.01). The noise is printed raw and
speed-normalized.

    python benchmarks/bench_gate.py interleaved --tries 10 --budget 90s --until 20:10   # 1-1.5 min per gate, idle
    python benchmarks/bench_gate.py real --sweeps 5 --results /tmp/gate-bench    # ~18 min on 2 cores
    python benchmarks/bench_gate.py synthetic --from /tmp/gate-bench --trials 2000
    python benchmarks/bench_gate.py synthetic --sd-step 0.05 --sd-sweep 0.02 --trials 2000
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.core.files import read_json  # noqa: E402
from bench.gate.verdicts import compare_snapshots  # noqa: E402
from bench.records.snapshot import snapshot  # noqa: E402
from bench.stats.estimators import DEFAULT_ALPHA, DEFAULT_THRESHOLD  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
import real_pools  # noqa: E402

KINDS = ("identical", "delay5", "delay10")
#: bootstrap resamples per gate here (the CLI uses 2000; 400 keeps thousands of simulated gates fast)
N_BOOT_BENCH = 1000


def gate_matrix(name: str = "gate_bench", delay_s: float = 0.0, timed_steps: int = 12, repeats: int = 8) -> dict:
    """The gate's reference matrix: one embedded cell (dynamic bsz on), ``repeats`` runs of ``timed_steps`` timed steps.

    No profiled step (every measured step is timed); a fixed seed, so every run does the same work
    step by step and the gate can pair steps.
    """
    m = {
        "name": name, "engine": "embedded", "platform": "cpu",
        "base": {"steps": timed_steps + 1, "warmup_steps": 1, "profile_steps": [], "train_batch_size": 4, "n": 2,
                 "ppo_mini_batch_size": 4, "micro_batch_size_per_gpu": 2, "max_prompt_length": 160,
                 "max_response_length": 24, "timeout_s": 300, "seed": 0},
        "factors": {"dynamic_bsz": ["on"]}, "repeats": repeats,
    }
    # one intra-op thread: on 2 cores shared with the harness (and maybe other jobs) two threads jitter
    m["base"]["env"] = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if delay_s:
        m["base"]["embedded"] = {"update_delay_s": round(float(delay_s), 4)}
    return m


def cpu_pressure() -> float | None:
    """``some avg60`` of ``/proc/pressure/cpu`` (share of time some task waited for a CPU), or None."""
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        return float(dict(kv.split("=") for kv in line.split()[1:])["avg60"])
    except (OSError, KeyError, ValueError, IndexError):
        return None


def run_sweep(matrix: dict, results: Path, workdir: Path) -> Path:
    """Run one sweep of ``matrix`` (``--force``) in-process; returns its folder."""
    from bench.cli import main

    path = workdir / f"{matrix['name']}.yaml"
    path.write_text(yaml.safe_dump(matrix, sort_keys=False))
    rc = main(["run", str(path), "--force", "--results", str(results),
               "--tracking-uri", f"sqlite:///{(results / 'mlflow.db').as_posix()}"])
    if rc != 0:
        raise SystemExit(f"sweep of {matrix['name']} failed (exit {rc}); see {results / matrix['name']}")
    return (results / matrix["name"] / "latest").resolve()


def real(args: argparse.Namespace) -> None:
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gate-bench-"))
    log_path = results / "gate_bench_sweeps.json"
    log = read_json(log_path) or {"sweeps": []}
    base_med = log.get("base_median_s")
    t0 = time.time()
    for i in range(args.sweeps):
        for kind in KINDS:
            if sum(s["kind"] == kind for s in log["sweeps"]) > i:
                continue  # resume: already run
            if kind != "identical" and base_med is None:
                continue
            frac = {"identical": 0.0, "delay5": 0.05, "delay10": 0.10}[kind]
            delay = frac * (base_med or 0.0)
            m = gate_matrix(f"gate_bench_{kind}", delay, args.timed_steps, args.repeats)
            p0 = cpu_pressure()
            ts = time.time()
            sweep = run_sweep(m, results, work)
            entry = {"kind": kind, "sweep": str(sweep), "delay_s": delay, "wall_s": time.time() - ts,
                     "pressure_before": p0, "pressure_after": cpu_pressure()}
            snap = snapshot(sweep)
            st = [t for r in snap["cells"][0]["repeats"] for t in r["samples"]["step_time"]]
            entry["median_s"] = float(np.median(st))
            if kind == "identical" and (base_med is None or entry["median_s"] < base_med):
                # the delays are fractions of the fastest identical sweep so far: the machine's idle speed
                base_med = log["base_median_s"] = entry["median_s"]
            log["sweeps"].append(entry)
            log_path.write_text(json.dumps(log, indent=1))
            print(f"[{time.time() - t0:6.0f}s] {kind:9} #{i}: median {entry['median_s']:.3f} s, delay {delay:.3f} s, "
                  f"CPU pressure {p0}->{entry['pressure_after']}", flush=True)
    evaluate_real(log)


def _snaps(log: dict, max_pressure: float | None = None) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {k: [] for k in KINDS}
    for s in log["sweeps"]:
        if (
            max_pressure is not None
            and max((s.get("pressure_before") or 0.0), (s.get("pressure_after") or 0.0)) > max_pressure
        ):
            continue
        snap = snapshot(Path(s["sweep"]))
        snap["_pressure"] = max(x for x in (s.get("pressure_before"), s.get("pressure_after"), -1.0) if x is not None)
        out[s["kind"]].append(snap)
    return out


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a rate k/n."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def _gate(base: dict, cand: dict, pairing: bool, normalize: bool = True) -> dict:
    b = copy.deepcopy(base)
    c = copy.deepcopy(cand)
    return compare_snapshots(b, c, metrics=["step_time"], threshold=DEFAULT_THRESHOLD, alpha=DEFAULT_ALPHA,
                             n_boot=N_BOOT_BENCH, pairing=pairing, normalize=normalize)


def _outcome(res: dict) -> str:
    """``regression`` (exit 1), ``pass`` (exit 0) or ``cannot judge`` (exit 3, e.g. too noisy)."""
    return {1: "regression", 0: "pass"}.get(res["exit_code"], "cannot judge")


def _rates(snaps: dict[str, list[dict]], pairing: bool, normalize: bool = True) -> dict[str, tuple[dict, list]]:
    """Per kind of candidate: counts of outcomes over all (baseline, candidate) pairs, and the changes."""
    ident = snaps["identical"]
    out = {}
    for kind, label in (("identical", "identical (false alarm)"), ("delay5", "5 % slower (detection)"),
                        ("delay10", "10 % slower (detection)")):
        pairs = (
            itertools.permutations(ident, 2) if kind == "identical" else ((a, b) for a in ident for b in snaps[kind])
        )
        res = [_gate(a, b, pairing, normalize) for a, b in pairs]
        counts = {o: sum(_outcome(r) == o for r in res) for o in ("regression", "pass", "cannot judge")}
        out[label] = (counts, [r["rows"][0].get("change") for r in res])
    return out


def _samples(rep: dict, normalized: bool) -> np.ndarray:
    """A repeat's step times, divided by its speed probe (times the probe's nominal 0.03 s) when ``normalized``."""
    st = np.array(rep["samples"]["step_time"], float)
    pr = np.array(rep["samples"].get("speed_probe") or [], float)
    return st * 0.03 / pr if normalized and len(pr) == len(st) else st


def noise(snaps: dict[str, list[dict]], normalized: bool = False) -> dict[str, float]:
    """Spreads of log step time over the identical sweeps (two-way layout: run x step, runs nested in sweeps).

    ``sd_work``: spread of the per-step means (the work of each step, the same in every run);
    ``sd_step``: residual after removing run and step means; ``sd_run``: spread of run means within a
    sweep beyond ``sd_step``; ``sd_sweep``: spread of sweep means beyond the runs'.
    """
    runs, sweep_of = [], []
    for i, s in enumerate(snaps["identical"]):
        for r in s["cells"][0]["repeats"]:
            runs.append(np.log(_samples(r, normalized)))
            sweep_of.append(i)
    n = min(map(len, runs))
    x = np.array([r[:n] for r in runs])  # runs x steps
    sweep_of = np.array(sweep_of)
    run_means = x.mean(axis=1)
    step_means = x.mean(axis=0)
    resid = x - run_means[:, None] - step_means[None, :] + x.mean()
    sd_step = float(math.sqrt((resid ** 2).sum() / max(1, (x.shape[0] - 1) * (x.shape[1] - 1))))
    within = [run_means[sweep_of == k] for k in np.unique(sweep_of)]
    w_var = [float(np.var(g, ddof=1)) for g in within if len(g) > 1]
    sd_run = math.sqrt(max(0.0, float(np.mean(w_var)) - sd_step ** 2 / n)) if w_var else 0.0
    sweep_means = np.array([g.mean() for g in within])
    r = float(np.mean([len(g) for g in within]))
    sd_sweep = math.sqrt(max(0.0, float(np.var(sweep_means, ddof=1)) - (sd_run ** 2 + sd_step ** 2 / n) / r)) \
        if len(sweep_means) > 1 else 0.0
    return {"sd_work": float(step_means.std(ddof=1)) if n > 1 else 0.0, "sd_step": sd_step, "sd_run": sd_run,
            "sd_sweep": sd_sweep, "sd_sweep_means": float(sweep_means.std(ddof=1)) if len(sweep_means) > 1 else 0.0,
            "steps": n, "runs_per_sweep": r, "sweeps": len(within)}


def _print_rates(title: str, rates: dict) -> None:
    """One line per kind: the share of gates that exit 1 (regression), 0 (pass) and 3 (cannot judge)."""
    print(title)
    for label, (counts, changes) in rates.items():
        n = sum(counts.values())
        k = counts["regression"]
        lo, hi = wilson(k, n)
        ch = [c for c in changes if c is not None]
        spread = (
            f"; change median {np.median(ch):+.1%}, 5-95% [{np.percentile(ch, 5):+.1%}, {np.percentile(ch, 95):+.1%}]"
            if ch
            else ""
        )
        print(
            f"  {label:26} exit 1 (regression) {k:4d}/{n:<4d} = {k / n if n else math.nan:6.1%} "
            f"(95% CI {lo:.1%}-{hi:.1%}); "
            f"exit 0 {counts['pass'] / n if n else math.nan:6.1%}; exit 3 (cannot judge) "
            f"{counts['cannot judge'] / n if n else math.nan:6.1%}{spread}"
        )


def evaluate_real(log: dict, max_pressure: float | None = None) -> None:
    snaps = _snaps(log, max_pressure)
    if max_pressure is not None:
        print(f"only sweeps with CPU pressure (some avg60) <= {max_pressure} % before and after")
    delays = {k: [s["delay_s"] for s in log["sweeps"] if s["kind"] == k] for k in ("delay5", "delay10")}
    meds = [
        np.median([t for r in s["cells"][0]["repeats"] for t in r["samples"]["step_time"]]) for s in snaps["identical"]
    ]
    if meds:
        for k, d in delays.items():
            if d:
                eff = [dd / m for dd in d for m in meds]
                print(f"{k}: injected {np.median(d):.3f} s = {np.median(eff):.1%} of the identical sweeps' median step "
                      f"(range {min(eff):.1%}-{max(eff):.1%})")
    print("\nsweeps: " + ", ".join(f"{k} {len(v)}" for k, v in snaps.items()) +
          f"; reference median step {log.get('base_median_s', float('nan')):.3f} s")
    pr = [s["_pressure"] for v in snaps.values() for s in v if s["_pressure"] >= 0]
    if pr:
        print(f"CPU pressure (some avg60, %) around the sweeps: median {np.median(pr):.0f}, max {max(pr):.0f}")
    for normalized in (False, True):
        nz = noise(snaps, normalized)
        print(f"noise of log step time{' / speed probe' if normalized else ''} over identical sweeps: " +
              ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in nz.items()))
    for pairing, normalize in ((False, True), (True, True), (False, False)):
        _print_rates(
            f"gate (threshold {DEFAULT_THRESHOLD:.0%}, alpha {DEFAULT_ALPHA}, pairing {'auto' if pairing else 'off'}, "
            f"normalize {'auto' if normalize else 'off'}):",
            _rates(snaps, pairing, normalize),
        )


# -- synthetic ------------------------------------------------------------------------------------

def _snap(runs: list[np.ndarray], work: np.ndarray) -> dict:
    """A one-cell snapshot holding one repeat per array of ``runs`` with workload fingerprints ``work``."""
    steps = list(range(2, 2 + len(work)))
    reps = [{"repeat": k, "status": "ok", "steps": steps, "workload": [[float(w), None, None] for w in work],
             "samples": {"step_time": [float(t) for t in times]}} for k, times in enumerate(runs)]
    return {"engine": "embedded", "platform": "cpu", "source": {"sweep": "synthetic"}, "base": {}, "versions": {},
            "cells": [{"key": "dynamic_bsz=1", "label": "dynamic_bsz", "cell_id": "x", "status": "ok", "failures": [],
                       "missing_repeats": [], "repeats": reps}]}


def synthetic(args: argparse.Namespace) -> None:
    if args.from_dir:
        log = read_json(Path(args.from_dir) / "gate_bench_sweeps.json")
        if not log:
            raise SystemExit(f"{args.from_dir}: no gate_bench_sweeps.json (run the real mode first)")
        nz = noise(_snaps(log, args.max_pressure), normalized=True)
        sd_step, sd_run, sd_sweep, sd_work = nz["sd_step"], nz["sd_run"], nz["sd_sweep"], nz["sd_work"]
        steps, repeats = nz["steps"], int(round(nz["runs_per_sweep"]))
        print(f"noise measured in {args.from_dir}: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                                                 for k, v in nz.items()))
    else:
        sd_step, sd_run, sd_sweep, sd_work = args.sd_step, args.sd_run, args.sd_sweep, args.sd_work
        steps, repeats = args.timed_steps, args.repeats
    print(f"model: log t = work[step] (sd {sd_work:.4f}) + sweep offset (sd {sd_sweep:.4f}) + run offset "
          f"(sd {sd_run:.4f}) + step noise (sd {sd_step:.4f}); {repeats} x {steps} timed steps per side; "
          f"{args.trials} trials per figure; {N_BOOT_BENCH} bootstrap resamples per gate")
    rng = np.random.default_rng(args.seed)
    for pairing in (True, False):
        labels = {0.0: "identical (false alarm)", 0.05: "5 % slower (detection)", 0.10: "10 % slower (detection)"}
        counts = {lab: {"regression": 0, "pass": 0, "cannot judge": 0} for lab in labels.values()}
        changes: dict[str, list] = {lab: [] for lab in labels.values()}
        for _ in range(args.trials):
            work = rng.normal(0, sd_work, steps)
            wfp = np.round(np.exp(work) * 100, 6)

            def sweep(frac: float) -> dict:
                off = rng.normal(0, sd_sweep)
                runs = [
                    np.exp(work + off + rng.normal(0, sd_run) + rng.normal(0, sd_step, steps)) for _ in range(repeats)
                ]
                med = float(np.exp(np.median(work)))
                return _snap([t + frac * med for t in runs], wfp)

            base = sweep(0.0)
            for frac, lab in labels.items():
                res = _gate(base, sweep(frac), pairing)
                counts[lab][_outcome(res)] += 1
                changes[lab].append(res["rows"][0].get("change"))
        _print_rates(
            f"gate (threshold {DEFAULT_THRESHOLD:.0%}, alpha {DEFAULT_ALPHA}, pairing {'auto' if pairing else 'off'}):",
            {lab: (counts[lab], changes[lab]) for lab in labels.values()},
        )
        if args.paired_only:
            break


# -- interleaved gate: pass / regression rates of `gate --interleave` as a user runs it ------------------------

#: where the injected slowdown goes: the end of the update phase of the embedded engine's training step
SLOW_ANCHOR = "        actor_metrics = update_actor(tr, ro.seqs, batch, metrics)\n"
#: the end of the rollout (generation) phase, and the line after the step's time is taken
ROLLOUT_ANCHOR = "cfg.max_response_length, cfg.temperature, tr.device\n        )\n"
STEP_ANCHOR = '    timing["step"] = time.perf_counter() - t_step\n'


def _clone(dst: Path) -> Path:
    """A clone of this repository's HEAD (the candidate's working tree and the baseline revision HEAD)."""
    import subprocess

    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(dst)], check=True)
    return dst


def slowdown_patch(fraction: float, when: str) -> str:
    """The injected slowdown, self-calibrating: at the end of the update phase of each training step of the
    cells where ``cfg.<when>`` holds, CPU work (products of a 128 x 128 float32 matrix) for ``fraction`` of
    the wall time the step has taken so far (everything before it: generation, log-probs, update). So the
    step takes ``1 + fraction`` times as long, whatever the machine's load: work sized once at quiet speed
    would be mis-sized when the machine is busy (issue 18's first acceptance tries measured +17 to +25 %
    for a "10 %" slowdown)."""
    ind = " " * 12
    return (f"        if cfg.{when}:  # injected test slowdown: {fraction:.0%} of this step's time as CPU work\n"
            f"{ind}_until = time.perf_counter() + {fraction!r} * (time.perf_counter() - t_step)\n"
            f"{ind}_w = torch.full((128, 128), 1.0 / 128)\n"
            f"{ind}while time.perf_counter() < _until:\n"
            f"{ind}    _w = _w @ _w\n")


def rollout_slowdown_patch(fraction: float, when: str) -> tuple[str, str]:
    """The injected slowdown in the **rollout** phase (``timing_s/gen``), a phase the speed probe and the gate's
    update-phase calibration never touch: right after generation, CPU work (products of a 128 x 128 float32
    matrix) for ``fraction`` of the previous step's own time without the injected work (the first step, a
    warm-up, uses twice its generation time). Sized from the step just before, so the step takes about ``1 +
    fraction`` times as long whatever the machine's load. Returns ``(work, bookkeeping)``: the lines after
    generation and the line after the step's time is taken (the step's time less the injected work, kept as
    an attribute of ``run_step``)."""
    ind = " " * 12
    work = (f"        if cfg.{when}:  # injected test slowdown in the rollout: {fraction:.0%} of a step's time\n"
            f"{ind}_prev = getattr(run_step, '_bench_prev_s', None) or 2 * (time.perf_counter() - t_step)\n"
            f"{ind}_t_inj = time.perf_counter()\n"
            f"{ind}_until = _t_inj + {fraction!r} * _prev\n"
            f"{ind}_w = torch.full((128, 128), 1.0 / 128)\n"
            f"{ind}while time.perf_counter() < _until:\n"
            f"{ind}    _w = _w @ _w\n"
            f"{ind}run_step._bench_inj_s = time.perf_counter() - _t_inj\n")
    book = (f"    if cfg.{when}:\n"
            f"        run_step._bench_prev_s = timing['step'] - getattr(run_step, '_bench_inj_s', 0.0)\n")
    return work, book


def _set_slowdown(repo: Path, fraction: float, when: str, where: str = "update") -> None:
    """Add (``fraction`` > 0) or remove the injected slowdown in the candidate's working tree ``repo``:
    ``where`` "update" (:func:`slowdown_patch`) or "rollout" (:func:`rollout_slowdown_patch`)."""
    import subprocess

    step = repo / "bench/engines/embedded/step.py"
    subprocess.run(["git", "-C", str(repo), "checkout", "--", str(step)], check=True)
    if fraction > 0:
        text = step.read_text()
        if where == "rollout":
            work, book = rollout_slowdown_patch(fraction, when)
            for anchor in (ROLLOUT_ANCHOR, STEP_ANCHOR):
                assert text.count(anchor) == 1, "anchor of the injected slowdown not found"
            text = text.replace(ROLLOUT_ANCHOR, ROLLOUT_ANCHOR + work).replace(STEP_ANCHOR, STEP_ANCHOR + book)
        else:
            assert text.count(SLOW_ANCHOR) == 1, "anchor of the injected slowdown not found"
            text = text.replace(SLOW_ANCHOR, SLOW_ANCHOR + slowdown_patch(fraction, when))
        step.write_text(text)


def _psi_total() -> float | None:
    """``some total`` of ``/proc/pressure/cpu`` (microseconds some task waited for a CPU), or None."""
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        return float(dict(kv.split("=") for kv in line.split()[1:])["total"])
    except (OSError, KeyError, ValueError, IndexError):
        return None


def interleaved(args: argparse.Namespace) -> None:
    """``--tries`` interleaved gates of unchanged code and as many with a ``--slowdown`` injected in one cell
    (:func:`slowdown_patch`), alternating, each a fresh gate sweep (``--force``) of ``--matrix`` against ``HEAD``
    of a clone; prints each gate's verdict, blocks, change, interval, noise, figure, wall time and CPU pressure
    over the gate, then the rates with Wilson intervals and the measured noise with the blocks
    :func:`bench.stats.power.blocks_needed` asks for. ``--until HH:MM`` (UTC) starts no gate after that time
    whose median wall time so far would end past it."""
    import datetime as dt
    import os
    import subprocess

    work = Path(args.results)
    work.mkdir(parents=True, exist_ok=True)
    repo = work / "repo"
    if not repo.exists():
        _clone(repo)
    log_path = work / "interleaved_tries.jsonl"
    done = [json.loads(x) for x in log_path.read_text().splitlines()] if log_path.exists() else []
    matrix = (ROOT / args.matrix).resolve()
    kinds = [k for _ in range(args.tries) for k in ("unchanged", "slowdown")]
    until = None
    if args.until:
        hh, mm = map(int, args.until.split(":"))
        now = dt.datetime.now(dt.timezone.utc)
        until = now.replace(hour=hh, minute=mm, second=0, microsecond=0).timestamp()
    env = {**os.environ, "PYTHONPATH": str(repo)}
    for i, kind in enumerate(kinds[len(done):], len(done)):
        walls = [d["wall_s"] for d in done] or [0.0]
        if until is not None and time.time() + float(np.median(walls)) > until:
            print(f"stopping before try {i}: a gate (median {np.median(walls):.0f} s) would end after {args.until} UTC")
            break
        frac = args.slowdown if kind == "slowdown" else 0.0
        _set_slowdown(repo, frac, args.when, args.phase)
        cmd = [sys.executable, "run_bench.py", "gate", "--results", str(work / "results"),
               "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}", "--interleave", "HEAD", "--matrix", str(matrix),
               "--force", *(["--blocks", str(args.blocks)] if args.blocks else []),
               *(["--budget", args.budget] if args.budget else []),
               *(["--side-by-side"] if args.side_by_side else []),
               *[x for o in args.set for x in ("--set", o)]]
        t0, psi0 = time.time(), _psi_total()
        try:
            res = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True,
                                 timeout=(until - t0 if until else None))
        except subprocess.TimeoutExpired:
            print(f"try {i} {kind}: stopped at {args.until} UTC, unfinished (not counted)")
            break
        wall, psi1 = time.time() - t0, _psi_total()
        gate_json = max((work / "results").glob("*/2*/gate/gate.json"), key=lambda p: p.stat().st_mtime)
        if res.returncode not in (0, 1, 3) or gate_json.stat().st_mtime < t0:
            print(f"try {i} {kind}: gate ended with exit {res.returncode} and no verdict: {res.stderr[-400:]}")
            break
        g = json.loads(gate_json.read_text())
        rows = g.get("rows", [])
        entry = {"try": i, "kind": kind, "exit": res.returncode, "verdict": g.get("verdict"), "wall_s": wall,
                 "blocks": g.get("blocks_run"), "slowdown": frac, "phase": args.phase, "sweep": g.get("sweep"),
                 "started_utc": dt.datetime.fromtimestamp(t0, dt.timezone.utc).strftime("%H:%M:%S"),
                 "pressure": cpu_pressure(),
                 "pressure_gate": (None if psi0 is None or psi1 is None else (psi1 - psi0) / 1e6 / wall * 100),
                 "rows": [{k: r.get(k) for k in ("cell", "verdict", "change", "raw_change", "ci_low", "ci_high",
                                                 "sd_pair", "mde", "blocks_needed", "normalized", "reason",
                                                 "cpu_effect")}
                          for r in rows],
                 "probe": g.get("probe", {}).get("note")}
        done.append(entry)
        with open(log_path, "a") as fh:
            fh.write(json.dumps(entry) + "\n")
        print(_try_line(entry), flush=True)
    _set_slowdown(repo, 0, args.when, args.phase)
    _summary_interleaved(done, args)


def _try_line(e: dict) -> str:
    """One markdown table row of a try (see :func:`_summary_interleaved` for the header)."""
    r = (e["rows"] or [{}])[0]
    ci = f"[{_pct(r.get('ci_low'))}, {_pct(r.get('ci_high'))}]"
    sd = "-" if r.get("sd_pair") is None else f"{r['sd_pair']:.3f}"
    pg = "-" if e.get("pressure_gate") is None else f"{e['pressure_gate']:.0f} %"
    cpu = "-" if not r.get("cpu_effect") else _pct(r["cpu_effect"]["effect"])
    return (f"| {e['try']} | {e.get('started_utc', '')} | {e['kind']} | {e['verdict']} ({e['exit']}) | {e['blocks']} | "
            f"{_pct(r.get('change'))} {ci} | {_pct(r.get('raw_change'))} | {sd} | {_pct(r.get('mde'))} | "
            f"{r.get('blocks_needed')} | {'applied' if r.get('normalized') else 'raw'} | {cpu} | {e['wall_s']:.0f} s | "
            f"{pg} |")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def _summary_interleaved(done: list[dict], args: argparse.Namespace) -> None:
    from bench.stats.power import blocks_needed

    print("| try | start (UTC) | kind | verdict (exit) | blocks | change [RCI] | raw change | SD of block log ratio | "
          "gate can see | blocks needed | probe | CPU term | wall | CPU pressure (some, over the gate) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for e in done:
        print(_try_line(e))
    slow = [r["change"] for e in done if e["kind"] == "slowdown" for r in e["rows"] if r.get("change") is not None]
    same = [r["change"] for e in done if e["kind"] == "unchanged" for r in e["rows"] if r.get("change") is not None]
    if slow:
        print(f"measured change: slowdown tries median {np.median(slow):+.1%} (range {min(slow):+.1%} to "
              f"{max(slow):+.1%})" + (f"; unchanged tries median {np.median(same):+.1%}" if same else ""))

    for kind, want in (("unchanged", "pass"), ("slowdown", "regression")):
        runs = [d for d in done if d["kind"] == kind]
        if not runs:
            continue
        k = sum(d["verdict"] == want for d in runs)
        lo, hi = wilson(k, len(runs))
        walls = [d["wall_s"] for d in runs]
        other = {v: sum(d["verdict"] == v for d in runs) for v in ("pass", "regression", "cannot judge")}
        print(f"{kind}: {want} in {k} of {len(runs)} ({k / len(runs):.0%}, 95 % CI {lo:.0%}-{hi:.0%}); verdicts "
              f"{other}; wall median {np.median(walls):.0f} s (min {min(walls):.0f}, max {max(walls):.0f}); "
              f"blocks median {np.median([d['blocks'] or 0 for d in runs]):.0f}")
    sds = [r["sd_pair"] for d in done for r in d["rows"] if r.get("sd_pair") is not None]
    if sds:
        sd = float(np.median(sds))
        need = blocks_needed(sd, alpha=DEFAULT_ALPHA, threshold=DEFAULT_THRESHOLD, max_mde=2 * DEFAULT_THRESHOLD)
        print(f"noise: SD of a block's log ratio, median over gates {sd:.3f} (range {min(sds):.3f}-{max(sds):.3f}); "
              f"blocks the gate needs at that noise: {need}")


def _sim_records(rng: np.random.Generator, change: float, blocks: int, sd_pair: float, steps: int = 4) -> list[dict]:
    """Run records of a simulated one-cell interleaved gate sweep: each run's log value = block drift (SD 0.2,
    cancels in the pairs) + run noise (SD ``sd_pair / sqrt(2)``) + ``log(1 + change)`` for the candidate."""
    out = []
    for k in range(blocks):
        drift = rng.normal(0, 0.2)
        for v in ("baseline", "candidate"):
            mu = math.log(0.4) + drift + rng.normal(0, sd_pair / math.sqrt(2)) + (math.log1p(change) if v == "candidate"
                                                                                  else 0.0)
            st = list(np.exp(mu + rng.normal(0, 0.01, steps)))
            out.append({"cell_id": "c", "repeat": k, "code_version": v, "status": "ok", "label": "cell",
                        "summary": {"timed_steps": list(range(2, 2 + steps)), "step_time_samples_s": st},
                        "steps": {}})
    return out


def oc(args: argparse.Namespace) -> None:
    """The interleaved gate's operating characteristic from real recorded runs: ``--trials`` simulated gates per
    true change (0, T/2, T, 1.5T, 2T of the threshold T), each built from ONE recorded gate sweep of unchanged code
    (``--pool``, :func:`real_pools.gate_records`: whole gates, a moving-block bootstrap of their blocks, per-gate
    offsets and failed runs kept), ``--cells`` cells, each gate run look by look through the real stop rule
    (:class:`bench.gate.interleaved.GateStopRule` with the declared analysis: covariate, Bonferroni over the cells,
    repeated intervals) up to ``--blocks``. Prints per change the probability of each verdict with its Wilson
    interval, the coverage of the final interval (every cell's), the median blocks and the wall time they take
    at the recorded seconds per block; then the smallest fixed design as powerful; ``--plot FILE`` draws the curve."""
    from bench.gate.interleaved import GateStopRule
    from bench.gate.runs import declare_analysis

    pool = real_pools.load_pool(Path(args.pool))
    wall = float(np.mean([sum(r["wall_s"] for r in b["runs"]) for g in pool["gates"] for b in g["blocks"][1:]]))
    rng = np.random.default_rng(args.seed)
    T, alpha = args.threshold, args.alpha
    print(f"interleaved gate OC from {pool['header']['blocks']} real blocks of {len(pool['gates'])} recorded gates "
          f"({wall:.1f} s a block after the first), "
          f"{args.cells} cell(s), up to {args.blocks} blocks, threshold {T:.0%}, alpha {alpha} per gate, "
          f"{args.trials} gates per row, seed {args.seed}")
    print("true change  regression [95% CI]      pass [95% CI]            cannot judge  coverage  blocks  wall")
    curve = []
    for mult in (0.0, 0.5, 1.0, 1.5, 2.0):
        change = mult * T
        verdicts, used, covered, cells_seen = [], [], 0, 0
        for _ in range(args.trials):
            cells = [f"c{c}" for c in range(args.cells)]
            an = declare_analysis(cells=cells, threshold=T, alpha=alpha, max_mde=None, normalize=True,
                                  max_looks=args.blocks)
            rule = GateStopRule(threshold=T, alpha=alpha, max_mde=None, normalize=True, max_blocks=args.blocks,
                                analysis=an)
            recs = real_pools.gate_records(rng, pool, blocks=args.blocks, cells=args.cells, change=change)
            for look in range(1, args.blocks + 1):
                if rule.after_block([r for r in recs if r["repeat"] < look], look).stop:
                    break
            res = rule.compare([r for r in recs if r["repeat"] < look], look)
            verdicts.append(res["verdict"])
            used.append(look)
            for r in res["rows"]:
                if r.get("ci_low") is not None:
                    cells_seen += 1
                    covered += r["ci_low"] <= change <= r["ci_high"]
        n = len(verdicts)
        k_reg, k_pass = verdicts.count("regression"), verdicts.count("pass")
        lo_r, hi_r = wilson(k_reg, n)
        lo_p, hi_p = wilson(k_pass, n)
        cov = covered / cells_seen if cells_seen else float("nan")
        curve.append((change, k_reg / n, k_pass / n, float(np.mean(used))))
        print(f"{change:+10.1%}  {k_reg / n:6.1%} [{lo_r:.1%}, {hi_r:.1%}]  {k_pass / n:6.1%} [{lo_p:.1%}, {hi_p:.1%}]"
              f"  {verdicts.count('cannot judge') / n:11.1%}  {cov:8.1%}  {np.median(used):6.0f}  "
              f"{np.median(used) * wall:5.0f} s")
    # like for like: the smallest fixed design (one analysis after n blocks, the same rules at alpha / m) whose
    # power at 2T is at least the sequential gate's, at a false-regression rate of at most alpha
    from bench.gate.runs import paired_comparison

    seq_power = curve[-1][1]
    fixed, last = None, None
    for nb in range(4, args.blocks + 1, 2):
        rates = []
        for change in (0.0, 2 * T):
            reg = 0
            for _ in range(args.trials // 2):
                an = declare_analysis(cells=[f"c{c}" for c in range(args.cells)], threshold=T, alpha=alpha,
                                      max_mde=None, normalize=True, max_looks=1)
                res = paired_comparison(real_pools.gate_records(rng, pool, blocks=nb, cells=args.cells, change=change),
                                        threshold=T, alpha=alpha, analysis=an)
                reg += res["verdict"] == "regression"
            rates.append(reg / (args.trials // 2))
        last = (nb, rates)
        if rates[1] >= seq_power and rates[0] <= alpha:
            fixed = (nb, rates)
            break
    if fixed is None:
        nb, (f0, f2) = last
        print(f"no fixed design of up to {args.blocks} blocks reaches the sequential gate's power at 2T "
              f"({seq_power:.1%}); fixed {nb} blocks: regression {f2:.1%} at 2T, {f0:.1%} at 0 "
              f"({args.trials // 2} gates each); sequential mean blocks / {nb}: "
              + ", ".join(f"{c:+.1%}: {b / nb:.2f}" for c, _, _, b in curve))
    else:
        nb, (f0, f2) = fixed
        print(f"smallest fixed design as powerful at 2T: {nb} blocks ({nb * wall:.0f} s; regression {f2:.1%} at 2T, "
              f"{f0:.1%} at 0); sequential mean blocks / fixed blocks: "
              + ", ".join(f"{c:+.1%}: {b / nb:.2f}" for c, _, _, b in curve) + " (wall time, same seconds a block)")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.2))
        xs = [c[0] for c in curve]
        ax.plot(xs, [c[1] for c in curve], "o-", label="regression")
        ax.plot(xs, [c[2] for c in curve], "s-", label="pass")
        ax.axhline(alpha, ls=":", c="grey")
        ax.set_xlabel("true change of the candidate")
        ax.set_ylabel("probability")
        ax.xaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")


def pool_cmd(args: argparse.Namespace) -> None:
    """Write a gate pool (:func:`real_pools.record_gate_pool`) from interleaved gate sweep folders of unchanged code
    (``--from``) to ``--out``."""
    missing = [d for d in args.from_dir if not (Path(d) / "sweep.json").is_file()]
    if missing:
        raise SystemExit(f"pool: not a sweep folder (no sweep.json): {', '.join(missing)}")
    data = real_pools.record_gate_pool([Path(d) for d in args.from_dir], args.target)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    h = data["header"]
    print(f"wrote {out}: {len(data['gates'])} gates, {h['blocks']} blocks, {h['failed_runs']} failed run(s)")


def family_cmd(args: argparse.Namespace) -> None:
    """Family error of the interleaved gate at a true 0 on a gate pool (:func:`real_pools.gate_family`): per number of
    cells and probe correlation, ``--trials`` gates, the share with an interval missing 0 at some look and with a
    false verdict at some look, with their Wilson intervals and Monte Carlo standard errors."""
    pool = real_pools.load_pool(Path(args.pool))
    h = pool["header"]
    print(f"pool {Path(args.pool).name}: {len(pool['gates'])} gates, {h['blocks']} blocks, {h['failed_runs']} failed "
          f"run(s), {h['machine']}, load {h['load_average_mean']}; alpha {args.alpha}, threshold {args.threshold:.0%}, "
          f"up to {args.blocks} looks, {args.trials} gates a row, {'until the stop' if args.stop else 'all looks'}"
          + ("; synthetic probe blind to each gate's own mean" if args.offset_blind else ""))
    for cells in args.cells:
        for rho in args.rho:
            t0 = time.time()
            got = real_pools.gate_family(pool, reps=args.trials, cells=cells, looks=args.blocks, alpha=args.alpha,
                                         threshold=args.threshold, rho=None if rho < 0 else rho, seed=args.seed,
                                         stop=args.stop, offset_blind=args.offset_blind)
            n = got["n"]
            print(f"cells {cells} probe {'recorded' if rho < 0 else f'r={rho}'}: interval error {got['interval']:.2%} "
                  f"(MC SE {real_pools.mc_se(got['interval'], n):.2%}, 95 % {got['interval_ci'][0]:.2%}-"
                  f"{got['interval_ci'][1]:.2%}); false verdict {got['false']:.2%} (MC SE "
                  f"{real_pools.mc_se(got['false'], n):.2%}); pass {got['pass']:.1%}, blocks {got['blocks']:.1f} "
                  f"[{time.time() - t0:.0f} s]", flush=True)


def interleaved_sim(args: argparse.Namespace) -> None:
    """The interleaved gate's pass and detection rates by simulation: for each SD of a block's log ratio
    (``--sd-pair``), ``--trials`` gates of unchanged code and of a ``--slowdown``, each run look by look through
    :class:`bench.gate.interleaved.GateStopRule` (the sequential intervals, stop from block 3) up to ``--blocks``."""
    from bench.gate.interleaved import GateStopRule

    rng = np.random.default_rng(args.seed)
    print(f"interleaved gate, one cell, budget {args.blocks} blocks, threshold {DEFAULT_THRESHOLD:.0%}, "
          f"alpha {DEFAULT_ALPHA}, {args.trials} simulated gates per row")
    print("sd_pair  kind       pass  regression  cannot judge  blocks (median)")
    for sd in args.sd_pair:
        for kind, change in (("unchanged", 0.0), ("slowdown", args.slowdown)):
            verdicts, used = [], []
            for _ in range(args.trials):
                rule = GateStopRule(threshold=DEFAULT_THRESHOLD, alpha=DEFAULT_ALPHA, max_mde=None, normalize=False,
                                    max_blocks=args.blocks)
                recs = _sim_records(rng, change, args.blocks, sd)
                for look in range(1, args.blocks + 1):
                    got = rule.after_block([r for r in recs if r["repeat"] < look], look)
                    if got.stop:
                        break
                verdicts.append(rule.compare([r for r in recs if r["repeat"] < look], look)["verdict"])
                used.append(look)
            n = len(verdicts)
            print(f"{sd:7.3f}  {kind:9s} {verdicts.count('pass') / n:5.0%}  {verdicts.count('regression') / n:10.0%}  "
                  f"{verdicts.count('cannot judge') / n:12.0%}  {np.median(used):6.0f}")


def sweep_to_sweep_cmd(args: argparse.Namespace) -> None:
    """What a stored baseline would carry from sweep to sweep on this machine, measured: each gate sweep of an
    ``interleaved`` run (``--from`` its results folder) is one "saved sweep" of the baseline code (its baseline
    runs, block 0 left out: cold start); :func:`bench.gate.baseline.sweep_to_sweep` over them (the figure ``baseline
    save --force`` keeps), the part of it that the runs' own spread explains, the sweep's own offset SD, and the
    smallest change a stored-baseline gate (:func:`bench.gate.stored_runs.compare_runs`) could then see with
    ``--runs`` runs per side."""
    from bench.gate.baseline import history_entry, sweep_to_sweep
    from bench.gate.stored_runs import run_logs
    from bench.records.run_record import load_records
    from bench.records.snapshot import record_samples
    from bench.stats.power import mde_from_se

    tries = [json.loads(x) for x in (Path(args.from_dir) / "interleaved_tries.jsonl").read_text().splitlines()]
    history = []
    within: dict[str, list[float]] = {"raw": [], "normalized": []}
    run_vars: dict[str, list[float]] = {"raw": [], "normalized": []}
    for t in tries:
        by_cell: dict[str, list[dict]] = {}
        for r in load_records(t["sweep"]):
            if r.get("code_version") == "baseline" and r.get("status") == "ok" and r["repeat"] > 0:
                by_cell.setdefault(r["cell_id"], []).append({"status": "ok", "samples": record_samples(r)})
        cells = [{"key": k, "repeats": reps} for k, reps in by_cell.items()]
        history.append(history_entry({"cells": cells, "source": {"sweep": t["sweep"]}}))  # as `baseline save` keeps it
        for c in cells:  # the values the gate compares (bench.gate.stored_runs.run_logs), on both scales
            xs, ps = run_logs(c, "step_time", 1.0)
            scales = {"raw": xs, "normalized": [x - p for x, p in zip(xs, ps)] if None not in ps else []}
            for key, v in scales.items():
                if len(v) > 1:
                    run_vars[key].append(float(np.var(v, ddof=1)))
                    within[key].append(float(np.var(v, ddof=1)) / len(v))
    s2s = sweep_to_sweep(history)
    print(f"{len(history)} sweeps of the baseline code ({args.from_dir}): {s2s['note']}")

    def see(x: float) -> str:
        return f"{mde_from_se(x, alpha=DEFAULT_ALPHA, threshold=DEFAULT_THRESHOLD):.1%}"

    for scale, fig in (("raw", s2s), ("speed-normalized", s2s.get("normalized"))):
        key = "raw" if scale == "raw" else "normalized"
        if not fig or fig.get("sd_log") is None or not within[key]:
            continue
        off = math.sqrt(max(0.0, fig["sd_log"] ** 2 - float(np.mean(within[key]))))
        run_sd = math.sqrt(float(np.mean(run_vars[key])))
        se_in = math.sqrt(2 * run_sd ** 2 / args.runs)
        se = math.sqrt(se_in ** 2 + 2 * off ** 2)
        print(f"{scale}: SD of a run's log step time within a sweep {run_sd:.3f}, of the mean of a sweep's runs "
              f"{math.sqrt(float(np.mean(within[key]))):.3f}; a sweep's own offset: SD {off:.3f}. A stored-baseline "
              f"gate with {args.runs} runs per side sees {see(se)} at best (offsets ignored, within sweeps only: "
              f"{see(se_in)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("real", help="real embedded sweeps")
    r.add_argument("--sweeps", type=int, default=8, help="sweeps of each kind (default 8)")
    r.add_argument("--timed-steps", type=int, default=12)
    r.add_argument("--repeats", type=int, default=8, help="repeats per sweep (default 8, as the CI test)")
    r.add_argument("--results", default=str(Path(tempfile.gettempdir()) / "gate-bench"),
                   help="results folder (reused: finished sweeps are kept and the run resumes)")
    r.add_argument("--evaluate-only", action="store_true", help="only evaluate the sweeps already run")
    r.add_argument("--max-pressure", type=float, default=None,
                   help="also evaluate only the sweeps run while the CPU pressure stayed at or below this (%%)")
    s = sub.add_parser("synthetic", help="simulated sweeps with a noise model")
    s.add_argument("--from", dest="from_dir", default=None, help="estimate the noise from a real run's results folder")
    s.add_argument("--sd-step", type=float, default=0.05, help="step noise SD of log step time (default 0.05)")
    s.add_argument("--sd-sweep", type=float, default=0.02, help="sweep-to-sweep SD of log step time (default 0.02)")
    s.add_argument("--sd-run", type=float, default=0.01, help="run-to-run SD within a sweep (default 0.01)")
    s.add_argument("--repeats", type=int, default=2)
    s.add_argument(
        "--max-pressure", type=float, default=None, help="with --from: only sweeps at or below this CPU pressure"
    )
    s.add_argument("--paired-only", action="store_true", help="skip the unpaired evaluation")
    s.add_argument("--sd-work", type=float, default=0.10, help="SD of the per-step workload (default 0.10)")
    s.add_argument("--timed-steps", type=int, default=20)
    s.add_argument("--trials", type=int, default=1000)
    s.add_argument("--seed", type=int, default=0)
    i = sub.add_parser("interleaved", help="`gate --interleave HEAD` tries: unchanged code and an injected slowdown")
    i.add_argument("--matrix", default="matrix/gate.yaml", help="matrix (default matrix/gate.yaml, the CI gate matrix)")
    i.add_argument("--tries", type=int, default=10, help="gates of each kind (default 10)")
    i.add_argument("--slowdown", type=float, default=0.10, help="injected slowdown (default 0.10 of the step time)")
    i.add_argument("--phase", choices=("update", "rollout"), default="update",
                   help="where the slowdown goes: the end of the update phase (default) or right after generation")
    i.add_argument("--when", default="use_dynamic_bsz",
                   help="embedded RunConfig flag of the cell(s) slowed down (default use_dynamic_bsz)")
    i.add_argument("--blocks", type=int, default=None, help="--blocks of each gate (default: the matrix's repeats)")
    i.add_argument("--budget", default=None, help="--budget of each gate (a duration: 90s, 2m)")
    i.add_argument("--side-by-side", action="store_true", help="gate --side-by-side (both versions at once, pinned)")
    i.add_argument("--until", default=None, metavar="HH:MM",
                   help="UTC time: start no gate that would likely end after it; kill one still running then")
    i.add_argument("--set", action="append", default=[], metavar="base.KEY=VALUE", help="matrix override")
    i.add_argument("--results", default=str(Path(tempfile.gettempdir()) / "gate-bench-interleaved"),
                   help="work folder (clone, results, tries log; reused: tries already run are kept)")
    w = sub.add_parser("sweep-to-sweep", help="sweep-to-sweep variance a stored baseline carries, from gate sweeps")
    w.add_argument("--from", dest="from_dir", required=True, help="results folder of an `interleaved` run")
    w.add_argument("--runs", type=int, default=8, help="runs per side of the stored-baseline gate (default 8)")
    m = sub.add_parser("interleaved-sim", help="pass / detection rates of the interleaved gate by simulation")
    m.add_argument("--sd-pair", type=float, nargs="+", default=[0.02, 0.04, 0.06, 0.08, 0.16],
                   help="SDs of a block's log ratio to simulate")
    m.add_argument("--blocks", type=int, default=12)
    m.add_argument("--slowdown", type=float, default=0.10)
    m.add_argument("--trials", type=int, default=200)
    m.add_argument("--seed", type=int, default=0)
    o = sub.add_parser("oc", help="operating characteristic of the interleaved gate, resampling real gate sweeps")
    o.add_argument("--pool", default=str(real_pools.POOLS / "gate_aa_embedded.json"),
                   help="gate pool (benchmarks/pools/gate_*.json, written by the `pool` mode)")
    o.add_argument("--cells", type=int, default=1)
    o.add_argument("--blocks", type=int, default=40)
    o.add_argument("--trials", type=int, default=1000)
    o.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    o.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    o.add_argument("--seed", type=int, default=0)
    o.add_argument("--plot", default=None, help="PNG file for the curve")
    q = sub.add_parser("pool", help="write a gate pool from interleaved gate sweeps of unchanged code")
    q.add_argument("--from", dest="from_dir", nargs="+", required=True, help="gate sweep folders")
    q.add_argument("--target", default="embedded:cpu")
    q.add_argument("--out", default=str(real_pools.POOLS / "gate_aa_embedded.json"))
    f = sub.add_parser("family", help="family error at a true 0 on a gate pool, per cells and probe correlation")
    f.add_argument("--pool", default=str(real_pools.POOLS / "gate_aa_embedded.json"))
    f.add_argument("--cells", type=int, nargs="+", default=[1, 2, 4])
    f.add_argument("--rho", type=float, nargs="+", default=[-1.0, 0.5, 0.9],
                   help="probe correlations (a synthetic probe tracking the real block noise); -1: the recorded probe")
    f.add_argument("--blocks", type=int, default=12)
    f.add_argument("--trials", type=int, default=500)
    f.add_argument("--alpha", type=float, default=0.05)
    f.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    f.add_argument("--all-looks", dest="stop", action="store_false", help="every look, not only until the stop")
    f.add_argument("--offset-blind", action="store_true",
                   help="the synthetic probe sees none of a recorded gate's own mean (a stress case)")
    f.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.mode == "pool":
        pool_cmd(args)
        return
    if args.mode == "family":
        family_cmd(args)
        return
    if args.mode == "oc":
        oc(args)
        return
    if args.mode == "interleaved-sim":
        interleaved_sim(args)
        return
    if args.mode == "interleaved":
        interleaved(args)
        return
    if args.mode == "sweep-to-sweep":
        sweep_to_sweep_cmd(args)
        return
    if args.mode == "real":
        if args.evaluate_only:
            evaluate_real(read_json(Path(args.results) / "gate_bench_sweeps.json"), args.max_pressure)
        else:
            real(args)
            if args.max_pressure is not None:
                evaluate_real(read_json(Path(args.results) / "gate_bench_sweeps.json"), args.max_pressure)
    else:
        synthetic(args)


if __name__ == "__main__":
    main()
