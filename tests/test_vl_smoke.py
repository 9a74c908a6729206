"""``run_bench.py MATRIX --smoke`` of a VL matrix: every cell on the tiny Qwen3-VL with image prompts, the
user's VL settings kept, the CPU counterpart of the MRoPE (and RMSNorm) patch beside the cell's NPU patch.
Checked through the CLI's dry run, as a user sees it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _dry_run(matrix: str, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(ROOT / "run_bench.py"), matrix, "--smoke", "--dry-run", *extra],
                          capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)


def _argv_value(argv: list[str], key: str) -> str | None:
    for a in argv:
        if a.lstrip("+").split("=", 1)[0] == key:
            return a.split("=", 1)[1].strip("'")
    return None


def test_vl_matrix_smoke_cells_run_the_tiny_qwen3vl_with_images():
    proc = _dry_run("matrix/qwen3vl8b_a2.yaml", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    cells = {c["source_label"]: c for c in got["cells"]}
    assert len(cells) == 9
    for label, c in cells.items():
        argv, patches = c["launch"]["argv"], c["launch"]["patches"]
        assert c["platform"] == "cpu"
        assert _argv_value(argv, "actor_rollout_ref.model.path").startswith("{bench_cache}/models/qwen3vl-tiny-")
        assert _argv_value(argv, "data.train_files").startswith("{bench_cache}/data/vl-")
        assert _argv_value(argv, "data.image_key") == "images"  # the user's VL setting, kept
        assert _argv_value(argv, "data.max_prompt_length") == "128"  # room for the image's tokens
        want = "vllm_mrope_cache:on" if label == "mrope_cache" else "vllm_mrope_cache:off"
        assert want in patches, (label, patches)
        assert "smoke: multimodal matrix: builtin:qwen3vl-tiny with builtin:vl image prompts" in c["launch"]["notes"]
        assert any("use_remove_padding=true" in x for x in c["left_out"])  # still said per cell
    mrope = cells["mrope_cache"]["launch"]["patches"]
    assert "vllm_ascend_mrope_cache" in mrope  # the cell's own NPU patch still goes in (it refuses on CPU, saying why)
    assert "cpu_rmsnorm:on" in cells["rmsnorm_fused"]["launch"]["patches"]
    # mrope_cache is exercised on CPU now; only the NPU-only switches are not
    assert set(got["not_exercised"]) == {"task_queue", "mc2"}
    # the all-off and mrope_cache smoke launches differ (before: equal launches)
    assert cells["mrope_cache"]["cell_id"] != cells["all-off"]["cell_id"]


def test_vl_smoke_dry_run_readable_and_text_matrix_unchanged():
    out = _dry_run("matrix/qwen3vl8b_a2.yaml").stdout
    assert "note: smoke: mrope_cache runs its CPU counterpart vllm_mrope_cache beside the cell's own " \
           "vllm_ascend_mrope_cache (npu only)" in out
    cell = out[out.index("mrope_cache -> smoke cell"):].split("\n  9. ")[0]  # the cell's part (items may wrap)
    assert "patch: vllm_mrope_cache:on" in cell and "+vllm_ascend_mrope_cache:on" in cell
    assert "not exercised on CPU: mrope_cache" not in out
    # a text matrix's smoke run keeps the text model and data and runs no MRoPE patch
    from bench.engines.verl_cpu.smoke import smoke_base
    from bench.spec.loading import load_matrix

    base, _ = smoke_base(load_matrix(ROOT / "matrix" / "verl_cpu.yaml"))
    assert (base.model, base.data, base.is_multimodal()) == ("builtin:qwen3-tiny", "builtin:text", False)
