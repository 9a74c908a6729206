"""The machine's speed right before and right after a run, timed by the harness (:class:`BracketProbe`).

An engine whose runs cannot time the speed probe between their own steps (a real verl run: Ray, FSDP workers and
the rollout engine in other processes) gets the same fixed kernel timed by the harness around the run instead: for
about :data:`SECONDS` before the launch and again after the run has ended, when no run process competes with it.
On a shared VM whose speed moves from minute to minute, a run taking two minutes runs at about the speed these two
windows see; whether that holds on a machine is measured, not assumed (``benchmarks/bench_verdict.py
bracket-probe``: over the runs of a sweep, each cell centred on its own mean, do the run values and the bracket's
probe times correlate). The record keeps it as ``machine_probe`` (:func:`bracket_record`); no figure uses it until
that check says it tracks.

The kernel is the engines' shared speed probe (:data:`bench.engines.builtins.speed_probe.PROBE`, one intra-op
thread, about 30 ms on the CI VM), so its time means the same thing in both engines; the spec is prefixed
``bracket:`` so that a bracket probe is never compared with an in-run one.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from bench.engines.builtins.speed_probe import SpeedProbe, spec

#: seconds of kernel repetitions per window (before and after a run); the window's figure is their median
SECONDS = 1.5
#: fewest repetitions per window, however slow the machine
MIN_REPS = 5


class BracketProbe:
    """Times the speed-probe kernel in the harness process; build once per sweep (imports torch, makes the
    operands, warms the kernel), then :meth:`window` before and after each run.

    Args:
        seconds: length of one window in seconds (at least :data:`MIN_REPS` repetitions).
    """

    def __init__(self, seconds: float = SECONDS) -> None:
        self.seconds = seconds
        self.spec = "bracket:" + spec()
        self._probe = SpeedProbe()

    def window(self) -> dict[str, float]:
        """Repeat the kernel for :attr:`seconds` (at least :data:`MIN_REPS` times); returns ``{"median_s",
        "min_s", "max_s", "reps", "at"}`` (kernel seconds; ``at`` = epoch seconds at the window's start)."""
        at = time.time()
        t_end = time.perf_counter() + self.seconds
        times: list[float] = []
        while len(times) < MIN_REPS or time.perf_counter() < t_end:
            times.append(self._probe.measure())
        return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "reps": len(times),
                "at": at}


def bracket_record(probe: BracketProbe, before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The record's ``machine_probe`` block: ``spec``, ``before`` and ``after`` windows (:meth:`BracketProbe.window`)
    and ``median_s``, the geometric mean of the two windows' medians (seconds of the kernel; lower = faster)."""

    return {"spec": probe.spec, "before": before, "after": after,
            "median_s": math.sqrt(before["median_s"] * after["median_s"])}


#: square GEMM size of :func:`matmul_peak` (n x n @ n x n; 2 n^3 FLOPs) and repetitions per dtype (best kept)
PEAK_SIZE = 1024
PEAK_REPS = 5


def matmul_peak(size: int = PEAK_SIZE, reps: int = PEAK_REPS) -> dict[str, Any]:
    """This machine's measured matmul peak, in the harness process (all of torch's intra-op threads): the best of
    ``reps`` timed ``size``-cubed GEMMs per dtype after one warm-up, ``2 size^3 / seconds`` FLOP/s.

    Returns ``{"fp32_flops", "bf16_flops" (None where bf16 GEMM fails), "size", "reps", "threads", "at"}``. The
    MFU of a CPU run (:func:`bench.records.mfu.cpu_peak`) divides by the fp32 figure. On a loaded machine the
    best of a few is still below the idle peak: the MFU is then an upper bound (docs/mfu.md).
    """
    import torch

    out: dict[str, Any] = {"size": size, "reps": reps, "threads": torch.get_num_threads(), "at": time.time()}
    for name, dtype in (("fp32_flops", torch.float32), ("bf16_flops", torch.bfloat16)):
        try:
            a = torch.randn(size, size).to(dtype)
            b = torch.randn(size, size).to(dtype)
            torch.matmul(a, b)  # warm-up
            best = math.inf
            for _ in range(reps):
                t0 = time.perf_counter()
                torch.matmul(a, b)
                best = min(best, time.perf_counter() - t0)
            out[name] = 2.0 * size**3 / best
        except RuntimeError:
            out[name] = None
    return out
