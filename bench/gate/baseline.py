"""``run_bench.py baseline save SWEEP --name NAME``: store a sweep as a named baseline for the gate.

A baseline is one JSON file, ``<results>/baselines/<NAME>.json`` (format ``grpo-bench-baseline``,
``format_version`` 1), holding what the gate needs to judge a later sweep without the original
results folder:

* ``engine``, ``platform``, package ``versions``, ``git_commit`` of the sweep, and a ``machine``
  description (host, OS, CPU model and count, memory, Python) of the machine that saved it;
* ``source``: matrix name, sweep id, sweep folder relative to the results folder, MLflow parent run;
* ``base``/``design``/``repeats``: the matrix settings the samples were taken with;
* ``cells``: per cell, its factor ``levels`` (the key the gate matches on), label, cell id, and per
  repeat the per-step ``samples`` of every gate metric (step time of the timed steps, throughput,
  rollout share, Free ratio of the profiled steps), the timed ``steps`` and their ``workload``
  fingerprints (response and prompt lengths, so the gate can pair steps that did the same work), the
  machine-speed probe of each timed step and its kernel (``probe_spec``; :mod:`bench.records.speed`), plus the
  run's summary statistics.

Saving tags the sweep's MLflow parent run ``bench.baseline=<NAME>``. Other actions: ``baseline list``
(the stored baselines) and ``baseline show NAME``.

A sweep with failed or unfinished cells, or a cell without step-time samples, is refused (exit 2):
a baseline must be complete.
"""

from __future__ import annotations

import functools
import re
import time
import typing
from pathlib import Path
from typing import Annotated, Any

from bench.core.errors import BenchError, InputError, did_you_mean
from bench.core.files import atomic_write_json, read_json
from bench.core.inputs import check_numbers
from bench.core.metadata import machine
from bench.core.paths import check_folder, resolve_path
from bench.records.results import find_sweep
from bench.records.run_record import Seconds  # a sample (seconds, tokens/s, a share) is finite and not negative
from bench.records.snapshot import (
    FORMAT,
    FORMAT_VERSION,
    check_complete,
    check_judgeable,
    check_snapshot,
    snapshot,
)
from bench.spec.loading import value_message
from bench.spec.matrix import Base
from bench.spec.metrics import METRICS
from bench.tracking import Tracker, store_failure

BASELINES = "baselines"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def baselines_dir(results: Path) -> Path:
    """``<results>/baselines``."""
    return Path(results) / BASELINES


def resolve_baseline(ref: str, results: Path) -> Path:
    """The file of a baseline given by name (``<results>/baselines/<ref>.json``) or path.

    Raises:
        BenchError: no such baseline (the message lists the known names).
    """
    p = Path(ref)
    resolve_path("--baseline", p)  # a name too long for the file system, a dangling link: refused by name
    if p.is_file():
        return p
    cand = baselines_dir(results) / f"{ref}.json"
    if _NAME.match(ref) and cand.is_file():
        return cand
    known = sorted(x.stem for x in baselines_dir(results).glob("*.json")) if baselines_dir(results).is_dir() else []
    raise InputError("baseline", f"baseline {ref}: unknown baseline{did_you_mean(ref, known)} (no file {cand}; known: "
                     f"{', '.join(known) or 'none, save one with `run_bench.py baseline save SWEEP --name NAME`'})")


def load_baseline(ref: str, results: Path) -> dict[str, Any]:
    """Read and check a baseline file given by name or path.

    Raises:
        BenchError: unknown name, unreadable file, not a baseline, or a newer format version.
    """
    path = resolve_baseline(ref, results)
    data = read_json(path)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BenchError(f"{path}: not a baseline file (expected \"format\": \"{FORMAT}\")")
    ver = data.get("format_version")
    if isinstance(ver, bool) or not isinstance(ver, int) or ver < 1:
        raise BenchError(f"{path}: format_version: expected an integer, got {ver!r} (allowed: 1..{FORMAT_VERSION})")
    if ver > FORMAT_VERSION:
        raise BenchError(
            f"{path}: baseline format_version {ver!r} is not supported (this harness reads <= {FORMAT_VERSION})"
        )
    for key in ("engine", "platform", "cells"):
        if key not in data:
            raise BenchError(f"{path}: baseline file lacks {key!r}")
    check_baseline_shape(data, path)
    check_snapshot(data, str(path))
    data["_path"] = str(path)
    return data


@functools.cache
def _shape_model() -> Any:
    """The pydantic model of the parts of a baseline every reader indexes (built once, on first use)."""
    from pydantic import BaseModel, ConfigDict, Field

    class _Repeat(BaseModel):
        model_config = ConfigDict(extra="allow")
        repeat: int | None = None
        status: str | None = None
        samples: dict[str, list[Seconds | None]]

    class _Cell(BaseModel):
        model_config = ConfigDict(extra="allow")
        key: str
        label: str
        levels: dict[str, int | None]
        repeats: list[_Repeat]

    class _History(BaseModel):
        model_config = ConfigDict(extra="allow")
        log_step_time: dict[str, float] = {}
        log_step_time_normalized: dict[str, float] = {}
        log_cpu_time: dict[str, float] = {}

    class _Figure(BaseModel):  # a sweep-to-sweep SD of log step time and its degrees of freedom
        model_config = ConfigDict(extra="allow")
        sd_log: Annotated[float, Field(ge=0, le=MAX_SD_LOG, allow_inf_nan=False)] | None = None
        df: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None

    class _Offset(_Figure):
        normalized: _Figure | None = None

    class _Source(BaseModel):
        model_config = ConfigDict(extra="allow")
        sweep: str | None = None

    class _Shape(BaseModel):
        model_config = ConfigDict(extra="allow")
        engine: str
        platform: str
        source: _Source
        cells: list[_Cell] = Field(min_length=1)  # a baseline of no cell judges nothing
        history: list[_History] | None = None  # the saved sweeps (save --force appends)
        sweep_to_sweep: _Offset | None = None

    return _Shape


#: key paths of a baseline whose numbers may be negative (:func:`bench.core.inputs.check_numbers`): the log cell values
#: of its history (step time, speed-normalized step time, CPU time), a phase's "other" time (the step less its
#: parts), and the matrix as the sweep ran it (checked by the matrix's own model then; an ``expect`` bound may be
#: negative)
SIGNED = ("history[].log_step_time*", "history[].log_cpu_time*", "cells[].repeats[].summary.phase_median_s.other",
          "base.*", "design.*", "expect*")
#: largest sweep-to-sweep SD of log step time a baseline may hold (e^10: a factor of 22 000 between sweeps)
MAX_SD_LOG = 10.0


#: the parts of a baseline's repeat that hold measured figures only (numbers, lists and objects of them, null): a
#: text there (a hand-edited ``"fast"``) passed the number check and was read as written
_MEASURED = ("samples", "host_load", "timing", "workload", "steps", "summary")
#: keys under those parts that describe a figure in words (the MFU's basis, where the peak memory came from)
_WORDS = ("mfu_basis", "peak_memory_source")


def _no_text(value: Any, key: str, path: Path | str) -> None:
    """Refuse a text anywhere in ``value`` but under :data:`_WORDS`.

    Raises:
        BenchError: naming the file and the key.
    """
    if isinstance(value, str):
        raise BenchError(f"{path}: not a valid baseline: {key}: text {value[:40]!r} (allowed: a number or null)")
    if isinstance(value, dict):
        for k, v in value.items():
            if k not in _WORDS:
                _no_text(v, f"{key}.{k}", path)
    elif isinstance(value, list):
        for n, v in enumerate(value):
            _no_text(v, f"{key}.{n}", path)


@functools.cache
def numeric_base_keys() -> frozenset[str]:
    """The keys of a matrix's ``base`` that hold a number (:class:`bench.spec.matrix.Base`'s fields typed ``int`` or
    ``float``, optional or not): a baseline keeps the matrix as it ran, so a text there was hand-edited."""
    out = set()
    for name, field in Base.model_fields.items():
        args = typing.get_args(field.annotation) or (field.annotation,)
        if any(a in (int, float) for a in args) and str not in args:
            out.add(name)
    return frozenset(out)


def check_baseline_shape(data: dict[str, Any], path: Path | str) -> None:
    """Check the parts of a baseline every reader indexes (``source``, each cell's ``key``, ``label``,
    ``levels`` and ``repeats`` with their ``samples``), so a hand-edited file fails as one line; and every number in
    it (:func:`bench.core.inputs.check_numbers`: finite, not negative but in :data:`SIGNED`; ``sweep_to_sweep.sd_log``
    at most :data:`MAX_SD_LOG`): a NaN ``sd_log`` was read as no offset and changed the gate's verdict silently; and
    no text where the matrix's ``base`` holds a number (:func:`numeric_base_keys`).

    Raises:
        BenchError: naming the file and the first missing or mistyped key.
    """
    from pydantic import ValidationError

    check_numbers(data, f"{path}: not a valid baseline", signed=SIGNED)
    base = data.get("base")
    for key in sorted(numeric_base_keys() & set(base) if isinstance(base, dict) else ()):
        if isinstance(base[key], (str, bool, list, dict)):  # the matrix as it ran held a number there
            raise BenchError(f"{path}: not a valid baseline: base.{key}: {str(base[key])[:40]!r} (allowed: a number, "
                             f"as the matrix's base.{key})")
    for i, cell in enumerate(data.get("cells") or [] if isinstance(data.get("cells"), list) else []):
        if isinstance(cell, dict):  # the cell's own figures (its median step time ...)
            _no_text(cell.get("summary"), f"cells.{i}.summary", path)
        for j, rep in enumerate(cell.get("repeats") or [] if isinstance(cell, dict) else []):
            if isinstance(rep, dict):
                for key in _MEASURED:
                    _no_text(rep.get(key), f"cells.{i}.repeats.{j}.{key}", path)
    try:
        _shape_model().model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(x) for x in err["loc"])
        raise BenchError(f"{path}: not a valid baseline: {key}: {value_message(err)}") from None


def save(sweep_ref: str, name: str, results: Path, tracking_uri: str | None, *, force: bool = False,
         note: str = "", alpha: float | None = None) -> tuple[Path, dict[str, Any], str | None]:
    """Store sweep ``sweep_ref`` as baseline ``name``; returns (file, content, MLflow warning or None).

    ``alpha``: the gate's significance level the baseline must be able to reach (default: the gate's
    default, 0.01; see :func:`check_judgeable`).

    Raises:
        BenchError: bad name, existing baseline without ``force``, unknown sweep, incomplete sweep, a
            sweep with too few timed steps per cell to ever pass the gate.
    """
    if not _NAME.match(name) or len(name) > 100:
        raise InputError("baseline name", f"baseline name {name[:60]!r}: use at most 100 letters, digits, '_', '-', "
                         "'.' (starting with a "
                         "letter or digit)")
    out = baselines_dir(results) / f"{name}.json"
    check_folder("--results", baselines_dir(results))  # <results>/baselines a file, a dangling link ...
    if out.exists() and not force:
        raise BenchError(f"--name {name}: baseline {out} exists (use --force to replace it)")
    sweep = find_sweep(sweep_ref, results)
    snap = snapshot(sweep, results)
    check_complete(snap, f"{sweep}")
    if alpha is None:
        from bench.stats.estimators import DEFAULT_ALPHA as alpha  # deferred: bench.stats.estimators loads scipy
    check_judgeable(snap, f"{sweep}", alpha)
    snap.update(name=name, created_at=time.time(), note=note, machine=machine())
    for c in snap["cells"]:
        c["summary"] = _cell_summary(c)
    old = load_baseline(str(out), results) if out.exists() else None  # checked like every reader checks it
    snap["history"] = ((old or {}).get("history") or [])[-(HISTORY_KEEP - 1):] + [history_entry(snap)]
    snap["sweep_to_sweep"] = sweep_to_sweep(snap["history"][-HISTORY:])
    atomic_write_json(out, snap)
    warn = tag_parent(tracking_uri, snap, {"bench.baseline": name, f"bench.baseline.{name}": out.name})
    return out, snap, warn


#: the last saved sweeps of a baseline's history that measure its sweep-to-sweep SD (:func:`sweep_to_sweep`)
HISTORY = 20
#: saved sweeps a baseline keeps in its history (``save --force`` of the same name appends; the ``history``
#: command's series, :mod:`bench.gate.history`)
HISTORY_KEEP = 1000


def history_entry(snap: dict[str, Any]) -> dict[str, Any]:
    """One saved sweep in a baseline's history: per cell (factor levels) the log of its value, the mean over its ok
    runs of the log run value (:func:`bench.gate.stored_runs.run_logs`: the median of a run's timed step times),
    as ``log_step_time``; and, where every such run carries the speed probe at every step, the same less the log of
    the run's median probe time as ``log_step_time_normalized`` (the values the gate compares when it applies the
    probe, so that the offset it allows for is measured on the same scale).

    Also (since issue 44; an older entry lacks them and reads as unknown): the sweep's ``git_commit``, ``matrix``,
    the saving ``machine`` (:func:`bench.gate.history.machine_of`), the ``stack`` (:func:`bench.gate.history.stack_of`)
    and per cell its figures (:func:`bench.gate.history.cell_figures`: step time, throughput, rollout share, Free
    ratio), which the ``history`` command reads as series."""
    import numpy as np

    from bench.gate.history import cell_figures, machine_of, stack_of  # deferred: bench.gate.history imports this
    from bench.gate.stored_runs import run_logs  # deferred: bench.gate.stored_runs loads scipy

    cells, normed, cpu = {}, {}, {}
    for c in snap["cells"]:
        xs, ps = run_logs(c, "step_time", 1.0)
        if xs:
            cells[c["key"]] = float(np.mean(xs))
            if all(p is not None for p in ps):
                normed[c["key"]] = float(np.mean([x - p for x, p in zip(xs, ps)]))
        if cs := run_logs(c, "cpu_time", 1.0)[0]:
            cpu[c["key"]] = float(np.mean(cs))
    return {"sweep": snap["source"].get("sweep"), "created_at": snap.get("created_at"), "log_step_time": cells,
            "log_step_time_normalized": normed, "git_commit": snap.get("git_commit"),
            "matrix": (snap.get("source") or {}).get("matrix"), "machine": machine_of(snap.get("machine")),
            "stack": stack_of(snap.get("versions")), "cells": {c["key"]: cell_figures(c) for c in snap["cells"]},
            "log_cpu_time": cpu}


def _pooled_sd(history: list[dict[str, Any]], field: str) -> tuple[float | None, int]:
    """Pooled SD over cells of ``field``'s per-cell log values across the saved sweeps, and the degrees of freedom
    of the offset it measures; ``(None, 0)`` when no cell was saved twice.

    The SD is the pooled one (sum over cells of the squared deviations from the cell's mean over its saves, over
    the sum over cells of saves - 1). Its degrees of freedom are those of the level that varies (Kalibera & Jones
    2013, 2020): the offset is one per sweep, shared by all of the sweep's cells, so ``s`` saves give ``s - 1``
    of them whatever the number of cells (the most saves of any one cell, less 1), not ``cells x (s - 1)``: the
    cells of one sweep move together, and counting them as independent made the stored gate's interval too short
    (2 saves, 4 cells, a shared offset: a false-regression rate above alpha;
    ``tests/gate/test_baseline_offset_df.py``)."""
    import math

    import numpy as np

    keys = {k for h in history for k in h.get(field) or {}}
    ss, pooled_df, saves = 0.0, 0, 0
    for k in keys:
        xs = np.array([h[field][k] for h in history if k in (h.get(field) or {})])
        if len(xs) > 1:
            ss += float(np.sum((xs - xs.mean()) ** 2))
            pooled_df += len(xs) - 1
            saves = max(saves, len(xs))
    return (math.sqrt(ss / pooled_df), saves - 1) if pooled_df else (None, 0)


def sweep_to_sweep(history: list[dict[str, Any]]) -> dict[str, Any]:
    """How much a stored baseline moves from one sweep to the next, measured over its saved sweeps: ``sd_log``
    = pooled SD over cells of the log cell step time across the saves (``None`` with fewer than 2) and its ``df``;
    ``normalized``: the same of the speed-normalized values (``{"sd_log", "df"}``; ``None`` where no cell was saved
    twice with the probe), which the gate uses where it applies the probe; ``cpu_time``: the same of the log CPU
    time per step (``None`` where no cell was saved twice with it), for ``gate --metric cpu_time``; ``sweeps``;
    ``note`` (what a gate against this baseline must allow for: a stored baseline is for tracking over time; for a
    verdict, run the interleaved gate)."""
    import math

    sd, df = _pooled_sd(history, "log_step_time")
    nsd, ndf = _pooled_sd(history, "log_step_time_normalized")
    csd, cdf = _pooled_sd(history, "log_cpu_time")
    cpu = {"sd_log": csd, "df": cdf} if csd is not None else None
    if sd is None:
        return {"sd_log": None, "sweeps": len(history), "normalized": None, "cpu_time": cpu,
                "note": f"sweep-to-sweep variance unknown: measured over {len(history)} saved sweep(s), needs 2 or "
                        "more (save this name again with --force after another sweep); until then a gate against "
                        "this baseline decides no step-time or throughput row (cannot judge)"}
    speed = f"; speed-normalized {nsd:.3f} (about {math.expm1(nsd):.1%})" if nsd is not None else ""
    return {"sd_log": sd, "sweeps": len(history), "df": df,
            "normalized": {"sd_log": nsd, "df": ndf} if nsd is not None else None, "cpu_time": cpu,
            "note": f"sweep-to-sweep SD of log step time {sd:.3f} (about {math.expm1(sd):.1%}){speed}, measured over "
                    f"{len(history)} saved sweeps: a gate against this stored baseline cannot tell changes of that "
                    "order from the machine (`gate --interleave` compares both versions in one sweep)"}


def _cell_summary(cell: dict[str, Any]) -> dict[str, Any]:
    """Pooled medians of a cell's samples over its repeats."""
    import numpy as np

    out: dict[str, Any] = {"repeats": len(cell["repeats"])}
    for m in METRICS:
        vals = [v for r in cell["repeats"] for v in r["samples"].get(m, [])]
        out[f"{m}_n"] = len(vals)
        out[f"{m}_median"] = float(np.median(vals)) if vals else None
    return out


def tag_parent(tracking_uri: str | None, snap: dict[str, Any], tags: dict[str, str]) -> str | None:
    """Set ``tags`` on the sweep's MLflow parent run; returns a warning text instead of raising."""
    rid = snap["source"].get("parent_run_id")
    if not tracking_uri or not rid:
        return "the sweep has no MLflow parent run recorded; nothing tagged"
    try:
        tr = Tracker(tracking_uri, snap["source"].get("matrix") or "default")
        for k, v in tags.items():
            tr.client.set_tag(rid, k, v)
    except Exception as exc:  # a missing run or an unreachable store must not lose the saved file
        return f"MLflow tagging of parent run {rid} at {tracking_uri} failed: {store_failure(exc, tracking_uri)}"
    return None
