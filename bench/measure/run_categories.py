"""One run folder's operator categories per step and phase, and its ranks' time breakdown with the slow-rank flag.

:func:`run_categories` takes every source the readers find (torch chrome traces under ``trace/`` / ``profile/``:
:func:`bench.measure.torch_reader.find_torch_traces`; every ``*_ascend_pt`` folder:
:func:`bench.measure.ascend.find_ascend_profiles`, its ``kernel_details.csv``, else its ``op_statistic.csv``,
else its ``trace_view.json``) and sums the time per category (microseconds) per step and phase. The step is the
file's own (``ProfilerStep#N``, ``Step Id``), else the one its path names (verl's ``<step>/<role>/`` folders,
``..._step2_...`` file names); the phase is :func:`~bench.measure.op_categories.phase_of` of the Ascend role
folder or the trace's path (``None``: unknown).

:func:`run_rank_breakdown`: the Ascend step trace of every rank when the run has one, else msprof-analyze's
``cluster_step_trace_time.csv`` (``cluster_analysis_output/``) when present, else the derived overlap
of each torch GPU trace (the rank from the trace's ``distributedInfo.rank``, else ``rank<N>`` in its name),
then :func:`bench.measure.rank_overlap.run_ranks`.

A file that cannot be read is a warning naming it, never an error.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from bench.measure._common import MeasureError, rel_path
from bench.measure.ascend import find_ascend_profiles, read_ascend_free
from bench.measure.ascend_kernels import KERNEL_DETAILS_CSV, TRACE_VIEW_JSON
from bench.measure.ascend_step_trace import OUTPUT_DIR
from bench.measure.chrome_trace import open_binary
from bench.measure.op_categories import (
    CATEGORIES,
    kernel_details_categories,
    op_statistic_categories,
    phase_of,
    read_trace_events,
    trace_categories,
)
from bench.measure.rank_overlap import (
    SLOW_RANK_THRESHOLD,
    ascend_rank_breakdown,
    read_cluster_step_trace,
    run_ranks,
    trace_overlap,
)
from bench.measure.torch_reader import find_torch_traces, trace_steps

OP_STATISTIC_CSV = "op_statistic.csv"
CLUSTER_STEP_TRACE_CSV = "cluster_step_trace_time.csv"
_RANK_INFO_RE = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')
_RANK_NAME_RE = re.compile(r"rank[-_]?(\d+)")


def _sources(run_dir: Path) -> list[dict[str, Any]]:
    """``{"kind", "path", "rank", "role", "path_step"}`` of every file to categorize."""
    out = []
    for prof in find_ascend_profiles(run_dir):
        base = Path(prof.path) / OUTPUT_DIR
        for kind, name in (("kernel_details", KERNEL_DETAILS_CSV), ("op_statistic", OP_STATISTIC_CSV),
                           ("trace", TRACE_VIEW_JSON)):
            if (base / name).is_file():
                out.append({"kind": kind, "path": base / name, "rank": prof.rank, "role": prof.role,
                            "path_step": prof.path_step})
                break
    traces = find_torch_traces(run_dir)
    steps, _ = trace_steps([rel_path(p, run_dir) for p in traces])
    for p in traces:
        rel = rel_path(p, run_dir)
        out.append({"kind": "trace", "path": p, "rank": trace_rank(p), "role": rel, "path_step": steps[rel]})
    return out


def trace_rank(path: str | os.PathLike, peek: int = 1 << 16) -> int | None:
    """The rank of a torch chrome trace: ``distributedInfo.rank`` in its first ``peek`` bytes (decompressed;
    torch writes it before the events), else ``rank<N>`` / ``rank-<N>`` in the file name; ``None``."""
    try:
        with open_binary(Path(path)) as fh:
            m = _RANK_INFO_RE.search(fh.read(peek))
    except (OSError, EOFError):
        m = None
    if m:
        return int(m.group(1))
    m2 = _RANK_NAME_RE.search(Path(path).name)
    return int(m2.group(1)) if m2 else None


def run_categories(run_dir: str | os.PathLike) -> dict[str, Any]:
    """Time per category (us) of every profiled step of a run, per phase and summed over phases.

    Returns ``{"sources": [{"path" (relative), "kind", "rank", "role", "phase", "steps": [{"step",
    "category_us"}]}], "steps": {step: {"phases": {phase: {category: us}}, "category_us": {category: us},
    "share": {category: share}}}, "warnings": [...]}``. ``op_statistic.csv`` has no steps: it counts under the
    profile folder's step (``None`` when the path names none). Several ranks add up (the shares are those of the
    summed device time).
    """
    root = Path(run_dir)
    out: dict[str, Any] = {"sources": [], "steps": {}, "warnings": []}
    for src in _sources(root):
        try:
            if src["kind"] == "kernel_details":
                got = kernel_details_categories(src["path"])["steps"]
            elif src["kind"] == "op_statistic":
                got = [{"step": None, **op_statistic_categories(src["path"])}]
            else:
                tc = trace_categories(src["path"])
                got = tc["steps"]
                out["warnings"].extend(f"{rel_path(src['path'], root)}: {w}" for w in tc["warnings"])
        except MeasureError as exc:
            out["warnings"].append(str(exc).replace(str(root) + os.sep, ""))
            continue
        phase = phase_of(src["role"])
        steps = [{"step": s["step"] if s["step"] is not None else src["path_step"], "category_us": s["category_us"]}
                 for s in got]
        out["sources"].append({"path": rel_path(src["path"], root), "kind": src["kind"], "rank": src["rank"],
                               "role": src["role"], "phase": phase, "steps": steps})
        for s in steps:
            slot = out["steps"].setdefault(s["step"], {"phases": {}, "category_us": dict.fromkeys(CATEGORIES, 0.0)})
            ph = slot["phases"].setdefault(phase, dict.fromkeys(CATEGORIES, 0.0))
            for c, v in s["category_us"].items():
                ph[c] += v
                slot["category_us"][c] += v
    for slot in out["steps"].values():
        total = sum(slot["category_us"].values())
        slot["share"] = {c: (v / total if total > 0 else None) for c, v in slot["category_us"].items()}
    return out


def run_rank_breakdown(run_dir: str | os.PathLike, threshold: float = SLOW_RANK_THRESHOLD,
                       expected_ranks: int | None = None) -> dict[str, Any]:
    """Per step and rank: computing, communication not overlapped, overlapped, communication, free, bubble and
    step time (us), and the slow-rank flag (:func:`bench.measure.rank_overlap.run_ranks`, ``threshold``: share of
    the step). ``source``: ``"ascend_step_trace"``, ``"cluster_step_trace"``, ``"torch_trace"`` or ``None``
    (nothing to read); warnings name what could not be read."""
    root = Path(run_dir)
    warnings: list[str] = []
    af = read_ascend_free(root, expected_ranks=expected_ranks)
    warnings.extend(af.warnings)
    if af.rows:
        return {"source": "ascend_step_trace", **run_ranks(ascend_rank_breakdown(af.rows), threshold),
                "warnings": warnings}
    cluster = sorted(root.rglob(CLUSTER_STEP_TRACE_CSV))
    if cluster:
        try:
            return {"source": "cluster_step_trace", **run_ranks(read_cluster_step_trace(cluster[0]), threshold),
                    "warnings": warnings}
        except MeasureError as exc:
            warnings.append(str(exc))
    per_step: dict[Any, dict[Any, dict[str, float]]] = {}
    traces = find_torch_traces(root)
    path_steps, _ = trace_steps([rel_path(p, root) for p in traces])
    for i, p in enumerate(traces):
        rel = rel_path(p, root)
        try:
            ov = trace_overlap(p, read_trace_events(p))
        except MeasureError as exc:
            warnings.append(str(exc))
            continue
        if ov["basis"] != "device":
            continue
        rank = trace_rank(p)
        if rank is None:
            rank = -1 - i
            warnings.append(f"{rel}: rank unknown (no distributedInfo.rank, no rank<N> in the name); using {rank}")
        for s in ov["steps"]:
            step = s["step"] if s["step"] is not None else path_steps[rel]
            slot = per_step.setdefault(step, {}).setdefault(rank, {})
            for k, v in s.items():  # several traces of one rank in one step (roles) add up
                if k not in ("step", "window_us"):
                    slot[k] = v if slot.get(k) is None or v is None else slot[k] + v
    if not per_step:
        return {"source": None, "threshold": threshold, "steps": {}, "slow_steps": [], "warnings": warnings}
    return {"source": "torch_trace", **run_ranks(per_step, threshold), "warnings": warnings}
