"""The Hydra overrides of a verl launch: the run settings of the matrix ``base`` block
(:func:`base_overrides`), the profiler (:func:`profiler_overrides`), built-in model and data paths of the
``verl:cpu`` target, ``${VAR}`` expansion of user values (:func:`expand_value`), and reading overrides back
from an argv (:func:`overrides_of`, :func:`fill_run_dir`). The order of the whole argv is in
:mod:`bench.engines.verl.launch`.
"""

from __future__ import annotations

import re
from typing import Any

from bench.core.errors import BenchError, did_you_mean
from bench.engines.builtins import data as data_mod
from bench.engines.common import default_profile_steps
from bench.engines.verl.config import hydra_value
from bench.engines.verl_cpu import assets
from bench.spec.launch import fill_placeholders
from bench.spec.loading import expand_env
from bench.spec.matrix import Base

ENTRY_MODULE = "verl.trainer.main_ppo"
#: Metrics JSONL written by verl's file logger (``trainer.logger`` includes ``file``).
METRICS_FILE = "metrics.jsonl"
#: Where the profiler writes, inside the run folder.
PROFILE_DIR = "profile"
#: NPU profiler role settings (verl ``tool_config.npu``): what the Ascend step_trace_time.csv needs.
NPU_PROFILER = {"discrete": False, "contents": ["npu", "cpu"], "level": "level1", "analysis": True}
DEVICES = {"npu": "npu", "cuda": "cuda", "cpu": "cpu"}
UNSET_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-[^}]*)?\}")
RUN_DIR_PLACEHOLDER = "{run_dir}"
#: Hydra/OmegaConf's "missing value" literal, shown in a dry run for an unset model or data path.
MISSING = "???"


def _hv(value: Any) -> str:
    """A value for a Hydra override (:mod:`bench.engines.verl.config` imports Hydra only inside its functions)."""
    return hydra_value(value)


def _path_value(raw: str) -> str:
    """A path for an override: a Hydra list ``[a,b]`` passes as written, else quoted when needed."""
    raw = raw.strip()
    if raw == MISSING or (raw.startswith("[") and raw.endswith("]")):
        return raw
    if UNSET_RE.search(raw):  # dry run with an unset variable: show it as written
        return raw
    return _hv(raw)


def expand_value(value: str, key: str, strict: bool, notes: list[str]) -> str:
    """``${VAR}`` from the environment; unset: error (strict) or left visible with a note."""
    out = expand_env(value, file="base", key=key, strict=False)
    for name in dict.fromkeys(m.group(1) for m in UNSET_RE.finditer(out)):
        if strict:
            raise BenchError(f"base.{key}: environment variable {name} is not set (export {name}=...)")
        notes.append(f"base.{key}: ${{{name}}} is not set here; left as written (a real run stops on it)")
    return out


def key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def builtin_model_path(spec: str | None, platform: str) -> str | None:
    """``{bench_cache}/models/<name>-<hash>`` for ``builtin:qwen3-tiny`` (or no model) or ``builtin:qwen3vl-tiny``
    on ``cpu``; ``None`` for a real path. The placeholder is filled at launch, so the cell id does not name
    this machine.

    Raises:
        BenchError: a ``builtin:`` model on an accelerator platform, or an unknown builtin name.
    """
    if spec is None and platform == "cpu":
        spec = assets.BUILTIN_MODEL
    if spec is None or not spec.startswith("builtin:"):
        return None
    relpath = assets.model_relpath(spec)
    if platform != "cpu":
        raise BenchError(f"base.model: {spec} is the tiny CPU model; on {platform} give a checkpoint path")
    return "{bench_cache}/" + relpath


def builtin_data_path(spec: str | None, platform: str, default: str | None = "builtin:text") -> str | None:
    """``{bench_cache}/data/<set>-<hash>.parquet`` for a ``builtin:`` data set (or none) on ``cpu``; else ``None``.

    Raises:
        BenchError: a ``builtin:`` data set on an accelerator platform, or an unknown builtin name.
    """
    if spec is None and platform == "cpu":
        spec = default
    if spec is None or not spec.startswith("builtin:"):
        return None
    if spec not in data_mod.BUILTINS:
        raise BenchError(f"base.data: unknown builtin data set {spec!r}{did_you_mean(spec, data_mod.BUILTINS)} "
                         f"(allowed: {', '.join(data_mod.BUILTINS)})")
    if platform != "cpu":
        raise BenchError(f"base.data: {spec} is generated for CPU smoke runs; on {platform} give a parquet path")
    return "{bench_cache}/" + data_mod.builtin_relpath(spec)


def base_overrides(base: Base, platform: str, model: str, train: str, val: str) -> list[str]:
    """The run settings of ``base`` as verl overrides (paths already expanded)."""
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={_path_value(train)}",
        f"data.val_files={_path_value(val)}",
        f"data.train_batch_size={base.train_batch_size}",
        f"data.max_prompt_length={base.max_prompt_length}",
        f"data.max_response_length={base.max_response_length}",
        f"data.seed={base.seed}",
        f"actor_rollout_ref.model.path={_path_value(model)}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={base.ppo_mini_batch_size}",
        f"actor_rollout_ref.actor.use_kl_loss={_hv(base.use_kl_loss)}",
        f"actor_rollout_ref.rollout.n={base.n}",
        f"actor_rollout_ref.rollout.temperature={_hv(base.temperature)}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={base.rollout_tp}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={_hv(base.gpu_memory_utilization)}",
        "algorithm.use_kl_in_reward=false",
        f"trainer.device={DEVICES[platform]}",
        f"trainer.n_gpus_per_node={base.n_gpus_per_node}",
        f"trainer.nnodes={base.nnodes}",
        f"trainer.total_training_steps={base.steps}",
        "trainer.val_before_train=false",
        "trainer.logger=[console,file]",
    ]


def profiler_overrides(base: Base, platform: str) -> list[str]:
    """``global_profiler`` + actor/ref role profilers, and on ``cpu`` the rollout's (empty when
    ``base.profile_steps`` is ``[]``).

    The rollout role (:func:`rollout_profiler_overrides`) profiles vLLM's engine for the generation of each
    profiled step: its trace lies beside the training roles' in the profile folder, read as phase ``rollout``.
    """
    steps = default_profile_steps(base)
    if not steps:
        return []
    out = [
        f"global_profiler.tool={'npu' if platform == 'npu' else 'torch'}",
        f"global_profiler.steps={_hv(steps)}",
        f"global_profiler.save_path='{RUN_DIR_PLACEHOLDER}/{PROFILE_DIR}'",
    ]
    for role in ("actor", "ref"):
        prefix = f"actor_rollout_ref.{role}.profiler"
        out += [f"{prefix}.enable=true", f"{prefix}.all_ranks=true"]
        if platform == "npu":
            out += [f"{prefix}.tool_config.npu.{k}={_hv(v)}" for k, v in NPU_PROFILER.items()]
        elif platform == "cpu":
            out.append(f"{prefix}.tool_config.torch.contents=[cpu]")
    return out + rollout_profiler_overrides(platform)


def rollout_profiler_overrides(platform: str) -> list[str]:
    """The rollout role's torch profiler, on ``cpu`` only (the verl 0.9.x CPU stack).

    verl drives vLLM's own torch profiler around the generation of a profiled step only in ``discrete`` mode
    (``vLLMHttpServer._should_profile``): each replica writes
    ``<save_path>/agent_loop_rollout_replica_<r>/<instance>-rank-<tp>.<time stamp>.pt.trace.json.gz`` (vLLM's CPU
    worker records CPU activity only, hence ``contents=[cpu]``), and ``relocate_results`` moves it up into the profile
    folder as ``rollout-replica<r>_<name>`` (verl's flat layout; a file flushed late stays in the sub-folder,
    which the trace search walks too). The file names no step: :func:`bench.measure.torch_reader.trace_steps`
    pairs the rollout traces with the profiled steps in order.

    Not on ``cuda``: its launches must also compose against verl 0.6.1, whose rollout profiler has neither
    ``tool_config.torch`` nor ``relocate_results`` (nor a vLLM server that drives the engine profiler); not on
    ``npu`` (vllm-ascend's profiler is configured apart).
    """
    if platform != "cpu":
        return []
    prefix = "actor_rollout_ref.rollout.profiler"
    return [f"{prefix}.enable=true", f"{prefix}.all_ranks=true", f"{prefix}.relocate_results=true",
            f"{prefix}.tool_config.torch.discrete=true", f"{prefix}.tool_config.torch.contents=[cpu]"]


def overrides_of(argv: list[str]) -> list[str]:
    """The overrides of verl's config in a verl launch argv (everything after ``-m verl.trainer.main_ppo``
    except Hydra's own ``hydra.*`` settings, which verl's config does not hold)."""
    try:
        i = argv.index(ENTRY_MODULE)
    except ValueError:
        return []
    return [o for o in argv[i + 1:] if not key_of(o).startswith("hydra.")]


def fill_run_dir(overrides: list[str], run_dir: str = "/tmp/bench-run") -> list[str]:
    """Overrides with ``{run_dir}`` and the machine placeholders replaced (to check them before the run
    folder exists)."""
    return [fill_placeholders(o.replace(RUN_DIR_PLACEHOLDER, run_dir)) for o in overrides]
