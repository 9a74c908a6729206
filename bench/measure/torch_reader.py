"""The torch chrome traces of a run folder (:func:`find_torch_traces`), the training step a trace's path
names (:func:`step_from_path`; a verl rollout trace, which names none, paired with its step by
:func:`trace_steps`), and their :class:`~bench.measure.formats.Reader`: every trace of the run
parsed at once over the cores and through the parsed-trace cache (:func:`bench.measure.trace_pool.parse_traces`),
then the Free ratio per step (:mod:`bench.measure.torch_trace`); a step's operators (the same parse, through the
cache), its categories (:func:`bench.measure.op_categories.trace_categories`) and each GPU trace's ranks
(:func:`bench.measure.rank_overlap.trace_overlap`).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from bench.measure._common import MeasureError, rel_path, walk_files
from bench.measure.chrome_trace import looks_like_chrome_trace, open_binary
from bench.measure.formats import CategorySource, Measurements, RankTimes, Reader, ReadOptions, StepOps
from bench.measure.op_categories import phase_of, read_trace_events, trace_categories
from bench.measure.rank_overlap import trace_overlap
from bench.measure.trace_cache import CACHE_DIR
from bench.measure.trace_ops import step_entry
from bench.measure.trace_pool import parse_files, parse_traces

#: folders of a run folder that hold torch chrome traces (any depth below them)
TRACE_DIRS = ("trace", "profile")


_RANK_INFO_RE = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')
_RANK_NAME_RE = re.compile(r"rank[-_]?(\d+)")
_PATH_STEP_RE = re.compile(r"(?:^|[_\-/])(?:train_)?step[_\-]?(\d+)(?=[_\-./]|$)")
#: vLLM's torch profiler names a trace ``<instance>-rank-<tp>.<time stamp>.pt.trace.json[.gz]`` (torch's
#: ``tensorboard_trace_handler``; unix ns in torch 2.13); verl's relocation prefixes ``rollout-replica<r>_``.
_STAMP_RE = re.compile(r"\.(\d{10,})(?=\.pt\.trace\.json(?:\.gz)?$)")


def step_from_path(rel: str) -> int | None:
    """The training step a trace file's name or folders name (``None`` if none does).

    verl's torch profiler writes one trace per role and profiled step, named like
    ``actor-rollout_train_step2_rank0-of-1_pid123.json.gz`` (verl >= 0.7), or ``<save_path>/<step>/<role>/``
    folders (verl 0.6.x): a trace without ``ProfilerStep#N`` windows is attributed to that step.
    """
    m = _PATH_STEP_RE.search(rel)
    if m:
        return int(m.group(1))
    for part in Path(rel).parts[:-1]:
        if part.isdigit():
            return int(part)
    return None


def trace_steps(rels: list[str]) -> tuple[dict[str, int | None], list[str]]:
    """The training step of each trace path (relative to the run folder), and warnings.

    A path that names a step (:func:`step_from_path`) keeps it. verl's rollout traces (vLLM's engine profiled
    around the generation of each profiled step; :func:`~bench.measure.op_categories.phase_of` says
    ``rollout``) name none: those of one engine worker (the name without the time stamp torch writes into it)
    are ordered by that stamp (else by name) and paired one to one with the steps the other traces name, in order (vLLM
    writes each before its step's training trace). A worker whose count of rollout traces differs from the
    count of named steps is left unpaired (``None``: its windows count as unstepped), with a warning.
    """
    out = {rel: step_from_path(rel) for rel in rels}
    named = sorted({s for s in out.values() if s is not None})
    groups: dict[str, list[tuple[int, str]]] = {}
    for rel, step in out.items():
        if step is not None or phase_of(rel) != "rollout":
            continue
        m = _STAMP_RE.search(rel)
        key = rel[:m.start()] + rel[m.end():] if m else rel
        groups.setdefault(key, []).append((int(m.group(1)) if m else 0, rel))
    warnings = []
    for key, files in sorted(groups.items()):
        if len(files) != len(named):
            warnings.append(f"{key}: {len(files)} rollout trace(s) for {len(named)} profiled step(s) "
                            f"{named}: not paired with a step")
            continue
        for step, (_stamp, rel) in zip(named, sorted(files)):
            out[rel] = step
    return out, warnings


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


def find_torch_traces(run_dir: str | os.PathLike) -> list[Path]:
    """Chrome traces under ``<run_dir>/trace/`` and ``<run_dir>/profile/`` (any depth).

    Names ending ``.json`` or ``.json.gz`` (``*.pt.trace.json[.gz]``, verl's ``prof_rank-<r>.json.gz``)
    whose first bytes look like a chrome trace; nothing inside ``*_ascend_pt`` folders.
    """
    root = Path(run_dir)
    found = []
    for sub in TRACE_DIRS:
        base = root / sub
        if not base.is_dir():
            continue
        for p in walk_files(base):
            if (p.name.endswith(".json") or p.name.endswith(".json.gz")) and looks_like_chrome_trace(p):
                found.append(p)
    return found


class TorchTraceReader(Reader):
    """torch profiler chrome traces: the Free ratio per ``ProfilerStep#N`` window (or the step the path names)."""

    name = "torch"

    def detect(self, run_dir: Path) -> bool:
        return bool(find_torch_traces(run_dir))

    def read(self, run_dir: Path, options: ReadOptions) -> Measurements:
        out = Measurements(fields={"traces": []})
        paths = find_torch_traces(run_dir)
        steps, step_warnings = trace_steps([rel_path(p, run_dir) for p in paths])
        out.warnings.extend(step_warnings)
        for trace_path, tf in zip(paths, parse_traces(paths, cache_dir=run_dir / CACHE_DIR)):
            rel = rel_path(trace_path, run_dir)
            if isinstance(tf, MeasureError):  # the file is not a readable trace
                out.warnings.append(str(tf))
                continue
            d = tf.to_dict()
            d["path"] = rel
            out.fields["traces"].append(d)
            out.warnings.extend(f"{rel}: {w}" for w in tf.warnings)
            path_step = steps[rel]
            for s in tf.steps:
                if math.isnan(s.free_ratio):
                    continue
                entry = {"kind": "torch", "source": rel, "free_ratio": s.free_ratio, "basis": s.basis}
                out.free.append((s.step if s.step is not None else path_step, entry))
        return out

    def _tables(self, run_dir: Path, source: str, memo: dict) -> dict[str, Any] | None:
        """The parsed tables of the trace ``source`` (through the run folder's cache, once per run)."""
        path = run_dir / source
        if not path.is_file():
            return None
        key = (self.name, path)
        if key not in memo:
            memo[key] = parse_files([("trace", path)], cache_dir=run_dir / CACHE_DIR)[0]
        got = memo[key]
        return got if isinstance(got, dict) else None

    def step_ops(self, run_dir: Path, step: int, source: str, memo: dict) -> StepOps | None:
        """Every operator of the step's window: device kernels / memcpy / memset by duration when the trace has
        device events, else the ``cpu_op`` self times (:func:`bench.measure.trace_ops.top_table`'s ``ops``)."""
        got = self._tables(run_dir, source, memo)
        hit = step_entry(got.get("top_ops") or [], step) if got else None
        if not hit or "ops" not in hit:
            return None
        ops = hit["ops"]
        if ops.get("device"):
            return StepOps(source=source, basis="device", ops=[tuple(o) for o in ops["device"]],
                           window_ms=hit.get("window_ms"), cpu=[tuple(o) for o in ops.get("cpu") or []])
        return StepOps(source=source, basis="cpu", ops=[tuple(o) for o in ops.get("cpu") or []],
                       window_ms=hit.get("window_ms"))

    def top_ops(self, run_dir: Path, step: int, source: str, memo: dict, n: int) -> dict[str, Any] | None:
        """The trace's own top tables of the step (:func:`bench.measure.trace_ops.top_table`)."""
        got = self._tables(run_dir, source, memo)
        hit = step_entry(got["top_ops"], step) if got else None
        if not hit:
            return None
        return {"source": source, "window_ms": hit["window_ms"], "cpu": hit["cpu"][:n], "device": hit["device"][:n]}

    def categories(self, run_dir: Path) -> tuple[list[CategorySource], list[str]]:
        """Each trace's time per category and ``ProfilerStep`` window (else the step its path names)."""
        traces = find_torch_traces(run_dir)
        steps, _ = trace_steps([rel_path(p, run_dir) for p in traces])
        out, warnings = [], []
        for p in traces:
            rel = rel_path(p, run_dir)
            try:
                tc = trace_categories(p)
            except MeasureError as exc:
                warnings.append(str(exc))
                continue
            warnings.extend(f"{rel}: {w}" for w in tc["warnings"])
            out.append(CategorySource(path=rel, kind="trace", rank=trace_rank(p), role=rel, steps=[
                {"step": s["step"] if s["step"] is not None else steps[rel], "category_us": s["category_us"]}
                for s in tc["steps"]]))
        return out, warnings

    def ranks(self, run_dir: Path, expected_ranks: int | None = None) -> tuple[RankTimes | None, list[str]]:
        """The derived overlap of each GPU trace (device events only), per step and rank (the trace's
        ``distributedInfo.rank``, else ``rank<N>`` in its name, else ``-1 - i`` with a warning); several traces
        of one rank in one step (verl roles) add up."""
        warnings: list[str] = []
        per_step: dict[Any, dict[Any, dict[str, float | None]]] = {}
        traces = find_torch_traces(run_dir)
        path_steps, _ = trace_steps([rel_path(p, run_dir) for p in traces])
        for i, p in enumerate(traces):
            rel = rel_path(p, run_dir)
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
                for k, v in s.items():
                    if k not in ("step", "window_us"):
                        slot[k] = v if slot.get(k) is None or v is None else slot[k] + v
        return (RankTimes("torch_trace", per_step) if per_step else None), warnings
