"""The harness's machine-speed probe around a run (bench.execution.machine_probe): timed windows of the speed-probe
kernel, taken only for an engine that asks for them and a run on this machine."""

from __future__ import annotations

import math
import time

import pytest


def test_window_times_the_kernel_for_its_length():
    from bench.engines.builtins.speed_probe import spec
    from bench.execution.machine_probe import MIN_REPS, BracketProbe, bracket_record

    probe = BracketProbe(seconds=0.3)
    t0 = time.perf_counter()
    w = probe.window()
    took = time.perf_counter() - t0
    assert w["reps"] >= MIN_REPS and w["min_s"] <= w["median_s"] <= w["max_s"] and w["median_s"] > 0
    # the window ran at least its length, and its repetitions account for the time it took
    assert took >= 0.3 and w["reps"] * w["min_s"] <= took
    assert probe.spec == "bracket:" + spec()  # never mixed with the embedded engine's in-run probe
    rec = bracket_record(probe, w, {**w, "median_s": 4 * w["median_s"]})
    assert rec["median_s"] == pytest.approx(2 * w["median_s"])  # geometric mean of before and after
    assert math.isclose(rec["before"]["median_s"], w["median_s"]) and rec["spec"] == probe.spec


def test_only_engines_that_ask_and_only_runs_on_this_machine():
    from bench.execution import runner
    from bench.execution.executors import LocalExecutor

    class Remote:
        name = "ray"

    assert runner._bracket_probe("embedded", LocalExecutor()) is None  # it times the probe between its own steps
    assert runner._bracket_probe("verl", Remote()) is None  # the run's node is not this machine
    probe = runner._bracket_probe("verl", LocalExecutor())
    assert probe is not None and runner._bracket_probe("verl", LocalExecutor()) is probe  # built once


def test_host_load_reads_cumulative_cpu_and_steal_seconds():
    """The record's host_load carries /proc/stat's total and steal CPU seconds, so a run's steal share is
    d steal / d total between its before and after readings."""
    from bench.core.metadata import host_load

    a = host_load()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.3:  # keep one CPU busy: the total must grow by about that much or more
        pass
    b = host_load()
    assert 0 <= a["cpu_steal_s"] <= b["cpu_steal_s"] <= b["cpu_total_s"]
    assert b["cpu_total_s"] - a["cpu_total_s"] >= 0.2  # clock ticks: 10 ms resolution, all CPUs summed


def test_matmul_peak_is_a_measured_gemm_rate_and_the_cpu_runs_divide_by_its_fp32_figure():
    from bench.execution.machine_probe import matmul_peak
    from bench.execution.runner import ran_here
    from bench.records.mfu import NO_PEAK, cpu_peak

    t0 = time.perf_counter()
    got = matmul_peak(size=256, reps=2)
    elapsed = time.perf_counter() - t0
    assert got["size"] == 256 and got["reps"] == 2 and got["threads"] >= 1
    # 3 GEMMs of 2 * 256^3 FLOPs per dtype ran inside the call: the best one cannot beat the whole call's rate
    assert 0 < got["fp32_flops"] and 2 * 256**3 / got["fp32_flops"] <= elapsed
    peak = cpu_peak(got)
    assert peak["peak_flops"] == got["fp32_flops"] and peak["dtype"] == "fp32" and "measured" in peak["source"]
    assert cpu_peak(None)["peak_flops"] is None and cpu_peak(None)["source"] == NO_PEAK
    # a Ray run's node is this machine when its IP is loopback (the --ray-address loopback head)
    assert ran_here({"ip": "127.0.0.1"}) and not ran_here(None) and not ran_here({"ip": "203.0.113.9"})
