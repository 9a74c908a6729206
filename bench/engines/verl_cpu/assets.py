"""Model and data of the ``verl:cpu`` target, built locally on first use (no hub downloads).

``builtin:qwen3-tiny``: a randomly initialised 2-layer ``Qwen3ForCausalLM`` (hidden 128, 2 heads of 64,
fp32) with the byte-level BPE tokenizer and chat template of the embedded engine's tiny model
(:func:`bench.engines.builtins.model._train_tokenizer`), trained on the builtin arithmetic prompts.

``builtin:qwen3vl-tiny``: the embedded engine's tiny Qwen3-VL (4 layers, hidden 128, interleaved MRoPE,
a 2-block vision tower), built by the same builder (:func:`bench.engines.builtins.model.build_tiny`, in
the harness's environment) into the same cache folder, with its ``Qwen3VLProcessor`` saved beside it.
verl and vLLM load it in the verl CPU stack, where transformers' processor needs torchvision: the stack
gets torchvision 0.28.0 with ``--no-deps`` and the ``torchvision_op_schemas`` workaround
(:mod:`bench_patches.verl_cpu`).

``builtin:text`` data: the embedded engine's arithmetic prompts (:mod:`bench.engines.builtins.data`),
already in verl's RL parquet format (``data_source``, ``prompt`` chat messages, ``ability``,
``reward_model.ground_truth``, ``extra_info``). ``builtin:vl``: image + text prompts in verl's multimodal
RL parquet (the ``images`` column, ``<image>`` in the user message).

Both live under the bench cache (``$BENCH_CACHE_DIR`` or ``<repo>/.cache``) in folders named by a hash
of their recipe; a file lock makes concurrent builders wait for one build.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from bench.core.errors import BenchError, did_you_mean
from bench.engines.builtins import data as data_mod
from bench.engines.builtins.model import BUILTIN_MODEL as EMBEDDED_VL
from bench.engines.builtins.model import _train_tokenizer, ensure_builtin, resolve_model_path

BUILTIN_MODEL = "builtin:qwen3-tiny"
BUILTIN_VL_MODEL = "builtin:qwen3vl-tiny"
BUILTIN_MODELS = (BUILTIN_MODEL, BUILTIN_VL_MODEL)
BUILTIN_DATA = "builtin:text"
BUILTIN_VL_DATA = "builtin:vl"
RECIPE: dict[str, Any] = {
    "architecture": "Qwen3ForCausalLM",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "vocab_size_target": 1024,
    "seed": 0,
    "version": 1,
}


def cache_key() -> str:
    """12 hex digits of the model recipe (the cache folder suffix)."""
    return hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:12]


def model_dir(cache_dir: Path) -> Path:
    """Where ``builtin:qwen3-tiny`` lives in ``cache_dir``."""
    return Path(cache_dir) / "models" / f"qwen3-tiny-{cache_key()}"


def build_model(out_dir: Path, cache_dir: Path) -> None:
    """Build tokenizer + random-weight tiny Qwen3 into ``out_dir`` (seconds on 2 cores)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    items = data_mod.load_prompts(data_mod.builtin_path(BUILTIN_DATA, cache_dir))
    texts = [m["content"] for it in items for m in it.messages]
    texts += [it.answer or it.ground_truth for it in items] + ["user", "assistant", "system"]
    tokenizer = _train_tokenizer(texts, RECIPE["vocab_size_target"])
    pad, eos = tokenizer.convert_tokens_to_ids("<|endoftext|>"), tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=RECIPE["hidden_size"],
        intermediate_size=RECIPE["intermediate_size"],
        num_hidden_layers=RECIPE["num_hidden_layers"],
        num_attention_heads=RECIPE["num_attention_heads"],
        num_key_value_heads=RECIPE["num_key_value_heads"],
        head_dim=RECIPE["head_dim"],
        max_position_embeddings=RECIPE["max_position_embeddings"],
        rms_norm_eps=RECIPE["rms_norm_eps"],
        rope_theta=RECIPE["rope_theta"],
        tie_word_embeddings=RECIPE["tie_word_embeddings"],
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
        torch_dtype="float32",
    )
    torch.manual_seed(RECIPE["seed"])
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = [eos, pad]
    model.generation_config.pad_token_id = pad
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "bench_recipe.json").write_text(json.dumps({"key": cache_key(), "recipe": RECIPE}, indent=1))


def ensure_model(cache_dir: Path) -> Path:
    """Path of ``builtin:qwen3-tiny`` in ``cache_dir``, built first when absent.

    Raises:
        BenchError: the build failed (message says why).
    """
    from filelock import FileLock

    path = model_dir(cache_dir)
    if (path / "config.json").is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if (path / "config.json").is_file():
            return path
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            build_model(tmp, cache_dir)
            os.replace(tmp, path)
        except Exception as exc:
            raise BenchError(f"model: building {BUILTIN_MODEL} failed: {type(exc).__name__}: {exc}") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def vl_model_dir(cache_dir: Path) -> Path:
    """Where ``builtin:qwen3vl-tiny`` lives in ``cache_dir`` (the embedded engine's folder of the same model)."""
    return resolve_model_path(EMBEDDED_VL, Path(cache_dir))[0]


def ensure_vl_model(cache_dir: Path) -> Path:
    """Path of ``builtin:qwen3vl-tiny`` (model + processor) in ``cache_dir``, built first when absent.

    Raises:
        BenchError: the build failed (message says why).
    """
    path = vl_model_dir(cache_dir)
    try:
        ensure_builtin(path, Path(cache_dir))
    except BenchError:
        raise
    except Exception as exc:
        raise BenchError(f"model: building {BUILTIN_VL_MODEL} failed: {type(exc).__name__}: {exc}") from None
    return path


def model_relpath(spec: str) -> str:
    """``models/<name>-<hash>`` of a builtin model inside the cache folder (POSIX path).

    Raises:
        BenchError: an unknown builtin name.
    """
    if spec == BUILTIN_MODEL:
        return model_dir(Path("")).as_posix()
    if spec == BUILTIN_VL_MODEL:
        return vl_model_dir(Path("")).as_posix()
    raise BenchError(f"base.model: unknown builtin model {spec!r}{did_you_mean(spec, BUILTIN_MODELS)} for engine "
                     f"verl (allowed: {', '.join(BUILTIN_MODELS)})")


def ensure_data(cache_dir: Path) -> Path:
    """Path of the ``builtin:text`` RL parquet in ``cache_dir`` (generated when absent)."""
    return data_mod.builtin_path(BUILTIN_DATA, cache_dir)


def reward_file() -> Path:
    """The reward function file verl loads (:mod:`bench.engines.verl_cpu.reward`)."""
    return Path(__file__).with_name("reward.py")
