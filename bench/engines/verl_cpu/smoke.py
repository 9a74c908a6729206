"""``run_bench.py MATRIX --smoke``: every cell of a verl matrix, for real, on this CPU, before accelerator time.

A verl matrix for NPU or GPU nodes is checked against verl's config at plan time, but some mistakes only
show when verl runs: a factor whose mechanism is silently ignored, a patch that fails to import, an
override that verl accepts and then trips over, an environment variable nobody reads. The smoke run
launches each cell's own verl launch on the ``verl:cpu`` target for a couple of real GRPO steps:

- kept from the cell: its factor overrides (filled with the smoke lengths), its environment (factor and
  ``base.env``), its patches (an NPU patch then reports in each process whether it applied or why it
  refused), and ``base.overrides``;
- replaced: model and data (the tiny ``builtin:qwen3-tiny`` and ``builtin:text``; for a multimodal
  matrix, :meth:`bench.spec.matrix.Base.is_multimodal`, the tiny Qwen3-VL ``builtin:qwen3vl-tiny`` and the
  image prompts ``builtin:vl``, so the matrix's image key, processor and multimodal data settings meet a
  VL model), lengths, batch sizes, ``n``, steps, ranks and rollout TP (one CPU rank), the device (``cpu``)
  and the profiler (off);
- added: the CPU counterpart of a factor's patch where the CPU target has one (``mrope_cache`` ->
  ``vllm_mrope_cache``, ``rmsnorm_fused`` -> ``cpu_rmsnorm``), beside the cell's own patch (an NPU patch
  refuses on CPU and says why in its report), so the factor's idea runs and its evidence is checked;
- left out, with the reason: overrides that only make sense on an accelerator
  (:data:`ACCELERATOR_ONLY`), and the accelerator platform's profiler settings.

This module plans the smoke cells (:func:`smoke_cells`); :func:`bench.execution.smoke.run_smoke` runs
them. Per cell the result is ``ran`` (steps finished, with the evidence of each factor), ``failed`` with the
first verl error line, and the list of what was left out and why. Nothing goes to MLflow: a smoke run
checks launches, it measures nothing worth comparing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from bench.core.engine_registry import get_engine
from bench.engines.verl.overrides import key_of
from bench.engines.verl_cpu import target
from bench.spec.matrix import Base, Matrix
from bench.spec.optimizations import REGISTRY, applicability, resolve
from bench.spec.plan import Plan, RunSpec, cell_id_of, launch_levels, merge_mechanisms

#: Key patterns of overrides that only make sense on an accelerator, with the reason they are left out.
ACCELERATOR_ONLY: tuple[tuple[str, str], ...] = (
    (r"actor_rollout_ref\.model\.use_remove_padding", "remove-padding needs flash-attn's varlen kernels (CUDA/NPU)"),
    (r"actor_rollout_ref\.model\.use_liger", "Liger kernels are Triton GPU kernels"),
    (r"actor_rollout_ref\.model\.use_fused_kernels", "verl's fused kernels are Triton GPU kernels"),
    (
        r"actor_rollout_ref\.(actor|ref)\.(fsdp_config\.)?strategy",
        "FSDP1 refuses a CPU device; the CPU target uses fsdp2",
    ),
    (r"actor_rollout_ref\.rollout\.name", "the CPU target's rollout is vLLM's CPU build"),
    (r"actor_rollout_ref\.rollout\.(enable_sleep_mode|free_cache_engine)", "vLLM has no sleep mode on CPU"),
    (
        r"actor_rollout_ref\.rollout\.(tensor_model_parallel_size|data_parallel_size|expert_parallel_size)",
        "one CPU rank: no model parallelism",
    ),
    (r".*\.attn_implementation", "flash attention needs CUDA; the CPU target uses sdpa"),
    (
        r"(actor_rollout_ref\.rollout\.)?dtype|.*\.fsdp_config\.(model_)?dtype|.*mixed_precision.*",
        "the CPU target computes in fp32",
    ),
    (r"trainer\.(device|n_gpus_per_node|nnodes)", "the smoke run places one rank on the CPU"),
    (
        r"global_profiler\..*|actor_rollout_ref\.(actor|ref|rollout)\.profiler\..*",
        "the accelerator's profiler settings (the smoke run does not profile)",
    ),
    (r"ray_kwargs\..*|transfer_queue\..*", "the CPU target sizes Ray and TransferQueue for a 2-core machine"),
)
_ACCEL = [(re.compile(rf"^{pattern}$"), why) for pattern, why in ACCELERATOR_ONLY]
#: Environment variables read only by an accelerator stack: kept (they are part of the cell), noted inert.
INERT_ENV = {
    "TASK_QUEUE_ENABLE": "read by torch_npu's dispatcher only",
    "VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE": "read by vLLM-Ascend only",
    "HCCL_CONNECT_TIMEOUT": "read by Ascend's HCCL only",
    "USE_OPTIMIZED_MODEL": "read by vLLM-Ascend only",
}
#: Settings of the smoke run (tiny model, short sequences, one rank).
SMOKE_BASE: dict[str, Any] = {
    "model": "builtin:qwen3-tiny", "data": "builtin:text", "val_data": None,
    "train_batch_size": 4, "ppo_mini_batch_size": 4, "micro_batch_size_per_gpu": 2,
    "log_prob_micro_batch_size_per_gpu": 4, "n": 2, "max_prompt_length": 64, "max_response_length": 32,
    "ppo_max_token_len": None, "log_prob_max_token_len": None, "rollout_tp": 1, "n_gpus_per_node": 1,
    "nnodes": 1, "gpu_memory_utilization": 0.5, "profile_steps": [], "warmup_steps": 0, "timeout_s": 900,
}
#: What a multimodal matrix's smoke run sets on top of :data:`SMOKE_BASE`: the tiny Qwen3-VL and image prompts
#: (the prompt holds the image's tokens: longer prompts), and a longer time limit (a VL cell's start-up took
#: 415-653 s and its first step about 180 s on the 2-core machine at load 30-50: one cell passed 900 s).
SMOKE_VL: dict[str, Any] = {"model": "builtin:qwen3vl-tiny", "data": "builtin:vl", "max_prompt_length": 128,
                            "timeout_s": 1800}


def accelerator_only(override: str) -> str | None:
    """Why ``override`` is left out of a smoke run (``None``: kept; also when the CPU target sets the
    same value itself, e.g. ``actor_rollout_ref.rollout.name=vllm``)."""
    if override.lstrip("+") in {s.value.lstrip("+") for s in target.OVERRIDES}:
        return None
    key = key_of(override)
    for pattern, why in _ACCEL:
        if pattern.match(key):
            return why
    return None


def not_exercised(plan: Plan, matrix: Matrix | None = None) -> dict[str, str]:
    """Factors the plan varies whose mechanism has no effect on the CPU target, with the reason (their
    environment variables and patches still go into the smoke launches). ``matrix`` gives the smoke
    settings' context (a multimodal matrix's smoke run serves the tiny Qwen3-VL)."""
    ctx = smoke_base(matrix)[0].context() if matrix is not None else {"rollout_tp": 1}
    out = {}
    for key in plan.varied:
        why = applicability(key, "verl", "cpu", ctx)
        if why:
            out[key] = why
    return out


def smoke_base(matrix: Matrix, steps: int = 2) -> tuple[Base, list[str]]:
    """The matrix's ``base`` with the smoke settings (:data:`SMOKE_BASE`, ``steps``; :data:`SMOKE_VL` too for a
    multimodal matrix), its accelerator-only overrides removed; returns it and the removed overrides as
    ``"override: why"``."""
    kept, left = [], []
    for o in matrix.base.overrides:
        why = accelerator_only(o)
        if why:
            left.append(f"{o}: {why}")
        else:
            kept.append(o)
    vl = SMOKE_VL if matrix.base.is_multimodal() else {}
    return Base(**{**matrix.base.model_dump(), **SMOKE_BASE, **vl, "steps": steps, "overrides": kept}), left


def cpu_counterparts(levels: dict[str, int | None], platform: str, context: dict[str, Any]) -> tuple[list, list]:
    """The patches of the ``verl:cpu`` mechanism of each factor level that the cell's own (``platform``)
    mechanism lacks, where the factor applies on CPU; returns them and one note per factor."""
    patches, notes = [], []
    if platform == "cpu":
        return patches, notes
    for key, level in levels.items():
        if level is None or applicability(key, "verl", "cpu", context):
            continue
        own = resolve(key, level, "verl", platform).patches
        extra = [p for p in resolve(key, level, "verl", "cpu").patches if p not in own]
        if extra:
            patches += extra
            # one text for every level of the factor (the dry run shows a note common to all cells once)
            opt = REGISTRY[key]
            names = lambda target: sorted({p.split(":")[0] for lv in opt.levels  # noqa: E731
                                           for p in resolve(key, lv, "verl", target).patches})
            mine = f" beside the cell's own {', '.join(names(platform))} ({platform} only)" if names(platform) else ""
            notes.append(f"smoke: {key} runs its CPU counterpart {', '.join(names('cpu'))}{mine}")
    return patches, notes


@dataclass
class SmokeCell:
    """One cell of a smoke run: the CPU launch and what was left out of the cell's own launch."""

    spec: RunSpec
    source_label: str
    left_out: list[str] = field(default_factory=list)
    inert: list[str] = field(default_factory=list)


def smoke_cells(matrix: Matrix, plan: Plan, steps: int = 2) -> list[SmokeCell]:
    """The CPU smoke launch of every run of ``plan`` (a verl matrix's plan on its own platform).

    Raises:
        BenchError: the smoke settings cannot be built (from :meth:`bench.engines.verl.launch.VerlEngine.build`).
    """
    engine = get_engine("verl")  # the registry's instance: this module is what VerlEngine.smoke_cells calls
    out = []
    base, left_user = smoke_base(matrix, steps)
    ctx = base.context()
    vl_note = [f"smoke: multimodal matrix: {base.model} with {base.data} image prompts"] if ctx["multimodal"] else []
    for run in plan.runs:
        levels = dict(run.levels)
        used = launch_levels(levels, set(matrix.factors))  # an optimization the matrix does not list: nothing
        mechs = [resolve(k, v, "verl", plan.platform) for k, v in used.items() if v is not None]
        mech = merge_mechanisms(mechs)
        left = [f"base.overrides: {x}" for x in left_user]
        kept_factor = []
        for o in mech.overrides:
            why = accelerator_only(o)
            if why:
                left.append(f"factor override {o}: {why}")
            else:
                kept_factor.append(o)
        extra, notes = cpu_counterparts(used, plan.platform, ctx)
        mech = mech.model_copy(update={"overrides": tuple(kept_factor), "patches": mech.patches + tuple(extra)})
        launch = engine.build(base, mech, "cpu", used, strict=False)
        launch = launch.model_copy(update={"notes": launch.notes + vl_note + notes})
        inert = [f"{k}={v}: {INERT_ENV[k]} (kept, no effect on CPU)" for k, v in launch.env.items() if k in INERT_ENV]
        spec = RunSpec(cell_id=cell_id_of("verl", "cpu", launch), engine="verl", platform="cpu", levels=levels,
                       cells=run.cells, not_applicable=run.not_applicable, launch=launch, timeout_s=base.timeout_s)
        out.append(SmokeCell(spec=spec, source_label=run.label, left_out=left, inert=inert))
    return out


__all__ = ["ACCELERATOR_ONLY", "SMOKE_VL", "SmokeCell", "accelerator_only", "cpu_counterparts", "smoke_cells"]
