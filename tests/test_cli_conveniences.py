"""Conveniences of the command line: ``--version``, ``run --cells PATTERN``, ``base.KEY=VALUE`` overrides."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_version_prints_package_version_and_git_sha(capsys):
    from bench import __version__

    assert main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    sha = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if sha.returncode == 0:
        assert re.fullmatch(rf"run_bench\.py {re.escape(__version__)} \(git {sha.stdout.strip()}(\+dirty)?\)", out), out
    else:
        assert out == f"run_bench.py {__version__}"


def test_version_without_git_and_through_the_entry_point(monkeypatch, capsys, tmp_path):
    import bench.tracking
    from bench import __version__

    monkeypatch.setattr(bench.tracking, "git_commit", lambda: "unknown")
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"run_bench.py {__version__}\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), "--version"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith(f"run_bench.py {__version__}") and p.stderr == ""
    assert list(tmp_path.iterdir()) == []  # writes nothing


# -- console in a non-terminal -------------------------------------------------------------------------

def _row(label: str, **kw) -> dict:
    from bench.spec.optimizations import FACTOR_KEYS

    row = {k: "n/a" for k in FACTOR_KEYS}
    row.update(
        label=label,
        step_time_s=1.2345,
        step_time_raw_s=1.3,
        step_time_iqr_s=0.01,
        speedup=1.0,
        rollout_share=0.4,
        free_ratio=None,
        status="ok",
        reason="",
        rmsnorm_fused="1",
        dynamic_bsz="0",
    )
    row.update(kw)
    return row


def test_plain_table_keeps_every_label_whole_on_one_line():
    from bench.commands.run import plain_table

    long = "rmsnorm_fused+dynamic_bsz+" + "x" * 180
    lines = plain_table([_row("all-off", rmsnorm_fused="0"), _row(long, dynamic_bsz="1")])
    assert len(lines) == 4 and lines[0].split() == ["cell", "rmsnorm_fused", "dynamic_bsz", "step", "s", "raw", "s",
                                                    "IQR", "speedup", "rollout", "Free", "status"]
    assert lines[3].startswith(long + "  1              1") and lines[3].split()[-1] == "ok" and "1.234" in lines[3]
    assert lines[2].startswith("all-off ") and lines[2].split()[-2:] == ["-", "ok"]  # free_ratio None -> "-"


def test_rich_table_at_80_columns_would_wrap_the_label():
    """Why the plain layout exists: rich folds a 25-character label in an 80-column log."""
    import io

    from rich.console import Console

    from bench.commands.run import summary_table

    buf = io.StringIO()
    Console(file=buf, width=80).print(summary_table([_row("all-off"), _row("rmsnorm_fused+dynamic_bsz")]))
    assert "rmsnorm_fused+dynamic_bsz" not in buf.getvalue()


@pytest.mark.slow
def test_sweep_piped_to_a_file_prints_unwrapped_labels(tmp_path):
    """A real 2-cell embedded sweep (smoke settings, ~40 s) with stdout piped, as in a CI log."""
    text = (ROOT / "matrix" / "smoke.yaml").read_text().replace("name: smoke", "name: smokewide")
    text = text.replace("design: full", "design:\n  type: explicit\n  cells:\n    - {}\n"
                        "    - {rmsnorm_fused: on, dynamic_bsz: on}")
    text = text.replace("factors:\n", "factors:\n  rmsnorm_fused: [off, on]\n")
    (tmp_path / "wide.yaml").write_text(text)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    env.pop("MLFLOW_TRACKING_URI", None)
    p = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), "wide.yaml", "--results", "res",
                        "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    table = lines[lines.index("cells") + 1:]
    assert table[0].split()[:3] == ["cell", "rmsnorm_fused", "dynamic_bsz"] and set(table[1]) <= {"-", " "}
    for i, label in enumerate(("all-off", "rmsnorm_fused+dynamic_bsz")):
        row = table[2 + i].split()
        assert row[0] == label and row[-1] == "ok" and float(row[3]) > 0  # label, levels, step s ... status
        # the live line of the finished run holds the whole label too
        assert any(ln.split()[:2] == ["ok", label] for ln in lines[:lines.index("cells")])
    assert table[4].startswith("sweep folder: ")


# -- base.KEY=VALUE overrides -----------------------------------------------------------------------------

SMOKE = ROOT / "matrix" / "smoke.yaml"


def test_overrides_set_base_values_validated_like_the_file():
    from bench.spec.loading import load_matrix

    plain = load_matrix(SMOKE)
    m = load_matrix(SMOKE, ["base.steps=5", "base.embedded.update_delay_s=0.25", "base.max_response_length=32"])
    assert (m.base.steps, m.base.max_response_length, plain.base.steps) == (5, 32, 3)
    assert m.base.embedded == {"update_delay_s": 0.25}
    assert m.fingerprint() != plain.fingerprint()  # its own sweep, not a resume of the file's
    assert load_matrix(SMOKE, ["base.steps=3"]).fingerprint() == plain.fingerprint()  # same content, same sweep


def run_cli(tmp_path, *args, capsys):
    rc = main(["run", str(SMOKE), *args, "--results", str(tmp_path / "res")])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("override,expected", [
    ("base.steps=abc", "smoke.yaml: override base.steps=abc: base.steps: expected an integer, got a string 'abc'"),
    ("base.steps=0", "override base.steps=0: base.steps: must be greater than or equal to 1, got 0"),
    ("base.stepz=3", "override base.stepz=3: base.stepz: unknown key"),
    ("steps=3", "override 'steps=3': expected base.KEY=VALUE (e.g. base.steps=4)"),
    ("base.steps", "override 'base.steps': expected base.KEY=VALUE"),
    ("base.steps=[1", "override 'base.steps=[1': value is not YAML"),
    ("base.steps.x=1", "override 'base.steps.x=1': base.steps is not a mapping in the file"),
    ("base.train_batch_size=5", "override base.train_batch_size=5: base: ppo_mini_batch_size (4) must divide "
                                "train_batch_size (5)"),
])
def test_bad_overrides_are_one_line_exit_2_naming_the_key(tmp_path, capsys, override, expected):
    rc, out, err = run_cli(tmp_path, "--dry-run", override, capsys=capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and expected in err, err
    assert out == "" and not (tmp_path / "res").exists()


def test_overrides_before_or_after_options(tmp_path, capsys):
    for args in (("base.steps=4", "--dry-run"), ("--dry-run", "base.steps=4")):
        rc, out, err = run_cli(tmp_path, *args, capsys=capsys)
        assert rc == 0 and "runs=2 x 1 repeat(s)" in out and err == ""
    rc, _, err = run_cli(tmp_path, "--dry-run", "--bogus", capsys=capsys)
    assert rc == 2 and "unrecognized arguments: --bogus" in err


# -- --cells PATTERN ---------------------------------------------------------------------------------------

def _dry_cells(out: str) -> list[str]:
    return re.findall(r"^ +\d+\. (\S+) \([0-9a-f]{12}\):", out, re.M)  # the dry run's runs (not the run order)


def test_cells_selects_by_label_substring_glob_or_cell_id(tmp_path, capsys):
    rc, out, _ = run_cli(tmp_path, "--dry-run", capsys=capsys)
    assert rc == 0 and _dry_cells(out) == ["all-off", "dynamic_bsz"]
    all_off_id = re.search(r"all-off \(([0-9a-f]+)\)", out).group(1)
    for pattern, cells in (("dynamic", ["dynamic_bsz"]), ("all-*", ["all-off"]), (all_off_id[:6], ["all-off"]),
                           ("dyn*,all-off", ["all-off", "dynamic_bsz"]), ("*", ["all-off", "dynamic_bsz"])):
        rc, out, err = run_cli(tmp_path, "--dry-run", "--cells", pattern, capsys=capsys)
        assert rc == 0 and _dry_cells(out) == cells, (pattern, out, err)
        assert f"runs={len(cells)} x 1 repeat(s)" in out


@pytest.mark.parametrize("pattern,expected", [
    ("rmsnorm", "smoke.yaml: --cells 'rmsnorm' matches no cell (allowed labels: all-off, dynamic_bsz;"),
    ("Dyn*", "--cells 'Dyn*' matches no cell (allowed labels: all-off, dynamic_bsz;"),
    (" , ", "--cells ' , ': empty pattern"),
])
def test_cells_matching_nothing_is_one_line_exit_2(tmp_path, capsys, pattern, expected):
    rc, out, err = run_cli(tmp_path, "--cells", pattern, capsys=capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and expected in err, err
    assert not (tmp_path / "res").exists()


def test_a_subset_is_its_own_sweep():
    from bench.commands.run import select_cells
    from bench.spec.loading import load_matrix
    from bench.spec.plan import make_plan

    m = load_matrix(SMOKE)
    full = m.fingerprint()
    plan = select_cells(make_plan(m, strict=False), "all-off", SMOKE)
    assert [r.label for r in plan.runs] == ["all-off"]
    m.selected_cells = [r.cell_id for r in plan.runs]
    assert m.fingerprint() != full  # neither resumes nor is resumed by the sweep of every cell


def test_cells_apply_to_smoke_runs_too(tmp_path, capsys):
    rc = main(["run", str(ROOT / "matrix" / "qwen3vl8b_a2.yaml"), "--smoke", "--dry-run", "--cells", "mc2,all-off",
               "--results", str(tmp_path / "res")])
    out = capsys.readouterr().out
    assert rc == 0 and re.findall(r"^ +\d+\. (\S+) -> smoke cell", out, re.M) == ["all-off", "mc2"], out


@pytest.mark.slow
def test_subset_sweep_with_override_runs_and_resumes_on_its_own(tmp_path):
    """Real embedded runs (~1 min): ``--cells`` + ``base.steps=4`` runs one cell with 4 steps; the whole
    matrix afterwards is a new sweep (runs both cells), and the subset again resumes its own sweep."""
    import json

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)

    def run(*args):
        p = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), str(SMOKE), *args, "--results", "res",
                            "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        return p.stdout

    assert "executed 1, cached 0, failed 0" in run("--cells", "dynamic", "base.steps=4")
    def sweeps():  # the sweep folders (not the `latest` link)
        return sorted({p.resolve() for p in (tmp_path / "res" / "smoke").glob("*/sweep.json")})

    (sub,) = [json.loads(p.read_text()) for p in sweeps()]
    assert sub["matrix"]["base"]["steps"] == 4 and [r["label"] for r in sub["plan"]["runs"]] == ["dynamic_bsz"]
    assert "executed 2, cached 0, failed 0" in run("base.steps=4")
    assert "executed 0, cached 1, failed 0" in run("base.steps=4", "--cells", "dynamic")
    assert len(sweeps()) == 2
