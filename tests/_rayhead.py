"""A real local Ray head (or a head plus worker nodes) for tests: free ports, its own temp folder and HOME,
only 127.0.0.1 addresses for the multi-node cluster, every process stopped afterwards."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_head(auth: dict[str, str], ray_bin: Path | None = None, cpus: int = 2, gpus: int = 0):
    """Start ``ray start --head --block`` with ``auth`` in its environment and HOME in its own temp folder
    (so nothing in the real ``~/.ray`` — e.g. an ``auth_token`` a local verl run left — changes how it starts).
    ``ray_bin``: the ``ray`` CLI (default: next to this Python); ``cpus``/``gpus``: logical resources.
    Yields the job server address; always stopped."""
    ray_bin = Path(ray_bin) if ray_bin else Path(sys.executable).parent / "ray"
    if not ray_bin.exists():
        pytest.skip("the ray CLI is not installed next to this Python")
    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths are length-limited
    dport = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HOME": temp, **auth}
    for k in ("BENCH_PATCHES", "BENCH_RUN_DIR", "RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH"):
        env.pop(k, None)
    if "RAY_AUTH_TOKEN" not in auth:
        env.pop("RAY_AUTH_TOKEN", None)
    cmd = [
        str(ray_bin),
        "start",
        "--head",
        "--block",
        f"--num-cpus={cpus}",
        f"--num-gpus={gpus}",
        f"--port={free_port()}",
        f"--dashboard-port={dport}",
        "--dashboard-host=127.0.0.1",
        "--include-dashboard=true",
        f"--ray-client-server-port={free_port()}",
        f"--temp-dir={temp}",
        # own agent ports: a second head (e.g. the token-auth one beside the module's head) must not find
        # the first head's dashboard agent on Ray's default ports ("No available agent to submit job")
        *(
            f"--{opt}={free_port()}"
            for opt in (
                "dashboard-agent-listen-port",
                "dashboard-agent-grpc-port",
                "metrics-export-port",
                "runtime-env-agent-port",
            )
        ),
    ]
    log = open(Path(temp) / "ray-start.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    address = f"http://127.0.0.1:{dport}"
    headers = {"authorization": f"Bearer {auth['RAY_AUTH_TOKEN']}"} if "RAY_AUTH_TOKEN" in auth else None
    try:
        from ray.job_submission import JobSubmissionClient

        deadline = time.time() + 60
        while True:
            try:
                JobSubmissionClient(address, headers=headers).list_jobs()
                break
            except Exception:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(
                        f"ray head did not come up: {(Path(temp) / 'ray-start.log').read_text()[-2000:]}"
                    )
                time.sleep(0.5)
        yield address
    finally:
        _stop(proc, timeout_s=30)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _agent_ports() -> list[str]:
    return [f"--{opt}={free_port()}" for opt in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                 "metrics-export-port", "runtime-env-agent-port",
                                                 "node-manager-port", "object-manager-port")]


def _stop(proc: subprocess.Popen, timeout_s: float = 45) -> None:
    """SIGTERM a `ray start --block` process (it drains and shuts its processes down), wait up to ``timeout_s``
    seconds, then SIGKILL whatever is left of the process group the test started."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group this test started
    except ProcessLookupError:
        pass
    proc.wait()


def start_cluster(auth: dict[str, str], nodes: list[dict], timeout_s: float = 120):
    """Start a Ray cluster of ``len(nodes)`` nodes on this machine: a head (``nodes[0]``) and worker nodes
    (``ray start --address 127.0.0.1:GCS_PORT``), each a ``ray start --block`` process of its own with its own
    ``num_cpus`` and ``resources`` (``nodes[i] = {"cpus": 1, "resources": {"bench_node": 1}}``), every node on
    127.0.0.1 (``_ray_loopback.py``), free ports, a temp folder and HOME of its own. Yields the job server
    address once every node is alive; always stops every node (workers first) and removes the folder."""
    launcher = [sys.executable, str(Path(__file__).with_name("_ray_loopback.py")), "start", "--block",
                "--node-ip-address=127.0.0.1"]
    temp = tempfile.mkdtemp(prefix="rc", dir="/tmp")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HOME": temp, **auth}
    for k in ("BENCH_PATCHES", "BENCH_RUN_DIR", "RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH"):
        env.pop(k, None)
    if "RAY_AUTH_TOKEN" not in auth:
        env.pop("RAY_AUTH_TOKEN", None)
    gcs, dport = free_port(), free_port()
    address = f"http://127.0.0.1:{dport}"

    def opts(node: dict) -> list[str]:
        return [f"--num-cpus={node.get('cpus', 1)}", "--num-gpus=0",
                f"--resources={json.dumps(node.get('resources') or {})}", *_agent_ports()]

    procs: list[subprocess.Popen] = []
    logs = []

    def launch(cmd: list[str], name: str) -> None:
        logs.append(open(Path(temp) / f"{name}.log", "w"))
        procs.append(subprocess.Popen(cmd, stdout=logs[-1], stderr=subprocess.STDOUT, env=env, start_new_session=True))

    def tails() -> str:
        return " | ".join(f"{p.name}: {p.read_text()[-800:]}" for p in sorted(Path(temp).glob("*.log")))

    try:
        launch([*launcher, "--head", f"--port={gcs}", f"--dashboard-port={dport}", "--dashboard-host=127.0.0.1",
                "--include-dashboard=true", f"--ray-client-server-port={free_port()}", f"--temp-dir={temp}",
                *opts(nodes[0])], "head")
        from ray.job_submission import JobSubmissionClient
        from ray.util.state import StateApiClient
        from ray.util.state.common import ListApiOptions, StateResource

        headers = {"authorization": f"Bearer {auth['RAY_AUTH_TOKEN']}"} if "RAY_AUTH_TOKEN" in auth else None
        deadline = time.time() + timeout_s
        while True:
            try:
                JobSubmissionClient(address, headers=headers).list_jobs()
                break
            except Exception:
                if procs[0].poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"ray head did not come up: {tails()}")
                time.sleep(0.5)
        for i, node in enumerate(nodes[1:], 1):
            launch([*launcher, f"--address=127.0.0.1:{gcs}", *opts(node)], f"node{i}")
        while True:
            try:
                found = StateApiClient(address, headers=headers).list(
                    StateResource.NODES, options=ListApiOptions(detail=True), raise_on_missing_output=False)
                if sum(str(n.state) == "ALIVE" for n in found) >= len(nodes):
                    break
            except Exception:
                pass
            if any(p.poll() is not None for p in procs) or time.time() > deadline:
                raise RuntimeError(f"the {len(nodes)} Ray nodes did not come up: {tails()}")
            time.sleep(0.5)
        yield address
    finally:
        for proc in reversed(procs):
            _stop(proc)
        for fh in logs:
            fh.close()
        shutil.rmtree(temp, ignore_errors=True)
