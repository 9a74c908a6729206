"""Ascend step_trace_time.csv / analysis.db reader: header variants, ranks, missing ranks, no step ids.

Free ratio = Free / (Computing + Communication(Not Overlapped) + Free). Fixture values (us):

* two_ranks_device_id (new header): rank 0 step 2: 600 + 150 + 250 -> 0.25, step 3: 500 + 125 + 375
  -> 0.375; rank 1 step 2: 750 + 125 + 125 -> 0.125, step 3: 750 + 250 + 1000 -> 0.5.
* missing_rank_old_header (no Device_id): ranks 0, 1, 3 (2 missing; 3 only in step 5):
  step 5: 0.25, 0.125, 0.375; step 6: 0.5, 0.25.
* no_step_single_card: profiler_info.json (no rank), one row, empty Step: 800 + 0 + 200 -> 0.2.
* verl_step_dirs: <save_path>/2/<role>/..._ascend_pt, empty Step; rank 0: actor 100/400, ref
  100/400 -> 0.25; rank 1: actor 300/800, ref 200/200 -> 500/1000 = 0.5 (time weighted).
"""

from __future__ import annotations

import shutil
import sqlite3
import sys
import types
from pathlib import Path

import pytest

from bench.measure import MeasureError, analyse_raw, ensure_analysed, read_ascend_free
from bench.measure.ascend import find_ascend_profiles
from bench.measure.ascend_step_trace import rank_of, read_step_trace_csv, read_step_trace_db

FIX = Path(__file__).parent / "fixtures" / "measure" / "ascend"


def test_csv_new_header_rows():
    csv_path = (
        next((FIX / "two_ranks_device_id").glob("*1001*_ascend_pt")) / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv"
    )
    assert csv_path.read_bytes().endswith(b"\r\n")  # csv.writer line ends, as torch_npu writes
    rows = read_step_trace_csv(csv_path, rank=0)
    assert [(r.device_id, r.step, r.step_label) for r in rows] == [(0, 2, "2"), (0, 3, "3")]
    r = rows[0]
    assert (r.computing_us, r.communication_not_overlapped_us, r.overlapped_us, r.communication_us) == (
        600.0,
        150.0,
        50.0,
        200.0,
    )
    assert (r.free_us, r.stage_us, r.bubble_us, r.communication_not_overlapped_exclude_receive_us) == (
        250.0,
        1000.0,
        0.0,
        150.0,
    )
    assert r.preparing_us == 12.5
    assert r.step_time_us == 1000.0
    assert r.free_ratio == 0.25


def test_csv_old_header_rows():
    csv_path = (
        next((FIX / "missing_rank_old_header").glob("*2001*_ascend_pt"))
        / "ASCEND_PROFILER_OUTPUT"
        / "step_trace_time.csv"
    )
    rows = read_step_trace_csv(csv_path)
    assert [(r.device_id, r.step, r.free_ratio) for r in rows] == [(None, 5, 0.25), (None, 6, 0.5)]


def test_csv_bad_header(tmp_path):
    p = tmp_path / "step_trace_time.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(MeasureError, match="missing column"):
        read_step_trace_csv(p)


def test_rank_from_profiler_info():
    two = FIX / "two_ranks_device_id"
    assert sorted(rank_of(d) for d in two.glob("*_ascend_pt")) == [0, 1]
    single = next((FIX / "no_step_single_card").glob("*_ascend_pt"))
    assert rank_of(single) is None


def test_rank_from_rank_id_field(tmp_path):
    d = tmp_path / "x_ascend_pt"
    d.mkdir()
    (d / "profiler_info.json").write_text('{"rank_id": "5"}')
    assert rank_of(d) == 5
    (d / "profiler_info.json").write_text("")  # old torch_npu: an empty marker file
    assert rank_of(d) is None


def test_two_ranks_per_step_spread():
    af = read_ascend_free(FIX / "two_ranks_device_id")
    assert af.ranks == [0, 1]
    assert af.missing_ranks == []
    assert list(af.steps) == [2, 3]
    s2, s3 = af.steps[2], af.steps[3]
    assert s2.per_rank == {0: 0.25, 1: 0.125}
    assert (s2.mean, s2.min, s2.max, s2.spread) == (0.1875, 0.125, 0.25, 0.125)
    assert s3.per_rank == {0: 0.375, 1: 0.5}
    assert (s3.mean, s3.min, s3.max, s3.spread) == (0.4375, 0.375, 0.5, 0.125)
    assert s2.missing_ranks == s3.missing_ranks == []
    assert af.warnings == []
    assert af.needs_analyse == []


def test_missing_rank_reported():
    af = read_ascend_free(FIX / "missing_rank_old_header")
    assert af.ranks == [0, 1, 3]
    assert af.expected_ranks == [0, 1, 2, 3]
    assert af.missing_ranks == [2]
    s5, s6 = af.steps[5], af.steps[6]
    assert s5.per_rank == {0: 0.25, 1: 0.125, 3: 0.375}
    assert (s5.mean, s5.min, s5.max, s5.spread) == (0.25, 0.125, 0.375, 0.25)
    assert s5.missing_ranks == [2]
    assert s6.per_rank == {0: 0.5, 1: 0.25}
    assert (s6.mean, s6.spread) == (0.375, 0.25)
    assert s6.missing_ranks == [2, 3]
    # a larger world size says which ranks are absent beyond the highest seen
    af8 = read_ascend_free(FIX / "missing_rank_old_header", expected_ranks=5)
    assert af8.missing_ranks == [2, 4]


def test_no_step_ids_single_row():
    af = read_ascend_free(FIX / "no_step_single_card")
    assert list(af.steps) == [None]
    s = af.steps[None]
    assert s.step is None
    # no rank known: counted under its Device_id, with a warning
    assert s.per_rank == {0: 0.2}
    assert s.mean == 0.2 and s.spread == 0.0
    assert len(af.warnings) == 1 and "rank unknown" in af.warnings[0]
    assert af.rows[0].step_label == ""


def test_verl_layout_step_from_folder_and_time_weighting():
    af = read_ascend_free(FIX / "verl_step_dirs")
    profs = af.profiles
    assert len(profs) == 4
    assert {p.role for p in profs} == {"actor_update", "ref_compute_log_prob"}
    assert {p.path_step for p in profs} == {2}
    assert list(af.steps) == [2]
    s = af.steps[2]
    assert s.per_rank == {0: 0.25, 1: 0.5}
    assert (s.mean, s.spread) == (0.375, 0.25)


def _make_db(path: Path, rows):
    con = sqlite3.connect(path)
    con.execute(
        "CREATE TABLE StepTraceTime (deviceId INTEGER, step TEXT, computing NUMERIC, "
        "communication_not_overlapped NUMERIC, overlapped NUMERIC, communication NUMERIC, free NUMERIC, "
        "stage NUMERIC, bubble NUMERIC, communication_not_overlapped_and_exclude_receive NUMERIC, "
        "preparing NUMERIC)"
    )
    con.executemany("INSERT INTO StepTraceTime VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
    con.commit()
    con.close()


def test_db_export_variant(tmp_path):
    """verl >= 0.7 profiles with export_type Db: table StepTraceTime of analysis.db."""
    d = tmp_path / "node0_1_20251101000000000_ascend_pt"
    (d / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    (d / "profiler_info_3.json").write_text('{"rank_id": 3}')
    _make_db(
        d / "ASCEND_PROFILER_OUTPUT" / "analysis.db",
        [
            (3, "7", 600.0, 100.0, 0.0, 100.0, 300.0, 1000.0, 0.0, 100.0, 1.0),
            (3, None, 100.0, 0.0, 0.0, 0.0, 100.0, 200.0, 0.0, 0.0, 1.0),
        ],
    )
    rows = read_step_trace_db(d / "ASCEND_PROFILER_OUTPUT" / "analysis.db", rank=3)
    assert [(r.step, r.free_ratio) for r in rows] == [(7, 0.3), (None, 0.5)]
    af = read_ascend_free(tmp_path)
    assert af.steps[7].per_rank == {3: 0.3}
    assert af.missing_ranks == [0, 1, 2]
    # a database without the table has no rows
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    assert read_step_trace_db(empty) == []


def _raw_profile(root: Path) -> Path:
    d = root / "node0_9_20251101000000000_ascend_pt"
    (d / "FRAMEWORK").mkdir(parents=True)
    (d / "FRAMEWORK" / "torch.op_range").write_bytes(b"\x00")
    (d / "PROF_000001_20251101000000000_ABCDEFGHIJKLMNOP").mkdir()
    (d / "profiler_info_0.json").write_text('{"rank_id": 0}')
    return d


def test_raw_only_listed_and_analyse_needs_torch_npu(tmp_path, monkeypatch):
    d = _raw_profile(tmp_path)
    af = read_ascend_free(tmp_path)
    assert af.needs_analyse == [str(d)]
    assert af.steps == {}
    assert [p.needs_analyse for p in find_ascend_profiles(tmp_path)] == [True]
    # torch_npu absent: a clear error
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.raises(MeasureError, match="torch_npu is not importable"):
        analyse_raw(d)
    with pytest.raises(MeasureError, match="torch_npu"):
        ensure_analysed(tmp_path)


def _fake_torch_npu(monkeypatch, analyse):
    pkg = types.ModuleType("torch_npu")
    prof_pkg = types.ModuleType("torch_npu.profiler")
    mod = types.ModuleType("torch_npu.profiler.profiler")
    mod.analyse = analyse
    pkg.profiler = prof_pkg
    prof_pkg.profiler = mod
    monkeypatch.setitem(sys.modules, "torch_npu", pkg)
    monkeypatch.setitem(sys.modules, "torch_npu.profiler", prof_pkg)
    monkeypatch.setitem(sys.modules, "torch_npu.profiler.profiler", mod)


def test_analyse_runs_torch_npu_offline_parse(tmp_path, monkeypatch):
    d = _raw_profile(tmp_path)
    src_csv = (
        next((FIX / "two_ranks_device_id").glob("*1001*_ascend_pt")) / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv"
    )
    calls = []

    def analyse(profiler_path, max_process_number=None, export_type=None):
        calls.append(profiler_path)
        out = Path(profiler_path) / "ASCEND_PROFILER_OUTPUT"
        out.mkdir()
        shutil.copy(src_csv, out / "step_trace_time.csv")

    _fake_torch_npu(monkeypatch, analyse)
    assert ensure_analysed(tmp_path) == [str(d)]
    assert calls == [str(d)]
    af = read_ascend_free(tmp_path)
    assert af.steps[2].per_rank == {0: 0.25}
    assert ensure_analysed(tmp_path) == []  # nothing left to do


def test_analyse_that_writes_nothing_is_an_error(tmp_path, monkeypatch):
    d = _raw_profile(tmp_path)
    _fake_torch_npu(monkeypatch, lambda profiler_path, **kw: None)  # torch_npu swallows its errors
    with pytest.raises(MeasureError, match="produced no"):
        analyse_raw(d)
