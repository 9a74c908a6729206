"""Runtime patches (``patches/``) on CPU: delivery through sitecustomize, reports, refusal without
torch_npu, the fused forwards against eager (with a stand-in torch_npu), the restore of the eager
forwards after verl's NPU patch, and the MRoPE cos/sin cache against vLLM's native computation."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from bench.measure.evidence import FinishedRun

ROOT = Path(__file__).resolve().parent.parent
PATCHES = ROOT / "patches"

FAKE_TORCH_NPU = '''
"""Stand-in for torch_npu on CPU: the documented semantics of the three fused ops, with call counters."""
import torch
CALLS = {"npu_rms_norm": 0, "npu_swiglu": 0, "npu_rotary_mul": 0}
def npu_rms_norm(x, gamma, epsilon=1e-6):
    CALLS["npu_rms_norm"] += 1
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon)
    return (xf * rstd).to(x.dtype) * gamma, rstd
def npu_swiglu(x, dim=-1):
    CALLS["npu_swiglu"] += 1
    a, b = x.chunk(2, dim=dim)
    return torch.nn.functional.silu(a) * b
def npu_rotary_mul(x, r1, r2, rotary_mode="half"):
    CALLS["npu_rotary_mul"] += 1
    x1, x2 = x.chunk(2, -1)
    return r1 * x + r2 * torch.cat((-x2, x1), -1)
'''


def _run(code: str, run_dir: Path, patches: str, extra_path: list[Path] = (), timeout: int = 240):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BENCH_")}
    env.update(BENCH_PATCHES=patches, BENCH_RUN_DIR=str(run_dir),
               PYTHONPATH=os.pathsep.join([str(PATCHES), *map(str, extra_path), str(ROOT)]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=run_dir)


def _reports(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run_dir / "patches").glob("*.json"))]


@pytest.fixture
def fake_npu(tmp_path, monkeypatch):
    """torch_npu stand-in importable in this process (removed afterwards)."""
    d = tmp_path / "fake_npu"
    d.mkdir()
    (d / "torch_npu.py").write_text(FAKE_TORCH_NPU)
    monkeypatch.syspath_prepend(str(d))
    yield d
    sys.modules.pop("torch_npu", None)
    importlib.invalidate_caches()


@pytest.fixture
def bench_patches(monkeypatch):
    """The patches package imported in this process; hooks and the Qwen3-VL forwards reset afterwards."""
    monkeypatch.syspath_prepend(str(PATCHES))
    import bench_patches
    import bench_patches.qwen3vl_npu_fused as fused
    from transformers.models.qwen3_vl import modeling_qwen3_vl as m

    saved = {("Qwen3VLTextRMSNorm", "forward"): m.Qwen3VLTextRMSNorm.__dict__["forward"],
             ("Qwen3VLTextMLP", "forward"): m.Qwen3VLTextMLP.__dict__["forward"],
             (None, "apply_rotary_pos_emb"): m.apply_rotary_pos_emb}
    yield bench_patches
    bench_patches.reset_hooks()
    for (owner, attr), value in saved.items():
        setattr(getattr(m, owner) if owner else m, attr, value)
    fused._ORIGINALS.clear()
    fused._STATE.update(mode=None, record=None)


# ------------------------------------------------------------------------------ delivery and reports


def test_npu_patch_refuses_without_torch_npu(tmp_path):
    proc = _run("print('alive')", tmp_path, "qwen3vl_npu_fused:on")
    assert proc.returncode == 0 and proc.stdout.strip() == "alive"
    assert "qwen3vl_npu_fused:on refused" in proc.stderr and "needs torch_npu" in proc.stderr
    (report,) = _reports(tmp_path)
    assert report["pid"] > 0 and report["role"] == "python-c" and report["requested"] == ["qwen3vl_npu_fused:on"]
    rec = report["patches"]["qwen3vl_npu_fused"]
    assert rec["status"] == "refused" and rec["mode"] == "on"
    assert rec["reason"].startswith("mode 'on' needs torch_npu (the Ascend PyTorch adapter)")


def test_sitecustomize_chains_and_reports_unknown_patch(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import sys; sys.stderr.write('CHAINED\\n')\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = _run("print('ok')", run_dir, "qwen3vl_npu_fused:off,no_such_patch", extra_path=[other])
    assert proc.returncode == 0 and "CHAINED" in proc.stderr
    (report,) = _reports(run_dir)
    assert report["patches"]["qwen3vl_npu_fused"]["status"] == "armed"
    assert report["patches"]["no_such_patch"]["status"] == "error"
    assert "unknown patch 'no_such_patch'" in report["patches"]["no_such_patch"]["reason"]
    # no BENCH_PATCHES: nothing applied, nothing written
    (run_dir / "q").mkdir()
    quiet = _run("print('ok')", run_dir / "q", "", extra_path=[other])
    assert quiet.returncode == 0 and "CHAINED" in quiet.stderr and not (run_dir / "q" / "patches").exists()


def test_process_roles(bench_patches):
    role = bench_patches.process_role
    py = "/usr/bin/python3"
    assert role([py, "-m", "verl.trainer.main_ppo", "a=b"]) == "driver"
    assert role([py, "-m", "bench.engines.embedded", "--out", "x"]) == "embedded"
    assert role([py, "/x/ray/_private/workers/default_worker.py", "--node-ip-address=1"]) == "ray-worker"
    assert role([py, "/x/ray/dashboard/dashboard.py"]) == "ray-system"
    assert role([py, "/usr/bin/ray", "start", "--head"]) == "ray-system"
    assert role([py, "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"]) == "mp-child"
    assert role([py, "train.py"]) == "train.py"


# ----------------------------------------------------------------------------- qwen3vl_npu_fused


def _tiny_modules(m):
    cfg = types.SimpleNamespace(hidden_size=16, intermediate_size=24, hidden_act="silu")
    torch.manual_seed(0)
    norm = m.Qwen3VLTextRMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    return norm, m.Qwen3VLTextMLP(cfg)


def test_fused_forwards_match_eager(bench_patches, fake_npu, tmp_path, monkeypatch):
    import bench_patches.qwen3vl_npu_fused as fused
    from transformers.models.qwen3_vl import modeling_qwen3_vl as m

    eager = (m.Qwen3VLTextRMSNorm.forward, m.Qwen3VLTextMLP.forward, m.apply_rotary_pos_emb)
    report = bench_patches.activate("qwen3vl_npu_fused:on", str(tmp_path))
    rec = report.patches["qwen3vl_npu_fused"]
    assert rec["status"] == "applied", rec
    assert any("Qwen3VLTextRMSNorm.forward -> torch_npu.npu_rms_norm" in a for a in rec["actions"])
    assert any("Qwen3VLTextMLP.forward -> torch_npu.npu_swiglu" in a for a in rec["actions"])
    assert any("apply_rotary_pos_emb -> torch_npu.npu_rotary_mul" in a for a in rec["actions"])
    assert m.Qwen3VLTextRMSNorm.forward is not eager[0] and m.apply_rotary_pos_emb is not eager[2]

    norm, mlp = _tiny_modules(m)
    x = torch.randn(2, 5, 16)
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    cos, sin = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    npu = importlib.import_module("torch_npu")
    # tensors not on an NPU take the eager path ...
    assert torch.equal(norm(x), eager[0](norm, x)) and npu.CALLS["npu_rms_norm"] == 0
    # ... and on an NPU (here: CPU declared fused) the fused ops give the eager results
    monkeypatch.setattr(fused, "FUSED_DEVICE_TYPES", {"npu", "cpu"})
    torch.testing.assert_close(norm(x), eager[0](norm, x))
    torch.testing.assert_close(mlp(x), eager[1](mlp, x))
    for got, want in zip(m.apply_rotary_pos_emb(q, k, cos, sin), eager[2](q, k, cos, sin)):
        torch.testing.assert_close(got, want)
    assert npu.CALLS == {"npu_rms_norm": 1, "npu_swiglu": 1, "npu_rotary_mul": 2}
    (written,) = _reports(tmp_path)
    assert written["patches"]["qwen3vl_npu_fused"]["status"] == "applied"


FAKE_061_PATCHER = '''
"""Like verl 0.7.x (PR 4186, first in tag v0.7.0): replaces the Qwen3-VL forwards when imported."""
from transformers.models.qwen3_vl import modeling_qwen3_vl
def rms_norm_forward(self, x): raise RuntimeError("npu forward called")
def silu_forward(self, x): raise RuntimeError("npu forward called")
modeling_qwen3_vl.Qwen3VLTextRMSNorm.forward = rms_norm_forward
modeling_qwen3_vl.Qwen3VLTextMLP.forward = silu_forward
'''


def test_off_restores_eager_after_import_time_patch(bench_patches, tmp_path, monkeypatch):
    import bench_patches.qwen3vl_npu_fused as fused
    from transformers.models.qwen3_vl import modeling_qwen3_vl as m

    eager = (m.Qwen3VLTextRMSNorm.forward, m.Qwen3VLTextMLP.forward, m.apply_rotary_pos_emb)
    report = bench_patches.activate("qwen3vl_npu_fused:off", str(tmp_path))  # no torch_npu needed
    # the modeling module is already imported here: the patch records the eager state it found
    assert report.patches["qwen3vl_npu_fused"]["status"] == "applied"
    assert report.patches["qwen3vl_npu_fused"]["actions"] == [
        "transformers.models.qwen3_vl.modeling_qwen3_vl.Qwen3VLTextRMSNorm.forward: eager "
        "(at import of transformers.models.qwen3_vl.modeling_qwen3_vl)"]
    (tmp_path / "fake_verl061_npu_patch.py").write_text(FAKE_061_PATCHER)
    monkeypatch.syspath_prepend(str(tmp_path))
    fused.watch_patcher("fake_verl061_npu_patch")
    importlib.import_module("fake_verl061_npu_patch")
    assert (m.Qwen3VLTextRMSNorm.forward, m.Qwen3VLTextMLP.forward, m.apply_rotary_pos_emb) == eager
    actions = report.patches["qwen3vl_npu_fused"]["actions"]
    assert any(a.startswith("restored eager modeling_qwen3_vl.Qwen3VLTextRMSNorm.forward (was "
                            "fake_verl061_npu_patch.rms_norm_forward; after import of fake_verl061_npu_patch)")
               for a in actions), actions
    norm, mlp = _tiny_modules(m)
    x = torch.randn(1, 3, 16)
    norm(x), mlp(x)  # the eager forwards run again
    sys.modules.pop("fake_verl061_npu_patch", None)


FAKE_090_PATCHER = '''
"""Like verl 0.9.x (PR 6777, first in tag v0.9.0): a per-model NPU_PATCHES table applied by apply_npu_patches."""
def rms_norm_forward_npu(self, x): raise RuntimeError("npu forward called")
def _patch_qwen3_vl():
    from transformers.models.qwen3_vl import modeling_qwen3_vl
    modeling_qwen3_vl.Qwen3VLTextRMSNorm.forward = rms_norm_forward_npu
def _patch_qwen3():
    from transformers.models.qwen3 import modeling_qwen3
    modeling_qwen3.Qwen3RMSNorm.forward = rms_norm_forward_npu
NPU_PATCHES = {"qwen3": _patch_qwen3, "qwen3_vl": _patch_qwen3_vl}
def apply_npu_patches():
    for fn in NPU_PATCHES.values():
        fn()
'''


def test_off_after_verl_npu_patches_table_is_eager_in_the_evidence(bench_patches, tmp_path, monkeypatch):
    """rmsnorm_fused=0 on a verl after PR 6777: the Qwen3-VL RMSNorm that verl fuses by default runs eager again,
    only that model's (verl's patch of Qwen3 stays), and the evidence check reads the eager forward."""
    import bench_patches.qwen3vl_npu_fused as fused
    from transformers.models.qwen3 import modeling_qwen3
    from transformers.models.qwen3_vl import modeling_qwen3_vl as m

    from bench.measure.evidence import FinishedRun, evidence_check

    eager, qwen3_eager = m.Qwen3VLTextRMSNorm.forward, modeling_qwen3.Qwen3RMSNorm.forward
    report = bench_patches.activate("qwen3vl_npu_fused:off", str(tmp_path))
    (tmp_path / "fake_verl090_npu_patch.py").write_text(FAKE_090_PATCHER)
    monkeypatch.syspath_prepend(str(tmp_path))
    fused.watch_patcher("fake_verl090_npu_patch")
    try:
        importlib.import_module("fake_verl090_npu_patch").apply_npu_patches()  # what verl's FSDP engine calls
        assert m.Qwen3VLTextRMSNorm.forward is eager
        assert modeling_qwen3.Qwen3RMSNorm.forward.__module__ == "fake_verl090_npu_patch"  # not use_liger's all
        actions = report.patches["qwen3vl_npu_fused"]["actions"]
        assert "restored eager modeling_qwen3_vl.Qwen3VLTextRMSNorm.forward (was fake_verl090_npu_patch." \
               "rms_norm_forward_npu; after verl NPU_PATCHES['qwen3_vl'])" in actions
        assert actions[-1] == "transformers.models.qwen3_vl.modeling_qwen3_vl.Qwen3VLTextRMSNorm.forward: eager " \
                              "(after fake_verl090_npu_patch.apply_npu_patches())"
        check = evidence_check("rmsnorm_fused", "verl", "npu")
        run = FinishedRun(tmp_path, "verl", "npu")
        assert check(0, run) == ("confirmed", "qwen3vl_npu_fused:off: Qwen3-VL RMSNorm forward eager at the end in "
                                 "1 of 1 training (actor/ref) process(es); verl's own NPU RMSNorm patch undone in 1")
        # had verl's forward stayed (the patch not enforcing), the same check says so
        m.Qwen3VLTextRMSNorm.forward = sys.modules["fake_verl090_npu_patch"].rms_norm_forward_npu
        fused.record_state("test: verl's forward left in place")
        verdict, detail = check(0, FinishedRun(tmp_path, "verl", "npu"))
        assert verdict == "contradicted" and "ran other fake_verl090_npu_patch.rms_norm_forward_npu" in detail
    finally:
        modeling_qwen3.Qwen3RMSNorm.forward = qwen3_eager
        sys.modules.pop("fake_verl090_npu_patch", None)


def test_off_recovers_eager_when_replaced_before_activation(bench_patches, tmp_path):
    from transformers.models.qwen3_vl import modeling_qwen3_vl as m

    eager_code = m.Qwen3VLTextRMSNorm.forward.__code__

    def npu_forward(self, x):
        raise RuntimeError("npu forward called")

    m.Qwen3VLTextRMSNorm.forward = npu_forward
    report = bench_patches.activate("qwen3vl_npu_fused:off", str(tmp_path))
    assert m.Qwen3VLTextRMSNorm.forward.__code__.co_code == eager_code.co_code
    actions = report.patches["qwen3vl_npu_fused"]["actions"]
    assert any("recovered the eager Qwen3VLTextRMSNorm.forward from a pristine copy" in a for a in actions)
    assert any("restored eager modeling_qwen3_vl.Qwen3VLTextRMSNorm.forward" in a for a in actions)


@pytest.mark.slow
def test_off_restores_eager_after_verl_apply_npu_patches(tmp_path):
    """The installed verl's own NPU patch (applied by its FSDP engine) is undone in a patched process."""
    fake = tmp_path / "fake_npu"
    fake.mkdir()
    (fake / "torch_npu.py").write_text(FAKE_TORCH_NPU)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    code = """
    from transformers.models.qwen3_vl import modeling_qwen3_vl as m
    eager = (m.Qwen3VLTextRMSNorm.forward, m.Qwen3VLTextMLP.forward, m.apply_rotary_pos_emb)
    from verl.models.transformers import npu_patch
    npu_patch.apply_npu_patches()            # what verl's FSDP engine calls on an NPU machine
    now = (m.Qwen3VLTextRMSNorm.forward, m.Qwen3VLTextMLP.forward, m.apply_rotary_pos_emb)
    print("RESTORED", all(a is b for a, b in zip(eager, now)))
    """
    proc = _run(code, run_dir, "qwen3vl_npu_fused:off", extra_path=[fake], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESTORED True" in proc.stdout
    (report,) = _reports(run_dir)
    actions = report["patches"]["qwen3vl_npu_fused"]["actions"]
    assert "restored eager modeling_qwen3_vl.Qwen3VLTextRMSNorm.forward (was verl.models.transformers.npu_patch." \
           "rms_norm_forward_npu; after verl NPU_PATCHES['qwen3_vl'])" in actions
    assert any("Qwen3VLTextMLP.forward (was verl.models.transformers.npu_patch.silu_forward_npu" in a for a in actions)
    from bench.measure.verl_evidence import rmsnorm_fused  # the installed verl's NPU_PATCHES: eager in the evidence

    assert rmsnorm_fused(0, FinishedRun(run_dir, "verl", "npu"))[0] == "confirmed"
    assert rmsnorm_fused(1, FinishedRun(run_dir, "verl", "npu"))[0] == "missing"  # requested off, not on


# ----------------------------------------------------------------------------- vllm_ascend_mrope_cache

FAKE_VLLM_FORWARD_CONTEXT = '''
class ForwardContext:
    pass
CONTEXT = ForwardContext()
def get_forward_context():
    return CONTEXT
'''

FAKE_ASCEND_ROTARY = '''
"""Stand-in for vllm_ascend.ops.rotary_embedding: forward_oot = vLLM's MRotaryEmbedding.forward_native."""
import torch
CALLS = {"original": 0}

def apply_interleaved_rope(x, mrope_section):
    channels = torch.arange(x.shape[-1], device=x.device)
    is_h = (channels % 3 == 1) & (channels < mrope_section[1] * 3)
    is_w = (channels % 3 == 2) & (channels < mrope_section[2] * 3)
    return torch.where(is_w, x[2], torch.where(is_h, x[1], x[0]))

def neox_rotate(x, cos, sin):  # vLLM apply_rotary_emb (NeoX): x [T, H, rd], cos/sin [T, rd/2]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

class AscendMRotaryEmbedding(torch.nn.Module):
    def __init__(self, head_size, rotary_dim, max_pos, base, mrope_section, mrope_interleaved):
        super().__init__()
        self.head_size, self.rotary_dim, self.is_neox_style = head_size, rotary_dim, True
        self.mrope_section, self.mrope_interleaved = mrope_section, mrope_interleaved
        inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
        freqs = torch.einsum("i,j->ij", torch.arange(max_pos, dtype=torch.float), inv_freq)
        self.cos_sin_cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)

    def forward_oot(self, positions, query, key):
        CALLS["original"] += 1
        num_tokens = positions.shape[-1]
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)
        if positions.ndim == 2:
            if self.mrope_interleaved:
                cos = apply_interleaved_rope(cos, self.mrope_section)
                sin = apply_interleaved_rope(sin, self.mrope_section)
            else:
                cos = torch.cat([m[i] for i, m in enumerate(cos.split(self.mrope_section, dim=-1))], dim=-1)
                sin = torch.cat([m[i] for i, m in enumerate(sin.split(self.mrope_section, dim=-1))], dim=-1)
        out = []
        for x in (query, key):
            shape = x.shape
            x = x.view(num_tokens, -1, self.head_size)
            rot = neox_rotate(x[..., : self.rotary_dim], cos, sin)
            out.append(torch.cat((rot, x[..., self.rotary_dim:]), dim=-1).reshape(shape))
        return tuple(out)
'''


@pytest.fixture
def fake_vllm_ascend(tmp_path, monkeypatch, fake_npu, bench_patches):
    root = tmp_path / "fake_vllm"
    for pkg in ("vllm", "vllm_ascend", "vllm_ascend/ops"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "vllm" / "forward_context.py").write_text(FAKE_VLLM_FORWARD_CONTEXT)
    (root / "vllm_ascend" / "ops" / "rotary_embedding.py").write_text(FAKE_ASCEND_ROTARY)
    monkeypatch.syspath_prepend(str(root))
    import bench_patches.vllm_ascend_mrope_cache as mrope

    monkeypatch.setattr(mrope, "FUSED_DEVICE_TYPES", {"npu", "cpu"})
    for key in mrope.STATS:
        mrope.STATS[key] = 0
    yield mrope
    for name in [n for n in sys.modules if n.split(".")[0] in ("vllm", "vllm_ascend")]:
        sys.modules.pop(name)


@pytest.mark.parametrize("interleaved, section, rotary_dim", [(True, [4, 2, 2], 16), (False, [2, 3, 3], 16),
                                                               (True, [2, 1, 1], 8)])
def test_mrope_cache_matches_native_and_computes_once_per_forward(fake_vllm_ascend, tmp_path, interleaved, section,
                                                                  rotary_dim):
    mrope = fake_vllm_ascend
    import bench_patches

    report = bench_patches.activate("vllm_ascend_mrope_cache", str(tmp_path))
    assert report.patches["vllm_ascend_mrope_cache"]["status"] == "armed"
    ops = importlib.import_module("vllm_ascend.ops.rotary_embedding")  # the hook patches it on import
    assert report.patches["vllm_ascend_mrope_cache"]["status"] == "applied"
    ctx = importlib.import_module("vllm.forward_context").CONTEXT
    rope = ops.AscendMRotaryEmbedding(16, rotary_dim, 64, 10000.0, section, interleaved)
    native = ops.AscendMRotaryEmbedding.forward_oot.__wrapped__
    torch.manual_seed(1)
    for forward in range(2):
        positions = torch.randint(0, 64, (3, 7))
        ctx.is_first_layer = True  # set_ascend_forward_context does this at the start of each forward
        for layer in range(3):
            q, k = torch.randn(7, 4 * 16), torch.randn(7, 2 * 16)
            got = rope.forward_oot(positions, q, k)
            want = native(rope, positions, q, k)
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w)
        assert ctx.is_first_layer is False
    assert mrope.STATS["computed"] == 2 and mrope.STATS["reused"] == 4  # once per forward, reused in layers 2-3
    assert importlib.import_module("torch_npu").CALLS["npu_rotary_mul"] == 12  # one per q and per k in every layer
    # the counters reach the process report, and the run's evidence check reads them from there
    mrope._report_stats(force=True)
    from bench.measure.verl_evidence import factor_evidence

    got = factor_evidence(tmp_path, {"mrope_cache": 1}, "verl", "npu")["mrope_cache"]
    assert got["verdict"] == "confirmed" and "2 forwards, 4 of 6 layer calls reused" in got["detail"], got
    # text-only positions (1-D) and no first-layer flag: still correct, computed in every layer
    del ctx.is_first_layer
    pos1 = torch.randint(0, 64, (7,))
    q, k = torch.randn(7, 64), torch.randn(7, 32)
    for g, w in zip(rope.forward_oot(pos1, q, k), native(rope, pos1, q, k)):
        torch.testing.assert_close(g, w)
    assert mrope.STATS["computed"] == 3


def test_mrope_leaves_qwen25vl_fused_path_alone(fake_vllm_ascend, tmp_path):
    mrope = fake_vllm_ascend
    import bench_patches

    bench_patches.activate("vllm_ascend_mrope_cache", str(tmp_path))
    ops = importlib.import_module("vllm_ascend.ops.rotary_embedding")
    rope = ops.AscendMRotaryEmbedding(128, 128, 64, 10000.0, [16, 24, 24], False)
    rope.forward_oot(torch.randint(0, 64, (3, 2)), torch.randn(2, 128), torch.randn(2, 128))
    assert ops.CALLS["original"] == 1 and mrope.STATS["fallback"] == 1


def test_mrope_refuses_without_vllm_ascend(tmp_path):
    proc = _run("print('ok')", tmp_path, "vllm_ascend_mrope_cache")
    assert proc.returncode == 0
    rec = _reports(tmp_path)[0]["patches"]["vllm_ascend_mrope_cache"]
    assert rec["status"] == "refused" and "torch_npu" in rec["reason"]


# ----------------------------------------------------------------------------- verl_file_logger

FAKE_TRACKING_061 = '''
"""verl 0.6.1's FileLogger, as released (json.dumps on a buffered text file)."""
import json, os
class FileLogger:
    def __init__(self, project_name, experiment_name):
        self.filepath = os.getenv("VERL_FILE_LOGGER_PATH", None)
        self.fp = open(self.filepath, "w")
    def log(self, data, step):
        data = {"step": step, "data": data}
        self.fp.write(json.dumps(data) + "\\n")
    def finish(self):
        self.fp.close()
'''


def test_file_logger_keeps_numpy_steps_and_flushes(bench_patches, tmp_path, monkeypatch):
    import bench_patches.verl_file_logger as flog
    import numpy as np

    (tmp_path / "fake_tracking_061.py").write_text(FAKE_TRACKING_061)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(flog, "TARGET_MODULE", "fake_tracking_061")
    out = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(out))
    report = bench_patches.activate("verl_file_logger", str(tmp_path))
    tracking = importlib.import_module("fake_tracking_061")
    assert report.patches["verl_file_logger"]["status"] == "applied"
    logger = tracking.FileLogger("p", "e")
    logger.log({"timing_s/step": 1.5, "perf/total_num_tokens": np.int64(42), "x": np.float32(0.25),
                "t": torch.tensor(2.0)}, 1)
    logger.log({"timing_s/step": 1.25}, 2)
    # readable before close (a killed run keeps its steps), verl's own line format
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == [{"step": 1, "data": {"timing_s/step": 1.5, "perf/total_num_tokens": 42, "x": 0.25, "t": 2.0}},
                     {"step": 2, "data": {"timing_s/step": 1.25}}]
    logger.finish()
    sys.modules.pop("fake_tracking_061", None)



def test_speed_probe_patch_adds_the_kernel_time_to_every_step_with_the_file_logger(bench_patches, tmp_path,
                                                                                   monkeypatch):
    """``verl_speed_probe`` with ``verl_file_logger`` on verl 0.6.1's FileLogger: every step's line gets
    ``bench/speed_probe_s`` (the embedded engine's kernel, seconds, positive and under a second here), the step's own
    metrics are unchanged, numpy values still made plain, and the report names the kernel, which the run record's
    evidence takes as its speed probe (so the report, the stop rule and the gate normalize by it)."""
    import bench_patches.verl_file_logger as flog
    import bench_patches.verl_speed_probe as sprobe
    import numpy as np

    from bench.engines.builtins.speed_probe import spec

    (tmp_path / "fake_tracking_061p.py").write_text(FAKE_TRACKING_061)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(flog, "TARGET_MODULE", "fake_tracking_061p")
    monkeypatch.setattr(sprobe, "TARGET_MODULE", "fake_tracking_061p")
    out = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(out))
    report = bench_patches.activate("verl_file_logger,verl_speed_probe", str(tmp_path))
    tracking = importlib.import_module("fake_tracking_061p")
    assert report.patches["verl_speed_probe"]["status"] == "applied"
    assert spec() in " ".join(report.patches["verl_speed_probe"]["actions"])
    from bench.records.speed import PROBE_METRIC, probe_from_patches, probe_spec

    assert sprobe.METRIC == PROBE_METRIC
    reports = [json.loads(f.read_text()) for f in sorted((tmp_path / "patches").glob("*.json"))]
    ev = probe_from_patches(reports)
    assert ev is not None and ev["spec"] == spec() and ev["metric"] == PROBE_METRIC
    assert probe_spec({"evidence": {"speed_probe": ev}}) == spec()
    logger = tracking.FileLogger("p", "e")
    for step in (1, 2, 3):
        logger.log({"timing_s/step": 1.5, "n": np.int64(step)}, step)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [ln["step"] for ln in lines] == [1, 2, 3]
    for ln in lines:
        probe = ln["data"].pop(sprobe.METRIC)
        assert 0 < probe < 1.0
        assert ln["data"] == {"timing_s/step": 1.5, "n": ln["step"]}
    logger.finish()
    sys.modules.pop("fake_tracking_061p", None)

def test_patch_evidence_summary(tmp_path):
    from bench.measure.patch_reports import patch_evidence

    code = "print('x')"
    (tmp_path / "a").mkdir()
    _run(code, tmp_path / "a", "qwen3vl_npu_fused:on,verl_file_logger")
    _run(code, tmp_path / "a", "qwen3vl_npu_fused:on,verl_file_logger")
    ev = patch_evidence(tmp_path / "a")
    assert ev["verl_file_logger"] == "applied in 0; armed in 2; refused in 0"
    assert ev["qwen3vl_npu_fused:on"].startswith("applied in 0; armed in 0; refused in 2: mode 'on' needs torch_npu")
