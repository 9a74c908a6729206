"""Reader of the per-step metrics JSONL written by verl's ``FileLogger`` (and by the embedded engine).

Format (``verl/utils/tracking.py``, class ``FileLogger``): one JSON object per line,
``{"step": N, "data": {"<metric>": value, ...}}``; ``$VERL_FILE_LOGGER_PATH`` names the file
(else ``${VERL_FILE_LOGGER_ROOT:-.}/<project>/<experiment>.jsonl``), opened with mode ``"w"`` at
start, so a file holds one run.

* verl 0.6.x writes ``json.dumps(data) + "\\n"`` through a buffered text file: spaces after ``:`` and
  ``,``, NaN/inf as the bare tokens ``NaN`` / ``Infinity`` / ``-Infinity``.
* verl >= 0.7.1 writes ``orjson.dumps(data, option=OPT_SERIALIZE_NUMPY) + b"\\n"`` unbuffered: compact,
  NaN/inf as ``null``.

Both are read here. Values are coerced to ``float`` (numeric strings such as ``"1.5"`` or ``"NaN"``
are accepted, ``null`` becomes NaN); other values (lists, dicts, words) are skipped and reported.
Several lines of the same step are merged (a later line wins on a repeated key: verl logs the
validation metrics of a step in a separate call). A last line that does not parse (a run killed
mid-write) is skipped and reported as ``truncated_last_line``; an unparsable line elsewhere is
skipped and reported in ``bad_lines``.

Units are whatever the metric name says (verl: ``timing_s/*`` seconds, ``perf/*_gb`` GiB,
``perf/throughput`` tokens/s per device, ``response_length/*`` tokens).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.measure._common import MeasureError, rel_path, to_float, walk_files
from bench.measure.formats import Measurements, Reader, ReadOptions


@dataclass(frozen=True)
class StepMetrics:
    """The metrics of one training step: ``metrics`` maps metric name -> float (NaN kept)."""

    step: int
    metrics: dict[str, float]


@dataclass
class MetricsLog:
    """What :func:`read_metrics_jsonl` found. Iterates (and indexes) like ``list[StepMetrics]``.

    Attributes:
        path: the file read.
        steps: one entry per step, sorted by step.
        truncated_last_line: the last line did not parse (killed mid-write) and was skipped.
        bad_lines: ``(line number, reason)`` of other skipped lines (1-based line numbers).
        skipped_values: ``(step, metric, reason)`` of values that are not numbers.
    """

    path: str
    steps: list[StepMetrics] = field(default_factory=list)
    truncated_last_line: bool = False
    bad_lines: list[tuple[int, str]] = field(default_factory=list)
    skipped_values: list[tuple[int, str, str]] = field(default_factory=list)

    def __iter__(self) -> Iterator[StepMetrics]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, index: int) -> StepMetrics:
        return self.steps[index]

    def by_step(self) -> dict[int, dict[str, float]]:
        """``{step: {metric: value}}`` (a fresh dict)."""
        return {s.step: dict(s.metrics) for s in self.steps}

    def series(self, name: str) -> list[tuple[int, float]]:
        """``[(step, value)]`` of one metric over the steps that logged it."""
        return [(s.step, s.metrics[name]) for s in self.steps if name in s.metrics]

    def issues(self) -> dict:
        """The reading problems as a JSON-friendly dict."""
        return {
            "truncated_last_line": self.truncated_last_line,
            "bad_lines": [list(b) for b in self.bad_lines],
            "skipped_values": [list(v) for v in self.skipped_values],
        }


def _parse_step(value: object) -> int | None:
    f = to_float(value)
    if f is None or f != f or f in (float("inf"), float("-inf")) or f != int(f):
        return None
    return int(f)


def read_metrics_jsonl(path: str | os.PathLike) -> MetricsLog:
    """Read a verl file-logger JSONL (0.6.x ``json`` or >= 0.7.1 ``orjson`` writer).

    Raises :class:`~bench.measure._common.MeasureError` only when the file cannot be opened.
    An empty file gives an empty log.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise MeasureError(f"{p}: cannot read metrics JSONL: {exc.strerror or exc}") from exc

    log = MetricsLog(path=str(p))
    merged: dict[int, dict[str, float]] = {}
    lines = raw.split(b"\n")
    # index of the last non-blank line: a failure there is a truncated write
    last_idx = max((i for i, ln in enumerate(lines) if ln.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        lineno = i + 1
        try:
            obj = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if i == last_idx:
                log.truncated_last_line = True
            else:
                log.bad_lines.append((lineno, f"not JSON: {exc}"))
            continue
        if not isinstance(obj, dict) or "step" not in obj or not isinstance(obj.get("data"), dict):
            log.bad_lines.append((lineno, 'not a {"step": N, "data": {...}} object'))
            continue
        step = _parse_step(obj["step"])
        if step is None:
            log.bad_lines.append((lineno, f"step is not an integer: {obj['step']!r}"))
            continue
        target = merged.setdefault(step, {})
        for key, value in obj["data"].items():
            f = to_float(value)
            if f is None:
                log.skipped_values.append((step, str(key), f"not a number: {type(value).__name__}"))
                continue
            target[str(key)] = f
    log.steps = [StepMetrics(step=s, metrics=merged[s]) for s in sorted(merged)]
    return log


def looks_like_verl_jsonl(path: str | os.PathLike, max_bytes: int = 1 << 16) -> bool:
    """Whether the first complete line of ``path`` is a ``{"step": N, "data": {...}}`` object."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(max_bytes)
    except OSError:
        return False
    for line in head.split(b"\n"):
        if not line.strip():
            continue
        try:
            obj = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return False
        return isinstance(obj, dict) and "step" in obj and isinstance(obj.get("data"), dict)
    return False


def find_metrics_file(run_dir: str | os.PathLike) -> tuple[Path | None, list[Path]]:
    """The metrics JSONL of a run folder and the other candidates.

    ``<run_dir>/metrics.jsonl`` if present; else every ``*.jsonl`` below the folder whose first
    line is a verl file-logger record, the shallowest (then alphabetically first) chosen.
    Returns ``(chosen or None, other candidates)``.
    """
    root = Path(run_dir)
    direct = root / "metrics.jsonl"
    candidates = [p for p in walk_files(root) if p.name.endswith(".jsonl") and p != direct]
    candidates = [p for p in candidates if looks_like_verl_jsonl(p)]
    candidates.sort(key=lambda p: (len(p.relative_to(root).parts), p.as_posix()))
    if direct.is_file():
        return direct, candidates
    if candidates:
        return candidates[0], candidates[1:]
    return None, []


class JsonlReader(Reader):
    """verl's file-logger JSONL (also what the embedded engine writes): per-step metrics."""

    name = "jsonl"
    when_absent = "no metrics JSONL found"

    def detect(self, run_dir: Path) -> bool:
        return find_metrics_file(run_dir)[0] is not None

    def read(self, run_dir: Path, options: ReadOptions) -> Measurements:
        metrics_path, others = find_metrics_file(run_dir)
        out = Measurements()
        if metrics_path is None:
            return out
        log = read_metrics_jsonl(metrics_path)
        rel = rel_path(metrics_path, run_dir)
        out.fields = {"metrics_file": rel, "metrics": log.by_step(), "metrics_issues": log.issues()}
        if log.truncated_last_line:
            out.warnings.append(f"{rel}: last line truncated (run killed mid-write); skipped")
        for lineno, reason in log.bad_lines:
            out.warnings.append(f"{rel}:{lineno}: skipped: {reason}")
        if others:
            out.warnings.append(f"other metrics JSONL files ignored: {[rel_path(p, run_dir) for p in others]}")
        return out
