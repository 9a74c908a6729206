"""Bad input to every subcommand: exit 2, exactly one line on stderr, no traceback, nothing written.

Each case builds its inputs in a fresh folder, snapshots every file there (path, size, mtime), runs the
command in-process through :func:`bench.cli.main` (the same error boundary as ``run_bench.py``) and
checks the folder is unchanged: no results, no MLflow store, no log. A few cases go through the real
entry point in a subprocess.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _badinput import GOOD

from bench.cli import main

ROOT = Path(__file__).resolve().parent.parent
SMOKE = (ROOT / "matrix" / "smoke.yaml").read_text()


def _base(**kv: object) -> str:
    """GOOD with ``base`` keys replaced (values written as YAML text)."""
    lines = GOOD.splitlines()
    out = []
    for line in lines:
        key = line.strip().split(":")[0]
        if line.startswith("  ") and key in kv:
            continue
        out.append(line)
        if line == "base:":
            out += [f"  {k}: {v}" for k, v in kv.items()]
    return "\n".join(out) + "\n"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: matrix text (str or bytes) -> expected fragment of the one stderr line
MATRICES: dict[str, tuple[str | bytes, str]] = {
    "malformed_yaml": ("name: t\nfactors:\n  dynamic_bsz: [off, on\n", "malformed YAML"),
    "non_string_key": ("name: t\n1: 2\n", "key 1 is not a string"),
    "non_string_factor_key": ("name: t\nfactors:\n  3: [0, 1]\n", "key 3 is not a string"),
    "duplicate_top_key": ("name: t\nname: u\n", "duplicate key 'name'"),
    "duplicate_base_key": ("name: t\nbase:\n  steps: 3\n  steps: 4\n", "duplicate key 'steps'"),
    "unknown_factor": ("name: t\nfactors:\n  turbo: [0, 1]\n", "unknown factor 'turbo'"),
    "unknown_level": ("name: t\nfactors:\n  task_queue: [0, 3]\n", "unknown level 3"),
    "unknown_design": ("name: t\ndesign: latin\n", "unknown design 'latin'"),
    "unknown_base_key": ("name: t\nbase:\n  stepz: 3\n", "base.stepz: unknown key"),
    "unknown_top_key": ("name: t\nrepeat: 3\n", "repeat: unknown key"),
    "bad_engine": ("name: t\nengine: megatron\n", "engine"),
    "bad_platform": ("name: t\nplatform: tpu\n", "platform"),
    "bad_name": ("name: ../evil\n", "name"),
    "no_name": ("engine: embedded\n", "name"),
    "top_level_list": ("- name: t\n", "must be a mapping"),
    "empty_file": ("", "must be a mapping"),
    "nul_bytes": (b"name: t\n\x00\x01", "binary content"),
    "not_utf8": (b"name: \xff\xfe\n", "not UTF-8"),
    "python_tag": ("name: !!python/object/apply:os.system ['true']\n",
                   "tag !!python/object/apply:os.system is not allowed"),
    "deep_nesting": ("name: t\nx: " + "[" * 5000 + "]" * 5000 + "\n", "YAML"),
    "steps_zero": (_base(steps=0, warmup_steps=0), "base.steps"),
    "steps_huge": (_base(steps=10**9), "base.steps"),
    "steps_string": (_base(steps="abc"), "base.steps"),
    "warmup_ge_steps": (_base(warmup_steps=3), "warmup_steps (3) must be below steps"),
    "profile_step_out_of_range": (_base(profile_steps="[9]"), "profile_steps [9] outside"),
    "negative_batch": (_base(train_batch_size=-1), "base.train_batch_size"),
    "mini_not_dividing_train": (
        _base(train_batch_size=6, ppo_mini_batch_size=4),
        "ppo_mini_batch_size (4) must divide",
    ),
    "micro_not_dividing_mini": (_base(micro_batch_size_per_gpu=3), "micro_batch_size_per_gpu (3) must divide"),
    "world_not_dividing": (_base(n_gpus_per_node=3), "must be a multiple of n_gpus_per_node"),
    "prompt_too_short_for_embedded": (_base(max_prompt_length=4), "max_prompt_length"),
    "ppo_token_len_below_seq": (_base(ppo_max_token_len=20), "ppo_max_token_len (20) must be at least"),
    "log_prob_token_len_below_seq": (
        _base(log_prob_max_token_len=100),
        "log_prob_max_token_len (100) must be at least",
    ),
    "temperature_nan": (_base(temperature=".nan"), "base.temperature"),
    "temperature_zero": (_base(temperature=0), "base.temperature"),
    "timeout_negative": (_base(timeout_s=-5), "base.timeout_s"),
    "timeout_inf": (_base(timeout_s=".inf"), "base.timeout_s"),
    "gpu_mem_above_one": (_base(gpu_memory_utilization=2), "gpu_memory_utilization"),
    "seed_negative": (_base(seed=-1), "base.seed"),
    "n_zero": (_base(n=0), "base.n"),
    "repeats_huge": (GOOD + "repeats: 1000000000000\n", "repeats"),
    "repeats_zero": (GOOD + "repeats: 0\n", "repeats"),
    "embedded_bad_value": (_base(embedded="{lr: fast}"), "lr"),
    "embedded_unknown_key": (_base(embedded="{turbo: 1}"), "base.embedded: unknown key 'turbo'"),
    "unset_env_var": (_base(env="{FOO: '${BENCH_TEST_SURELY_UNSET_VAR}'}"), "BENCH_TEST_SURELY_UNSET_VAR is not set"),
    "env_not_a_string": (_base(env="{FOO: [1, 2]}"), "base.env.FOO"),
    "exclude_unknown_factor": (GOOD + "exclude:\n  - when: {turbo: on}\n", "unknown factor 'turbo'"),
    "explicit_bad_level": ("name: t\ndesign:\n  type: explicit\n  cells:\n    - {dynamic_bsz: 7}\n", "unknown level 7"),
    "fractional_both": (
        "name: t\ndesign:\n  type: fractional\n  resolution: 3\n  generators: a b ab\n",
        "exactly one of resolution or generators",
    ),
    "no_runnable_cell": (
        "name: t\nplatform: cpu\nfactors:\n  dynamic_bsz: [off, on]\nexclude:\n  - when: {dynamic_bsz: on}\n"
        "  - when: {dynamic_bsz: off}\n",
        "no runnable cell",
    ),
    "factor_levels_repeat": ("name: t\nfactors:\n  dynamic_bsz: [on, on]\n", "levels must be distinct"),
    "bad_expect": (GOOD + "expect:\n  - bogus: 1\n", "expect"),
}


@pytest.fixture()
def box(tmp_path, monkeypatch):
    """A fresh working folder; no MLflow variable, no job summary."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.delenv("BENCH_TEST_SURELY_UNSET_VAR", raising=False)
    return tmp_path


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(root) / name
            st = p.lstat()
            out[str(p.relative_to(folder))] = (st.st_size, st.st_mtime_ns)
    return out


def check(box: Path, argv: list[str], capsys, expected: str = "", code: int = 2) -> str:
    """Run ``argv``; assert exit ``code``, one stderr line containing ``expected``, no traceback, nothing written."""
    before = snapshot(box)
    rc = main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == code, err
    assert len(lines) == 1, err
    assert "Traceback" not in out + err
    assert expected in lines[0], lines[0]
    assert snapshot(box) == before, "something was written"
    return lines[0]


@pytest.mark.parametrize("case", sorted(MATRICES))
def test_bad_matrix(box, capsys, case):
    text, expected = MATRICES[case]
    path = box / "m.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    check(box, ["run", "m.yaml", "--results", "res"], capsys, expected)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_cuda_requested_without_cuda(box, capsys):
    (box / "m.yaml").write_text(GOOD.replace("platform: cpu", "platform: cuda"))
    check(box, ["run", "m.yaml", "--results", "res"], capsys, "no cuda device is available")


def _matrix(box: Path) -> str:
    (box / "m.yaml").write_text(GOOD)
    return "m.yaml"


RUN_FLAGS = {
    "unknown_option": (["--bogus"], "unrecognized arguments: --bogus"),
    "tracking_bad_scheme": (["--tracking-uri", "bogus://x"], "unsupported scheme"),
    "tracking_sqlite_two_slashes": (["--tracking-uri", "sqlite://x.db"], "three slashes"),
    "tracking_unreachable_server": (["--tracking-uri", "http://127.0.0.1:{port}"], "tracking server unreachable"),
    "tracking_bad_port": (["--tracking-uri", "http://127.0.0.1:99999"], "bad port"),
}


@pytest.mark.parametrize("case", sorted(RUN_FLAGS))
def test_bad_run_flags(box, capsys, case):
    extra, expected = RUN_FLAGS[case]
    extra = [a.replace("{port}", str(_closed_port())) for a in extra]
    start = time.monotonic()
    check(box, ["run", _matrix(box), "--results", "res", *extra], capsys, expected)
    assert time.monotonic() - start < 30  # refused in seconds, not minutes


def test_tracking_file_that_is_not_a_database(box, capsys):
    (box / "notdb.db").write_text("hello, not sqlite")
    check(box, ["run", _matrix(box), "--results", "res", "--tracking-uri", f"sqlite:///{box}/notdb.db"], capsys,
          "is not a SQLite database")


def test_tracking_sqlite_under_a_file(box, capsys):
    (box / "afile").write_text("x")
    check(box, ["run", _matrix(box), "--results", "res", "--tracking-uri", f"sqlite:///{box}/afile/m.db"], capsys,
          "is not writable")


def test_results_is_a_file(box, capsys):
    (box / "res").write_text("x")
    check(box, ["run", _matrix(box), "--results", "res"], capsys, "folder is not writable")


def test_matrix_is_a_folder(box, capsys):
    (box / "d.yaml").mkdir()
    check(box, ["run", "d.yaml", "--results", "res"], capsys, "is a folder")


def test_missing_matrix(box, capsys):
    check(box, ["run", "nope.yaml", "--results", "res"], capsys, "cannot read matrix")


TUNE = GOOD + """tune:
  cell: {dynamic_bsz: on}
  space:
    ppo_max_token_len_per_gpu: {low: 1, high: 4, unit: seq}
"""

CLI_FLAGS = {
    "tune_n_trials_zero": (["tune", "m.yaml", "--n-trials", "0"], "--n-trials 0: allowed range"),
    "tune_timeout_negative": (["tune", "m.yaml", "--timeout", "-1"], "--timeout -1.0: allowed range"),
    "tune_timeout_nan": (["tune", "m.yaml", "--timeout", "nan"], "must be a finite number"),
    "tune_n_trials_not_int": (["tune", "m.yaml", "--n-trials", "many"], "invalid int value"),
    "gate_threshold_negative": (["gate", "--candidate", "x", "--threshold", "-0.1"], "--threshold"),
    "gate_alpha_too_big": (["gate", "--candidate", "x", "--alpha", "0.9"], "--alpha"),
    "gate_bootstrap_tiny": (["gate", "--candidate", "x", "--bootstrap", "5"], "--bootstrap"),
    "gate_seed_negative": (["gate", "--candidate", "x", "--seed", "-3"], "--seed"),
    "gate_max_mde_inf": (["gate", "--candidate", "x", "--max-mde", "inf"], "finite"),
    "gate_no_candidate": (["gate"], "--candidate"),
    "gate_bad_pairing": (["gate", "--candidate", "x", "--pairing", "maybe"], "--pairing"),
    "report_alpha": (["report", "x", "--alpha", "0.7"], "--alpha"),
    "report_bootstrap_negative": (["report", "x", "--bootstrap", "-1"], "--bootstrap"),
    "report_seed_huge": (["report", "x", "--seed", str(2**40)], "--seed"),
    "baseline_bad_action": (["baseline", "delete"], "invalid choice"),
    "unknown_subcommand_option": (["sync", "--frobnicate"], "unrecognized arguments"),
}


@pytest.mark.parametrize("case", sorted(CLI_FLAGS))
def test_bad_flags(box, capsys, case):
    argv, expected = CLI_FLAGS[case]
    (box / "m.yaml").write_text(TUNE)
    check(box, [*argv, "--results", "res"], capsys, expected)


def test_tune_without_tune_block(box, capsys):
    check(box, ["tune", _matrix(box), "--results", "res"], capsys, "tune")


# -- files the harness reads: sweeps, records, baselines ------------------------------------------------


@pytest.fixture()
def sweep_box(box):
    """A results folder with a real-shaped synthetic sweep ``synth`` (see _sweeps)."""
    from _sweeps import EMBEDDED_CELLS, make_sweep

    make_sweep(box / "res", "synth", EMBEDDED_CELLS[:2], repeats=2, seed=1)
    return box


def _sweep(box: Path) -> Path:
    return (box / "res" / "synth" / "latest").resolve()


def _baseline(box: Path, data: object) -> None:
    d = box / "res" / "baselines"
    d.mkdir(parents=True, exist_ok=True)
    (d / "b.json").write_text(json.dumps(data))


def test_gate_unknown_candidate(sweep_box, capsys):
    check(sweep_box, ["gate", "--candidate", "nope", "--baseline", "b", "--results", "res"], capsys, "no sweep found")


def test_gate_unknown_baseline(sweep_box, capsys):
    check(sweep_box, ["gate", "--candidate", "synth", "--baseline", "nobase", "--results", "res"], capsys, "nobase")


def _valid_header() -> dict:
    from bench.gate.baseline import FORMAT, FORMAT_VERSION

    return {"format": FORMAT, "format_version": FORMAT_VERSION, "engine": "embedded", "platform": "cpu"}


BASELINES = {
    "not_json": ("{{{", "not a baseline file"),
    "json_list": ([1, 2], "not a baseline file"),
    "no_source": ({**_valid_header(), "cells": []}, "source"),
    "cell_without_key": (
        {**_valid_header(), "source": {"sweep": "x"}, "cells": [{"label": "a", "levels": {}, "repeats": []}]},
        "cells.0.key",
    ),
    "repeat_without_samples": (
        {
            **_valid_header(),
            "source": {"sweep": "x"},
            "cells": [{"key": "k", "label": "a", "levels": {}, "repeats": [{"repeat": 0}]}],
        },
        "samples",
    ),
    "future_version": ({**_valid_header(), "format_version": 999, "cells": []}, "not supported"),
}


@pytest.mark.parametrize("case", sorted(BASELINES))
def test_gate_bad_baseline_file(sweep_box, capsys, case):
    data, expected = BASELINES[case]
    if isinstance(data, str):
        (sweep_box / "res" / "baselines").mkdir(parents=True, exist_ok=True)
        (sweep_box / "res" / "baselines" / "b.json").write_text(data)
    else:
        _baseline(sweep_box, data)
    check(sweep_box, ["gate", "--candidate", "synth", "--baseline", "b", "--results", "res"], capsys, expected)


def test_baseline_show_bad_file(sweep_box, capsys):
    _baseline(sweep_box, {**_valid_header(), "source": {"sweep": "x"}, "cells": [{"label": "a"}]})
    check(sweep_box, ["baseline", "show", "b", "--results", "res"], capsys, "not a valid baseline")


def test_baseline_save_without_name(sweep_box, capsys):
    check(sweep_box, ["baseline", "save", "synth", "--results", "res"], capsys, "--name NAME is required")


def test_baseline_save_bad_name(sweep_box, capsys):
    check(sweep_box, ["baseline", "save", "synth", "--name", "../x", "--results", "res"], capsys, "--name")


def test_baseline_save_unknown_sweep(sweep_box, capsys):
    check(sweep_box, ["baseline", "save", "nope", "--name", "x", "--results", "res"], capsys, "no sweep found")


SWEEP_FILES = {
    "sweep_json_garbage": ("sweep.json", b"\x00\xff garbage", "not a sweep record"),
    "sweep_json_list": ("sweep.json", b"[]", "not a sweep record"),
    "sweep_json_no_plan": ("sweep.json", b'{"engine": "embedded"}', "plan.runs missing"),
    "sweep_json_run_without_cell_id": ("sweep.json", b'{"plan": {"runs": [{"label": "a"}]}}', "needs cell_id"),
}


@pytest.mark.parametrize("case", sorted(SWEEP_FILES))
@pytest.mark.parametrize("command", ["report", "sync"])
def test_bad_sweep_file(sweep_box, capsys, case, command):
    name, data, expected = SWEEP_FILES[case]
    (_sweep(sweep_box) / name).write_bytes(data)
    check(sweep_box, [command, "synth", "--results", "res"], capsys, expected)


def test_report_unknown_sweep(sweep_box, capsys):
    check(sweep_box, ["report", "nope", "--results", "res"], capsys, "no sweep found")


def test_sync_unknown_sweep(sweep_box, capsys):
    check(sweep_box, ["sync", "nope", "--results", "res"], capsys, "no sweep found")


def test_record_without_cell_id_is_not_a_record(sweep_box, capsys):
    """A ``record.json`` without ``cell_id`` is left out, so the sweep lacks runs: the baseline refuses it."""
    rec = next(_sweep(sweep_box).glob("*/r0/record.json"))
    data = json.loads(rec.read_text())
    del data["cell_id"]
    rec.write_text(json.dumps(data))
    check(sweep_box, ["baseline", "save", "synth", "--name", "x", "--results", "res"], capsys, "")


# -- through the real entry point ------------------------------------------------------------------------


def _bench(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, str(ROOT / "run_bench.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_entry_point_bad_input_is_one_line_and_no_late_fork_server_traceback(tmp_path):
    """An early error after the fork server could start: one line, and nothing printed after exit."""
    (tmp_path / "m.yaml").write_text(SMOKE)
    p = _bench(["m.yaml", "--results", "res", "--tracking-uri", "bogus://x"], tmp_path)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "Traceback" not in p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["m.yaml"]


def test_unexpected_error_is_one_line_with_a_traceback_log(tmp_path, monkeypatch, capsys):
    """A bug (here: a failing import of a subcommand's helper) -> exit 1, one line naming the step and a log."""
    import bench.commands.run as cli_run

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.yaml").write_text(GOOD)

    def boom(*a, **k):
        raise ZeroDivisionError("synthetic bug")

    monkeypatch.setattr(cli_run, "make_plan", boom)
    rc = main(["run", "m.yaml", "--results", "res"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1, err
    assert "unexpected ZeroDivisionError: synthetic bug while" in lines[0]
    log = Path(lines[0].rsplit("full traceback in ", 1)[1])
    assert log.is_file() and log.parent == Path("res/logs")
    assert "Traceback" in log.read_text() and "synthetic bug" in log.read_text()
