"""A profiled trace is parsed once: the sweep's measurement parses each trace one time (Free ratio, step table
and top operators in one pass), the MLflow log of its top operators reads the parsed-profile cache, and
``report``, ``gate``, a resumed sweep and the MLflow summary of every run parse nothing (the parser raises if
called). Real embedded GRPO runs of ``matrix/smoke.yaml``, the CLI called as the user calls it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.measure.chrome_trace as chrome_trace
import bench.measure.torch_trace as torch_trace
import bench.measure.trace_fast as trace_fast
from bench.cli import main
from bench.measure.trace_cache import CACHE_DIR

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def test_report_gate_resume_and_mlflow_never_reparse(tmp_path, monkeypatch):
    calls: list[str] = []
    real_scan = torch_trace.scan_trace

    def counting(path, *args, **kwargs):
        calls.append(str(path))
        return real_scan(path, *args, **kwargs)

    monkeypatch.setattr(torch_trace, "scan_trace", counting)
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = [str(ROOT / "matrix" / "smoke.yaml"), "--results", "res", "--tracking-uri", uri]
    assert main(argv) == 0
    records = sorted(Path("res").rglob("record.json"))
    traces = sorted(p for r in records for p in (r.parent / "trace").rglob("*.json*"))
    assert len(records) == 2 and len(traces) >= 2
    # one parse per trace for the whole sweep: the measurement; the MLflow log of the top operators read the cache
    assert sorted(Path(c).name for c in calls) == sorted(p.name for p in traces), calls
    for r in records:
        assert list((r.parent / CACHE_DIR).glob("trace-*.json"))

    def no_parse(path, *args, **kwargs):
        raise AssertionError(f"parsed again: {path}")

    monkeypatch.setattr(torch_trace, "scan_trace", no_parse)
    # and no other reader of a trace's bytes either (both event readers open the file through open_binary)
    monkeypatch.setattr(chrome_trace, "open_binary", no_parse)
    monkeypatch.setattr(trace_fast, "open_binary", no_parse)
    sweep = records[0].parent.parent.parent
    assert main(["report", str(sweep), "--bootstrap", "200"]) == 0
    assert main(["gate", "--baseline", str(sweep), "--candidate", str(sweep), "--results", "res",
                 "--no-expect"]) in (0, 3)
    assert main(argv) == 0  # the resumed sweep: both runs are done, nothing is measured again

    from bench.tracking.records import profile_summary

    for r in records:
        rec = json.loads(r.read_text())
        _, prof = profile_summary(rec, r.parent, 0.5)
        ops = [s["top_ops"] for s in prof["steps"].values()]
        assert ops and all(o and o["cpu"] for o in ops)  # from the cache: the parser would raise
