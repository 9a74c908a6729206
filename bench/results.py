"""The results folder: sweeps, run folders, atomic writes, resume and the lock.

Layout (a person can browse it)::

    results/<matrix name>/
        latest -> <sweep id>                 newest sweep (relative symlink)
        .lock                                one harness per matrix at a time
        <sweep id>/                          YYYYmmdd-HHMMSS-<matrix fingerprint>
            sweep.json                       matrix, plan, MLflow parent run, timings
            summary.csv / summary.md         one row per cell (speedup vs the all-off cell)
            <cell id>/spec.json              the RunSpec (levels, merged cells, launch)
            <cell id>/r<k>/                  repeat k: run.log, metrics.jsonl, run_config.yaml, trace/,
                                             evidence.json, record.json (written last, atomically)

A cell repeat is *finished* when its ``record.json`` says ``status: ok``. Rerunning the same matrix
(same fingerprint and platform) resumes the newest such sweep and skips finished repeats; ``--force``
starts a new sweep.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from bench.errors import BenchError

RECORD = "record.json"
SWEEP = "sweep.json"


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and ``os.replace``.

    A reader sees the old or the new content, never a partial file, even if the process is killed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    """:func:`atomic_write_text` of ``data`` as indented JSON (non-JSON values via ``str``)."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> Any | None:
    """The JSON content of ``path``, or ``None`` when missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def check_writable(root: Path) -> None:
    """Fail early, writing nothing, when ``root`` (or its nearest existing parent) is not writable.

    Raises:
        BenchError: naming the folder.
    """
    root = Path(root)
    probe = root
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise BenchError(f"--results {root}: folder is not writable ({probe})")


def new_sweep_id(fingerprint: str) -> str:
    """``YYYYmmdd-HHMMSS-<fingerprint>`` in local time; sorts by start time."""
    return time.strftime("%Y%m%d-%H%M%S") + f"-{fingerprint}"


class ResultsDir:
    """The results folder of one matrix (``<root>/<matrix name>``)."""

    def __init__(self, root: Path, matrix_name: str):
        self.root = Path(root)
        self.base = self.root / matrix_name

    def lock(self) -> FileLock:
        """A lock for this matrix's folder; acquire with ``with rd.lock():``.

        Raises (on acquire): BenchError when another harness holds it.
        """
        self.base.mkdir(parents=True, exist_ok=True)
        return _NamedLock(str(self.base / ".lock"))

    def sweeps(self) -> list[Path]:
        """Sweep folders, oldest first."""
        if not self.base.is_dir():
            return []
        return sorted(p for p in self.base.iterdir() if not p.is_symlink() and p.is_dir() and (p / SWEEP).exists())

    def find_resumable(self, fingerprint: str, platform: str) -> Path | None:
        """The newest sweep of the same matrix content and platform, or ``None``."""
        for sweep in reversed(self.sweeps()):
            meta = read_json(sweep / SWEEP) or {}
            if meta.get("fingerprint") == fingerprint and meta.get("platform") == platform:
                return sweep
        return None

    def resolve_sweep(self, ref: str | Path) -> Path:
        """A sweep folder from a path, ``<matrix>/<sweep id>``, a sweep id, or ``latest``.

        Raises:
            BenchError: no such sweep.
        """
        cand = [Path(ref), self.base / str(ref)]
        for c in cand:
            if (c / SWEEP).exists():
                return c.resolve()
        raise BenchError(f"{ref}: no sweep found (looked for {SWEEP} in {', '.join(map(str, cand))})")

    def point_latest(self, sweep: Path) -> None:
        """Atomically point ``latest`` at ``sweep`` (relative symlink)."""
        link = self.base / "latest"
        tmp = self.base / f".latest.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        os.symlink(sweep.name, tmp)
        os.replace(tmp, link)


def find_sweep(ref: str | Path, root: Path) -> Path:
    """Resolve a sweep reference given on the command line.

    Accepts a sweep folder, a matrix folder (its ``latest``), ``<matrix name>`` or
    ``<matrix name>/<sweep id>`` under ``root``.

    Raises:
        BenchError: nothing matches.
    """
    for cand in (Path(ref), Path(ref) / "latest", Path(root) / str(ref), Path(root) / str(ref) / "latest"):
        if (cand / SWEEP).exists():
            return cand.resolve()
    raise BenchError(f"{ref}: no sweep found (give a sweep folder, or a matrix name under {root})")


def run_dir(sweep: Path, cell_id: str, repeat: int) -> Path:
    """The folder of one repeat of one cell."""
    return Path(sweep) / cell_id / f"r{repeat}"


def load_records(sweep: Path) -> list[dict]:
    """Every ``record.json`` of a sweep (finished or failed), ordered by cell id then repeat."""
    out = []
    for path in sorted(Path(sweep).glob(f"*/r*/{RECORD}")):
        rec = read_json(path)
        if rec is not None:
            rec["_dir"] = str(path.parent)
            out.append(rec)
    return out


class _NamedLock(FileLock):
    """FileLock that fails at once with a BenchError instead of waiting for another harness."""

    def __enter__(self):  # type: ignore[override]
        try:
            self.acquire(timeout=0)
        except Timeout:
            raise BenchError(f"{self.lock_file}: another harness is running this matrix (remove the lock if not)") from None
        return self
