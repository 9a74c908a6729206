"""Free ratio per step and rank from the Ascend PyTorch profiler (torch_npu) output.

Layout written by ``torch_npu.profiler`` (``tensorboard_trace_handler(dir)``)::

    <dir>/<worker>_<timestamp>_ascend_pt/            worker = "<hostname>_<pid>" by default
        profiler_info_<rank>.json                    "profiler_info.json" when no rank is known
        FRAMEWORK/, PROF_<...>/                      raw data
        ASCEND_PROFILER_OUTPUT/                      parsed output (online, or offline ``analyse``)
            step_trace_time.csv                      export_type Text (verl 0.6.x)
            analysis.db                              export_type Db (verl >= 0.7): table StepTraceTime

verl puts it under ``<save_path>/[<step>/]<role>/`` (``profile_step`` in the path in 0.6.x).

Free ratio (msprof-analyze's step time, ``advisor`` ``op_schedule_advice.get_ratio``):
``free_ratio = Free / (Computing + Communication(Not Overlapped) + Free)``. Several rows of one rank
in one step (several roles or devices) are combined time weighted: ``sum(Free) / sum(step time)``.
Across ranks: mean, min, max and spread (= max - min) of the per-rank ratios, and the ranks missing.

The step trace files and their columns: :mod:`bench.measure.ascend_step_trace`. Every rank's
``step_trace_time.csv``, ``kernel_details.csv`` and ``trace_view.json`` are parsed at once over the cores
and through the parsed-profile cache (:func:`bench.measure.trace_pool.parse_files`): the kernels per step
(:mod:`bench.measure.ascend_kernels`) and the trace's windows and top operators feed the top operators of
MLflow's ``profile_summary.json`` (:mod:`bench.measure.top_ops`) and the operators of "where it acts"
(:meth:`AscendReader.step_ops`); each rank's ``kernel_details.csv`` / ``op_statistic.csv`` / ``trace_view.json``
gives its categories (:meth:`AscendReader.categories`), the step trace (else msprof-analyze's
``cluster_step_trace_time.csv``) its ranks' time breakdown (:meth:`AscendReader.ranks`).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.measure._common import MeasureError, rel_path
from bench.measure.ascend_kernels import KERNEL_DETAILS_CSV, TRACE_VIEW_JSON, kernel_top, profile_files, rank_files
from bench.measure.ascend_step_trace import (
    ANALYSIS_DB,
    OUTPUT_DIR,
    STEP_TRACE_CSV,
    StepTraceRow,
    rank_of,
    read_step_trace_csv,
    read_step_trace_db,
)
from bench.measure.formats import CategorySource, Measurements, RankTimes, Reader, ReadOptions, StepOps
from bench.measure.op_categories import kernel_details_categories, op_statistic_categories, trace_categories
from bench.measure.rank_overlap import ascend_rank_breakdown, read_cluster_step_trace
from bench.measure.trace_cache import CACHE_DIR
from bench.measure.trace_ops import step_entry
from bench.measure.trace_pool import parse_files

#: the per-rank operator statistics of the whole profile (no steps)
OP_STATISTIC_CSV = "op_statistic.csv"
#: msprof-analyze's cluster step trace (under ``cluster_analysis_output/``)
CLUSTER_STEP_TRACE_CSV = "cluster_step_trace_time.csv"


@dataclass
class AscendProfile:
    """One ``*_ascend_pt`` folder.

    Attributes:
        path: the folder.
        rank: see :func:`rank_of`.
        role: name of the parent folder (verl's role folder, e.g. ``actor_update``) or ``""``.
        path_step: the last all-digits folder name between the search root and the folder
            (verl 0.6.x's ``<save_path>/<step>/<role>/``), else ``None``.
        output: ``step_trace_time.csv`` or ``analysis.db`` found in ``ASCEND_PROFILER_OUTPUT``
            (``None`` if neither).
        has_raw: raw data present (``FRAMEWORK`` or ``PROF_*``), i.e. offline ``analyse`` can parse it.
    """

    path: str
    rank: int | None
    role: str
    path_step: int | None
    output: str | None
    has_raw: bool

    @property
    def needs_analyse(self) -> bool:
        """Raw data only: no parsed step trace yet."""
        return self.output is None and self.has_raw


def _find_output(pt_dir: Path) -> str | None:
    out = pt_dir / OUTPUT_DIR
    csv_path = out / STEP_TRACE_CSV
    if csv_path.is_file():
        return str(csv_path)
    db_path = out / ANALYSIS_DB
    if db_path.is_file():
        return str(db_path)
    return None


def _has_raw(pt_dir: Path) -> bool:
    try:
        names = os.listdir(pt_dir)
    except OSError:
        return False
    return any(n == "FRAMEWORK" or n.startswith("PROF_") for n in names)


def find_ascend_profiles(root: str | os.PathLike) -> list[AscendProfile]:
    """Every ``*_ascend_pt`` folder at or below ``root`` (sorted by path)."""
    base = Path(root)
    dirs: list[Path] = []
    if base.is_dir() and base.name.endswith("_ascend_pt"):
        dirs.append(base)
    elif base.is_dir():
        for dirpath, dirnames, _ in os.walk(base):
            keep = []
            for name in sorted(dirnames):
                if name.endswith("_ascend_pt"):
                    dirs.append(Path(dirpath) / name)
                else:
                    keep.append(name)
            dirnames[:] = keep  # do not descend into an *_ascend_pt folder
    profiles = []
    for d in sorted(dirs):
        try:
            rel_parts = d.relative_to(base).parts[:-1]
        except ValueError:
            rel_parts = ()
        digits = [int(part) for part in rel_parts if part.isdigit()]
        profiles.append(
            AscendProfile(
                path=str(d),
                rank=rank_of(d),
                role=d.parent.name if d != base else "",
                path_step=digits[-1] if digits else None,
                output=_find_output(d),
                has_raw=_has_raw(d),
            )
        )
    return profiles


def read_profile_rows(profile: AscendProfile) -> list[StepTraceRow]:
    """The step rows of one profile folder (``[]`` when it has no parsed output)."""
    if profile.output is None:
        return []
    if profile.output.endswith(".csv"):
        return read_step_trace_csv(profile.output, rank=profile.rank)
    return read_step_trace_db(profile.output, rank=profile.rank)


def _rows_of_all(profiles: list[AscendProfile], cache_dir: Path | None) -> list[list[StepTraceRow] | MeasureError]:
    """The step rows of every profile: the CSVs through :func:`parse_files` (cached, in parallel when large),
    the databases read here."""
    csvs = [i for i, p in enumerate(profiles) if p.output and p.output.endswith(".csv")]
    got = dict(zip(csvs, parse_files([("step_trace", profiles[i].output) for i in csvs], cache_dir=cache_dir)))
    out: list[list[StepTraceRow] | MeasureError] = []
    for i, prof in enumerate(profiles):
        if i in got:
            g = got[i]
            out.append(g if isinstance(g, MeasureError) else
                       [StepTraceRow(**{**r, "rank": prof.rank}) for r in g["rows"]])
            continue
        try:
            out.append(read_profile_rows(prof))
        except MeasureError as exc:
            out.append(exc)
    return out



@dataclass
class StepAcrossRanks:
    """Free ratio of one step across ranks.

    Attributes:
        step: the step (``None``: no step id anywhere, one row per profile).
        per_rank: rank -> time-weighted free ratio of that rank in this step.
        mean / min / max / spread: over ``per_rank`` values (spread = max - min); ``None`` if empty.
        missing_ranks: expected ranks with no row for this step.
    """

    step: int | None
    per_rank: dict[int, float]
    mean: float | None
    min: float | None
    max: float | None
    spread: float | None
    missing_ranks: list[int]


@dataclass
class AscendFree:
    """Result of :func:`read_ascend_free`.

    Attributes:
        root: the folder searched.
        profiles: every ``*_ascend_pt`` folder found.
        rows: every step row read, with its rank (and ``step`` resolved: the CSV's Step, else the
            folder's ``path_step``).
        steps: step -> :class:`StepAcrossRanks`, sorted by step (``None`` key last).
        ranks: ranks seen; expected_ranks: ranks expected (``range(expected)`` if given, else
            ``0..max(ranks)``); missing_ranks: expected ranks with no data at all.
        needs_analyse: profile folders with raw data only (see :func:`analyse_raw`).
        warnings: oddities (unknown ranks, unreadable outputs ...).
    """

    root: str
    profiles: list[AscendProfile] = field(default_factory=list)
    rows: list[StepTraceRow] = field(default_factory=list)
    steps: dict = field(default_factory=dict)
    ranks: list[int] = field(default_factory=list)
    expected_ranks: list[int] = field(default_factory=list)
    missing_ranks: list[int] = field(default_factory=list)
    needs_analyse: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-friendly form (step keys kept as given; ``None`` step as ``None``)."""
        return {
            "root": self.root,
            "profiles": [asdict(p) for p in self.profiles],
            "steps": {k: asdict(v) for k, v in self.steps.items()},
            "ranks": list(self.ranks),
            "expected_ranks": list(self.expected_ranks),
            "missing_ranks": list(self.missing_ranks),
            "needs_analyse": list(self.needs_analyse),
            "warnings": list(self.warnings),
        }


def read_ascend_free(root: str | os.PathLike, expected_ranks: int | None = None,
                     cache_dir: str | os.PathLike | None = None) -> AscendFree:
    """Per step, the Free ratio of each rank and its spread across ranks, for every profile below ``root``.

    A profile without a known rank is counted under its ``Device_id`` when the row has one, else
    under ``-1 - index`` (so it still contributes, but is never mistaken for a real rank); a warning
    says so. Raw-only folders are listed in ``needs_analyse`` (run :func:`analyse_raw` first).
    ``cache_dir``: the parsed-profile cache for the ``step_trace_time.csv`` files (``None``: none).
    """
    result = AscendFree(root=str(root))
    result.profiles = find_ascend_profiles(root)
    all_rows = _rows_of_all(result.profiles, Path(cache_dir) if cache_dir is not None else None)
    for idx, (prof, rows) in enumerate(zip(result.profiles, all_rows)):
        if prof.output is None:
            if prof.has_raw:
                result.needs_analyse.append(prof.path)
            else:
                result.warnings.append(f"{prof.path}: no {OUTPUT_DIR}/{STEP_TRACE_CSV} and no raw data")
            continue
        if isinstance(rows, MeasureError):
            result.warnings.append(str(rows))
            continue
        for row in rows:
            rank = prof.rank
            if rank is None:
                rank = row.device_id if row.device_id is not None and row.device_id >= 0 else -1 - idx
                result.warnings.append(f"{prof.path}: rank unknown (no profiler_info_<rank>.json); using {rank}")
            step = row.step if row.step is not None else prof.path_step
            result.rows.append(StepTraceRow(**{**asdict(row), "rank": rank, "step": step}))
    # dedupe repeated warnings, keep order
    result.warnings = list(dict.fromkeys(result.warnings))

    seen_ranks = sorted({r.rank for r in result.rows if r.rank is not None and r.rank >= 0})
    result.ranks = seen_ranks
    if expected_ranks is not None:
        expected = list(range(expected_ranks))
    else:
        expected = list(range(seen_ranks[-1] + 1)) if seen_ranks else []
    result.expected_ranks = expected
    result.missing_ranks = [r for r in expected if r not in seen_ranks]

    # step -> rank -> [free, total]
    acc: dict[int | None, dict[int, list[float]]] = {}
    for row in result.rows:
        slot = acc.setdefault(row.step, {}).setdefault(row.rank, [0.0, 0.0])
        slot[0] += row.free_us
        slot[1] += row.step_time_us
    keys = sorted((k for k in acc if k is not None)) + ([None] if None in acc else [])
    for step in keys:
        per_rank = {rank: ft[0] / ft[1] for rank, ft in sorted(acc[step].items()) if ft[1] > 0}
        vals = list(per_rank.values())
        present = set(acc[step])
        result.steps[step] = StepAcrossRanks(
            step=step,
            per_rank=per_rank,
            mean=sum(vals) / len(vals) if vals else None,
            min=min(vals) if vals else None,
            max=max(vals) if vals else None,
            spread=(max(vals) - min(vals)) if vals else None,
            missing_ranks=[r for r in expected if r not in present],
        )
    return result


def analyse_raw(profiler_path: str | os.PathLike, max_process_number: int | None = None) -> list[str]:
    """Parse raw Ascend profiler data offline with ``torch_npu.profiler.profiler.analyse``.

    ``profiler_path`` is one ``*_ascend_pt`` folder or a folder holding several. Needs torch_npu
    (and CANN's ``msprof``). torch_npu's ``analyse`` swallows its own errors, so success is checked
    afterwards: every raw-only profile below ``profiler_path`` must now have a parsed step trace.

    Returns the step-trace files now present. Raises :class:`~bench.measure._common.MeasureError`
    when torch_npu is not importable or when the analysis produced no step trace.
    """
    path = Path(profiler_path)
    if not path.is_dir():
        raise MeasureError(f"{path}: no such profiler folder")
    try:
        module = importlib.import_module("torch_npu.profiler.profiler")
        analyse = module.analyse
    except (ImportError, AttributeError) as exc:
        raise MeasureError(
            f"{path}: raw Ascend profiler data (no {OUTPUT_DIR}) needs torch_npu to be parsed, and "
            f"torch_npu is not importable here ({exc}); run "
            "`python -c \"from torch_npu.profiler.profiler import analyse; analyse(profiler_path='<dir>')\"` "
            "on a machine with torch_npu and CANN, then read the folder again"
        ) from exc
    kwargs = {"profiler_path": str(path)}
    if max_process_number is not None:
        kwargs["max_process_number"] = max_process_number
    analyse(**kwargs)
    profiles = find_ascend_profiles(path)
    still_raw = [p.path for p in profiles if p.needs_analyse]
    if still_raw:
        raise MeasureError(
            f"torch_npu analyse produced no {OUTPUT_DIR}/{STEP_TRACE_CSV} (or {ANALYSIS_DB}) for "
            f"{still_raw}; is CANN's msprof installed and the raw data complete?"
        )
    return [p.output for p in profiles if p.output]


def ensure_analysed(root: str | os.PathLike) -> list[str]:
    """Run :func:`analyse_raw` on every raw-only ``*_ascend_pt`` folder below ``root``.

    Returns the folders analysed (``[]`` when nothing needed it; torch_npu is then not imported).
    """
    todo = [p.path for p in find_ascend_profiles(root) if p.needs_analyse]
    for folder in todo:
        analyse_raw(folder)
    return todo


class AscendReader(Reader):
    """torch_npu profiler folders (``*_ascend_pt``): the device Free ratio per step and rank from
    ``step_trace_time.csv`` / ``analysis.db``; ``prepare`` runs the offline ``analyse`` when asked."""

    name = "ascend"

    def prepare(self, run_dir: Path, options: ReadOptions) -> None:
        if options.analyse:
            ensure_analysed(run_dir)

    def detect(self, run_dir: Path) -> bool:
        return bool(find_ascend_profiles(run_dir))

    def read(self, run_dir: Path, options: ReadOptions) -> Measurements:
        af = read_ascend_free(run_dir, expected_ranks=options.expected_ranks, cache_dir=run_dir / CACHE_DIR)
        ad = af.to_dict()
        ad["kernel_details"], ad["trace_view"], errors = rank_files(af.profiles, run_dir)
        af.warnings.extend(errors)
        for p in ad["profiles"]:
            p["path"] = rel_path(p["path"], run_dir)
            if p["output"]:
                p["output"] = rel_path(p["output"], run_dir)
        ad["root"] = "."
        ad["needs_analyse"] = [rel_path(p, run_dir) for p in ad["needs_analyse"]]
        out = Measurements(fields={"ascend": ad}, warnings=list(af.warnings))
        if af.needs_analyse:
            out.warnings.append(f"raw Ascend profiler data not parsed yet (run analyse): {ad['needs_analyse']}")
        if af.missing_ranks:
            out.warnings.append(f"Ascend profiler output missing for rank(s) {af.missing_ranks}")
        for step, across in af.steps.items():
            for rank, ratio in across.per_rank.items():
                out.free.append(
                    (step, {"kind": "ascend", "source": f"rank {rank}", "free_ratio": ratio, "basis": "device"})
                )
            if step is not None:
                out.missing_ranks[step] = list(across.missing_ranks)
        return out


    @staticmethod
    def _rank(source: str) -> int | None:
        """The rank of a Free-ratio source ``rank N`` (``None``: not one of this format's)."""
        parts = source.split()
        return int(parts[1]) if len(parts) == 2 and parts[0] == "rank" and parts[1].lstrip("-").isdigit() else None

    def _profiles(self, run_dir: Path, memo: dict) -> list[AscendProfile]:
        if (self.name, "profiles") not in memo:  # once per run folder, not once per step
            memo[self.name, "profiles"] = find_ascend_profiles(run_dir)
        return memo[self.name, "profiles"]

    def _rank_profiles(self, run_dir: Path, source: str, memo: dict) -> list[AscendProfile]:
        """The run's profiles of the rank that ``source`` names (none when it names no rank), in their order."""
        rank = self._rank(source)
        return [] if rank is None else [p for p in self._profiles(run_dir, memo) if p.rank == rank]

    def step_ops(self, run_dir: Path, step: int, source: str, memo: dict) -> StepOps | None:
        """The rank's ``kernel_details.csv`` kernels of the step (their durations summed by name), else its
        ``trace_view.json`` window like a torch trace."""
        for prof in self._rank_profiles(run_dir, source, memo):
            files = profile_files(prof)
            for kind in ("kernel_details", "trace"):
                if kind not in files:
                    continue
                key = (self.name, kind, files[kind])
                if key not in memo:
                    memo[key] = parse_files([(kind, files[kind])], cache_dir=run_dir / CACHE_DIR)[0]
                got = memo[key]
                if not isinstance(got, dict):
                    continue
                label = rel_path(files[kind], run_dir)
                if kind == "kernel_details":
                    hit = step_entry(got.get("steps") or [], step)
                    if hit:
                        return StepOps(source=label, basis="device", ops=[tuple(o) for o in hit["ops"]])
                else:
                    hit = step_entry(got.get("top_ops") or [], step)
                    if hit and "ops" in hit:
                        ops = hit["ops"]
                        basis = "device" if ops.get("device") else "cpu"
                        return StepOps(source=label, basis=basis, ops=[tuple(o) for o in ops.get(basis) or []],
                                       window_ms=hit.get("window_ms"))
        return None

    def top_ops(self, run_dir: Path, step: int, source: str, memo: dict, n: int) -> dict[str, Any] | None:
        """The rank's ``kernel_details.csv`` (device kernels, durations summed per name) and ``trace_view.json``
        (CPU operators, and the device half when there is no ``kernel_details.csv``); the share is of the step's
        window (the trace's ``ProfilerStep`` window, else msprof's step time ``Computing + Communication(Not
        Overlapped) + Free`` of the rank)."""
        for prof in self._rank_profiles(run_dir, source, memo):
            if (self.name, prof.path) not in memo:  # a rank's files are looked up (hashed) once, not once per step
                files = profile_files(prof)
                jobs = list(files.items())
                if prof.output and prof.output.endswith(".csv"):
                    jobs.append(("step_trace", prof.output))
                memo[self.name, prof.path] = files, dict(zip([k for k, _ in jobs],
                                                             parse_files(jobs, cache_dir=run_dir / CACHE_DIR)))
            files, got = memo[self.name, prof.path]
            trace = got.get("trace") if isinstance(got.get("trace"), dict) else None
            table = step_entry(trace["top_ops"], step) if trace else None
            window = table["window_ms"] * 1e3 if table and table.get("window_ms") else None
            if window is None and isinstance(got.get("step_trace"), dict):
                rows = got["step_trace"]["rows"]
                window = sum(StepTraceRow(**r).step_time_us for r in rows
                             if r.get("step") == step or (r.get("step") is None and len(rows) == 1)) or None
            device = None
            if isinstance(got.get("kernel_details"), dict):
                device = kernel_top(got["kernel_details"], step, window, n)
            if device is None and table:
                device = table["device"][:n]
            if device is None and table is None:
                continue
            src = files.get("kernel_details") or files.get("trace")
            return {"source": os.path.relpath(src, run_dir),
                    "window_ms": None if window is None else round(window / 1e3, 3),
                    "cpu": table["cpu"][:n] if table else [], "device": device or []}
        return None

    def categories(self, run_dir: Path) -> tuple[list[CategorySource], list[str]]:
        """Each profile folder's ``kernel_details.csv``, else its ``op_statistic.csv`` (no steps: the folder's
        step), else its ``trace_view.json``; the role folder names the phase."""
        out, warnings = [], []
        for prof in find_ascend_profiles(run_dir):
            base = Path(prof.path) / OUTPUT_DIR
            kind = next((k for k, name in (("kernel_details", KERNEL_DETAILS_CSV), ("op_statistic", OP_STATISTIC_CSV),
                                           ("trace", TRACE_VIEW_JSON)) if (base / name).is_file()), None)
            if kind is None:
                continue
            path = base / {"kernel_details": KERNEL_DETAILS_CSV, "op_statistic": OP_STATISTIC_CSV,
                           "trace": TRACE_VIEW_JSON}[kind]
            try:
                if kind == "kernel_details":
                    got = kernel_details_categories(path)["steps"]
                elif kind == "op_statistic":
                    got = [{"step": None, **op_statistic_categories(path)}]
                else:
                    tc = trace_categories(path)
                    got = tc["steps"]
                    warnings.extend(f"{rel_path(path, run_dir)}: {w}" for w in tc["warnings"])
            except MeasureError as exc:
                warnings.append(str(exc))
                continue
            out.append(CategorySource(path=rel_path(path, run_dir), kind=kind, rank=prof.rank, role=prof.role, steps=[
                {"step": s["step"] if s["step"] is not None else prof.path_step, "category_us": s["category_us"]}
                for s in got]))
        return out, warnings

    def ranks(self, run_dir: Path, expected_ranks: int | None = None) -> tuple[RankTimes | None, list[str]]:
        """Every rank's step trace (:func:`bench.measure.rank_overlap.ascend_rank_breakdown`), else
        msprof-analyze's ``cluster_step_trace_time.csv`` anywhere under the run folder."""
        af = read_ascend_free(run_dir, expected_ranks=expected_ranks)
        warnings = list(af.warnings)
        if af.rows:
            return RankTimes("ascend_step_trace", ascend_rank_breakdown(af.rows)), warnings
        cluster = sorted(Path(run_dir).rglob(CLUSTER_STEP_TRACE_CSV))
        if cluster:
            try:
                return RankTimes("cluster_step_trace", read_cluster_step_trace(cluster[0])), warnings
            except MeasureError as exc:
                warnings.append(str(exc))
        return None, warnings
