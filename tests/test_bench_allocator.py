"""``benchmarks/bench_allocator.py`` (issue 23): the figures of a series of with/without-preload pairs.

The series' folders are written as ``run_bench.py`` leaves them (``<level>_<i>/<matrix>/<sweep>/<cell>/r0/``
with ``record.json`` and ``run.log``); the analysis pairs the runs by index, leaves out a pair whose run did
not finish, and applies the gate's paired rule (``bench.gate.runs.judge_ratios``).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_allocator  # noqa: E402


def _run(out: Path, level: str, i: int, step: float | None, warning: bool) -> None:
    r0 = out / f"{level}_{i}" / f"alloc_{level}" / "20261201-000000-abc" / "adb594a165f1" / "r0"
    r0.mkdir(parents=True)
    rec = {"status": "failed", "reason": "timed out after 4 finished step(s)"} if step is None else {
        "status": "ok", "summary": {"step_time_median_s": step, "phase_median_s": {"gen": step / 2,
                                                                                 "update_actor": step / 4}},
        "timing": {"startup_s": 80.0}, "host_load": {"before": {"load1_per_cpu": 0.5}, "after": {}}}
    (r0 / "record.json").write_text(json.dumps(rec))
    (r0 / "run.log").write_text("WARNING cpu_worker.py:127] libtcmalloc is not found in LD_PRELOAD.\n" if warning
                                else "INFO no warning\n")


@pytest.mark.parametrize("ratios,verdict", [([0.80, 0.79, 0.81, 0.80, 0.82], "improvement"),
                                            ([1.0, 1.001, 0.999, 1.0005, 0.9995], "unchanged"),
                                            ([0.7, 1.4, 0.9, 1.2, 0.8], "noisy")])
def test_pairs_are_judged_by_the_gates_paired_rule(tmp_path, capsys, ratios, verdict):
    for i, r in enumerate(ratios, 1):
        _run(tmp_path, "off", i, 2.0, warning=True)
        _run(tmp_path, "on", i, 2.0 * r, warning=False)
    _run(tmp_path, "off", 9, None, warning=True)  # a run that timed out: its pair is left out
    _run(tmp_path, "on", 9, 1.0, warning=False)
    result = bench_allocator.analyze(tmp_path)
    assert result["pairs"] == list(range(1, len(ratios) + 1))
    step = result["metrics"]["step"]
    assert step["ratios"] == pytest.approx(ratios)
    assert step["verdict"] == verdict
    assert step["change"] == pytest.approx(math.expm1(sum(map(math.log, ratios)) / len(ratios)))
    out = capsys.readouterr().out
    decision = "apply the preload" if verdict == "improvement" else "do not apply the preload"
    assert f"decision: {decision}" in out
    assert '"warning": true' in out and '"warning": false' in out  # the preload reached vLLM's workers or not
