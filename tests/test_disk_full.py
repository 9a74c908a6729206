"""A full disk under the results folder (issue 33), through the real entry point (``run_bench.py`` in a
subprocess) on a real tmpfs filled to the last byte: ``run`` (the MLflow store is the first thing it would create),
``report``, ``baseline save``, ``tune`` and ``sync`` each end with our one disk-full line and exit 1
(docs/guarantees.md), no traceback, no crash log, no half-made MLflow store left behind, and the sweep's own files
unchanged.
Skipped, with the reason, where a tmpfs cannot be mounted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _badinput import GOOD, TUNE, give_specs
from _sweeps import EMBEDDED_CELLS, make_sweep
from _tmpfs import mounted_tmpfs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def full_disk(tmp_path):
    """A 4 MiB tmpfs holding a synthetic sweep ``synth`` under ``res/``, then filled to the last byte."""
    with mounted_tmpfs(tmp_path / "full", "4m") as mnt:
        make_sweep(mnt / "res", "synth", EMBEDDED_CELLS[:2], repeats=2, seed=1)
        give_specs(next((mnt / "res" / "synth").glob("2*")))  # sync reads each run's spec, as of a real sweep
        for name, chunk in (("filler", 65536), ("filler2", 1)):  # every free block, then the last bytes
            fd = os.open(mnt / name, os.O_WRONLY | os.O_CREAT)
            try:
                while os.write(fd, b"\0" * chunk):
                    pass
            except OSError:
                pass
            finally:
                os.close(fd)
        assert shutil.disk_usage(mnt).free < 4096
        yield mnt


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _paths(folder: Path) -> list[str]:
    """Every file, folder and link under ``folder`` (a 0-byte lock file and an empty folder included)."""
    return [str(p.relative_to(folder)) for p in folder.rglob("*")]


def _bench(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(cwd)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, str(ROOT / "run_bench.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("argv", [
    ["run", "m.yaml", "--results", "res"],
    ["report", "synth", "--results", "res"],
    ["baseline", "save", "synth", "--name", "b", "--results", "res"],
    ["tune", "t.yaml", "--results", "res"],
    ["sync", "synth", "--results", "res"],
], ids=["run", "report", "baseline-save", "tune", "sync"])
def test_full_disk_gives_one_line_and_exit_1(full_disk, tmp_path, argv):
    (tmp_path / "m.yaml").write_text(GOOD)
    (tmp_path / "t.yaml").write_text(TUNE)
    argv = [str(tmp_path / a) if a.endswith(".yaml") else a for a in argv]
    before = _files(full_disk / "res")
    paths_before = _paths(full_disk)
    p = _bench(argv, full_disk)
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 1, p.stdout + p.stderr
    assert len(err) == 1 and err[0].startswith("error: ") and "disk full" in err[0], p.stderr
    assert "free" in err[0] and "rerun" in err[0], err[0]
    assert "Traceback" not in p.stdout + p.stderr and "unexpected" not in err[0]
    after = _files(full_disk / "res")
    assert not (full_disk / "res" / "mlflow.db").exists(), sorted(after)  # no half-made store
    made = sorted(set(_paths(full_disk)) - set(paths_before))
    assert not made, made  # nothing half-made left behind: no lock, no empty matrix folder (it held no sweep)
    assert {k: v for k, v in after.items() if k in before} == before  # the sweep's files untouched
    assert not list(full_disk.glob("error-*.log")) and not list((full_disk / "res").rglob("error-*.log"))
