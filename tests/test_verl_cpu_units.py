"""The pieces of the verl CPU target that run without verl: failure classes, factor evidence, the smoke
transformation, trace-step mapping, the RMSNorm patch's arithmetic, the target's launch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench.core.errors import BenchError
from bench.measure import step_from_path
from bench.measure.verl_evidence import factor_evidence, flagged
from bench.measure.verl_failure import classify, culprit_override, last_exception_line
from bench.spec.loading import load_matrix
from bench.spec.plan import make_plan

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "patches"))

# Lines as a real verl 0.9.1 run on this machine printed them (Ray's actor prefix and colours included).
PIN_LOG = """\
\x1b[36m(TaskRunnerV1 pid=8048)\x1b[0m INFO: actor and ref model engine initialized
ray.exceptions.RayTaskError(RuntimeError): \x1b[36mray::WorkerDict.actor_rollout_ref_init_model()\x1b[39m (pid=8507, ip=192.0.2.2)
    padded_sharded_param = padded_sharded_param.pin_memory()
RuntimeError: Cannot access accelerator device when none is available.
Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.
"""  # noqa: E501  (verbatim log lines)
TQ_LOG = """\
  File "verl/trainer/main_ppo.py", line 137, in run
    import transfer_queue as tq
ModuleNotFoundError: No module named 'transfer_queue'
"""
CONFIG_LOG = """\
Could not override 'actor_rollout_ref.actor.no_such_knob'.
To append to your config use +actor_rollout_ref.actor.no_such_knob=1
Key 'no_such_knob' is not in struct
"""
DIED_LOG = """\
(TaskRunnerV1 pid=9093) step:2 - timing_s/step:2.5
\x1b[36m(vLLMHttpServer pid=1619)\x1b[0m RuntimeError: operator torchvision::nms does not exist
ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.
	class_name: vLLMHttpServer
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}
"""


def test_failure_classes_from_real_log_lines():
    assert classify(PIN_LOG) == ("crash", "RuntimeError: Cannot access accelerator device when none is available.")
    assert classify(TQ_LOG) == ("crash", "ModuleNotFoundError: No module named 'transfer_queue'")
    kind, reason = classify(CONFIG_LOG, overrides=["a=1", "actor_rollout_ref.actor.no_such_knob=1"])
    assert kind == "config" and reason.startswith("Could not override 'actor_rollout_ref.actor.no_such_knob'")
    assert reason.endswith("(override actor_rollout_ref.actor.no_such_knob=1)")
    kind, reason = classify(DIED_LOG, steps_done=2)
    assert kind == "worker_died" and "The actor died unexpectedly" in reason
    assert reason.endswith("first error: RuntimeError: operator torchvision::nms does not exist")
    assert classify("torch.OutOfMemoryError: CPU out of memory. Tried to allocate 2.00 GiB")[0] == "oom"
    assert classify(PIN_LOG, timed_out=True, steps_done=0)[0] == "startup_timeout"
    assert classify("", timed_out=True, steps_done=3) == ("timeout", "timed out after 3 finished step(s)")
    assert classify("nothing to see\n") is None
    assert last_exception_line(["(WorkerDict pid=1) ValueError: bad", "done"]) == "ValueError: bad"
    assert culprit_override("Key 'x' is not in struct", ["y=1"]) is None


def _report(tmp: Path, role: str, pid: int, patches: dict) -> None:
    (tmp / "patches").mkdir(parents=True, exist_ok=True)
    requested = [f"{k}:{v['mode']}" if v.get("mode") else k for k, v in patches.items()]
    (tmp / "patches" / f"{role}-h-{pid}.json").write_text(json.dumps(
        {"pid": pid, "role": role, "requested": requested, "patches": patches}))


def test_factor_evidence_verdicts(tmp_path):
    ev = {
        "mode": None,
        "status": "applied",
        "actions": [],
        "counters": {
            "dynamic_bsz": {"calls": 3, "sequences": 24, "micro_batches": 5},
            "forward_prefetch": {"calls": 2, "modules": 2},
            "vllm_config": {"enforce_eager": False, "compilation_mode": "VLLM_COMPILE"},
        },
    }
    rms = {
        "mode": "on",
        "status": "applied",
        "actions": [
            "transformers.models.qwen3.modeling_qwen3.Qwen3RMSNorm.forward -> torch.nn.functional.rms_norm (fused, on)"
        ],
    }
    _report(tmp_path, "ray-worker", 1, {"verl_evidence": ev, "cpu_rmsnorm": rms})
    got = factor_evidence(tmp_path, {"dynamic_bsz": 1, "forward_prefetch": 1, "graph_mode": 1, "rmsnorm_fused": 1,
                                     "mc2": None}, "verl")
    assert {k: v["verdict"] for k, v in got.items()} == {
        "dynamic_bsz": "confirmed", "forward_prefetch": "confirmed", "graph_mode": "confirmed",
        "rmsnorm_fused": "confirmed", "mc2": "n/a"}
    assert got["dynamic_bsz"]["detail"] == "3 passes split 24 sequences into 5 token-budget micro-batches"
    # the same run judged against the other levels: every factor is contradicted; nothing recorded: missing
    other = factor_evidence(tmp_path, {"dynamic_bsz": 0, "forward_prefetch": 0, "graph_mode": 0}, "verl")
    assert {v["verdict"] for v in other.values()} == {"contradicted"} and flagged(other) == list(other)
    empty = tmp_path / "empty"
    empty.mkdir()
    none = factor_evidence(empty, {"dynamic_bsz": 1, "forward_prefetch": 1, "graph_mode": 1, "rmsnorm_fused": 1},
                           "verl")
    assert {v["verdict"] for v in none.values()} == {"missing"}
    # a silent no-op: prefetch on, FSDP2, but no module got a prefetch target
    (empty / "hydra" / ".hydra").mkdir(parents=True)
    (empty / "hydra" / ".hydra" / "config.yaml").write_text("actor_rollout_ref:\n  actor:\n    strategy: fsdp2\n")
    assert "did nothing" in factor_evidence(empty, {"forward_prefetch": 1}, "verl")["forward_prefetch"]["detail"]


def test_trace_step_from_verl_file_names():
    assert step_from_path("profile/actor-rollout-ref_train_step3_rank0-of-1_pid9455_2026.json.gz") == 3
    assert step_from_path("profile/12/actor/trace.json") == 12
    assert step_from_path("trace/run.pt.trace.json") is None


def test_rollout_traces_paired_with_the_profiled_steps():
    """vLLM's rollout traces name no step: per engine worker, in the order of their millisecond stamps, they
    take the steps the training traces name; a count that does not match pairs nothing and says so."""
    from bench.measure.torch_reader import trace_steps

    train = ["profile/actor-rollout-ref_train_step2_rank0-of-1_pid9.json.gz",
             "profile/actor-rollout-ref_train_step3_rank0-of-1_pid9.json.gz"]
    rollout = ["profile/rollout-replica0_ab12-rank-0.1764868201000.pt.trace.json.gz",
               "profile/rollout-replica0_ab12-rank-0.1764868199000.pt.trace.json.gz"]
    late = "profile/agent_loop_rollout_replica_1/cd34-rank-0.1764868200500.pt.trace.json.gz"
    steps, warnings = trace_steps([*train, *rollout])
    assert [steps[r] for r in train] == [2, 3] and [steps[r] for r in rollout] == [3, 2] and warnings == []
    steps, warnings = trace_steps([train[1], rollout[0], late])  # one profiled step, two workers
    assert steps[rollout[0]] == 3 and steps[late] == 3 and warnings == []
    steps, warnings = trace_steps([train[1], *rollout])
    assert steps[rollout[0]] is None and steps[rollout[1]] is None
    assert warnings == ["profile/rollout-replica0_ab12-rank-0.pt.trace.json.gz: 2 rollout trace(s) for 1 "
                        "profiled step(s) [3]: not paired with a step"]
    assert trace_steps(["trace/run.pt.trace.json"]) == ({"trace/run.pt.trace.json": None}, [])


def test_smoke_cells_keep_the_cell_and_say_what_was_left_out():
    from bench.engines.verl_cpu.smoke import accelerator_only, smoke_cells

    m = load_matrix(ROOT / "matrix" / "qwen3vl8b_a2.yaml")
    plan = make_plan(m, strict=False)
    cells = smoke_cells(m, plan, steps=2)
    assert len(cells) == len(plan.runs) == 9
    by_label = {c.source_label: c for c in cells}
    tq2 = by_label["task_queue=2"]
    assert tq2.spec.platform == "cpu" and tq2.spec.launch.argv[0] == "{verl_python}"
    assert tq2.spec.launch.env["TASK_QUEUE_ENABLE"] == "2"  # the cell's own environment is kept ...
    assert any(x.startswith("TASK_QUEUE_ENABLE=2: read by torch_npu") for x in tq2.inert)  # ... and said inert
    fused = by_label["rmsnorm_fused"].spec.launch
    assert "qwen3vl_npu_fused:on" in fused.patches and "verl_cpu" in fused.patches
    argv = " ".join(fused.argv)
    assert "trainer.device=cpu" in argv and "trainer.total_training_steps=2" in argv and "global_profiler" not in argv
    assert "data.image_key=images" in argv and "actor_rollout_ref.rollout.max_num_batched_tokens=8192" in argv
    left = by_label["all-off"].left_out
    assert any("use_remove_padding=true" in x and "flash-attn" in x for x in left)
    assert any("free_cache_engine=true" in x for x in left)
    assert not any("rollout.name=vllm" in x for x in left)  # the CPU target sets the same value itself
    assert accelerator_only("actor_rollout_ref.actor.strategy=fsdp") and not accelerator_only("data.truncation=error")


def test_cpu_rmsnorm_arithmetic():
    import torch
    from bench_patches.cpu_rmsnorm import decomposed_rms_norm, fused_forward
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    torch.manual_seed(0)
    norm = Qwen3RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 7, 64)
    ref = norm(x)
    assert torch.allclose(fused_forward(norm, x), ref, atol=1e-5)
    assert torch.allclose(decomposed_rms_norm(x, norm.weight, 1e-6), ref, atol=1e-5)


def test_builtin_assets_and_unknown_names(tmp_path, monkeypatch):
    from bench.engines.verl.overrides import builtin_data_path, builtin_model_path
    from bench.engines.verl_cpu import assets

    assert builtin_model_path(None, "cpu") == f"{{bench_cache}}/models/qwen3-tiny-{assets.cache_key()}"
    assert builtin_model_path("/ckpt", "cpu") is None and builtin_data_path("/d.parquet", "cpu") is None
    with pytest.raises(BenchError, match="unknown builtin model"):
        builtin_model_path("builtin:llama", "cpu")
    path = assets.ensure_model(tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["num_hidden_layers"] == 2
    assert (path / "tokenizer.json").is_file() and assets.ensure_model(tmp_path) == path  # cached


def test_builtin_vl_model_and_data_for_verl_cpu(tmp_path):
    """builtin:qwen3vl-tiny is the embedded engine's tiny Qwen3-VL folder (one builder, one cache entry);
    builtin:vl is verl's multimodal RL parquet: an ``images`` column and ``<image>`` in the user message."""
    import pyarrow.parquet as pq

    from bench.engines.builtins import data as data_mod
    from bench.engines.builtins.model import BUILTIN_MODEL as EMBEDDED_VL
    from bench.engines.builtins.model import resolve_model_path
    from bench.engines.verl.overrides import builtin_data_path, builtin_model_path
    from bench.engines.verl_cpu import assets

    shared = resolve_model_path(EMBEDDED_VL, tmp_path)[0]
    rel = shared.relative_to(tmp_path).as_posix()
    assert builtin_model_path("builtin:qwen3vl-tiny", "cpu") == "{bench_cache}/" + rel
    assert assets.vl_model_dir(tmp_path) == shared
    with pytest.raises(BenchError, match="tiny CPU model; on npu"):
        builtin_model_path("builtin:qwen3vl-tiny", "npu")
    assert builtin_data_path("builtin:vl", "cpu") == "{bench_cache}/" + data_mod.builtin_relpath("builtin:vl")
    table = pq.read_table(data_mod.builtin_path("builtin:vl", tmp_path)).to_pylist()
    assert len(table) == data_mod.BUILTIN_SIZE
    for row in table[:20]:
        assert row["data_source"] == "bench/vl" and len(row["images"]) == 1
        assert row["images"][0]["bytes"][:8] == b"\x89PNG\r\n\x1a\n"
        (msg,) = row["prompt"]
        assert msg["role"] == "user" and msg["content"].count("<image>") == 1
        assert row["reward_model"]["ground_truth"].isdigit()


def test_embedded_rollout_never_samples_vision_placeholders():
    """A sampled <|image_pad|> in a response made the next Qwen3-VL training forward fail ("Image features
    and image tokens do not match", seen in matrix/full.yaml at step 4): generation suppresses them."""
    from types import SimpleNamespace

    from bench.engines.embedded.checkpoint import token_ids

    cfg = SimpleNamespace(image_token_id=7, video_token_id=8, vision_start_token_id=5, vision_end_token_id=6)
    model = SimpleNamespace(config=cfg, generation_config=SimpleNamespace(eos_token_id=[3, 1]))
    tok = SimpleNamespace(eos_token_id=3, pad_token_id=1)
    ids = token_ids(model, tok)
    assert ids.vision == (7, 8, 5, 6) and ids.image == 7 and ids.eos == (3, 1)
    src = (ROOT / "bench" / "engines" / "embedded" / "rollout.py").read_text()
    assert "suppress_tokens=list(ids.vision)" in src
