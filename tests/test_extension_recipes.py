"""The four recipes of CONTRIBUTING.md, each proved with a toy (tests/extension_toys.py): a new engine,
a new profiler format, a new optimization with its evidence and article figure, a new statistical test.

The end-to-end test runs the real harness in child processes that register the toys first (as a plugin
would): two real sweeps of the toy engine, the report of one and a compare of both with the toy test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
MATRIX = """name: toy
engine: toy
platform: cpu
base:
  steps: 5
  warmup_steps: 1
  profile_steps: [5]
factors:
  toy_opt: [0, 1]
repeats: 2
"""
PLUGIN = ("import sys, extension_toys; extension_toys.register_all(); from bench.cli import main; "
          "sys.exit(main(sys.argv[1:]))")


def bench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", PLUGIN, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_registrations_are_undone():
    """Registering the toys adds them to each registry; unregister_all removes every one."""
    import extension_toys as toys

    from bench.analyze import stat_tests as stats
    from bench.engines import engine_names
    from bench.measure import READERS
    from bench.spec import optimizations

    before = (engine_names(), [r.name for r in READERS], optimizations.FACTOR_KEYS, list(stats.TESTS))
    toys.register_all()
    try:
        assert "toy" in engine_names() and engine_names()[:2] == ["embedded", "verl"]
        assert [r.name for r in READERS][-1] == "toytrace"
        assert optimizations.FACTOR_KEYS[-1] == "toy_opt"
        assert ("toy_opt", 1) == optimizations.article_factors()[0]  # largest article gain first
        assert stats.compare([[1.0, 1.1, 1.2]], [[2.0, 2.1, 2.2]], test="toy welch").test == "toy welch"
    finally:
        toys.unregister_all()
    assert (engine_names(), [r.name for r in READERS], optimizations.FACTOR_KEYS, list(stats.TESTS)) == before


def test_unknown_engine_is_one_line_naming_the_allowed_ones(tmp_path):
    (tmp_path / "m.yaml").write_text(MATRIX.replace("engine: toy", "engine: sglang"))
    proc = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), "m.yaml", "--dry-run"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert (
        proc.stderr.strip().splitlines()[-1].endswith("m.yaml:2: engine: allowed: 'embedded' or 'verl', got 'sglang'")
    )
    assert len(proc.stderr.strip().splitlines()) == 1


def test_toys_run_through_sweep_report_and_compare(tmp_path):
    (tmp_path / "toy.yaml").write_text(MATRIX)
    db = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = ["--results", str(tmp_path / "results"), "--tracking-uri", db]
    dry = bench("run", "toy.yaml", "--dry-run", "--verbose", "--order-seed", "1", *common, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "toy_opt=1" in dry.stdout and "run_config.yaml" in dry.stdout  # shows_config: the toy's config

    first = bench("run", "toy.yaml", *common, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    sweep_a = (tmp_path / "results" / "toy" / "latest").resolve()
    records = [json.loads(p.read_text()) for p in sweep_a.rglob("record.json")]
    assert len(records) == 4 and all(r["status"] == "ok" for r in records)
    for rec in records:  # the toy format's Free ratio, the toy optimization's evidence from the registry
        assert rec["free_ratio"] == {"5": 0.25 if rec["levels"]["toy_opt"] else 0.4}
        assert rec["evidence_verdicts"] == {"toy_opt": "confirmed"}
        assert rec["summary"]["free_ratio_median"] == (0.25 if rec["levels"]["toy_opt"] else 0.4)

    rep = bench("report", str(sweep_a), *common, cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr[-2000:]
    md = next(sweep_a.rglob("report.md")).read_text()
    row = next(line for line in md.splitlines() if line.startswith("| Toy optimization (9.9)"))
    assert row.split(" | ")[1] == "+50.0%"  # the article figure of the registry entry, beside ours

    second = bench("run", "toy.yaml", "--force", *common, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    sweep_b = (tmp_path / "results" / "toy" / "latest").resolve()
    assert sweep_b != sweep_a
    cmp = bench("compare", str(sweep_a), str(sweep_b), "--test", "toy welch", "--bootstrap", "200", *common,
                cwd=tmp_path)
    assert cmp.returncode in (0, 1, 3), cmp.stderr[-2000:]
    gate = json.loads(next((sweep_b / "compare").glob("*.json")).read_text())
    assert gate["settings"]["test"] == "toy welch t (two-sided)"
    assert {r["test"] for r in gate["rows"] if r.get("test")} == {"toy welch"}

    bad = bench("compare", str(sweep_a), str(sweep_b), "--test", "no such test", *common, cwd=tmp_path)
    assert bad.returncode == 2 and "--test no such test: unknown test (allowed: mann-whitney u" in bad.stderr
