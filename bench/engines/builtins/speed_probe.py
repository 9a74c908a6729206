"""Machine-speed probe: a fixed reference kernel timed between GRPO steps.

On a shared virtual machine the CPU's speed drifts: a fixed single-thread torch workload here takes
5-8 % longer or shorter from one second to the next and keeps a drift of about 4 % between 20-second
windows (measured on this project's 2-core CI VM: SD of log time of 20-s blocks 4.6 %). That drift is
common to everything the process runs, so a sweep run a minute after its baseline can look several
percent slower without any change. Timing the same fixed kernel next to every step measures the drift:
the SD of log(step time / probe time) over 20-s blocks was 1.4 % on the same machine (the probe ran in
the same process, right before each 0.58-s step), against 4.6 % for the step time alone.

The gate and the tune objective divide step times by the probe's time around the step when both sides
carry the same probe (``bench.gate``, ``bench.tune``); the raw step times are never changed.

The kernel is fixed (:data:`PROBE`) and has two parts, timed together, one intra-op thread (the run's
thread count is restored afterwards), about 30 ms on the CI VM:

* compute: ``matmul_iters`` times ``x = tanh(x @ a * 0.01)`` with ``a`` a 256x256 float32 matrix;
* memory: ``stream_passes`` times ``dst.copy_(src); dst.mul_(1.0001)`` over 2,000,000 float32 (8 MB).

Why both: a GRPO step of the small embedded model is partly compute-bound (matmuls) and partly bound
by memory traffic and op dispatch. Measured on the CI VM over 10 runs of 20 steps (run means of log
time, step workload removed): the matmul part alone moved 0.55x as much as the step (step/probe SD
6.0 %), the memory part 1.4x as much (5.4 %), their sum 1.0x (3.3 %), against 9.3 % for the raw step
times. Its identity (:func:`spec`) is logged so that only probes of the same kernel are compared.
"""

from __future__ import annotations

import time

from bench.records.speed import PROBE_METRIC

#: the reference kernel's parameters; change them and :func:`spec` changes, so old and new probes never mix
PROBE = {"n": 256, "matmul_iters": 20, "stream_floats": 2_000_000, "stream_passes": 30, "dtype": "float32",
         "threads": 1}
METRIC = PROBE_METRIC  # the metric name is the analysis side's (bench.records.speed), the kernel is the engine's


def spec() -> str:
    """Identity of the probe kernel, e.g. ``matmul256x20+stream2000000x30-float32-t1``."""
    p = PROBE
    return (f"matmul{p['n']}x{p['matmul_iters']}+stream{p['stream_floats']}x{p['stream_passes']}"
            f"-{p['dtype']}-t{p['threads']}")


def source() -> str:
    """A hash of the kernel's code (:class:`SpeedProbe`, first 12 hex digits of its source's SHA-256): two code
    versions whose probes differ in code but not in :data:`PROBE` are told apart (the interleaved gate fits the
    probe as a covariate only where both versions timed the same kernel)."""
    import hashlib
    import inspect

    return hashlib.sha256(inspect.getsource(SpeedProbe).encode()).hexdigest()[:12]


class SpeedProbe:
    """Times :data:`PROBE` on the CPU; :meth:`measure` returns seconds (lower = faster machine).

    The operands are created once (seeded) and the kernel runs once at construction to warm the
    allocator and the BLAS path, so the first measurement is not an outlier.
    """

    def __init__(self) -> None:
        import torch

        self._torch = torch
        gen = torch.Generator().manual_seed(0)
        n = PROBE["n"]
        self._a = torch.randn(n, n, generator=gen, dtype=torch.float32)
        self._x0 = torch.randn(n, n, generator=gen, dtype=torch.float32)
        self._src = torch.randn(PROBE["stream_floats"], generator=gen, dtype=torch.float32)
        self._dst = torch.empty_like(self._src)
        self.measure()

    def measure(self) -> float:
        """Run the kernel once; wall seconds (``time.perf_counter``)."""
        torch = self._torch
        threads = torch.get_num_threads()
        torch.set_num_threads(PROBE["threads"])
        try:
            with torch.no_grad():
                x = self._x0
                t0 = time.perf_counter()
                for _ in range(PROBE["matmul_iters"]):
                    x = torch.tanh(x @ self._a * 0.01)
                for _ in range(PROBE["stream_passes"]):
                    self._dst.copy_(self._src)
                    self._dst.mul_(1.0001)
                return time.perf_counter() - t0
        finally:
            torch.set_num_threads(threads)

