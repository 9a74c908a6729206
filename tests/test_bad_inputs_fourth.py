"""Bad inputs of issue 33 still open after tests/test_bad_inputs_third.py, each through the real entry point
(:func:`_badinput.check_refused`: exit 2, one stderr line naming file and key with what is allowed, nothing
written, no traceback): hand-edited ``sweep.json`` files read by one strict reader, outputs whose place is taken,
options a subcommand would ignore, matrix cross-checks, tracking URIs checked by every command, and messages.
"""
# ruff: noqa: F811 - the fixtures box and sweep_box come from _badinput; tests take them as parameters

from __future__ import annotations

from pathlib import Path

import pytest
from _badinput import GOOD, box, check_refused, edit_json, give_specs, sweep_box  # noqa: F401 - fixtures


def _write(box: Path, text: str, name: str = "m.yaml") -> str:
    (box / name).write_text(text)
    return name


def _sweep(box: Path) -> Path:
    return next((box / "res" / "synth").glob("2*"))


def _runs(d: dict) -> list:
    return d["plan"]["runs"]


# -- 1. sweep.json hand-edits: one strict reader (bench.records.results.check_sweep_meta) ----------------------------

SWEEP_EDITS = {
    "level_unknown_factor": (lambda d: _runs(d)[0]["levels"].update(dynamic_bzs=1),
                             ("plan.runs[0].levels", "unknown factor 'dynamic_bzs'", "did you mean 'dynamic_bsz'",
                              "allowed: ", "rmsnorm_fused")),
    "level_text": (lambda d: _runs(d)[1]["levels"].update(dynamic_bsz="x"),
                   ("plan.runs[1].levels.dynamic_bsz", '"x" is not a level', "allowed: 0, 1")),
    "level_outside": (lambda d: _runs(d)[1]["levels"].update(dynamic_bsz=5),
                      ("plan.runs[1].levels.dynamic_bsz", "5 is not a level", "allowed: 0, 1")),
    "level_bool": (lambda d: _runs(d)[1]["levels"].update(dynamic_bsz=True),
                   ("plan.runs[1].levels.dynamic_bsz", "true is not a level", "allowed: 0, 1")),
    "matrix_text": (lambda d: d.update(matrix="x"), ("matrix: str 'x'", "allowed: a JSON object")),
    "matrix_missing": (lambda d: d.pop("matrix"), ("matrix: missing", "allowed: a JSON object")),
    "matrix_base_list": (lambda d: d["matrix"].update(base=[1]), ("matrix.base: list", "allowed: a JSON object")),
    "runs_empty": (lambda d: d["plan"].update(runs=[]), ("plan.runs is empty", "at least one")),
    "run_twice": (lambda d: _runs(d).append(dict(_runs(d)[0])),
                  ("plan.runs[2].cell_id", "listed twice", "plan.runs[0]", "each cell once")),
}
READERS = {
    "report": ["report", "synth"],
    "gate_baseline": ["gate", "--candidate", "other", "--baseline", "synth"],
    "gate_candidate": ["gate", "--candidate", "synth", "--baseline", "other"],
    "compare": ["compare", "synth", "other"],
    "baseline_save": ["baseline", "save", "synth", "--name", "b1"],
    "sync": ["sync", "synth"],
}


@pytest.mark.parametrize("case", sorted(SWEEP_EDITS))
def test_hand_edited_sweep_json_is_read_identically(sweep_box, capsys, case):
    """Every reader of a sweep refuses the same hand edit with the same line (file, key path, what is allowed);
    ``sync`` used to upload ``levels.dynamic_bsz: "x"``, ``report`` counted a duplicated cell twice."""
    from _sweeps import EMBEDDED_CELLS, make_sweep

    make_sweep(sweep_box / "res", "other", EMBEDDED_CELLS[:2], repeats=2, seed=2)
    sweep = _sweep(sweep_box)
    give_specs(sweep)
    edit, expected = SWEEP_EDITS[case]
    edit_json(sweep / "sweep.json", edit)
    expected = ("res/synth/latest/sweep.json", *expected)
    lines = {name: check_refused(sweep_box, [*argv, "--results", "res"], capsys, expected)
             for name, argv in READERS.items()}
    assert len(set(lines.values())) == 1, lines
    line = next(iter(lines.values()))
    assert "unexpected" not in line and "Input should" not in line, line


# -- 2. outputs: a file where an output folder goes, a read-only results folder, a baseline that is a folder -----

OUTPUTS = {
    "report": (["report", "synth"], "report"),
    "gate": (["gate", "--candidate", "synth", "--baseline", "synth", "--no-expect"], "gate"),
    "compare": (["compare", "synth", "synth"], "compare"),
}


@pytest.mark.parametrize("command", sorted(OUTPUTS))
def test_file_where_the_output_folder_goes(sweep_box, capsys, command):
    """A file named ``report``/``gate``/``compare`` in the sweep: was FileExistsError with a crash log."""
    argv, folder = OUTPUTS[command]
    (_sweep(sweep_box) / folder).write_text("mine\n")
    check_refused(sweep_box, [*argv, "--results", "res"], capsys,
                  (f"output folder {_sweep(sweep_box).resolve()}/{folder}", "is a file, not a folder", "--out DIR"))


@pytest.mark.parametrize("command", sorted(OUTPUTS))
def test_output_folder_file_inside_is_refused(sweep_box, capsys, command):
    """``report/report.md`` (or ``gate/gate.md``) a folder: was IsADirectoryError with a crash log."""
    argv, folder = OUTPUTS[command]
    name = {"report": "report.md"}.get(command, "gate.md")
    (_sweep(sweep_box) / folder / name).mkdir(parents=True)
    check_refused(sweep_box, [*argv, "--results", "res"], capsys, (f"{folder}/{name}", "is a folder", "move it away"))


@pytest.mark.parametrize("argv", [["baseline", "show", "b"], ["gate", "--candidate", "synth", "--baseline", "b"],
                                  ["baseline", "save", "synth", "--name", "b", "--force"]],
                         ids=["show", "gate", "save_force"])
def test_baseline_file_is_a_folder(sweep_box, capsys, argv):
    """``baselines/b.json`` a folder: was IsADirectoryError (save --force) or a message without the path."""
    (sweep_box / "res" / "baselines" / "b.json").mkdir(parents=True)
    check_refused(sweep_box, [*argv, "--results", "res"], capsys, ("baselines/b.json", "is a folder"))


def _unshare_prefix() -> list[str] | None:
    """``unshare`` into a mount namespace of our own (as root, or mapped to root in a user namespace), or None."""
    import os
    import shutil
    import subprocess

    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return None
    prefix = ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--user", "--map-root-user"])
    ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=30).returncode == 0
    return prefix if ok else None


@pytest.mark.parametrize("command", ["report", "gate"])
def test_read_only_results_mount(sweep_box, command):
    """``--results`` on a read-only mount (a bind mount of its own, so root is refused too): was an OSError with a
    crash log in the temporary folder; now one line naming the folder, exit 2."""
    import os
    import subprocess
    import sys

    from _badinput import tree

    prefix = _unshare_prefix()
    if prefix is None:
        pytest.skip("no mount namespace here (unshare needs root or user namespaces) for a read-only bind mount")
    root = Path(__file__).resolve().parent.parent
    argv = OUTPUTS[command][0]
    before = tree(sweep_box)
    script = f"mount --bind -o ro res res && exec {sys.executable} {root / 'run_bench.py'} " + " ".join(argv) + \
        " --results res"
    env = {**os.environ, "PYTHONPATH": str(root), "TMPDIR": str(sweep_box / "res")}
    proc = subprocess.run([*prefix, "sh", "-c", script], cwd=sweep_box, env=env, capture_output=True, text=True,
                          timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr)
    assert "a read-only mount" in lines[0] and f"{command}" in lines[0] and "unexpected" not in lines[0], lines[0]
    assert tree(sweep_box) == before


# -- 3. options a subcommand would ignore are refused --------------------------------------------------------

IGNORED = {
    "gate_stored_matrix": (["gate", "--baseline", "synth", "--candidate", "synth", "--matrix", "m.yaml"],
                           ("--matrix m.yaml", "only with --interleave")),
    "baseline_list_name": (["baseline", "list", "--name", "x"], ("baseline list", "--name", "baseline save` only")),
    "baseline_list_note": (["baseline", "list", "--note", "hi"], ("baseline list", "--note", "baseline save` only")),
    "baseline_show_force": (["baseline", "show", "b", "--force"], ("baseline show", "--force", "save` only")),
    "baseline_show_alpha": (["baseline", "show", "b", "--alpha", "0.05"], ("baseline show", "--alpha", "save` only")),
    "dry_run_parallel_zero": (["run", "m.yaml", "--dry-run", "--parallel", "0", "--ray-address",
                               "http://127.0.0.1:1"], ("--parallel '0'", "allowed: auto", "1..4096")),
    "dry_run_parallel_text": (["run", "m.yaml", "--dry-run", "--parallel", "abc", "--ray-address",
                               "http://127.0.0.1:1"], ("--parallel 'abc'", "allowed: auto")),
    "interleave_blocks_huge": (["gate", "--interleave", "HEAD", "--matrix", "m.yaml", "--blocks", "1000000000000"],
                               ("--blocks 1000000000000", "allowed 2..1000")),
    "results_empty": (["run", "m.yaml", "--results", ""], ("--results", "'' is empty", "allowed: a folder")),
    "results_empty_dry_run": (["run", "m.yaml", "--dry-run", "--results", ""], ("--results", "is empty")),
}


@pytest.mark.parametrize("case", sorted(IGNORED))
def test_ignored_option_is_refused(sweep_box, capsys, case):
    argv, expected = IGNORED[case]
    _write(sweep_box, GOOD)
    if "--results" not in argv:
        argv = [*argv, "--results", "res"]
    check_refused(sweep_box, argv, capsys, expected)


# -- 4. matrix cross-checks ----------------------------------------------------------------------------------

TWO = GOOD.replace("  dynamic_bsz: [off, on]", "  dynamic_bsz: [off, on]\n  rmsnorm_fused: [0, 1]")
TUNE_SPACE = "  space:\n    ppo_max_token_len_per_gpu: {low: 1, high: 4, unit: seq}\n"
CROSS = {
    "explicit_cell_twice": (TWO + "design:\n  type: explicit\n  cells:\n    - {dynamic_bsz: 1}\n"
                            "    - {rmsnorm_fused: 1}\n    - {dynamic_bsz: 1, rmsnorm_fused: 0}\n",
                            ("design.cells[2]", "the same cell as design.cells[0]", "list each cell once")),
    "explicit_all_off_twice": (TWO + "design:\n  type: explicit\n  cells:\n    - {}\n    - {dynamic_bsz: 0}\n",
                               ("design.cells[1]", "the same cell as design.cells[0]")),
    "factor_listed_twice": (GOOD.replace("factors:\n  dynamic_bsz: [off, on]", "factors: [dynamic_bsz, dynamic_bsz]"),
                            ("factors", "'dynamic_bsz' is listed twice", "each factor once")),
    "override_carriage_return": (GOOD.replace("  steps: 3", "  steps: 3\n  overrides: [\"trainer.x=1\\r\"]"),
                                 ("base.overrides", "control character '\\r'")),
    "expect_unlisted_factor": (GOOD + "expect:\n  - {factor: rmsnorm_fused, at_least: 0.05}\n",
                               ("expect.0.rmsnorm_fused", "does not list rmsnorm_fused", "dynamic_bsz: [0, 1]")),
    "expect_unused_level": (GOOD.replace("[off, on]", "[off]").replace("dynamic_bsz: [off]",
                                                                        "dynamic_bsz: [off]\n  rmsnorm_fused: [0, 1]")
                            + "expect:\n  - {factor: dynamic_bsz, level: 1, at_least: 0.05}\n",
                            ("expect.0.dynamic_bsz", "level 1 is not among the matrix's levels [0]")),
    "tune_fixed_unlisted": (GOOD + "tune:\n  fixed: {rmsnorm_fused: on}\n" + TUNE_SPACE,
                            ("tune.fixed.rmsnorm_fused", "does not list rmsnorm_fused")),
    "tune_fixed_unused_level": (TWO.replace("rmsnorm_fused: [0, 1]", "rmsnorm_fused: [0]")
                                + "tune:\n  fixed: {rmsnorm_fused: on}\n" + TUNE_SPACE,
                                ("tune.fixed.rmsnorm_fused", "level 1 is not among the matrix's levels [0]")),
}


@pytest.mark.parametrize("case", sorted(CROSS))
@pytest.mark.parametrize("mode", ["dry-run", "run"])
def test_matrix_cross_check(box, capsys, case, mode):
    text, expected = CROSS[case]
    argv = ["run", _write(box, text), "--results", "res"] + (["--dry-run"] if mode == "dry-run" else [])
    line = check_refused(box, argv, capsys, ("m.yaml", *expected))
    assert "unexpected" not in line and "()" not in line, line


def test_tune_fixed_refused_by_tune_too(box, capsys):
    """``tune`` reads the matrix through the same model: a fixed level the matrix does not use is refused there
    (was: a trial ran)."""
    text, expected = CROSS["tune_fixed_unlisted"]
    check_refused(box, ["tune", _write(box, text), "--results", "res"], capsys, ("m.yaml", *expected))


@pytest.mark.parametrize("given", ["base.steps=3\r", "base.steps=3\t"], ids=["cr", "tab"])
def test_override_with_control_character(box, capsys, given):
    """``base.steps=3\\r`` on the command line ran 3 steps (YAML drops the line break): refused by name."""
    check_refused(box, ["run", _write(box, GOOD), "--dry-run", "--results", "res", given], capsys,
                  ("override", "control character"))


# -- 5. a tracking URI given to a reader is checked as `run` checks it ----------------------------------------

URI_READERS = {
    "report": ["report", "synth"],
    "compare": ["compare", "synth", "synth"],
    "gate_baseline": ["gate", "--candidate", "synth", "--baseline", "synth", "--no-expect"],
    "baseline_save": ["baseline", "save", "synth", "--name", "b1"],
}
URIS = {
    "bogus": ("bogus://x", ("--tracking-uri bogus://x", "unsupported scheme", "allowed: sqlite:///PATH")),
    "upper_case": ("SQLITE:///x.db", ("--tracking-uri SQLITE:///x.db", "lower case", "sqlite://")),
    "two_slashes": ("sqlite://x.db", ("--tracking-uri sqlite://x.db", "three slashes")),
}


@pytest.mark.parametrize("uri", sorted(URIS))
@pytest.mark.parametrize("command", sorted(URI_READERS))
def test_reader_checks_its_tracking_uri(sweep_box, capsys, command, uri):
    """Was: not checked (a warning in MLflow's words after the outputs were written)."""
    value, expected = URIS[uri]
    line = check_refused(sweep_box, [*URI_READERS[command], "--results", "res", "--tracking-uri", value], capsys,
                         expected)
    assert "three slashes" not in line or uri == "two_slashes", line


def test_reader_checks_the_environment_tracking_uri(sweep_box, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "bogus://x")
    check_refused(sweep_box, ["report", "synth", "--results", "res"], capsys, ("bogus://x", "unsupported scheme"))


# -- 6. messages ------------------------------------------------------------------------------------------------

def test_databricks_uri_is_named_as_a_workspace(box, capsys, monkeypatch):
    """``--tracking-uri databricks`` (MLflow's word for a Databricks workspace) was told it "keeps no file store"."""
    monkeypatch.setenv("HOME", str(box / "home"))
    monkeypatch.delenv("DATABRICKS_HOST", raising=False)
    for uri in ("databricks", "databricks://prof"):
        line = check_refused(box, ["run", _write(box, GOOD), "--results", "res", "--tracking-uri", uri], capsys,
                             (f"--tracking-uri {uri}", "Databricks workspace", "DATABRICKS_HOST", "~/.databrickscfg"))
        assert "file store" not in line, line


def test_databricks_uri_passes_a_dry_run(box, capsys, monkeypatch):
    """A dry run contacts no store: a Databricks URI is not refused there (its workspace is checked by a real run)."""
    from bench.cli import main

    monkeypatch.setenv("HOME", str(box / "home"))
    monkeypatch.delenv("DATABRICKS_HOST", raising=False)
    assert main(["run", _write(box, GOOD), "--dry-run", "--results", "res", "--tracking-uri", "databricks"]) == 0
    assert "file store" not in capsys.readouterr().err
