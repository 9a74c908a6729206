"""The verl engine: a matrix cell -> ``python -m verl.trainer.main_ppo`` with Hydra overrides.

The argv (a list, never a shell string) is ``["{python}", "-m", "verl.trainer.main_ppo", *overrides]``,
the overrides in this order:

1. the run settings of the matrix ``base`` block (:func:`~bench.engines.verl.overrides.base_overrides`):
   GRPO, data files, lengths, batch sizes, ``n``, rollout TP and memory, devices, ``trainer.total_training_steps``,
   ``trainer.logger=[console,file]`` (the file logger writes ``$VERL_FILE_LOGGER_PATH``, set to
   ``{run_dir}/metrics.jsonl``);
2. the profiler (:func:`~bench.engines.verl.overrides.profiler_overrides`): ``global_profiler`` (tool
   ``npu`` on Ascend, ``torch`` on CUDA; steps; ``save_path={run_dir}/profile``) and the actor and ref
   role profilers on all ranks (on NPU with ``contents=[npu,cpu]``, ``level1``, online ``analysis``); on CPU
   also the rollout role's (vLLM's engine traced around each profiled step's generation, discrete mode, its
   traces relocated into the profile folder: phase ``rollout``);
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
import sys
from pathlib import Path
from typing import Any

from bench.core.errors import BenchError
from bench.engines.base import EngineBase
from bench.engines.builtins import data as data_mod
from bench.engines.common import default_cache_dir
from bench.engines.verl.config import VerlConfigError, check_overrides
from bench.engines.verl.notes import forward_prefetch_note, mc2_note, not_read_notes
from bench.engines.verl.overrides import (
    DEVICES,
    ENTRY_MODULE,
    METRICS_FILE,
    MISSING,
    RUN_DIR_PLACEHOLDER,
    UNSET_RE,
    base_overrides,
    builtin_data_path,
    builtin_model_path,
    expand_value,
    fill_run_dir,
    key_of,
    overrides_of,
    profiler_overrides,
)
from bench.engines.verl.probe import probe_machine
from bench.engines.verl_cpu import assets, smoke, target
from bench.engines.verl_cpu.target import verl_python
from bench.measure.verl_failure import classify
from bench.spec.launch import Launch, fill_placeholders
from bench.spec.matrix import Base, Matrix
from bench.spec.optimizations import Mechanism, conflict_lifts, resolve

#: Patches every verl launch gets (measurement plumbing, not factors): see patches/bench_patches/verl_file_logger.py.
ENGINE_PATCHES = ("verl_file_logger", "verl_evidence")
#: Hydra's output folder inside the run folder: ``.hydra/config.yaml`` there is the config verl composed.
HYDRA_DIR = "hydra"
#: The reward function of the verl:cpu target, relative to the repository root.
REWARD_FILE = "bench/engines/verl_cpu/reward.py"


def _ensure_cpu_assets(launches: list[Launch]) -> None:
    """Build the tiny model and the data set the ``verl:cpu`` launches name (once; cached)."""
    cache = default_cache_dir()
    paths = [p for launch in launches for p in (launch.config.get("paths") or {}).values()]
    if any(("{bench_cache}/" + assets.model_relpath(assets.BUILTIN_MODEL)) in p for p in paths):
        assets.ensure_model(cache)
    if any(("{bench_cache}/" + assets.model_relpath(assets.BUILTIN_VL_MODEL)) in p for p in paths):
        assets.ensure_vl_model(cache)
    for name in data_mod.BUILTINS:
        if any(("{bench_cache}/" + data_mod.builtin_relpath(name)) in p for p in paths):
            data_mod.builtin_path(name, cache)

class VerlEngine(EngineBase):
    """Builds ``verl.trainer.main_ppo`` launches; checks the machine before a real sweep.

    Args:
        verl_version: the verl release whose behaviour notes refer to (FSDP2 forward prefetch);
            ``None`` = the installed verl.
    """

    name = "verl"
    supports_smoke = True  # the other capabilities keep EngineBase's defaults
    bracket_probe = True  # Ray, workers and vLLM cannot time the probe between steps: the harness times it around

    def __init__(self, verl_version: str | None = None) -> None:
        self.verl_version = verl_version

    @staticmethod
    def startup_text(launch: Any) -> str:
        """Ray, the workers and the rollout engine start before step 1."""
        return "starting up (Ray, workers, rollout engine) before step 1"

    @staticmethod
    def stack_packages(platform: str) -> tuple[str, ...]:
        """What a verl run's driver imports: torch, verl's trainer and the rollout's vLLM."""
        return ("torch", "verl.trainer.main_ppo", "vllm")

    @staticmethod
    def stack_probe_patches(platform: str) -> tuple[str, ...]:
        """On ``cpu`` the CPU target's workarounds (``verl_cpu``): without its ``torchvision_op_schemas``,
        ``import verl.trainer.main_ppo`` dies in the verl CPU stack (transformers' model imports load torchvision,
        whose compiled ops cannot load beside torch ``2.13.0+cpu``), as it would in a run."""
        return (target.PATCHES[0],) if platform == "cpu" else ()

    @staticmethod
    def stack_placeholders(python: str) -> dict[str, str]:
        """``{verl_python}``: a stack's runs use the stack's interpreter instead of ``$BENCH_VERL_PYTHON``."""
        return {"verl_python": python}

    @staticmethod
    def placeholders() -> dict[str, str]:
        """``{verl_python}`` (the verl CPU stack's interpreter) and ``{bench_cache}`` (models and data built
        locally)."""
        return {"verl_python": verl_python(), "bench_cache": str(default_cache_dir())}

    @staticmethod
    def classify_failure(run_dir: Path, log_tail: str, *, timed_out: bool, steps_done: int, returncode: int,
                         argv: list[str]) -> tuple[str, str] | None:
        """The kind of a failed verl run from its log (:func:`bench.measure.verl_failure.classify`), unless the
        run wrote its own ``failure.json``."""
        if (Path(run_dir) / "failure.json").exists():
            return None
        return classify(log_tail, timed_out=timed_out, steps_done=steps_done, returncode=returncode,
                        overrides=[a for a in argv[1:] if "=" in a])

    def smoke_base(self, matrix: Matrix, steps: int = 2) -> tuple[Base, list[str]]:
        """:func:`bench.engines.verl_cpu.smoke.smoke_base`."""
        return smoke.smoke_base(matrix, steps)

    def smoke_cells(self, matrix: Matrix, plan: Any, steps: int = 2) -> list[Any]:
        """:func:`bench.engines.verl_cpu.smoke.smoke_cells` (the ``verl:cpu`` launch of each cell)."""
        return smoke.smoke_cells(matrix, plan, steps)

    def not_exercised(self, plan: Any, matrix: Matrix | None = None) -> dict[str, str]:
        """:func:`bench.engines.verl_cpu.smoke.not_exercised`."""
        return smoke.not_exercised(plan, matrix)

    def build(
        self, base: Base, mechanism: Mechanism, platform: str, levels: dict[str, int | None], *, strict: bool
    ) -> Launch:
        """The launch of one cell (see the module docstring for the order of the overrides).

        Raises:
            BenchError: platform ``cpu`` (verl's rollout needs an NPU or GPU), no ``base.model`` /
                ``base.data``, or (``strict``) an unset ``${VAR}`` (the message names the matrix key).
        """
        if platform not in DEVICES:
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
            expand_value(base.model, "model", strict, notes) if base.model else MISSING)
        train = builtin_data_path(base.data, platform) or (
            expand_value(base.data, "data", strict, notes) if base.data else MISSING)
        val = builtin_data_path(base.val_data, platform, default=None) or (
            (expand_value(base.val_data, "val_data", strict, notes) if base.val_data else "") or train)

        ctx = base.context()
        factor_overrides = [o.format(**ctx) for o in mechanism.overrides]
        user_overrides = [expand_value(o, f"overrides[{i}]", strict, notes) for i, o in enumerate(base.overrides)]
        target_overrides: list[str] = []
        env: dict[str, str] = {}
        target_patches: tuple[str, ...] = ()
        if cpu:
            target_overrides = target.overrides(base.n_gpus_per_node, f"'{{repo}}/{REWARD_FILE}'")
            env.update(target.env())
            target_patches = target.PATCHES
        overrides = [
            *base_overrides(base, platform, model, train, val),
            *profiler_overrides(base, platform),
            *target_overrides,
            *factor_overrides,
            *user_overrides,
            f"hydra.run.dir='{RUN_DIR_PLACEHOLDER}/{HYDRA_DIR}'",
        ]

        env.update({k: expand_value(v, f"env.{k}", strict, notes) for k, v in base.env.items()})
        for k, v in mechanism.env.items():
            if k in env and env[k] != v:
                notes.append(f"base.env.{k}={env[k]} is replaced by the factor's {k}={v}")
            env[k] = v
        for lift_env, lift_note in conflict_lifts(levels, "verl", platform):  # e.g. verl PR 6562's rollout level
            env.update(lift_env)
            notes.append(lift_note)
        env["VERL_FILE_LOGGER_PATH"] = f"{RUN_DIR_PLACEHOLDER}/{METRICS_FILE}"

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
        user_keys = {key_of(o): o for o in user_overrides}
        for key, level in levels.items():
            if level is None:
                continue
            try:
                mech = resolve(key, level, "verl", platform)
            except KeyError:
                continue
            for o in mech.overrides:
                k = key_of(o)
                if k in user_keys:
                    notes.append(f"base.overrides sets {k} after factor {key} ({user_keys[k]}): the factor's value "
                                 "is overridden in every cell")
        if levels.get("forward_prefetch") is not None:
            note = forward_prefetch_note(overrides, self.verl_version)
            if note:
                notes.append(note)
        notes += not_read_notes(levels, platform)  # "mc2: not read by vllm-ascend X (...)"
        return notes

    # ------------------------------------------------------------------------------------- preflight

    def preflight(self, matrix: Matrix, launches: list[Launch], platform: str) -> None:
        """verl importable, devices visible, model and data paths present, overrides valid for this verl.

        Raises:
            BenchError: one line naming what is missing or refused.
        """
        where = matrix.source or matrix.name
        python = sys.executable
        if platform == "cpu":
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

def check_path(where: str, key: str, path: str | None) -> None:
    """A model/data path must exist on this machine (``scheme://`` locations and Hydra lists are not checked).

    Raises:
        BenchError: the path is missing (or still holds an unset ``${VAR}``).
    """
    if not path:
        return
    m = UNSET_RE.search(path)
    if m:
        raise BenchError(f"{where}: {key}: environment variable {m.group(1)} is not set (export {m.group(1)}=...)")
    items = [p.strip() for p in path.strip("[]").split(",")] if path.startswith("[") else [path]
    for item in items:
        if "://" in item or not item:
            continue
        if not Path(item).expanduser().exists():
            raise BenchError(f"{where}: {key}: {item} does not exist on this machine")
