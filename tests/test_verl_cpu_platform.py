"""Each workaround of the verl CPU target, in the verl CPU stack itself (``tools/install_verl_cpu.sh``).

Every test runs a short script with the stack's interpreter twice where it matters: with the workaround
(the script must succeed) and without it (the script must show the original failure), so a test fails
when its workaround is removed or stops being needed. Skipped, with the reason, where the stack is not
installed; ``.ci/run`` installs it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import _verl_stack as verl_stack
import pytest

from bench.engines.verl_cpu.target import ENV, verl_python

ROOT_PATCHES = str(Path(__file__).resolve().parent.parent / "patches")
if ROOT_PATCHES not in sys.path:
    sys.path.insert(0, ROOT_PATCHES)

ROOT = Path(__file__).resolve().parent.parent
PY = verl_python()
pytestmark = [pytest.mark.heavy,
              pytest.mark.skipif(not verl_stack.has("verl", "vllm"), reason=verl_stack.NOT_INSTALLED)]


def _run(code: str, tmp_path: Path, patches: str = "verl_cpu", platform: bool = True,
         extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` with the stack's interpreter. ``patches=""`` (the "without" runs) keeps only the
    ``torchvision_op_schemas`` workaround where torchvision is installed: without it no process of that stack
    can import transformers' vision models, so every other workaround's test would fail on that instead."""
    if not patches and verl_stack.has("torchvision"):
        patches = "verl_cpu:torchvision"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BENCH_", "VERL_", "RAY_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT / "patches"), str(ROOT)]), BENCH_RUN_DIR=str(tmp_path))
    if patches:
        env["BENCH_PATCHES"] = patches
    if platform:
        env.update({k: s.value for k, s in ENV if k.startswith("VERL_")})
    env.update(extra or {})
    return subprocess.run([PY, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)


def _json(proc: subprocess.CompletedProcess) -> dict:
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(lines[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_platform_registered_through_verl_external_modules(tmp_path):
    code = """
    import json, torch
    import verl
    from verl.utils.device import get_device_name, get_torch_device, get_device_id, get_nccl_backend, get_resource_name
    dev = get_torch_device()
    with dev.stream(dev.current_stream()):
        dev.synchronize()
    t = torch.ones(2).to(get_device_id())
    print(json.dumps({"name": get_device_name(), "id": get_device_id(), "backend": get_nccl_backend(),
                      "resource": get_resource_name(), "tensor": str(t.device), "peak": dev.max_memory_allocated(),
                      "free_total": list(dev.mem_get_info())}))
    """
    got = _json(_run(code, tmp_path, patches=""))
    assert got["name"] == "cpu" and got["id"] == "cpu" and got["tensor"] == "cpu"
    assert got["backend"] == "gloo" and got["resource"] == "GPU"
    assert got["peak"] > 10 * 2**20  # peak RSS of a process that imported torch and verl, bytes
    assert 0 < got["free_total"][0] <= got["free_total"][1]


def test_without_platform_verl_has_no_cpu_device(tmp_path):
    code = """
    import json
    from verl.utils.device import get_device_name
    print(json.dumps({"name": get_device_name()}))
    """
    proc = _run(code, tmp_path, patches="", platform=False)
    assert proc.returncode != 0 or _json(proc)["name"] != "cpu"


def test_vllm_dist_alias(tmp_path):
    code = """
    import json, importlib.metadata as md
    try:
        v = md.version("vllm")
    except md.PackageNotFoundError:
        v = None
    ok = True
    try:
        import verl.third_party.vllm as tv  # raises "vllm version None not supported" without the alias
        got = tv.vllm_version
    except ValueError as exc:
        ok, got = False, str(exc)
    print(json.dumps({"version": v, "ok": ok, "got": got}))
    """
    with_alias = _json(_run(code, tmp_path))
    assert with_alias["ok"] and with_alias["version"].endswith("+cpu") and with_alias["got"] == with_alias["version"]
    without = _json(_run(code, tmp_path, patches=""))
    assert without["version"] is None and not without["ok"] and "not supported" in without["got"]


def test_gloo_backend(tmp_path):
    code = f"""
    import json, os
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="{_free_port()}")
    import torch.distributed as dist
    from verl.utils.distributed import initialize_global_process_group
    try:
        initialize_global_process_group(timeout_second=60)
        t = __import__("torch").ones(3)
        dist.all_reduce(t)
        out = {{"ok": True, "backend": str(dist.get_backend()), "sum": t.tolist()}}
        dist.destroy_process_group()
    except Exception as exc:
        out = {{"ok": False, "error": str(exc)[:300]}}
    print(json.dumps(out))
    """
    got = _json(_run(code, tmp_path))
    assert got["ok"] and got["sum"] == [1.0, 1.0, 1.0], got
    without = _json(_run(code, tmp_path, patches=""))
    assert not without["ok"] and "Duplicate device type cpu" in without["error"]


def test_vllm_linear_keeps_weight(tmp_path):
    code = """
    import json, torch
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 32)
    x = torch.randn(5, 64)
    ref = torch.nn.functional.linear(x, layer.weight, layer.bias)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    kept = layer.weight.numel()
    with torch.no_grad():
        layer.weight.mul_(2.0)  # what a weight sync does: load new values into the weight
    out = layer.cpu_linear(x, layer.weight, layer.bias)
    err_ref = float((layer.cpu_linear(x, layer.weight / 2.0, layer.bias) - ref).abs().max())
    print(json.dumps({"kept": kept, "err_ref": err_ref,
                      "synced": float((out - torch.nn.functional.linear(x, layer.weight, layer.bias)).abs().max())}))
    """
    got = _json(_run(code, tmp_path))
    assert got["kept"] == 64 * 32 and got["err_ref"] < 1e-5 and got["synced"] < 1e-5
    without = _run(code, tmp_path, patches="")
    # vLLM's own dispatcher prepacks and deletes layer.weight: nothing left to sync into
    assert without.returncode != 0 or _json(without)["kept"] == 0


def test_no_pin_memory(tmp_path):
    code = """
    import json, torch
    import verl.workers.engine.fsdp.transformer_impl as ti
    pol = ti.CPUOffloadPolicy(pin_memory=True)
    try:
        torch.empty(4).pin_memory()
        can_pin = True
    except RuntimeError:
        can_pin = False
    print(json.dumps({"pin": pol.pin_memory, "can_pin": can_pin}))
    """
    got = _json(_run(code, tmp_path))
    assert got == {"pin": False, "can_pin": False}
    assert _json(_run(code, tmp_path, patches=""))["pin"] is True  # and pinning fails on this CPU-only machine


def test_replay_buffer_poll(tmp_path):
    """One verl process (issue 47: it was three): the patched module at the default poll, imported again after
    ``$BENCH_VERL_POLL_S`` is set (the import hook fires again and reads it), and verl's own module executed
    once more outside the import system, where no hook sees it: verl's value without the workaround."""
    code = """
    import importlib, importlib.util, json, os, sys
    name = "verl.trainer.ppo.v1.replay_buffer"
    def poll(module):
        return module.ReplayBuffer(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None,
                                   max_off_policy_strategy="drop", sampler_kwargs={}).poll_interval
    got = {"default": poll(importlib.import_module(name))}
    os.environ["BENCH_VERL_POLL_S"] = "0.25"
    del sys.modules[name]
    got["env"] = poll(importlib.import_module(name))
    spec = importlib.util.spec_from_file_location("replay_buffer_unpatched", sys.modules[name].__file__)
    plain = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plain)
    got["without"] = poll(plain)
    print(json.dumps(got))
    """
    assert _json(_run(code, tmp_path)) == {"default": 0.1, "env": 0.25, "without": 2.0}


def test_ray_init_joins_an_existing_cluster(tmp_path):
    code = """
    import json, ray
    seen = {}
    def fake_init(*args, **kwargs):
        seen.update(kwargs)
        if "num_cpus" in kwargs or "num_gpus" in kwargs:  # what Ray says when joining a cluster
            raise ValueError("When connecting to an existing cluster, num_cpus and num_gpus must not be provided.")
    if hasattr(ray.init, "__wrapped__"):
        ray.init.__wrapped__ = fake_init
    else:
        ray.init = fake_init
    try:
        ray.init(num_cpus=8, num_gpus=1, include_dashboard=False, runtime_env={"env_vars": {}})
        ok = True
    except ValueError:
        ok = False
    print(json.dumps({"ok": ok, "kwargs": sorted(seen)}))
    """
    got = _json(_run(code, tmp_path, extra={"RAY_ADDRESS": "127.0.0.1:6379"}))
    assert got == {"ok": True, "kwargs": ["runtime_env"]}
    assert _json(_run(code, tmp_path, patches="", extra={"RAY_ADDRESS": "127.0.0.1:6379"}))["ok"] is False
    # a private local cluster (no RAY_ADDRESS) keeps its sizing
    assert _json(_run(code, tmp_path))["kwargs"] == ["include_dashboard", "num_cpus", "num_gpus", "runtime_env"]


def test_patch_reports_name_each_workaround(tmp_path):
    code = """
    import json
    import os
    import verl.utils.distributed, verl.workers.engine.fsdp.transformer_impl, verl.trainer.ppo.v1.replay_buffer
    import vllm.model_executor.layers.utils
    import ray
    import importlib.util
    if importlib.util.find_spec("torchvision"):
        import torchvision
    ray.init.__wrapped__ = lambda *a, **k: None
    os.environ["RAY_ADDRESS"] = "127.0.0.1:6379"
    ray.init(num_cpus=8)
    print(json.dumps({"ok": True}))
    """
    assert _json(_run(code, tmp_path))["ok"]
    reports = [json.loads(p.read_text()) for p in (tmp_path / "patches").glob("*.json")]
    actions = [a for r in reports for a in r["patches"]["verl_cpu"]["actions"]]
    done = {a.split(":", 1)[0] for a in actions}
    from bench_patches.verl_cpu import WORKAROUNDS

    expected = set(WORKAROUNDS) - (set() if _HAS_TORCHVISION else {"torchvision_op_schemas"})
    assert done == expected


@pytest.fixture(scope="module")
def tiny_vl_processor_dir() -> Path:
    """``builtin:qwen3vl-tiny`` (model + processor), built in this (the harness's) environment, cached."""
    from bench.engines.builtins.model import default_cache_dir
    from bench.engines.verl_cpu import assets

    return assets.ensure_vl_model(default_cache_dir())


_HAS_TORCHVISION = verl_stack.has("torchvision")


@pytest.mark.skipif(not _HAS_TORCHVISION, reason="torchvision is not installed in the verl CPU stack "
                    "(tools/install_verl_cpu.sh installs it with --no-deps)")
def test_torchvision_op_schemas(tmp_path, tiny_vl_processor_dir):
    """torchvision 0.28 (a CUDA build beside torch 2.13.0+cpu) imports, resizes and serves the Qwen3-VL
    processor with the declared schemas; without them ``import torchvision`` fails on ``torchvision::nms``."""
    code = f"""
    import json, torch
    try:
        import torchvision
        from torchvision.transforms.v2 import functional as F
        shape = list(F.resize(torch.rand(3, 64, 48), [32, 24]).shape)
        from transformers import AutoProcessor
        proc = AutoProcessor.from_pretrained({str(tiny_vl_processor_dir)!r})
        from PIL import Image
        out = proc(text=["<|vision_start|><|image_pad|><|vision_end|>hi"], images=[Image.new("RGB", (64, 64))],
                   return_tensors="pt")
        got = {{"ok": True, "shape": shape, "processor": type(proc).__name__,
                "grid": out["image_grid_thw"].tolist(), "tokens": int(out["input_ids"].shape[1]),
                "text_tokens": len(proc.tokenizer("hi")["input_ids"])}}
    except Exception as exc:
        got = {{"ok": False, "error": f"{{type(exc).__name__}}: {{exc}}"}}
    print(json.dumps(got))
    """
    with_schemas = _json(_run(code, tmp_path))
    assert with_schemas["ok"], with_schemas
    assert with_schemas["shape"] == [3, 32, 24] and with_schemas["processor"] == "Qwen3VLProcessor"
    assert with_schemas["grid"] == [[1, 4, 4]]  # 64x64 px in 16-px patches; 2x2 merge -> 4 image tokens
    # <|image_pad|> expanded to 4 image tokens, plus vision start/end and the tokens of "hi"
    assert with_schemas["tokens"] == 4 + 2 + with_schemas["text_tokens"]
    without = _json(_run(code, tmp_path, patches="verl_cpu:off"))
    assert not without["ok"] and "torchvision::nms does not exist" in without["error"]


@pytest.mark.skipif(not _HAS_TORCHVISION, reason="torchvision is not installed in the verl CPU stack "
                    "(tools/install_verl_cpu.sh installs it with --no-deps)")
def test_torchvision_op_schemas_each_route_alone(tmp_path):
    """The schemas are declared by either route alone: right after ``torch`` loads (when the post-import hook
    on ``torchvision.extension`` is skipped, as it once was in a Ray worker of a real run) or right after
    ``torchvision.extension`` ran; each process reports which route acted. Removing a route fails its case."""
    code = """
    import json, sys
    import bench_patches
    from bench_patches import verl_cpu
    routes = {"torch": verl_cpu._tv_schemas_at_torch_import, "torchvision.extension": verl_cpu._install_tv_schemas}
    for name, hook in routes.items():
        if name != sys.argv[1] and hook in bench_patches._HOOKS.get(name, []):
            bench_patches._HOOKS[name].remove(hook)
    try:
        import torch
        import torchvision
        from torchvision.transforms.v2 import functional as F
        got = {"ok": True, "shape": list(F.resize(torch.rand(3, 8, 6), [4, 3]).shape)}
    except Exception as exc:
        got = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    acts = bench_patches.REPORT.patches["verl_cpu"]["actions"]
    got["routes"] = [a.split(") ", 1)[1].split(" so ")[0] for a in acts if a.startswith("torchvision_op_schemas")]
    print(json.dumps(got))
    """
    for route, said in (("torch", "at torch import"), ("torchvision.extension", "after torchvision.extension")):
        got = _json(_run(code.replace("sys.argv[1]", repr(route)), tmp_path, patches="verl_cpu:torchvision"))
        assert got["ok"] and got["shape"] == [3, 4, 3], (route, got)
        assert got["routes"] == [said], (route, got)
