"""collect(run_dir) and summarize(steps, warmup_steps): exact values on the fixtures.

verl09_metrics.jsonl, training steps 1..4 (step 0 = validation only), warm-up 1 -> measured 2, 3, 4:

=====  ====  ===  ======  ===  ===  =====  ======  ====  =====  =========  =====
step   step  gen  reward  olp  ref  adv    update  thr   mem    resp mean  max
=====  ====  ===  ======  ===  ===  =====  ======  ====  =====  =========  =====
2      4.0   2.0  0.25    0.5  .25  0.125  0.75    1000  10.25  64         128
3      5.0   2.5  0.25    0.5  .5   0.125  1.0     1200  10.5   96         128
4      4.5   3.0  0.25    0.5  .25  0.125  0.25    1100  10.375 80         160
=====  ====  ===  ======  ===  ===  =====  ======  ====  =====  =========  =====

step time median 4.5, IQR 4.75 - 4.25 = 0.5; other = 0.125 each step; rollout share 0.5, 0.5, 2/3
-> 0.5; waste 0.5, 0.25, 0.5 -> 0.5; response min 16, 32, 8; clip 0.25, 0.5, 0.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from bench.measure import MeasureError, collect, read_metrics_jsonl, summarize

FIX = Path(__file__).parent / "fixtures" / "measure"


def _gpu_run(tmp_path: Path) -> Path:
    run = tmp_path / "cell"
    (run / "trace").mkdir(parents=True)
    shutil.copy(FIX / "verl09_metrics.jsonl", run / "metrics.jsonl")
    with (
        open(FIX / "gpu_two_steps.pt.trace.json", "rb") as src,
        gzip.open(run / "trace" / "rank0.pt.trace.json.gz", "wb") as dst,
    ):
        shutil.copyfileobj(src, dst)
    (run / "trace" / "notes.json").write_text('{"not": "a trace"}')
    (run / "run.log").write_text("hello\n")
    return run


def test_collect_gpu_run(tmp_path):
    run = _gpu_run(tmp_path)
    out = collect(run)
    assert out["metrics_file"] == "metrics.jsonl"
    assert sorted(out["metrics"]) == [0, 1, 2, 3, 4]
    assert out["metrics"][3]["timing_s/step"] == 5.0
    assert out["metrics_issues"]["truncated_last_line"] is True
    assert out["free_ratio"] == {3: 0.48, 4: 0.4375}
    assert out["profiled_steps"] == [3, 4]
    detail = out["free_ratio_detail"][3]
    assert detail["sources"] == [
        {"kind": "torch", "source": "trace/rank0.pt.trace.json.gz", "free_ratio": 0.48, "basis": "device"}
    ]
    assert (detail["min"], detail["max"], detail["spread"], detail["missing_ranks"]) == (0.48, 0.48, 0.0, [])
    assert [t["path"] for t in out["traces"]] == ["trace/rank0.pt.trace.json.gz"]
    assert out["ascend"] is None
    assert out["unstepped_free"] == []
    assert any("truncated" in w for w in out["warnings"])
    json.dumps(out)  # JSON-friendly


def test_summarize_collect_result(tmp_path):
    """Time figures over the timed steps (measured, not profiled: step 2 here), the Free ratio over the
    profiled measured steps (3, 4); without profiled steps every measured step is timed."""
    got = collect(_gpu_run(tmp_path))
    s = summarize(got, warmup_steps=1)
    assert s["n_steps"] == 4
    assert s["warmup_steps"] == 1
    assert s["measured_steps"] == [2, 3, 4]
    assert s["profiled_steps"] == [3, 4]
    assert s["profiled_measured_steps"] == [3, 4]
    assert s["timed_steps"] == [2] and s["step_time_samples_s"] == [4.0]
    assert (s["step_time_median_s"], s["step_time_iqr_s"], s["rollout_share_median"]) == (4.0, 0.0, 0.5)
    assert (s["throughput_median"], s["response_length_mean"], s["response_length_max"]) == (1000.0, 64.0, 128.0)
    assert s["phase_median_s"]["gen"] == 2.0 and s["phase_median_s"]["update_actor"] == 0.75
    assert s["peak_memory_gb"] == 10.5  # over the measured steps; the warm-up step's 12.5 is excluded
    assert s["free_ratio_median"] == 0.45875
    json.dumps(s)
    s = summarize(got, warmup_steps=1, profiled_steps=[])
    assert s["timed_steps"] == [2, 3, 4] and s["step_time_samples_s"] == [4.0, 5.0, 4.5]
    assert s["step_time_median_s"] == 4.5
    assert s["step_time_iqr_s"] == 0.5
    assert s["step_time_mean_s"] == 4.5
    assert s["phase_median_s"] == {
        "gen": 2.5,
        "reward": 0.25,
        "old_log_prob": 0.5,
        "ref": 0.25,
        "adv": 0.125,
        "update_actor": 0.75,
        "other": 0.125,
    }
    assert s["rollout_share_median"] == 0.5
    assert s["throughput_median"] == 1100.0
    assert s["peak_memory_gb"] == 10.5
    assert s["peak_memory_source"] == "perf/max_memory_allocated_gb"
    assert s["response_length_mean"] == 80.0
    assert s["response_length_max"] == (128.0 + 128.0 + 160.0) / 3
    assert s["response_length_min"] == (16.0 + 32.0 + 8.0) / 3
    assert s["response_clip_ratio"] == 0.25
    assert s["long_tail_waste_median"] == 0.5
    assert s["free_ratio_median"] is None  # no profiled step among the measured ones


def test_summarize_inputs_and_edge_cases():
    log = read_metrics_jsonl(FIX / "verl09_metrics.jsonl")
    a = summarize(log, 1, free_ratio={2: 0.5, 1: 0.9})
    b = summarize(list(log), 1, free_ratio={2: 0.5, 1: 0.9})
    c = summarize(log.by_step(), 1, free_ratio={2: 0.5, 1: 0.9})
    assert a == b == c
    assert a["profiled_steps"] == [1, 2]
    assert a["profiled_measured_steps"] == [2]
    assert a["free_ratio_median"] == 0.5
    # no profiled step among the measured ones
    none = summarize(log, 1, free_ratio={1: 0.9})
    assert none["free_ratio_median"] is None
    # all steps warm-up: every statistic empty
    empty = summarize(log, 10)
    assert empty["measured_steps"] == []
    assert empty["step_time_median_s"] is None
    assert empty["peak_memory_gb"] is None
    assert empty["phase_median_s"]["other"] is None
    # CPU-only run: device memory 0 -> host memory
    cpu = summarize({1: {"timing_s/step": 2.0, "perf/max_memory_allocated_gb": 0.0, "perf/cpu_memory_used_gb": 3.5}}, 0)
    assert (cpu["peak_memory_gb"], cpu["peak_memory_source"]) == (3.5, "perf/cpu_memory_used_gb")
    assert cpu["phase_median_s"]["other"] == 2.0
    assert cpu["rollout_share_median"] is None
    # verl >= 0.7 logs the worker's memory under the role prefix (actor/perf/...): still read
    verl09 = {2: {"timing_s/step": 1.0, "actor/perf/max_memory_allocated_gb": 0.0,
                  "actor/perf/cpu_memory_used_gb": 7.25},
              3: {"timing_s/step": 1.0, "actor/perf/max_memory_allocated_gb": 0.0,
                  "actor/perf/cpu_memory_used_gb": 7.5}}
    v = summarize(verl09, 0)
    assert (v["peak_memory_gb"], v["peak_memory_source"]) == (7.5, "perf/cpu_memory_used_gb")
    gpu = summarize({1: {"timing_s/step": 1.0, "actor/perf/max_memory_allocated_gb": 21.0,
                         "critic/perf/max_memory_allocated_gb": 23.0}}, 0)
    assert gpu["peak_memory_gb"] == 23.0


def test_collect_verl06_jsonl_anywhere_and_cpu_trace(tmp_path):
    run = tmp_path / "cell"
    (run / "logs" / "proj").mkdir(parents=True)
    shutil.copy(FIX / "verl06_metrics.jsonl", run / "logs" / "proj" / "exp.jsonl")
    (run / "logs" / "other.jsonl").write_text('{"event": "x"}\n')
    (run / "profile" / "actor").mkdir(parents=True)
    shutil.copy(FIX / "cpu_two_steps.pt.trace.json", run / "profile" / "actor" / "prof_rank-0.json")
    out = collect(run)
    assert out["metrics_file"] == "logs/proj/exp.jsonl"
    assert sorted(out["metrics"]) == [1, 2, 3]
    assert out["free_ratio"] == {1: 0.25, 2: 0.7}
    assert out["profiled_steps"] == [1, 2]
    assert out["free_ratio_detail"][1]["sources"][0]["basis"] == "cpu"
    s = summarize(out, warmup_steps=0)
    assert s["free_ratio_median"] == (0.25 + 0.7) / 2
    assert s["step_time_median_s"] == 7.0


def test_collect_ascend_run_with_missing_rank(tmp_path):
    run = tmp_path / "cell"
    run.mkdir()
    shutil.copytree(FIX / "ascend" / "missing_rank_old_header", run / "profile")
    out = collect(run)
    assert out["metrics_file"] is None
    assert "no metrics JSONL found" in out["warnings"]
    assert out["free_ratio"] == {5: 0.25, 6: 0.375}
    d5 = out["free_ratio_detail"][5]
    assert [e["source"] for e in d5["sources"]] == ["rank 0", "rank 1", "rank 3"]
    assert (d5["min"], d5["max"], d5["spread"], d5["missing_ranks"]) == (0.125, 0.375, 0.25, [2])
    assert out["free_ratio_detail"][6]["missing_ranks"] == [2, 3]
    assert out["ascend"]["missing_ranks"] == [2]
    assert any("rank(s) [2]" in w for w in out["warnings"])
    assert all(not p["path"].startswith("/") for p in out["ascend"]["profiles"])
    assert out["traces"] == []


def test_collect_unstepped_ascend_and_world_size(tmp_path):
    run = tmp_path / "cell"
    run.mkdir()
    shutil.copytree(FIX / "ascend" / "no_step_single_card", run / "prof")
    out = collect(run, expected_ranks=2)
    assert out["free_ratio"] == {}
    assert out["profiled_steps"] == []
    assert out["unstepped_free"] == [{"kind": "ascend", "source": "rank 0", "free_ratio": 0.2, "basis": "device"}]
    assert out["ascend"]["missing_ranks"] == [1]
    json.dumps(out)


def test_collect_verl_step_folders(tmp_path):
    run = tmp_path / "cell"
    shutil.copytree(FIX / "ascend" / "verl_step_dirs", run)
    out = collect(run)
    assert out["free_ratio"] == {2: 0.375}
    assert out["free_ratio_detail"][2]["spread"] == 0.25


def test_collect_not_a_folder(tmp_path):
    with pytest.raises(MeasureError):
        collect(tmp_path / "nope")
