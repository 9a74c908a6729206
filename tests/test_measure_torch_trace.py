"""Free ratio from torch chrome traces: exact values on hand-made traces in Kineto's format.

GPU fixture ``gpu_two_steps.pt.trace.json`` (times relative to ts0 = 5091018480000 us):

* ProfilerStep#3 = [0, 1000]: device intervals kernel s7 [50, 250], kernel s13 [200, 400],
  memcpy s7 [380, 420], kernel s7 [600, 700], memset s13 [650, 675], kernel s13 [950, 1100.5]
  -> union inside the window [50, 420] + [600, 700] + [950, 1000] = 370 + 100 + 50 = 520,
  free = 480, ratio = 0.48.
* ProfilerStep#4 = [1000.5, 1800.5]: [1000.5, 1100.5] (the crossing kernel), kernel s7
  [1050.5, 1200.5], kernel s13 [1300.5, 1500.5], kernel s7 [1400.5, 1450.5], memcpy s7
  [1700.5, 1750.5] -> union [1000.5, 1200.5] + [1300.5, 1500.5] + [1700.5, 1750.5] = 450,
  free = 350, ratio = 0.4375.
* Ignored: kernels before/after every window, the ``gpu_user_annotation`` spanning both steps,
  ``cuda_runtime``/``cpu_op`` events, flows, instants, metadata, the ``Trace`` span.

CPU fixture ``cpu_two_steps.pt.trace.json`` (main thread 4242):

* ProfilerStep#1 = [0, 1000]: cpu_op [10, 610] (+ nested [12, 600]), [700, 750], [740, 800],
  [950, 1100] -> 600 + 100 + 50 = 750, ratio 0.25.
* ProfilerStep#2 = [1000, 2000]: [1000, 1100] + [1500, 1700] = 300, ratio 0.7. The
  ``aten::index_select`` [1100, 1900] on thread 4300 is not the main thread: ignored.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bench.measure import MeasureError, parse_trace_free
from bench.measure._common import merge_segments, union_length_in
from bench.measure.chrome_trace import iter_trace_events, looks_like_chrome_trace

FIX = Path(__file__).parent / "fixtures" / "measure"
T0 = 5091018480000.0


def test_gpu_trace_two_steps_exact():
    tf = parse_trace_free(FIX / "gpu_two_steps.pt.trace.json")
    assert tf.basis == "device"
    assert tf.main_thread == (31337, 31337)
    assert tf.warnings == []
    assert tf.events == 63
    assert tf.device_events == 12
    assert [s.step for s in tf.steps] == [3, 4]
    s3, s4 = tf.steps
    assert (s3.start_us, s3.end_us) == (T0, T0 + 1000.0)
    assert (s3.window_us, s3.busy_us, s3.free_us, s3.free_ratio) == (1000.0, 520.0, 480.0, 0.48)
    assert (s4.start_us, s4.end_us) == (T0 + 1000.5, T0 + 1800.5)
    assert (s4.window_us, s4.busy_us, s4.free_us, s4.free_ratio) == (800.0, 450.0, 350.0, 0.4375)
    assert s3.basis == s4.basis == "device"
    agg = tf.aggregate()
    assert agg == {
        "steps": 2,
        "window_us": 1800.0,
        "busy_us": 970.0,
        "free_us": 830.0,
        "free_ratio": 830.0 / 1800.0,
        "median_free_ratio": 0.45875,
    }
    d = tf.to_dict()
    assert d["steps"][0]["free_ratio"] == 0.48
    json.dumps(d)


def test_cpu_only_trace_two_steps_exact():
    tf = parse_trace_free(FIX / "cpu_two_steps.pt.trace.json")
    assert tf.basis == "cpu"
    assert tf.main_thread == (4242, 4242)
    assert tf.device_events == 0
    assert [(s.step, s.window_us, s.busy_us, s.free_us, s.free_ratio) for s in tf.steps] == [
        (1, 1000.0, 750.0, 250.0, 0.25),
        (2, 1000.0, 300.0, 700.0, 0.7),
    ]
    assert all(s.basis == "cpu" for s in tf.steps)
    assert tf.aggregate()["free_ratio"] == 0.475


def test_gzip_gives_the_same(tmp_path):
    gz = tmp_path / "rank0.pt.trace.json.gz"
    with open(FIX / "gpu_two_steps.pt.trace.json", "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    plain = parse_trace_free(FIX / "gpu_two_steps.pt.trace.json")
    packed = parse_trace_free(gz)
    assert packed.steps == plain.steps
    # the name does not matter, the magic bytes do
    odd = tmp_path / "trace.json"
    shutil.copy(gz, odd)
    assert parse_trace_free(odd).steps == plain.steps
    assert looks_like_chrome_trace(gz)


def test_compaction_does_not_change_the_result():
    plain = parse_trace_free(FIX / "gpu_two_steps.pt.trace.json")
    tiny = parse_trace_free(FIX / "gpu_two_steps.pt.trace.json", block=2)
    assert tiny.steps == plain.steps


def _cpu_events():
    return json.loads((FIX / "cpu_two_steps.pt.trace.json").read_text())["traceEvents"]


def test_old_torch_profilerstep_as_cpu_op_is_not_busy(tmp_path):
    events = _cpu_events()
    for ev in events:
        if str(ev.get("name", "")).startswith("ProfilerStep#"):
            ev["cat"] = "cpu_op"
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"traceEvents": events}))
    tf = parse_trace_free(p)
    assert [(s.step, s.free_ratio) for s in tf.steps] == [(1, 0.25), (2, 0.7)]


def test_bare_array_with_string_timestamps(tmp_path):
    """Ascend's trace_view.json layout: a bare array, ts/dur as strings."""
    events = _cpu_events()
    for ev in events:
        for key in ("ts", "dur"):
            if key in ev:
                ev[key] = f"{ev[key]:.3f}"
    p = tmp_path / "trace_view.json"
    p.write_text(json.dumps(events))
    tf = parse_trace_free(p)
    assert [(s.step, s.free_ratio) for s in tf.steps] == [(1, 0.25), (2, 0.7)]
    assert looks_like_chrome_trace(p)


def test_trace_without_profiler_steps_gives_one_unstepped_window(tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 100.0, "dur": 50.0},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 8, "ts": 120.0, "dur": 50.0},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 300.0, "dur": 100.0},
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    tf = parse_trace_free(p)
    assert tf.main_thread is None
    assert [(s.step, s.window_us, s.busy_us, s.free_ratio) for s in tf.steps] == [(None, 300.0, 170.0, 130.0 / 300.0)]


def test_duplicate_steps_and_several_threads_warn(tmp_path):
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": 100, "dur": 100},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": 500, "dur": 100},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 2, "ts": 0, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 150, "dur": 25},
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events}))
    tf = parse_trace_free(p)
    assert tf.main_thread == (1, 1)
    assert [(s.step, s.free_ratio) for s in tf.steps] == [(1, 1.0), (2, 0.75)]
    assert len(tf.warnings) == 2


def test_truncated_trace_is_read_up_to_the_cut(tmp_path):
    text = (FIX / "cpu_two_steps.pt.trace.json").read_text()
    p = tmp_path / "cut.json"
    p.write_text(text[: int(len(text) * 0.9)])
    tf = parse_trace_free(p)
    assert tf.warnings and "cut short" in tf.warnings[0]
    assert [s.step for s in tf.steps] == [1, 2]


def test_not_a_trace(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("hello")
    with pytest.raises(MeasureError):
        parse_trace_free(p)
    assert not looks_like_chrome_trace(p)
    with pytest.raises(MeasureError):
        parse_trace_free(tmp_path / "missing.json")


def test_iter_trace_events_streams():
    it = iter_trace_events(FIX / "gpu_two_steps.pt.trace.json")
    first = next(it)
    assert first["ph"] == "M" and first["name"] == "process_name"
    assert sum(1 for _ in it) == 62


def test_interval_helpers():
    s, e = merge_segments(np.array([5.0, 0.0, 2.0, 10.0]), np.array([6.0, 3.0, 4.0, 12.0]))
    assert s.tolist() == [0.0, 5.0, 10.0] and e.tolist() == [4.0, 6.0, 12.0]
    # touching intervals merge
    s, e = merge_segments(np.array([0.0, 1.0]), np.array([1.0, 2.0]))
    assert s.tolist() == [0.0] and e.tolist() == [2.0]
    s, e = merge_segments(np.array([0.0, 5.0, 10.0]), np.array([4.0, 6.0, 12.0]))
    assert union_length_in(s, e, 3.0, 11.0) == 1.0 + 1.0 + 1.0
    assert union_length_in(s, e, 6.5, 9.5) == 0.0
    assert union_length_in(s, e, -10.0, 100.0) == 7.0


def test_real_torch_cpu_profiler_trace(tmp_path):
    """A trace written by the installed torch.profiler (CPU, with a schedule) parses per step."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule

    out = tmp_path / "real.pt.trace.json"

    def handler(prof):
        prof.export_chrome_trace(str(out))

    x = torch.randn(32, 32)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
        on_trace_ready=handler,
    ) as prof:
        for _ in range(4):
            (x @ x).relu().sum()
            prof.step()
    tf = parse_trace_free(out)
    assert tf.basis == "cpu"
    assert [s.step for s in tf.steps] == [1, 2]
    for s in tf.steps:
        assert 0.0 <= s.free_ratio <= 1.0
        assert s.busy_us > 0
