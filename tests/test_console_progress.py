"""The console of ``run`` in a CI log (stdout piped): live progress as plain lines, an ETA from measured run
times, what a run is doing, no control characters, and a final table whose labels never wrap."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.execution.progress import LiveProgress, eta_s, fmt_duration

ROOT = Path(__file__).resolve().parent.parent
PROGRESS = re.compile(r"^\[\s*(\d+)s\] (.*)$")


def test_eta_is_mean_finished_wall_times_remaining():
    assert eta_s([], 5) is None  # nothing finished: no estimate ("ETA ?")
    assert eta_s([10.0, 20.0], 3) == 45.0
    assert eta_s([10.0, 20.0], 3, current_elapsed=5.0) == 40.0
    assert eta_s([10.0], 1, current_elapsed=30.0) == 0.0  # never negative
    assert [fmt_duration(x) for x in (None, 4.4, 65, 3 * 3600 + 120)] == ["?", "4s", "1m 05s", "3h 02m"]


def test_plain_progress_prints_changes_and_a_heartbeat():
    import io

    from rich.console import Console

    buf = io.StringIO()
    live = LiveProgress(Console(file=buf, force_terminal=False, width=160), noun="run", heartbeat_s=0.3, tick_s=0.05)
    live.start("warming up", total=2)
    live.begin("all-off r0", lambda: "step 1/3")
    import time

    time.sleep(0.8)  # no change: heartbeat lines repeat the status
    live.finish()
    live.begin("dynamic_bsz r0", lambda: "step 2/3")
    live.stop()
    lines = buf.getvalue().splitlines()
    assert lines[0].endswith("] warming up | 0/2 done, ETA ?")
    assert sum(ln.endswith("] run 1/2 all-off r0: step 1/3 | 0/2 done, ETA ?") for ln in lines) >= 2
    last = lines[-1]
    assert "run 2/2 dynamic_bsz r0: step 2/3 | 1/2 done, ETA " in last and "ETA ?" not in last


@pytest.mark.slow
def test_run_piped_to_a_file_shows_progress_eta_and_an_unwrapped_table(tmp_path):
    """A real 2-cell embedded sweep (smoke settings, 2 steps) with stdout piped at COLUMNS=80, as in a CI log."""
    text = (ROOT / "matrix" / "smoke.yaml").read_text().replace("name: smoke", "name: smokeprog")
    text = text.replace("design: full", "design:\n  type: explicit\n  cells:\n    - {}\n"
                        "    - {rmsnorm_fused: on, dynamic_bsz: on}")
    text = text.replace("factors:\n", "factors:\n  rmsnorm_fused: [off, on]\n")
    (tmp_path / "prog.yaml").write_text(text)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80", "FORCE_COLOR": "1"}  # FORCE_COLOR: still plain
    env.pop("MLFLOW_TRACKING_URI", None)
    with open(tmp_path / "log.txt", "w") as log:
        p = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), "prog.yaml", "base.steps=2",
                            "base.profile_steps=[1]", "--results", "res", "--tracking-uri",
                            f"sqlite:///{tmp_path}/mlflow.db"], cwd=tmp_path, env=env, stdout=log,
                           stderr=subprocess.PIPE, text=True, timeout=600)
    out = (tmp_path / "log.txt").read_text()
    assert p.returncode == 0, p.stderr[-2000:]
    assert "\x1b" not in out and "\r" not in out  # no ANSI codes, no redrawn lines
    lines = out.splitlines()
    prog = [(int(m.group(1)), m.group(2)) for m in map(PROGRESS.match, lines) if m]
    texts = [t for _, t in prog]
    assert texts[0].startswith("opening the results folder and the MLflow store")
    # the first run: its label, what it is doing, and no estimate before a run has finished
    first = [t for t in texts if t.startswith("run 1/2 ")]
    # each line says what the run is doing (its steps are under a second here, so which step a line
    # catches depends on the machine: any "step k/2", starting or measuring)
    assert first and all(re.fullmatch(r"run 1/2 \S+ r0: \S.* \| 0/2 done, ETA \?", t) for t in first)
    assert all(m is None or m.group(1) in "12" for m in (re.search(r": step (\d)/2 \|", t) for t in first))
    label1 = first[0].split(" ")[2]
    # the second run: an ETA from the first run's measured wall time
    second = [t for t in texts if t.startswith("run 2/2 ")]
    assert second and all(re.search(r"\| 1/2 done, ETA (\d+s|\d+m \d\ds)$", t) for t in second)
    assert {label1, second[0].split(" ")[2]} == {"all-off", "rmsnorm_fused+dynamic_bsz"}
    # never silent for long: consecutive progress lines while runs execute (a busy machine may stretch them)
    stamps = [s for s, _ in prog]
    assert max(b - a for a, b in zip(stamps, stamps[1:])) <= 30
    # the final table: one line per cell, every label whole at the start of its line, nothing wrapped
    table = lines[lines.index("cells") + 1:]
    assert table[0].split()[:3] == ["cell", "rmsnorm_fused", "dynamic_bsz"] and set(table[1]) <= {"-", " "}
    assert [r.split()[0] for r in table[2:4]] == ["all-off", "rmsnorm_fused+dynamic_bsz"]
    assert all(r.split()[-1] == "ok" for r in table[2:4])
    assert table[4].startswith("sweep folder: ")
