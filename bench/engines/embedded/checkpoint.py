"""Loading a checkpoint into the embedded engine: the built-in tiny model (:mod:`bench.engines.builtins.model`)
or any local Hugging Face checkpoint, and the token ids its rollout needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.core.errors import BenchError


def load(path: Path, device: str) -> tuple[Any, Any]:
    """``from_pretrained`` model (float32, eval mode, on ``device``) and processor/tokenizer from ``path``.

    Vision-language checkpoints (config with ``vision_config``) load with ``AutoModelForImageTextToText``
    and ``AutoProcessor``; text-only ones with ``AutoModelForCausalLM`` and ``AutoTokenizer``.

    Raises:
        BenchError: the checkpoint cannot be loaded (message from transformers, first line).
    """
    import torch
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(path)
        if hasattr(cfg, "vision_config"):
            from transformers import AutoModelForImageTextToText as AutoModel
            from transformers import AutoProcessor as AutoProc
        else:
            from transformers import AutoModelForCausalLM as AutoModel
            from transformers import AutoTokenizer as AutoProc
        processor = AutoProc.from_pretrained(path)
        model = AutoModel.from_pretrained(path, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as exc:
        raise BenchError(f"model: cannot load {path}: {str(exc).splitlines()[0]}") from None
    model.to(device)
    model.eval()
    return model, processor


def token_ids(model: Any, processor: Any) -> "Any":
    """The :class:`~bench.engines.builtins.sequences.TokenIds` of a loaded model (pad, image, EOS ids).

    EOS ids are the generation config's ``eos_token_id`` (int or list) plus the tokenizer's EOS.
    """
    from bench.engines.builtins.sequences import TokenIds  # deferred: bench.engines.builtins.sequences loads torch

    tok = getattr(processor, "tokenizer", processor)
    eos = model.generation_config.eos_token_id
    eos = list(eos) if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else [])
    if tok.eos_token_id is not None and tok.eos_token_id not in eos:
        eos.append(tok.eos_token_id)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    image = getattr(model.config, "image_token_id", None)
    vision = [getattr(model.config, k, None) for k in ("image_token_id", "video_token_id", "vision_start_token_id",
                                                       "vision_end_token_id")]
    return TokenIds(pad=int(pad), image=None if image is None else int(image), eos=tuple(int(e) for e in eos),
                    vision=tuple(int(v) for v in vision if v is not None))
