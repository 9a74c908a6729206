"""Wall time of one sweep with ``--parallel N`` versus ``--parallel 1`` on the same Ray cluster.

Not a test. Starts a local cluster of ``--nodes`` nodes on this machine (a head and worker raylets, each
``ray start --block`` with ``--num-cpus`` CPUs and one unit of the custom resource ``bench_node``, every node
on 127.0.0.1; ``tests/_rayhead.py``), or uses an existing one (``--ray-address``), then runs the same embedded
matrix (two cells, dynamic_bsz off/on, ``--repeats`` blocks, tiny steps) through the CLI once per value of
``--parallel`` (in the order given, fresh results folder each), and prints per sweep: the wall time of the
``run_bench.py run`` process, the runs, the mean wall time of a run (its Ray job), the median step time over
the runs (shows contention when the nodes share CPUs) and whether the runs of every block overlapped in time
on distinct nodes.

    python benchmarks/bench_ray_parallel.py --parallel 2 1 --repeats 4          # ~7 min on 2 cores
    python benchmarks/bench_ray_parallel.py --ray-address http://HEAD:8265 --parallel auto 1

On a cluster whose nodes are separate machines the runs of a block do not share CPUs; on this one machine
the nodes share its cores, so the figures bound what concurrency gains here from above by start-up overlap.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MATRIX = """
name: raypar_bench
engine: embedded
platform: cpu
base:
  steps: 3
  warmup_steps: 1
  profile_steps: []
  train_batch_size: 4
  n: 2
  ppo_mini_batch_size: 4
  micro_batch_size_per_gpu: 2
  max_prompt_length: 128
  max_response_length: 16
  timeout_s: 600
factors:
  dynamic_bsz: [off, on]
design: full
repeats: {repeats}
"""


def sweep(address: str, parallel: str, matrix: Path, work: Path) -> dict:
    """Run the matrix once with ``--parallel parallel``; the figures of that sweep."""
    results = work / f"results-p{parallel}"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "BENCH_RUN_DIR", "BENCH_PATCHES")}
    env["PYTHONPATH"] = str(ROOT)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), "run", str(matrix), "--ray-address", address,
                           "--parallel", parallel, "--results", str(results), "--order-seed", "1",
                           "--tracking-uri", f"sqlite:///{work / f'mlflow-p{parallel}.db'}"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"--parallel {parallel}: exit {proc.returncode}\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    (sweep_dir,) = [p for p in (results / "raypar_bench").iterdir() if p.is_dir() and not p.is_symlink()]
    recs = [json.loads(p.read_text()) for p in sweep_dir.glob("*/r*/record.json")]
    overlap = True
    for k in {r["repeat"] for r in recs}:
        block = [r for r in recs if r["repeat"] == k]
        if len(block) > 1:
            distinct = len({r["node"]["id"] for r in block}) == len(block)
            together = max(r["started_at"] for r in block) < min(r["finished_at"] for r in block)
            overlap = overlap and distinct and together
    return {"parallel": parallel, "wall_s": wall, "runs": len(recs), "ok": sum(r["status"] == "ok" for r in recs),
            "run_wall_s": statistics.mean(r["wall_s"] for r in recs),
            "step_s": statistics.median(r["summary"]["step_time_median_s"] for r in recs if r["status"] == "ok"),
            "nodes": len({r["node"]["id"] for r in recs}), "blocks_overlap": overlap}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parallel", nargs="+", default=["2", "1"], help="values of --parallel, run in this order")
    ap.add_argument("--repeats", type=int, default=4, help="blocks (repeats of each of the two cells)")
    ap.add_argument("--nodes", type=int, default=2, help="nodes of the local cluster")
    ap.add_argument("--num-cpus", type=int, default=1, help="logical CPUs of each local node")
    ap.add_argument("--ray-address", default=None, help="use this cluster instead of starting a local one")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="raypar-bench-") as tmp:
        work = Path(tmp)
        matrix = work / "raypar_bench.yaml"
        matrix.write_text(MATRIX.format(repeats=args.repeats))
        with contextlib.ExitStack() as stack:
            address = args.ray_address
            if address is None:
                sys.path.insert(0, str(ROOT / "tests"))
                from _rayhead import start_cluster

                nodes = [{"cpus": args.num_cpus, "resources": {"bench_node": 1}}] * args.nodes
                address = stack.enter_context(contextlib.contextmanager(start_cluster)({"RAY_AUTH_MODE": "disabled"},
                                                                                        nodes))
            rows = [sweep(address, str(p), matrix, work) for p in args.parallel]
    print(f"{'--parallel':>10} {'wall s':>8} {'runs':>5} {'ok':>3} {'run wall s':>10} {'step s':>7} {'nodes':>5} "
          "blocks overlap on distinct nodes")
    for r in rows:
        print(f"{r['parallel']:>10} {r['wall_s']:8.1f} {r['runs']:5d} {r['ok']:3d} {r['run_wall_s']:10.1f} "
              f"{r['step_s']:7.3f} {r['nodes']:5d} {r['blocks_overlap']}")
    base = next((r for r in rows if r["parallel"] == "1"), None)
    for r in rows:
        if base is not None and r is not base:
            print(f"--parallel {r['parallel']}: {base['wall_s'] / r['wall_s']:.2f}x faster than --parallel 1 "
                  f"({r['wall_s']:.1f} s vs {base['wall_s']:.1f} s)")
    print(f"load average after: {os.getloadavg()[0]:.2f} (2-core machine shared with other work)")


if __name__ == "__main__":
    main()
