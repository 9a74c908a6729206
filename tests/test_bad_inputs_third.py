"""Bad inputs of issue 33 that broke the promise (exit 2, one line naming file and key, nothing written, no
traceback; :func:`_badinput.check_refused`): YAML 1.1 number forms read silently, lax integers and booleans,
``factors`` given as a list of mappings, ``tune`` blocks that ``run`` accepted and ``tune`` refused, a lone
surrogate, an over-long matrix path, an override given twice, SIGHUP, and messages that said the wrong thing.
"""
# ruff: noqa: F811 - the fixture box comes from _badinput; tests take it as a parameter

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _badinput import GOOD, box, check_refused  # noqa: F401 - fixture
from _badinput import base as _base

ROOT = Path(__file__).resolve().parent.parent


def _write(box: Path, text: str, name: str = "m.yaml") -> str:
    (box / name).write_text(text)
    return name


THREE = GOOD.replace("  dynamic_bsz: [off, on]", "  dynamic_bsz: [off, on]\n  rmsnorm_fused: [0, 1]\n"
                     "  forward_prefetch: [0, 1]")
SPACE = "  space:\n    ppo_max_token_len_per_gpu: {low: 1, high: 4, unit: seq}\n"


def _tune(*lines: str, space: str = SPACE) -> str:
    return GOOD + "tune:\n" + "".join(f"  {ln}\n" for ln in lines) + space


MATRICES: dict[str, tuple[str, str | tuple[str, ...]]] = {
    # YAML 1.1 number forms: 010 is 8, 0x2 is 2, 0b11 is 3, 1_0 is 10; refused by name
    "octal_steps": (_base(steps="010"), ("base.steps", "'010'", "octal", "read as 8")),
    "hex_repeats": (GOOD + "repeats: 0x2\n", ("repeats", "'0x2'", "hexadecimal")),
    "binary_seed": (_base(seed="0b11"), ("base.seed", "'0b11'", "binary")),
    "underscore_steps": (_base(steps="1_0"), ("base.steps", "'1_0'", "read as 10")),
    "underscore_float": (_base(temperature="1_0.5"), ("base.temperature", "'1_0.5'", "'_'")),
    # integers and booleans strict everywhere
    "resolution_string": (THREE + "design: {type: fractional, resolution: '3'}\n",
                          ("design.resolution", "expected an integer")),
    "resolution_float": (THREE + "design: {type: fractional, resolution: 3.0}\n",
                         ("design.resolution", "expected an integer")),
    "tune_rule_of_thumb_int": (_tune("start_at_rule_of_thumb: 1"),
                               ("tune.start_at_rule_of_thumb", "expected true or false")),
    "tune_normalize_text": (_tune("normalize: 'no'"), ("tune.normalize", "expected true or false")),
    "tune_log_int": (_tune(space=SPACE.replace("unit: seq", "unit: seq, log: 1")),
                     ("tune.space.ppo_max_token_len_per_gpu.log", "expected true or false")),
    "tune_log_text": (_tune(space=SPACE.replace("unit: seq", "unit: seq, log: 'true'")),
                      ("tune.space.ppo_max_token_len_per_gpu.log", "expected true or false")),
    # factors as a list of what is not a name (was: unexpected TypeError: unhashable type)
    "factors_list_of_mappings": (GOOD.replace("  dynamic_bsz: [off, on]", "  - {dynamic_bsz: [0, 1]}"),
                                 ("factors", "names only", "a mapping")),
    "factors_list_of_lists": (GOOD.replace("  dynamic_bsz: [off, on]", "  - [dynamic_bsz]"),
                              ("factors", "names only", "a list")),
    "factors_omap": (GOOD.replace("factors:\n  dynamic_bsz: [off, on]", "factors: !!omap\n  - dynamic_bsz: [0, 1]"),
                     ("factors", "names only")),
    # tune blocks that `tune` refuses are refused by `run` too
    "tune_grid_log": (_tune("sampler: grid", space=SPACE.replace("unit: seq", "unit: seq, log: true")),
                      ("tune.sampler.type", "log: true")),
    "tune_grid_huge": (_tune("sampler: grid", space="  space:\n"
                             "    ppo_max_token_len_per_gpu: {low: 152, high: 16000000}\n"
                             "    log_prob_max_token_len_per_gpu: {low: 152, high: 16000000}\n"),
                       ("tune.sampler.type", "points")),
    "tune_low_below_seq": (_tune(space=SPACE.replace("low: 1,", "low: 0.5,")),
                           ("tune.space.ppo_max_token_len_per_gpu.low", "below the longest possible sequence")),
    "tune_storage_driver_not_sqlite": (_tune("storage: 'sqlite+pysqlite:///m.yaml'"),
                                       ("tune.storage", "not a SQLite database")),
    "tune_storage_upper_case": (_tune("storage: 'SQLITE:///x.db'"), ("tune.storage", "lower case")),
    # a lone surrogate: was UnicodeEncodeError while printing the plan
    "surrogate_in_reason": (THREE + 'exclude:\n  - when: {rmsnorm_fused: 1}\n    reason: "bad \\udc80 here"\n',
                            ("reason", "lone surrogate")),
    # the expect block strict too: a text or float level, a boolean or text bound
    "expect_level_text": (GOOD + "expect:\n  - {factor: dynamic_bsz, level: '1', at_least: 0.1}\n",
                          ("expect.0.level",)),
    "expect_level_float": (GOOD + "expect:\n  - {factor: dynamic_bsz, level: 1.0, at_least: 0.1}\n",
                           ("expect.0.level",)),
    "expect_at_least_bool": (GOOD + "expect:\n  - {factor: dynamic_bsz, at_least: true}\n", ("expect.0.at_least",)),
    "expect_at_least_text": (GOOD + "expect:\n  - {factor: dynamic_bsz, at_least: '0.1'}\n", ("expect.0.at_least",)),
    # messages that said the wrong thing
    "generators_empty": (THREE + "design: {type: fractional, generators: ''}\n", ("design", "generators is empty")),
    "resolution_above_factors": (THREE + "design: {type: fractional, resolution: 4}\n",
                                 ("design.resolution", "at most 3", "half fraction")),
}


@pytest.mark.parametrize("case", sorted(MATRICES))
@pytest.mark.parametrize("mode", ["dry-run", "run"])
def test_bad_matrix(box, capsys, case, mode):
    text, expected = MATRICES[case]
    argv = ["run", _write(box, text), "--results", "res"] + (["--dry-run"] if mode == "dry-run" else [])
    line = check_refused(box, argv, capsys, expected)
    assert "None" not in line and "unexpected" not in line, line


OVERRIDES = {
    "octal": (["base.steps=010"], ("override 'base.steps=010'", "base.steps", "octal")),
    "twice": (["base.steps=3", "base.steps=4"], ("override 'base.steps=4'", "set twice", "'base.steps=3'")),
    "block_and_key": (["base.embedded={lr: 0.1}", "base.embedded.lr=0.2"], ("base.embedded.lr", "set twice")),
}


@pytest.mark.parametrize("case", sorted(OVERRIDES))
def test_bad_overrides(box, capsys, case):
    given, expected = OVERRIDES[case]
    check_refused(box, ["run", _write(box, GOOD), "--dry-run", "--results", "res", *given], capsys, expected)


def test_gate_set_twice(box, capsys):
    check_refused(box, ["gate", "--interleave", "HEAD", "--matrix", _write(box, GOOD), "--set", "base.steps=3",
                        "--set", "base.steps=4", "--results", "res"], capsys, ("base.steps", "set twice"))


def test_run_refuses_upper_case_tracking_scheme(box, capsys):
    check_refused(box, ["run", _write(box, GOOD), "--results", "res", "--tracking-uri", "SQLITE:///x.db"], capsys,
                  ("--tracking-uri", "lower case"))


@pytest.mark.parametrize("path", ["/".join(["x" * 200] * 25) + "/m.yaml", "y" * 300 + "/m.yaml"],
                         ids=["path_too_long", "component_too_long"])
def test_matrix_path_too_long(box, capsys, path):
    check_refused(box, ["run", path, "--dry-run", "--results", "res"], capsys, ("matrix", "longer than"))


def test_fractional_half_fraction_of_resolution_iv_exists(box, capsys):
    """2^(4-1) of resolution IV (D = ABC): pyDOE3's search misses it; the harness builds it (and a dry run shows it)."""
    from bench.cli import main
    from bench.spec.design import fractional
    from bench.spec.loading import load_matrix

    text = THREE.replace("  forward_prefetch: [0, 1]", "  forward_prefetch: [0, 1]\n  task_queue: [0, 1]")
    _write(box, text + "design: {type: fractional, resolution: 4}\n")
    m = load_matrix(box / "m.yaml")
    d = fractional(m, m.design)
    assert d.resolution == 4 and len(d.cells) == 8
    assert main(["run", "m.yaml", "--dry-run", "--results", "res"]) == 0
    capsys.readouterr()


def test_resolution_is_checked_on_the_design(box):
    """pyDOE3 answers resolution 5 for 7 factors with a resolution IV design: the harness checks the design."""
    from bench.spec.design import fractional
    from bench.spec.matrix import Matrix

    factors = {k: [0, 1] for k in ("rmsnorm_fused", "dynamic_bsz", "forward_prefetch", "mc2", "mrope_cache",
                                   "graph_mode")} | {"task_queue": [0, 1]}
    m = Matrix(name="t", factors=factors, design={"type": "fractional", "resolution": 5})
    d = fractional(m, m.design)
    assert d.resolution >= 5 and len(d.cells) == 64


def test_sighup_ends_the_sweep_like_sigterm(box):
    """A closed terminal (SIGHUP) ends the harness with one line, exit 129, and the sweep closed as interrupted."""
    text = _base(steps=4, embedded="{update_delay_s: 2.0}").replace("name: t", "name: hup")
    _write(box, text)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    err = open(box / "h.err", "w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "run_bench.py"), "m.yaml", "--results", "res", "--tracking-uri",
                             f"sqlite:///{box / 'mlflow.db'}"], cwd=box, env=env, stdout=subprocess.DEVNULL,
                            stderr=err, start_new_session=True,
                            # a terminal's default (under nohup the harness rightly keeps SIGHUP ignored)
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not list((box / "res").glob("hup/2*/*/r0/run_config.yaml")):  # a run is under way
            assert proc.poll() is None, (box / "h.err").read_text()
            assert time.monotonic() < deadline, "no run started"
            time.sleep(0.2)
        proc.send_signal(signal.SIGHUP)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        err.close()
    lines = (box / "h.err").read_text().strip().splitlines()
    assert rc == 129 and len(lines) == 1 and lines[0].startswith("hangup:"), (rc, lines)
    meta = json.loads(next((box / "res").glob("hup/2*/sweep.json")).read_text())
    assert meta["status"] == "interrupted"


@pytest.mark.parametrize("ver", ['"1"', "true", "0"])
def test_baseline_format_version_not_an_integer_is_named(box, capsys, ver):
    """``format_version: "1"`` was told "'1' is not supported (this harness reads <= 1)"."""
    (box / "baselines").mkdir()
    (box / "baselines" / "main.json").write_text('{"format": "grpo-bench-baseline", "format_version": %s, '
                                                 '"engine": "embedded", "platform": "cpu", "cells": []}' % ver)
    line = check_refused(box, ["baseline", "show", "main", "--results", "."], capsys,
                         ("format_version", "expected an integer", "allowed: 1.."))
    assert "not supported" not in line
