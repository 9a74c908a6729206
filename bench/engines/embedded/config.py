"""Run configuration of the embedded GRPO engine (the file given by ``--config``).

Field names follow verl's ``ppo_trainer.yaml`` where verl has the same knob (``train_batch_size``,
``ppo_mini_batch_size``, ``ppo_max_token_len_per_gpu`` ...), so a matrix ``base`` block maps onto both
engines alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from bench.errors import BenchError

DEFAULT_MODEL = "builtin:qwen3vl-tiny"
DEFAULT_DATA = "builtin:shapes"


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

    model_config = ConfigDict(extra="forbid")

    model: str = DEFAULT_MODEL
    data: str = DEFAULT_DATA
    device: Literal["cpu", "cuda", "npu"] = "cpu"
    steps: int = Field(3, ge=1)
    warmup_steps: int = Field(1, ge=0)
    profile_steps: list[int] = Field(default_factory=lambda: [2, 3])
    train_batch_size: int = Field(8, ge=1)
    n: int = Field(4, ge=1)
    ppo_mini_batch_size: int = Field(8, ge=1)
    micro_batch_size_per_gpu: int = Field(4, ge=1)
    log_prob_micro_batch_size_per_gpu: int = Field(8, ge=1)
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int | None = Field(None, ge=1)
    log_prob_max_token_len_per_gpu: int | None = Field(None, ge=1)
    max_prompt_length: int = Field(96, ge=8)
    max_response_length: int = Field(64, ge=1)
    temperature: float = Field(1.0, gt=0)
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    clip_ratio: float = 0.2
    lr: float = 1e-5
    rmsnorm_fused: bool = False
    update_delay_s: float = Field(0.0, ge=0)
    speed_probe: bool | None = None
    seed: int = 0

    @model_validator(mode="after")
    def _fill_token_limits(self) -> "RunConfig":
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
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise BenchError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise BenchError(f"{path}{line}: malformed YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise BenchError(f"{path}: expected a mapping of run settings")
    try:
        return RunConfig(**raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "(root)"
        raise BenchError(f"{path}: {key}: {err['msg']}") from None
