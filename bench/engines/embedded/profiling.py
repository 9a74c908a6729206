"""``torch.profiler`` over the configured steps, exported as plain-JSON chrome traces.

The profiler runs with a ``schedule``, so each profiled step is one ``ProfilerStep#N`` window (N = the
1-based GRPO step, the ``step`` of ``metrics.jsonl``). Consecutive profiled steps share one trace file
``trace/steps_<first>-<last>.json``; a gap starts a new file. Activities: CPU, plus CUDA on ``cuda``
(kernels, memcpy, runtime). Phases show up as ``phase/<name>`` user annotations.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("bench.embedded")


def blocks(steps: list[int]) -> list[tuple[int, int]]:
    """Runs of consecutive step numbers: ``[1, 2, 4]`` -> ``[(1, 2), (4, 4)]``."""
    out: list[tuple[int, int]] = []
    for s in sorted(set(steps)):
        if out and s == out[-1][1] + 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


class StepProfiler:
    """Context manager; call :meth:`step` after every GRPO step.

    Args:
        steps: 1-based steps to record (empty: the profiler is never created).
        out_dir: folder for the traces (created on first export).
        device: ``cpu`` | ``cuda`` | ``npu`` (CUDA activity only on ``cuda``).
    """

    def __init__(self, steps: list[int], out_dir: Path, device: str) -> None:
        self.steps = sorted(set(steps))
        self.out_dir = out_dir
        self.device = device
        self.files: list[str] = []
        self._pending = blocks(self.steps)
        self._prof: Any = None

    def _schedule(self, step_num: int) -> Any:
        from torch.profiler import ProfilerAction

        if step_num not in self.steps:
            return ProfilerAction.NONE
        return ProfilerAction.RECORD if step_num + 1 in self.steps else ProfilerAction.RECORD_AND_SAVE

    def _export(self, prof: Any) -> None:
        first, last = self._pending.pop(0)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"steps_{first}-{last}.json"
        prof.export_chrome_trace(str(path))
        self.files.append(path.name)
        log.info("profiler: steps %d-%d -> %s (%.1f MB)", first, last, path.name, path.stat().st_size / 1e6)

    def activities(self) -> list[str]:
        """Names of the recorded activities."""
        return ["CPU", "CUDA"] if self.device == "cuda" else ["CPU"]

    def __enter__(self) -> "StepProfiler":
        if self.steps:
            from torch.profiler import ProfilerActivity, profile

            if self.device == "cpu":
                # Kineto of the CUDA build logs "USDT ... profiler_start/stop" and "ERROR ... gpuGetDeviceCount
                # failed" to stderr on a machine without a GPU; keep stderr for real failures.
                os.environ.setdefault("KINETO_LOG_LEVEL", "6")

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device == "cuda" else [])
            self._prof = profile(activities=acts, schedule=self._schedule, on_trace_ready=self._export)
            self._prof.start()
            self._prof.step()  # step 0 -> 1, so ProfilerStep#N numbers match the 1-based GRPO step
        return self

    def step(self) -> None:
        """Mark the end of one GRPO step."""
        if self._prof is not None:
            self._prof.step()

    def __exit__(self, *exc: Any) -> None:
        if self._prof is not None:
            self._prof.stop()
            self._prof = None
