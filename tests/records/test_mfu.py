"""MFU and tokens/s per device per phase (bench.records.mfu) on a tiny model whose FLOPs are counted by hand."""

from __future__ import annotations

import pytest

from bench.measure.flops import step_seqlens, training_flops
from bench.records.mfu import NO_PEAK, cell_phase_perf, device_peak, furthest_from_peak, mlflow_metrics, phase_perf

#: a 2-layer Qwen2-style model with small dims (head_dim = 64 / 4 = 16)
TINY = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}


def by_hand(seqlens: list[int]) -> float:
    """verl 0.9.1's _estimate_qwen2_flops written out for TINY: 6 x matmul params x tokens + causal attention."""
    h, inter, layers, heads, kv, vocab = 64, 128, 2, 4, 2, 100
    d = h // heads                                   # 16
    attn_linear = h * (heads * d + 2 * kv * d + heads * d)  # q, k, v, o: 64 * (64 + 64 + 64) = 12,288
    mlp = 3 * h * inter                              # gate, up, down: 24,576
    emb_and_head = 2 * vocab * h                     # 12,800
    n = (attn_linear + mlp) * layers + emb_and_head  # 86,528 matmul parameters per token
    tokens = sum(seqlens)
    attn = 6 * sum(s * s for s in seqlens) * d * heads * layers  # QK^T and AV over the causal half, fwd + bwd
    return 6 * n * tokens + attn


def test_tiny_model_flops_match_the_hand_count():
    lens = [10, 20]
    assert by_hand(lens) == 15_959_040  # 6 * 86,528 * 30 + 6 * 500 * 16 * 4 * 2
    assert training_flops(TINY, lens) == pytest.approx(by_hand(lens), rel=1e-12)
    # FLOPs per token of one 96-token sequence, forward only (1/3 of training): 2 N + 2 * 96 * d * heads * layers
    assert training_flops(TINY, [96]) / 3 / 96 == pytest.approx(2 * 86_528 + 2 * 96 * 16 * 4 * 2, rel=1e-12)


def test_unknown_model_type_gives_no_flops():
    assert training_flops({**TINY, "model_type": "bert"}, [10]) is None


def test_mfu_per_phase_against_a_given_peak():
    # one step: 4 sequences of 24 tokens (prompt 16 + response 8), 96 tokens; 2 devices; peak 1 GFLOP/s
    row = {"perf/total_num_tokens": 96.0, "prompt_length/mean": 16.0, "response_length/mean": 8.0,
           "timing_s/gen": 0.5, "timing_s/old_log_prob": 0.1, "timing_s/update_actor": 0.4, "timing_s/step": 1.2}
    assert step_seqlens(row) == [24.0] * 4
    f_train = by_hand([24] * 4)
    perf = phase_perf({1: row}, [1], {1: f_train}, n_devices=2, peak_flops=1e9, update_passes=2)
    assert set(perf) == {"gen", "old_log_prob", "update_actor"}  # no ref pass logged: no ref figure
    assert perf["gen"]["mfu"] == pytest.approx(f_train / 3 / 0.5 / 2 / 1e9)
    assert perf["old_log_prob"]["mfu"] == pytest.approx(f_train / 3 / 0.1 / 2 / 1e9)
    assert perf["update_actor"]["mfu"] == pytest.approx(f_train * 2 / 0.4 / 2 / 1e9)
    assert perf["gen"]["tokens_per_s_per_device"] == pytest.approx(96 / 0.5 / 2)
    assert furthest_from_peak(perf) == "gen"
    assert mlflow_metrics(perf)["perf/mfu/update_actor"] == pytest.approx(perf["update_actor"]["mfu"])
    assert "perf/tokens_per_s_per_device/old_log_prob" in mlflow_metrics(perf)
    # without a peak: tokens/s, no MFU
    assert phase_perf({1: row}, [1], {1: f_train}, n_devices=2, peak_flops=None)["gen"]["mfu"] is None
    # a cell: the geometric mean of its runs' values
    other = phase_perf({1: {**row, "timing_s/gen": 2.0}}, [1], {1: f_train}, n_devices=2, peak_flops=1e9)
    cell = cell_phase_perf([{"phase_perf": perf}, {"phase_perf": other}])
    assert cell["gen"]["mfu"] == pytest.approx((perf["gen"]["mfu"] * other["gen"]["mfu"]) ** 0.5)


def test_device_peaks_by_name():
    assert device_peak("NVIDIA H100 80GB HBM3")["peak_flops"] == 989e12
    assert device_peak("NVIDIA H100 PCIe")["peak_flops"] == 756e12
    assert device_peak("NVIDIA H200")["peak_flops"] == 989e12
    assert device_peak("NVIDIA A100-SXM4-80GB")["peak_flops"] == 312e12
    assert device_peak("Ascend910B3")["peak_flops"] == 354e12
    got = device_peak("Some Future Accelerator")
    assert got["peak_flops"] is None and got["source"] == NO_PEAK
