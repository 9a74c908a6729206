"""Run configuration of the embedded GRPO engine (the file given by ``--config``).

Field names follow verl's ``ppo_trainer.yaml`` where verl has the same knob (``train_batch_size``,
``ppo_mini_batch_size``, ``ppo_max_token_len_per_gpu`` ...), so a matrix ``base`` block maps onto both
engines alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, model_validator

from bench.core.errors import BenchError
from bench.core.inputs import load_yaml, read_text, yaml_error_line

DEFAULT_MODEL = "builtin:qwen3vl-tiny"
DEFAULT_DATA = "builtin:shapes"
#: KL estimators verl's ``core_algos.kl_penalty`` accepts (``kl_loss_type``)
KL_TYPES = ("low_var_kl", "k3", "kl", "k1", "mse", "k2", "abs", "full")
#: largest run config file read (a run config is a page of YAML)
MAX_CONFIG_BYTES = 1 << 20


class RunConfig(BaseModel):
    """Everything one embedded run needs. Lengths are in tokens, times in seconds.

    Attributes:
        model: ``builtin:qwen3vl-tiny`` (built and cached locally) or a path to a local HF checkpoint.
        data: ``builtin:shapes`` (multimodal), ``builtin:text`` (text-only) or a path to a verl RL parquet.
        device: ``cpu``, ``cuda`` or ``npu``.
        steps: GRPO steps to run (>= 1).
        warmup_steps: leading steps excluded from statistics.
        profile_steps: 1-based steps recorded by ``torch.profiler`` (empty = no profiling).
        train_batch_size: prompts per step.
        n: samples per prompt (GRPO group size).
        ppo_mini_batch_size: prompts per optimizer step (verl semantics: multiplied by ``n``).
        micro_batch_size_per_gpu: sequences per micro-batch in the update when dynamic bsz is off.
        log_prob_micro_batch_size_per_gpu: sequences per micro-batch in log-prob passes when off.
        use_dynamic_bsz: token-budget micro-batches (verl ``use_dynamic_bsz``).
        ppo_max_token_len_per_gpu: token budget of an update micro-batch (dynamic bsz).
        log_prob_max_token_len_per_gpu: token budget of a log-prob micro-batch (dynamic bsz).
        max_prompt_length / max_response_length: P and R.
        temperature: rollout sampling temperature.
        use_kl_loss / kl_loss_coef / kl_loss_type: KL loss against the reference (creates the ref pass).
        clip_ratio: PPO clip epsilon.
        lr: AdamW learning rate.
        rmsnorm_fused: install the fused RMSNorm forward in the model's text RMSNorm modules.
        update_delay_s: test-only: a fixed sleep inside the update phase (injected slowdown).
        speed_probe: time a fixed reference kernel around each unprofiled step and log it as
            ``bench/speed_probe_s`` (:mod:`.speed_probe`); ``None`` (default) = on for ``device: cpu``.
        seed: seed for data order, sampling and init.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str = DEFAULT_MODEL
    data: str = DEFAULT_DATA
    device: Literal["cpu", "cuda", "npu"] = "cpu"
    steps: int = Field(3, ge=1, le=100_000, strict=True)
    warmup_steps: int = Field(1, ge=0, le=100_000, strict=True)
    profile_steps: list[StrictInt] = Field(default_factory=lambda: [2, 3])
    train_batch_size: int = Field(8, ge=1, le=1_000_000, strict=True)
    n: int = Field(4, ge=1, le=1024, strict=True)
    ppo_mini_batch_size: int = Field(8, ge=1, le=1_000_000, strict=True)
    micro_batch_size_per_gpu: int = Field(4, ge=1, le=1_000_000, strict=True)
    log_prob_micro_batch_size_per_gpu: int = Field(8, ge=1, le=1_000_000, strict=True)
    use_dynamic_bsz: StrictBool = False
    ppo_max_token_len_per_gpu: int | None = Field(None, ge=1, le=1 << 24, strict=True)
    log_prob_max_token_len_per_gpu: int | None = Field(None, ge=1, le=1 << 24, strict=True)
    max_prompt_length: int = Field(96, ge=8, le=1 << 20, strict=True)
    max_response_length: int = Field(64, ge=1, le=1 << 20, strict=True)
    temperature: float = Field(1.0, gt=0, le=100, strict=True)
    use_kl_loss: StrictBool = True
    kl_loss_coef: float = Field(0.001, ge=0, le=100, strict=True)
    kl_loss_type: Literal[KL_TYPES] = "low_var_kl"  # type: ignore[valid-type]
    clip_ratio: float = Field(0.2, gt=0, lt=1, strict=True)
    lr: float = Field(1e-5, gt=0, le=1, strict=True)
    rmsnorm_fused: StrictBool = False
    update_delay_s: float = Field(0.0, ge=0, le=3600, strict=True)
    speed_probe: StrictBool | None = None
    seed: int = Field(0, ge=0, le=2**32 - 1, strict=True)

    @model_validator(mode="after")
    def _fill_token_limits(self) -> "RunConfig":
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be below steps ({self.steps})")
        bad = [s for s in self.profile_steps if not 1 <= s <= self.steps]
        if bad or len(set(self.profile_steps)) != len(self.profile_steps):
            raise ValueError(f"profile_steps {self.profile_steps}: each step once, within 1..{self.steps}")
        seq = self.max_prompt_length + self.max_response_length
        if self.ppo_max_token_len_per_gpu is None:
            self.ppo_max_token_len_per_gpu = 2 * seq  # article 3.2.1
        if self.log_prob_max_token_len_per_gpu is None:
            self.log_prob_max_token_len_per_gpu = 4 * seq  # article 3.2.1
        if self.speed_probe is None:
            self.speed_probe = self.device == "cpu"
        return self


def load_run_config(path: str | Path | None) -> RunConfig:
    """Load and validate a run config YAML; ``None`` gives the default run.

    Raises:
        BenchError: unreadable file, malformed YAML or an invalid key/value (message names file and key).
    """
    if path is None:
        return RunConfig()
    path = Path(path)
    text = read_text(path, MAX_CONFIG_BYTES, "run config")
    try:
        raw = load_yaml(text) or {}
    except yaml.YAMLError as exc:
        raise BenchError(yaml_error_line(path, text, exc)) from None
    if not isinstance(raw, dict):
        raise BenchError(f"{path}: expected a mapping of run settings")
    try:
        return RunConfig(**raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "(root)"
        raise BenchError(f"{path}: {key}: {err['msg']}") from None
