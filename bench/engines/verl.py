"""The verl engine: a matrix cell -> ``python -m verl.trainer.main_ppo`` with Hydra overrides.

The argv (a list, never a shell string) is ``["{python}", "-m", "verl.trainer.main_ppo", *overrides]``,
the overrides in this order:

1. the run settings of the matrix ``base`` block (:func:`base_overrides`): GRPO, data files, lengths,
   batch sizes, ``n``, rollout TP and memory, devices, ``trainer.total_training_steps``,
   ``trainer.logger=[console,file]`` (the file logger writes ``$VERL_FILE_LOGGER_PATH``, set to
   ``{run_dir}/metrics.jsonl``);
2. the profiler (:func:`profiler_overrides`): ``global_profiler`` (tool ``npu`` on Ascend, ``torch`` on
   CUDA; steps; ``save_path={run_dir}/profile``) and the actor and ref role profilers on all ranks (on
   NPU with ``contents=[npu,cpu]``, ``level1``, online ``analysis``);
3. the factor mechanisms of :mod:`bench.spec.optimizations` (``{placeholders}`` filled from
   :meth:`bench.spec.matrix.Base.context`, e.g. ``2*(P+R)`` / ``4*(P+R)`` token limits);
4. ``base.overrides``, last, so a matrix can override anything.

The environment is ``base.env`` + the mechanisms' variables (those win: they are the ablation) +
``VERL_FILE_LOGGER_PATH``; the patches are the mechanisms' plus ``verl_file_logger`` (verl 0.6.x's file
logger made numpy-safe and flushed per step), all delivered by ``patches/sitecustomize.py``.
``${VAR}`` in ``base.model`` / ``base.data`` / ``base.val_data`` / ``base.overrides`` / ``base.env`` is
taken from the environment: a real run (``strict``) stops on an unset one, naming the matrix key; a dry
run leaves it visible and says so in the launch notes.

Nothing here imports verl, torch or Hydra: planning and ``--dry-run`` work on any machine.
:meth:`VerlEngine.preflight` (before a real sweep) checks the machine: verl importable, devices visible,
model and data paths present, every override accepted by the installed verl's Hydra config.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.engines import register
from bench.engines.base import Launch
from bench.engines.common import default_profile_steps
from bench.errors import BenchError
from bench.metadata import cann_version, installed_version  # noqa: F401  (cann_version re-exported)
from bench.spec.loading import expand_env
from bench.spec.matrix import Base, Matrix
from bench.spec.optimizations import Mechanism, resolve

ENTRY_MODULE = "verl.trainer.main_ppo"
#: Metrics JSONL written by verl's file logger (``trainer.logger`` includes ``file``).
METRICS_FILE = "metrics.jsonl"
#: Where the profiler writes, inside the run folder.
PROFILE_DIR = "profile"
#: NPU profiler role settings (verl ``tool_config.npu``): what the Ascend step_trace_time.csv needs.
NPU_PROFILER = {"discrete": False, "contents": ["npu", "cpu"], "level": "level1", "analysis": True}
#: Patches every verl launch gets (measurement plumbing, not factors): see patches/bench_patches/verl_file_logger.py.
ENGINE_PATCHES = ("verl_file_logger", "verl_evidence")
#: Hydra's output folder inside the run folder: ``.hydra/config.yaml`` there is the config verl composed.
HYDRA_DIR = "hydra"
#: The reward function of the verl:cpu target, relative to the repository root.
REWARD_FILE = "bench/engines/verl_cpu/reward.py"
#: First vllm-ascend release with ``VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE`` (tags v0.10.0rc1 on; absent in v0.9.x).
MC2_MIN_VLLM_ASCEND = "0.10.0"
_DEVICE = {"npu": "npu", "cuda": "cuda", "cpu": "cpu"}
_UNSET_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-[^}]*)?\}")
_PLACEHOLDER = "{run_dir}"
#: Hydra/OmegaConf's "missing value" literal, shown in a dry run for an unset model or data path.
MISSING = "???"


def _hv(value: Any) -> str:
    """A value for a Hydra override (lazy import keeps planning free of Hydra)."""
    from bench.verl_config import hydra_value

    return hydra_value(value)


def _path_value(raw: str) -> str:
    """A path for an override: a Hydra list ``[a,b]`` passes as written, else quoted when needed."""
    raw = raw.strip()
    if raw == MISSING or (raw.startswith("[") and raw.endswith("]")):
        return raw
    if _UNSET_RE.search(raw):  # dry run with an unset variable: show it as written
        return raw
    return _hv(raw)


def _expand(value: str, key: str, strict: bool, notes: list[str]) -> str:
    """``${VAR}`` from the environment; unset: error (strict) or left visible with a note."""
    out = expand_env(value, file="base", key=key, strict=False)
    for name in dict.fromkeys(m.group(1) for m in _UNSET_RE.finditer(out)):
        if strict:
            raise BenchError(f"base.{key}: environment variable {name} is not set (export {name}=...)")
        notes.append(f"base.{key}: ${{{name}}} is not set here; left as written (a real run stops on it)")
    return out


def _key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def builtin_model_path(spec: str | None, platform: str) -> str | None:
    """``{bench_cache}/models/qwen3-tiny-<hash>`` for ``builtin:qwen3-tiny`` (or no model) on ``cpu``; ``None``
    for a real path. The placeholder is filled at launch, so the cell id does not name this machine.

    Raises:
        BenchError: a ``builtin:`` model on an accelerator platform, or an unknown builtin name.
    """
    from bench.engines.verl_cpu import assets

    if spec is None and platform == "cpu":
        spec = assets.BUILTIN_MODEL
    if spec is None or not spec.startswith("builtin:"):
        return None
    if spec != assets.BUILTIN_MODEL:
        raise BenchError(f"base.model: unknown builtin model {spec!r} for engine verl (allowed: {assets.BUILTIN_MODEL})")
    if platform != "cpu":
        raise BenchError(f"base.model: {spec} is the tiny CPU model; on {platform} give a checkpoint path")
    return "{bench_cache}/" + assets.model_dir(Path("")).as_posix()


def builtin_data_path(spec: str | None, platform: str, default: str | None = "builtin:text") -> str | None:
    """``{bench_cache}/data/<set>-<hash>.parquet`` for a ``builtin:`` data set (or none) on ``cpu``; else ``None``.

    Raises:
        BenchError: a ``builtin:`` data set on an accelerator platform, or an unknown builtin name.
    """
    from bench.engines.embedded import data as data_mod

    if spec is None and platform == "cpu":
        spec = default
    if spec is None or not spec.startswith("builtin:"):
        return None
    if spec not in data_mod.BUILTINS:
        raise BenchError(f"base.data: unknown builtin data set {spec!r} (allowed: {', '.join(data_mod.BUILTINS)})")
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
        f"trainer.device={_DEVICE[platform]}",
        f"trainer.n_gpus_per_node={base.n_gpus_per_node}",
        f"trainer.nnodes={base.nnodes}",
        f"trainer.total_training_steps={base.steps}",
        "trainer.val_before_train=false",
        "trainer.logger=[console,file]",
    ]


def profiler_overrides(base: Base, platform: str) -> list[str]:
    """``global_profiler`` + actor/ref role profilers (empty when ``base.profile_steps`` is ``[]``)."""
    steps = default_profile_steps(base)
    if not steps:
        return []
    out = [
        f"global_profiler.tool={'npu' if platform == 'npu' else 'torch'}",
        f"global_profiler.steps={_hv(steps)}",
        f"global_profiler.save_path='{_PLACEHOLDER}/{PROFILE_DIR}'",
    ]
    for role in ("actor", "ref"):
        prefix = f"actor_rollout_ref.{role}.profiler"
        out += [f"{prefix}.enable=true", f"{prefix}.all_ranks=true"]
        if platform == "npu":
            out += [f"{prefix}.tool_config.npu.{k}={_hv(v)}" for k, v in NPU_PROFILER.items()]
        elif platform == "cpu":
            out.append(f"{prefix}.tool_config.torch.contents=[cpu]")
    return out


def overrides_of(argv: list[str]) -> list[str]:
    """The overrides of verl's config in a verl launch argv (everything after ``-m verl.trainer.main_ppo``
    except Hydra's own ``hydra.*`` settings, which verl's config does not hold)."""
    try:
        i = argv.index(ENTRY_MODULE)
    except ValueError:
        return []
    return [o for o in argv[i + 1:] if not _key_of(o).startswith("hydra.")]


def fill_run_dir(overrides: list[str], run_dir: str = "/tmp/bench-run") -> list[str]:
    """Overrides with ``{run_dir}`` and the machine placeholders replaced (to check them before the run
    folder exists)."""
    from bench.executors import fill_placeholders

    return [fill_placeholders(o.replace(_PLACEHOLDER, run_dir)) for o in overrides]


def _ensure_cpu_assets(launches: list[Launch]) -> None:
    """Build the tiny model and the data set the ``verl:cpu`` launches name (once; cached)."""
    from bench.engines.embedded import data as data_mod
    from bench.engines.embedded.model import default_cache_dir
    from bench.engines.verl_cpu import assets

    cache = default_cache_dir()
    paths = [p for launch in launches for p in (launch.config.get("paths") or {}).values()]
    if any("{bench_cache}/models/" in p for p in paths):
        assets.ensure_model(cache)
    for name in data_mod.BUILTINS:
        if any(("{bench_cache}/" + data_mod.builtin_relpath(name)) in p for p in paths):
            data_mod.builtin_path(name, cache)


def _fsdp_strategy(overrides: list[str]) -> str:
    strategy = "fsdp"  # verl's default for actor and ref (0.6.x - 0.9.x)
    for o in overrides:
        key, _, value = o.partition("=")
        if re.fullmatch(r"\+*actor_rollout_ref\.(actor|ref)\.(fsdp_config\.)?strategy", key):
            strategy = value.strip().strip("'\"")
    return strategy


def forward_prefetch_note(overrides: list[str], verl_version: str | None = None) -> str | None:
    """Why ``forward_prefetch`` would do nothing with this verl and these overrides, or ``None``."""
    from bench.verl_config import (
        VerlConfigError,
        fsdp2_honours_forward_prefetch,
        installed_verl_version,
        read_release_file,
    )

    if _fsdp_strategy(overrides) != "fsdp2":
        return None
    try:
        source = read_release_file("utils/fsdp_utils.py", verl_version)
        label = verl_version or installed_verl_version()
    except VerlConfigError:
        return ("forward_prefetch: strategy fsdp2, and verl is not installed here to check whether its FSDP2 "
                "wrapper honours fsdp_config.forward_prefetch (verl releases before PR 6317 ignore it)")
    honoured = fsdp2_honours_forward_prefetch(source)
    if honoured is False:
        return (f"forward_prefetch: verl {label} with strategy fsdp2 ignores fsdp_config.forward_prefetch "
                "(apply_fsdp2 never reads it; honoured from verl PR 6317 on, or with strategy fsdp): "
                "this factor has no effect in these runs")
    if honoured is None:
        return f"forward_prefetch: cannot tell whether verl {label}'s FSDP2 wrapper honours forward_prefetch"
    return None


def mc2_note() -> str | None:
    """Why ``VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE`` would be ignored by the installed vllm-ascend, or ``None``."""
    from bench.verl_config import version_at_least

    v = installed_version("vllm_ascend", "vllm-ascend")
    if v is not None and not version_at_least(v, MC2_MIN_VLLM_ASCEND):
        return (f"mc2: vllm-ascend {v} has no VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE (added in v0.10.0rc1; "
                f"the article used 0.11.0): this factor has no effect here")
    return None


@register
class VerlEngine:
    """Builds ``verl.trainer.main_ppo`` launches; checks the machine before a real sweep.

    Args:
        verl_version: the verl release whose behaviour notes refer to (FSDP2 forward prefetch);
            ``None`` = the installed verl.
    """

    name = "verl"
    options_key = None
    shows_config = False
    forkserver_platforms = ()
    supports_smoke = True
    has_speed_probe = False

    def __init__(self, verl_version: str | None = None) -> None:
        self.verl_version = verl_version

    def build(
        self, base: Base, mechanism: Mechanism, platform: str, levels: dict[str, int | None], *, strict: bool
    ) -> Launch:
        """The launch of one cell (see the module docstring for the order of the overrides).

        Raises:
            BenchError: platform ``cpu`` (verl's rollout needs an NPU or GPU), no ``base.model`` /
                ``base.data``, or (``strict``) an unset ``${VAR}`` (the message names the matrix key).
        """
        if platform not in _DEVICE:
            raise BenchError(f"platform: engine verl runs on npu, cuda or cpu, not {platform!r}")
        notes: list[str] = []
        cpu = platform == "cpu"
        for key, what in (("model", "a model path (e.g. ${QWEN3VL_MODEL_PATH})"),
                          ("data", "a train parquet (e.g. ${QWEN3VL_TRAIN_FILES})")):
            if not getattr(base, key) and not cpu:
                if strict:
                    raise BenchError(f"base.{key}: engine verl needs {what}")
                notes.append(f"base.{key} is not set: engine verl needs {what}; shown as ??? (a real run stops here)")
        model = builtin_model_path(base.model, platform) or (
            _expand(base.model, "model", strict, notes) if base.model else MISSING)
        train = builtin_data_path(base.data, platform) or (
            _expand(base.data, "data", strict, notes) if base.data else MISSING)
        val = builtin_data_path(base.val_data, platform, default=None) or (
            (_expand(base.val_data, "val_data", strict, notes) if base.val_data else "") or train)

        ctx = base.context()
        factor_overrides = [o.format(**ctx) for o in mechanism.overrides]
        user_overrides = [_expand(o, f"overrides[{i}]", strict, notes) for i, o in enumerate(base.overrides)]
        target_overrides: list[str] = []
        env: dict[str, str] = {}
        target_patches: tuple[str, ...] = ()
        if cpu:
            from bench.engines.verl_cpu import target

            target_overrides = target.overrides(base.n_gpus_per_node, f"'{{repo}}/{REWARD_FILE}'")
            env.update(target.env())
            target_patches = target.PATCHES
        overrides = [
            *base_overrides(base, platform, model, train, val),
            *profiler_overrides(base, platform),
            *target_overrides,
            *factor_overrides,
            *user_overrides,
            f"hydra.run.dir='{_PLACEHOLDER}/{HYDRA_DIR}'",
        ]

        env.update({k: _expand(v, f"env.{k}", strict, notes) for k, v in base.env.items()})
        for k, v in mechanism.env.items():
            if k in env and env[k] != v:
                notes.append(f"base.env.{k}={env[k]} is replaced by the factor's {k}={v}")
            env[k] = v
        env["VERL_FILE_LOGGER_PATH"] = f"{_PLACEHOLDER}/{METRICS_FILE}"

        notes += self._factor_notes(base, platform, levels, user_overrides, overrides)
        patches = list(dict.fromkeys([*target_patches, *mechanism.patches, *ENGINE_PATCHES]))
        config = {
            "engine": "verl",
            "entry": ENTRY_MODULE,
            "platform": platform,
            "overrides": overrides,
            "env": env,
            "patches": patches,
            "paths": {"base.model": model, "base.data": train, "base.val_data": val},
        }
        python = "{verl_python}" if cpu else "{python}"
        return Launch(
            argv=[python, "-m", ENTRY_MODULE, *overrides],
            env=env,
            patches=patches,
            config=config,
            notes=notes,
        )

    def _factor_notes(self, base: Base, platform: str, levels: dict[str, int | None], user_overrides: list[str],
                      overrides: list[str]) -> list[str]:
        notes = []
        user_keys = {_key_of(o): o for o in user_overrides}
        for key, level in levels.items():
            if level is None:
                continue
            try:
                mech = resolve(key, level, "verl", platform)
            except KeyError:
                continue
            for o in mech.overrides:
                k = _key_of(o)
                if k in user_keys:
                    notes.append(f"base.overrides sets {k} after factor {key} ({user_keys[k]}): the factor's value "
                                 "is overridden in every cell")
        if levels.get("forward_prefetch") is not None:
            note = forward_prefetch_note(overrides, self.verl_version)
            if note:
                notes.append(note)
        if levels.get("mc2") is not None:
            note = mc2_note()
            if note:
                notes.append(note)
        return notes

    # ------------------------------------------------------------------------------------- preflight

    def preflight(self, matrix: Matrix, launches: list[Launch], platform: str) -> None:
        """verl importable, devices visible, model and data paths present, overrides valid for this verl.

        Raises:
            BenchError: one line naming what is missing or refused.
        """
        from bench.executors import fill_placeholders

        where = matrix.source or matrix.name
        python = sys.executable
        if platform == "cpu":
            from bench.engines.verl_cpu import target

            python = target.verl_python()
            if not Path(python).exists():
                raise BenchError(f"{where}: engine verl on cpu: {target.PYTHON_ENV}={python} does not exist "
                                 "(install the stack: bash tools/install_verl_cpu.sh)")
            _ensure_cpu_assets(launches)
        elif importlib.util.find_spec("verl") is None:
            raise BenchError(f"{where}: engine verl: verl is not installed for {sys.executable} (pip install verl)")
        for launch in launches:
            for key, path in (launch.config.get("paths") or {}).items():
                check_path(where, key, fill_placeholders(path).strip("'"))
        if any(launch.env.get("VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE") == "1" for launch in launches):
            note = mc2_note()
            if note:
                raise BenchError(f"{where}: factors.{note}")
        from bench.verl_config import VerlConfigError, check_overrides

        for launch in launches:
            try:
                check_overrides(fill_run_dir(overrides_of(launch.argv)))
            except VerlConfigError as exc:
                raise BenchError(f"{where}: {exc}") from None
        overrides = [fill_run_dir(overrides_of(launch.argv)) for launch in launches]
        probe = probe_machine(platform, overrides, python=python)
        if probe.get("error"):
            raise BenchError(f"{where}: engine verl: {probe['error']}")
        if probe.get("invalid"):
            bad = probe["invalid"]
            raise BenchError(f"{where}: verl {probe.get('verl', '')} rejects run {bad['index'] + 1} of the plan "
                             f"(its validate_config): {bad['error']}")
        need = matrix.base.n_gpus_per_node
        if probe.get("devices", 0) < need:
            detail = f" ({probe['detail']})" if probe.get("detail") else ""
            raise BenchError(
                f"{where}: base.n_gpus_per_node: {need} {platform} device(s) wanted, {probe.get('devices', 0)} "
                f"visible on this machine{detail}"
            )


def patch_evidence(run_dir: str | Path) -> dict[str, str]:
    """One line per patch summarising the per-process reports in ``run_dir/patches/*.json``
    (written by ``patches/sitecustomize.py``), small enough for an MLflow tag, e.g.
    ``{"qwen3vl_npu_fused:on": "applied in 8 (ray-worker 8); armed in 3; refused in 0"}``; a refusal or
    error adds its first reason."""
    out: dict[str, str] = {}
    stats: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(run_dir, "patches").glob("*.json")):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for name, rec in (report.get("patches") or {}).items():
            key = f"{name}:{rec.get('mode')}" if rec.get("mode") else name
            st = stats.setdefault(key, {"applied": {}, "armed": 0, "refused": 0, "error": 0, "reason": ""})
            status = rec.get("status", "?")
            if status == "applied":
                role = report.get("role", "?")
                st["applied"][role] = st["applied"].get(role, 0) + 1
            elif status in ("armed", "refused", "error"):
                st[status] += 1
            if status in ("refused", "error") and not st["reason"]:
                st["reason"] = str(rec.get("reason", ""))[:300]
    for key, st in sorted(stats.items()):
        n_applied = sum(st["applied"].values())
        roles = ", ".join(f"{r} {n}" for r, n in sorted(st["applied"].items()))
        line = f"applied in {n_applied}" + (f" ({roles})" if roles else "") + f"; armed in {st['armed']}"
        line += f"; refused in {st['refused']}" + (f"; error in {st['error']}" if st["error"] else "")
        if st["reason"]:
            line += f": {st['reason']}"
        out[key] = line
    return out


def check_path(where: str, key: str, path: str | None) -> None:
    """A model/data path must exist on this machine (``scheme://`` locations and Hydra lists are not checked).

    Raises:
        BenchError: the path is missing (or still holds an unset ``${VAR}``).
    """
    if not path:
        return
    m = _UNSET_RE.search(path)
    if m:
        raise BenchError(f"{where}: {key}: environment variable {m.group(1)} is not set (export {m.group(1)}=...)")
    items = [p.strip() for p in path.strip("[]").split(",")] if path.startswith("[") else [path]
    for item in items:
        if "://" in item or not item:
            continue
        if not Path(item).expanduser().exists():
            raise BenchError(f"{where}: {key}: {item} does not exist on this machine")


def probe_machine(platform: str, override_lists: list[list[str]] = (), timeout_s: float = 900,
                  python: str = sys.executable) -> dict[str, Any]:
    """In a child process (patches never touch the harness): import verl, run verl's own
    ``validate_config`` on each composed override list, count the ``platform`` devices.

    Returns:
        ``{"verl": version, "devices": n, "detail": why 0, "invalid": {"index": i, "error": msg}}``, or
        ``{"error": msg}`` when verl does not import or the probe fails.
    """
    import tempfile

    env = {k: v for k, v in os.environ.items() if k not in ("BENCH_PATCHES", "BENCH_RUN_DIR")}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump([list(o) for o in override_lists], fh)
        path = fh.name
    try:
        proc = subprocess.run([python, "-m", "bench.engines.verl", "--probe", platform, path],
                              capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"the verl probe (import, config validation, devices) took over {timeout_s:g} s"}
    finally:
        os.unlink(path)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{\"")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the verl probe failed: {tail}"}
    return json.loads(lines[-1])


def _probe(platform: str, path: str) -> dict[str, Any]:
    """The child side of :func:`probe_machine`."""
    import warnings

    out: dict[str, Any] = {}
    try:
        import verl

        out["verl"] = getattr(verl, "__version__", "?")
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        return {"error": f"verl does not import: {type(exc).__name__}: {first}"}
    try:
        from verl.trainer.ppo.utils import need_critic
        from verl.utils.config import validate_config
    except ImportError:
        validate_config = None
    if validate_config is not None:
        from bench.verl_config import fast_compose

        for i, overrides in enumerate(json.loads(Path(path).read_text())):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    cfg = fast_compose(overrides)
                    use_ref = bool(cfg.algorithm.get("use_kl_in_reward", False) or cfg.actor_rollout_ref.actor.use_kl_loss)
                    validate_config(config=cfg, use_reference_policy=use_ref, use_critic=need_critic(cfg))
            except Exception as exc:
                msg = " ".join(str(exc).split())[:400]
                out["invalid"] = {"index": i, "error": f"{type(exc).__name__}: {msg}"}
                break
    try:
        import torch

        if platform == "npu":
            try:
                import torch_npu  # noqa: F401
            except Exception as exc:
                out.update(devices=0, detail=f"torch_npu does not import: {exc}")
            else:
                out["devices"] = torch.npu.device_count() if torch.npu.is_available() else 0
        elif platform == "cpu":  # ranks are processes on the host; vLLM's CPU build serves the rollout
            out["devices"] = os.cpu_count() or 1
            if importlib.util.find_spec("vllm") is None:
                out.update(devices=0, detail="vLLM is not installed beside verl (bash tools/install_verl_cpu.sh)")
        else:
            out["devices"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:
        out.update(devices=0, detail=f"{type(exc).__name__}: {exc}")
    return out


if __name__ == "__main__":  # python -m bench.engines.verl --probe PLATFORM OVERRIDES.json
    if len(sys.argv) == 4 and sys.argv[1] == "--probe":
        print(json.dumps(_probe(sys.argv[2], sys.argv[3])))
    else:
        sys.exit("usage: python -m bench.engines.verl --probe PLATFORM OVERRIDES.json")
