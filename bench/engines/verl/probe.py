"""The verl machine probe: in a child process (patches never touch the harness) import verl, run verl's
own ``validate_config`` on each composed override list and count the devices (:func:`probe_machine`).

Child side: ``python -m bench.engines.verl.probe --probe PLATFORM OVERRIDES.json``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.engines.verl.config import fast_compose


def probe_machine(platform: str, override_lists: list[list[str]] = (), timeout_s: float = 900,
                  python: str = sys.executable) -> dict[str, Any]:
    """In a child process (patches never touch the harness): import verl, run verl's own
    ``validate_config`` on each composed override list, count the ``platform`` devices.

    Returns:
        ``{"verl": version, "devices": n, "detail": why 0, "invalid": {"index": i, "error": msg}}``, or
        ``{"error": msg}`` when verl does not import or the probe fails.
    """
    import tempfile

    env = {k: v for k, v in os.environ.items() if k not in ("BENCH_PATCHES", "BENCH_RUN_DIR")}
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump([list(o) for o in override_lists], fh)
        path = fh.name
    try:
        proc = subprocess.run([python, "-m", "bench.engines.verl.probe", "--probe", platform, path],
                              capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"the verl probe (import, config validation, devices) took over {timeout_s:g} s"}
    finally:
        os.unlink(path)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{\"")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the verl probe failed: {tail}"}
    return json.loads(lines[-1])


def _probe(platform: str, path: str) -> dict[str, Any]:
    """The child side of :func:`probe_machine`."""
    import warnings

    out: dict[str, Any] = {}
    try:
        import verl

        out["verl"] = getattr(verl, "__version__", "?")
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        return {"error": f"verl does not import: {type(exc).__name__}: {first}"}
    try:
        from verl.trainer.ppo.utils import need_critic
        from verl.utils.config import validate_config
    except ImportError:
        validate_config = None
    if validate_config is not None:
        for i, overrides in enumerate(json.loads(Path(path).read_text())):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    cfg = fast_compose(overrides)
                    use_ref = bool(
                        cfg.algorithm.get("use_kl_in_reward", False) or cfg.actor_rollout_ref.actor.use_kl_loss
                    )
                    validate_config(config=cfg, use_reference_policy=use_ref, use_critic=need_critic(cfg))
            except Exception as exc:
                msg = " ".join(str(exc).split())[:400]
                out["invalid"] = {"index": i, "error": f"{type(exc).__name__}: {msg}"}
                break
    try:
        import torch

        if platform == "npu":
            try:
                import torch_npu  # noqa: F401
            except Exception as exc:
                out.update(devices=0, detail=f"torch_npu does not import: {exc}")
            else:
                out["devices"] = torch.npu.device_count() if torch.npu.is_available() else 0
        elif platform == "cpu":  # ranks are processes on the host; vLLM's CPU build serves the rollout
            out["devices"] = os.cpu_count() or 1
            if importlib.util.find_spec("vllm") is None:
                out.update(devices=0, detail="vLLM is not installed beside verl (bash tools/install_verl_cpu.sh)")
        else:
            out["devices"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:
        out.update(devices=0, detail=f"{type(exc).__name__}: {exc}")
    return out


if __name__ == "__main__":  # python -m bench.engines.verl.probe --probe PLATFORM OVERRIDES.json
    if len(sys.argv) == 4 and sys.argv[1] == "--probe":
        print(json.dumps(_probe(sys.argv[2], sys.argv[3])))
    else:
        sys.exit("usage: python -m bench.engines.verl.probe --probe PLATFORM OVERRIDES.json")
