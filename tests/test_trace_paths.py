"""The fast trace reader (msgspec batches) and the reference path (ijson, one event at a time) give the same
Free ratios and step tables on every trace fixture — torch CPU trace, GPU trace, Ascend-style
``trace_view.json`` (bare array, string timestamps, one line, separators inside strings and nested
objects in ``args``) — plain, gzip, re-laid-out, cut short at many places, and in batches small enough to
put a batch boundary next to every event. Also: the fallback without msgspec installed, the parallel pool
and the parsed-trace cache."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.measure import (
    MeasureError,
    collect,
    parse_trace_free,
    parse_traces,
    torch_trace,
    trace_cache,
    trace_fast,
    trace_ops,
    trace_pool,
)
from bench.measure.trace_scan import scan_trace

FIX = Path(__file__).parent / "fixtures" / "measure"
FIXTURES = ["gpu_two_steps.pt.trace.json", "cpu_two_steps.pt.trace.json", "ascend_trace_view.json"]
ROOT = Path(__file__).resolve().parents[1]


def _both(path: Path) -> tuple[object, object]:
    """``to_dict()`` of both paths (or the error message each raised); the fast one must really be fast."""
    out = []
    for engine in ("fast", "ijson"):
        try:
            tf = parse_trace_free(path, engine=engine)
            d = tf.to_dict()
        except MeasureError as exc:
            d = ("MeasureError", type(exc).__name__)
        out.append(d)
    return out[0], out[1]


def _layouts(name: str, tmp: Path) -> list[Path]:
    """The fixture as written, compact one-line, pretty with an indent, and gzip of each."""
    src = FIX / name
    data = json.loads(src.read_text())
    files = [src]
    for tag, text in (("compact", json.dumps(data, separators=(",", ":"))), ("indent", json.dumps(data, indent=2))):
        p = tmp / f"{tag}_{name}"
        p.write_text(text)
        files.append(p)
    for p in list(files):
        gz = tmp / f"{p.name}.gz"
        gz.write_bytes(gzip.compress(p.read_bytes()))
        files.append(gz)
    return files


@pytest.mark.parametrize("name", FIXTURES)
def test_fast_and_reference_agree_on_every_layout(name, tmp_path, monkeypatch):
    for path in _layouts(name, tmp_path):
        fast, ref = _both(path)
        assert fast == ref, path.name
        assert fast["steps"], path.name  # every fixture has Free ratios
        assert scan_trace(path, engine="fast").engine == "fast", path.name
        # a batch boundary next to every event: the result does not depend on where batches end
        monkeypatch.setattr(trace_fast, "CHUNK", 97)
        assert parse_trace_free(path, engine="fast").to_dict() == ref, path.name
        monkeypatch.undo()


@pytest.mark.parametrize("name", FIXTURES)
def test_fast_and_reference_agree_on_traces_cut_short(name, tmp_path, monkeypatch):
    """A run killed while writing its trace: both paths read the same whole events and warn the same."""
    raw = json.dumps(json.loads((FIX / name).read_text()), indent=1).encode()
    cuts = {int(len(raw) * k / 40) for k in range(1, 40)} | {raw.rfind(b"]"), raw.rfind(b"]") + 1, len(raw) - 1}
    cuts = sorted(c for c in cuts if c < len(raw))
    fast_seen = 0
    for cut in cuts:
        for gz in (False, True):
            p = tmp_path / f"cut{cut}.json{'.gz' if gz else ''}"
            p.write_bytes(gzip.compress(raw[:cut]) if gz else raw[:cut])
            fast, ref = _both(p)
            assert fast == ref, (cut, gz)
            if isinstance(ref, dict) and ref["events"]:
                assert any("cut short" in w for w in ref["warnings"]), cut
                fast_seen += scan_trace(p, engine="fast").engine == "fast"
            monkeypatch.setattr(trace_fast, "CHUNK", 113)
            assert _both(p) == (fast, ref), (cut, gz)
            monkeypatch.undo()
    assert fast_seen > len(cuts)  # most cut files are read by the fast path itself, not handed back


def test_odd_files_are_handed_to_the_reference_path(tmp_path):
    """Shapes the fast reader cannot be sure of go to ijson, so the result is still the reference one."""
    base = json.loads((FIX / "gpu_two_steps.pt.trace.json").read_text())
    cases = {
        "bool_ts": {**base, "traceEvents": [*base["traceEvents"], {"ph": "X", "cat": "kernel", "ts": True, "dur": 1}]},
        "number_item": {**base, "traceEvents": [*base["traceEvents"], 7]},
        "int_times": {**base, "traceEvents": [
            {**e, "ts": int(e["ts"]), "dur": int(e["dur"])} if "dur" in e else e for e in base["traceEvents"]]},
        "late_key": {"otherData": {"x": [1, 2]}, "traceEvents": base["traceEvents"], "traceName": "t"},
        "no_events": {"schemaVersion": 1},
        "long_trailer": {"traceEvents": base["traceEvents"], "deviceProperties": [
            {"id": i, "dims": [1, 2], "name": "},{]"} for i in range(100)]},
    }
    for tag, data in cases.items():
        p = tmp_path / f"{tag}.json"
        p.write_text(json.dumps(data))
        fast, ref = _both(p)
        assert fast == ref, tag
    dup = tmp_path / "dup.json"
    dup.write_text('{"traceEvents": [], "x": 1, "traceEvents": ' + json.dumps(base["traceEvents"]) + "}")
    assert _both(dup)[0] == _both(dup)[1]
    assert scan_trace(dup, engine="fast").engine == "ijson"


def test_fallback_without_msgspec_gives_the_same(tmp_path):
    """msgspec missing (a C library that did not install): the module imports and ijson reads the traces."""
    code = (
        "import sys, json; sys.modules['msgspec'] = None\n"
        "from bench.measure import parse_trace_free\n"
        "from bench.measure import trace_fast\n"
        "assert not trace_fast.AVAILABLE\n"
        f"print(json.dumps([parse_trace_free(p).to_dict() for p in {[str(FIX / n) for n in FIXTURES]!r}]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    want = [json.loads(json.dumps(parse_trace_free(FIX / n, engine="fast").to_dict())) for n in FIXTURES]
    assert got == want


def test_collect_is_the_same_with_either_engine(tmp_path, monkeypatch):
    """The whole measurement of a run folder — Free ratio per step and its sources, every trace's step table and
    top operators (torch CPU, GPU, gzip, cut short), an Ascend rank's ``trace_view.json``, and the run's
    summary with its phase table (``phase_median_s``) — is the same on both paths."""
    from bench.measure import summarize

    run = tmp_path / "run"
    (run / "trace").mkdir(parents=True)
    for name in FIXTURES[:2]:
        (run / "trace" / name).write_bytes((FIX / name).read_bytes())
    (run / "trace" / "rank1.pt.trace.json.gz").write_bytes(gzip.compress((FIX / FIXTURES[0]).read_bytes()))
    cut = json.dumps(json.loads((FIX / FIXTURES[0]).read_text()), indent=1).encode()
    (run / "trace" / "rank2_cut.pt.trace.json.gz").write_bytes(gzip.compress(cut[: len(cut) * 3 // 4]))
    asc = run / "node0_1_20251101120000000_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    asc.mkdir(parents=True)
    (asc.parent / "profiler_info_0.json").write_text("{}")
    (asc / "trace_view.json").write_bytes((FIX / "ascend_trace_view.json").read_bytes())
    (asc / "step_trace_time.csv").write_text("Step,Computing,Communication(Not Overlapped),Free\n3,600,150,250\n")
    (run / "metrics.jsonl").write_bytes((FIX / "verl06_metrics.jsonl").read_bytes())
    out, summary = {}, {}
    for engine in ("fast", "ijson"):
        monkeypatch.setenv("BENCH_TRACE_ENGINE", engine)
        monkeypatch.setenv("BENCH_TRACE_CACHE", "off")
        out[engine] = collect(run)
        summary[engine] = summarize(out[engine], 1)
    assert out["fast"] == out["ijson"]
    assert summary["fast"] == summary["ijson"] and summary["fast"]["phase_median_s"]
    assert [t["path"] for t in out["fast"]["traces"]] == ["trace/cpu_two_steps.pt.trace.json",
                                                        "trace/gpu_two_steps.pt.trace.json",
                                                        "trace/rank1.pt.trace.json.gz",
                                                        "trace/rank2_cut.pt.trace.json.gz"]
    assert all(t["top_ops"] for t in out["fast"]["traces"])
    assert [s["step"] for s in out["fast"]["ascend"]["trace_view"][0]["steps"]] == [3, 4]
    assert out["fast"]["free_ratio"][1] == 0.25 and out["fast"]["free_ratio"][2] == 0.7


def test_pool_and_cache(tmp_path, monkeypatch):
    """Several files in worker processes give what one process gives; a second read comes from the cache."""
    files = []
    for i in range(4):
        p = tmp_path / f"rank{i}.json"
        p.write_bytes((FIX / FIXTURES[i % 3]).read_bytes())
        files.append(p)
    missing = tmp_path / "missing.json"
    alone = [parse_trace_free(p).to_dict() for p in files]
    monkeypatch.setattr(trace_pool, "POOL_MIN_BYTES", 0)
    cache = tmp_path / ".trace_cache"
    stats: dict = {}
    got = parse_traces([*files, missing], cache_dir=cache, workers=2, stats=stats)
    assert [g.to_dict() for g in got[:4]] == alone
    assert isinstance(got[4], MeasureError)
    assert stats == {"hits": 0, "parsed": 4}
    assert len(list(cache.glob("trace-*.json"))) == 3  # files 0 and 3 hold the same bytes: one content key

    # the cache answers: a parse would now fail (the engine name is invalid), the cached read does not
    monkeypatch.setenv("BENCH_TRACE_ENGINE", "nonsense")
    stats = {}
    again = parse_traces(files, cache_dir=cache, workers=2, stats=stats)
    assert [g.to_dict() for g in again] == alone
    assert stats == {"hits": 4, "parsed": 0}
    # a changed file is a new key: parsed again (and the invalid engine now says so)
    files[1].write_bytes(files[1].read_bytes() + b"\n")
    assert isinstance(parse_traces(files[1:2], cache_dir=cache, workers=1)[0], MeasureError)
    monkeypatch.delenv("BENCH_TRACE_ENGINE")
    assert parse_traces(files[1:2], cache_dir=cache, workers=1)[0].to_dict() == alone[1]
    # the key is the content: not the name, inode or mtime; a byte changed in the middle, size and mtime kept,
    # is a new key
    assert trace_cache.content_hash(files[0]) == trace_cache.content_hash(files[3])
    st = os.stat(files[2])
    data = bytearray(files[2].read_bytes())
    data[len(data) // 2] ^= 0x01
    files[2].write_bytes(bytes(data))
    os.utime(files[2], ns=(st.st_atime_ns, st.st_mtime_ns))
    stats = {}
    parse_traces(files[2:3], cache_dir=cache, workers=1, stats=stats)
    assert stats == {"hits": 0, "parsed": 1}
    monkeypatch.setenv("BENCH_TRACE_CACHE", "sometimes")
    with pytest.raises(MeasureError, match="BENCH_TRACE_CACHE"):
        parse_traces(files, cache_dir=cache)


def test_collect_reads_a_run_folder_again_from_the_cache(tmp_path, monkeypatch):
    """``collect`` twice on one run folder (record on resume, a re-measure): the second never parses."""
    run = tmp_path / "run"
    (run / "trace").mkdir(parents=True)
    for name in FIXTURES[:2]:
        (run / "trace" / name).write_bytes((FIX / name).read_bytes())
    first = collect(run)
    assert len(list((run / trace_cache.CACHE_DIR).glob("trace-*.json"))) == 2

    def no_parse(*args, **kwargs):
        raise AssertionError("parsed again")

    monkeypatch.setattr(torch_trace, "parse_trace_hashed_dict", no_parse)
    assert collect(run) == first
    monkeypatch.setenv("BENCH_TRACE_CACHE", "off")
    with pytest.raises(AssertionError, match="parsed again"):
        collect(run)


def test_no_pool_parses_one_by_one(tmp_path, monkeypatch):
    """Where no worker process can be started, the traces are parsed in the calling process."""
    files = [FIX / n for n in FIXTURES]

    def no_processes(*args, **kwargs):
        raise OSError("no processes here")

    monkeypatch.setattr(trace_pool, "POOL_MIN_BYTES", 0)
    monkeypatch.setattr(trace_pool, "ProcessPoolExecutor", no_processes)
    got = parse_traces(files, workers=2)
    assert [g.to_dict() for g in got] == [parse_trace_free(p).to_dict() for p in files]


def test_gzip_cut_short_is_read_to_the_cut_by_both_paths(tmp_path):
    """A gzip trace of a killed run: every whole event before the cut, on both paths (a plain ``read(n)`` of
    gzip drops what it gathered in the call that meets the cut)."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0.0,
               "dur": 1e6}]
    for i in range(40000):
        events.append({"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": 20.0 * i,
                       "dur": 10.0, "args": {"correlation": i, "grid": [i % 97, 1, 1]}})
    raw = json.dumps({"schemaVersion": 1, "traceEvents": events}, indent=1).encode()
    packed = gzip.compress(raw, 6)
    p = tmp_path / "cut.json.gz"
    p.write_bytes(packed[: len(packed) * 2 // 3])
    prefix = gzip.GzipFile(fileobj=io.BytesIO(packed[: len(packed) * 2 // 3]))
    text = b""
    try:
        while chunk := prefix.read1(1 << 16):
            text += chunk
    except EOFError:
        pass
    whole = text.count(b'"args"') - 1  # the last event begun is not whole (the cut is mid-stream)
    fast, ref = _both(p)
    assert fast == ref
    assert fast["events"] in (whole, whole + 1)
    assert scan_trace(p, engine="fast").engine == "fast"
    assert fast["warnings"] == [f"trace cut short after {fast['events']} events; read what was there"]


@pytest.mark.parametrize("chunk", [None, 61])
def test_an_escaped_window_name_is_still_a_window(tmp_path, monkeypatch, chunk):
    """A window name written with a JSON escape is a window on both paths, however the batches fall."""
    text = (FIX / "cpu_two_steps.pt.trace.json").read_text().replace('"ProfilerStep#1"', '"Profiler\\u0053tep#1"')
    assert "Profiler\\u0053tep#1" in text
    p = tmp_path / "escaped.json"
    p.write_text(text)
    if chunk:
        monkeypatch.setattr(trace_fast, "CHUNK", chunk)
    fast, ref = _both(p)
    assert fast == ref
    assert [s["step"] for s in fast["steps"]] == [1, 2]


def test_cut_inside_an_event_with_nested_objects(tmp_path, monkeypatch):
    """Cut inside an event whose ``args`` hold many objects (separators that are not event boundaries)."""
    base = json.loads((FIX / "gpu_two_steps.pt.trace.json").read_text())
    nested = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": base["traceEvents"][-1]["ts"],
              "dur": 1.0, "args": {"inputs": [{"shape": [i, 2], "dtype": "bf16"} for i in range(30)]}}
    raw = json.dumps({"traceEvents": [*base["traceEvents"], nested, nested]}, indent=1).encode()
    for frac in (0.97, 0.985, 0.995):
        p = tmp_path / f"cut{frac}.json"
        p.write_bytes(raw[: int(len(raw) * frac)])
        fast, ref = _both(p)
        assert fast == ref, frac
        monkeypatch.setattr(trace_fast, "CHUNK", 200)
        assert _both(p) == (fast, ref), frac
        monkeypatch.undo()


@pytest.mark.parametrize("name", FIXTURES)
def test_the_hash_folded_into_the_parse_is_the_content_hash(name, tmp_path, monkeypatch):
    """The cache key comes out of the parse's own read (every byte hashed once as it passes), and is the hash
    of the whole file on both paths: plain, gzip, re-laid-out, cut short, handed from the fast path to ijson."""
    files = _layouts(name, tmp_path)
    raw = (FIX / name).read_bytes()
    for cut in (len(raw) // 3, len(raw) * 2 // 3):
        p = tmp_path / f"cut{cut}_{name}"
        p.write_bytes(raw[:cut])
        files.append(p)
        gz = tmp_path / f"cut{cut}_{name}.gz"
        gz.write_bytes(gzip.compress(raw)[: cut // 2])
        files.append(gz)
    odd = tmp_path / f"odd_{name}"  # a boolean ts: the fast path hands the file to ijson mid-way
    data = json.loads(raw)
    events = data if isinstance(data, list) else data["traceEvents"]
    events.append({"ph": "X", "cat": "kernel", "name": "k", "ts": True, "dur": 1})
    odd.write_text(json.dumps(data))
    files.append(odd)
    for path in files:
        want = trace_cache.content_hash(path)
        for engine in ("fast", "ijson"):
            try:
                tf, digest = torch_trace.parse_trace_hashed(path, engine=engine)
            except MeasureError:
                continue  # nothing readable at all (a gzip cut inside its header): nothing is cached
            assert digest == want, (path.name, engine)
            assert tf.to_dict() == parse_trace_free(path, engine=engine).to_dict()
    monkeypatch.setattr(trace_fast, "CHUNK", 101)
    assert torch_trace.parse_trace_hashed(files[0])[1] == trace_cache.content_hash(files[0])


def test_top_operators_come_from_the_same_pass_on_both_paths(tmp_path, monkeypatch):
    """Every fixture's per-step top operators (CPU self time, device kernels) are part of the parse's result,
    the same on both paths, and per step the windows of the Free ratio's step table."""
    for name in FIXTURES:
        for path in _layouts(name, tmp_path):
            fast, ref = _both(path)
            assert fast["top_ops"] == ref["top_ops"], path.name
            assert [t["step"] for t in fast["top_ops"]] == [s["step"] for s in fast["steps"]]
            assert all(t["cpu"] for t in fast["top_ops"]), path.name
    gpu = parse_trace_free(FIX / "gpu_two_steps.pt.trace.json").top_ops
    assert gpu[0]["device"][0] == {"name": "ampere_sgemm_128x64_tn", "calls": 1, "self_ms": 0.2, "share": 0.2}
    # the sums by sorted keys (many windows x names) are the dense counters' sums
    monkeypatch.setattr(trace_ops, "DENSE_KEYS", 0)
    for name in FIXTURES:
        assert parse_trace_free(FIX / name).top_ops == parse_trace_free(FIX / name, engine="ijson").top_ops
    assert parse_trace_free(FIX / "gpu_two_steps.pt.trace.json").top_ops == gpu
    # device events spilled to a temporary file in blocks of 3: the same tables on both paths
    monkeypatch.setattr(trace_ops, "SPILL", 3)
    for name in FIXTURES:
        assert parse_trace_free(FIX / name).top_ops == parse_trace_free(FIX / name, engine="ijson").top_ops
    assert parse_trace_free(FIX / "gpu_two_steps.pt.trace.json").top_ops == gpu


def test_without_xxhash_the_key_is_blake2b_and_still_folded(tmp_path):
    """xxhash missing: the key is blake2b of every byte, and the parse's folded hash still equals it."""
    code = (
        "import sys, json; sys.modules['xxhash'] = None\n"
        "from bench.measure import trace_cache, torch_trace\n"
        f"p = {str(FIX / FIXTURES[0])!r}\n"
        "print(json.dumps([trace_cache.HASH, trace_cache.content_hash(p), torch_trace.parse_trace_hashed(p)[1]]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    name, full, folded = json.loads(proc.stdout)
    import hashlib

    assert name == "blake2b" and full == folded
    assert full == hashlib.blake2b((FIX / FIXTURES[0]).read_bytes(), digest_size=16).hexdigest()


def test_self_times_are_the_stacks_on_any_order():
    """The columns-and-runs self times are the plain stack's (torch's rule) on shuffled, sorted, tied and
    overlapping events."""
    import numpy as np

    def stack_self(events):
        out, stack = {}, []
        for i, ts, dur in sorted(events, key=lambda e: (e[1], -e[2])):
            while stack and ts >= stack[-1][0]:
                stack.pop()
            if stack:
                out[stack[-1][1]] -= dur
            out[i] = dur
            stack.append([ts + dur, i])
        return out

    rng = np.random.default_rng(7)
    for trial in range(30):
        n = 400
        ts = np.round(rng.uniform(0, 500, n), 0 if trial % 3 == 0 else 3)  # ties on every third trial
        dur = np.round(rng.exponential(5 if trial % 2 else 0.5, n), 2)
        if trial % 5 == 0:
            ts = np.sort(ts) + np.arange(n) * 1e-3  # sorted, strictly increasing: no sort needed
        order, own = trace_ops.self_times(ts, dur)
        idx = np.arange(n) if order is None else order
        want = stack_self([(i, float(ts[i]), float(dur[i])) for i in range(n)])
        assert {int(i): float(o) for i, o in zip(idx, own)} == pytest.approx(want), trial
