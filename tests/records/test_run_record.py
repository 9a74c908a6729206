"""The typed run record (:mod:`bench.records.run_record`): every schema version this project wrote is read (version 1,
the hand-built dict, converted: its summary recomputed over the timed steps), an unknown one is named on one
line, and a record its loader would refuse is never written."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest

from bench.records.record import write_record
from bench.records.run_record import SCHEMA_VERSION, RecordError, RunRecord, load_run_record, read_record

#: steps 1..4: 1 warm-up, 2-3 timed, 4 profiled (slower, as under the profiler)
STEPS = {str(s): {"timing_s/step": t, "timing_s/gen": g, "perf/throughput": tp, "perf/cpu_memory_used_gb": 3.0 + s}
         for s, t, g, tp in ((1, 9.0, 3.0, 50.0), (2, 2.0, 1.0, 100.0), (3, 4.0, 1.0, 80.0), (4, 8.0, 6.0, 40.0))}


def _v1(folder: Path) -> Path:
    """A record as the harness wrote it before the typed record (schema 1): rollout share and throughput
    over every measured step (2, 3, 4), step time over the timed steps (2, 3)."""
    rec = {"schema_version": 1, "cell_id": "abc", "repeat": 0, "status": "ok", "engine": "embedded",
           "platform": "cpu", "levels": {"dynamic_bsz": 1}, "steps": STEPS, "free_ratio": {"4": 0.25},
           "summary": {"n_steps": 4, "warmup_steps": 1, "measured_steps": [2, 3, 4], "profiled_steps": [4],
                       "profiled_measured_steps": [4], "timed_steps": [2, 3], "step_time_samples_s": [2.0, 4.0],
                       "step_time_median_s": 3.0, "rollout_share_median": 0.5, "throughput_median": 80.0,
                       "free_ratio_median": 0.25, "peak_memory_gb": 7.0},
           "timing": {"startup_s": 1.5}}
    path = folder / "abc" / "r0" / "record.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(rec))
    return path


def test_version_1_is_read_with_its_figures_over_the_timed_steps(tmp_path):
    path = _v1(tmp_path)
    rec = load_run_record(path)
    assert rec.schema_version == SCHEMA_VERSION == 2
    s = rec.summary
    assert s.timed_steps == [2, 3] and s.step_time_median_s == 3.0
    assert s.rollout_share_median == pytest.approx(0.375)  # median(1/2, 1/4); v1 said 0.5 (steps 2-4)
    assert s.throughput_median == 90.0  # median(100, 80); v1 said 80 (steps 2-4)
    assert (s.free_ratio_median, s.peak_memory_gb) == (0.25, 7.0)
    as_dict = read_record(path)
    assert as_dict["timing"] == {"startup_s": 1.5} and as_dict["schema_version"] == 2  # extra keys kept


def test_a_record_without_version_is_version_1(tmp_path):
    path = _v1(tmp_path)
    data = json.loads(path.read_text())
    del data["schema_version"]
    path.write_text(json.dumps(data))
    assert load_run_record(path).summary.throughput_median == 90.0


@pytest.mark.parametrize("version", [0, 3, "2", True])
def test_an_unknown_version_is_named_on_one_line(tmp_path, version):
    path = _v1(tmp_path)
    data = json.loads(path.read_text())
    data["schema_version"] = version
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError) as exc:
        load_run_record(path)
    msg = str(exc.value)
    assert "\n" not in msg and str(path) in msg and f"schema_version {version!r}" in msg and "(1, 2)" in msg


def test_a_bad_version_1_value_is_named_not_repaired(tmp_path):
    """Conversion never hides a corrupt file: its values are checked before the summary is recomputed."""
    path = _v1(tmp_path)
    path.write_text(path.read_text().replace('"step_time_median_s": 3.0', '"step_time_median_s": NaN'))
    with pytest.raises(RecordError, match=r"summary\.step_time_median_s: nan is not a finite number"):
        read_record(path)


def test_write_record_refuses_what_the_loader_would_refuse(tmp_path):
    good = json.loads(_v1(tmp_path).read_text()) | {"schema_version": SCHEMA_VERSION}
    RunRecord.model_validate(good)
    for bad in ({**good, "status": "done"}, {**good, "repeat": -1}, {**good, "wall_s": float("inf")},
                {**good, "summary": {**good["summary"], "step_time_samples_s": [-1.0]}}):
        with pytest.raises(pydantic.ValidationError):
            write_record(tmp_path, bad)
    assert not (tmp_path / "record.json").exists()
    write_record(tmp_path, good)
    assert json.loads((tmp_path / "record.json").read_text()) == good


def test_load_records_with_a_cache_reads_only_new_or_rewritten_records(tmp_path, monkeypatch):
    """A sequential sweep looks after every block (:func:`bench.execution.blocks.run_blocks`): with a cache, an
    unchanged record is not read again, a rewritten one is, and every call returns the same content as a plain
    :func:`~bench.records.run_record.load_records` in fresh dicts."""
    from _sweeps import EMBEDDED_CELLS, make_sweep

    import bench.records.run_record as run_record

    sweep = make_sweep(tmp_path, "synth", EMBEDDED_CELLS[:2], repeats=2, steps=6)
    real, reads = run_record.read_record, []
    monkeypatch.setattr(run_record, "read_record", lambda p: reads.append(p) or real(p))
    cache: dict = {}
    first = run_record.load_records(sweep, cache=cache)
    assert len(reads) == 4 and first == run_record.load_records(sweep)
    reads.clear()
    first[0]["status"] = "changed by a reader"  # a caller's edit does not reach the cache
    again = run_record.load_records(sweep, cache=cache)
    assert reads == [] and again == run_record.load_records(sweep) and again[0] is not first[0]
    path = Path(again[1]["_dir"]) / "record.json"
    rec = json.loads(path.read_text())
    rec["summary"]["step_time_median_s"] = 9.5
    (path.parent / "tmp.json").write_text(json.dumps(rec))
    (path.parent / "tmp.json").replace(path)  # rewritten whole, as the harness writes a record
    reads.clear()
    third = run_record.load_records(sweep, cache=cache)
    assert reads == [path] and third[1]["summary"]["step_time_median_s"] == 9.5
