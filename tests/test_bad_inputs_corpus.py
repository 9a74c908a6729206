"""Hand-written bad inputs, one group per class of issue 21, each checked for the whole promise
(:func:`_badinput.check_refused`: exit 2, one stderr line naming file/key, no traceback, nothing written,
no process left, a time cap). Property-based cases: ``test_bad_inputs_hypothesis.py``; signals, pipes and
stores through the real entry point: ``test_bad_inputs_io.py``.
"""
# ruff: noqa: F811 - the fixtures box and sweep_box come from _badinput; tests take them as parameters

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from _badinput import GOOD, box, check_refused, edit_json, give_specs, sweep_box  # noqa: F401 - fixtures
from _badinput import base as _base

ROOT = Path(__file__).resolve().parent.parent


TUNE = """tune:
  fixed: {dynamic_bsz: on}
  space:
    ppo_max_token_len_per_gpu: {low: 1, high: 4, unit: seq}
"""




# -- accepted although wrong: the matrix ---------------------------------------------------------------------

LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))

MATRICES: dict[str, tuple[str | bytes, str | tuple[str, ...]]] = {
    # misspelled keys inside a factor's spec
    "factor_spec_misspelled": (GOOD.replace("dynamic_bsz: [off, on]", "dynamic_bsz: {levles: [0, 1]}"),
                               ("factors", "levles", "did you mean 'levels'")),
    "factor_spec_extra": (GOOD.replace("dynamic_bsz: [off, on]", "dynamic_bsz: {levels: [0, 1], weight: 2}"),
                          ("weight", "allowed: levels")),
    "factor_name_near_miss": (GOOD.replace("dynamic_bsz: [off, on]", "dynamic_bzs: [off, on]"),
                              ("dynamic_bzs", "did you mean 'dynamic_bsz'")),
    "base_key_near_miss": (_base(stpes=3), ("base.stpes", "did you mean 'steps'")),
    "top_key_near_miss": (GOOD + "repeets: 2\n", ("repeets", "did you mean 'repeats'")),
    "design_key_near_miss": (GOOD + "design: {type: one_at_a_time, referense: baseline}\n",
                             ("referense", "did you mean 'reference'")),
    "engine_near_miss": (GOOD.replace("engine: embedded", "engine: embeded"), ("engine", "did you mean 'embedded'")),
    # booleans taken as integers (and other wrong types)
    "steps_bool": (_base(steps="true"), ("base.steps", "expected an integer, got a boolean")),
    "n_bool": (_base(n="yes"), "base.n"),
    "seed_bool": (_base(seed="false"), "base.seed"),
    "repeats_bool": (GOOD + "repeats: true\n", "repeats"),
    "steps_float": (_base(steps=3.5), ("base.steps", "expected an integer")),
    "steps_string": (_base(steps="'3'"), ("base.steps", "expected an integer, got a string")),
    "temperature_bool": (_base(temperature="true"), "base.temperature"),
    "profile_step_bool": (_base(profile_steps="[true]"), "base.profile_steps"),
    "use_kl_loss_int": (_base(use_kl_loss=1), "base.use_kl_loss"),
    # step plans
    "profile_every_measured_step": (_base(profile_steps="[2, 3]"), ("profile_steps", "no timed step")),
    "profile_step_repeated": (_base(steps=5, profile_steps="[4, 4]"), ("profile_steps", "listed twice")),
    "profile_step_beyond": (_base(profile_steps="[9]"), ("profile_steps", "outside")),
    "warmup_eats_all": (_base(warmup_steps=3), "warmup_steps"),
    # engine sub-block
    "embedded_lr_nan": (_base(embedded="{lr: .nan}"), ("base.embedded.lr", "finite")),
    "embedded_lr_inf": (_base(embedded="{lr: .inf}"), "base.embedded.lr"),
    "embedded_clip_negative": (_base(embedded="{clip_ratio: -0.2}"), ("base.embedded.clip_ratio", "greater than 0")),
    "embedded_clip_above_one": (_base(embedded="{clip_ratio: 1.5}"), "base.embedded.clip_ratio"),
    "embedded_kl_type": (_base(embedded="{kl_loss_type: fancy}"), ("base.embedded.kl_loss_type", "low_var_kl")),
    "embedded_steps_contradict": (_base(embedded="{steps: 9}"), ("base.embedded.steps", "contradicts base.steps")),
    "embedded_warmup_contradict": (_base(embedded="{warmup_steps: 0}"), "base.embedded.warmup_steps"),
    "embedded_device": (_base(embedded="{device: cuda}"), ("base.embedded.device", "platform")),
    "embedded_delay_negative": (_base(embedded="{update_delay_s: -1}"), "base.embedded.update_delay_s"),
    "embedded_kl_coef_nan": (_base(embedded="{kl_loss_coef: .nan}"), "base.embedded.kl_loss_coef"),
    "embedded_bool_as_int": (_base(embedded="{rmsnorm_fused: 1}"), "base.embedded.rmsnorm_fused"),
    "embedded_near_miss": (_base(embedded="{clip_ration: 0.2}"), ("clip_ration", "did you mean 'clip_ratio'")),
    "embedded_not_mapping": (_base(embedded="[1, 2]"), ("base.embedded", "expected a mapping")),
    "embedded_model_missing": (_base(embedded="{model: /surely/not/here}"), ("base.embedded.model", "does not exist")),
    # models and data that do not exist
    "model_path_missing": (_base(model="/surely/not/a/model"), ("base.model", "does not exist")),
    "model_builtin_unknown": (_base(model="'builtin:qwen3vl-huge'"), ("base.model", "builtin:qwen3vl-tiny")),
    "data_builtin_unknown": (_base(data="'builtin:shape'"), ("base.data", "did you mean 'builtin:shapes'")),
    "model_not_a_checkpoint": (_base(model="/tmp"), ("base.model", "no config.json")),
    # exclusion rules on factors the matrix does not list
    "exclude_unlisted_factor": (GOOD + "exclude:\n  - when: {task_queue: on}\n", ("exclude[0].when.task_queue",
                                                                                 "does not list")),
    "exclude_level_not_in_matrix": (GOOD.replace("[off, on]", "[off]") + "exclude:\n  - when: {dynamic_bsz: on}\n",
                                    ("exclude[0].when.dynamic_bsz", "not among")),
    # names that collide with the harness's own folders, or are too long
    "name_logs": (GOOD.replace("name: t", "name: logs"), ("name", "collides")),
    "name_baselines": (GOOD.replace("name: t", "name: baselines"), ("name", "collides")),
    "name_mlflow_db": (GOOD.replace("name: t", "name: mlflow.db"), ("name", "collides")),
    "name_smoke_suffix": (GOOD.replace("name: t", "name: t-smoke"), ("name", "collides")),
    "name_too_long": (GOOD.replace("name: t", "name: " + "n" * 300), ("name", "at most 100")),
    # ${VAR} unset outside the launch-expanded keys
    "env_var_in_description": (GOOD + "description: '${BENCH_TEST_SURELY_UNSET_VAR}'\n",
                               ("description", "BENCH_TEST_SURELY_UNSET_VAR")),
    "env_var_in_tune": (GOOD + TUNE.replace("fixed:", "study: '${BENCH_TEST_SURELY_UNSET_VAR}'\n  fixed:"),
                        "BENCH_TEST_SURELY_UNSET_VAR"),
    # messages in our words
    "design_without_type": (GOOD + "design: {reference: baseline}\n", ("design", "missing 'type'")),
    "design_type_near_miss": (GOOD + "design: fractionl\n", ("unknown design 'fractionl'", "did you mean")),
    "base_not_mapping": ("name: t\nbase: 5\n", ("base", "expected a mapping, got an integer")),
    "design_not_mapping": ("name: t\ndesign: [full]\n", "design"),
    "factors_not_mapping": ("name: t\nfactors: 5\n", ("factors", "mapping")),
    "exclude_not_list": (GOOD + "exclude: {when: {}}\n", ("exclude", "expected a list")),
    "huge_integer": (_base(steps=10**40), ("base.steps", "less than or equal")),
    "generators_invalid": (
        "name: t\nplatform: cpu\nfactors: {rmsnorm_fused: [0, 1], dynamic_bsz: [0, 1], task_queue: [0, 1]}\n"
        "design: {type: fractional, generators: 'a b xy'}\n", ("design.generators", "base factors")),
    "generators_count": (
        "name: t\nplatform: cpu\nfactors: {rmsnorm_fused: [0, 1], dynamic_bsz: [0, 1], task_queue: [0, 1]}\n"
        "design: {type: fractional, generators: 'a b'}\n", ("design.generators", "one word per factor")),
    "generators_symbols": (
        "name: t\nplatform: cpu\nfactors: {rmsnorm_fused: [0, 1], dynamic_bsz: [0, 1], task_queue: [0, 1]}\n"
        "design: {type: fractional, generators: 'a b a*b'}\n", ("design.generators", "letters")),
    "resolution_impossible": (
        "name: t\nplatform: cpu\nfactors: {rmsnorm_fused: [0, 1], dynamic_bsz: [0, 1], task_queue: [0, 1]}\n"
        "design: {type: fractional, resolution: 8}\n", "design.resolution"),
    # tune block: bounds, sampler
    "tune_bound_inf": (GOOD + TUNE.replace("high: 4", "high: .inf"), ("tune.space", "high")),
    "tune_bound_nan": (GOOD + TUNE.replace("low: 1", "low: .nan"), ("tune.space", "low")),
    "tune_sampler_seed_negative": (GOOD + TUNE + "  sampler: {type: tpe, seed: -1}\n", "tune.sampler.seed"),
    "tune_sampler_seed_huge": (GOOD + TUNE + f"  sampler: {{type: tpe, seed: {2**70}}}\n", "tune.sampler.seed"),
    "tune_sampler_type": (GOOD + TUNE + "  sampler: {type: cmaes}\n", ("tune.sampler.type", "'tpe'")),
    "tune_n_trials_bool": (GOOD + TUNE + "  n_trials: true\n", "tune.n_trials"),
    "tune_param_near_miss": (GOOD + TUNE.replace("ppo_max_token_len_per_gpu:", "ppo_max_token_len_per_gp:"),
                             "did you mean 'ppo_max_token_len_per_gpu'"),
    # inputs that explode
    "billion_laughs": (LAUGHS + "name: t\n", ("YAML refused", "expands to more than")),
    "laughs_in_tune": (GOOD + "tune:\n  fixed: {}\n  x: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"  {c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi")), "expands to more"),
    "deep_nesting": ("name: t\nx: " + "[" * 200 + "]" * 200 + "\n", ("YAML refused", "nested deeper")),
    "deep_mapping": ("name: t\nx: " + "{a: " * 100 + "1" + "}" * 100 + "\n", "nested deeper"),
    "too_large": ("name: t\n" + "# pad\n" * 200_000, "larger than 1 MiB"),
    "binary": (b"name: t\n\x00\x01", "binary content"),
    "not_utf8": (b"name: t\ndescription: \xff\xfe\n", "not UTF-8"),
}


def _write(box: Path, text: str | bytes) -> str:
    if isinstance(text, bytes):
        (box / "m.yaml").write_bytes(text)
    else:
        (box / "m.yaml").write_text(text)
    return "m.yaml"


@pytest.mark.parametrize("case", sorted(MATRICES))
@pytest.mark.parametrize("mode", ["dry-run", "run"])
def test_bad_matrix(box, capsys, case, mode):
    text, expected = MATRICES[case]
    argv = ["run", _write(box, text), "--results", "res"] + (["--dry-run"] if mode == "dry-run" else [])
    line = check_refused(box, argv, capsys, expected)
    assert "m.yaml" in line


def test_env_var_in_model_refused_by_a_real_run(box, capsys):
    """Unset ``${VAR}`` in ``base.model`` on the embedded engine: a dry run shows it, a run refuses it."""
    _write(box, _base(model="'${BENCH_TEST_SURELY_UNSET_VAR}/m'"))
    check_refused(box, ["run", "m.yaml", "--results", "res"], capsys, ("base", "BENCH_TEST_SURELY_UNSET_VAR"))


def test_env_var_in_overrides_refused_on_the_embedded_engine(box, capsys):
    _write(box, _base(overrides="['x=${BENCH_TEST_SURELY_UNSET_VAR}']"))
    check_refused(box, ["run", "m.yaml", "--results", "res"], capsys, ("overrides", "BENCH_TEST_SURELY_UNSET_VAR"))


def test_bad_override_bool(box, capsys):
    _write(box, GOOD)
    check_refused(box, ["run", "m.yaml", "base.steps=true", "--dry-run", "--results", "res"], capsys,
                  ("override base.steps=true", "expected an integer"))


def test_tune_block_checked_by_run_too(box, capsys):
    """One validation pass: a bad tune block is refused by ``run`` as by ``tune``."""
    _write(box, GOOD + TUNE.replace("high: 4", "high: -1"))
    check_refused(box, ["run", "m.yaml", "--dry-run", "--results", "res"], capsys, "tune.space")


# -- special files, paths, flags ------------------------------------------------------------------------------

def test_matrix_is_a_pipe(box, capsys):
    os.mkfifo(box / "m.yaml")
    check_refused(box, ["run", "m.yaml", "--results", "res"], capsys, ("m.yaml", "is a pipe"), cap_s=5)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null", "/dev/urandom"])
def test_matrix_is_a_device(box, capsys, device):
    check_refused(box, ["run", device, "--results", "res"], capsys, (device, "is a device"), cap_s=5)


def test_matrix_dangling_link(box, capsys):
    os.symlink(box / "gone.yaml", box / "m.yaml")
    check_refused(box, ["run", "m.yaml", "--results", "res"], capsys, ("m.yaml", "does not exist"))


def _good(box: Path) -> str:
    return _write(box, GOOD)


PATHS = {
    "results_component_too_long": (["--results", "r" * 300], ("--results", "longer than 255")),
    "results_under_proc": (["--results", "/proc/bench-results"], ("--results", "kernel file system")),
    "results_under_sys": (["--results", "/sys/bench-results"], ("--results", "kernel file system")),
    "results_is_device": (["--results", "/dev/null"], ("--results", "kernel file system")),
    "results_dangling_link": (["--results", "dangling"], ("--results", "does not exist")),
    "results_under_a_file": (["--results", "afile/res"], ("--results", "is a file")),
    "tracking_in_memory": (["--tracking-uri", "sqlite:///:memory:"], ("--tracking-uri", "in-memory")),
    "tracking_sqlite_no_path": (["--tracking-uri", "sqlite://"], ("--tracking-uri", "in-memory")),
    "tracking_memory_mode": (["--tracking-uri", "sqlite:///file:x?mode=memory&uri=true"], "in-memory"),
    "tracking_bad_scheme": (["--tracking-uri", "ftp://host/x"], ("--tracking-uri", "unsupported scheme")),
    "tracking_empty": (["--tracking-uri", ""], "--tracking-uri"),
    "tracking_db_is_device": (["--tracking-uri", "sqlite:////dev/null"], ("--tracking-uri", "not a file")),
    "tracking_db_name_too_long": (["--tracking-uri", "sqlite:///" + "d" * 300 + ".db"], "longer than 255"),
    "order_seed_negative": (["--order-seed", "-1"], ("--order-seed", "allowed range")),
    "order_seed_huge": (["--order-seed", str(2**70)], "--order-seed"),
    "order_seed_text": (["--order-seed", "x"], ("--order-seed", "invalid int")),
    "order_unknown": (["--order", "random"], ("--order", "invalid choice")),
    "smoke_steps_zero": (["--smoke-steps", "0"], "--smoke-steps"),
    "cells_empty": (["--cells", ","], ("--cells", "empty pattern")),
    "cells_no_match": (["--cells", "zzz"], ("--cells", "matches no cell")),
}


@pytest.mark.parametrize("case", sorted(PATHS))
@pytest.mark.parametrize("mode", ["dry-run", "run"])
def test_bad_run_paths_and_flags(box, capsys, case, mode, monkeypatch):
    extra, expected = PATHS[case]
    (box / "afile").write_text("x")
    os.symlink(box / "nowhere", box / "dangling")
    argv = ["run", _good(box), *extra] + (["--results", "res"] if "--results" not in extra else [])
    check_refused(box, argv + (["--dry-run"] if mode == "dry-run" else []), capsys, expected)


def test_env_tracking_uri_in_memory(box, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///:memory:")
    check_refused(box, ["run", _good(box), "--results", "res"], capsys, "in-memory")


def test_unwritable_results_folder(box, capsys):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere; the read-only and kernel-folder cases cover it")
    (box / "ro").mkdir()
    (box / "ro").chmod(stat.S_IRUSR | stat.S_IXUSR)
    check_refused(box, ["run", _good(box), "--results", "ro/res"], capsys, "not writable")


def test_option_before_the_matrix_is_not_a_subcommand(box, capsys):
    """``run_bench.py --results DIR m.yaml`` is ``run m.yaml --results DIR``; options before a subcommand too."""
    from bench.cli import main

    _write(box, GOOD.replace("name: t", "name: logs"))
    check_refused(box, ["--results", "res", "m.yaml", "--dry-run"], capsys, ("m.yaml", "name"))
    check_refused(box, ["--results", "res", "report", "nope"], capsys, "no sweep found")
    _write(box, GOOD)
    assert main(["--results", "res", "m.yaml", "--dry-run"]) == 0
    capsys.readouterr()


TUNE_FLAGS = {
    "storage_in_memory": (["--storage", "sqlite:///:memory:"], ("--storage", "in-memory")),
    "storage_no_path": (["--storage", "sqlite://"], "in-memory"),
    "tracking_bad_scheme": (["--tracking-uri", "bogus://x"], "unsupported scheme"),
    "tracking_in_memory": (["--tracking-uri", "sqlite:///:memory:"], "in-memory"),
    "n_trials_huge": (["--n-trials", str(10**30)], "--n-trials"),
    "timeout_inf": (["--timeout", "inf"], ("--timeout", "finite")),
    "study_bad": (["--study", "../x"], "--study"),
    "results_dangling": (["--results", "dangling"], "does not exist"),
}


@pytest.mark.parametrize("case", sorted(TUNE_FLAGS))
def test_bad_tune_flags(box, capsys, case):
    """Refused before ``optuna.db`` or the MLflow store exists."""
    extra, expected = TUNE_FLAGS[case]
    os.symlink(box / "nowhere", box / "dangling")
    _write(box, GOOD + TUNE + "  n_trials: 2\n")
    argv = ["tune", "m.yaml", *extra] + (["--results", "res"] if "--results" not in extra else [])
    check_refused(box, argv, capsys, expected)
    assert not (box / "res").exists()


# -- corrupt or odd results files -------------------------------------------------------------------------------



def _record(box: Path) -> Path:
    return next((box / "res" / "synth" / "latest").resolve().glob("*/r0/record.json"))




RECORDS = {
    "truncated": (lambda p: p.write_text(p.read_text()[: len(p.read_text()) // 2]), "truncated"),
    "empty": (lambda p: p.write_text(""), "empty file"),
    "a_list": (lambda p: p.write_text("[1, 2]"), "expected a JSON object"),
    "repeat_string": (lambda p: edit_json(p, lambda d: d.update(repeat="0")), "repeat"),
    "repeat_bool": (lambda p: edit_json(p, lambda d: d.update(repeat=False)), "repeat"),
    "status_unknown": (lambda p: edit_json(p, lambda d: d.update(status="done")), "status"),
    "no_cell_id": (lambda p: edit_json(p, lambda d: d.pop("cell_id")), "cell_id"),
    "wrong_folder": (lambda p: edit_json(p, lambda d: d.update(repeat=7)), "does not match its folder"),
    "summary_list": (lambda p: edit_json(p, lambda d: d.update(summary=[1])), "summary"),
    "steps_string": (lambda p: edit_json(p, lambda d: d.update(steps="x")), "steps"),
    "median_nan": (lambda p: p.write_text(p.read_text().replace('"step_time_median_s": ',
                                                                '"step_time_median_s": NaN, "x_": ')),
                   "step_time_median_s"),
    "median_zero": (lambda p: edit_json(p, lambda d: d["summary"].update(step_time_median_s=0.0)),
                    "step_time_median_s"),
    "sample_infinite": (lambda p: edit_json(p, lambda d: d["summary"].update(step_time_samples_s=[1.0, float("inf")])),
                        "step_time_samples_s"),
    "sample_negative": (lambda p: edit_json(p, lambda d: d["summary"].update(step_time_samples_s=[-1.0])), "negative"),
    "step_time_nan": (lambda p: edit_json(p, lambda d: next(iter(d["steps"].values())).update(
        {"timing_s/step": float("nan")})), "timing_s/step"),
    "timed_steps_strings": (lambda p: edit_json(p, lambda d: d["summary"].update(timed_steps=["2"])), "timed_steps"),
    "is_a_pipe": (lambda p: (p.unlink(), os.mkfifo(p)), "is a pipe"),
    "is_a_folder": (lambda p: (p.unlink(), p.mkdir()), "is a folder"),
    "binary": (lambda p: p.write_bytes(b"\x00\xff\xfe"), "not a usable run record"),
}
COMMANDS = {
    "report": ["report", "synth"],
    "gate": ["gate", "--candidate", "synth", "--baseline", "synth"],
    "compare": ["compare", "synth", "synth"],
    "baseline_save": ["baseline", "save", "synth", "--name", "b1"],
    "sync": ["sync", "synth"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("case", sorted(RECORDS))
def test_corrupt_record_is_named(sweep_box, capsys, case, command):
    rec = _record(sweep_box)
    RECORDS[case][0](rec)
    line = check_refused(sweep_box, [*COMMANDS[command], "--results", "res"], capsys,
                         ("record.json", RECORDS[case][1]))
    assert str(rec.parent.parent.name) in line


def test_bad_queue_file_is_kept_aside_and_named(sweep_box, capsys):
    """An unreadable ``mlflow_queue.json`` is renamed beside itself and named; the sweep still syncs."""
    from bench.cli import main
    from bench.tracking.upload_queue import QUEUE

    sweep = (sweep_box / "res" / "synth" / "latest").resolve()
    give_specs(sweep)
    (sweep / QUEUE).write_text("{not json")
    rc = main(["sync", "--results", "res", "--tracking-uri", f"sqlite:///{sweep_box}/res/mlflow.db"])
    out, err = capsys.readouterr()
    aside = list(sweep.glob(f"{QUEUE}.bad-*"))
    assert len(aside) == 1 and aside[0].read_text() == "{not json"
    assert "unusable MLflow queue file" in err and aside[0].name in err and "Traceback" not in out + err
    assert rc == 0 and "in sync" in out
    assert len(list(sweep.glob("*/r*/mlflow.json"))) == 4  # every run uploaded


@pytest.mark.parametrize("case", ["truncated", "median_nan", "sample_infinite", "wrong_folder", "is_a_pipe"])
def test_resume_does_not_count_an_unusable_record_as_finished(sweep_box, case):
    """A resumed sweep runs such a repeat again and names it (``corrupt_records`` feeds its warning)."""
    from bench.records.record import is_finished
    from bench.records.run_record import corrupt_records

    rec = _record(sweep_box)
    assert is_finished(rec.parent)
    RECORDS[case][0](rec)
    assert not is_finished(rec.parent)
    problems = corrupt_records(rec.parent.parent.parent)
    assert len(problems) == 1 and str(rec) in problems[0] and RECORDS[case][1] in problems[0]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_in_memory_store_refused_by_every_subcommand(sweep_box, capsys, command):
    check_refused(sweep_box, [*COMMANDS[command], "--results", "res", "--tracking-uri", "sqlite:///:memory:"], capsys,
                  ("--tracking-uri", "in-memory"))
