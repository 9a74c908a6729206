"""One GRPO step, phase by phase, with verl's algorithm functions and verl's metric names.

    gen -> reward -> old_log_prob -> ref (KL loss on) -> adv -> update_actor

- gen: :func:`.rollout.generate` (``n`` samples per prompt).
- reward: rule-based outcome score (:mod:`.reward`) placed on the last response token
  (``token_level_scores``; ``token_level_rewards`` = scores, no in-reward KL, as verl with ``use_kl_loss``).
- old_log_prob / ref: no-grad log-prob passes of actor and reference over micro-batches.
- adv: ``verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage`` grouped by prompt.
- update_actor: mini-batches of ``ppo_mini_batch_size * n`` sequences; per micro-batch the policy loss
  from ``core_algos.get_policy_loss_fn("vanilla")`` plus ``kl_loss_coef *`` ``agg_loss(kl_penalty(...))``,
  normalised by the mini-batch token count (``global_batch_info``, as ``verl/workers/utils/losses.py``
  ``ppo_loss``) so gradients do not depend on the micro-batching; grad-norm clip 1.0 and AdamW.

Metrics: ``verl.trainer.ppo.metric_utils.compute_{data,timing,throughout}_metrics`` on a verl
``DataProto`` of the batch, plus ``actor/*``, memory and per-pass micro-batch counts.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch

from bench.engines.builtins.data import EncodedPrompt, PromptItem
from bench.engines.builtins.sequences import Sequence, TokenIds
from bench.measure.run_summary import STEP_CPU

from . import batching, reward
from .config import RunConfig
from .forward import response_log_probs
from .rollout import Rollout, generate

PASSES = ("old_log_prob", "ref", "update_actor")


@dataclass
class Trainer:
    """State that lives across steps: models, optimizer, verl actor config, device."""

    cfg: RunConfig
    model: Any
    ref: Any | None
    processor: Any
    ids: TokenIds
    device: str
    optimizer: torch.optim.Optimizer
    actor_cfg: Any
    micro_batches: dict[str, list[int]] = field(default_factory=lambda: {p: [] for p in PASSES})


def make_trainer(cfg: RunConfig, model: Any, ref: Any | None, processor: Any, ids: TokenIds, device: str) -> Trainer:
    """Build the AdamW optimizer (verl defaults: betas 0.9/0.999, weight decay 0.01) and verl's ``ActorConfig``."""
    from verl.workers.config import ActorConfig

    actor_cfg = ActorConfig(
        strategy="fsdp",
        rollout_n=cfg.n,
        ppo_mini_batch_size=cfg.ppo_mini_batch_size,
        ppo_micro_batch_size_per_gpu=cfg.micro_batch_size_per_gpu,
        use_dynamic_bsz=cfg.use_dynamic_bsz,
        ppo_max_token_len_per_gpu=cfg.ppo_max_token_len_per_gpu,
        clip_ratio=cfg.clip_ratio,
        clip_ratio_low=cfg.clip_ratio,
        clip_ratio_high=cfg.clip_ratio,
        use_kl_loss=cfg.use_kl_loss,
        kl_loss_coef=cfg.kl_loss_coef,
        kl_loss_type=cfg.kl_loss_type,
        loss_agg_mode="token-mean",
    )
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.999), weight_decay=0.01)
    return Trainer(cfg, model, ref, processor, ids, device, opt, actor_cfg)


@contextmanager
def phase(timing: dict[str, float], name: str, device: str) -> Iterator[None]:
    """Time a phase into ``timing[name]`` (seconds, wall); syncs the device so async kernels are counted.

    Also emits a ``torch.profiler.record_function`` range ``phase/<name>`` for the trace.
    """
    _sync(device)
    t0 = time.perf_counter()
    with torch.profiler.record_function(f"phase/{name}"):
        yield
        _sync(device)
    timing[name] = time.perf_counter() - t0


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "npu":
        torch.npu.synchronize()  # type: ignore[attr-defined]


def partitions(tr: Trainer, seq_lens: list[int], pass_name: str) -> list[list[int]]:
    """Micro-batch index lists for one pass (``old_log_prob``/``ref``: log-prob settings; ``update_actor``:
    update settings).

    Raises:
        batching.InfeasibleError: dynamic bsz with a token budget below the longest sequence.
    """
    cfg = tr.cfg
    if pass_name == "update_actor":
        if cfg.use_dynamic_bsz:
            return batching.dynamic_micro_batches(seq_lens, cfg.ppo_max_token_len_per_gpu, "ppo_max_token_len_per_gpu")
        return batching.fixed_micro_batches(len(seq_lens), cfg.micro_batch_size_per_gpu)
    if cfg.use_dynamic_bsz:
        return batching.dynamic_micro_batches(
            seq_lens, cfg.log_prob_max_token_len_per_gpu, "log_prob_max_token_len_per_gpu"
        )
    return batching.fixed_micro_batches(len(seq_lens), cfg.log_prob_micro_batch_size_per_gpu)


def log_prob_pass(tr: Trainer, model: Any, seqs: list[Sequence], name: str, metrics: dict[str, Any]) -> torch.Tensor:
    """No-grad log-probs of all ``seqs`` under ``model``, micro-batched: (N, R) float32 on CPU."""
    lens = [int(s.input_ids.shape[0]) for s in seqs]
    parts = partitions(tr, lens, name)
    _record_pass(tr, metrics, name, parts, lens)
    out = torch.zeros((len(seqs), tr.cfg.max_response_length))
    with torch.no_grad():
        for p in parts:
            lp = response_log_probs(
                model, [seqs[i] for i in p], tr.ids, tr.cfg.max_response_length, tr.cfg.temperature, tr.device
            )
            out[p] = lp.float().cpu()
    return out


def _record_pass(tr: Trainer, metrics: dict[str, Any], name: str, parts: list[list[int]], lens: list[int]) -> None:
    st = batching.stats(parts, lens)
    metrics[f"perf/{name}/num_micro_batches"] = st.num_micro_batches
    metrics[f"perf/{name}/padded_tokens"] = st.padded_tokens
    metrics[f"perf/{name}/real_tokens"] = st.real_tokens
    tr.micro_batches[name].append(st.num_micro_batches)


def grpo_advantages(scores: torch.Tensor, response_mask: torch.Tensor, uids: np.ndarray) -> torch.Tensor:
    """verl's GRPO outcome advantage: ``(score - group mean) / (group std + 1e-6)`` on every response token.

    Args:
        scores: (N,) outcome rewards.
        response_mask: (N, R).
        uids: (N,) group id per row (object array).

    Returns:
        (N, R) advantages (``verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage``).
    """
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    token_rewards = token_level(scores, response_mask)
    adv, _ = compute_grpo_outcome_advantage(
        token_rewards, response_mask, uids, epsilon=1e-6, norm_adv_by_std_in_grpo=True
    )
    return adv


def token_level(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(N,) scores -> (N, R) with each score on the row's last response token (verl's reward manager)."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = response_mask.sum(-1).clamp(min=1) - 1
    out[torch.arange(len(scores)), last] = scores.float()
    return out


def update_actor(
    tr: Trainer, seqs: list[Sequence], batch: dict[str, torch.Tensor], metrics: dict[str, Any]
) -> dict[str, float]:
    """PPO-clip update with KL loss over mini-batches; returns ``actor/*`` metrics (mean over mini-batches).

    ``batch`` holds (N, R) tensors ``old_log_probs``, ``advantages``, ``response_mask`` and, with KL loss,
    ``ref_log_prob``.
    """
    from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty

    cfg, acfg = tr.cfg, tr.actor_cfg
    policy_loss_fn = get_policy_loss_fn(acfg.policy_loss.get("loss_mode", "vanilla"))
    mini = cfg.ppo_mini_batch_size * cfg.n
    n = len(seqs)
    lens = [int(s.input_ids.shape[0]) for s in seqs]
    tr.model.train()
    per_mini: dict[str, list[float]] = {}
    all_parts: list[list[int]] = []
    for start in range(0, n, mini):
        rows = list(range(start, min(start + mini, n)))
        parts = [[rows[j] for j in p] for p in partitions(tr, [lens[i] for i in rows], "update_actor")]
        all_parts += parts
        mask_mb = batch["response_mask"][rows]
        acfg.global_batch_info.update(
            dp_size=1, batch_num_tokens=int(mask_mb.sum()), global_batch_size=len(rows), loss_scale_factor=None
        )
        sums = {"actor/pg_loss": 0.0, "actor/kl_loss": 0.0}
        means: dict[str, list[float]] = {}
        tr.optimizer.zero_grad(set_to_none=True)
        for p in parts:
            log_prob = response_log_probs(
                tr.model, [seqs[i] for i in p], tr.ids, cfg.max_response_length, cfg.temperature, tr.device
            )
            mask = batch["response_mask"][p].to(log_prob.device).bool()
            old = batch["old_log_probs"][p].to(log_prob.device)
            adv = batch["advantages"][p].to(log_prob.device)
            pg_loss, pg_metrics = policy_loss_fn(
                old_log_prob=old,
                log_prob=log_prob,
                advantages=adv,
                response_mask=mask,
                loss_agg_mode=acfg.loss_agg_mode,
                config=acfg,
                rollout_is_weights=None,
            )
            loss = pg_loss
            sums["actor/pg_loss"] += float(pg_loss.detach())
            if cfg.use_kl_loss:
                ref = batch["ref_log_prob"][p].to(log_prob.device)
                kld = kl_penalty(logprob=log_prob, ref_logprob=ref, kl_penalty=acfg.kl_loss_type)
                kl_loss = agg_loss(
                    loss_mat=kld, loss_mask=mask, loss_agg_mode=acfg.loss_agg_mode, **acfg.global_batch_info
                )
                loss = loss + kl_loss * acfg.kl_loss_coef
                sums["actor/kl_loss"] += float(kl_loss.detach())
            loss.backward()
            for k, v in pg_metrics.items():
                means.setdefault(k, []).append(float(v))
        grad_norm = torch.nn.utils.clip_grad_norm_(tr.model.parameters(), max_norm=1.0)
        if torch.isfinite(grad_norm):
            tr.optimizer.step()
        mb_metrics = {**sums, **{k: float(np.mean(v)) for k, v in means.items()}, "actor/grad_norm": float(grad_norm)}
        if not cfg.use_kl_loss:
            mb_metrics.pop("actor/kl_loss")
        for k, v in mb_metrics.items():
            per_mini.setdefault(k, []).append(v)
    tr.model.eval()
    _record_pass(tr, metrics, "update_actor", all_parts, lens)
    out = {k: float(np.mean(v)) for k, v in per_mini.items()}
    if cfg.use_kl_loss:
        out["actor/kl_coef"] = cfg.kl_loss_coef
    out["actor/lr"] = cfg.lr
    return out


def memory_metrics(device: str) -> dict[str, float]:
    """verl's memory metrics (``verl/workers/engine_workers.py``), in GiB.

    ``perf/cpu_memory_used_gb`` is ``psutil.virtual_memory().used`` (the machine's used memory, as verl
    logs it); on ``cuda``/``npu`` also the device's peak allocated and reserved memory.
    """
    import psutil

    out = {"perf/cpu_memory_used_gb": psutil.virtual_memory().used / 1024**3}
    if device in ("cuda", "npu"):
        mod = torch.cuda if device == "cuda" else torch.npu  # type: ignore[attr-defined]
        out["perf/max_memory_allocated_gb"] = mod.max_memory_allocated() / 1024**3
        out["perf/max_memory_reserved_gb"] = mod.max_memory_reserved() / 1024**3
    return out


def run_step(
    tr: Trainer, items: list[PromptItem], encoded: list[EncodedPrompt]
) -> tuple[dict[str, Any], dict[str, float]]:
    """One GRPO step on the prompts ``items`` (already encoded). Returns ``(metrics, timing_s)``.

    Raises:
        batching.InfeasibleError: a dynamic-bsz token budget below a sequence of this batch.
    """
    from verl import DataProto
    from verl.trainer.ppo.metric_utils import compute_data_metrics, compute_throughout_metrics, compute_timing_metrics

    cfg = tr.cfg
    timing: dict[str, float] = {}
    metrics: dict[str, Any] = {}
    t_step, cpu_step = time.perf_counter(), time.process_time()
    with phase(timing, "gen", tr.device):
        ro: Rollout = generate(
            tr.model, encoded, cfg.n, tr.ids, cfg.max_prompt_length, cfg.max_response_length, cfg.temperature, tr.device
        )
    with phase(timing, "reward", tr.device):
        tok = getattr(tr.processor, "tokenizer", tr.processor)
        texts = tok.batch_decode([s.input_ids[s.prompt_len :] for s in ro.seqs], skip_special_tokens=True)
        scores = torch.tensor(
            [reward.score(items[i].data_source, t, items[i].ground_truth) for i, t in zip(ro.prompt_index, texts)]
        )
        token_scores = token_level(scores, ro.response_mask)
    with phase(timing, "old_log_prob", tr.device):
        old_lp = log_prob_pass(tr, tr.model, ro.seqs, "old_log_prob", metrics)
    batch = {"old_log_probs": old_lp, "response_mask": ro.response_mask}
    if cfg.use_kl_loss:
        with phase(timing, "ref", tr.device):
            batch["ref_log_prob"] = log_prob_pass(tr, tr.ref, ro.seqs, "ref", metrics)
    with phase(timing, "adv", tr.device):
        uids = np.array([f"p{items[i].index}" for i in ro.prompt_index], dtype=object)
        batch["advantages"] = grpo_advantages(scores, ro.response_mask, uids)
    with phase(timing, "update_actor", tr.device):
        if cfg.update_delay_s:
            # at the start of the phase, not the end: the speed probe taken right after the step must
            # time the machine after real work, not a CPU that just sat idle (caches cold)
            time.sleep(cfg.update_delay_s)
        actor_metrics = update_actor(tr, ro.seqs, batch, metrics)
    timing["step"] = time.perf_counter() - t_step
    # CPU seconds of this process over the step (user + sys, every thread: torch's intra-op threads included;
    # time.process_time = CLOCK_PROCESS_CPUTIME_ID, ns resolution; children excluded, the step spawns none), logged
    # beside the wall time as STEP_CPU (bench.measure.run_summary); not in ``timing``, which holds wall phases
    metrics[STEP_CPU] = time.process_time() - cpu_step

    dp = DataProto.from_dict(
        tensors={
            "prompts": ro.prompts,
            "responses": ro.responses,
            "attention_mask": ro.attention_mask,
            "response_mask": ro.response_mask,
            "token_level_scores": token_scores,
            "token_level_rewards": token_scores,
            "advantages": batch["advantages"],
            "returns": batch["advantages"],
        },
        meta_info={"global_token_num": ro.attention_mask.sum(-1).tolist()},
    )
    metrics.update(actor_metrics)
    metrics.update(compute_data_metrics(dp, use_critic=False))
    metrics.update(compute_timing_metrics(dp, timing))
    metrics.update(compute_throughout_metrics(dp, timing, n_gpus=1))
    metrics.update(memory_metrics(tr.device))
    return metrics, timing
