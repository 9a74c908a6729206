"""Bad inputs found by a hostile review after issue 21 was reopened: cases the first corpus missed, one group per
class of the issue, each checked for the whole promise (:func:`_badinput.check_refused`: exit 2, one stderr line
naming file/key, no traceback, no library wording, nothing written, no process left, a time cap). Also the gaps the
first pass left: data paths checked before the sweep, the default step plan leaving a timed step, exclusion rules
on a single-level factor, ``sync`` uploading the good records of a sweep that has a bad one, a tracking store that
answers but keeps nothing.
"""
# ruff: noqa: F811 - the fixtures box and sweep_box come from _badinput; tests take them as parameters

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest
from _badinput import GOOD, box, check_refused, edit_json, give_specs, sweep_box  # noqa: F401 - fixtures
from _badinput import base as _base


def _write(box: Path, text: str, name: str = "m.yaml") -> str:
    (box / name).write_text(text)
    return name


TWO = GOOD.replace("  dynamic_bsz: [off, on]", "  dynamic_bsz: [off, on]\n  rmsnorm_fused: [on]")
TUNE = "tune:\n  space:\n    ppo_max_token_len_per_gpu: {low: 1, high: 4, unit: seq}\n"

MATRICES: dict[str, tuple[str, str | tuple[str, ...]]] = {
    # accepted although wrong: names colliding with the stores' sidecar files
    "name_mlflow_wal": (GOOD.replace("name: t", "name: mlflow.db-wal"), ("name", "collides")),
    "name_optuna_journal": (GOOD.replace("name: t", "name: optuna.db-journal"), ("name", "collides")),
    "name_mlflow_lock": (GOOD.replace("name: t", "name: mlflow.db.lock"), ("name", "collides")),
    # YAML that means something else than it says
    "base60_integer": (_base(steps="1:30"), ("base-60", "quote it")),
    "binary_name": (GOOD.replace("name: t", "name: !!binary aGVsbG8="), "!!binary"),
    "python_name_tag": (GOOD + "description: !!python/name:os.system\n",
                        ("tag !!python/name:os.system is not allowed", "no tags")),
    "custom_tag": (GOOD + "description: !env HOME\n", "tag !env is not allowed"),
    # env and overrides that could never launch
    "env_key_with_equals": (_base(env="{'A=B': x}"), ("base.env", "not a variable name")),
    "env_key_empty": (_base(env="{'': x}"), ("base.env", "not a variable name")),
    "env_key_space": (_base(env="{'A B': x}"), ("base.env", "not a variable name")),
    "env_value_nul": (_base(env='{A: "x\\0y"}'), ("base.env", "NUL")),
    "override_without_equals": (_base(overrides="['junk']"), ("base.overrides", "not a Hydra override")),
    "override_empty_key": (_base(overrides="['=1']"), ("base.overrides", "KEY=VALUE")),
    # every name or path the run will use, checked before the sweep
    "data_missing": (_base(data="/surely/not/data.parquet"), ("base.data", "does not exist")),
    "data_is_a_folder": (_base(data="/tmp"), ("base.data", "not a file")),
    "data_empty": (_base(data="''"), ("base.data", "empty")),
    "model_empty": (_base(model="''"), ("base.model", "empty")),
    "model_component_too_long": (_base(model="'/tmp/" + "x" * 300 + "'"), ("base.model", "longer than 255")),
    "embedded_data_missing": (_base(embedded="{data: /surely/not/d.parquet}"),
                              ("base.embedded.data", "does not exist")),
    "val_data_on_embedded": (_base(val_data="/surely/not/val.parquet"), ("base.val_data", "no validation set")),
    # exclusion rules and explicit cells on what the matrix does not vary
    "exclude_single_level": (TWO + "exclude:\n  - when: {rmsnorm_fused: on, dynamic_bsz: on}\n",
                             ("exclude[0].when.rmsnorm_fused", "single level")),
    "explicit_cell_unlisted_factor": (GOOD + "design: {type: explicit, cells: [{task_queue: 1}]}\n",
                                      ("design.cells[0].task_queue", "list it under factors")),
    # messages in our words (no pydantic wording), with the allowed keys and "did you mean"
    "explicit_cells_empty": (GOOD + "design: {type: explicit, cells: []}\n", ("design.cells", "at least 1 item")),
    "tune_space_empty": (GOOD + "tune:\n  space: {}\n", ("tune.space", "at least 1 item")),
    "embedded_lr_zero": (_base(embedded="{lr: 0}"), ("base.embedded.lr", "must be greater than 0")),
    "embedded_lr_text": (_base(embedded="{lr: fast}"), ("base.embedded.lr", "expected a number")),
    "tune_key_misspelled": (GOOD + "tune:\n  spaec: {}\n", ("tune.spaec", "did you mean 'space'")),
    "tune_param_key_misspelled": (GOOD + TUNE.replace("high: 4", "hgh: 4"), ("hgh", "did you mean 'high'")),
    "tune_unknown_key_lists_allowed": (GOOD + "tune:\n  direction: up\n" + TUNE[len("tune:\n"):],
                                       ("tune.direction", "allowed:")),
    "expect_unknown_key_lists_allowed": (GOOD + "expect:\n  - {factor: dynamic_bsz, effct: faster}\n",
                                         ("expect.0.effct", "allowed:")),
    # inputs that explode: a flat list past the node cap is refused early (bounded time)
    "wide_flat_list": ("name: t\nx: [" + ", ".join(["1"] * 30000) + "]\n", "expands to more than"),
}


@pytest.mark.parametrize("case", sorted(MATRICES))
@pytest.mark.parametrize("mode", ["dry-run", "run"])
def test_bad_matrix(box, capsys, case, mode):
    text, expected = MATRICES[case]
    argv = ["run", _write(box, text), "--results", "res"] + (["--dry-run"] if mode == "dry-run" else [])
    check_refused(box, argv, capsys, expected)


def test_relative_data_path_is_resolved_against_the_current_folder(box, capsys):
    """A run starts in its own run folder: ``data: d.parquet`` is the user's file, given to the run absolute."""
    from bench.cli import main

    (box / "d.parquet").write_text("x")
    _write(box, _base(data="d.parquet"))
    assert main(["run", "m.yaml", "--dry-run", "--json", "--results", "res"]) == 0
    doc = json.loads(capsys.readouterr().out)
    configs = [r["launch"]["config"] for r in doc["runs"]]
    assert {c["data"] for c in configs} == {str(box / "d.parquet")}


def test_default_step_plan_leaves_a_timed_step(box, capsys):
    """``profile_steps`` unset with one measured step: that step is timed, not profiled (nothing profiled);
    with two or more measured steps the last one is profiled as before."""
    from bench.cli import main

    for steps, profiled in ((2, []), (3, [3])):
        _write(box, _base(steps=steps, warmup_steps=1))
        assert main(["run", "m.yaml", "--dry-run", "--json", "--results", "res"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert {tuple(r["launch"]["config"]["profile_steps"]) for r in doc["runs"]} == {tuple(profiled)}


# -- flags, paths and URIs ---------------------------------------------------------------------------------------

FLAGS = {
    "ray_address_empty": (["--ray-address", ""], ("--ray-address", "empty")),
    "budget_zero": (["--budget", "0s"], ("--budget", "allowed range")),
    "budget_huge": (["--budget", "99999999999999999999h"], ("--budget", "allowed range")),
    "json_without_dry_run": (["--json"], ("--json", "only with --dry-run")),
    "verbose_without_dry_run": (["--verbose"], ("--verbose", "only with --dry-run")),
    "tracking_file_store": (["--tracking-uri", "file:///tmp/mlruns"], ("--tracking-uri", "no file store")),
    "tracking_bare_folder": (["--tracking-uri", "/tmp/mlruns"], ("--tracking-uri", "sqlite:///PATH")),
    "results_is_a_file": (["--results", "afile"], ("--results", "not a folder")),
}


@pytest.mark.parametrize("case", sorted(FLAGS))
def test_bad_run_flags(box, capsys, case):
    extra, expected = FLAGS[case]
    (box / "afile").write_text("x")
    argv = ["run", _write(box, GOOD), *extra] + (["--results", "res"] if "--results" not in extra else [])
    check_refused(box, argv, capsys, expected)


def test_missing_database_driver_is_refused_before_the_lock(box, capsys):
    import importlib.util

    if any(importlib.util.find_spec(m) for m in ("psycopg2", "psycopg", "pg8000")):
        pytest.skip("a PostgreSQL driver is installed here")
    check_refused(box, ["run", _write(box, GOOD), "--results", "res", "--tracking-uri",
                        "postgresql://u@127.0.0.1:9/db"], capsys, ("--tracking-uri", "no postgresql driver"))


def test_matrix_file_near_miss(box, capsys):
    _write(box, GOOD)
    check_refused(box, ["run", "m.yml", "--results", "res"], capsys, ("m.yml", "did you mean 'm.yaml'"))


def test_latest_that_is_not_a_link(box, capsys):
    _write(box, GOOD)
    (box / "res" / "t").mkdir(parents=True)
    (box / "res" / "t" / "latest").write_text("x")
    check_refused(box, ["run", "m.yaml", "--results", "res"], capsys, ("latest", "not the 'latest' link"))


def test_gate_interleave_checks_its_results_folder(box, capsys):
    _write(box, GOOD)
    check_refused(box, ["gate", "--interleave", "HEAD", "--matrix", "m.yaml", "--results", "/proc/bench-x"], capsys,
                  ("--results", "kernel file system"))


# -- the results files and the commands that read them --------------------------------------------------------------



def _sweep(box: Path) -> Path:
    return (box / "res" / "synth" / "latest").resolve()


def _record(box: Path) -> Path:
    return sorted(_sweep(box).glob("*/r0/record.json"))[0]




RECORDS = {
    "step_key_text": (lambda d: d.update(steps={"a": {"timing_s/step": 1.0}}), "not a step number"),
    "step_key_negative": (lambda d: d.update(steps={"-1": {"timing_s/step": 1.0}}), "not a step number"),
    "free_ratio_above_one": (lambda d: d.update(free_ratio={"6": 2.5}), "not a fraction"),
    "rollout_share_above_one": (lambda d: d["summary"].update(rollout_share_median=5.0), "not a fraction"),
}
READERS = {
    "report": ["report", "synth"],
    "gate": ["gate", "--candidate", "synth", "--baseline", "synth"],
    "compare": ["compare", "synth", "synth"],
    "baseline_save": ["baseline", "save", "synth", "--name", "b1"],
}


@pytest.mark.parametrize("command", sorted(READERS))
@pytest.mark.parametrize("case", sorted(RECORDS))
def test_wrong_record_is_named(sweep_box, capsys, case, command):
    rec = _record(sweep_box)
    edit_json(rec, RECORDS[case][0])
    check_refused(sweep_box, [*READERS[command], "--results", "res"], capsys, ("record.json", RECORDS[case][1]))


SWEEPS = {
    "repeats_nan": (lambda d: d["plan"].update(repeats=float("nan")), "plan.repeats"),
    "stopped_after_text": (lambda d: d.update(sequential={"stopped_after": "2"}), "sequential.stopped_after"),
    "cell_id_escapes": (lambda d: d["plan"]["runs"][0].update(cell_id="../../x"), "not a cell folder name"),
}


@pytest.mark.parametrize("command", sorted(READERS) + ["sync"])
@pytest.mark.parametrize("case", sorted(SWEEPS))
def test_wrong_sweep_file_is_named(sweep_box, capsys, case, command):
    edit_json(_sweep(sweep_box) / "sweep.json", SWEEPS[case][0])
    argv = [*(READERS.get(command) or ["sync", "synth"]), "--results", "res"]
    check_refused(sweep_box, argv, capsys, ("sweep.json", SWEEPS[case][1]))


COMMANDS = {
    "report_near_miss": (["report", "synt"], "did you mean 'synth'"),
    "compare_metric_near_miss": (["compare", "synth", "synth", "--metric", "step_tme"], "did you mean 'step_time'"),
    "compare_metric_empty": (["compare", "synth", "synth", "--metric", ""], ("--metric", "unknown metric")),
    "compare_metric_commas": (["compare", "synth", "synth", "--metric", ",,"], ("--metric", "unknown metric")),
    "gate_metric_near_miss": (["gate", "--candidate", "synth", "--baseline", "synth", "--metric", "troughput"],
                              "did you mean 'throughput'"),
    "baseline_name_too_long": (["baseline", "save", "synth", "--name", "n" * 300], ("--name", "at most 100")),
    "baseline_list_argument": (["baseline", "list", "x"], ("baseline list", "takes no argument")),
    "sync_results_is_a_file": (["sync", "--results", "afile"], ("--results", "not a folder")),
    "report_results_is_a_file": (["report", "synth", "--results", "afile"], ("--results", "not a folder")),
}


@pytest.mark.parametrize("case", sorted(COMMANDS))
def test_bad_command_input(sweep_box, capsys, case):
    argv, expected = COMMANDS[case]
    (sweep_box / "afile").write_text("x")
    check_refused(sweep_box, argv + (["--results", "res"] if "--results" not in argv else []), capsys, expected)


def test_baselines_folder_that_is_a_file(sweep_box, capsys):
    (sweep_box / "res" / "baselines").write_text("x")
    check_refused(sweep_box, ["baseline", "save", "synth", "--name", "b1", "--results", "res"], capsys,
                  ("baselines", "not a folder"))


def test_baseline_list_names_an_unusable_file(sweep_box, capsys):
    (sweep_box / "res" / "baselines").mkdir()
    (sweep_box / "res" / "baselines" / "bad.json").write_text("{x")
    check_refused(sweep_box, ["baseline", "list", "--results", "res"], capsys, "bad.json")




def test_sync_uploads_the_good_records_and_names_the_bad_one(sweep_box, capsys):
    """One corrupt record does not hold back the sweep: the other runs are uploaded, the bad one is named (exit 2),
    the queue stays; once the file is fixed, ``sync`` completes the sweep."""
    from bench.cli import main
    from bench.tracking.upload_queue import QUEUE

    sweep = _sweep(sweep_box)
    give_specs(sweep)
    (sweep / QUEUE).write_text("{}")
    rec = _record(sweep_box)
    good = rec.read_text()
    rec.write_text(good[: len(good) // 2])
    uri = f"sqlite:///{sweep_box}/res/mlflow.db"
    rc = main(["sync", "synth", "--results", "res", "--tracking-uri", uri])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and str(rec) in lines[0] and "truncated" in lines[0], err
    assert "other runs are uploaded" in lines[0] and "Traceback" not in out + err
    assert len(list(sweep.glob("*/r*/mlflow.json"))) == 3 and not (rec.parent / "mlflow.json").exists()
    assert (sweep / QUEUE).exists() and "still pending" in out
    rec.write_text(good)
    assert main(["sync", "synth", "--results", "res", "--tracking-uri", uri]) == 0
    assert len(list(sweep.glob("*/r*/mlflow.json"))) == 4 and not (sweep / QUEUE).exists()


def test_sync_of_every_sweep_goes_on_past_a_bad_one(sweep_box, capsys):
    """``sync`` without a sweep: a sweep whose every record is unusable is named, the others are synced."""
    from _sweeps import EMBEDDED_CELLS, make_sweep

    from bench.cli import main
    from bench.tracking.upload_queue import QUEUE

    other = make_sweep(sweep_box / "res", "other", EMBEDDED_CELLS[:1], repeats=1, seed=2)
    for sweep in (_sweep(sweep_box), other):
        give_specs(sweep)
        (sweep / QUEUE).write_text("{}")
    for rec in _sweep(sweep_box).glob("*/r*/record.json"):
        rec.write_text("{")
    rc = main(["sync", "--results", "res", "--tracking-uri", f"sqlite:///{sweep_box}/res/mlflow.db"])
    out, err = capsys.readouterr()
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "nothing uploaded" in err, err
    assert len(list(other.glob("*/r*/mlflow.json"))) == 1
    assert not (other / QUEUE).exists() and (_sweep(sweep_box) / QUEUE).exists()


# -- a tracking store that answers but keeps nothing --------------------------------------------------------------

class _Forgetful(http.server.BaseHTTPRequestHandler):
    """Answers every MLflow REST call with 200 and an empty JSON object: accepts writes, keeps nothing."""

    def _ok(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = do_PATCH = do_DELETE = _ok

    def log_message(self, *args):
        pass


def test_a_store_that_keeps_nothing_is_an_outage(tmp_path, monkeypatch):
    """The parent run of such a store is read back and found missing: the tracker raises (the sweep treats it as
    an outage and queues every upload for ``sync``), never records an empty run id as the parent."""
    from bench.tracking import Tracker

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Forgetful)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        tracker = Tracker(f"http://127.0.0.1:{server.server_address[1]}", "t")
        assert not tracker.parent_alive("") and not tracker.parent_alive("abc")
        with pytest.raises(Exception, match="did not keep|run_id|parent"):
            tracker.start_parent("p", {}, {})
    finally:
        server.shutdown()
        server.server_close()


STORAGES = {
    "unknown_scheme": ("'ftp://x/y'", "unsupported storage"),
    "journal_on_a_device": ("'journal:/dev/null'", "not a regular file"),
    "journal_on_a_folder": ("'journal:/tmp'", "not a regular file"),
    "journal_in_a_kernel_folder": ("'journal:/proc/bench-x.log'", "kernel file system"),
    "sqlite_not_a_database": ("'sqlite:///m.yaml'", "not a SQLite database"),
}


@pytest.mark.parametrize("command", ["tune", "run"])
@pytest.mark.parametrize("case", sorted(STORAGES))
def test_bad_tune_storage_is_refused_before_anything_is_written(box, capsys, case, command):
    """``tune.storage`` of the matrix (and ``--storage``) checked before ``optuna.db`` or the MLflow store exist,
    by ``tune`` and, in the one validation pass, by ``run``."""
    value, expected = STORAGES[case]
    _write(box, GOOD + TUNE.replace("tune:\n", f"tune:\n  storage: {value}\n  n_trials: 1\n"))
    check_refused(box, [command, "m.yaml", "--results", "res"], capsys, ("tune.storage", expected))
    if command == "tune":
        check_refused(box, ["tune", "m.yaml", "--results", "res", "--storage", value.strip("'")], capsys,
                      ("--storage", expected))


@pytest.mark.parametrize("bad", ["{", '{"plan": {"runs": []}, "fingerprint": "f"}', "[1]"])
def test_resume_names_an_unusable_sweep_file_and_never_resumes_it(sweep_box, bad):
    """Resume reads each earlier sweep's ``sweep.json`` through its validator: a truncated or wrong one is named
    (the sweep warns with it) and never resumed, whatever its fingerprint."""
    from bench.records.results import ResultsDir

    good = _sweep(sweep_box)
    meta = json.loads((good / "sweep.json").read_text())
    broken = good.parent / "29990101-000000-broken"
    broken.mkdir()
    (broken / "sweep.json").write_text(bad)
    rd = ResultsDir(sweep_box / "res", "synth")
    assert rd.find_resumable(meta["fingerprint"], meta["platform"]) == good
    assert len(rd.unusable) == 1 and str(broken / "sweep.json") in rd.unusable[0]


IGNORED = {  # options that would be ignored without the one they act with
    "smoke_steps_without_smoke": (["run", "m.yaml", "--smoke-steps", "3"], "only with --smoke"),
    "threshold_without_a_plan": (["run", "m.yaml", "--threshold", "0.1"], "only with --sequential"),
    "alpha_without_a_plan": (["run", "m.yaml", "--alpha=0.1"], "only with --sequential"),
    "parallel_without_ray_dry_run": (["run", "m.yaml", "--parallel", "auto", "--dry-run"], "needs --ray-address"),
    "order_seed_with_sequential_order": (["run", "m.yaml", "--order", "sequential", "--order-seed", "3"],
                                         "only with --order blocked"),
    **{f"gate_{opt[2:].replace('-', '_')}_without_interleave": (
        ["gate", "--baseline", "synth", "--candidate", "synth", opt, *([value] if value else [])],
        "only with --interleave") for opt, value in (("--set", "base.steps=4"), ("--blocks", "4"),
                                                     ("--budget", "5m"), ("--force", ""), ("--spawn", ""),
                                                     ("--order-seed", "3"), ("--side-by-side", ""))},
}


@pytest.mark.parametrize("case", sorted(IGNORED))
def test_an_option_that_would_be_ignored_is_refused(sweep_box, capsys, case):
    argv, expected = IGNORED[case]
    _write(sweep_box, GOOD)
    flag = argv[2].split("=")[0] if argv[0] == "run" else ""
    check_refused(sweep_box, [*argv, "--results", "res"], capsys, (flag, expected))


BASELINES = {
    "nan_sample": (float("nan"), "not a finite number"),
    "negative_sample": (-1.0, "is negative"),
    "infinite_sample": (float("inf"), "not a finite number"),
}


@pytest.mark.parametrize("command", ["gate", "compare", "show"])
@pytest.mark.parametrize("case", sorted(BASELINES))
def test_a_baseline_with_a_bad_sample_is_named(sweep_box, capsys, case, command):
    """A stored baseline's samples are finite and not negative (a NaN made the gate pass without a word)."""
    from bench.gate.baseline import save

    out, _, _ = save("synth", "bl", sweep_box / "res", None)
    value, expected = BASELINES[case]
    edit_json(out, lambda d: d["cells"][0]["repeats"][0]["samples"]["step_time"].__setitem__(0, value))
    argv = {"gate": ["gate", "--baseline", "bl", "--candidate", "synth"], "compare": ["compare", "bl", "synth"],
            "show": ["baseline", "show", "bl"]}[command]
    check_refused(sweep_box, [*argv, "--results", "res"], capsys, ("bl.json", "not a valid baseline", expected))


def test_gate_interleave_checks_the_tune_block_too(box, capsys):
    """One validation pass: the tune block of ``gate --interleave --matrix`` is checked like ``run``'s."""
    _write(box, GOOD + TUNE.replace("tune:\n", "tune:\n  storage: 'journal:/dev/null'\n"))
    check_refused(box, ["gate", "--interleave", "HEAD", "--matrix", "m.yaml", "--results", "res"], capsys,
                  ("tune.storage", "not a regular file"))


def test_baseline_name_near_miss(sweep_box, capsys):
    from bench.gate.baseline import save

    save("synth", "main", sweep_box / "res", None)
    check_refused(sweep_box, ["gate", "--baseline", "mian", "--candidate", "synth", "--results", "res"], capsys,
                  ("--baseline mian", "did you mean 'main'"))


def test_sync_names_an_unusable_spec_and_uploads_the_other_cell(sweep_box, capsys):
    from bench.cli import main
    from bench.tracking.upload_queue import QUEUE

    sweep = _sweep(sweep_box)
    give_specs(sweep)
    (sweep / QUEUE).write_text("{}")
    spec = sorted(sweep.glob("*/spec.json"))[0]
    edit_json(spec, lambda d: d.update(cell_id=5))
    rc = main(["sync", "synth", "--results", "res", "--tracking-uri", f"sqlite:///{sweep_box}/res/mlflow.db"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and str(spec) in lines[0] and "cell_id: expected a string" in lines[0], err
    assert len(list(sweep.glob("*/r*/mlflow.json"))) == 2 and not list(spec.parent.glob("r*/mlflow.json"))
