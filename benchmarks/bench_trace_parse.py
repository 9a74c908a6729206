"""Throughput and peak memory of the streaming chrome-trace parser (``bench.measure.torch_trace``).

Not a test. Writes a synthetic Kineto-style trace of about ``--size-mb`` MB (default 300) into a
temporary folder, parses it in a fresh child process (so its peak RSS is the parser's alone), and
prints events/s and the child's peak RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) next to
the file size: the RSS stays near the interpreter's baseline plus 16 bytes per disjoint busy
segment, whatever the file size (``json.load`` would need several times the file size).

The synthetic trace: ``ProfilerStep#N`` windows of 10 ms on the main thread, each filled with
``cpu_op`` events and, on the device, kernels of 20 us every 25 us on stream 7 plus kernels nested
inside them on stream 13, so every window's expected Free ratio is exactly 0.2 (checked).

    python benchmarks/bench_trace_parse.py                 # ~300 MB
    python benchmarks/bench_trace_parse.py --size-mb 1500  # ~1.5 GB
    python benchmarks/bench_trace_parse.py --sizes 100 300 1000 --gzip
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP_US = 10_000.0
PERIOD_US = 25.0
EXPECTED_FREE = 0.2


def _step_events(step: int, t0: float, pid: int) -> list[str]:
    out = [
        f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "pid": {pid}, "tid": {pid}, '
        f'"ts": {t0:.3f}, "dur": {STEP_US:.3f}, '
        f'"args": {{"External id": {step}, "Record function id": 0, "Ev Idx": {step}}}}}'
    ]
    n = int(STEP_US / PERIOD_US)
    for i in range(n):
        ts = t0 + i * PERIOD_US
        corr = step * n + i
        out.append(
            f'{{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": {pid}, "tid": {pid}, "ts": {ts:.3f}, '
            f'"dur": 6.250, "args": {{"External id": {corr}, "Record function id": 0, "Sequence number": {corr}, '
            f'"Fwd thread id": 0, "Ev Idx": {corr}}}}}'
        )
        out.append(
            f'{{"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "pid": 0, "tid": 7, "ts": {ts:.3f}, '
            f'"dur": 20.000, "args": {{"External id": {corr}, "queued": 0, "device": 0, "context": 1, "stream": 7, '
            f'"correlation": {corr}, "registers per thread": 32, "shared memory": 0, "blocks per SM": 0.5, '
            f'"warps per SM": 2.0, "grid": [66, 1, 1], "block": [128, 1, 1], "est. achieved occupancy %": 3}}}}'
        )
        out.append(
            f'{{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "pid": 0, "tid": 13, '
            f'"ts": {ts + 10.0:.3f}, "dur": 10.000, "args": {{"External id": {corr}, "device": 0, "stream": 13, '
            f'"correlation": {corr}}}}}'
        )
    return out


def generate(path: Path, size_mb: float, use_gzip: bool) -> tuple[int, int]:
    """Write the trace; returns (events, steps). Streams to disk, holding one step at a time."""
    target = int(size_mb * 1024 * 1024)
    opener = gzip.open if use_gzip else open
    pid = 4242
    events = steps = 0
    written = 0
    with opener(path, "wt", encoding="utf-8") as fh:
        fh.write('{\n  "schemaVersion": 1,\n  "deviceProperties": [],\n  "traceEvents": [\n')
        t0 = 5091018480000.0
        first = True
        while written < target:
            chunk = _step_events(steps + 1, t0, pid)
            text = ("" if first else ",\n") + ",\n".join(chunk)
            fh.write(text)
            written += len(text)
            first = False
            events += len(chunk)
            steps += 1
            t0 += STEP_US + 500.0
        fh.write('\n  ],\n  "traceName": "synthetic"\n}\n')
    return events, steps


def parse_child(path: str) -> None:
    sys.path.insert(0, str(ROOT))
    from bench.measure.torch_trace import parse_trace_free

    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    tf = parse_trace_free(path)
    wall = time.perf_counter() - t
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ratios = [s.free_ratio for s in tf.steps]
    print(
        json.dumps(
            {
                "events": tf.events,
                "steps": len(tf.steps),
                "wall_s": wall,
                "peak_rss_mb": peak_kb / 1024,
                "rss_before_parse_mb": base_kb / 1024,
                "min_free": min(ratios),
                "max_free": max(ratios),
            }
        )
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=float, default=300.0, help="approximate (uncompressed) trace size")
    ap.add_argument("--sizes", type=float, nargs="+", help="several sizes, one parse each")
    ap.add_argument("--gzip", action="store_true", help="write .json.gz")
    ap.add_argument("--dir", help="where to write (default: a temporary folder, removed after)")
    ap.add_argument("--parse", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.parse:
        parse_child(args.parse)
        return 0

    sizes = args.sizes or [args.size_mb]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        print(
            f"{'size MB':>8} {'file MB':>8} {'events':>10} {'gen s':>7} {'parse s':>8} "
            f"{'events/s':>10} {'MB/s':>7} {'peak RSS MB':>12} {'free ratio':>11}"
        )
        for size in sizes:
            path = Path(tmp) / ("synthetic.pt.trace.json" + (".gz" if args.gzip else ""))
            t = time.perf_counter()
            events, _ = generate(path, size, args.gzip)
            gen_s = time.perf_counter() - t
            file_mb = path.stat().st_size / 1024 / 1024
            proc = subprocess.run(
                [sys.executable, __file__, "--parse", str(path)], capture_output=True, text=True, check=False
            )
            if proc.returncode != 0:
                print(proc.stderr, file=sys.stderr)
                return proc.returncode
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            assert r["events"] == events, (r["events"], events)
            ok = abs(r["min_free"] - EXPECTED_FREE) < 1e-6 and abs(r["max_free"] - EXPECTED_FREE) < 1e-6
            print(
                f"{size:8.0f} {file_mb:8.1f} {events:10d} {gen_s:7.1f} {r['wall_s']:8.1f} "
                f"{events / r['wall_s']:10.0f} {size / r['wall_s']:7.1f} {r['peak_rss_mb']:12.1f} "
                f"{r['min_free']:.4f}{'' if ok else ' (expected 0.2!)'}"
            )
            os.unlink(path)
            if not ok:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
