"""Operator categories per step and phase from every trace format, the ranks' Computing / Communication /
Overlapped / Free breakdown and the slow-rank flag (issue 32, first acceptance item).

Every expected figure is computed by hand in the comments from the fixtures (times in microseconds):

* ``categories/kernel_details.csv`` (torch_npu's column layout, CRLF): step 1 rows MatMulV2 100, FlashAttentionScore
  80, RmsNorm 20, RotaryPositionEmbedding 15, Mul 10, ViewCopy 12 + TransData 8 + Transpose 6 = 26, NonZero on
  AI_CPU 30, hcom_allReduce_ 50, MEMCPY_ASYNC 5, Range 4: total 340; step 2 MatMulV2 120, hcom_allGather_ 40,
  Cast 10 (total 170) and a row without a duration (bad).
* ``categories/op_statistic.csv``: Total Time(us) MatMulV2 1000, FlashAttentionScore 600, hcom_allReduce_ 300,
  NonZero (AI_CPU) 200, RmsNorm 160, RotaryPositionEmbedding 120, Mul 100, ViewCopy 90 + TransData 30 = 120,
  Range 5: total 2605.
* ``gpu_nccl_overlap.pt.trace.json`` (offsets from its first microsecond): window 1 [1000, 2000]: sgemm [1100,
  1400], NCCL AllReduce on stream 13 [1300, 1700], elementwise [1400, 1500], flash_fwd [1600, 1800], memcpy DtoH
  [1850, 1900]; window 2 [2000, 3000]: sgemm [2100, 2600], rms_norm [2600, 2650], NCCL AllGather [2700, 2900];
  an sgemm at [3100, 3200] lies outside both windows.
* ``ascend/eight_ranks_slow``: 8 ranks; step 1 Computing 1000, Communication(Not Overlapped) 300, Free 100 on every
  rank but rank 5 (1100, 200, 100); step 2 the same but rank 3 (1050, 250, 100). Step time 1400 everywhere.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.measure.ascend import read_ascend_free
from bench.measure.ascend_kernels import parse_kernel_details_hashed
from bench.measure.op_categories import (
    BUILTIN_RULES,
    CATEGORIES,
    CategoryRule,
    CategoryRules,
    categorize,
    category_rules,
    kernel_details_categories,
    op_statistic_categories,
    phase_of,
    register_category_rule,
    trace_categories,
    unregister_category_rule,
)
from bench.measure.rank_overlap import read_cluster_step_trace, run_ranks, slow_ranks, trace_overlap
from bench.measure.run_categories import run_categories, run_rank_breakdown, trace_rank
from bench.measure.torch_trace import parse_trace_free

FIX = Path(__file__).parent / "fixtures" / "measure"
CAT = FIX / "categories"
GPU = FIX / "gpu_nccl_overlap.pt.trace.json"


def _nonzero(times: dict) -> dict:
    return {c: v for c, v in times.items() if v}


#: (name, op_type, core) -> category: every op name of the fixtures, and the usual names of each category
NAMES = [
    # Ascend kernel_details.csv / op_statistic.csv
    ("aclnnMm_MatMulCommon_MatMulV2", "MatMulV2", "AI_CORE", "matmul"),
    ("MatMulV2", "MatMulV2", "AI_CORE", "matmul"),
    ("aclnnGroupedMatmul_GroupedMatmul", "GroupedMatmul", "AI_CORE", "matmul"),
    ("aclnnFlashAttentionScore_FlashAttentionScore_FlashAttentionScore", "FlashAttentionScore", "MIX_AIC", "attention"),
    ("FlashAttentionScore", "FlashAttentionScore", "MIX_AIC", "attention"),
    ("aclnnRmsNorm_RmsNorm_RmsNorm", "RmsNorm", "AI_VECTOR_CORE", "normalization"),
    ("RmsNorm", "RmsNorm", "AI_VECTOR_CORE", "normalization"),
    ("aclnnRotaryPositionEmbedding_RotaryPositionEmbedding_RotaryPositionEmbedding", "RotaryPositionEmbedding",
     "AI_VECTOR_CORE", "rotary"),
    ("RotaryPositionEmbedding", "RotaryPositionEmbedding", "AI_VECTOR_CORE", "rotary"),
    ("npu_rotary_mul", None, None, "rotary"),
    ("npu_mrope", None, None, "rotary"),
    ("InterleaveRope", "InterleaveRope", "AI_VECTOR_CORE", "rotary"),
    ("RopeWithSinCosCache", None, None, "rotary"),
    ("MRotaryEmbedding.forward_native", None, None, "rotary"),
    ("aten::dropout", "cpu_op", None, "elementwise"),
    ("property_getter", None, None, "other"),  # "rope" inside a word is no rotary
    ("aclnnMul_MulAiCore_Mul", "Mul", "AI_VECTOR_CORE", "elementwise"),
    ("Mul", "Mul", "AI_VECTOR_CORE", "elementwise"),
    ("aclnnCast_CastAiCore_Cast", "Cast", "AI_VECTOR_CORE", "elementwise"),
    ("ViewCopy", "ViewCopy", "AI_VECTOR_CORE", "copy"),
    ("TransData", "TransData", "AI_CORE", "copy"),
    ("aclnnPermute_TransposeAiCore_Transpose", "Transpose", "AI_CORE", "copy"),
    ("aclnnNonzero_NonZeroAiCpu_NonZero", "NonZero", "AI_CPU", "ai_cpu"),
    ("NonZero", "NonZero", "AI_CPU", "ai_cpu"),
    ("Cast", "Cast", "AI_CPU", "ai_cpu"),  # the core decides: an AI_CPU task is ai_cpu whatever its name
    ("hcom_allReduce__512_0_1", "hcom_allReduce_", "HCCL", "communication"),
    ("hcom_allReduce_", "hcom_allReduce_", "HCCL", "communication"),
    ("hcom_allGather__512_1_1", "hcom_allGather_", "HCCL", "communication"),
    ("hcom_reduceScatter__1_0_1", None, None, "communication"),
    ("hcom_broadcast_", None, None, "communication"),
    ("MEMCPY_ASYNC", "MEMCPY_ASYNC", "N/A", "memcpy"),
    ("aclnnArange_RangeAiCore_Range", "Range", "AI_CORE", "other"),
    ("Range", "Range", "AI_CORE", "other"),
    # torch/Kineto GPU kernels (op_type: the event's cat)
    ("ampere_sgemm_128x64_tn", "kernel", None, "matmul"),
    ("ampere_sgemm_64x32_tn", "kernel", None, "matmul"),
    ("ampere_sgemm_128x64_nn", "kernel", None, "matmul"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "kernel", None, "communication"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", None, "communication"),
    ("ncclDevKernel_AllGather_RING_LL", "kernel", None, "communication"),
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "kernel", None, "communication"),
    ("ncclDevKernel_SendRecv", "kernel", None, "communication"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "kernel", None,
     "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "kernel", None,
     "elementwise"),
    ("void at::native::elementwise_kernel<128, 2>", "kernel", None, "elementwise"),
    ("void at::native::reduce_kernel<512, 1>", "kernel", None, "elementwise"),
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4>>", "kernel", None, "attention"),
    ("void rms_norm_kernel<float>", "kernel", None, "normalization"),
    ("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", None, "memcpy"),
    ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", None, "memcpy"),
    ("Memset (Device)", "gpu_memset", None, "memcpy"),
    # torch CPU operators
    ("aten::matmul", "cpu_op", None, "matmul"),
    ("aten::mm", "cpu_op", None, "matmul"),
    ("aten::addmm", "cpu_op", None, "matmul"),
    ("aten::linear", "cpu_op", None, "matmul"),
    ("aten::relu", "cpu_op", None, "elementwise"),
    ("aten::sum", "cpu_op", None, "elementwise"),
    ("aten::add_", "cpu_op", None, "elementwise"),
    ("aten::add", "cpu_op", None, "elementwise"),
    ("aten::copy_", "cpu_op", None, "copy"),
    ("aten::index_select", "cpu_op", None, "copy"),
    ("aten::transpose", "cpu_op", None, "copy"),
    ("aten::broadcast_tensors", "cpu_op", None, "copy"),  # not a collective broadcast
    ("aten::scaled_dot_product_attention", "cpu_op", None, "attention"),
    ("aten::native_layer_norm", "cpu_op", None, "normalization"),
    ("c10d::allreduce_", "cpu_op", None, "communication"),
    ("gloo:all_reduce", "cpu_op", None, "communication"),
    ("weird},{name", "cpu_op", None, "other"),
    ("aten::empty", "cpu_op", None, "other"),
]


@pytest.mark.parametrize(("name", "op_type", "core", "expected"), NAMES, ids=[n[0][:48] for n in NAMES])
def test_categorize_each_name(name, op_type, core, expected):
    assert categorize(name, op_type=op_type, core=core) == expected
    # case-insensitive
    assert categorize(name.upper(), op_type=op_type and op_type.lower(), core=core and core.lower()) == expected


def test_every_category_is_reachable_and_rules_are_data():
    assert {n[3] for n in NAMES} == set(CATEGORIES)
    assert {r.category for r in BUILTIN_RULES} | {"other"} == set(CATEGORIES)
    assert category_rules()[: len(BUILTIN_RULES)] == list(BUILTIN_RULES)  # no plugin rules installed here


def test_registered_rules_first_or_last():
    # a rule registered first wins over the built-ins; one registered last only catches what they leave
    first = register_category_rule(CategoryRule("matmul", r"^Range$", "type"), first=True)
    last = register_category_rule(CategoryRule("elementwise", r"^aten::empty$", "name"))
    shadowed = register_category_rule(CategoryRule("other", r"matmul"))
    try:
        assert category_rules()[0] is first and category_rules()[-1] is shadowed
        assert categorize("aclnnArange_RangeAiCore_Range", op_type="Range") == "matmul"
        assert categorize("aten::empty") == "elementwise"
        assert categorize("aten::matmul") == "matmul"  # the built-in rule matched before `shadowed`
    finally:
        for r in (first, last, shadowed):
            unregister_category_rule(r)
    assert categorize("aclnnArange_RangeAiCore_Range", op_type="Range") == "other"
    with pytest.raises(ValueError):
        register_category_rule(CategoryRule("gemm", r"x"))
    with pytest.raises(ValueError):
        CategoryRule("matmul", r"x", "stream")


PLUGIN_RULES = CategoryRules("toy", (CategoryRule("rotary", r"^Range$", "type"),))


def test_entry_point_rules_come_after_first_registered_and_before_builtins(monkeypatch):
    from importlib.metadata import EntryPoint

    from bench.core import plugins
    from bench.measure.op_categories import ENTRY_POINT_GROUP, RULES

    # a package's grpo_bench.op_categories entry (this module's PLUGIN_RULES), found by the shared registry's lookup
    plugin_ep = EntryPoint(name="toy", value=f"{__name__}:PLUGIN_RULES", group=ENTRY_POINT_GROUP)
    own = plugins.entry_points
    monkeypatch.setattr(plugins, "entry_points", lambda g: own(g) + ([plugin_ep] if g == ENTRY_POINT_GROUP else []))
    monkeypatch.setattr(RULES, "_loaded", False)
    monkeypatch.setattr(RULES, "_items", {})
    first = register_category_rule(CategoryRule("copy", r"^Range$", "type"), first=True)
    try:
        assert RULES.names()[:2] == ["builtin", "toy"]
        assert category_rules()[:3] == [first, PLUGIN_RULES.rules[0], BUILTIN_RULES[0]]
        assert categorize("Range", op_type="Range") == "copy"
    finally:
        unregister_category_rule(first)
    assert categorize("Range", op_type="Range") == "rotary"


def test_kernel_details_categories():
    got = kernel_details_categories(CAT / "kernel_details.csv")
    assert (got["rows"], got["bad_rows"]) == (16, 1)
    s1, s2 = got["steps"]
    assert s1["step"] == 1 and s1["total_us"] == 340.0
    assert _nonzero(s1["category_us"]) == {
        "matmul": 100.0, "attention": 80.0, "normalization": 20.0, "rotary": 15.0, "elementwise": 10.0,
        "copy": 26.0, "ai_cpu": 30.0, "communication": 50.0, "memcpy": 5.0, "other": 4.0}
    assert s1["share"]["copy"] == pytest.approx(26 / 340)
    assert s2["step"] == 2 and _nonzero(s2["category_us"]) == {"matmul": 120.0, "elementwise": 10.0,
                                                               "communication": 40.0}
    # the existing kernel parser reads the same fixture to the same per-step sums (340, 170)
    details, _ = parse_kernel_details_hashed(CAT / "kernel_details.csv")
    assert [(s["step"], s["busy_us"]) for s in details["steps"]] == [(1, 340.0), (2, 170.0)]


def test_op_statistic_categories():
    got = op_statistic_categories(CAT / "op_statistic.csv")
    assert got["total_us"] == 2605.0 and got["bad_rows"] == 0
    assert _nonzero(got["category_us"]) == {
        "matmul": 1000.0, "attention": 600.0, "communication": 300.0, "ai_cpu": 200.0, "normalization": 160.0,
        "rotary": 120.0, "elementwise": 100.0, "copy": 120.0, "other": 5.0}
    assert got["count"]["copy"] == 9  # ViewCopy 6 + TransData 3
    assert got["share"]["matmul"] == pytest.approx(1000 / 2605)


def test_gpu_trace_categories_and_overlap():
    cats = trace_categories(GPU)
    assert cats["basis"] == "device"
    s1, s2 = cats["steps"]
    # step 1: sgemm 300, elementwise 100, flash 200, NCCL 400, memcpy 50; step 2: sgemm 500, rms_norm 50, NCCL 200
    assert (s1["step"], s1["window_us"], s1["total_us"]) == (1, 1000.0, 1050.0)
    assert _nonzero(s1["category_us"]) == {"matmul": 300.0, "elementwise": 100.0, "attention": 200.0,
                                           "communication": 400.0, "memcpy": 50.0}
    assert _nonzero(s2["category_us"]) == {"matmul": 500.0, "normalization": 50.0, "communication": 200.0}

    ov = trace_overlap(GPU)
    assert ov["communication_streams"] == [13]
    o1, o2 = ov["steps"]
    # step 1: compute union [1100,1500] + [1600,1800] + [1850,1900] = 650; NCCL [1300,1700] = 400, of which
    # [1300,1500] and [1600,1700] overlap compute = 300; not overlapped 100; all device [1100,1800] + [1850,1900]
    # = 750, free 1000 - 750 = 250
    assert {k: o1[k] for k in ("computing_us", "communication_us", "overlapped_us",
                               "communication_not_overlapped_us", "free_us")} == {
        "computing_us": 650.0, "communication_us": 400.0, "overlapped_us": 300.0,
        "communication_not_overlapped_us": 100.0, "free_us": 250.0}
    # step 2: compute [2100,2650] = 550, NCCL [2700,2900] = 200 with no overlap, free 1000 - 750 = 250
    assert (o2["computing_us"], o2["overlapped_us"], o2["communication_not_overlapped_us"], o2["free_us"]) == (
        550.0, 0.0, 200.0, 250.0)
    assert o1["bubble_us"] is None
    for o in (o1, o2):  # Computing + Communication(Not Overlapped) + Free = the window
        assert o["computing_us"] + o["communication_not_overlapped_us"] + o["free_us"] == o["window_us"]
    # the Free ratio parser agrees: 250 / 1000 in both windows
    for engine in ("fast", "ijson"):
        assert [s.free_ratio for s in parse_trace_free(GPU, engine=engine).steps] == [0.25, 0.25]
    assert trace_rank(GPU) == 0


def test_trace_cut_short_counts_the_events_before_the_cut(tmp_path):
    # cut just before the first step-2 kernel (the sgemm at 2100): ProfilerStep#2 was read, no kernel of it;
    # window 1 whole (300 + 100 + 200 + 400 + 50 = 1050), window 2 empty (0); a warning says so
    raw = GPU.read_text()
    cut = tmp_path / "trace" / "cut.pt.trace.json"
    cut.parent.mkdir()
    text = raw[: raw.index('"ampere_sgemm_64x32_tn"')]
    cut.write_text(text[: text.rindex("{")])
    got = trace_categories(cut)
    assert got["warnings"] and "cut short" in got["warnings"][0]
    assert [s["total_us"] for s in got["steps"]] == [1050.0, 0.0]  # step 2's kernels come after the cut
    out = run_categories(tmp_path)
    assert out["warnings"] == [f"trace/cut.pt.trace.json: {got['warnings'][0]}"]


def test_cpu_trace_and_trace_view_categories():
    # cpu_two_steps: window 1 aten::matmul 600 with aten::mm 588 inside (self 12 + 588 = 600 matmul); relu [700,
    # 750] holds sum [740, 800] by the self-time stack (relu self 50 - 60 -> 0), add_ 150: elementwise 210;
    # window 2: aten::add 200, aten::index_select 800 (another thread), aten::copy_ after the window
    cpu = trace_categories(FIX / "cpu_two_steps.pt.trace.json")
    assert cpu["basis"] == "cpu"
    assert [_nonzero(s["category_us"]) for s in cpu["steps"]] == [{"matmul": 600.0, "elementwise": 210.0},
                                                                  {"elementwise": 200.0, "copy": 800.0}]
    # Ascend's trace_view.json layout (bare array, string ts/dur) of the same events as gpu_two_steps
    tv = trace_categories(FIX / "ascend_trace_view.json")
    gpu = trace_categories(FIX / "gpu_two_steps.pt.trace.json")
    assert tv["basis"] == "device" and [s["category_us"] for s in tv["steps"]] == [
        s["category_us"] for s in gpu["steps"]]


def test_eight_ascend_ranks_one_slow(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIX / "ascend" / "eight_ranks_slow", run)
    got = run_rank_breakdown(run)
    assert got["source"] == "ascend_step_trace" and got["warnings"] == []
    assert got["slow_steps"] == [1]
    r5 = got["steps"][1]["ranks"][5]
    assert (r5["computing_us"], r5["communication_not_overlapped_us"], r5["overlapped_us"], r5["free_us"],
            r5["bubble_us"], r5["step_time_us"]) == (1100.0, 200.0, 100.0, 100.0, 0.0, 1400.0)
    slow1 = got["steps"][1]["slow"]
    # step 1: computing 1000..1100, spread 100 = 7.1 % of the 1400 step > 5 %: rank 5 (100 > 0.05 * 1400 = 70)
    assert slow1["flagged"] and slow1["slow_ranks"] == [5] and slow1["step_us"] == 1400.0
    assert slow1["computing"]["spread_share"] == pytest.approx(100 / 1400)
    assert slow1["step_time"]["spread_us"] == 0.0 and slow1["step_time"]["slow_ranks"] == []
    # step 2: rank 3 computes 50 more = 3.6 % < 5 %: not flagged
    slow2 = got["steps"][2]["slow"]
    assert not slow2["flagged"] and slow2["computing"]["spread_share"] == pytest.approx(50 / 1400)
    # a threshold of 8 % leaves step 1 unflagged too (7.1 % < 8 %)
    assert run_rank_breakdown(run, threshold=0.08)["slow_steps"] == []
    # the existing Free ratio of the same rows: 100 / 1400 on every rank
    assert read_ascend_free(run).steps[1].per_rank == {r: 100 / 1400 for r in range(8)}


def test_cluster_step_trace_of_msprof_analyze():
    # ascend/cluster_step_trace_time.csv: the same 8 ranks and 2 steps as eight_ranks_slow in msprof-analyze's
    # layout, plus a "stage" row (left out): the same flag, step 1 rank 5 (7.1 % > 5 %), step 2 unflagged (3.6 %)
    per_step = read_cluster_step_trace(FIX / "ascend" / "cluster_step_trace_time.csv")
    assert sorted(per_step) == [1, 2] and sorted(per_step[1]) == list(range(8))
    assert per_step[1][5] == {"computing_us": 1100.0, "communication_not_overlapped_us": 200.0,
                              "overlapped_us": 100.0, "communication_us": 300.0, "free_us": 100.0,
                              "bubble_us": 0.0, "step_time_us": 1400.0}
    got = run_ranks(per_step)
    assert got["slow_steps"] == [1] and got["steps"][1]["slow"]["slow_ranks"] == [5]


def test_run_without_rank_outputs_reads_the_cluster_file(tmp_path):
    (tmp_path / "cluster_analysis_output").mkdir()
    shutil.copy(FIX / "ascend" / "cluster_step_trace_time.csv", tmp_path / "cluster_analysis_output")
    got = run_rank_breakdown(tmp_path)
    assert got["source"] == "cluster_step_trace" and got["slow_steps"] == [1]
    assert got["steps"][1]["slow"]["slow_ranks"] == [5] and got["steps"][2]["slow"]["flagged"] is False
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_rank_breakdown(empty)["source"] is None


def test_slow_rank_by_step_time():
    # two ranks, step times 1000 and 1100: spread 100 = 9.1 % of the 1100 step; rank 1 is slow by step time
    got = slow_ranks({0: {"step_time_us": 1000.0, "computing_us": 800.0},
                      1: {"step_time_us": 1100.0, "computing_us": 820.0}})
    assert got["flagged"] and got["step_time"]["slow_ranks"] == [1] and got["computing"]["slow_ranks"] == []
    assert got["step_time"]["spread_share"] == pytest.approx(100 / 1100)
    assert not slow_ranks({0: {"step_time_us": 1000.0, "computing_us": 800.0}})["flagged"]  # one rank


def test_torch_ranks_overlap_and_slow_rank(tmp_path):
    # rank 1: the step-2 sgemm lasts 620 ([2100, 2720]): computing 620, NCCL [2700, 2900] overlaps 20, not
    # overlapped 180, free 1000 - 800 = 200; computing spread 620 - 550 = 70 = 7 % of the 1000 window > 5 %
    (tmp_path / "trace").mkdir()
    shutil.copy(GPU, tmp_path / "trace" / "rank0.pt.trace.json")
    doc = json.loads(GPU.read_text())
    doc["distributedInfo"]["rank"] = 1
    t0 = min(e["ts"] for e in doc["traceEvents"] if "ts" in e) - 1000
    for e in doc["traceEvents"]:
        if e.get("name") == "ampere_sgemm_64x32_tn" and e["ts"] == t0 + 2100:
            e["dur"] = 620
    (tmp_path / "trace" / "rank1.pt.trace.json").write_text(json.dumps(doc))
    got = run_rank_breakdown(tmp_path)
    assert got["source"] == "torch_trace" and got["warnings"] == []
    r1 = got["steps"][2]["ranks"][1]
    assert (r1["computing_us"], r1["overlapped_us"], r1["communication_not_overlapped_us"], r1["free_us"]) == (
        620.0, 20.0, 180.0, 200.0)
    assert got["slow_steps"] == [2] and got["steps"][2]["slow"]["slow_ranks"] == [1]
    assert got["steps"][1]["slow"]["computing"]["spread_us"] == 0.0  # step 1 is the same on both ranks


def test_run_categories_per_phase(tmp_path):
    # profile/2/actor_update/... holds kernel_details.csv (training; Step Id 1 and 2), profile/2/rollout/... the
    # op_statistic.csv (rollout; no step column, so the folder's step 2)
    got = run_categories(CAT / "run")
    assert got["warnings"] == []
    assert [(s["kind"], s["phase"], s["rank"]) for s in got["sources"]] == [("kernel_details", "training", 0),
                                                                            ("op_statistic", "rollout", 0)]
    assert sorted(got["steps"]) == [1, 2]
    assert {p: sum(v.values()) for p, v in got["steps"][1]["phases"].items()} == {"training": 340.0}
    assert {p: sum(v.values()) for p, v in got["steps"][2]["phases"].items()} == {"training": 170.0,
                                                                                  "rollout": 2605.0}
    # step 2 matmul: 120 (training) + 1000 (rollout); share of the 2775 in all
    assert got["steps"][2]["category_us"]["matmul"] == 1120.0
    assert got["steps"][2]["share"]["matmul"] == pytest.approx(1120 / 2775)
    # an unreadable file is a warning naming it, never an error
    bad = tmp_path / "run" / "x_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    bad.mkdir(parents=True)
    (bad / "kernel_details.csv").write_text("Foo,Bar\n1,2\n")
    out = run_categories(tmp_path / "run")
    assert out["sources"] == [] and len(out["warnings"]) == 1 and "missing column(s)" in out["warnings"][0]


@pytest.mark.parametrize(("label", "phase"), [
    ("actor_update", "training"), ("ref_compute_log_prob", "training"), ("actor_compute_log_prob", "training"),
    ("actor-rollout_train_step2_rank0-of-1_pid12.json.gz", "training"), ("rollout", "rollout"),
    ("generate_sequences", "rollout"), ("e2e", None), ("", None)])
def test_phase_of(label, phase):
    assert phase_of(label) == phase
