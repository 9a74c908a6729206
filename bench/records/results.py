"""The results folder: sweeps, run folders, resume and the lock (atomic writes: :mod:`bench.core.files`).

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
import re
import shutil
import time
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from bench.core.errors import (  # noqa: F401 - re-exported
    NO_SPACE,
    BenchError,
    DiskFullError,
    InputError,
    did_you_mean,
    is_no_space,
)
from bench.core.files import read_json
from bench.core.inputs import check_numbers
from bench.core.paths import check_folder, check_matrix_folder, check_names
from bench.records.run_record import RECORD, load_records  # noqa: F401 - the record loader, re-exported for readers
from bench.spec.optimizations import REGISTRY
from bench.spec.stack import STACK_FACTOR

SWEEP = "sweep.json"
#: what the library calls the results folder in its messages (:class:`bench.core.errors.InputError`; ``--results``
#: in the commands)
RESULTS_FOLDER = "results folder"


def folder_size(path: Path) -> int:
    """Bytes of the regular files under ``path`` (0 when missing)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def free_bytes(path: Path) -> int | None:
    """Free bytes on the file system of ``path`` (or its nearest existing parent); ``None`` if unknown."""
    path = Path(path)
    while not path.exists() and path.parent != path:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def check_writable(root: Path, matrix_name: str | None = None) -> None:
    """Fail early, writing nothing, when ``root`` (or its nearest existing parent) is not writable, or (given
    ``matrix_name``) when ``<root>/<matrix_name>`` or its ``latest`` is not what the harness made there
    (:func:`bench.core.paths.check_matrix_folder`).

    Raises:
        BenchError: naming the folder.
    """
    if matrix_name is not None:
        check_matrix_folder(root, matrix_name)
    root = Path(root)
    probe = root
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(RESULTS_FOLDER, f"{RESULTS_FOLDER} {root}: folder is not writable ({probe})")


def check_output_folder(out: Path, files: tuple[str, ...], given: bool) -> None:
    """Refuse, before anything is computed or written, an output folder ``out`` the harness cannot fill with
    ``files``: the folder (or its nearest existing parent) a file, a read-only mount or not writable
    (:func:`bench.core.paths.check_folder`), or one of ``files`` inside it a folder or something else than a file.
    ``given``: ``out`` came from ``--out`` (else it is the command's default place, and the message says so).

    Raises:
        BenchError: naming the path, what is in the way and what to do.
    """
    flag = "--out" if given else "output folder"
    hint = "" if given else " (move it away, or give --out DIR)"
    try:
        check_folder(flag, out)
    except BenchError as exc:
        raise BenchError(f"{exc}{hint}") from None
    for name in files:
        p = Path(out) / name
        if os.path.lexists(p) and not p.is_symlink() and not p.is_file():  # a link is replaced, never followed
            kind = "a folder" if p.is_dir() else "not a regular file"
            raise BenchError(f"{flag} {out}: {p} is {kind} (move it away; the harness writes a file there)")


def check_baseline_slot(ref: str | None, results: Path) -> None:
    """Refuse a baseline name whose file ``<results>/baselines/<ref>.json`` exists as a folder or other
    non-file (read by ``baseline show``, ``gate --baseline`` and ``compare``, written by ``baseline save``).

    Raises:
        BenchError: naming the path.
    """
    if not ref or "/" in ref or ref.endswith(".json"):
        return
    p = Path(results) / "baselines" / f"{ref}.json"
    if os.path.lexists(p) and not p.is_file():
        kind = "a folder" if p.is_dir() else "a dangling link" if p.is_symlink() else "not a regular file"
        raise BenchError(f"baseline {ref}: {p} is {kind} (a baseline is a JSON file; move it away)")


def new_sweep_id(fingerprint: str) -> str:
    """``YYYYmmdd-HHMMSS-<fingerprint>`` in local time; sorts by start time."""
    return time.strftime("%Y%m%d-%H%M%S") + f"-{fingerprint}"


class ResultsDir:
    """The results folder of one matrix (``<root>/<matrix name>``)."""

    def __init__(self, root: Path, matrix_name: str):
        self.root = Path(root)
        self.base = self.root / matrix_name
        #: what was wrong with each sweep the last :meth:`find_resumable` passed over (its ``sweep.json``)
        self.unusable: list[str] = []

    def lock(self) -> FileLock:
        """A lock for this matrix's folder; acquire with ``with rd.lock():``.

        Raises:
            BenchError: the matrix folder exists as something else than a folder; (on acquire) another
                harness holds the lock.
        """
        check_matrix_folder(self.root, self.base.name)  # the folder, its latest link and its .lock, each by name
        made_base = not os.path.lexists(self.base)
        made_lock = made_base or not os.path.lexists(self.base / ".lock")
        self.base.mkdir(parents=True, exist_ok=True)
        lock = _NamedLock(str(self.base / ".lock"))
        lock.made = (made_base, made_lock)
        return lock

    def sweeps(self) -> list[Path]:
        """Sweep folders, oldest first."""
        if not self.base.is_dir():
            return []
        return sorted(p for p in self.base.iterdir() if not p.is_symlink() and p.is_dir() and (p / SWEEP).exists())

    def find_resumable(self, fingerprint: str, platform: str, cell_ids: list[str] | None = None) -> Path | None:
        """The newest sweep of the same matrix content and platform, or ``None``. A sweep whose ``sweep.json``
        is unusable is never resumed: what is wrong is added to :attr:`unusable` (the sweep names it). With
        ``cell_ids`` (this plan's), the newest such sweep is not resumed either when its cells differ: the same
        matrix launches other runs since the harness or an engine changed (a new sweep starts, the old one stays)."""
        self.unusable = []
        for sweep in reversed(self.sweeps()):
            try:
                meta = check_sweep_meta(sweep / SWEEP)
            except BenchError as exc:
                self.unusable.append(str(exc))
                continue
            if meta.get("fingerprint") == fingerprint and meta.get("platform") == platform:
                if cell_ids is not None and {c["cell_id"] for c in meta["plan"]["runs"]} != set(cell_ids):
                    self.unusable.append(f"{sweep}: its cells' launches differ from this harness's (same matrix, "
                                         "changed engine or harness code)")
                    return None
                return sweep
        return None

    def new_sweep(self, fingerprint: str) -> Path:
        """Make the folder of a new sweep (:func:`new_sweep_id`) and return it; a sweep of the same matrix begun in
        the same second waits for the next one."""
        while (self.base / new_sweep_id(fingerprint)).exists():
            time.sleep(0.1)
        out = self.base / new_sweep_id(fingerprint)
        out.mkdir(parents=True)
        return out

    def resolve_sweep(self, ref: str | Path) -> Path:
        """A sweep folder from a path, ``<matrix>/<sweep id>``, a sweep id, or ``latest``.

        Raises:
            BenchError: no such sweep.
        """
        check_names("sweep", Path(ref), ref)
        cand = [Path(ref), self.base / str(ref)]
        for c in cand:
            if (c / SWEEP).exists():
                return c.resolve()
        raise BenchError(f"{ref}: no sweep found (looked for {SWEEP} in {', '.join(map(str, cand))})")

    def point_latest(self, sweep: Path) -> None:
        """Atomically point ``latest`` at ``sweep`` (relative symlink)."""
        link = self.base / "latest"
        if link.exists() and not link.is_symlink():
            raise BenchError(f"{link}: exists and is not the 'latest' link (move it away)")
        tmp = self.base / f".latest.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        os.symlink(sweep.name, tmp)
        os.replace(tmp, link)


def find_sweep(ref: str | Path, root: Path) -> Path:
    """Resolve a sweep reference given on the command line.

    Accepts a sweep folder, a matrix folder (its ``latest``), ``<matrix name>`` or
    ``<matrix name>/<sweep id>`` under ``root``.

    Raises:
        BenchError: nothing matches, or ``ref`` has a name longer than the file system allows (it was an
            "unexpected OSError: File name too long", exit 1).
    """
    check_names("sweep", Path(ref), ref)
    for cand in (Path(ref), Path(ref) / "latest", Path(root) / str(ref), Path(root) / str(ref) / "latest"):
        if (cand / SWEEP).exists():
            check_sweep_meta(cand / SWEEP)
            return cand.resolve()
    names = sorted(p.name for p in Path(root).iterdir() if (p / "latest" / SWEEP).exists()) if Path(root).is_dir() \
        else []
    raise BenchError(f"{ref}: no sweep found{did_you_mean(str(ref), names)} (give a sweep folder, or a matrix name "
                     f"under {root}: {', '.join(names[:20]) or 'none yet'})")


def check_sweep_meta(path: Path) -> dict:
    """Read a ``sweep.json`` and check the shape readers rely on (``plan.runs`` of cells with ``cell_id``,
    ``label`` and ``levels``) and every number in it (finite; not negative outside :data:`SWEEP_SIGNED`); returns
    it.

    Raises:
        BenchError: unreadable, not JSON, or missing/mistyped keys (naming the file and key).
    """
    meta = read_json(path)
    if not isinstance(meta, dict):
        raise BenchError(f"{path}: not a sweep record (unreadable or not a JSON object)")
    runs = (meta.get("plan") or {}).get("runs") if isinstance(meta.get("plan"), dict) else None
    if not isinstance(runs, list):
        raise BenchError(f"{path}: not a sweep record: plan.runs missing")
    if not runs:
        raise BenchError(f"{path}: plan.runs is empty (allowed: the sweep's cells, at least one)")
    if len(runs) > MAX_PLANNED_RUNS:
        raise BenchError(f"{path}: plan.runs has {len(runs)} cells (allowed: at most {MAX_PLANNED_RUNS})")
    seen: dict[str, int] = {}
    for i, run in enumerate(runs):
        if not (isinstance(run, dict) and isinstance(run.get("cell_id"), str) and isinstance(run.get("label"), str)
                and isinstance(run.get("levels"), dict)):
            raise BenchError(f"{path}: plan.runs[{i}]: needs cell_id, label and levels")
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", run["cell_id"]):  # a folder of this sweep
            raise BenchError(f"{path}: plan.runs[{i}].cell_id {run['cell_id'][:60]!r}: not a cell folder name")
        if run["cell_id"] in seen:  # a reader would count that cell's runs twice
            raise BenchError(f"{path}: plan.runs[{i}].cell_id {run['cell_id']!r}: listed twice (also "
                             f"plan.runs[{seen[run['cell_id']]}]; allowed: each cell once)")
        seen[run["cell_id"]] = i
        check_levels(run["levels"], f"{path}: plan.runs[{i}].levels")
    matrix = meta.get("matrix")
    if not isinstance(matrix, dict):
        got = "missing" if matrix is None else f"{type(matrix).__name__} {str(matrix)[:40]!r}"
        raise BenchError(f"{path}: matrix: {got} (allowed: a JSON object, the matrix as the sweep ran it)")
    for key, kind in (("base", dict), ("design", dict), ("expect", list)):
        if matrix.get(key) is not None and not isinstance(matrix[key], kind):
            raise BenchError(f"{path}: matrix.{key}: {type(matrix[key]).__name__} (allowed: "
                             f"{'a JSON object' if kind is dict else 'a list'})")
    seq = meta.get("sequential") if isinstance(meta.get("sequential"), dict) else {}
    if "repeats" not in meta["plan"]:  # read as 1, a missing repeat of a 2-repeat sweep was not reported pending
        raise BenchError(f"{path}: not a sweep record: plan.repeats missing (allowed: an integer >= 1, the repeats "
                         "the sweep planned)")
    for key, value in (("plan.repeats", meta["plan"]["repeats"]),
                       ("sequential.stopped_after", 1 if seq.get("stopped_after") is None else seq["stopped_after"])):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
            raise BenchError(f"{path}: not a sweep record: {key} {value!r} (allowed: an integer >= 1)")
    for key in ("engine", "platform", "matrix_name"):
        if not isinstance(meta.get(key), str):
            raise BenchError(f"{path}: not a sweep record: {key} missing")
    check_numbers(meta, str(path), signed=SWEEP_SIGNED, free=SWEEP_FREE)
    return meta


#: key paths of a ``sweep.json`` whose numbers may be negative (:func:`bench.core.inputs.check_numbers`): the matrix as
#: it ran (its model checked it then; an ``expect`` bound may be negative) and the sequential rule's state
SWEEP_SIGNED = ("matrix*", "sequential*")
#: key paths not checked: the sequential looks' statistics (an estimate not yet computable is stored as NaN)
SWEEP_FREE = ("sequential.looks*",)


#: most cells a ``sweep.json`` may plan (a real design of 9 two-level factors has 512)
MAX_PLANNED_RUNS = 10_000


def check_levels(levels: dict[str, Any], where: str) -> None:
    """Check a cell's factor levels as a results file holds them: each key a registered factor, each value
    one of that factor's levels (an integer, never a boolean or text) or ``null`` (not applicable).

    Raises:
        BenchError: ``where`` (file and key path), the factor or value, and what is allowed.
    """
    for key, value in levels.items():
        opt = REGISTRY.get(key)
        if key == STACK_FACTOR:  # a position in the matrix's stack factor (bench.spec.stack)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1000:
                shown = json.dumps(value)[:40] if isinstance(value, (str, int, float)) else type(value).__name__
                raise BenchError(f"{where}.{key}: {shown} is not a stack position (allowed: 0, 1, ... in the order "
                                 "of the matrix's factors.stack)")
            continue
        if opt is None:
            raise BenchError(f"{where}: unknown factor {str(key)[:60]!r}{did_you_mean(key, REGISTRY)} "
                             f"(allowed: {', '.join(REGISTRY)})")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value not in opt.levels):
            shown = json.dumps(value)[:40] if isinstance(value, (str, bool, int, float)) else type(value).__name__
            raise BenchError(f"{where}.{key}: {shown} is not a level of {key} (allowed: "
                             f"{', '.join(map(str, opt.levels))}, or null where not applicable)")


def run_dir(sweep: Path, cell_id: str, repeat: int, version: str | None = None) -> Path:
    """The folder of one repeat of one cell: ``<cell_id>/r<repeat>``; in an interleaved gate sweep a run of the
    baseline's code is ``<cell_id>/r<repeat>-baseline`` (the candidate's keep ``r<repeat>``)."""
    suffix = f"-{version}" if version and version != "candidate" else ""
    return Path(sweep) / cell_id / f"r{repeat}{suffix}"


def is_record(rec: Any) -> bool:
    """Whether ``rec`` has the shape every reader relies on: a dict with ``cell_id`` (str), ``repeat``
    (int), ``status`` (str), and ``summary`` / ``steps`` dicts when present."""
    return (isinstance(rec, dict) and isinstance(rec.get("cell_id"), str) and isinstance(rec.get("repeat"), int)
            and not isinstance(rec.get("repeat"), bool) and isinstance(rec.get("status"), str)
            and isinstance(rec.get("summary", {}), dict) and isinstance(rec.get("steps", {}), dict))


class _NamedLock(FileLock):
    """FileLock that fails at once with a BenchError instead of waiting for another harness.

    On a full disk before anything was recorded (the matrix folder holds nothing but the lock), it leaves nothing
    half-made behind: the lock file this invocation created is removed while still held (a harness that opened it
    meanwhile finds it unlinked and does not take it: filelock checks the link count) and so is the matrix folder
    when this invocation created it and it is empty. A lock that was there before (a previous sweep's, or another
    harness's) and a folder that holds anything else are kept."""

    #: (the matrix folder, the lock file) did not exist before :meth:`ResultsDir.lock` made them
    made: tuple[bool, bool] = (False, False)

    def __enter__(self):  # type: ignore[override]
        try:
            self.acquire(timeout=0)
        except Timeout:
            raise BenchError(
                f"{self.lock_file}: another harness is running this matrix (remove the lock if not)"
            ) from None
        return self

    def __exit__(self, exc_type, exc, tb):  # type: ignore[override]
        try:
            if self.made[1] and self.is_locked and (isinstance(exc, DiskFullError) or exc is not None
                                                    and is_no_space(exc)):
                self._discard_unused()
        finally:
            super().__exit__(exc_type, exc, tb)

    def _discard_unused(self) -> None:
        """Remove the lock file (held) and the folder this invocation made, when the folder holds nothing else."""
        path = Path(self.lock_file)
        try:
            if os.listdir(path.parent) != [path.name]:
                return
            path.unlink()
            if self.made[0]:
                path.parent.rmdir()  # a harness that just made its own lock there keeps the folder (not empty)
        except OSError:
            pass
