"""The verl engine: exact argv and environment of chosen cells (the article's values), conflicts,
applicability, unset variables, notes and preflight — all on CPU."""

from __future__ import annotations

import pytest

from bench.core.errors import BenchError
from bench.engines.base import get_engine
from bench.engines.verl.launch import VerlEngine, check_path
from bench.engines.verl.notes import forward_prefetch_note
from bench.engines.verl.overrides import fill_run_dir, overrides_of
from bench.spec.loading import load_matrix
from bench.spec.matrix import ExplicitDesign, Matrix
from bench.spec.optimizations import Mechanism
from bench.spec.plan import make_plan

A2 = "matrix/qwen3vl8b_a2.yaml"
ENV = {"QWEN3VL_MODEL_PATH": "/models/Qwen3-VL-8B-Instruct", "QWEN3VL_TRAIN_FILES": "/data/geo3k/train.parquet",
       "QWEN3VL_VAL_FILES": "/data/geo3k/test.parquet"}
ALL_ON = {"rmsnorm_fused": 1, "task_queue": 1, "dynamic_bsz": 1, "forward_prefetch": 1, "mc2": 1, "mrope_cache": 1,
          "graph_mode": 1}
ALL_OFF = {k: 0 for k in ALL_ON}

HEAD = [
    "{python}", "-m", "verl.trainer.main_ppo",
    "algorithm.adv_estimator=grpo",
    "data.train_files=/data/geo3k/train.parquet",
    "data.val_files=/data/geo3k/test.parquet",
    "data.train_batch_size=128",
    "data.max_prompt_length=1024",
    "data.max_response_length=2048",
    "data.seed=0",
    "actor_rollout_ref.model.path=/models/Qwen3-VL-8B-Instruct",
    "actor_rollout_ref.actor.ppo_mini_batch_size=32",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.rollout.temperature=1.0",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
    "algorithm.use_kl_in_reward=false",
    "trainer.device=npu",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1",
    "trainer.total_training_steps=6",
    "trainer.val_before_train=false",
    "trainer.logger=[console,file]",
    "global_profiler.tool=npu",
    "global_profiler.steps=[6]",
    "global_profiler.save_path='{run_dir}/profile'",
    *[f"actor_rollout_ref.{role}.profiler.{k}" for role in ("actor", "ref") for k in (
        "enable=true", "all_ranks=true", "tool_config.npu.discrete=false", "tool_config.npu.contents=[npu,cpu]",
        "tool_config.npu.level=level1", "tool_config.npu.analysis=true")],
]
TAIL = [
    "data.image_key=images",
    "data.filter_overlong_prompts=true",
    "data.truncation=error",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.kl_loss_coef=0.01",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.use_torch_compile=false",
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true",
    "actor_rollout_ref.ref.entropy_from_logits_with_chunking=true",
    "actor_rollout_ref.model.use_remove_padding=true",
    "actor_rollout_ref.model.enable_gradient_checkpointing=true",
    "actor_rollout_ref.ref.fsdp_config.param_offload=true",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.enable_chunked_prefill=true",
    "actor_rollout_ref.rollout.max_num_batched_tokens=8192",
    "actor_rollout_ref.rollout.free_cache_engine=true",
    "hydra.run.dir='{run_dir}/hydra'",
]


@pytest.fixture
def a2_env(monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)


def _cells(matrix: Matrix, *cells: dict, platform: str | None = None, **base_update):
    base = matrix.base.model_copy(update=base_update) if base_update else matrix.base
    m = matrix.model_copy(update={"design": ExplicitDesign(type="explicit", cells=[dict(c) for c in cells]),
                                  "base": base})
    return make_plan(m, platform, strict=True)


def test_article_all_on_cell_exact(a2_env):
    """Every optimization of the article on: the exact argv, environment and patches."""
    run = _cells(load_matrix(A2), ALL_ON).runs[0]
    assert run.launch.argv == HEAD + [
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=6144",  # 2 * (1024 + 2048)
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=12288",  # 4 * (1024 + 2048)
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=12288",
        "actor_rollout_ref.actor.fsdp_config.forward_prefetch=true",
        "actor_rollout_ref.ref.fsdp_config.forward_prefetch=true",
        "actor_rollout_ref.rollout.enforce_eager=false",
    ] + TAIL
    assert run.launch.env == {
        "USE_OPTIMIZED_MODEL": "0",
        "TASK_QUEUE_ENABLE": "1",
        "VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE": "1",
        "VERL_FILE_LOGGER_PATH": "{run_dir}/metrics.jsonl",
    }
    assert run.launch.patches == [
        "qwen3vl_npu_fused:on",
        "vllm_ascend_mrope_cache",
        "verl_file_logger",
        "verl_evidence",
    ]
    assert run.launch.notes == []
    assert run.launch.config["overrides"] == run.launch.argv[3:]


def test_article_all_off_cell_exact(a2_env):
    run = _cells(load_matrix(A2), ALL_OFF).runs[0]
    assert run.launch.argv == HEAD + [
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=false",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.fsdp_config.forward_prefetch=false",
        "actor_rollout_ref.ref.fsdp_config.forward_prefetch=false",
        "actor_rollout_ref.rollout.enforce_eager=true",
    ] + TAIL
    assert run.launch.env == {"USE_OPTIMIZED_MODEL": "0", "TASK_QUEUE_ENABLE": "0",
                              "VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE": "0",
                              "VERL_FILE_LOGGER_PATH": "{run_dir}/metrics.jsonl"}
    # "off" actively restores the eager forwards (verl 0.6.x patches them at import)
    assert run.launch.patches == ["qwen3vl_npu_fused:off", "verl_file_logger", "verl_evidence"]


def test_task_queue_levels_and_graph_mode_conflict(a2_env):
    m = load_matrix(A2)
    cells = [{**ALL_OFF, "task_queue": tq, "graph_mode": g} for tq in (0, 1, 2) for g in (0, 1)]
    plan = _cells(m, *cells)
    assert len(plan.runs) == 5
    assert len(plan.dropped) == 1
    dropped = plan.dropped[0]
    assert (dropped.cell["task_queue"], dropped.cell["graph_mode"], dropped.kind) == (2, 1, "invalid")
    assert "TASK_QUEUE_ENABLE=2" in dropped.reason
    seen = {(r.launch.env["TASK_QUEUE_ENABLE"], r.launch.argv[-len(TAIL) - 1]) for r in plan.runs}
    assert seen == {("0", "actor_rollout_ref.rollout.enforce_eager=true"),
                    ("0", "actor_rollout_ref.rollout.enforce_eager=false"),
                    ("1", "actor_rollout_ref.rollout.enforce_eager=true"),
                    ("1", "actor_rollout_ref.rollout.enforce_eager=false"),
                    ("2", "actor_rollout_ref.rollout.enforce_eager=true")}
    # the full design of the article's matrix: 192 design cells, 32 invalid, 160 runs
    full = make_plan(m.model_copy(update={"design": load_matrix("matrix/full.yaml").design}), strict=True)
    assert (full.design_cells, len(full.dropped), len(full.runs)) == (192, 32, 160)
    assert {d.kind for d in full.dropped} == {"invalid"}


def test_mc2_not_applicable_at_tp1(a2_env):
    m = load_matrix(A2)
    tp1 = _cells(m, {**ALL_OFF, "mc2": 0}, {**ALL_OFF, "mc2": 1}, rollout_tp=1)
    assert len(tp1.runs) == 1 and len(tp1.runs[0].cells) == 2  # merged: mc2 does nothing at TP 1
    run = tp1.runs[0]
    assert run.levels["mc2"] is None
    assert (
        "tensor_model_parallel_size >= 2" in run.not_applicable["mc2"] and "rollout_tp=1" in run.not_applicable["mc2"]
    )
    assert "VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE" not in run.launch.env
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=1" in run.launch.argv
    tp2 = _cells(m, {**ALL_OFF, "mc2": 1}, rollout_tp=2)
    assert tp2.runs[0].launch.env["VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE"] == "1"


def test_cuda_cell(a2_env):
    run = _cells(load_matrix(A2), ALL_ON, platform="cuda").runs[0]
    argv = run.launch.argv
    assert "trainer.device=cuda" in argv and "global_profiler.tool=torch" in argv
    assert "actor_rollout_ref.model.use_liger=true" in argv  # the fused path on CUDA is Liger
    assert not [a for a in argv if "tool_config.npu" in a]
    assert run.launch.patches == ["verl_file_logger", "verl_evidence"]
    assert set(run.launch.env) == {"USE_OPTIMIZED_MODEL", "VERL_FILE_LOGGER_PATH"}  # no task queue / mc2 on CUDA
    assert {k for k, v in run.levels.items() if v is None} == {"task_queue", "mc2", "mrope_cache"}


def test_dry_run_plan_with_unset_variables(monkeypatch):
    for k in ENV:
        monkeypatch.delenv(k, raising=False)
    plan = make_plan(load_matrix(A2), strict=False)  # platform npu in the file; this machine has none
    assert plan.platform == "npu" and len(plan.runs) == 9
    run = plan.runs[0]
    assert "actor_rollout_ref.model.path=${QWEN3VL_MODEL_PATH}" in run.launch.argv
    assert "data.train_files=${QWEN3VL_TRAIN_FILES}" in run.launch.argv
    assert "data.val_files=${QWEN3VL_TRAIN_FILES}" in run.launch.argv  # no val files: the train file
    assert any("base.model" in n and "QWEN3VL_MODEL_PATH" in n for n in run.launch.notes)
    with pytest.raises(BenchError) as err:
        make_plan(load_matrix(A2), strict=True)
    assert str(err.value) == (f"{A2}: base.model: environment variable QWEN3VL_MODEL_PATH is not set "
                              "(export QWEN3VL_MODEL_PATH=...)")
    monkeypatch.setenv("QWEN3VL_MODEL_PATH", "/m")
    with pytest.raises(BenchError, match=r"base\.data: environment variable QWEN3VL_TRAIN_FILES is not set"):
        make_plan(load_matrix(A2), strict=True)


def test_refusals():
    base = load_matrix("matrix/full.yaml").base
    engine = get_engine("verl")
    cpu = engine.build(base, Mechanism(), "cpu", {}, strict=True)  # verl:cpu: tiny model and data, built locally
    assert cpu.argv[0] == "{verl_python}" and "trainer.device=cpu" in cpu.argv
    assert any(a.startswith("actor_rollout_ref.model.path='{bench_cache}/models/qwen3-tiny-") for a in cpu.argv)
    assert cpu.env["VERL_PLATFORM"] == "cpu" and cpu.patches[0] == "verl_cpu"
    rollout = [a for a in cpu.argv if a.startswith("actor_rollout_ref.rollout.profiler.")]
    assert rollout == [f"actor_rollout_ref.rollout.profiler.{k}" for k in (
        "enable=true", "all_ranks=true", "relocate_results=true", "tool_config.torch.discrete=true",
        "tool_config.torch.contents=[cpu]")]  # vLLM's engine traced for the rollout phase (verl 0.9.x)
    for platform in ("npu", "cuda"):  # verl 0.6.1's rollout profiler has no tool_config.torch / relocate_results
        acc = engine.build(base.model_copy(update={"model": "/m", "data": "/d"}), Mechanism(), platform, {},
                           strict=True)
        assert not [a for a in acc.argv if a.startswith("actor_rollout_ref.rollout.profiler.")]
    unprofiled = engine.build(base.model_copy(update={"profile_steps": []}), Mechanism(), "cpu", {}, strict=True)
    assert not [a for a in unprofiled.argv if "profiler" in a]
    with pytest.raises(BenchError, match=r"base\.model: builtin:qwen3-tiny is the tiny CPU model"):
        engine.build(base.model_copy(update={"model": "builtin:qwen3-tiny", "data": "/d"}), Mechanism(), "npu", {},
                     strict=False)
    with pytest.raises(BenchError, match="unknown builtin data set"):
        engine.build(base.model_copy(update={"data": "builtin:nope"}), Mechanism(), "cpu", {}, strict=False)
    with pytest.raises(BenchError, match=r"base\.model: engine verl needs a model path"):
        engine.build(base, Mechanism(), "npu", {}, strict=True)
    dry = engine.build(base, Mechanism(), "npu", {}, strict=False)  # a dry run shows what is missing
    assert "actor_rollout_ref.model.path=???" in dry.argv and "data.train_files=???" in dry.argv
    assert any(n.startswith("base.model is not set: engine verl needs a model path") for n in dry.notes)


def test_notes_for_overridden_factors_and_forward_prefetch(a2_env):
    m = load_matrix(A2)
    base = m.base.model_copy(update={
        "overrides": [*m.base.overrides, "actor_rollout_ref.rollout.enforce_eager=true",
                      "actor_rollout_ref.actor.strategy=fsdp2"],
        "env": {**m.base.env, "TASK_QUEUE_ENABLE": "2"},
    })
    mech = Mechanism(env={"TASK_QUEUE_ENABLE": "1"}, overrides=("actor_rollout_ref.rollout.enforce_eager=false",
                                                                 "actor_rollout_ref.actor.fsdp_config.forward_prefetch=true"))
    levels = {"task_queue": 1, "graph_mode": 1, "forward_prefetch": 1}
    launch = VerlEngine("0.6.1").build(base, mech, "npu", levels, strict=True)
    notes = "\n".join(launch.notes)
    assert launch.env["TASK_QUEUE_ENABLE"] == "1" and "base.env.TASK_QUEUE_ENABLE=2 is replaced" in notes
    assert "base.overrides sets actor_rollout_ref.rollout.enforce_eager after factor graph_mode" in notes
    assert "verl 0.6.1 with strategy fsdp2 ignores fsdp_config.forward_prefetch" in notes
    # the installed verl (0.9.x) honours it under FSDP2; FSDP1 (the default strategy) always does
    assert not [n for n in VerlEngine().build(base, mech, "npu", levels, strict=True).notes if "forward_prefetch" in n]
    assert forward_prefetch_note(["actor_rollout_ref.actor.strategy=fsdp2"]) is None
    assert forward_prefetch_note(["actor_rollout_ref.actor.strategy=fsdp"], "0.6.1") is None


def test_paths_are_quoted_for_hydra(monkeypatch):
    monkeypatch.setenv("QWEN3VL_MODEL_PATH", "/models/my model,v2")
    monkeypatch.setenv("QWEN3VL_TRAIN_FILES", "[/d/a.parquet,/d/b.parquet]")
    run = _cells(load_matrix(A2), ALL_OFF).runs[0]
    assert "actor_rollout_ref.model.path='/models/my model,v2'" in run.launch.argv
    assert "data.train_files=[/d/a.parquet,/d/b.parquet]" in run.launch.argv  # a Hydra list passes as written
    from bench.engines.verl.config import fast_compose

    cfg = fast_compose(overrides_of([a.replace("{run_dir}", "/r") for a in run.launch.argv]))
    assert cfg.actor_rollout_ref.model.path == "/models/my model,v2"
    assert list(cfg.data.train_files) == ["/d/a.parquet", "/d/b.parquet"]


def test_check_path(tmp_path):
    check_path("m.yaml", "base.model", str(tmp_path))
    check_path("m.yaml", "base.data", "hdfs://cluster/data.parquet")
    with pytest.raises(BenchError, match=r"m\.yaml: base\.data: /nope/x\.parquet does not exist"):
        check_path("m.yaml", "base.data", "/nope/x.parquet")
    with pytest.raises(BenchError, match="environment variable QWEN3VL_MODEL_PATH is not set"):
        check_path("m.yaml", "base.model", "${QWEN3VL_MODEL_PATH}")


def test_preflight_on_this_cpu_machine(tmp_path, monkeypatch):
    """Clear errors, in order: a missing path, an override the installed verl refuses, a configuration
    verl's own validate_config rejects, no NPU (one real probe: import verl, validate, count devices)."""
    import bench.engines.verl.launch as verl_engine

    model, data = tmp_path / "model", tmp_path / "train.parquet"
    model.mkdir()
    data.write_bytes(b"")
    monkeypatch.setenv("QWEN3VL_MODEL_PATH", str(model))
    monkeypatch.setenv("QWEN3VL_TRAIN_FILES", str(tmp_path / "missing.parquet"))
    monkeypatch.delenv("QWEN3VL_VAL_FILES", raising=False)
    m = load_matrix(A2)
    engine = VerlEngine()
    with pytest.raises(BenchError, match=r"base\.data: .*missing\.parquet does not exist on this machine"):
        engine.preflight(m, [r.launch for r in make_plan(m, strict=True).runs], "npu")
    monkeypatch.setenv("QWEN3VL_TRAIN_FILES", str(data))
    bad = m.model_copy(update={"base": m.base.model_copy(update={"overrides": ["trainer.no_such_key=1"]})})
    with pytest.raises(BenchError, match=r"refuses the override 'trainer.no_such_key=1'"):
        engine.preflight(bad, [r.launch for r in make_plan(bad, strict=True).runs], "npu")

    # 3 prompts x n=1 cannot be split over 2 devices: verl's validate_config says so
    odd = m.model_copy(update={"factors": {"dynamic_bsz": [0]}, "base": m.base.model_copy(update={
        "train_batch_size": 3, "ppo_mini_batch_size": 3, "n": 1, "n_gpus_per_node": 2})})
    good_launches = [r.launch for r in make_plan(m, strict=True).runs]
    odd_launches = [r.launch for r in make_plan(odd, strict=True).runs]
    lists = [fill_run_dir(overrides_of(launch.argv)) for launch in good_launches[:1] + odd_launches]
    probe = verl_engine.probe_machine("npu", lists)
    from bench.engines.verl.config import installed_verl_version

    assert probe["verl"] == installed_verl_version()
    assert probe["invalid"]["index"] == 1 and "divisible" in probe["invalid"]["error"]
    assert probe["devices"] == 0 and "torch_npu does not import" in probe["detail"]

    monkeypatch.setattr(verl_engine, "probe_machine", lambda platform, lists, **kw: {**probe, "invalid": {
        "index": 0, "error": probe["invalid"]["error"]}})
    with pytest.raises(BenchError, match=r"verl .* rejects run 1 of the plan \(its validate_config\): .*divisible"):
        engine.preflight(odd, odd_launches, "npu")
    monkeypatch.setattr(verl_engine, "probe_machine", lambda platform, lists, **kw: {
        k: v for k, v in probe.items() if k != "invalid"})
    with pytest.raises(BenchError, match=r"base\.n_gpus_per_node: 8 npu device\(s\) wanted, 0 visible .*torch_npu"):
        engine.preflight(m, good_launches, "npu")


def test_resolve_launch_fills_only_its_placeholders(tmp_path):
    """Hydra overrides may hold braces (interpolations, dicts): only {python} and {run_dir} are filled."""
    from bench.execution.executors import resolve_launch

    argv = ["{python}", "-m", "verl.trainer.main_ppo", "global_profiler.save_path='{run_dir}/profile'",
            "+x.y=${oc.env:HOME}", "+z={a:1}"]
    res = resolve_launch(argv, {"VERL_FILE_LOGGER_PATH": "{run_dir}/metrics.jsonl", "B": "{notmine}"},
                         ["verl_file_logger"], tmp_path, 10)
    assert res.argv[3:] == [f"global_profiler.save_path='{tmp_path.resolve()}/profile'", "+x.y=${oc.env:HOME}",
                            "+z={a:1}"]
    assert res.env["VERL_FILE_LOGGER_PATH"] == f"{tmp_path.resolve()}/metrics.jsonl" and res.env["B"] == "{notmine}"
