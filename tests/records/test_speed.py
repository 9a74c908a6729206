"""Speed normalization (``bench.records.speed``): the gate and claims read step times at the baseline's machine
speed."""

from __future__ import annotations

import json
import math
import re

import pytest
from _sweeps import EMBEDDED_CELLS, log_normal_times, make_sweep

from bench.cli import main
from bench.records.speed import normalizable, normalize, normalized_pair


@pytest.fixture(scope="module")
def uri(tmp_path_factory):
    from bench.tracking import Tracker

    d = tmp_path_factory.mktemp("mlflow")
    u = f"sqlite:///{d}/mlflow.db"
    Tracker(u, "synth")
    return u


def gate(results, uri, *extra):
    main(["gate", "--baseline", "base", "--candidate", "cand", "--results", str(results), "--tracking-uri", uri,
          "--bootstrap", "300", *extra])
    return json.loads((results / "cand" / "latest" / "gate" / "gate.json").read_text())


@pytest.fixture()
def results(tmp_path, uri):
    """Baseline ``base``: 4 cells, 6 repeats, every step run on the same work (pairable), machine at nominal speed
    (each run's speed varying by 1 %, so the probe's tracking can be tested), saved from six such sweeps so that it
    measures its sweep-to-sweep offset (a baseline saved once decides no step-time row)."""
    for i, seed in enumerate((11, 1, 21, 31, 41, 51)):  # 6 saves: the sweep offset on 5 df
        make_sweep(tmp_path, "synth", EMBEDDED_CELLS, repeats=6, steps=10, machine_sd=0.01,
                   times=log_normal_times(sd=0.01),
                   seed=seed, same_work=True, machine=1.0)
        assert main(["baseline", "save", "synth", "--name", "base", "--results", str(tmp_path), "--tracking-uri", uri,
                     *(["--force"] if i else [])]) == 0
    return tmp_path


def test_slower_machine_alone_is_not_a_regression(results, uri):
    # same code, machine 8 % slower for the whole candidate sweep: raw step times are 8 % slower
    make_sweep(results, "cand", EMBEDDED_CELLS, repeats=6, steps=10, machine_sd=0.01,
               times=log_normal_times(sd=0.01), seed=2,
               same_work=True, machine=1.08)
    raw = gate(results, uri, "--normalize", "off")
    assert raw["exit_code"] == 1 and {r["verdict"] for r in raw["rows"]} == {"regression"}
    assert all(not r["normalized"] and r["normalize_reason"] == "--normalize off" for r in raw["rows"])
    res = gate(results, uri)
    assert res["exit_code"] == 0 and res["settings"]["normalize"] == "auto", res["rows"]
    for r in res["rows"]:
        assert r["normalized"] and r["verdict"] == "unchanged"
        assert r["speed_change"] == pytest.approx(0.08, abs=0.02)
        assert r["raw_change"] == pytest.approx(0.08, abs=0.02)
        assert abs(r["change"]) < 0.015
    md = (results / "cand" / "latest" / "gate" / "gate.md").read_text()
    assert "| machine speed |" in md and re.search(r"\| \+\d+\.\d% probe time; raw change \+\d+\.\d% \|", md)


def test_real_slowdown_on_a_faster_machine_is_still_caught(results, uri):
    # 10 % slower code while the machine ran 8 % faster: raw change about +1 %, normalized about +10 %
    make_sweep(results, "cand", EMBEDDED_CELLS, repeats=6, steps=10, machine_sd=0.01,
               times=log_normal_times(base_s=2.2, sd=0.01),
               seed=3, same_work=True, machine=0.92)
    raw = gate(results, uri, "--normalize", "off")
    assert raw["exit_code"] == 0
    res = gate(results, uri)
    assert res["exit_code"] == 1
    for r in res["rows"]:
        assert r["verdict"] == "regression" and r["change"] == pytest.approx(0.10, abs=0.015)
        assert r["raw_change"] == pytest.approx(1.1 * 0.92 - 1, abs=0.02)


def test_throughput_is_scaled_the_other_way(results, uri):
    make_sweep(results, "cand", EMBEDDED_CELLS, repeats=6, steps=10, machine_sd=0.01,
               times=log_normal_times(sd=0.01), seed=4,
               same_work=True, machine=1.08)
    res = gate(results, uri, "--metric", "throughput,rollout_share")
    assert res["exit_code"] == 0
    tp = [r for r in res["rows"] if r["metric"] == "throughput"]
    assert all(r["normalized"] and abs(r["change"]) < 0.015 and r["raw_change"] < -0.06 for r in tp)
    rs = [r for r in res["rows"] if r["metric"] == "rollout_share"]
    assert all(not r["normalized"] and "ratio" in r["normalize_reason"] for r in rs)


def test_a_side_without_probe_is_compared_raw_and_says_why(results, uri):
    make_sweep(results, "cand", EMBEDDED_CELLS, repeats=6, steps=10, machine_sd=0.01,
               times=log_normal_times(sd=0.01), seed=5,
               same_work=True, machine=None)
    res = gate(results, uri)
    assert res["exit_code"] == 0
    assert all(not r["normalized"] and "candidate has no speed probe" in r["normalize_reason"] for r in res["rows"])
    assert "not normalized" in (results / "cand" / "latest" / "gate" / "gate.md").read_text()


def test_normalize_formula_and_kernel_mismatch():
    assert normalize([[2.0, 3.0]], [[0.04, 0.02]], 0.02, "step_time") == [[1.0, 3.0]]
    assert normalize([[100.0]], [[0.04]], 0.02, "throughput") == [[200.0]]
    with pytest.raises(ValueError):
        normalize([[1.0, 2.0]], [[0.02]], 0.02, "step_time")

    def cell(probes, spec="k1"):
        return {"repeats": [{"status": "ok", "repeat": 0, "probe_spec": spec,
                             "samples": {"step_time": [1.0] * len(probes), "speed_probe": probes}}]}

    assert normalizable(cell([0.03, 0.03]), cell([0.03, 0.03]), "step_time") is None
    assert "different probe kernels" in normalizable(cell([0.03, 0.03]), cell([0.03, 0.03], "k2"), "step_time")
    assert "baseline has no speed probe" in normalizable(cell([]), cell([0.03]), "step_time")
    b, c, sp = normalized_pair(cell([0.02, 0.02]), cell([0.03, 0.03]), "step_time", [[1.0, 1.0]], [[1.5, 1.5]])
    assert b == [[1.0, 1.0]] and c == [[1.0, 1.0]] and math.isclose(sp, 0.5)


def test_report_reads_cells_at_one_machine_speed(tmp_path, uri):
    # dynamic_bsz makes steps 20 % faster, but its cells ran while the machine was 25 % slower
    from bench.commands.report import build

    times = log_normal_times(effects={"dynamic_bsz": math.log(0.8)}, sd=0.01)
    sweep = make_sweep(tmp_path, "rep", EMBEDDED_CELLS, repeats=2, steps=8, times=times, seed=6, same_work=True,
                       machine=[1.0, 1.25, 1.0, 1.25])
    raw = build(sweep, tmp_path, n_boot=200, normalize=False)
    norm = build(sweep, tmp_path, n_boot=200)
    cell = lambda data, label: next(r for r in data["cells"] if r["cell"] == label)  # noqa: E731
    assert raw["speed_normalized_to_s"] is None
    assert cell(raw, "dynamic_bsz")["speedup"] == pytest.approx(1.0, abs=0.03)
    assert norm["speed_normalized_to_s"] == pytest.approx(0.03 * 1.25 ** 0.5, rel=0.15)
    assert cell(norm, "dynamic_bsz")["speedup"] == pytest.approx(1.25, abs=0.03)
    main_eff = {t["name"]: t for t in norm["effects"]["fit"]["terms"]}["dynamic_bsz"]
    assert main_eff["change"] == pytest.approx(-0.2, abs=0.02)


def test_probe_evidence_comes_only_from_a_patch_that_applied_and_named_its_kernel():
    """A run whose probe a patch timed (verl:cpu's driver) gets ``speed_probe`` evidence from that patch's report;
    an armed patch that never applied (no FileLogger: no step carries the probe) or another metric gives none."""
    from bench.records.speed import PROBE_METRIC, probe_from_patches

    probe = {"spec": "matmul256x20+stream2000000x30-float32-t1", "metric": PROBE_METRIC, "placement": "driver"}
    worker = {"patches": {"verl_speed_probe": {"status": "armed", "actions": []}}}
    driver = {"patches": {"verl_file_logger": {"status": "applied"},
                          "verl_speed_probe": {"status": "applied", "actions": ["x"], "probe": probe}}}
    assert probe_from_patches([worker, driver]) == {"enabled": True, "spec": probe["spec"], "metric": PROBE_METRIC,
                                                    "placement": "driver"}
    assert probe_from_patches([worker]) is None
    armed = {"patches": {"verl_speed_probe": {"status": "armed", "probe": probe}}}
    assert probe_from_patches([armed]) is None
    other = {"patches": {"verl_speed_probe": {"status": "applied", "probe": {**probe, "metric": "bench/other_s"}}}}
    assert probe_from_patches([other, {}]) is None
