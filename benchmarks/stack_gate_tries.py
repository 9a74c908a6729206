"""Acceptance tries of the gate between two stacks (issue 43): A/A gates and gates against a slowed source tree.

Not a test. Runs ``--tries`` gates of each kind, alternating (A/A, slowed, A/A, ...), one at a time, each as a user
runs it (``python run_bench.py gate --stacks BASE CAND --matrix M --budget B --force``, this checkout's harness):

* **A/A**: ``--matrix`` (default ``matrix/gate.yaml``: one embedded cell, short runs, one intra-op thread) with
  ``stacks: {a: {}, b: {}}``, gated ``--stacks a b``: the same stack declared twice, two fork servers started alike.
  The verdict must be pass (or cannot judge), never regression.
* **slowed**: ``stacks: {a: {}, slowed: {paths: [TREE]}}``, gated ``--stacks a slowed``. ``TREE`` (built under
  ``--results``, never in the repository) holds a copy of the installed ``verl`` whose
  ``compute_grpo_outcome_advantage`` (called once per GRPO step by the embedded engine) first does CPU work
  (products of a 128 x 128 float32 matrix) for ``--slowdown`` (default 0.10) of the wall time since its previous
  call ended: about one step without the planted work, so each step after the first takes ``1 + slowdown`` times
  as long whatever the machine's load (self-calibrating, like ``benchmarks/bench_gate.py``'s planted slowdowns).
  The verdict must be regression.

Each try records its verdict, exit code, blocks, wall seconds, the estimate (covariate-adjusted change and its
repeated confidence interval), the raw change, the SD of a block's log ratio and the load average
(``os.getloadavg``) before and after. Tries go to ``<results>/stack_tries.jsonl``; a rerun continues. At the end
(or with ``--summary``) it prints a markdown table and:

* per kind, the share with the wanted verdict and the share decided (pass or regression) within the budget;
* the A/A offset pooled over the A/A gates: the mean of their per-gate log-ratio estimates (``log(1 + change)``)
  with a t interval over gates (95 %, ``n - 1`` degrees of freedom), shown as a percentage (``exp(x) - 1``), and
  the same for the raw (not covariate-adjusted) estimates.

    python benchmarks/stack_gate_tries.py --tries 10 --budget 7m --results /tmp/stack-tries --until 18:55
    python benchmarks/stack_gate_tries.py --results /tmp/stack-tries --summary
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shutil
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import yaml
from scipy import stats as sps

ROOT = Path(__file__).resolve().parent.parent

#: appended to the copied ``verl/trainer/ppo/core_algos.py`` (``{fraction}`` filled in)
PLANTED = """

# planted by benchmarks/stack_gate_tries.py: {fraction:.0%} of a step's time as CPU work, once per GRPO step
import time as _bench_time
_bench_grpo = compute_grpo_outcome_advantage
_bench_last = [None]


def compute_grpo_outcome_advantage(*args, **kwargs):
    now = _bench_time.perf_counter()
    if _bench_last[0] is not None:
        until = now + {fraction!r} * (now - _bench_last[0])
        w = torch.full((128, 128), 1.0 / 128)
        while _bench_time.perf_counter() < until:
            w = w @ w
    out = _bench_grpo(*args, **kwargs)
    _bench_last[0] = _bench_time.perf_counter()
    return out
"""


def slowed_tree(dst: Path, fraction: float) -> Path:
    """``dst`` holding ``verl/``: a copy of the installed verl with :data:`PLANTED` appended to its
    ``trainer/ppo/core_algos.py``; rebuilt each call. Returns ``dst``."""
    src = Path(find_spec("verl").origin).parent
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst / "verl", ignore=shutil.ignore_patterns("__pycache__"))
    algos = dst / "verl" / "trainer" / "ppo" / "core_algos.py"
    text = algos.read_text()
    assert "def compute_grpo_outcome_advantage(" in text, "verl has no compute_grpo_outcome_advantage"
    algos.write_text(text + PLANTED.format(fraction=fraction))
    return dst


def write_matrix(src: Path, dst: Path, stacks: dict) -> Path:
    """``src`` (a matrix file) with ``stacks`` as its ``stacks:`` block, written to ``dst``."""
    text = src.read_text().rstrip("\n") + "\n" + yaml.safe_dump({"stacks": stacks}, sort_keys=False)
    dst.write_text(text)
    return dst


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def _line(e: dict) -> str:
    r = (e.get("rows") or [{}])[0]
    sd = "-" if r.get("sd_pair") is None else f"{r['sd_pair']:.3f}"
    return (f"| {e['try']} | {e['started_utc']} | {e['kind']} | {e['verdict']} ({e['exit']}) | {e['blocks']} | "
            f"{e['wall_s']:.0f} | {_pct(r.get('change'))} [{_pct(r.get('ci_low'))}, {_pct(r.get('ci_high'))}] | "
            f"{_pct(r.get('raw_change'))} | {sd} | {e['load_before'][0]:.1f} / {e['load_after'][0]:.1f} |")


def pooled(values: list[float], level: float = 0.95) -> tuple[float, float, float] | None:
    """``(mean, low, high)`` of log ratios ``values`` over gates, t interval (``n - 1`` df) at ``level``, all
    as fractions (``exp(x) - 1``); ``None`` for fewer than 2 values."""
    x = np.asarray(values, float)
    if len(x) < 2:
        return None
    m, se = float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x)))
    h = float(sps.t.ppf(0.5 + level / 2, len(x) - 1)) * se
    return math.expm1(m), math.expm1(m - h), math.expm1(m + h)


def cpu_ratios(sweep: str | Path) -> list[float]:
    """Per complete block of a gate sweep, ``log(cpu_cand / cpu_base)`` of the runs' median step CPU time
    (``summary.cpu_time_median_s`` of each ``record.json``): the comparison without the CPU share the machine's other
    jobs took (a wall-time ratio carries it)."""
    runs: dict[int, dict[str, float]] = {}
    for rec in Path(sweep).glob("*/r*/record.json"):
        r = json.loads(rec.read_text())
        cpu = (r.get("summary") or {}).get("cpu_time_median_s")
        if r.get("status") == "ok" and cpu:
            runs.setdefault(r["repeat"], {})[r["code_version"]] = float(cpu)
    return [math.log(v["candidate"] / v["baseline"]) for _, v in sorted(runs.items()) if len(v) == 2]


def summary(done: list[dict]) -> None:
    """Print the table of ``done`` tries and the shares and pooled A/A offset (module docstring)."""
    print("| try | start (UTC) | kind | verdict (exit) | blocks | wall s | change [RCI] | raw change | "
          "SD block log ratio | load 1 min before / after |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for e in done:
        print(_line(e))
    for kind, want in (("A/A", "pass"), ("slowed", "regression")):
        runs = [e for e in done if e["kind"] == kind]
        if not runs:
            continue
        k = sum(e["verdict"] == want for e in runs)
        dec = sum(e["verdict"] in ("pass", "regression") for e in runs)
        wrong = sum(e["verdict"] == ("regression" if want == "pass" else "pass") for e in runs)
        walls = [e["wall_s"] for e in runs]
        print(f"{kind}: {want} in {k} of {len(runs)}; wrong verdicts {wrong}; decided within the budget {dec} of "
              f"{len(runs)}; wall {min(walls):.0f}-{max(walls):.0f} s (median {np.median(walls):.0f}); blocks "
              f"{min(e['blocks'] for e in runs)}-{max(e['blocks'] for e in runs)}")
    dec = sum(e["verdict"] in ("pass", "regression") for e in done)
    print(f"decided within the budget: {dec} of {len(done)}")
    for key, what in (("change", "covariate-adjusted"), ("raw_change", "raw")):
        vals = [math.log1p(r[key]) for e in done if e["kind"] == "A/A" for r in e["rows"][:1]
                if r.get(key) is not None]
        p = pooled(vals)
        if p is not None:
            print(f"A/A offset ({what}), mean over {len(vals)} gates: {p[0]:+.2%} (95 % t interval over gates "
                  f"{p[1]:+.2%} to {p[2]:+.2%})")
    for kind in ("A/A", "slowed"):
        per = [cpu_ratios(e["sweep"]) for e in done if e["kind"] == kind and e.get("sweep")]
        per = [x for x in per if x]
        p = pooled([float(np.mean(x)) for x in per])
        if p is not None:
            sd = [float(np.std(x, ddof=1)) for x in per if len(x) > 1]
            print(f"{kind}, median step CPU time: mean over {len(per)} gates of the per-gate mean block log ratio "
                  f"{p[0]:+.2%} (95 % t interval over gates {p[1]:+.2%} to {p[2]:+.2%}); SD of a block's CPU-time "
                  f"log ratio median {np.median(sd):.3f}")
    sds = [r["sd_pair"] for e in done for r in e["rows"][:1] if r.get("sd_pair") is not None]
    if sds:
        print(f"SD of a block's log ratio: median {np.median(sds):.3f} (range {min(sds):.3f}-{max(sds):.3f})")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tries", type=int, default=10, help="gates of each kind (default 10)")
    ap.add_argument("--budget", default="7m", help="each gate's --budget (default 7m, the CI gate's)")
    ap.add_argument("--matrix", default="matrix/gate.yaml", help="the gate matrix (without stacks:)")
    ap.add_argument("--slowdown", type=float, default=0.10, help="planted slowdown, fraction of a step")
    ap.add_argument("--results", required=True, help="work folder (tree, matrices, results, tries log)")
    ap.add_argument("--until", help="HH:MM (UTC): start no gate that would likely end after it")
    ap.add_argument("--summary", action="store_true", help="only print the table of the tries logged")
    args = ap.parse_args(argv)
    work = Path(args.results).resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "stack_tries.jsonl"
    done = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    if args.summary:
        summary(done)
        return
    src = (ROOT / args.matrix).resolve()
    tree = slowed_tree(work / "tree", args.slowdown)
    matrices = {"A/A": (write_matrix(src, work / "aa.yaml", {"a": {}, "b": {}}), ("a", "b")),
                "slowed": (write_matrix(src, work / "slowed.yaml", {"a": {}, "slowed": {"paths": [str(tree)]}}),
                           ("a", "slowed"))}
    until = None
    if args.until:
        hh, mm = map(int, args.until.split(":"))
        now = dt.datetime.now(dt.timezone.utc)
        until = now.replace(hour=hh, minute=mm, second=0, microsecond=0).timestamp()
    kinds = [k for _ in range(args.tries) for k in ("A/A", "slowed")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for i, kind in enumerate(kinds[len(done):], len(done)):
        walls = [e["wall_s"] for e in done] or [240.0]
        if until is not None and time.time() + float(np.median(walls)) > until:
            print(f"stopping before try {i}: a gate (median {np.median(walls):.0f} s) would end after {args.until} UTC")
            break
        matrix, (base, cand) = matrices[kind]
        results = work / "results" / ("aa" if kind == "A/A" else "slowed")
        cmd = [sys.executable, "run_bench.py", "gate", "--stacks", base, cand, "--matrix", str(matrix),
               "--budget", args.budget, "--force", "--results", str(results),
               "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}"]
        t0, load0 = time.time(), os.getloadavg()
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall, load1 = time.time() - t0, os.getloadavg()
        found = [p for p in results.glob("*/2*/gate/gate.json") if p.stat().st_mtime >= t0]
        if res.returncode not in (0, 1, 3) or not found:
            print(f"try {i} {kind}: gate ended with exit {res.returncode} and no verdict: {res.stderr[-600:]}")
            break
        g = json.loads(found[0].read_text())
        entry = {"try": i, "kind": kind, "exit": res.returncode, "verdict": g.get("verdict"), "wall_s": wall,
                 "blocks": g.get("blocks_run"), "sweep": g.get("sweep"), "load_before": load0, "load_after": load1,
                 "started_utc": dt.datetime.fromtimestamp(t0, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
                 "rows": [{k: r.get(k) for k in ("cell", "verdict", "change", "raw_change", "ci_low", "ci_high",
                                                 "sd_pair", "mde", "blocks_needed", "normalized", "reason")}
                          for r in g.get("rows", [])]}
        done.append(entry)
        with open(log, "a") as fh:
            fh.write(json.dumps(entry) + "\n")
        print(_line(entry), flush=True)
    summary(done)


if __name__ == "__main__":
    main()
