"""The bad-input promise checked through the real entry point: ``python run_bench.py ...`` in a subprocess
(exit 2, exactly one stderr line, no library wording, nothing created or changed under the working folder, a
wall-clock cap). The in-process twin is :func:`_badinput.check_refused`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from _badinput import LIBRARY_TEXT, tree

ROOT = Path(__file__).resolve().parents[1]


def cli(box: Path, argv: list[str], expected: str | tuple[str, ...] = "", code: int = 2,
        cap_s: float = 60.0) -> str:
    """Run ``python run_bench.py *argv`` in ``box``; assert the promise; returns the one stderr line.

    ``cap_s``: the wall-clock cap of the whole subprocess (start and imports included; a busy machine may take a
    few seconds to import the harness). ``expected``: fragment(s) the line must contain.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "GITHUB_STEP_SUMMARY")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    before = tree(box)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), *argv], cwd=box, env=env,
                          capture_output=True, text=True, timeout=cap_s + 30, stdin=subprocess.DEVNULL)
    wall = time.monotonic() - start
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == code, f"exit {proc.returncode}, stderr: {proc.stderr}"
    assert len(lines) == 1, proc.stderr
    for frag in LIBRARY_TEXT:
        assert frag not in proc.stdout + proc.stderr, f"library text {frag!r} in: {proc.stderr}"
    for frag in (expected,) if isinstance(expected, str) else expected:
        assert frag in lines[0], lines[0]
    after = tree(box)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert not changed, f"files created or changed: {changed}"
    assert wall < cap_s, f"took {wall:.1f} s"
    return lines[0]
