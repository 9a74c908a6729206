"""Launch side of the embedded engine: a matrix cell -> ``python -m bench.engines.embedded`` + run config.

Kept apart from the engine package so planning (and ``--dry-run``) never imports torch.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from bench.core.errors import BenchError, did_you_mean
from bench.core.paths import check_names
from bench.engines.base import EngineBase
from bench.engines.builtins.data import BUILTINS
from bench.engines.builtins.model import BUILTIN_MODEL
from bench.engines.common import default_cache_dir, default_profile_steps, device_available
from bench.engines.embedded.config import RunConfig
from bench.spec.launch import Launch
from bench.spec.loading import expand_env, value_message
from bench.spec.matrix import Base, Matrix
from bench.spec.optimizations import Mechanism

#: Matrix ``base`` keys copied into the embedded run config under the same name.
_SHARED_KEYS = (
    "steps",
    "warmup_steps",
    "train_batch_size",
    "n",
    "ppo_mini_batch_size",
    "micro_batch_size_per_gpu",
    "log_prob_micro_batch_size_per_gpu",
    "max_prompt_length",
    "max_response_length",
    "temperature",
    "use_kl_loss",
    "seed",
)


#: the run config fields of the first cell ids: each names a cell whatever its value; a field added later names
#: a cell only when it differs from its default (so a new field keeps every existing cell id)
ID_FIELDS = frozenset({
    "model", "data", "device", "steps", "warmup_steps", "profile_steps", "train_batch_size", "n",
    "ppo_mini_batch_size", "micro_batch_size_per_gpu", "log_prob_micro_batch_size_per_gpu", "use_dynamic_bsz",
    "ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu", "max_prompt_length", "max_response_length",
    "temperature", "use_kl_loss", "kl_loss_coef", "kl_loss_type", "clip_ratio", "lr", "rmsnorm_fused",
    "update_delay_s", "speed_probe", "seed",
})

#: run config keys the harness sets itself (from the named matrix setting); ``base.embedded`` may not set them
_BASE_OWNED = {"device": "platform", "ppo_max_token_len_per_gpu": "base.ppo_max_token_len",
               "log_prob_max_token_len_per_gpu": "base.log_prob_max_token_len", "profile_steps": "base.profile_steps"}


#: what an unset ``${VAR}`` leaves in a value a dry run shows (:func:`bench.spec.loading.expand_env`, not strict)
_ENV_LEFT = "${"


def _check_source(kind: str, value: str, key: str, strict: bool) -> str:
    """``value`` of ``model``/``data`` with ``${VAR}`` expanded and checked before anything runs: not empty; a
    ``builtin:`` name must be known; a model path must be a folder with ``config.json``; a data path must be a
    readable regular file (a verl RL parquet; its content is read by the run). An unset variable is left as
    written when not ``strict`` (a dry run shows it), and then nothing is checked.

    Raises:
        BenchError: unset variable (``strict``), empty value, unknown builtin name, missing, over-long or
            unusable path (naming ``key``).
    """
    import os
    from pathlib import Path

    value = expand_env(value, file="base", key=key.removeprefix("base."), strict=strict)
    if "${" in value:
        return value
    builtins = [BUILTIN_MODEL] if kind == "model" else list(BUILTINS)
    if not value.strip():
        raise BenchError(f"{key}: empty (allowed: {', '.join(builtins)}, or a path; leave the key out for the "
                         "default)")
    if value.startswith("builtin:"):
        if value not in builtins:
            raise BenchError(f"{key}: unknown builtin {kind} {value!r}{did_you_mean(value, builtins)} "
                             f"(allowed: {', '.join(builtins)}, or a path)")
        return value
    check_names(key, Path(value))
    path = Path(value).expanduser()
    try:
        exists = path.exists()
        usable = (path / "config.json").is_file() if kind == "model" else path.is_file()
        readable = os.access(path, os.R_OK)
    except OSError as exc:
        raise BenchError(f"{key}: {kind} path {value}: {exc.strerror}") from None
    if not exists:
        raise BenchError(f"{key}: {kind} path {value} does not exist (allowed: {', '.join(builtins)}, or a path)")
    if kind == "model" and not usable:
        raise BenchError(f"{key}: {value} is not a Hugging Face checkpoint (no config.json)")
    if kind == "data" and not usable:
        raise BenchError(f"{key}: data path {value} is not a file (allowed: a verl RL parquet file, or "
                         f"{', '.join(builtins)})")
    if not readable:
        raise BenchError(f"{key}: {kind} path {value} is not readable")
    # a run starts in its own run folder: a relative path is the user's, resolved against the current folder
    return value if path.is_absolute() or value.startswith("~") else os.path.abspath(value)


def _fill(value: Any, ctx: dict[str, Any]) -> Any:
    """Fill ``{placeholder}`` templates of the registry; an all-placeholder string becomes an int."""
    if isinstance(value, str) and "{" in value:
        filled = value.format(**ctx)
        return int(filled) if filled.isdigit() else filled
    return value


class EmbeddedEngine(EngineBase):
    """Builds launches of the embedded one-process GRPO engine (:mod:`bench.engines.embedded`)."""

    name = "embedded"
    options_key = "embedded"
    shows_config = True
    forkserver_platforms = ("cpu",)
    #: what an embedded run imports first (several seconds on 2 cores), imported once by the fork server
    forkserver_preload = ("torch", "transformers", "verl.trainer.ppo.core_algos", "verl.utils.seqlen_balancing",
                          "verl.utils.tracking", "bench.engines.embedded.run")
    supports_smoke = False

    @staticmethod
    def placeholders() -> dict[str, str]:
        """``{bench_cache}``: where the tiny model and the built-in data are built (:func:`default_cache_dir`)."""
        return {"bench_cache": str(default_cache_dir())}

    @staticmethod
    def stack_packages(platform: str) -> tuple[str, ...]:
        """What an embedded run imports: verl's algorithm functions (torch with them), then transformers."""
        return ("verl.trainer.ppo.core_algos", "transformers")

    @staticmethod
    def startup_text(launch: Any) -> str:
        """Building the tiny model when its cache folder has none yet, else loading the model and data."""
        try:
            import os
            from pathlib import Path

            from bench.engines.builtins.model import (  # deferred: name clash with engines.common.default_cache_dir
                default_cache_dir,
                resolve_model_path,
            )

            cfg = getattr(launch, "config", None) or {}
            env = getattr(launch, "env", None) or {}
            cache = Path(env["BENCH_CACHE_DIR"]) if env.get("BENCH_CACHE_DIR") else (
                Path(os.environ["BENCH_CACHE_DIR"]) if os.environ.get("BENCH_CACHE_DIR") else default_cache_dir())
            _, needs_build = resolve_model_path(str(cfg.get("model", "builtin:qwen3vl-tiny")), cache)
            if needs_build:
                return "building the tiny model (first use; cached for later runs)"
        except Exception:
            pass
        return "loading the model and data, then step 1"

    @staticmethod
    def id_config(config: dict[str, Any]) -> dict[str, Any]:
        """The run config as it names a cell: the :data:`ID_FIELDS`, and any later field off its default."""
        fields = RunConfig.model_fields
        return {k: v for k, v in config.items() if k in ID_FIELDS or k not in fields
                or v != fields[k].get_default(call_default_factory=True)}

    @classmethod
    def check_options(cls, base: Base) -> None:
        """Validate ``base.embedded`` against the run config's own schema before anything runs: known keys
        (with "did you mean"), ranges, enums, finite numbers, and no key that contradicts ``base``.

        Raises:
            ValueError: naming ``base.embedded.<key>``, the bad value and what is allowed.
        """
        from pydantic import ValidationError

        fields, options = sorted(RunConfig.model_fields), base.options(cls.options_key)
        if base.val_data is not None:
            raise ValueError("base.val_data: the embedded engine runs no validation set (allowed: leave it out; the "
                             "verl engine uses it)")
        for key, value in options.items():
            if key not in RunConfig.model_fields:
                raise ValueError(f"base.embedded: unknown key {key!r}{did_you_mean(key, fields)} "
                                 f"(allowed: {', '.join(fields)})")
            if key in _SHARED_KEYS and value != getattr(base, key):
                raise ValueError(f"base.embedded.{key}: {value!r} contradicts base.{key} ({getattr(base, key)!r}); "
                                 f"set base.{key} only")
            if key in _BASE_OWNED:
                raise ValueError(f"base.embedded.{key}: set by the harness from {_BASE_OWNED[key]}; not allowed here")
        config = {k: getattr(base, k) for k in _SHARED_KEYS}
        config["profile_steps"] = default_profile_steps(base)  # what build() gives the run
        config.update(options)
        try:
            RunConfig.model_validate(config)
        except ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(str(p) for p in err["loc"]) or "(root)"
            where = f"base.embedded.{key}" if key in options else f"base.{key}"
            raise ValueError(f"{where}: {value_message(err)}") from None
        for key in ("model", "data"):
            value = options.get(key)
            if value is not None:
                try:
                    _check_source(key, str(value), f"base.embedded.{key}", strict=False)
                except BenchError as exc:
                    raise ValueError(str(exc)) from None

    def build(
        self, base: Base, mechanism: Mechanism, platform: str, levels: dict[str, int | None], *, strict: bool
    ) -> Launch:
        """Run config = shared ``base`` keys + ``base.embedded`` + the factors' config keys.

        Raises:
            BenchError: ``base.embedded`` holds a key the run config does not know or a value it refuses;
                ``base.env`` names an unset ``${VAR}`` (``strict``; a dry run leaves it visible).
        """
        from pydantic import ValidationError

        ctx, options = base.context(), base.options(self.options_key)
        config: dict[str, Any] = {k: getattr(base, k) for k in _SHARED_KEYS}
        config.update(
            device=platform,
            profile_steps=default_profile_steps(base),
            ppo_max_token_len_per_gpu=ctx["ppo_max_token_len"],
            log_prob_max_token_len_per_gpu=ctx["log_prob_max_token_len"],
        )
        unset: list[str] = []  # keys a dry run leaves with an unset ${VAR} (each gets a note)
        if base.model is not None:
            config["model"] = _check_source("model", base.model, "base.model", strict)
            unset += ["base.model"] if _ENV_LEFT in config["model"] else []
        if base.data is not None:
            config["data"] = _check_source("data", base.data, "base.data", strict)
            unset += ["base.data"] if _ENV_LEFT in config["data"] else []
        for ov in base.overrides:  # not passed to this engine, but an unset variable is still a mistake
            unset += ["base.overrides"] if _ENV_LEFT in expand_env(ov, file="base", key="overrides",
                                                                   strict=strict) else []
        unknown = sorted(set(options) - set(RunConfig.model_fields))
        if unknown:
            raise BenchError(
                f"base.embedded: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(RunConfig.model_fields))})"
            )
        config.update(options)
        for key in ("model", "data"):  # the sub-block's own paths: checked and resolved like base's
            if options.get(key) is not None:
                config[key] = _check_source(key, str(options[key]), f"base.embedded.{key}", strict)
                unset += [f"base.embedded.{key}"] if _ENV_LEFT in config[key] else []
        taken = sorted(set(options) & set(mechanism.config))
        if taken:  # the factor would silently win, the cell id unchanged (issue 33)
            used = ", ".join(sorted(k for k, v in levels.items() if v is not None))
            raise BenchError(f"base.embedded.{taken[0]}: set in each cell by the optimizations' levels ({used}; "
                             "one not under factors is held off); remove it from base.embedded and list the "
                             "optimization under factors to choose its level")
        config.update({k: _fill(v, ctx) for k, v in mechanism.config.items()})
        try:
            config = RunConfig.model_validate(config).model_dump()
        except ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(str(p) for p in err["loc"]) or "(root)"
            where = f"base.embedded.{key}" if key in options else f"base.{key}"
            if key not in options and key not in _SHARED_KEYS:
                where = f"base (embedded run config {key})"
            raise BenchError(f"{where}: {value_message(err)} (engine embedded)") from None
        env = {k: expand_env(v, file="base", key=f"env.{k}", strict=strict) for k, v in base.env.items()}
        notes = [f"base.env.{k}: {v} has an unset variable; left as written (a real run stops on it)"
                 for k, v in env.items() if _ENV_LEFT in v]
        notes += [f"{key}: has an unset variable; left as written (a real run stops on it)"
                  for key in dict.fromkeys(unset)]
        argv = [
            "{python}",
            "-m",
            "bench.engines.embedded",
            "--out",
            "{run_dir}",
            "--config",
            "{run_dir}/run_config.yaml",
        ]
        return Launch(argv=argv, env={**env, **mechanism.env}, patches=list(mechanism.patches), config=config,
                      notes=notes)

    def preflight(self, matrix: Matrix, launches: list[Launch], platform: str) -> None:
        """torch and transformers importable; the requested device present.

        Raises:
            BenchError: a missing package or device.
        """
        for mod in ("torch", "transformers", "verl"):
            if importlib.util.find_spec(mod) is None:
                raise BenchError(f"{matrix.source}: engine: embedded needs the package {mod!r} (pip install -e .)")
        if platform != "cpu" and not device_available(platform):
            raise BenchError(f"{matrix.source}: platform: {platform} requested but no {platform} device is "
                             "available on this machine (use platform: cpu or auto)")
