"""One run folder's operator categories per step and phase, and its ranks' time breakdown with the slow-rank flag.

Both ask every reader (:func:`bench.measure.formats.readers`) of the run folder's formats.

:func:`run_categories`: each reader that finds its files (``detect``) gives its files' time per category and step
(:meth:`bench.measure.formats.Reader.categories`: torch chrome traces under ``trace/`` / ``profile/``; every
``*_ascend_pt`` folder's ``kernel_details.csv``, else its ``op_statistic.csv``, else its ``trace_view.json``; a
plugin format: its operator rows per step by name); they are summed per step and phase (microseconds). The step is
the file's own (``ProfilerStep#N``, ``Step Id``), else the one its path names (verl's ``<step>/<role>/`` folders,
``..._step2_...`` file names); the phase is :func:`~bench.measure.op_categories.phase_of` of the Ascend role folder
or the trace's path (``None``: unknown).

:func:`run_rank_breakdown`: the first reader, in reader order, whose :meth:`~bench.measure.formats.Reader.ranks`
gives a breakdown (torch: the derived overlap of each GPU trace, the rank from the trace's
``distributedInfo.rank``, else ``rank<N>`` in its name; Ascend: the step trace of every rank, else msprof-analyze's
``cluster_step_trace_time.csv``), then :func:`bench.measure.rank_overlap.run_ranks`.

A file that cannot be read is a warning naming it, never an error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench.measure.ascend import CLUSTER_STEP_TRACE_CSV, OP_STATISTIC_CSV
from bench.measure.formats import readers
from bench.measure.op_categories import CATEGORIES, phase_of
from bench.measure.rank_overlap import SLOW_RANK_THRESHOLD, run_ranks
from bench.measure.torch_reader import trace_rank

__all__ = ["CLUSTER_STEP_TRACE_CSV", "OP_STATISTIC_CSV", "run_categories", "run_rank_breakdown", "trace_rank"]


def run_categories(run_dir: str | os.PathLike) -> dict[str, Any]:
    """Time per category (us) of every profiled step of a run, per phase and summed over phases.

    Returns ``{"sources": [{"path" (relative), "kind", "rank", "role", "phase", "steps": [{"step",
    "category_us"}]}], "steps": {step: {"phases": {phase: {category: us}}, "category_us": {category: us},
    "share": {category: share}}}, "warnings": [...]}``, sources in reader order. ``op_statistic.csv`` has no
    steps: it counts under the profile folder's step (``None`` when the path names none). Several ranks add up
    (the shares are those of the summed device time).
    """
    root = Path(run_dir)
    out: dict[str, Any] = {"sources": [], "steps": {}, "warnings": []}
    for reader in readers():
        if not reader.detect(root):
            continue
        sources, warnings = reader.categories(root)
        out["warnings"].extend(w.replace(str(root) + os.sep, "") for w in warnings)
        for src in sources:
            phase = phase_of(src.role)
            out["sources"].append({"path": src.path, "kind": src.kind, "rank": src.rank, "role": src.role,
                                   "phase": phase, "steps": src.steps})
            for s in src.steps:
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
    the step), from the first reader that has ranks (see the module text). ``source``: the reader's
    (``"ascend_step_trace"``, ``"cluster_step_trace"``, ``"torch_trace"``, a plugin's) or ``None`` (nothing to
    read); warnings name what could not be read."""
    root = Path(run_dir)
    warnings: list[str] = []
    for reader in readers():
        got, more = reader.ranks(root, expected_ranks)
        warnings.extend(more)
        if got is not None:
            return {"source": got.source, **run_ranks(got.steps, threshold), "warnings": warnings}
    return {"source": None, "threshold": threshold, "steps": {}, "slow_steps": [], "warnings": warnings}
