"""Prompt data of the engines: the builtin generated sets and any verl RL parquet (read and encoded).

verl's RL parquet schema (``verl/utils/dataset/rl_dataset.py``, ``examples/data_preprocess/geo3k.py``):
``data_source`` (str), ``prompt`` (chat messages; ``<image>`` in a message marks where an image goes),
``images`` (optional; list of ``{"bytes": <png/jpeg>, "path": ...}``), ``ability`` (str),
``reward_model`` (``{"style": "rule", "ground_truth": str}``) and ``extra_info`` (dict).

Builtin sets (generated once, cached as parquet under the cache folder):

- ``builtin:shapes``: rendered images of coloured circles/squares/triangles with a counting or
  counting-plus-arithmetic question; image sizes 64..128 px so prompts carry 4..16 image tokens.
- ``builtin:text``: text-only arithmetic word problems.
- ``builtin:vl``: the ``builtin:shapes`` recipe under ``data_source`` ``bench/vl``: one image per prompt, the
  ``<image>`` placeholder in the user message and the ``images`` column, as verl's multimodal examples
  write it; the image + text data of the ``verl:cpu`` VL target.

Questions and reference answers come in several phrasings, so prompt and answer lengths vary.
Only numpy/pyarrow/PIL are imported here; ``transformers`` is touched only through the processor
object handed to :func:`encode_prompt`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.core.errors import BenchError

DATA_RECIPE_VERSION = 2
BUILTIN_SIZE = 256
REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")
IMAGE_PLACEHOLDER = "<image>"

_COLORS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 220)}
_SHAPES = ("circle", "square", "triangle")
_SIZES = ((64, 64), (64, 96), (96, 96), (96, 128), (128, 128))


@dataclass
class PromptItem:
    """One RL prompt.

    Attributes:
        index: row number in the dataset.
        data_source: ``data_source`` column (selects the reward rule).
        messages: chat messages as stored (``content`` is a string that may hold ``<image>``).
        images: encoded image files (PNG/JPEG bytes), in placeholder order.
        ground_truth: ``reward_model.ground_truth`` as a string.
        answer: reference answer text (``extra_info.answer``) or ``None``.
    """

    index: int
    data_source: str
    messages: list[dict[str, Any]]
    images: list[bytes] = field(default_factory=list)
    ground_truth: str = ""
    answer: str | None = None


# --------------------------------------------------------------------------- builtin generation


def _draw_shape(draw: Any, kind: str, box: tuple[int, int, int, int], rgb: tuple[int, int, int]) -> None:
    x0, y0, x1, y1 = box
    if kind == "circle":
        draw.ellipse(box, fill=rgb)
    elif kind == "square":
        draw.rectangle(box, fill=rgb)
    else:
        draw.polygon([((x0 + x1) // 2, y0), (x1, y1), (x0, y1)], fill=rgb)


def _render(rng: random.Random) -> tuple[bytes, list[tuple[str, str]]]:
    """Render one image with 1..5 non-overlapping shapes; returns (PNG bytes, [(color, shape)])."""
    from PIL import Image, ImageDraw

    w, h = rng.choice(_SIZES)
    img = Image.new("RGB", (w, h), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    cell = 32
    cells = [(cx, cy) for cx in range(w // cell) for cy in range(h // cell)]
    rng.shuffle(cells)
    objs = []
    for cx, cy in cells[: rng.randint(1, min(5, len(cells)))]:
        color, kind = rng.choice(list(_COLORS)), rng.choice(_SHAPES)
        size = rng.randint(14, 26)
        x0 = cx * cell + rng.randint(1, cell - size - 1)
        y0 = cy * cell + rng.randint(1, cell - size - 1)
        _draw_shape(draw, kind, (x0, y0, x0 + size, y0 + size), _COLORS[color])
        objs.append((color, kind))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue(), objs


def _shapes_row(i: int, rng: random.Random) -> dict[str, Any]:
    png, objs = _render(rng)
    color, kind = rng.choice(objs)
    n_kind = sum(1 for _, k in objs if k == kind)
    n_color = sum(1 for c, _ in objs if c == color)
    n_both = sum(1 for o in objs if o == (color, kind))
    q = rng.randrange(4)
    if q == 0:
        question, gt = f"How many {color} {kind}s are in the image?", n_both
        long = f"I count {gt} {color} {kind}s in the image. The answer is {gt}."
    elif q == 1:
        question, gt = "How many shapes are there?", len(objs)
        long = f"There are {gt} shapes in total. The answer is {gt}."
    elif q == 2:
        a = rng.randint(1, 9)
        question, gt = f"Count the {kind}s in the picture, then add {a}. What number do you get?", n_kind + a
        long = f"There are {n_kind} {kind}s, and {n_kind} plus {a} is {gt}. The answer is {gt}."
    else:
        question = (
            "Look at the picture. Several coloured shapes are drawn on a white background. "
            f"How many of them are {color}? Answer with a single number."
        )
        gt = n_color
        long = f"The {color} shapes are counted one by one: there are {gt} of them. The answer is {gt}."
    listing = ", ".join(f"a {c} {k}" for c, k in objs)
    steps = f"Let me list the shapes in the image: {listing}. {long}"
    answer = rng.choice([str(gt), f"The answer is {gt}.", long, steps])
    return {
        "data_source": "bench/shapes",
        "prompt": [{"role": "user", "content": IMAGE_PLACEHOLDER + question}],
        "images": [{"bytes": png, "path": None}],
        "ability": "counting",
        "reward_model": {"style": "rule", "ground_truth": str(gt)},
        "extra_info": {"split": "train", "index": i, "question": question, "answer": answer},
    }


def _text_row(i: int, rng: random.Random) -> dict[str, Any]:
    a, b = rng.randint(2, 40), rng.randint(2, 40)
    q = rng.randrange(4)
    if q == 0:
        question, gt, long = f"What is {a} plus {b}?", a + b, f"{a} plus {b} is {a + b}. The answer is {a + b}."
    elif q == 1:
        a, b = a % 10 + 1, b % 10 + 1
        question, gt, long = f"Compute {a} times {b}.", a * b, f"{a} times {b} is {a * b}. The answer is {a * b}."
    elif q == 2:
        c = rng.randint(1, a + b - 1)
        question = (
            f"Tom has {a} apples. He buys {b} more apples and then gives {c} away. How many apples does Tom have now?"
        )
        gt = a + b - c
        long = f"Tom has {a} plus {b}, that is {a + b} apples, and {a + b} minus {c} is {gt}. The answer is {gt}."
    else:
        a, b = max(a, b), min(a, b)
        question, gt, long = f"What is {a} minus {b}?", a - b, f"{a} minus {b} is {a - b}. The answer is {a - b}."
    steps = f"Let me work it out step by step. The question is: {question} {long}"
    answer = rng.choice([str(gt), f"The answer is {gt}.", long, steps])
    return {
        "data_source": "bench/text",
        "prompt": [{"role": "user", "content": question}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": str(gt)},
        "extra_info": {"split": "train", "index": i, "question": question, "answer": answer},
    }


def _vl_row(i: int, rng: random.Random) -> dict[str, Any]:
    """A ``builtin:vl`` row: a ``builtin:shapes`` image question under its own ``data_source`` (the multimodal
    RL parquet of the ``verl:cpu`` target; same layout as verl's ``examples/data_preprocess/geo3k.py``)."""
    row = _shapes_row(i, rng)
    row["data_source"] = "bench/vl"
    return row


BUILTINS = {"builtin:shapes": _shapes_row, "builtin:text": _text_row, "builtin:vl": _vl_row}


def generate_rows(name: str, n: int = BUILTIN_SIZE, seed: int = 0) -> list[dict[str, Any]]:
    """Generate ``n`` rows of builtin set ``name`` (``builtin:shapes`` | ``builtin:text``), deterministic in ``seed``.

    Raises:
        BenchError: unknown builtin name.
    """
    if name not in BUILTINS:
        raise BenchError(
            f"data: unknown builtin dataset {name!r}; choose one of {', '.join(BUILTINS)} or a parquet path"
        )
    rng = random.Random(f"{name}:{seed}")
    return [BUILTINS[name](i, rng) for i in range(n)]


def write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    """Write rows to ``path`` atomically (temp file + rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, path)


def builtin_relpath(name: str, seed: int = 0) -> str:
    """``data/<set>-<hash>.parquet``: where builtin set ``name`` lives inside the cache folder (the hash
    covers name, size, seed and recipe version, so a recipe change rebuilds)."""
    key = hashlib.sha256(json.dumps([name, BUILTIN_SIZE, seed, DATA_RECIPE_VERSION]).encode()).hexdigest()[:12]
    return f"data/{name.split(':', 1)[1]}-{key}.parquet"


def builtin_path(name: str, cache_dir: Path, seed: int = 0) -> Path:
    """Path of the cached parquet of builtin set ``name``; generates it (under a file lock) if absent.

    The file name holds a hash of (name, size, seed, recipe version), so a recipe change rebuilds.
    """
    from filelock import FileLock

    path = cache_dir / builtin_relpath(name, seed)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if not path.exists():
            write_parquet(generate_rows(name, BUILTIN_SIZE, seed), path)
    return path


# --------------------------------------------------------------------------- loading


def resolve_data_path(spec: str, cache_dir: Path) -> Path:
    """Turn a ``data`` setting into a parquet path (building builtin sets).

    Raises:
        BenchError: unknown builtin name, or the path does not exist.
    """
    if spec.startswith("builtin:"):
        return builtin_path(spec, cache_dir)
    path = Path(spec).expanduser()
    if not path.is_file():
        raise BenchError(f"data: dataset file not found: {spec}")
    return path


def load_prompts(path: Path) -> list[PromptItem]:
    """Read and validate a verl RL parquet into :class:`PromptItem` rows.

    Raises:
        BenchError: unreadable file, a missing required column (named), no ``ground_truth`` in
            ``reward_model``, a malformed ``prompt``, or an empty dataset.
    """
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path).read()  # not pq.read_table: that imports pyarrow.dataset and pandas (~1.5 s)
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise BenchError(f"{path}: cannot read parquet: {str(exc).splitlines()[0]}") from None
    for col in REQUIRED_COLUMNS:
        if col not in table.column_names:
            raise BenchError(
                f"{path}: dataset is missing required column '{col}' "
                f"(verl RL parquet needs {', '.join(REQUIRED_COLUMNS)}; has {', '.join(table.column_names)})"
            )
    if table.num_rows == 0:
        raise BenchError(f"{path}: dataset has no rows")
    has_images = "images" in table.column_names
    items = []
    for i, row in enumerate(table.to_pylist()):
        rm = row["reward_model"]
        if not isinstance(rm, dict) or rm.get("ground_truth") is None:
            raise BenchError(f"{path}: row {i}: column 'reward_model' has no 'ground_truth'")
        msgs = row["prompt"]
        if isinstance(msgs, str):
            msgs = [{"role": "user", "content": msgs}]
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and "content" in m for m in msgs):
            raise BenchError(f"{path}: row {i}: column 'prompt' must be a list of chat messages with 'content'")
        images = []
        for img in (row.get("images") or []) if has_images else []:
            data = img.get("bytes") if isinstance(img, dict) else img
            if not isinstance(data, (bytes, bytearray)):
                raise BenchError(f"{path}: row {i}: column 'images' entries must hold encoded image 'bytes'")
            images.append(bytes(data))
        n_ph = sum(str(m["content"]).count(IMAGE_PLACEHOLDER) for m in msgs)
        if n_ph != len(images):
            raise BenchError(f"{path}: row {i}: prompt has {n_ph} '<image>' placeholders but {len(images)} images")
        extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
        items.append(
            PromptItem(
                index=i,
                data_source=str(row["data_source"]),
                messages=[{"role": m.get("role") or "user", "content": str(m["content"])} for m in msgs],
                images=images,
                ground_truth=str(rm["ground_truth"]),
                answer=extra.get("answer"),
            )
        )
    return items


# --------------------------------------------------------------------------- encoding


@dataclass
class EncodedPrompt:
    """A tokenized prompt.

    Attributes:
        input_ids: (P,) int64 token ids, image placeholders expanded to one ``<|image_pad|>`` per merged patch.
        pixel_values: (num_patches, C*T*ps*ps) float32 or ``None`` (text-only).
        image_grid_thw: (num_images, 3) int64 or ``None``.
    """

    input_ids: Any
    pixel_values: Any = None
    image_grid_thw: Any = None


def chat_messages(item: PromptItem) -> list[dict[str, Any]]:
    """verl's ``RLHFDataset._build_messages``: split each ``content`` on ``<image>`` into a content list."""
    if not item.images:
        return [dict(m) for m in item.messages]
    out = []
    for m in item.messages:
        parts: list[dict[str, Any]] = []
        for j, seg in enumerate(m["content"].split(IMAGE_PLACEHOLDER)):
            if j > 0:
                parts.append({"type": "image"})
            if seg:
                parts.append({"type": "text", "text": seg})
        out.append({"role": m["role"], "content": parts})
    return out


def decode_images(item: PromptItem) -> list[Any]:
    """The item's images as RGB ``PIL.Image`` objects."""
    from PIL import Image

    return [Image.open(io.BytesIO(b)).convert("RGB") for b in item.images]


def encode_prompt(processor: Any, item: PromptItem) -> EncodedPrompt:
    """Apply the chat template (with generation prompt) and tokenize, as verl's ``RLHFDataset`` does.

    ``processor`` is a multimodal processor (``Qwen3VLProcessor``) or a plain tokenizer for text-only data.

    Raises:
        BenchError: images in the data but the model has no image processor.
    """
    msgs = chat_messages(item)
    if item.images:
        if not hasattr(processor, "image_processor"):
            raise BenchError(
                f"data row {item.index} has images but the model's processor ({type(processor).__name__}) "
                "has no image processor"
            )
        text = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        enc = processor(text=[text], images=decode_images(item), return_tensors="pt")
        return EncodedPrompt(enc["input_ids"][0], enc["pixel_values"], enc["image_grid_thw"])
    tok = getattr(processor, "tokenizer", processor)
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0]
    return EncodedPrompt(ids)
