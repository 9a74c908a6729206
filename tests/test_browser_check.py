"""The browser check (``tools/browser_check.py``) end to end: real mlflow server, optuna-dashboard, sweep,
tune and headless Chromium. Skipped where Debian's ``chromium`` / ``chromium-driver`` are not installed."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "browser_check.py"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SHOTS = ("0_experiment_plain_url.png", "1_experiment_runs.png", "2_parent_run.png", "3_child_step_time.png",
         "4_parent_cells_table.png", "5_optuna_study.png")
#: the script takes about 2-3 minutes on 2 busy cores, 8 minutes at load 18-20 (2026-12-07, beside the other half of
#: the suite and seven other engineers' jobs); past this it is ended (SIGTERM: it ends its servers)
TIMEOUT_S = 900

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)),
                       reason=f"needs {CHROMIUM} and {CHROMEDRIVER} (apt-get install chromium chromium-driver)"),
]


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG file (from its IHDR chunk)."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_browser_check_passes_and_writes_screenshots(tmp_path):
    out = tmp_path / "shots"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--out", str(out), "--wait", "45"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the script ends the process groups it started, then exits
        try:
            output, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        pytest.fail(f"browser check still running after {TIMEOUT_S} s:\n{output[-4000:]}")
    lines = [ln for ln in output.splitlines() if ln.startswith(("PASS", "FAIL", "NOTE"))]
    assert proc.returncode == 0, output[-6000:]
    assert lines and not any(ln.startswith("FAIL") for ln in lines), output[-6000:]
    for name in ("experiment opens on the runs list", "sweep name in the runs list", "cell names in the runs list",
                 "child step-time chart", "parent cells table (cells.json)", "optuna objective name"):
        assert any(ln.startswith(f"PASS {name}:") for ln in lines), f"no PASS line for {name!r}:\n{output[-4000:]}"
    assert (out / "checks.txt").read_text().splitlines() == lines
    for shot in SHOTS:
        w, h = png_size(out / shot)
        assert w >= 800 and h >= 600, f"{shot}: {w}x{h}"


def test_browser_check_bad_driver_path_is_bad_input(tmp_path):
    missing = tmp_path / "no-such-chromedriver"
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "o"), "--chromedriver", str(missing)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"error: --chromedriver {missing}: not an executable file (Debian: apt-get install chromium chromium-driver)"]
    assert not (tmp_path / "o").exists()
