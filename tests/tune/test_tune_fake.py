"""A stand-in executor for tune tests: writes what a real run writes, in milliseconds.

It reads the run's ``run_config.yaml`` (built by the real planner) and writes a verl-format
``metrics.jsonl`` whose step time is a smooth function of the two token limits, or — like the
embedded engine — exits 2 with ``failure.json`` of kind ``infeasible`` / ``oom``, or crashes.
Only the run itself is faked; planning, records, Optuna and MLflow are the real code.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from bench.core.process import ExecResult
from bench.engines.builtins.speed_probe import spec as probe_kernel
from bench.execution.executors import ResolvedLaunch
from bench.records.speed import PROBE_METRIC

SEQ = 160  # P+R of the test matrices


def step_time(ppo: int, lp: int) -> float:
    """Minimum 1.0 s at ppo = 4*SEQ, lp = 8*SEQ; grows with the log-distance from there."""
    return 1.0 + 0.3 * math.log2(ppo / (4 * SEQ)) ** 2 + 0.1 * math.log2(lp / (8 * SEQ)) ** 2


class FakeExecutor:
    """Infeasible below ``infeasible_below`` tokens (either limit), OOM above ``oom_above`` (ppo), crash on
    ``crash_at``."""

    name = "fake"

    def __init__(self, infeasible_below: int = 0, oom_above: int = 10**9, crash_at: set[int] | None = None,
                 machine: list[float] | None = None):
        """``machine``: per call (cycled), how much slower the machine runs (1.0 nominal); with it every step
        time is multiplied by that factor and each step logs a speed probe of ``0.03 s * factor`` and the
        run's evidence names the probe kernel, as the embedded engine does on CPU."""
        self.machine = machine
        self.infeasible_below = infeasible_below
        self.oom_above = oom_above
        self.crash_at = crash_at or set()
        self.calls: list[tuple[int, int]] = []

    def execute(self, launch: ResolvedLaunch) -> ExecResult:
        rd = Path(launch.run_dir)
        cfg = yaml.safe_load((rd / "run_config.yaml").read_text())
        ppo, lp = cfg["ppo_max_token_len_per_gpu"], cfg["log_prob_max_token_len_per_gpu"]
        self.calls.append((ppo, lp))
        log = rd / "run.log"
        if min(ppo, lp) < self.infeasible_below:
            log.write_text(f"AssertionError: max_token_len must be greater than the sequence length. "
                           f"Got max_token_len={min(ppo, lp)} and max_seq_len={self.infeasible_below}\n")
            (rd / "failure.json").write_text(
                json.dumps(
                    {
                        "kind": "infeasible",
                        "reason": f"ppo_max_token_len_per_gpu={min(ppo, lp)} is below the longest sequence of "
                        f"{self.infeasible_below} tokens",
                    }
                )
            )
            return ExecResult(2, False, 0.01, "exit code 2")
        if ppo > self.oom_above:
            log.write_text("torch.OutOfMemoryError: out of memory\n")
            (rd / "failure.json").write_text(
                json.dumps({"kind": "oom", "reason": "device out of memory in update_actor"})
            )
            return ExecResult(1, False, 0.01, "exit code 1")
        if ppo in self.crash_at:
            log.write_text("Traceback (most recent call last):\nRuntimeError: boom in the fake engine\n")
            return ExecResult(1, False, 0.01, "exit code 1")
        slow = self.machine[(len(self.calls) - 1) % len(self.machine)] if self.machine else 1.0
        t = step_time(ppo, lp) * slow
        if self.machine:
            (rd / "evidence.json").write_text(json.dumps({"speed_probe": {"enabled": True, "spec": probe_kernel()}}))
        with open(rd / "metrics.jsonl", "w") as fh:
            for step in range(1, cfg["steps"] + 1):
                data = {"timing_s/step": t, "timing_s/gen": t / 2, "timing_s/update_actor": t / 4,
                        "perf/throughput": 1000.0 / t, "perf/total_num_tokens": 1000}
                if self.machine:
                    data[PROBE_METRIC] = 0.03 * slow
                fh.write(json.dumps({"step": step, "data": data}) + "\n")
        log.write_text("ok\n")
        return ExecResult(0, False, 0.01, "")
