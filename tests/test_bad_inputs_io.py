"""Bad inputs through the real entry point (``run_bench.py`` in a subprocess): SIGTERM honoured while a large
matrix is parsed, special files never block, and a real MLflow store that loses writes leaves the runs queued
for ``sync`` (never marked as uploaded).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _big_matrix() -> str:
    """Just under the 1 MiB cap: a matrix with a long list of long plain scalars (few nodes, below the node cap,
    but seconds of scanning for the pure-Python parser)."""
    items = "".join("  - " + " ".join(["word"] * 400) + "\n" for _ in range(520))
    text = "name: t\nplatform: cpu\nfactors: {dynamic_bsz: [0, 1]}\nx_notes:\n" + items
    return text[: (1 << 20) - 1024].rsplit("\n", 1)[0] + "\n"


#: the harness's own entry (``bench.cli.main``) after its imports, saying "ready" just before it reads the matrix
_READY = """
import sys
import bench.cli
bench.cli.build_parser()  # every subcommand module imported: what remains is reading and parsing the matrix
print("ready", flush=True)
sys.exit(bench.cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("kind", ["large", "expanding"])
def test_sigterm_during_yaml_parsing_is_honoured_within_2_s(tmp_path, kind):
    """SIGTERM while a 1 MiB matrix is parsed (seconds of work) ends the process within 2 s, nothing written."""
    if kind == "large":
        text = _big_matrix()
    else:  # anchors and aliases: composing it takes seconds before the expansion cap refuses it
        text = "name: t\n" + "".join(f"k{j}: &a{j} [{', '.join(['x'] * 400)}]\n" for j in range(2000))
        text = text[: (1 << 20) - 1024].rsplit("\n", 1)[0] + "\n"
    (tmp_path / "m.yaml").write_text(text)
    proc = subprocess.Popen([sys.executable, "-c", _READY, "run", "m.yaml", "--results", "res", "--dry-run"],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # reading takes milliseconds; parsing 1 MiB takes seconds
        if kind == "expanding" and proc.poll() is not None:  # a fast machine reached the cap first: refused
            assert proc.returncode == 2 and "expands to more than" in proc.stderr.read()
            return
        assert proc.poll() is None, "finished before the signal: the parse was too quick to test"
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        waited = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = proc.stderr.read()
    assert waited < 2.0, f"took {waited:.2f} s after SIGTERM"
    assert not (tmp_path / "res").exists()
    if kind == "expanding" and "expands to more than" in err:
        # the cap was reached just before the signal: the refusal was printed and the interpreter was shutting
        # down (Python restores the default SIGTERM action there), so the exit is 2 or the signal itself
        assert proc.returncode in (2, -signal.SIGTERM), (proc.returncode, err)
        assert "Traceback" not in err
        return
    assert proc.returncode == 143, (proc.returncode, err)
    assert err.strip().startswith("terminated") and "Traceback" not in err
    assert not (tmp_path / "res").exists()


def test_pipe_as_matrix_is_refused_at_once(tmp_path):
    """A FIFO with no writer: refused in seconds, never a blocking read."""
    os.mkfifo(tmp_path / "m.yaml")
    start = time.monotonic()
    p = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), "m.yaml", "--results", "res"], cwd=tmp_path,
                       env=_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and "is a pipe" in p.stderr
    assert time.monotonic() - start < 30
    assert not (tmp_path / "res").exists()


def test_endless_device_as_matrix_is_refused(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), "/dev/zero", "--results", "res"], cwd=tmp_path,
                       env=_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "is a device" in p.stderr and "MemoryError" not in p.stderr, p.stderr


def _lossy_store(path: Path, what: str) -> str:
    """A real MLflow sqlite store whose ``runs`` rows vanish after insert (``what``: ``all`` runs, or only
    ``children``: runs tagged with a parent), as a store that accepts writes and does not keep them."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{path}"
    MlflowClient(uri).search_experiments()  # creates the schema
    con = sqlite3.connect(path)
    if what == "all":
        con.execute("CREATE TRIGGER lose AFTER INSERT ON runs BEGIN DELETE FROM runs WHERE run_uuid = NEW.run_uuid; "
                    "END;")
    else:
        con.execute("CREATE TRIGGER lose AFTER INSERT ON tags WHEN NEW.key = 'mlflow.parentRunId' BEGIN "
                    "DELETE FROM runs WHERE run_uuid = NEW.run_uuid; END;")
    con.commit()
    con.close()
    return uri


@pytest.mark.parametrize("what", ["all", "children"])
def test_store_that_loses_writes_leaves_runs_queued(tmp_path, what):
    """``sync`` to a store that loses its writes: nothing is marked uploaded, the queue stays, exit 1."""
    sys.path.insert(0, str(ROOT / "tests"))
    from _sweeps import EMBEDDED_CELLS, make_sweep

    sweep = make_sweep(tmp_path / "res", "synth", EMBEDDED_CELLS[:2], repeats=2, seed=1)
    meta = json.loads((sweep / "sweep.json").read_text())
    for run in meta["plan"]["runs"]:
        spec = {k: run[k] for k in ("cell_id", "levels", "cells", "not_applicable")}
        spec.update(engine="embedded", platform="cpu", launch={"argv": ["true"]}, timeout_s=60.0)
        (sweep / run["cell_id"] / "spec.json").write_text(json.dumps(spec))
    (sweep / "mlflow_queue.json").write_text(json.dumps({"reason": "outage in the test"}))
    uri = _lossy_store(tmp_path / "lossy.db", what)
    p = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), "sync", "synth", "--results", "res",
                        "--tracking-uri", uri], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "still pending" in p.stdout and "Traceback" not in p.stdout + p.stderr
    assert list(sweep.glob("*/r*/mlflow.json")) == []  # never marked as uploaded
    assert (sweep / "mlflow_queue.json").exists()


ONE_RUN = """\
name: lossy
engine: embedded
platform: cpu
base:
  steps: 2
  warmup_steps: 1
  profile_steps: []
  train_batch_size: 4
  n: 2
  ppo_mini_batch_size: 4
  micro_batch_size_per_gpu: 2
  max_response_length: 16
factors:
  dynamic_bsz: [off]
"""


def test_run_to_a_store_that_loses_child_runs_queues_them_and_sync_uploads_later(tmp_path):
    """A real embedded run whose store keeps the parent but loses every child: the child is not marked as
    uploaded (no ``mlflow.json``), the sweep is queued; once the store keeps writes, ``sync`` uploads it."""
    (tmp_path / "m.yaml").write_text(ONE_RUN)
    db = tmp_path / "lossy.db"
    uri = _lossy_store(db, "children")
    p = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), "m.yaml", "--results", "res", "--spawn",
                        "--tracking-uri", uri], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Traceback" not in p.stdout + p.stderr and "uploads queued" in p.stdout + p.stderr
    assert "MLflow: not uploaded (" in p.stdout and "run `run_bench.py sync" in p.stdout  # no link to a lost run
    sweep = (tmp_path / "res" / "lossy" / "latest").resolve()
    assert list(sweep.glob("*/r0/record.json")) and not list(sweep.glob("*/r0/mlflow.json"))
    assert (sweep / "mlflow_queue.json").exists()
    con = sqlite3.connect(db)
    con.execute("DROP TRIGGER lose")
    con.commit()
    con.close()
    p = subprocess.run([sys.executable, str(ROOT / "run_bench.py"), "sync", "--results", "res", "--tracking-uri",
                        uri], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "in sync" in p.stdout, p.stdout + p.stderr
    assert len(list(sweep.glob("*/r0/mlflow.json"))) == 1 and not (sweep / "mlflow_queue.json").exists()
