"""The synthetic sweep writer the gate, baseline and report tests share (``tests/_sweeps.py``) writes a sweep the
harness's own readers load: records, the ``latest`` pointer and the snapshot's samples."""

from __future__ import annotations

from _sweeps import EMBEDDED_CELLS, make_sweep

from bench.records.results import find_sweep, load_records
from bench.records.snapshot import snapshot


def test_make_sweep_writes_a_readable_sweep(tmp_path):
    sweep = make_sweep(tmp_path, "synth", EMBEDDED_CELLS, repeats=2, steps=6)
    assert find_sweep("synth", tmp_path) == sweep.resolve()
    recs = load_records(sweep)
    assert len(recs) == 8
    assert recs[0]["summary"]["timed_steps"] == [2, 3, 4, 5]
    snap = snapshot(sweep, tmp_path)
    assert [c["status"] for c in snap["cells"]] == ["ok"] * 4
    assert len(snap["cells"][0]["repeats"][0]["samples"]["step_time"]) == 4
    assert len(snap["cells"][0]["repeats"][0]["samples"]["free_ratio"]) == 1
