"""A whole embedded run: validate inputs, load the model, run the GRPO steps, write the run folder.

Run folder (``--out``):

- ``run_config.yaml``: the resolved :class:`~.config.RunConfig` (token limits filled), written first;
- ``engine.log``: this module's log;
- ``metrics.jsonl``: one line per step through verl's ``Tracking(default_backend="file")``
  (``$VERL_FILE_LOGGER_PATH`` points at it), i.e. verl's ``{"step": N, "data": {...}}``;
- ``trace/steps_<a>-<b>.json``: chrome traces of the profiled steps (:mod:`.profiling`);
- ``evidence.json``: what was really in effect (versions, device, each factor's mechanism and counts);
- ``failure.json``: written by ``__main__`` when the run fails.

Cheap checks (model path, dataset columns, device, token limits) run before the model is loaded, so bad
input fails within seconds.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench.core.errors import BenchError
from bench.engines.builtins import data as data_mod
from bench.engines.builtins import model as model_mod
from bench.engines.builtins.speed_probe import METRIC as PROBE_METRIC
from bench.engines.builtins.speed_probe import SpeedProbe
from bench.engines.builtins.speed_probe import source as probe_source
from bench.engines.builtins.speed_probe import spec as probe_spec
from bench.measure.flops import MODEL_CONFIG_FILE

from . import checkpoint
from .batching import InfeasibleError
from .config import RunConfig
from .profiling import StepProfiler

log = logging.getLogger("bench.embedded")
PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor")
PROJECT = "bench-embedded"


def setup_logging(out: Path) -> None:
    """Send the engine's log (and Python warnings) to ``out/engine.log``; keep library chatter off stdout."""
    handler = logging.FileHandler(out / "engine.log", mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("bench", "py.warnings", "transformers"):
        lg = logging.getLogger(name)
        lg.addHandler(handler)
        lg.setLevel(logging.INFO if name == "bench" else logging.WARNING)
        lg.propagate = False
    logging.captureWarnings(True)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def write_resolved_config(cfg: RunConfig, out: Path) -> None:
    """``out/run_config.yaml``: every field of ``cfg`` (defaults and derived token limits included)."""
    (out / "run_config.yaml").write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))


def check_device(device: str) -> str:
    """Human name of ``device`` after checking it is present.

    Raises:
        BenchError: ``cuda``/``npu`` requested but not available.
    """
    import torch

    if device == "cuda":
        if not torch.cuda.is_available():
            raise BenchError("device: cuda requested but torch.cuda.is_available() is False on this machine")
        return torch.cuda.get_device_name()
    if device == "npu":
        try:
            import torch_npu  # noqa: F401
        except ImportError:
            raise BenchError("device: npu requested but torch_npu is not installed") from None
        if not torch.npu.is_available():  # type: ignore[attr-defined]
            raise BenchError("device: npu requested but torch.npu.is_available() is False on this machine")
        return torch.npu.get_device_name()  # type: ignore[attr-defined]
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def set_threads(device: str) -> str:
    """Set torch's intra-op threads: ``OMP_NUM_THREADS`` when set, else 1 on CPU; returns where the count came from.

    On a 2-core machine shared with other processes, two intra-op threads stall whenever one core is
    taken (measured here: generation 0.6 s with one thread vs 7-8 s with two under load), while on an
    idle machine the tiny model gains little from a second thread. One thread keeps step times stable.
    """
    import torch

    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.strip().isdigit() and int(env) > 0:
        # set explicitly: a process forked from a warm server keeps the server's import-time count
        torch.set_num_threads(int(env))
        return "OMP_NUM_THREADS"
    if device == "cpu":
        torch.set_num_threads(1)
        return "engine default on cpu (1; set OMP_NUM_THREADS to change)"
    return "torch default"


def batch_schedule(cfg: RunConfig, n_items: int) -> list[list[int]]:
    """Dataset row indices of each step: a seeded permutation, cycled (``steps`` lists of ``train_batch_size``)."""
    import numpy as np

    perm = np.random.default_rng(cfg.seed).permutation(n_items).tolist()
    b = cfg.train_batch_size
    return [[perm[(k * b + j) % n_items] for j in range(b)] for k in range(cfg.steps)]


def check_lengths(cfg: RunConfig, prompt_lens: dict[int, int]) -> int:
    """Check prompts against ``max_prompt_length`` and the longest possible sequence against the token limits.

    The longest sequence a run can produce is its longest prompt plus ``max_response_length`` (a
    response may run to the limit). Returns that length.

    Raises:
        BenchError: a prompt longer than ``max_prompt_length`` (verl's default ``truncation: error``).
        InfeasibleError: with dynamic bsz, a token limit below the longest sequence.
    """
    idx, longest_prompt = max(prompt_lens.items(), key=lambda kv: kv[1])
    if longest_prompt > cfg.max_prompt_length:
        raise BenchError(
            f"data: prompt of row {idx} has {longest_prompt} tokens, above max_prompt_length={cfg.max_prompt_length}"
        )
    longest = longest_prompt + cfg.max_response_length
    if cfg.use_dynamic_bsz:
        for key in ("ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu"):
            limit = getattr(cfg, key)
            if limit < longest:
                raise InfeasibleError(
                    f"{key}={limit} is below the longest sequence of {longest} tokens "
                    f"(longest prompt {longest_prompt} + max_response_length {cfg.max_response_length})"
                )
    return longest


def phase_breakdown(timings: list[dict[str, float]], warmup_steps: int) -> tuple[list[int], dict[str, float]]:
    """Mean seconds per phase and per step over the measured steps (all steps if none is past warm-up)."""
    steps = list(range(warmup_steps + 1, len(timings) + 1)) or list(range(1, len(timings) + 1))
    keys = [k for k in (*PHASES, "step") if any(k in timings[s - 1] for s in steps)]
    return steps, {k: sum(timings[s - 1].get(k, 0.0) for s in steps) / len(steps) for k in keys}


def format_breakdown(steps: list[int], mean: dict[str, float], wall_s: float, profiled: list[int] = ()) -> str:
    """The table printed at the end of a run: phase, mean seconds, share of the step."""
    span = f"steps {steps[0]}-{steps[-1]}" if len(steps) > 1 else f"step {steps[0]}"
    under = [s for s in steps if s in profiled]
    note = f"; under the profiler: {', '.join(map(str, under))}" if under else ""
    lines = [f"phase breakdown (mean over {span}{note}):"]
    step = mean.get("step", 0.0) or 1e-12
    for k, v in mean.items():
        if k != "step":
            lines.append(f"  {k:<14}{v:8.3f} s  {100 * v / step:5.1f} %")
    other = step - sum(v for k, v in mean.items() if k != "step")
    lines.append(f"  {'(other)':<14}{other:8.3f} s  {100 * other / step:5.1f} %")
    lines.append(f"  {'step':<14}{step:8.3f} s  100.0 %")
    lines.append(f"process wall so far {wall_s:.1f} s")
    return "\n".join(lines)


def run(cfg: RunConfig, out: Path, t_start: float | None = None) -> dict[str, Any]:
    """Execute the run described by ``cfg`` into ``out`` (which must exist). Returns the evidence dict.

    Raises:
        BenchError: bad input (missing model path, dataset column, device, overlong prompt).
        InfeasibleError: a token limit below the longest sequence.
        torch.OutOfMemoryError / MemoryError / RuntimeError: from the steps (classified by ``__main__``).
    """
    t_start = t_start if t_start is not None else time.perf_counter()
    cache = model_mod.default_cache_dir()
    log.info("run config: %s", json.dumps(cfg.model_dump()))
    model_path, needs_build = model_mod.resolve_model_path(cfg.model, cache)
    items = data_mod.load_prompts(data_mod.resolve_data_path(cfg.data, cache))
    schedule = batch_schedule(cfg, len(items))
    profile_steps = [s for s in cfg.profile_steps if 1 <= s <= cfg.steps]
    if set(profile_steps) != set(cfg.profile_steps):
        log.warning("profile_steps %s outside 1..%d are not profiled", cfg.profile_steps, cfg.steps)

    import torch

    device_name = check_device(cfg.device)
    threads_source = set_threads(cfg.device)
    t0 = time.perf_counter()
    build_s = model_mod.ensure_builtin(model_path, cache) if needs_build else 0.0
    model, processor = checkpoint.load(model_path, cfg.device)
    ids = checkpoint.token_ids(model, processor)
    # the model's config, for the harness's FLOPs count (verl's counter; bench.measure.flops)
    (out / MODEL_CONFIG_FILE).write_text(model.config.to_json_string())
    used = sorted({i for rows in schedule for i in rows})
    encoded = {i: data_mod.encode_prompt(processor, items[i]) for i in used}
    longest = check_lengths(cfg, {i: int(e.input_ids.shape[0]) for i, e in encoded.items()})
    log.info(
        "model %s loaded in %.2f s (built in %.1f s); longest possible sequence %d",
        model_path.name,
        time.perf_counter() - t0,
        build_s,
        longest,
    )

    from . import fused  # deferred: bench.engines.embedded.fused loads torch
    from .step import make_trainer  # deferred: bench.engines.embedded.step loads torch

    torch.manual_seed(cfg.seed)
    ref = copy.deepcopy(model).eval().requires_grad_(False) if cfg.use_kl_loss else None
    if cfg.rmsnorm_fused:
        rms = fused.install_fused_rmsnorm(model, cfg.device)
        if ref is not None:
            fused.install_fused_rmsnorm(ref, cfg.device)
    else:
        rms = fused.describe_eager(model)
    trainer = make_trainer(cfg, model, ref, processor, ids, cfg.device)

    os.environ["VERL_FILE_LOGGER_PATH"] = str(out / "metrics.jsonl")
    from verl.utils.tracking import Tracking

    tracking = Tracking(project_name=PROJECT, experiment_name=out.name, default_backend="file")
    probe = SpeedProbe() if cfg.speed_probe else None
    t_steps = time.perf_counter()
    log.info("start-up done in %.2f s", t_steps - t_start)
    timings, passes, prof = _run_steps(trainer, schedule, items, encoded, profile_steps, probe, tracking,
                                       out / "trace", cfg.device)
    tracking.finish()
    t_end = time.perf_counter()

    evidence = _evidence(cfg, device_name=device_name, threads_source=threads_source, model_path=model_path,
                         model=model, build_s=build_s, items=items, rms=rms, passes=passes, longest=longest,
                         ref_pass=ref is not None, probe=probe, prof=prof, profile_steps=profile_steps,
                         wall_s={"startup": round(t_steps - t_start, 3), "steps": round(t_end - t_steps, 3)})
    (out / "evidence.json").write_text(json.dumps(evidence, indent=1))
    steps, mean = phase_breakdown(timings, cfg.warmup_steps)
    text = format_breakdown(steps, mean, time.perf_counter() - t_start, profile_steps)
    log.info("%s", text)
    print(text, flush=True)
    sys.stdout.flush()
    return evidence


def _run_steps(trainer: Any, schedule: list[list[int]], items: list[Any], encoded: dict[int, Any],
               profile_steps: list[int], probe: SpeedProbe | None, tracking: Any, trace_dir: Path, device: str
               ) -> tuple[list[dict[str, float]], dict[str, dict[str, list[int]]], StepProfiler]:
    """The GRPO steps of the run, one per row list of ``schedule`` (indexes into ``items``/``encoded``), under the
    step profiler (traces into ``trace_dir`` for ``profile_steps``), each step's metrics logged through verl's
    ``tracking`` (file backend). Returns (each step's phase timings in s, the per-pass counts the steps reported
    as ``perf/<pass>/<what>``, the finished profiler)."""
    from .step import run_step  # deferred: bench.engines.embedded.step loads torch

    timings: list[dict[str, float]] = []
    passes: dict[str, dict[str, list[int]]] = {}
    with StepProfiler(profile_steps, trace_dir, device) as prof:
        after: float | None = None  # probe taken right after the previous step
        for step, rows in enumerate(schedule, start=1):
            # the probe brackets each unprofiled step (its mean before/after is the machine's speed
            # during the step); never inside a profiled step's window, outside timing_s/step
            probed = probe is not None and step not in profile_steps
            before = (after if after is not None else probe.measure()) if probed else None
            metrics, timing = run_step(trainer, [items[i] for i in rows], [encoded[i] for i in rows])
            after = probe.measure() if probed else None
            if probed:
                metrics[PROBE_METRIC] = (before + after) / 2
            metrics["training/global_step"] = step
            tracking.log(data=metrics, step=step)
            timings.append(timing)
            for k, v in metrics.items():
                if k.startswith("perf/") and k.count("/") == 2:
                    _, p, what = k.split("/")
                    passes.setdefault(p, {}).setdefault(what, []).append(int(v))
            log.info("step %d: %s", step, " ".join(f"{k}={v:.3f}" for k, v in timing.items()))
            prof.step()
    return timings, passes, prof


def _evidence(cfg: RunConfig, *, device_name: str, threads_source: str, model_path: Path, model: Any, build_s: float,
              items: list[Any], rms: dict[str, Any], passes: dict[str, dict[str, list[int]]], longest: int,
              ref_pass: bool, probe: SpeedProbe | None, prof: StepProfiler, profile_steps: list[int],
              wall_s: dict[str, float]) -> dict[str, Any]:
    """The run's ``evidence.json``: versions, model, data, what each optimization's mechanism did in this process
    (fused RMSNorm installed, micro-batches and tokens per pass, the task-queue variable), the speed probe, the
    profiler's files and the wall time split (s) into start-up and steps."""
    import torch
    import transformers
    import verl

    from . import fused  # deferred: bench.engines.embedded.fused loads torch

    return {
        "engine": "embedded",
        "device": cfg.device,
        "device_name": device_name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "verl": verl.__version__,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "torch_threads_source": threads_source,
        "model": {
            "spec": cfg.model,
            "folder": model_path.name,
            "class": type(model).__name__,
            "parameters": sum(p.numel() for p in model.parameters()),
            "built_s": round(build_s, 2),
        },
        "data": {"spec": cfg.data, "rows": len(items), "multimodal": any(it.images for it in items)},
        "rmsnorm_fused": {
            **rms,
            "installed_forward": sorted({fused.installed_forward(m) for _, m in fused.text_rmsnorm_modules(model)}),
        },
        "dynamic_bsz": {
            "enabled": cfg.use_dynamic_bsz,
            "ppo_max_token_len_per_gpu": cfg.ppo_max_token_len_per_gpu if cfg.use_dynamic_bsz else None,
            "log_prob_max_token_len_per_gpu": cfg.log_prob_max_token_len_per_gpu if cfg.use_dynamic_bsz else None,
            "micro_batch_size_per_gpu": None if cfg.use_dynamic_bsz else cfg.micro_batch_size_per_gpu,
            "log_prob_micro_batch_size_per_gpu": None if cfg.use_dynamic_bsz else cfg.log_prob_micro_batch_size_per_gpu,
            "micro_batches": {p: v.get("num_micro_batches", []) for p, v in passes.items()},
            "padded_tokens": {p: v.get("padded_tokens", []) for p, v in passes.items()},
            "real_tokens": {p: v.get("real_tokens", []) for p, v in passes.items()},
            "longest_possible_sequence": longest,
        },
        "kl_loss": {"enabled": cfg.use_kl_loss, "ref_pass": ref_pass, "type": cfg.kl_loss_type},
        "update_delay_s": {"enabled": cfg.update_delay_s > 0, "seconds": cfg.update_delay_s, "phase": "update_actor"},
        "speed_probe": {
            "enabled": probe is not None,
            "spec": probe_spec() if probe is not None else None,
            "source": probe_source() if probe is not None else None,
            "metric": PROBE_METRIC,
            "placement": "before and after each unprofiled step; logged value = mean",
        },
        "task_queue": {
            "TASK_QUEUE_ENABLE": os.environ.get("TASK_QUEUE_ENABLE"),
            "read_by": "torch_npu" if cfg.device == "npu" else None,
        },
        "profiler": {
            "steps": profile_steps,
            "files": prof.files,
            "activities": prof.activities(),
            "step_label": "ProfilerStep#N = GRPO step N",
        },
        "wall_s": wall_s,
    }
