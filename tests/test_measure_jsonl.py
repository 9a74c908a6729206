"""verl file-logger JSONL reader: both writers (0.6.x json, >= 0.7.1 orjson) and a truncated last line."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from bench.measure import MeasureError, StepMetrics, read_metrics_jsonl
from bench.measure.jsonl import looks_like_verl_jsonl

FIX = Path(__file__).parent / "fixtures" / "measure"


def test_verl09_orjson_file_with_truncated_last_line():
    log = read_metrics_jsonl(FIX / "verl09_metrics.jsonl")
    assert [s.step for s in log] == [0, 1, 2, 3, 4]
    assert len(log) == 5
    assert isinstance(log[0], StepMetrics)
    # the step-5 line was cut mid-write: skipped and reported, not an error
    assert log.truncated_last_line is True
    assert log.bad_lines == []
    by = log.by_step()
    assert 5 not in by
    assert by[2]["timing_s/step"] == 4.0
    assert by[3]["timing_s/gen"] == 2.5
    assert by[1]["perf/throughput"] == 300.0
    assert by[2]["perf/total_num_tokens"] == 4096.0  # numpy int64 via OPT_SERIALIZE_NUMPY
    assert by[2]["actor/grad_norm"] == 0.75  # numpy float32
    # orjson writes NaN as null: read back as NaN
    assert math.isnan(by[2]["actor/entropy"])
    # two lines of step 4 (training + validation) merged
    assert by[4]["timing_s/step"] == 4.5
    assert by[4]["val-core/openai/gsm8k/reward/mean@1"] == 0.25
    assert by[0] == {"val-core/openai/gsm8k/reward/mean@1": 0.125, "val-aux/num_turns/mean": 1.0}
    assert log.series("timing_s/step") == [(1, 10.0), (2, 4.0), (3, 5.0), (4, 4.5)]
    assert log.issues() == {"truncated_last_line": True, "bad_lines": [], "skipped_values": []}


def test_verl06_json_dumps_file_with_nan_and_infinity_tokens():
    log = read_metrics_jsonl(FIX / "verl06_metrics.jsonl")
    assert [s.step for s in log] == [1, 2, 3]
    assert log.truncated_last_line is False
    by = log.by_step()
    assert by[1]["timing_s/step"] == 8.0
    assert math.isnan(by[2]["actor/entropy"])  # bare NaN token of json.dumps
    # step 3 logged twice; the later line wins on a repeated key
    assert by[3]["actor/grad_norm"] == math.inf
    assert by[3]["val-core/openai/gsm8k/reward/mean@1"] == 0.5
    assert by[3]["timing_s/gen"] == 3.5


def test_numbers_as_strings_and_non_numbers(tmp_path):
    p = tmp_path / "m.jsonl"
    lines = [
        json.dumps({"step": 2, "data": {"a": "1.5", "b": "NaN", "c": [1, 2], "d": "fast", "e": True}}),
        json.dumps({"step": "1", "data": {"a": 3}}),
        "garbage in the middle",
        json.dumps({"step": 3.0, "data": {"a": None}}),
        json.dumps({"no_step": 1, "data": {}}),
        json.dumps({"step": 1.5, "data": {}}),
        "",
    ]
    p.write_text("\n".join(lines))
    log = read_metrics_jsonl(p)
    by = log.by_step()
    assert sorted(by) == [1, 2, 3]
    assert by[2]["a"] == 1.5
    assert math.isnan(by[2]["b"])
    assert by[2]["e"] == 1.0
    assert "c" not in by[2] and "d" not in by[2]
    assert by[1] == {"a": 3.0}
    assert math.isnan(by[3]["a"])
    assert log.truncated_last_line is False
    assert [n for n, _ in log.bad_lines] == [3, 5, 6]
    assert [(s, k) for s, k, _ in log.skipped_values] == [(2, "c"), (2, "d")]


def test_truncated_last_line_without_newline_only(tmp_path):
    p = tmp_path / "m.jsonl"
    good = json.dumps({"step": 1, "data": {"x": 1.0}})
    p.write_text(good + "\n" + '{"step": 2, "data": {"x": 1.')
    log = read_metrics_jsonl(p)
    assert [s.step for s in log] == [1]
    assert log.truncated_last_line is True
    # a complete last record without the newline is fine
    p.write_text(good)
    log = read_metrics_jsonl(p)
    assert [s.step for s in log] == [1] and log.truncated_last_line is False


def test_empty_and_missing_file(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("")
    assert len(read_metrics_jsonl(p)) == 0
    with pytest.raises(MeasureError):
        read_metrics_jsonl(tmp_path / "nope.jsonl")


def _installed_verl_tracking():
    """The installed verl's ``verl/utils/tracking.py``, loaded alone (``import verl`` takes ~15 s)."""
    spec = importlib.util.find_spec("verl")  # locates the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "utils" / "tracking.py"
    mod_spec = importlib.util.spec_from_file_location("_installed_verl_tracking", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def test_real_verl_filelogger_roundtrip(tmp_path, monkeypatch):
    """Files written by the installed verl's own FileLogger (orjson writer) read back exactly."""
    tracking = _installed_verl_tracking()
    path = tmp_path / "verl.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    logger = tracking.FileLogger(project_name="p", experiment_name="e")
    logger.log({"timing_s/step": 1.25, "perf/throughput": 100}, step=1)
    logger.log({"timing_s/step": 2.5, "actor/entropy": float("nan"), "perf/total_num_tokens": np.int64(7)}, step=2)
    logger.finish()
    log = read_metrics_jsonl(path)
    assert log.by_step()[1] == {"timing_s/step": 1.25, "perf/throughput": 100.0}
    assert log.by_step()[2]["timing_s/step"] == 2.5
    assert math.isnan(log.by_step()[2]["actor/entropy"])
    assert log.by_step()[2]["perf/total_num_tokens"] == 7.0
    assert not log.truncated_last_line
    assert looks_like_verl_jsonl(path)


def test_looks_like_verl_jsonl(tmp_path):
    assert looks_like_verl_jsonl(FIX / "verl06_metrics.jsonl")
    assert looks_like_verl_jsonl(FIX / "verl09_metrics.jsonl")
    other = tmp_path / "o.jsonl"
    other.write_text('{"event": "start"}\n')
    assert not looks_like_verl_jsonl(other)
