"""Every path the harness opens or creates goes through one resolver, :func:`bench.core.paths.resolve_path`, before
anything is written (issue 48): names within the file system's limits (``os.pathconf``), links followed, a dangling
link or a loop refused by name. Was: ``results/mlflow.db`` or a ``--tracking-uri`` as a dangling link passed the
pre-run check, then MLflow retried for 100-116 s and left ``.lock`` files (``report`` even exited 0); a dangling Optuna
storage was refused in sqlite's words; ``tune --study`` of 300 characters ended in "unexpected OSError: File name too
long" after ``optuna.db``, ``mlflow.db``, a lock and an error log were written.
"""
# ruff: noqa: F811 - the fixtures come from _badinput; tests take them as parameters

from __future__ import annotations

import os

import pytest
from _badinput import GOOD, TUNE, box, check_refused, sweep_box  # noqa: F401 - fixtures
from _cli import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.core.errors import BenchError
from bench.core.paths import limits, resolve_path

FEW = settings(max_examples=int(os.environ.get("BENCH_HYPOTHESIS_CLI_EXAMPLES", "3")), deadline=None,
               derandomize=True, suppress_health_check=list(HealthCheck))
MANY = settings(max_examples=int(os.environ.get("BENCH_HYPOTHESIS_EXAMPLES", "30")), deadline=None,
                derandomize=True, suppress_health_check=list(HealthCheck))
LONG = "s" * 300


@pytest.fixture()
def dangling_store(sweep_box):
    """``res/mlflow.db`` a link to a file that does not exist, beside the synthetic sweep ``synth``."""
    (sweep_box / "res" / "mlflow.db").symlink_to("gone/mlflow.db")
    (sweep_box / "m.yaml").write_text(GOOD)
    return sweep_box


@pytest.mark.parametrize("argv", [["run", "m.yaml", "--results", "res"], ["report", "synth", "--results", "res"],
                                  ["baseline", "save", "synth", "--name", "b", "--results", "res"]],
                         ids=["run", "report", "baseline-save"])
def test_a_dangling_default_store_is_refused_at_once(dangling_store, argv):
    cli(dangling_store, argv, ("MLflow store sqlite:///res/mlflow.db", "is a link to gone/mlflow.db",
                               "which does not exist"))


def test_a_dangling_tracking_uri_is_refused_at_once(dangling_store):
    cli(dangling_store, ["run", "m.yaml", "--results", "r2", "--tracking-uri", "sqlite:///res/mlflow.db"],
        ("--tracking-uri sqlite:///res/mlflow.db", "is a link to gone/mlflow.db"))


def test_a_dangling_optuna_storage_is_refused_in_our_words(box):
    (box / "t.yaml").write_text(TUNE)
    (box / "o.db").symlink_to("gone/o.db")
    line = cli(box, ["tune", "t.yaml", "--results", "res", "--storage", "sqlite:///o.db"],
               ("--storage sqlite:///o.db", "is a link to gone/o.db, which does not exist"))
    assert "unable to open" not in line


def test_a_study_name_too_long_is_refused_before_anything_is_written(box):
    (box / "t.yaml").write_text(TUNE)
    cli(box, ["tune", "t.yaml", "--results", "res", "--study", LONG], ("--study", "at most 100"))


@pytest.mark.parametrize("command", [["report"], ["compare", "synth"], ["sync"]])
def test_a_sweep_name_too_long_is_refused_by_name(sweep_box, command):
    """The hostile trial of issue 48: ``report <300 characters>`` ended as "unexpected OSError: File name too long",
    exit 1; every sweep reference goes through :func:`bench.records.results.find_sweep`."""
    cli(sweep_box, [*command, LONG, "--results", "res"], ("sweep", "longer than 255 bytes"))


def test_a_tune_study_too_long_is_refused_by_dry_run(box):
    (box / "t.yaml").write_text(TUNE.replace("  n_trials: 2\n", f"  n_trials: 2\n  study: {LONG}\n"))
    cli(box, ["run", "t.yaml", "--dry-run"], ("t.yaml", "tune.study", "at most 100 characters"))


#: slot -> argv with ``{p}`` for the path; the box holds the sweep ``synth`` (res/), m.yaml, t.yaml
SLOTS = {
    "results": ["run", "m.yaml", "--results", "{p}"],
    "out": ["report", "synth", "--results", "res", "--out", "{p}"],
    "tracking-uri": ["run", "m.yaml", "--results", "res2", "--tracking-uri", "sqlite:///{p}"],
    "storage": ["tune", "t.yaml", "--results", "res2", "--storage", "sqlite:///{p}"],
    "journal": ["tune", "t.yaml", "--results", "res2", "--storage", "journal:{p}"],
    "matrix": ["run", "{p}", "--dry-run"],
    "baseline": ["gate", "--candidate", "synth", "--baseline", "{p}", "--results", "res"],
    "gate-out": ["compare", "synth", "synth", "--results", "res", "--out", "{p}"],
    "sweep": ["report", "{p}", "--results", "res"],  # the trial: a 300-character sweep was an unexpected OSError
    "history-out": ["history", "b", "--results", "res", "--out", "{p}"],
}


@st.composite
def bad_paths(draw):
    """(slot, argv): one path the harness would open or create, replaced by a dangling link or a name longer than
    the file system allows (a 256-400 character component, at the end or inside the path)."""
    slot = draw(st.sampled_from(sorted(SLOTS)))
    if draw(st.booleans()):
        path = draw(st.sampled_from(["dangling", "dangling/inside.db"]))
    else:
        name = draw(st.text("abcdefghij_.-", min_size=256, max_size=400).filter(lambda s: s.strip(".")))
        path = draw(st.sampled_from([name, f"{name}/x.db", f"res/{name}"]))
    return slot, [a.replace("{p}", path) for a in SLOTS[slot]]


def _ready(box):
    (box / "m.yaml").write_text(GOOD)
    (box / "t.yaml").write_text(TUNE)
    (box / "dangling").symlink_to("nowhere")


def test_any_path_replaced_is_refused_in_process(sweep_box, capsys):
    """Property through :func:`bench.cli.main`: exit 2, one line, nothing written, within the cap."""
    _ready(sweep_box)

    @MANY
    @given(bad_paths())
    def prop(case):
        slot, argv = case
        check_refused(sweep_box, argv, capsys)

    prop()


def test_any_path_replaced_is_refused_through_the_entry_point(sweep_box):
    _ready(sweep_box)

    @FEW
    @given(bad_paths())
    def prop(case):
        slot, argv = case
        cli(sweep_box, argv)

    prop()


def test_the_resolver_follows_links_and_reads_the_limits(tmp_path):
    """A link to a folder is followed to its target; a loop is named; the limits are the file system's own."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    assert resolve_path("--x", tmp_path / "link" / "new" / "f.db") == tmp_path.resolve() / "real" / "new" / "f.db"
    with pytest.raises(BenchError, match="a loop of symbolic links"):
        resolve_path("--x", tmp_path / "a" / "f.db")
    name_max, path_max = limits(tmp_path / "new" / "deeper")
    assert name_max == os.pathconf(tmp_path, "PC_NAME_MAX") and path_max == os.pathconf(tmp_path, "PC_PATH_MAX")
