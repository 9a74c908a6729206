"""The Ascend outputs of a profiled step of 8 ranks (``step_trace_time.csv``, ``kernel_details.csv``,
``trace_view.json`` in each ``*_ascend_pt/ASCEND_PROFILER_OUTPUT``): parsed in parallel (a process pool), cached by
content (a second read parses nothing), and the top operators of MLflow's ``profile_summary.json`` for an Ascend
step come from them (device kernels from ``kernel_details.csv``, CPU operators from ``trace_view.json``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.measure.ascend_kernels as ascend_kernels
import bench.measure.torch_trace as torch_trace
from bench.measure import collect, trace_pool
from bench.measure.ascend_kernels import parse_kernel_details_hashed
from bench.measure.trace_cache import CACHE_DIR, content_hash
from bench.tracking.records import profile_summary

FIX = Path(__file__).parent / "fixtures" / "measure"
STEP_HEADER = ("Device_id,Step,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,Bubble,"
               "Communication(Not Overlapped and Exclude Receive),Preparing")
KERNEL_HEADER = ("Step Id,Model ID,Task ID,Stream ID,Name,Type,OP State,Accelerator Core,Start Time(us),"
                 "Duration(us),Wait Time(us),Block Dim,Mix Block Dim,Input Shapes,Input Data Types,Output Shapes")


def _kernels(rank: int) -> str:
    """A kernel_details.csv: steps 3 and 4; MatMulV2 40 us x 3, a rank-dependent FlashAttention, an
    hcom_allReduce; shapes quoted with commas, start times with torch_npu's trailing tab."""
    rows = [KERNEL_HEADER]
    t = 5091018480000.0
    for step in (3, 4):
        for i in range(3):
            rows.append(f'{step},4294967295,{i},2,MatMulV2,MatMulV2,dynamic,AI_CORE,"{t + i * 50:.3f}\t",40.0,1.0,'
                        f'20,0,"""4,1024;1024,1024""",DT_BF16,"""4,1024"""')
        rows.append(f'{step},4294967295,9,2,FlashAttentionScore,FlashAttentionScore,dynamic,MIX_AIC,"{t + 200:.3f}\t",'
                    f'{10.0 + rank},0.5,24,48,"""1,8,128""",DT_BF16,"""1,8,128"""')
        rows.append(f'{step},4294967295,10,5,hcom_allReduce__123_0_1,HCCL,N/A,N/A,"{t + 300:.3f}\t",25.5,0,0,0,'
                    f'"",,""')
        t += 1000.0
    return "\r\n".join(rows) + "\r\n"


def _run(tmp_path: Path, ranks: int = 8) -> Path:
    run = tmp_path / "run"
    trace = json.loads((FIX / "ascend_trace_view.json").read_text())
    for r in range(ranks):
        out = run / f"node0_{1000 + r}_20251101120000000_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
        out.mkdir(parents=True)
        (out.parent / f"profiler_info_{r}.json").write_text("{}")
        rows = [STEP_HEADER] + [f"{r},{s},600.0,150.0,50.0,200.0,{250.0 + r},1000.0,0.0,150.0,12.5" for s in (3, 4)]
        (out / "step_trace_time.csv").write_text("\r\n".join(rows) + "\r\n")
        (out / "kernel_details.csv").write_text(_kernels(r))
        shifted = [{**e, "name": f"rank{r}_op"} if e.get("name") == "aten::linear" else e for e in trace]
        (out / "trace_view.json").write_text(json.dumps(shifted))
    return run


def test_eight_ranks_in_parallel_cached_and_the_top_operators(tmp_path, monkeypatch):
    run = _run(tmp_path)
    monkeypatch.setattr(trace_pool, "POOL_MIN_BYTES", 0)  # small fixtures: use the pool all the same
    pooled = collect(run)
    monkeypatch.setattr(trace_pool, "default_workers", lambda: 1)
    one = collect(_run(tmp_path / "alone"))  # the same files parsed one after another in this process
    monkeypatch.undo()
    monkeypatch.setattr(trace_pool, "POOL_MIN_BYTES", 0)
    def same(out: dict) -> dict:
        return {**out, "run_dir": None, "ascend": {**out["ascend"], "profiles": None}}

    assert same(one) == same(pooled)
    asc = pooled["ascend"]
    assert [k["rank"] for k in asc["kernel_details"]] == list(range(8))
    assert [t["rank"] for t in asc["trace_view"]] == list(range(8))
    assert asc["kernel_details"][0]["steps"] == [{"step": 3, "kernels": 5, "busy_us": 155.5},
                                                 {"step": 4, "kernels": 5, "busy_us": 155.5}]
    assert asc["kernel_details"][7]["steps"][0]["busy_us"] == 162.5
    assert [s["step"] for s in asc["trace_view"][0]["steps"]] == [3, 4]
    assert pooled["free_ratio"][3] == pytest.approx(sum((250 + r) / (1000 + r) for r in range(8)) / 8)
    kinds = {p.name.split("-")[0] for p in (run / CACHE_DIR).glob("*.json")}
    assert kinds == {"trace", "kernel_details", "step_trace"}

    # a second read (record on resume, the MLflow log) parses nothing: every parser raises now
    def no_parse(*args, **kwargs):
        raise AssertionError("parsed again")

    monkeypatch.setattr(torch_trace, "scan_trace", no_parse)
    monkeypatch.setattr(ascend_kernels, "read_step_trace_csv", no_parse)
    monkeypatch.setattr(ascend_kernels.csv, "reader", no_parse)
    assert collect(run) == pooled

    rec = {"free_ratio": {str(k): v for k, v in pooled["free_ratio"].items()},
           "summary": {"profiled_steps": [3, 4]},
           "free_ratio_detail": {str(k): v for k, v in pooled["free_ratio_detail"].items()}}
    _, prof = profile_summary(rec, run, 0.25)
    top = prof["steps"]["3"]["top_ops"]
    assert top["source"].endswith("kernel_details.csv") and "_ascend_pt" in top["source"]
    assert top["device"][0] == {"name": "MatMulV2", "calls": 3, "self_ms": 0.12, "share": 0.12}
    assert [o["name"] for o in top["device"]] == ["MatMulV2", "hcom_allReduce__123_0_1", "FlashAttentionScore"]
    assert top["cpu"][0]["name"] == "rank0_op"  # rank 0 is the step's first source; from its trace_view.json
    assert top["window_ms"] == 1.0  # the trace's ProfilerStep window


def test_kernel_details_reader(tmp_path):
    """Per step and name; the content hash from the same read; a file cut mid-row and a file that is not one."""
    p = tmp_path / "kernel_details.csv"
    p.write_text(_kernels(2))
    got, digest = parse_kernel_details_hashed(p)
    assert digest == content_hash(p)
    assert got["rows"] == 10 and got["bad_rows"] == 0
    assert got["steps"][1]["ops"] == [["MatMulV2", 3, 120.0], ["hcom_allReduce__123_0_1", 1, 25.5],
                                      ["FlashAttentionScore", 1, 12.0]]
    text = p.read_bytes()
    p.write_bytes(text[: text.rindex(b"MatMulV2") + 3])  # cut inside the last step's rows
    got, _ = parse_kernel_details_hashed(p)
    assert got["bad_rows"] == 1 and got["steps"][1]["kernels"] == 2
    no_steps = tmp_path / "k2.csv"
    no_steps.write_text("Name,Duration(us)\nA,1.5\nB,2\nA,0.5\n")
    got, _ = parse_kernel_details_hashed(no_steps)
    assert got["steps"] == [{"step": None, "kernels": 3, "busy_us": 4.0, "ops": [["A", 2, 2.0], ["B", 1, 2.0]]}]
    bad = tmp_path / "k3.csv"
    bad.write_text("Step Id,Name,Start Time(us)\n1,A,2\n")
    with pytest.raises(Exception, match=r"k3.csv: not a kernel_details.csv: missing column\(s\) \['Duration\(us\)'\]"):
        parse_kernel_details_hashed(bad)


def test_top_operators_of_every_step_look_each_rank_up_once(tmp_path, monkeypatch):
    """The MLflow summary of a run with two profiled Ascend steps finds the profiles and hashes a rank's files once
    for the run, not once per step (``step_top_ops``'s memo, which the Ascend reader keeps its files in)."""
    import bench.measure.ascend as ascend

    run = _run(tmp_path, ranks=2)
    got = collect(run)
    calls = {"profiles": 0, "parse": 0}

    def counted(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(ascend, "find_ascend_profiles", counted("profiles", ascend.find_ascend_profiles))
    monkeypatch.setattr(ascend, "parse_files", counted("parse", ascend.parse_files))
    rec = {"free_ratio": {str(k): v for k, v in got["free_ratio"].items()}, "summary": {"profiled_steps": [3, 4]},
           "free_ratio_detail": {str(k): v for k, v in got["free_ratio_detail"].items()}}
    _, prof = profile_summary(rec, run, 0.25)
    assert [s["top_ops"]["device"][0]["name"] for s in prof["steps"].values()] == ["MatMulV2", "MatMulV2"]
    assert calls == {"profiles": 1, "parse": 1}  # rank 0 answers both steps


def test_without_a_trace_view_the_window_is_msprofs_step_time(tmp_path):
    """A rank without ``trace_view.json``: its top operators' window is the step's ``Computing + Communication(Not
    Overlapped) + Free`` of ``step_trace_time.csv`` (600 + 150 + 251 us for rank 1)."""
    run = _run(tmp_path, ranks=2)
    for p in run.glob("*_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json"):
        p.unlink()
    got = collect(run)
    rec = {"free_ratio": {str(k): v for k, v in got["free_ratio"].items()}, "summary": {"profiled_steps": [3]},
           "free_ratio_detail": {str(k): v for k, v in got["free_ratio_detail"].items()}}
    from bench.measure.top_ops import step_top_ops

    top = step_top_ops(run, 3, [{"kind": "ascend", "source": "rank 1"}])
    assert top["window_ms"] == 1.001 and top["cpu"] == []
    assert top["device"][0] == {"name": "MatMulV2", "calls": 3, "self_ms": 0.12, "share": round(120 / 1001, 4)}
    _, prof = profile_summary(rec, run, 0.25)
    assert prof["steps"]["3"]["top_ops"]["window_ms"] == 1.0  # rank 0, the step's first source
