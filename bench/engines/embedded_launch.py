"""Launch side of the embedded engine: a matrix cell -> ``python -m bench.engines.embedded`` + run config.

Kept apart from the engine package so planning (and ``--dry-run``) never imports torch.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from bench.engines import register
from bench.engines.base import Launch
from bench.engines.common import default_profile_steps, device_available
from bench.errors import BenchError
from bench.spec.loading import expand_env
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


def _fill(value: Any, ctx: dict[str, Any]) -> Any:
    """Fill ``{placeholder}`` templates of the registry; an all-placeholder string becomes an int."""
    if isinstance(value, str) and "{" in value:
        filled = value.format(**ctx)
        return int(filled) if filled.isdigit() else filled
    return value


@register
class EmbeddedEngine:
    """Builds launches of the embedded one-process GRPO engine (:mod:`bench.engines.embedded`)."""

    name = "embedded"
    options_key = "embedded"
    shows_config = True
    forkserver_platforms = ("cpu",)
    supports_smoke = False
    has_speed_probe = True

    def build(
        self, base: Base, mechanism: Mechanism, platform: str, levels: dict[str, int | None], *, strict: bool
    ) -> Launch:
        """Run config = shared ``base`` keys + ``base.embedded`` + the factors' config keys.

        Raises:
            BenchError: ``base.embedded`` holds a key the run config does not know or a value it refuses;
                ``base.env`` names an unset ``${VAR}`` (``strict``; a dry run leaves it visible).
        """
        from pydantic import ValidationError

        from bench.engines.embedded.config import RunConfig

        ctx = base.context()
        config: dict[str, Any] = {k: getattr(base, k) for k in _SHARED_KEYS}
        config.update(
            device=platform,
            profile_steps=default_profile_steps(base),
            ppo_max_token_len_per_gpu=ctx["ppo_max_token_len"],
            log_prob_max_token_len_per_gpu=ctx["log_prob_max_token_len"],
        )
        if base.model:
            config["model"] = base.model
        if base.data:
            config["data"] = base.data
        unknown = sorted(set(base.embedded) - set(RunConfig.model_fields))
        if unknown:
            raise BenchError(
                f"base.embedded: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(RunConfig.model_fields))})"
            )
        config.update(base.embedded)
        config.update({k: _fill(v, ctx) for k, v in mechanism.config.items()})
        try:
            config = RunConfig.model_validate(config).model_dump()
        except ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(str(p) for p in err["loc"]) or "(root)"
            where = f"base.embedded.{key}" if key in base.embedded else f"base.{key}"
            if key not in base.embedded and key not in _SHARED_KEYS:
                where = f"base (embedded run config {key})"
            raise BenchError(f"{where}: {err['msg'].removeprefix('Value error, ')} "
                             f"(engine embedded), got {err.get('input')!r}") from None
        env = {k: expand_env(v, file="base", key=f"env.{k}", strict=strict) for k, v in base.env.items()}
        notes = [f"base.env.{k}: {v} has an unset variable; left as written (a real run stops on it)"
                 for k, v in env.items() if "${" in v]
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
