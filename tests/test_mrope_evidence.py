"""``mrope_cache`` on verl:cpu without verl: where the factor applies (multimodal runs only), what each level
launches, and the evidence verdicts read from patch reports as the vLLM processes write them."""

from __future__ import annotations

import json
from pathlib import Path

from bench.measure.verl_evidence import factor_evidence
from bench.spec.loading import load_matrix
from bench.spec.matrix import Base
from bench.spec.optimizations import applicability, resolve
from bench.spec.plan import make_plan

ROOT = Path(__file__).resolve().parent.parent


def _reports(tmp: Path, *records: tuple[str, dict]) -> Path:
    (tmp / "patches").mkdir(parents=True, exist_ok=True)
    for pid, (role, patches) in enumerate(records, 1):
        requested = [f"{k}:{v['mode']}" if v.get("mode") else k for k, v in patches.items()]
        (tmp / "patches" / f"{role}-h-{pid}.json").write_text(
            json.dumps({"pid": pid, "role": role, "requested": requested, "patches": patches}))
    return tmp


def _rec(mode: str, status: str = "applied", **counters: int) -> dict:
    rec = {"mode": mode, "status": status, "reason": "",
           "actions": ["vllm.model_executor.layers.rotary_embedding.mrope.MRotaryEmbedding.forward_native -> x"]}
    if counters:
        rec["counters"] = {"fallback": {}, "tokens": 10, **counters}
    return rec


def test_mrope_cache_applies_on_cpu_only_to_multimodal_runs():
    text = Base(model="builtin:qwen3-tiny", data="builtin:text")
    why = applicability("mrope_cache", "verl", "cpu", text.context())
    assert why and why.startswith("MRoPE exists only in multimodal models") and "multimodal=0" in why
    for vl in (Base(model="builtin:qwen3vl-tiny", data="builtin:vl"), Base(overrides=["data.image_key=images"])):
        assert vl.is_multimodal() and applicability("mrope_cache", "verl", "cpu", vl.context()) is None
    # the NPU target keeps its rule: a user's Qwen3-VL matrix need not name the image key
    assert applicability("mrope_cache", "verl", "npu", text.context()) is None
    assert resolve("mrope_cache", 1, "verl", "cpu").patches == ("vllm_mrope_cache:on",)
    assert resolve("mrope_cache", 0, "verl", "cpu").patches == ("vllm_mrope_cache:off",)
    # the shipped text matrix: mrope_cache stays out of its runs, with the reason
    plan = make_plan(load_matrix(ROOT / "matrix" / "verl_cpu.yaml"), strict=False)
    assert all(r.levels.get("mrope_cache") is None for r in plan.runs)
    assert "multimodal" in plan.runs[0].not_applicable["mrope_cache"]


def test_mrope_cache_evidence_from_vllm_process_reports(tmp_path):
    on = _reports(tmp_path / "on", ("driver", {"vllm_mrope_cache": _rec("on")}),
                  ("mp-child", {"vllm_mrope_cache": _rec("on", forwards=12, hits=36, layer_calls=48)}))
    got = factor_evidence(on, {"mrope_cache": 1}, "verl", "cpu")["mrope_cache"]
    assert got == {"verdict": "confirmed", "detail": "vllm_mrope_cache: 12 forwards, 36 of 48 layer calls reused "
                                                     "the forward's cos/sin, in 1 vLLM process(es)"}
    # the same run judged as the off level: contradicted
    assert factor_evidence(on, {"mrope_cache": 0}, "verl", "cpu")["mrope_cache"]["verdict"] == "contradicted"
    off = _reports(tmp_path / "off", ("mp-child", {"vllm_mrope_cache": _rec("off", forwards=12, hits=0,
                                                                            layer_calls=48)}))
    got = factor_evidence(off, {"mrope_cache": 0}, "verl", "cpu")["mrope_cache"]
    assert got["verdict"] == "confirmed" and got["detail"].endswith("vLLM's own MRoPE in every layer")
    assert factor_evidence(off, {"mrope_cache": 1}, "verl", "cpu")["mrope_cache"]["verdict"] == "missing"
    # armed, never reached: a compiled (graph mode) engine, or a model without MRoPE
    ev = {"mode": None, "status": "applied", "actions": [],
          "counters": {"vllm_config": {"enforce_eager": False, "compilation_mode": "VLLM_COMPILE"}}}
    graph = _reports(tmp_path / "graph", ("mp-child", {"vllm_mrope_cache": _rec("on", "armed"), "verl_evidence": ev}))
    got = factor_evidence(graph, {"mrope_cache": 1}, "verl", "cpu")["mrope_cache"]
    assert got["verdict"] == "missing" and "vLLM compiled the model (VLLM_COMPILE)" in got["detail"]
    # the off level in a graph-mode run: vLLM's own MRoPE, compiled: nothing cached, as asked
    graph_off = _reports(tmp_path / "graph_off", ("mp-child", {"vllm_mrope_cache": _rec("off", "armed"),
                                                               "verl_evidence": ev}))
    got = factor_evidence(graph_off, {"mrope_cache": 0}, "verl", "cpu")["mrope_cache"]
    assert got["verdict"] == "confirmed" and "compiled graph runs vLLM's own MRoPE" in got["detail"]
    nothing = _reports(tmp_path / "none", ("driver", {"verl_cpu": _rec("on")}))
    assert factor_evidence(nothing, {"mrope_cache": 1}, "verl", "cpu")["mrope_cache"]["verdict"] == "missing"
    assert factor_evidence(nothing, {"mrope_cache": 0}, "verl", "cpu")["mrope_cache"]["verdict"] == "confirmed"
    refused = _reports(tmp_path / "refused", ("mp-child", {"vllm_ascend_mrope_cache": {
        "mode": None, "status": "refused", "actions": [], "reason": "needs torch_npu for npu_rotary_mul"}}))
    got = factor_evidence(refused, {"mrope_cache": 1}, "verl", "npu")["mrope_cache"]
    assert got["verdict"] == "missing" and "needs torch_npu" in got["detail"]


def test_forward_key_of_the_cache_tracks_in_place_updates_and_inference_tensors():
    import sys

    import torch

    sys.path.insert(0, str(ROOT / "patches"))
    from bench_patches.vllm_mrope_cache import _same_forward, version_of

    ctx, positions = object(), torch.arange(6).expand(3, 6).clone()
    entry = (ctx, positions, version_of(positions))
    assert _same_forward(entry, ctx, positions)
    positions[0, 0] = 5  # vLLM refills its positions buffer in place between forwards
    assert not _same_forward(entry, ctx, positions)
    assert not _same_forward((ctx, positions, version_of(positions)), object(), positions)  # a new forward
    assert not _same_forward((ctx, positions, version_of(positions)), ctx, positions.clone())
    with torch.inference_mode():
        frozen = torch.arange(4)
    assert version_of(frozen) is None and _same_forward((ctx, frozen, None), ctx, frozen)
