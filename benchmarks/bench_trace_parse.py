"""Trace parsing at disk speed: MB/s and peak RSS of ``bench.measure`` on one big trace (one core), on the
traces of 8 ranks (all cores) and on the Ascend outputs of 8 ranks, beside HTA (Holistic Trace Analysis) on the
same files when it is installed in another environment.

Not a test. In one run, on the same generated files (a temporary folder, or ``--dir``: reused there when made
with the same options, so a timing run can start from files written earlier; deleted at the end unless
``--keep``):

* ``1 x --big-mb`` (default 2048 MB), parsed in one process (``workers=1``): the per-core rate;
* ``--ranks`` x ``--rank-mb`` (default 8 x 250 MB), parsed by ``bench.measure.parse_traces`` over all
  cores (a process pool);
* the Ascend outputs of ``--ranks`` ranks (each: ``trace_view.json`` of ``--ascend-mb``, Ascend's layout;
  ``kernel_details.csv`` of ``--ascend-kernels-mb``; ``step_trace_time.csv``), read by the Ascend reader as
  ``collect()`` reads a run folder (every file of every rank at once over the cores, through the cache);
* each case twice, as the product runs it: through the parsed-profile cache, first empty (every file parsed,
  its content hash folded into the same read), then filled (every file hashed and answered by the cache:
  what ``record`` on resume and the MLflow log of the top operators cost);
* HTA 0.5 (``TraceAnalysis`` load, then ``get_temporal_breakdown``) on the two trace cases, in its own
  environment (``--hta-python``, or ``$HTA_PYTHON``; "HTA not installed" otherwise), under a time limit and
  an address-space cap so that it cannot take the machine down; what it reached is printed.

Each measurement runs in a fresh child process. Printed per case: wall seconds and MB/s, MB/s per core, CPU
seconds and MB/s (user + system of every process of the measurement: on a busy machine wall MB/s drops, CPU
MB/s much less), peak RSS: of the largest process, of the sum over all processes at any one time (shared
pages counted in each: an upper bound) and of each process (the measuring process, then the pool's processes:
workers, forkserver, resource tracker), the peak sum of PSS, ``os.getloadavg()`` before and after (sampled
every 0.05 s with psutil; the measuring process also ``ru_maxrss``), and whether every result is exact: the
Free ratio exactly 0.2 in every step of every trace (0.25 for Ascend's step trace), every step's top operators
present, every kernel row read.

The synthetic trace (Kineto's layout and field order): ``ProfilerStep#N`` windows of 1 s (``--step-ms``;
about 80 MB of events each) on the main thread; every 25 us a ``cpu_op`` with a ``cuda_runtime`` launch, a
flow pair (``ph`` ``s``/``f``), a GEMM kernel of 20 us on stream 7 and an NCCL kernel of 10 us nested in it
on stream 13, so every window's Free ratio is exactly 0.2 (kernels busy 20 us of every 25 us). About 340
bytes per event.

    python benchmarks/bench_trace_parse.py                                  # the acceptance run
    python benchmarks/bench_trace_parse.py --dir D --keep --generate-only   # write the files first, then:
    HTA_PYTHON=<venv>/bin/python python benchmarks/bench_trace_parse.py --dir D
    python benchmarks/bench_trace_parse.py --big-mb 300 --rank-mb 40 --ascend-mb 20 --no-hta   # a quick look
    python benchmarks/bench_trace_parse.py --candidates --big-mb 200 --ranks 0  # JSON libraries compared
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP_US = 1_000_000.0  #: one profiled step's window (--step-ms); a real GRPO step lasts seconds
PERIOD_US = 25.0
EXPECTED_FREE = 0.2
RANK_FIELD = b'"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8}'


def _window(step: int, t0: float, pid: int, dur: float) -> str:
    return (f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "pid": {pid}, "tid": {pid}, '
            f'"ts": {t0:.3f}, "dur": {dur:.3f}, "args": {{"External id": {step}, "Record function id": 0, '
            f'"Ev Idx": {step}}}}}')


def _iterations(first: int, count: int, t0: float, pid: int) -> list[str]:
    """The events of ``count`` 25-us iterations from iteration ``first`` of a window starting at ``t0``."""
    out = []
    for i in range(first, first + count):
        ts = t0 + i * PERIOD_US
        c = int(t0) + i
        out.append(
            f'{{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": {pid}, "tid": {pid}, "ts": {ts:.3f}, '
            f'"dur": 6.250, "args": {{"External id": {c}, "Record function id": 0, "Sequence number": {c}, '
            f'"Fwd thread id": 0, "Ev Idx": {c}}}}}'
        )
        out.append(
            f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": {pid}, "tid": {pid}, '
            f'"ts": {ts + 2:.3f}, "dur": 3.000, "args": {{"External id": {c}, "cbid": 211, "correlation": {c}}}}}'
        )
        out.append(f'{{"ph": "s", "id": {c}, "pid": {pid}, "tid": {pid}, "ts": {ts + 2:.3f}, "cat": "ac2g", '
                   f'"name": "ac2g"}}')
        out.append(
            f'{{"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "pid": 0, "tid": 7, "ts": {ts:.3f}, '
            f'"dur": 20.000, "args": {{"External id": {c}, "queued": 0, "device": 0, "context": 1, "stream": 7, '
            f'"correlation": {c}, "registers per thread": 32, "shared memory": 0, "blocks per SM": 0.5, '
            f'"warps per SM": 2.0, "grid": [66, 1, 1], "block": [128, 1, 1], "est. achieved occupancy %": 3}}}}'
        )
        out.append(f'{{"ph": "f", "id": {c}, "pid": 0, "tid": 7, "ts": {ts:.3f}, "cat": "ac2g", "name": "ac2g", '
                   f'"bp": "e"}}')
        out.append(
            f'{{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "pid": 0, '
            f'"tid": 13, "ts": {ts + 10.0:.3f}, "dur": 10.000, "args": {{"External id": {c}, "device": 0, '
            f'"stream": 13, "correlation": {c}}}}}'
        )
    return out


_TIME = re.compile(r'"(ts|dur)": ([0-9.]+)')


def generate(path: Path, size_mb: float, ascend: bool = False) -> tuple[int, int]:
    """Write a trace of ``size_mb`` MB of events (uncompressed; gzip level 1 when ``path`` ends ``.gz``);
    returns ``(events, steps)``. The last window is shortened to end with the file (its Free ratio is 0.2
    too). Writes 1000 iterations at a time, so this process stays small (a child it starts later inherits
    its peak RSS as its own ``ru_maxrss`` baseline). ``ascend``: the layout of Ascend's ``trace_view.json``
    (a bare array, ``ts``/``dur`` as strings)."""
    target = int(size_mb * 1024 * 1024)
    pid = 4242
    per_iter = len(",\n".join(_iterations(0, 1, 5091018480000.0, pid))) + 2
    full = int(STEP_US / PERIOD_US)
    events = steps = written = 0
    opener = (lambda p: gzip.open(p, "wt", encoding="utf-8", compresslevel=1)) if path.suffix == ".gz" else (
        lambda p: open(p, "w", encoding="utf-8"))
    with opener(path) as fh:
        fh.write("[\n" if ascend else '{\n  "schemaVersion": 1,\n  "deviceProperties": [],\n  '
                 + RANK_FIELD.decode() + ',\n  "traceEvents": [\n')
        t0 = 5091018480000.0
        while written < target:
            n = max(1, min(full, (target - written) // per_iter))
            steps += 1
            text = ("" if steps == 1 else ",\n") + _window(steps, t0, pid, n * PERIOD_US)
            for first in range(0, n, 1000):
                text += ",\n" + ",\n".join(_iterations(first, min(1000, n - first), t0, pid))
                if ascend:
                    text = _TIME.sub(r'"\1": "\2"', text)
                fh.write(text)
                written += len(text)
                text = ""
            events += 1 + 6 * n
            t0 += n * PERIOD_US + 500.0
        fh.write("\n]\n" if ascend else '\n  ],\n  "traceName": "synthetic"\n}\n')
    return events, steps


def copy_as_rank(src: Path, dst: Path, rank: int) -> None:
    """A copy of ``src`` whose ``distributedInfo.rank`` is ``rank`` (HTA keys files by it)."""
    shutil.copyfile(src, dst)
    new = RANK_FIELD.replace(b'"rank": 0', f'"rank": {rank}'.encode())
    assert len(new) == len(RANK_FIELD), "one-digit ranks only"
    with open(dst, "r+b") as fh:
        head = fh.read(4096)
        fh.seek(head.index(RANK_FIELD))
        fh.write(new)


class TreeSampler(threading.Thread):
    """Every ``period`` s: RSS, PSS and CPU times of this process and all its descendants (psutil); keeps the
    peak RSS of each process, the peak of the sum of RSS over the processes (shared pages counted in each:
    an upper bound) and the peak of the sum of PSS (shared pages split)."""

    def __init__(self, period: float = 0.05) -> None:
        super().__init__(daemon=True)
        import psutil

        self.me = psutil.Process()
        self.period = period
        self.stop = threading.Event()
        self.peak_rss: dict[int, int] = {}
        self.peak_rss_sum = self.peak_pss_sum = 0
        self.cpu: dict[int, float] = {}

    def sample(self) -> None:
        procs = [self.me]
        try:
            procs += self.me.children(recursive=True)
        except Exception:  # noqa: BLE001 - a process ending during the walk
            pass
        rss_sum = pss_sum = 0
        for p in procs:
            try:
                mem = p.memory_full_info()  # rss and pss
                t = p.cpu_times()
            except Exception:  # noqa: BLE001
                continue
            rss_sum += mem.rss
            pss_sum += mem.pss
            self.peak_rss[p.pid] = max(self.peak_rss.get(p.pid, 0), mem.rss)
            if p.pid != self.me.pid:
                self.cpu[p.pid] = t.user + t.system
        self.peak_rss_sum = max(self.peak_rss_sum, rss_sum)
        self.peak_pss_sum = max(self.peak_pss_sum, pss_sum)

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            time.sleep(self.period)


def _timed(fn) -> dict:
    """Run ``fn`` under a :class:`TreeSampler`: wall and CPU seconds (every process), peak RSS per process and
    summed, peak PSS summed (MB)."""
    sampler = TreeSampler()
    sampler.start()
    cpu0 = time.thread_time()  # this thread only: the sampler's own CPU is not the parser's
    t0 = time.perf_counter()
    value = fn()
    wall = time.perf_counter() - t0
    own_cpu = time.thread_time() - cpu0
    sampler.stop.set()
    sampler.join()
    sampler.sample()
    me = os.getpid()
    sampler.peak_rss[me] = max(sampler.peak_rss.get(me, 0), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    workers = {pid: v for pid, v in sampler.peak_rss.items() if pid != me}
    return {"value": value, "wall_s": wall, "cpu_s": own_cpu + sum(sampler.cpu.values()),
            "rss_main_mb": sampler.peak_rss[me] / 2**20,
            "rss_procs_mb": sorted((v / 2**20 for v in workers.values()), reverse=True),
            "rss_max_mb": max(sampler.peak_rss.values()) / 2**20,
            "rss_sum_mb": max(sampler.peak_rss_sum, sampler.peak_rss[me] if not workers else 0) / 2**20,
            "pss_sum_mb": sampler.peak_pss_sum / 2**20}


def parse_child(paths: list[str], workers: int, cache: str) -> None:
    """One measurement (run in a fresh process): parse through the cache folder ``cache`` (empty: every file is
    parsed, its hash folded into the read; filled: every file is hashed and answered by the cache), time,
    check, print one JSON line."""
    sys.path.insert(0, str(ROOT))
    from bench.measure import parse_traces

    stats: dict = {}
    r = _timed(lambda: parse_traces(paths, cache_dir=cache, workers=workers, stats=stats))
    got = r.pop("value")
    bad = [str(g) for g in got if not hasattr(g, "steps")]
    ratios = [s.free_ratio for g in got if hasattr(g, "steps") for s in g.steps]
    tops = all(t["device"] and t["cpu"] for g in got if hasattr(g, "steps") for t in g.top_ops)
    print(json.dumps({**r, "events": sum(g.events for g in got if hasattr(g, "steps")), "steps": len(ratios),
                      "exact": bool(ratios) and all(x == EXPECTED_FREE for x in ratios) and not bad and tops,
                      "errors": bad, "stats": stats}))


def ascend_child(root: str, cache_off: bool) -> None:
    """The Ascend reader on a run folder of rank folders (fresh process): Free ratio per rank and step from
    ``step_trace_time.csv``, every ``kernel_details.csv`` and ``trace_view.json`` parsed at once over the cores
    through the cache; one JSON line."""
    sys.path.insert(0, str(ROOT))
    from bench.measure.ascend import AscendReader
    from bench.measure.formats import ReadOptions

    if cache_off:
        os.environ["BENCH_TRACE_CACHE"] = "off"
    r = _timed(lambda: AscendReader().read(Path(root), ReadOptions()))
    m = r.pop("value")
    asc = m.fields["ascend"]
    free_ok = bool(m.free) and all(e["free_ratio"] == 0.25 for _, e in m.free)
    trace_ok = all(s["free_ratio"] == EXPECTED_FREE for t in asc["trace_view"] for s in t["steps"])
    kern_ok = all(k["bad_rows"] == 0 and k["rows"] == sum(s["kernels"] for s in k["steps"])
                  for k in asc["kernel_details"])
    print(json.dumps({**r, "ranks": len(asc["kernel_details"]), "traces": len(asc["trace_view"]),
                      "exact": free_ok and trace_ok and kern_ok and len(asc["trace_view"]) > 0,
                      "errors": m.warnings[:3]}))


HTA_SCRIPT = r"""
import json, resource, sys, time
cap = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
files = sys.argv[2:]
out = {"stage": "import"}
try:
    from hta.trace_analysis import TraceAnalysis
    t = time.perf_counter()
    out["stage"] = "load"
    ta = TraceAnalysis(trace_files={i: f for i, f in enumerate(files)})
    out["load_s"] = time.perf_counter() - t
    out["stage"] = "temporal breakdown"
    t = time.perf_counter()
    df = ta.get_temporal_breakdown(visualize=False)
    out["breakdown_s"] = time.perf_counter() - t
    out["idle_pctg"] = [float(x) for x in df["idle_time_pctg"]]
    out["stage"] = "done"
except BaseException as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"[:200]
out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
out["children_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps(out))
"""


def run_hta(python: str, files: list[Path], timeout: float, cap_gb: float) -> str:
    """HTA on ``files`` in its own interpreter and process group; a one-line account of what it did."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([python, "-c", HTA_SCRIPT, str(int(cap_gb * 2**30)), *map(str, files)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return f"not finished after {timeout:.0f} s (killed)"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its pool workers, if any are left
        except ProcessLookupError:
            pass
    wall = time.perf_counter() - t0
    try:
        r = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"exit {proc.returncode} after {wall:.1f} s, no result"
    mb = sum(json_bytes(f) for f in files) / 2**20
    text = f"{wall:.1f} s wall ({mb / wall:.1f} MB/s)"
    if "load_s" in r:
        text += f", load {r['load_s']:.1f} s"
    if r.get("stage") == "done":
        text += f", temporal breakdown {r['breakdown_s']:.1f} s, idle % {[round(x, 2) for x in r['idle_pctg']]}"
    else:
        text += f", stopped in {r['stage']}: {r.get('error')}"
    return text + f"; peak RSS {r['peak_rss_mb']:.0f} MB (+ workers {r['children_peak_rss_mb']:.0f} MB)"


def hta_python(arg: str | None) -> str | None:
    """The interpreter that imports ``hta`` (the option, ``$HTA_PYTHON``, then this one), or ``None``."""
    for cand in (arg, os.environ.get("HTA_PYTHON"), sys.executable):
        if cand and subprocess.run([cand, "-c", "import hta.trace_analysis"], capture_output=True,
                                   check=False).returncode == 0:
            return cand
    return None


def candidates(path: Path, mb_limit: float = 100.0) -> None:
    """Decode rate (CPU MB/s) of each JSON library on the first ``mb_limit`` MB of events of ``path``."""
    sys.path.insert(0, str(ROOT))
    from bench.measure import trace_fast

    data = path.read_bytes()[: int(mb_limit * 2**20)]
    start = data.index(b"[", data.index(b'"traceEvents"'))
    data = data[start: data.rindex(b"},\n{") + 1] + b"]"
    mb = len(data) / 2**20
    print(f"\nJSON libraries on {mb:.0f} MB of events (CPU seconds of this process):")

    def rate(label: str, fn) -> None:
        t = time.process_time()
        n = fn()
        print(f"  {label:58s} {mb / (time.process_time() - t):7.0f} MB/s  ({n} events)")

    import ijson
    import msgspec
    import orjson

    dec = msgspec.json.Decoder(list[trace_fast.Event])
    rate("msgspec, Struct of the 7 used fields (chosen)", lambda: len(dec.decode(data)))
    rate("msgspec, whole events as dicts", lambda: len(msgspec.json.decode(data)))
    rate("orjson, a batch of whole events as dicts", lambda: len(orjson.loads(data)))
    rate(f"ijson items ({ijson.backend}), one event at a time",
         lambda: sum(1 for _ in ijson.items(io.BytesIO(data), "item", use_float=True)))


KERNEL_HEADER = ("Device_id,Step Id,Model ID,Task ID,Stream ID,Name,Type,Accelerator Core,Start Time(us),"
                 "Duration(us),Wait Time(us),Block Dim,Input Shapes,Input Data Types,Output Shapes")


def make_ascend(root: Path, ranks: int, trace_mb: float, kernel_mb: float) -> None:
    """``ranks`` profile folders as torch_npu writes them: ``profiler_info_<r>.json`` and, in
    ``ASCEND_PROFILER_OUTPUT/``, a ``trace_view.json`` of ``trace_mb`` MB (the synthetic step in Ascend's
    layout: Free ratio 0.2 per window), a ``kernel_details.csv`` of ``kernel_mb`` MB (kernels of the same
    windows) and a ``step_trace_time.csv`` (Free ratio 0.25 in every step)."""
    root.mkdir(parents=True, exist_ok=True)
    view = root / "trace_view.json"
    _, steps = generate(view, trace_mb, ascend=True)
    header = ("Device_id,Step,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,Bubble,"
              "Communication(Not Overlapped and Exclude Receive),Preparing")
    for r in range(ranks):
        out = root / f"node0_{1000 + r}_20251101120000000_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
        out.mkdir(parents=True)
        (out.parent / f"profiler_info_{r}.json").write_text("{}")
        rows = [header] + [f"{r},{s},600.0,150.0,50.0,200.0,250.0,1000.0,0.0,150.0,12.5" for s in range(1, steps + 1)]
        (out / "step_trace_time.csv").write_text("\r\n".join(rows) + "\r\n")
        shutil.copyfile(view, out / "trace_view.json")
        target, written, i = int(kernel_mb * 2**20), 0, 0
        with open(out / "kernel_details.csv", "w", encoding="utf-8", newline="") as fh:
            fh.write(KERNEL_HEADER + "\r\n")
            while written < target:
                lines = []
                for k in range(i, i + 2000):
                    step = 1 + (k * steps) // max(1, int(target / 160))
                    name = ("MatMulV2", "FlashAttentionScore", "hcom_allReduce__1_0_1", "Add")[k % 4]
                    lines.append(f'{r},{min(step, steps)},4294967295,{k},2,{name},{name},AI_CORE,'
                                 f'"{5091018480000.0 + 25.0 * k:.3f}\t",20.000,0.5,24,"""4,1024;1024,1024""",DT_BF16,'
                                 f'"""4,1024"""')
                i += 2000
                text = "\r\n".join(lines) + "\r\n"
                fh.write(text)
                written += len(text)
    view.unlink()


def json_bytes(path: Path) -> int:
    """The JSON bytes a trace holds: its size, or for gzip the trailer's ISIZE (files under 4 GiB)."""
    if path.suffix != ".gz":
        return path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(-4, os.SEEK_END)
        return int.from_bytes(fh.read(4), "little")


def measure(child_args: list[str]) -> dict:
    """One measurement in a fresh child process (its own peak RSS); the load average before and after."""
    cmd = [sys.executable, __file__, *child_args]
    load0 = os.getloadavg()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    r["load"] = (load0[0], os.getloadavg()[0])
    return r


def tree_mb(root: Path) -> float:
    """MB of the profiler files below ``root`` (the cache folder left out)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and ".trace_cache" not in p.parts) / 2**20


def row(label: str, mb: float, n: int, r: dict) -> str:
    """One line of the table."""
    procs = "+".join(f"{x:.0f}" for x in r["rss_procs_mb"][:8]) or "-"
    return (f"{label:38s} {mb:6.0f} {r['wall_s']:7.2f} {mb / r['wall_s']:7.1f} {mb / r['wall_s'] / n:6.1f} "
            f"{r['cpu_s']:6.2f} {mb / max(r['cpu_s'], 1e-9):8.1f}   {r['rss_max_mb']:5.0f} / {r['rss_sum_mb']:5.0f} "
            f"({r['rss_main_mb']:.0f} main; workers {procs}) PSS {r['pss_sum_mb']:.0f}  "
            f"{r['load'][0]:5.2f} / {r['load'][1]:<5.2f} {'yes' if r['exact'] else 'NO'}"
            + (f" {r['errors']}" if r.get("errors") else ""))


def prepare(tmp: Path, args: argparse.Namespace) -> dict:
    """The input files in ``tmp`` (generated, or reused when ``manifest.json`` says they were made with the same
    options); returns the manifest."""
    want = {k: getattr(args, k) for k in ("big_mb", "ranks", "rank_mb", "gzip_mb", "ascend_mb", "ascend_kernels_mb",
                                          "step_ms")}
    manifest = tmp / "manifest.json"
    if manifest.is_file():
        have = json.loads(manifest.read_text())
        if have.get("options") == want:
            return have
        for child in tmp.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    t = time.perf_counter()
    big_events, _ = generate(tmp / "big.pt.trace.json", args.big_mb)
    if args.gzip_mb:
        generate(tmp / "packed.pt.trace.json.gz", args.gzip_mb)
    if args.ranks:
        generate(tmp / "rank0.pt.trace.json", args.rank_mb)
        for r in range(1, args.ranks):
            copy_as_rank(tmp / "rank0.pt.trace.json", tmp / f"rank{r}.pt.trace.json", r)
        if args.ascend_mb:
            make_ascend(tmp / "ascend", args.ranks, args.ascend_mb, args.ascend_kernels_mb)
    have = {"options": want, "big_events": big_events, "generated_s": time.perf_counter() - t}
    manifest.write_text(json.dumps(have))
    return have


def main() -> int:
    global STEP_US
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big-mb", type=float, default=2048.0, help="size of the one big trace (MB)")
    ap.add_argument("--ranks", type=int, default=8, help="traces of the parallel case (0: skip it)")
    ap.add_argument("--rank-mb", type=float, default=250.0, help="size of each rank's trace (MB)")
    ap.add_argument("--ascend-mb", type=float, default=100.0,
                    help="size of each Ascend rank's trace_view.json (MB; 0: no Ascend case)")
    ap.add_argument("--ascend-kernels-mb", type=float, default=25.0, help="size of each kernel_details.csv (MB)")
    ap.add_argument("--workers", type=int, default=0, help="processes of the parallel case (0: all cores)")
    ap.add_argument("--dir", help="where the input files are (reused when made with the same options) or written "
                    "(default: a temporary folder, removed after)")
    ap.add_argument("--keep", action="store_true", help="keep the files of --dir (to measure them again)")
    ap.add_argument("--generate-only", action="store_true", help="write the files into --dir and stop")
    ap.add_argument("--hta-python", help="python of an environment with HTA (default: $HTA_PYTHON)")
    ap.add_argument("--no-hta", action="store_true", help="do not run HTA")
    ap.add_argument("--hta-timeout", type=float, default=150.0, help="seconds HTA may take per case")
    ap.add_argument("--hta-mem-gb", type=float, default=6.0, help="HTA's address-space cap (GB)")
    ap.add_argument("--candidates", action="store_true", help="also compare the JSON libraries' decode rates")
    ap.add_argument("--step-ms", type=float, default=STEP_US / 1000, help="length of a step window (ms)")
    ap.add_argument("--gzip-mb", type=float, default=0.0, help="also one gzip trace of this many MB (uncompressed)")
    ap.add_argument("--parse", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    ap.add_argument("--ascend-root", help=argparse.SUPPRESS)
    ap.add_argument("--cache-off", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    STEP_US = args.step_ms * 1000.0
    if args.parse:
        parse_child(args.parse, args.workers or 1, args.cache)
        return 0
    if args.ascend_root:
        ascend_child(args.ascend_root, args.cache_off)
        return 0

    sys.path.insert(0, str(ROOT))
    from bench.measure.trace_cache import HASH
    from bench.measure.trace_fast import AVAILABLE
    from bench.measure.trace_pool import default_workers

    workers = args.workers or default_workers()
    if args.dir:
        tmp = Path(args.dir)
        tmp.mkdir(parents=True, exist_ok=True)
    else:
        tmp = Path(tempfile.mkdtemp(prefix="bench_trace_"))
    try:
        made = prepare(tmp, args)
        print(f"input: {made['generated_s']:.0f} s to generate; {os.cpu_count()} cores, {workers} workers; fast "
              f"reader (msgspec) {'on' if AVAILABLE else 'MISSING: ijson path'}; cache key {HASH} of every byte")
        if args.generate_only:
            return 0
        big = tmp / "big.pt.trace.json"
        ranks = [tmp / f"rank{r}.pt.trace.json" for r in range(args.ranks)]
        cases = [(f"1 x {args.big_mb:.0f} MB, 1 core", [big], 1)]
        if args.gzip_mb:
            cases.append((f"1 x {args.gzip_mb:.0f} MB .gz, 1 core", [tmp / "packed.pt.trace.json.gz"], 1))
        if ranks:
            cases.append((f"{len(ranks)} x {args.rank_mb:.0f} MB, {workers} cores", ranks, workers))
        print(f"\n{'case':38s} {'MB':>6s} {'wall s':>7s} {'MB/s':>7s} {'/core':>6s} {'CPU s':>6s} {'CPU MB/s':>8s}   "
              "peak RSS MB: max proc / sum of procs (each process)      load 1-min before/after  exact")
        for label, paths, n in cases:
            cache = tmp / f"cache-{label.split(',')[0].replace(' ', '')}"
            shutil.rmtree(cache, ignore_errors=True)
            mb = sum(json_bytes(p) for p in paths) / 2**20
            common = ["--parse", *map(str, paths), "--workers", str(n), "--cache", str(cache)]
            r = measure(common)
            print(row(label + ", parse (+ hash)", mb, n, r))
            r = measure(common)
            print(row("  again: cache hit (hash only)", mb, n, r) + f"  {r['stats']}")
        if ranks and args.ascend_mb:
            root = tmp / "ascend"
            shutil.rmtree(root / ".trace_cache", ignore_errors=True)
            mb = tree_mb(root)
            r = measure(["--ascend-root", str(root)])
            print(row(f"Ascend {len(ranks)} ranks x 3 files, {workers} cores", mb, workers, r))
            r = measure(["--ascend-root", str(root)])
            print(row("  again: cache hit (hash only)", mb, workers, r))
        hta = None if args.no_hta else hta_python(args.hta_python)
        print()
        for label, paths, _ in cases:
            if hta is None:
                print(f"HTA {label}: HTA not installed" + (" (--no-hta)" if args.no_hta else ""))
            else:
                print(f"HTA {label}: {run_hta(hta, paths, args.hta_timeout, args.hta_mem_gb)}")
        if args.candidates:  # last: it grows this process, and a child starts with its parent's peak RSS
            candidates(big)
        print(f"\n(big trace: {made['big_events']} events; files {'kept' if args.keep else 'deleted'}: {tmp})")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
