"""Embedded engine, in process: GRPO advantages, dynamic micro-batching, fused RMSNorm, data validation."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("verl") is None:  # found, not imported: the tests import it (seconds)
    pytest.skip("could not import 'verl': not installed", allow_module_level=True)

from bench.core.errors import BenchError  # noqa: E402
from bench.engines.builtins import data  # noqa: E402
from bench.engines.embedded import batching, fused  # noqa: E402
from bench.engines.embedded.step import grpo_advantages, token_level  # noqa: E402

# --------------------------------------------------------------------------- GRPO advantages


def test_grpo_advantages_match_verl_and_are_zero_mean_per_group():
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    resp_len = torch.tensor([3, 5, 1, 8, 2, 2, 6, 4])
    mask = (torch.arange(8).unsqueeze(0) < resp_len.unsqueeze(1)).long()
    uids = np.array(["a"] * 4 + ["b"] * 4, dtype=object)

    ours = grpo_advantages(scores, mask, uids)
    ref, _ = compute_grpo_outcome_advantage(token_level(scores, mask), mask, uids, epsilon=1e-6)
    torch.testing.assert_close(ours, ref)

    # hand values: group a = [1,0,0,0]: mean 0.25, unbiased std 0.5 -> +1.5 / -0.5
    per_seq = ours[:, 0]
    torch.testing.assert_close(per_seq[:4], torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5, rtol=0)
    torch.testing.assert_close(per_seq[4:], torch.tensor([0.5, 0.5, -1.5, 0.5]), atol=1e-5, rtol=0)
    for g in (slice(0, 4), slice(4, 8)):
        assert abs(float(per_seq[g].sum())) < 1e-5
    # constant over each response, zero past it
    assert torch.equal(ours != 0, mask.bool())


def test_token_level_puts_score_on_last_response_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    out = token_level(torch.tensor([2.0, 3.0]), mask)
    assert out.tolist() == [[0.0, 0.0, 2.0, 0.0], [3.0, 0.0, 0.0, 0.0]]


# --------------------------------------------------------------------------- micro-batching

SKEWED = [160, 20, 20, 20, 20, 20, 20, 20]  # one long sequence, seven short ones


def test_dynamic_bsz_pads_less_than_fixed_on_skewed_batch():
    fixed = batching.fixed_micro_batches(len(SKEWED), 4)
    dyn = batching.dynamic_micro_batches(SKEWED, max_token_len=160)

    fs, ds = batching.stats(fixed, SKEWED), batching.stats(dyn, SKEWED)
    # fixed: [160,20,20,20] -> 4*160, [20]*4 -> 4*20
    assert fs == batching.PassStats(num_micro_batches=2, padded_tokens=720, real_tokens=300)
    # verl's balanced partition isolates the long sequence: {160}, {20 x 7}
    assert ds == batching.PassStats(num_micro_batches=2, padded_tokens=300, real_tokens=300)
    assert sorted(map(sorted, dyn)) == [[0], [1, 2, 3, 4, 5, 6, 7]]
    assert sorted(i for p in dyn for i in p) == list(range(len(SKEWED)))


@pytest.mark.parametrize("limit", [160, 200, 320, 1000])
def test_dynamic_micro_batches_never_exceed_the_token_limit(limit):
    rng = np.random.default_rng(limit)
    lens = rng.integers(20, 161, size=32).tolist()
    parts = batching.dynamic_micro_batches(lens, max_token_len=limit)
    assert all(sum(lens[i] for i in p) <= limit for p in parts)
    assert sorted(i for p in parts for i in p) == list(range(32))
    assert len(parts) >= -(-sum(lens) // limit)


def test_dynamic_limit_below_longest_sequence_is_infeasible():
    with pytest.raises(
        batching.InfeasibleError, match=r"ppo_max_token_len_per_gpu=100 .* longest sequence \(160 tokens\)"
    ):
        batching.dynamic_micro_batches(SKEWED, 100, "ppo_max_token_len_per_gpu")


# --------------------------------------------------------------------------- fused RMSNorm


def _tiny_model():
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from bench.engines.builtins.model import tiny_recipe

    r = tiny_recipe()
    cfg = Qwen3VLConfig(
        text_config={**r["text_config"], "vocab_size": 300, "pad_token_id": 0, "eos_token_id": 2},
        vision_config=r["vision_config"],
        image_token_id=5,
        video_token_id=6,
        vision_start_token_id=3,
        vision_end_token_id=4,
    )
    torch.manual_seed(0)
    return Qwen3VLForConditionalGeneration(cfg).eval()


def test_fused_rmsnorm_module_equals_eager():
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRMSNorm

    torch.manual_seed(0)
    norm = Qwen3VLTextRMSNorm(128, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(4, 7, 128) * 3
    eager = norm(x)
    ev = fused.install_fused_rmsnorm(torch.nn.ModuleDict({"n": norm}), "cpu")
    assert ev["modules"] == 1 and ev["forward"] == "torch.nn.functional.rms_norm"
    assert fused.installed_forward(norm) == "torch.nn.functional.rms_norm"
    torch.testing.assert_close(norm(x), eager, atol=1e-5, rtol=1e-5)


def test_fused_rmsnorm_model_logits_equal_eager():
    model = _tiny_model()
    patched = copy.deepcopy(model)
    ev = fused.install_fused_rmsnorm(patched, "cpu")
    # 4 layers x (input, post-attention, q_norm, k_norm) + final norm; the vision tower has none
    assert ev == {
        "enabled": True,
        "forward": "torch.nn.functional.rms_norm",
        "modules": 17,
        "classes": ["Qwen3VLTextRMSNorm"],
    }
    assert fused.describe_eager(model)["forward"] == "Qwen3VLTextRMSNorm.forward"
    ids = torch.randint(7, 300, (2, 24))
    with torch.no_grad():
        a = model(input_ids=ids).logits
        b = patched(input_ids=ids).logits
    assert not torch.equal(a, torch.zeros_like(a))
    torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------- data


def test_builtin_prompt_lengths_vary_and_rows_follow_verl_schema():
    rows = data.generate_rows("builtin:shapes", n=32, seed=0)
    assert {"data_source", "prompt", "images", "ability", "reward_model", "extra_info"} <= set(rows[0])
    assert all(r["prompt"][0]["content"].startswith("<image>") for r in rows)
    assert len({len(r["prompt"][0]["content"]) for r in rows}) > 5
    sizes = set()
    from io import BytesIO

    from PIL import Image

    for r in rows:
        sizes.add(Image.open(BytesIO(r["images"][0]["bytes"])).size)
    assert len(sizes) >= 3  # 4..16 image tokens


def test_parquet_without_required_column_names_it(tmp_path: Path):
    rows = data.generate_rows("builtin:text", n=4)
    for r in rows:
        del r["reward_model"]
    path = tmp_path / "bad.parquet"
    data.write_parquet(rows, path)
    with pytest.raises(BenchError, match="missing required column 'reward_model'"):
        data.load_prompts(path)


def test_parquet_roundtrip_loads_any_verl_rows(tmp_path: Path):
    rows = data.generate_rows("builtin:shapes", n=6)
    path = tmp_path / "ok.parquet"
    data.write_parquet(rows, path)
    items = data.load_prompts(path)
    assert [it.ground_truth for it in items] == [r["reward_model"]["ground_truth"] for r in rows]
    assert all(len(it.images) == 1 and it.images[0][:4] == b"\x89PNG" for it in items)
    msgs = data.chat_messages(items[0])
    assert msgs[0]["content"][0] == {"type": "image"} and msgs[0]["content"][1]["type"] == "text"
    assert json.dumps(msgs)  # plain data


# --------------------------------------------------------------------------- update


def test_update_loss_and_grad_norm_do_not_depend_on_micro_batching():
    """verl's global-token normalisation: the same mini-batch gives the same loss and gradient
    whether it is split in 8, 2 or 1 fixed micro-batches or by a token budget."""
    from bench.engines.builtins.sequences import Sequence, TokenIds
    from bench.engines.embedded.config import RunConfig
    from bench.engines.embedded.forward import response_log_probs
    from bench.engines.embedded.step import make_trainer, update_actor

    model = _tiny_model()
    ids = TokenIds(pad=0, image=5, eos=(2,))
    gen = torch.Generator().manual_seed(1)
    seqs = []
    for i in range(8):
        p, r = 5 + i % 4, 1 + (3 * i) % 10
        seqs.append(Sequence(torch.randint(7, 300, (p + r,), generator=gen), p))
    R = 10
    mask = torch.zeros(8, R, dtype=torch.long)
    for i, s in enumerate(seqs):
        mask[i, : s.response_len] = 1
    with torch.no_grad():
        old = response_log_probs(model, seqs, ids, R, 1.0, "cpu")
    adv = torch.randn(8, 1, generator=gen) * mask
    batch = {"old_log_probs": old, "advantages": adv, "response_mask": mask, "ref_log_prob": old - 0.05 * mask}

    base = dict(train_batch_size=2, n=4, ppo_mini_batch_size=2, max_response_length=R, max_prompt_length=16)
    results = {}
    for name, extra in {
        "fixed1": {"micro_batch_size_per_gpu": 1},
        "fixed2": {"micro_batch_size_per_gpu": 2},
        "fixed8": {"micro_batch_size_per_gpu": 8},
        "dynamic": {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 40},
    }.items():
        metrics: dict = {}
        tr = make_trainer(RunConfig(**base, **extra), copy.deepcopy(model), None, None, ids, "cpu")
        results[name] = update_actor(tr, seqs, batch, metrics)
        results[name]["mbs"] = metrics["perf/update_actor/num_micro_batches"]
    assert [results[k]["mbs"] for k in ("fixed1", "fixed2", "fixed8")] == [8, 4, 1]
    assert 1 < results["dynamic"]["mbs"] < 8
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
        vals = [results[k][key] for k in results]
        assert vals[0] != 0.0
        assert max(vals) - min(vals) < 1e-5 * max(1.0, abs(vals[0])), (key, vals)
