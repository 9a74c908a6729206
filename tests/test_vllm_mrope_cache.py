"""The ``mrope_cache`` patch of vLLM's own MRoPE (``patches/bench_patches/vllm_mrope_cache.py``), in the verl
CPU stack (vLLM 0.27.1 CPU build), on the tiny Qwen3-VL's text config (``builtin:qwen3vl-tiny``).

A script runs with the stack's interpreter and the patch delivered as in a run (``patches/`` first on
``PYTHONPATH``, ``BENCH_PATCHES``, ``sitecustomize``). It builds the model's rotary module through vLLM's own
``get_rope`` and plays three forwards as vLLM's model runner does (inside ``set_forward_context``, one
``[3, T]`` positions tensor passed to every layer): a prefill of two text + image prompts, flattened, and
two decode steps. In each layer it compares the patched module's query/key with vLLM's unpatched
``MRotaryEmbedding.forward_native`` on the same inputs, and counts vLLM's ``apply_interleaved_rope`` calls
(two per cos/sin computation) in each. Two processes (issue 47: there were three): ``on``, where the unpatched
reference is what a run without the patch computes, and ``off``. Skipped where the stack is not installed
(``tools/install_verl_cpu.sh``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import _verl_stack as verl_stack
import pytest

from bench.engines.verl_cpu.target import verl_python

ROOT = Path(__file__).resolve().parent.parent
PY = verl_python()
TINY = json.loads((ROOT / "bench" / "engines" / "builtins" / "qwen3vl_tiny.json").read_text())["text_config"]
LAYERS = TINY["num_hidden_layers"]
pytestmark = [pytest.mark.heavy, pytest.mark.skipif(not verl_stack.has("vllm"), reason=verl_stack.NOT_INSTALLED)]

SCRIPT = """
import json, sys, torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.forward_context import set_forward_context
from vllm.model_executor.layers.rotary_embedding import get_rope, mrope

tc = json.loads(sys.argv[1])
cfg = VllmConfig()
with set_current_vllm_config(cfg):
    rope = get_rope(tc["head_dim"], tc["max_position_embeddings"], True, tc["rope_parameters"], torch.float32)
original = getattr(mrope.MRotaryEmbedding.forward_native, "__wrapped__", mrope.MRotaryEmbedding.forward_native)

try:
    from bench_patches.vllm_mrope_cache import STATS
except ImportError:
    STATS = None
calls = {"n": 0}
own_interleave = mrope.apply_interleaved_rope
def counted(x, section):
    calls["n"] += 1
    return own_interleave(x, section)
mrope.apply_interleaved_rope = counted


def prompt(text_before, grid_h, grid_w, text_after, merge=2):
    # Qwen2/3-VL's rule (vLLM get_mrope_input_positions): text t=h=w=index; an image's merged patches
    # t=start, h=start+row, w=start+col; the text after it continues from start + max(rows, cols).
    rows, cols = grid_h // merge, grid_w // merge
    pos = [[i, i, i] for i in range(text_before)]
    start = text_before
    pos += [[start, start + r, start + c] for r in range(rows) for c in range(cols)]
    nxt = start + max(rows, cols)
    pos += [[nxt + i] * 3 for i in range(text_after)]
    return torch.tensor(pos, dtype=torch.long).T, nxt + text_after


torch.manual_seed(0)
a, end_a = prompt(5, 8, 6, 7)    # 5 text tokens, a 128x96 image (8x6 patches of 16 -> 4x3 merged), 7 text
b, end_b = prompt(3, 4, 8, 9)
forwards = [torch.cat([a, b], dim=1)]                                      # prefill, two sequences flattened
forwards += [torch.tensor([[end_a + s, end_b + s]] * 3) for s in range(2)]  # two decode steps
heads, kv_heads, d = tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
out = {"equal": True, "max_abs_diff": 0.0, "interleave_calls": 0, "layers": 0, "tokens": 0,
       "positions_rows_differ": bool((forwards[0][0] != forwards[0][1]).any()),
       "own_interleave_calls": 0, "own_counted": 0}
for positions in forwards:
    with set_forward_context(None, cfg):
        for layer in range(tc["num_hidden_layers"]):
            q = torch.randn(positions.shape[-1], heads * d)
            k = torch.randn(positions.shape[-1], kv_heads * d)
            before = calls["n"]
            got_q, got_k = rope(positions, q.clone(), k.clone())
            out["interleave_calls"] += calls["n"] - before
            before, counted = calls["n"], (STATS or {}).get("layer_calls", 0)
            ref_q, ref_k = original(rope, positions, q.clone(), k.clone())  # vLLM's own, as without the patch
            out["own_interleave_calls"] += calls["n"] - before
            out["own_counted"] += (STATS or {}).get("layer_calls", 0) - counted
            out["equal"] &= bool(torch.equal(got_q, ref_q) and torch.equal(got_k, ref_k))
            out["max_abs_diff"] = max(out["max_abs_diff"], float((got_q - ref_q).abs().max()),
                                      float((got_k - ref_k).abs().max()))
            out["rotated"] = bool(not torch.equal(ref_q, q))
            out["layers"] += 1
    out["tokens"] += positions.shape[-1]
compiled = torch.compile(lambda p, q, k: rope(p, q, k), backend="eager", fullgraph=True)
with set_forward_context(None, cfg):
    cq, ck = compiled(forwards[0], q0 := torch.randn(forwards[0].shape[-1], heads * d),
                      k0 := torch.randn(forwards[0].shape[-1], kv_heads * d))
    rq, rk = original(rope, forwards[0], q0.clone(), k0.clone())
out["compiled_equal"] = bool(torch.allclose(cq, rq) and torch.allclose(ck, rk))
out["forwards"] = len(forwards)
out["stats"] = STATS
print(json.dumps(out))
"""


def _has_torchvision() -> bool:
    if not Path(PY).exists():
        return False
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torchvision') is None)"
    return subprocess.run([PY, "-c", probe], capture_output=True, timeout=120).returncode == 0


_HAS_TORCHVISION = _has_torchvision()


def _run(tmp_path: Path, patches: str) -> tuple[dict, list[dict]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BENCH_", "VERL_", "RAY_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT / "patches"), str(ROOT)]), BENCH_RUN_DIR=str(tmp_path))
    # where the stack has torchvision (tools/install_verl_cpu.sh), vLLM imports it: its ops need the CPU platform's
    # torchvision_op_schemas workaround in this process as in every process of a run
    specs = [s for s in (patches, "verl_cpu:torchvision" if _HAS_TORCHVISION else "") if s]
    if specs:
        env["BENCH_PATCHES"] = ",".join(specs)
    proc = subprocess.run([PY, "-c", textwrap.dedent(SCRIPT), json.dumps(TINY)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=tmp_path)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    reports = [json.loads(p.read_text()) for p in sorted((tmp_path / "patches").glob("*.json"))]
    return json.loads(lines[-1]), reports


def test_cached_mrope_equals_vllm_and_computes_once_per_forward(tmp_path):
    got, reports = _run(tmp_path, "vllm_mrope_cache:on")
    assert TINY["rope_parameters"]["mrope_interleaved"] and got["positions_rows_differ"] and got["rotated"]
    # numerically equal to vLLM's own MRoPE, bit for bit, in every layer of every forward
    assert got["equal"] and got["max_abs_diff"] == 0.0 and got["layers"] == 3 * LAYERS
    # cos/sin built once per forward (2 interleaves: cos and sin) instead of once per layer
    assert got["interleave_calls"] == 2 * got["forwards"]
    stats = got["stats"]
    assert stats["forwards"] == 3 and stats["hits"] == 3 * (LAYERS - 1) and stats["tokens"] == got["tokens"]
    # under torch.compile (fullgraph: no graph break) the patch leaves vLLM's own code to be traced
    assert got["compiled_equal"] and stats["layer_calls"] == 3 * LAYERS
    rec = reports[0]["patches"]["vllm_mrope_cache"]
    assert rec["status"] == "applied" and rec["counters"]["hits"] == 3 * (LAYERS - 1)
    assert rec["actions"][0].startswith("vllm.model_executor.layers.rotary_embedding.mrope.MRotaryEmbedding")
    # removed: vLLM's own forward_native (the reference, on the same forwards) builds cos/sin in each layer (what
    # the once-per-forward count above rules out), and the patch neither runs nor counts there
    assert got["own_interleave_calls"] == 2 * LAYERS * got["forwards"] and got["own_counted"] == 0
    # only the listed patches are in the process's report
    assert set(reports[0]["patches"]) == {"vllm_mrope_cache"} | ({"verl_cpu"} if _HAS_TORCHVISION else set())


def test_off_vllm_recomputes_cos_sin_in_every_layer(tmp_path):
    # off: vLLM's own code in every layer, counted (the off level's evidence), no cache hit
    off, reports = _run(tmp_path / "off", "vllm_mrope_cache:off")
    assert off["equal"] and off["interleave_calls"] == 2 * LAYERS * off["forwards"]
    assert off["own_interleave_calls"] == 2 * LAYERS * off["forwards"] and off["own_counted"] == 0
    assert off["stats"]["forwards"] == 3 and off["stats"]["hits"] == 0 and off["stats"]["layer_calls"] == 3 * LAYERS
    rec = reports[0]["patches"]["vllm_mrope_cache"]
    assert rec["mode"] == "off" and rec["counters"]["layer_calls"] == 3 * LAYERS


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
