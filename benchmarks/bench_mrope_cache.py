"""What ``mrope_cache`` changes on CPU at the module level: MRoPE time per forward (all layers), vLLM's own
``MRotaryEmbedding.forward_native`` in every layer against the patched module (cos/sin once per forward).

Not a test. Runs in the verl CPU stack (re-executes itself with its interpreter, ``tools/install_verl_cpu.sh``).
Two text configs: the tiny Qwen3-VL of ``builtin:qwen3vl-tiny`` (4 layers, 4 heads of 32, sections [8, 4, 4])
and Qwen3-VL-8B's (36 layers, 32 heads + 8 KV heads of 128, sections [24, 20, 20]; the article's model),
each for a prefill (``--prefill`` tokens of text + image, flattened) and a decode step (``--batch`` tokens).
A forward = every layer's rotary call on fresh query/key, inside vLLM's ``set_forward_context``. The two
variants alternate (``--repeats`` rounds of ``--inner`` forwards each) so that machine load drifts over both;
printed: median time per forward (ms) of each, the ratio with its interquartile range over the rounds, and
the saving per forward.

    python benchmarks/bench_mrope_cache.py                      # about 1 minute on 2 cores
    python benchmarks/bench_mrope_cache.py --prefill 2048 --batch 64 --repeats 30
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {
    "qwen3vl-tiny": {"layers": 4, "heads": 4, "kv_heads": 2, "head_dim": 32, "section": [8, 4, 4]},
    "qwen3vl-8b": {"layers": 36, "heads": 32, "kv_heads": 8, "head_dim": 128, "section": [24, 20, 20]},
}


def _positions(tokens: int, image_side: int):
    """``[3, tokens]`` positions: 8 text tokens, an image of ``image_side`` x ``image_side`` merged patches,
    then text (Qwen2/3-VL's rule, as in ``tests/test_vllm_mrope_cache.py``)."""
    import torch

    pos = [[i] * 3 for i in range(8)]
    pos += [[8, 8 + r, 8 + c] for r in range(image_side) for c in range(image_side)]
    nxt = 8 + image_side
    pos += [[nxt + i] * 3 for i in range(max(0, tokens - len(pos)))]
    return torch.tensor(pos[:tokens], dtype=torch.long).T.contiguous()


def _measure(args: argparse.Namespace) -> dict:
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.layers.rotary_embedding import get_rope, mrope

    sys.path.insert(0, str(ROOT / "patches"))
    from bench_patches import vllm_mrope_cache as patch

    torch.set_num_threads(args.threads)
    cfg = VllmConfig()
    own = mrope.MRotaryEmbedding.forward_native
    cached = patch.make_forward_native(own)
    patch._STATE["mode"] = "on"
    out = {}
    for name, c in CONFIGS.items():
        rp = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": c["section"], "mrope_interleaved": True}
        with set_current_vllm_config(cfg):
            rope = get_rope(c["head_dim"], 4096, True, rp, torch.float32)
        for shape, tokens in (("prefill", args.prefill), ("decode", args.batch)):
            positions = _positions(tokens, 8) if shape == "prefill" else torch.arange(tokens).expand(3, tokens) + 500
            q = torch.randn(c["layers"], tokens, c["heads"] * c["head_dim"])
            k = torch.randn(c["layers"], tokens, c["kv_heads"] * c["head_dim"])

            def forward(fn):
                with set_forward_context(None, cfg):
                    for layer in range(c["layers"]):
                        fn(rope, positions, q[layer], k[layer])

            times = {"vllm": [], "cached": []}
            for fn in (own, cached):
                forward(fn)  # warm-up
            for _ in range(args.repeats):
                for label, fn in (("vllm", own), ("cached", cached)):
                    t0 = time.perf_counter()
                    for _ in range(args.inner):
                        forward(fn)
                    times[label].append((time.perf_counter() - t0) / args.inner * 1e3)
            ratios = sorted(b / a for a, b in zip(times["vllm"], times["cached"]))
            q1, q3 = statistics.quantiles(ratios, n=4)[0], statistics.quantiles(ratios, n=4)[2]
            mv, mc = statistics.median(times["vllm"]), statistics.median(times["cached"])
            out[f"{name} {shape} ({tokens} tokens)"] = {
                "vllm_ms": round(mv, 4), "cached_ms": round(mc, 4), "saved_ms": round(mv - mc, 4),
                "ratio": round(statistics.median(ratios), 3), "ratio_iqr": [round(q1, 3), round(q3, 3)]}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prefill", type=int, default=512, help="tokens of the prefill forward")
    p.add_argument("--batch", type=int, default=16, help="tokens of the decode forward (sequences)")
    p.add_argument("--repeats", type=int, default=15, help="alternating rounds")
    p.add_argument("--inner", type=int, default=5, help="forwards per round")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = p.parse_args()
    try:
        import vllm  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT))
        from bench.engines.verl_cpu.target import verl_python

        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "patches"), str(ROOT)])}
        return subprocess.call([verl_python(), __file__, *sys.argv[1:]], env=env)
    res = _measure(args)
    print(f"MRoPE per forward, vLLM {__import__('vllm').__version__} CPU, {args.threads} thread(s), median of "
          f"{args.repeats} alternating rounds x {args.inner} forwards:")
    for k, v in res.items():
        print(f"  {k:<36} vLLM {v['vllm_ms']:8.3f} ms  cached {v['cached_ms']:8.3f} ms  saved {v['saved_ms']:8.3f} ms"
              f"  ratio {v['ratio']:.3f} (IQR {v['ratio_iqr'][0]:.3f}-{v['ratio_iqr'][1]:.3f})")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
