"""Is the verl CPU stack installed? One probe for every test module that needs it (issue 31).

``import vllm`` alone takes about 16 s on 2 busy cores; each of the four modules that skip without the stack
used to start the stack's interpreter for it at import, so collecting the suite paid it four times. The probe
below imports vllm and verl (a broken install skips, as before) and looks torchvision up, all in one
subprocess, once per pytest process and interpreter.
"""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path

from bench.engines.verl_cpu.target import verl_python

_PROBE = """
import importlib, importlib.util, json
found = {}
for name in ("vllm", "verl"):
    try:
        importlib.import_module(name)
        found[name] = True
    except Exception:
        found[name] = False
found["torchvision"] = importlib.util.find_spec("torchvision") is not None
print(json.dumps(found))
"""
#: the reason of a skip without the stack
NOT_INSTALLED = "the verl CPU stack is not installed (bash tools/install_verl_cpu.sh)"


@functools.lru_cache(maxsize=None)
def _probe(python: str) -> dict[str, bool]:
    none = {"vllm": False, "verl": False, "torchvision": False}
    if not Path(python).exists():
        return none
    p = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True)
    try:
        return {**none, **json.loads(p.stdout.strip().splitlines()[-1])} if p.returncode == 0 else none
    except (IndexError, ValueError):
        return none


def has(*modules: str) -> bool:
    """Whether the verl CPU stack's interpreter (:func:`verl_python`) imports each of ``modules`` (``vllm``,
    ``verl``; ``torchvision``: found, not imported)."""
    found = _probe(verl_python())
    return all(found[m] for m in modules)
