"""The built-in model ``builtin:qwen3vl-tiny``: build it once (cached) and find it; shared by the engines.

``builtin:qwen3vl-tiny`` is built offline from ``qwen3vl_tiny.json``:

1. a byte-level BPE tokenizer trained with ``tokenizers`` on the builtin prompt sets (special tokens
   ``<|endoftext|> <|im_start|> <|im_end|> <|vision_start|> <|vision_end|> <|image_pad|> <|video_pad|>``),
   wrapped in ``PreTrainedTokenizerFast`` with a Qwen-style chat template;
2. ``Qwen2VLImageProcessor`` (patch 16, merge 2) + ``Qwen3VLVideoProcessor`` -> ``Qwen3VLProcessor``;
3. ``Qwen3VLConfig`` from the JSON, special token ids filled in; random init with a fixed seed;
4. a short supervised warm start on the reference answers (``extra_info.answer``) of ``builtin:shapes`` and
   ``builtin:text``, so that sampled responses end with EOS at a spread of lengths;
5. ``save_pretrained`` of model and processor into ``<cache>/models/qwen3vl-tiny-<hash>``, where the hash
   covers the JSON and the data recipe. The build runs under a ``filelock`` and is renamed into place,
   so concurrent runs build it once.

Every run then loads it with ``from_pretrained``, the same path a real checkpoint takes (the embedded
engine: :mod:`bench.engines.embedded.checkpoint`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from bench.core.errors import BenchError
from bench.engines.common import default_cache_dir  # noqa: F401  (re-exported: the models' cache)

from . import data as data_mod

BUILTIN_MODEL = "builtin:qwen3vl-tiny"
TINY_CONFIG = Path(__file__).with_name("qwen3vl_tiny.json")
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for c in message['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

log = logging.getLogger("bench.embedded")


def tiny_recipe() -> dict[str, Any]:
    """The parsed ``qwen3vl_tiny.json``."""
    return json.loads(TINY_CONFIG.read_text())


def tiny_cache_key(recipe: dict[str, Any] | None = None) -> str:
    """12-hex hash of the model recipe plus the data recipe version (the cache folder suffix)."""
    recipe = recipe if recipe is not None else tiny_recipe()
    blob = json.dumps({"model": recipe, "data": data_mod.DATA_RECIPE_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def resolve_model_path(spec: str, cache_dir: Path) -> tuple[Path, bool]:
    """Where the model lives; returns ``(path, needs_build)``. Builds nothing.

    Raises:
        BenchError: a path that does not exist or has no ``config.json``; an unknown ``builtin:`` name.
    """
    if spec == BUILTIN_MODEL:
        path = cache_dir / "models" / f"qwen3vl-tiny-{tiny_cache_key()}"
        return path, not (path / "config.json").is_file()
    if spec.startswith("builtin:"):
        raise BenchError(f"model: unknown builtin model {spec!r}; use {BUILTIN_MODEL} or a checkpoint path")
    path = Path(spec).expanduser()
    if not path.exists():
        raise BenchError(f"model: model path not found: {spec}")
    if not (path / "config.json").is_file():
        raise BenchError(f"model: {spec} is not a Hugging Face checkpoint (no config.json)")
    return path, False


def ensure_builtin(path: Path, cache_dir: Path) -> float:
    """Build the tiny model into ``path`` unless present; returns the seconds spent building (0 if cached)."""
    from filelock import FileLock

    if (path / "config.json").is_file():
        return 0.0
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if (path / "config.json").is_file():
            return 0.0
        import torch

        t0 = time.perf_counter()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        # One intra-op thread: these tiny kernels gain little from two, and two threads stall badly
        # whenever another process holds a core (measured: 0.15 s vs up to 2.7 s per warm-start step).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            build_tiny(tmp, cache_dir)
            shutil.rmtree(path, ignore_errors=True)  # an incomplete folder (no config.json) from elsewhere
            os.replace(tmp, path)
        finally:
            torch.set_num_threads(threads)
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("built %s in %.1f s", path.name, time.perf_counter() - t0)
        return time.perf_counter() - t0


def _train_tokenizer(texts: list[str], vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


def build_tiny(out_dir: Path, cache_dir: Path) -> None:
    """Build tokenizer, processor and warm-started ``Qwen3VLForConditionalGeneration`` into ``out_dir``.

    Takes well under a minute on 2 CPU cores (the warm start dominates).
    """
    import torch
    from transformers import (
        PreTrainedTokenizerFast,  # noqa: F401  (import check: fast tokenizers present)
        Qwen2VLImageProcessor,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLProcessor,
    )
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    recipe = tiny_recipe()
    items = []
    for name in ("builtin:shapes", "builtin:text"):
        items += data_mod.load_prompts(data_mod.builtin_path(name, cache_dir))
    texts = [m["content"].replace(data_mod.IMAGE_PLACEHOLDER, "") for it in items for m in it.messages]
    texts += [it.answer or it.ground_truth for it in items] + ["user", "assistant", "system"]
    tokenizer = _train_tokenizer(texts, recipe["tokenizer"]["vocab_size"])
    image_processor = Qwen2VLImageProcessor(**recipe["image_processor"])
    processor = Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(),
        chat_template=CHAT_TEMPLATE,
    )
    tid = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text_cfg = dict(recipe["text_config"])
    text_cfg.update(
        vocab_size=len(tokenizer),
        eos_token_id=tid["<|im_end|>"],
        pad_token_id=tid["<|endoftext|>"],
        bos_token_id=None,
    )
    config = Qwen3VLConfig(
        text_config=text_cfg,
        vision_config=recipe["vision_config"],
        image_token_id=tid["<|image_pad|>"],
        video_token_id=tid["<|video_pad|>"],
        vision_start_token_id=tid["<|vision_start|>"],
        vision_end_token_id=tid["<|vision_end|>"],
        tie_word_embeddings=recipe["text_config"].get("tie_word_embeddings", False),
    )
    torch.manual_seed(recipe["seed"])
    model = Qwen3VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = [tid["<|im_end|>"], tid["<|endoftext|>"]]
    model.generation_config.pad_token_id = tid["<|endoftext|>"]
    _warm_start(model, processor, items, recipe["warm_start"], tid, seed=recipe["seed"])
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    (out_dir / "bench_recipe.json").write_text(json.dumps({"key": tiny_cache_key(recipe), "recipe": recipe}, indent=1))


def _warm_start(model: Any, processor: Any, items: list, ws: dict, tid: dict, seed: int) -> None:
    """Supervised pass on ``prompt -> answer<|im_end|>``; loss on answer tokens only (HF ``labels``)."""
    import random

    import torch

    from .sequences import Sequence, TokenIds, pack  # deferred: bench.engines.builtins.sequences loads torch

    ids = TokenIds(pad=tid["<|endoftext|>"], image=tid["<|image_pad|>"], eos=(tid["<|im_end|>"],))
    tok = processor.tokenizer
    seqs = []
    for it in items:
        enc = data_mod.encode_prompt(processor, it)
        ans = tok(it.answer or it.ground_truth, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
        full = torch.cat([enc.input_ids, ans, torch.tensor([tid["<|im_end|>"]])])
        seqs.append(Sequence(full, int(enc.input_ids.shape[0]), enc.pixel_values, enc.image_grid_thw))
    # Only the language model learns here: the aim is the answer format and its EOS, not vision skill.
    frozen = [p for n, p in model.named_parameters() if ".visual." in f".{n}"]
    for p in frozen:
        p.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=ws["lr"], weight_decay=ws.get("weight_decay", 0.0))
    rng = random.Random(seed)
    model.train()
    t0, bs = time.perf_counter(), ws["batch_size"]
    for step in range(ws["steps"]):
        batch = rng.sample(seqs, bs)
        inputs = pack(batch, ids, "cpu")
        labels = inputs["input_ids"].clone()
        for i, s in enumerate(batch):
            labels[i, : s.prompt_len] = -100
            labels[i, s.input_ids.shape[0] :] = -100
        loss = model(**inputs, labels=labels, use_cache=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 50 == 0 or step == ws["steps"] - 1:
            log.info(
                "warm start step %d/%d loss %.3f (%.1f s)", step + 1, ws["steps"], loss.item(), time.perf_counter() - t0
            )
    for p in frozen:
        p.requires_grad_(True)
    model.eval()

