"""A reader's ``fields`` are typed (:class:`bench.measure.formats.ReaderFields`): what fits is merged into
:func:`bench.measure.collect`'s result, a key of the wrong type or an unknown key is left out with a warning
naming the reader and the key, never merged unchecked."""

from __future__ import annotations

import json
from pathlib import Path

from bench.measure import collect
from bench.measure.formats import Measurements, Reader, ReadOptions, checked_fields, register_reader, unregister_reader


class BadFields(Reader):
    """Sets one field right (``ascend``), one of the wrong type (``traces``) and one unknown (``novel``)."""

    name = "badfields"

    def detect(self, run_dir: Path) -> bool:
        return True

    def read(self, run_dir: Path, options: ReadOptions) -> Measurements:
        return Measurements(fields={"traces": "not a list", "ascend": {"root": "prof"}, "novel": 1})


def test_collect_merges_typed_fields_and_leaves_out_the_rest(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "data": {"timing_s/step": 2.5}}) + "\n")
    register_reader(BadFields())
    try:
        got = collect(tmp_path)
    finally:
        unregister_reader("badfields")
    assert got["metrics"] == {1: {"timing_s/step": 2.5}}  # the built-in JSONL reader's fields pass
    assert got["ascend"] == {"root": "prof"}
    assert got["traces"] == [] and "novel" not in got
    assert "reader badfields: field traces: Input should be a valid list; left out" in got["warnings"]
    assert "reader badfields: field novel: Extra inputs are not permitted; left out" in got["warnings"]


def test_checked_fields_is_strict():
    kept, warnings = checked_fields("r", {"metrics": {"1": {"timing_s/step": 1.0}}, "metrics_file": "m.jsonl"})
    assert kept == {"metrics_file": "m.jsonl"}  # a step key must be an int, as the JSONL reader gives it
    assert warnings == ["reader r: field metrics.1.[key]: Input should be a valid integer; left out"]
    assert checked_fields("r", {"metrics_issues": {"truncated_last_line": False, "bad_lines": [],
                                                   "skipped_values": []}}) == (
        {"metrics_issues": {"truncated_last_line": False, "bad_lines": [], "skipped_values": []}}, [])
