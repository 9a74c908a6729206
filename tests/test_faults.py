"""Faults on real (tiny) embedded sweeps: nothing finished is lost, no process of the sweep outlives it.

Covered: SIGKILL and SIGTERM of the harness mid-run then resume; SIGKILL of a run and of the fork
server; a run over its timeout; a real ``mlflow server`` killed mid-sweep (bounded extra wall time,
``sync`` fills MLflow in afterwards); two harnesses on a fresh MLflow database; a results folder on a
small tmpfs that fills up (skipped, with the reason, where mounting is not permitted).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from _tmpfs import mounted_tmpfs

from bench.core.errors import clip_words
from bench.execution.executors import kill_strays
from bench.records.record import ERROR_LINE

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

FAST = """\
name: {name}
engine: embedded
platform: cpu
base:
  steps: 2
  warmup_steps: 1
  profile_steps: {profile}
  train_batch_size: 4
  n: 2
  ppo_mini_batch_size: 4
  micro_batch_size_per_gpu: 2
  max_prompt_length: 96
  max_response_length: 16
  timeout_s: {timeout}
  embedded: {embedded}
factors:
  dynamic_bsz: {levels}
design: full
"""


def matrix(tmp: Path, name: str = "fast", *, levels: str = "[off, on]", profile: str = "[]", timeout: int = 300,
           embedded: str = "{}") -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(FAST.format(name=name, levels=levels, profile=profile, timeout=timeout, embedded=embedded))
    return path


def env() -> dict[str, str]:
    e = {**os.environ, "PYTHONPATH": str(ROOT)}
    e.pop("MLFLOW_TRACKING_URI", None)
    return e


def start(args: list[str], cwd: Path, name: str = "h") -> subprocess.Popen:
    """The harness in its own session (the test can always end its whole group)."""
    out = open(cwd / f"{name}.out", "w")
    err = open(cwd / f"{name}.err", "w")
    return subprocess.Popen([sys.executable, str(ROOT / "run_bench.py"), *args], cwd=cwd, env=env(), stdout=out,
                            stderr=err, start_new_session=True)


def bench(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "run_bench.py"), *args], cwd=cwd, env=env(),
                          capture_output=True, text=True, timeout=timeout)


def sweep_processes(folder: Path, harness_pid: int | None = None) -> list[psutil.Process]:
    """Processes working in ``folder`` (runs) and fork servers of ``harness_pid``."""
    root = str(folder.resolve())
    out = []
    for p in psutil.process_iter():
        try:
            cwd = p.cwd()
            penv = p.environ()
            in_folder = cwd == root or cwd.startswith(root + os.sep) or penv.get("BENCH_RUN_DIR", "").startswith(root)
            server = harness_pid is not None and penv.get("BENCH_HARNESS_PID") == str(harness_pid)
            if (in_folder or server) and p.pid != os.getpid():
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def assert_no_leftovers(folder: Path, harness_pid: int | None = None, wait_s: float = 15.0) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        left = [p for p in sweep_processes(folder, harness_pid) if p.status() != psutil.STATUS_ZOMBIE]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, [(p.pid, p.cmdline()[:4]) for p in left]


def wait_for(cond, timeout: float, proc: subprocess.Popen | None = None, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"harness ended (rc {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def records(res: Path, name: str = "fast") -> dict[str, dict]:
    return {str(p.parent.relative_to(p.parent.parent.parent)): json.loads(p.read_text())
            for p in res.glob(f"{name}/2*/*/r*/record.json")}


def runs_of(uri: str, experiment: str):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=1000) if exp else []
    return ([r for r in runs if r.data.tags.get("bench.kind") == "sweep"],
            [r for r in runs if r.data.tags.get("bench.kind") == "cell"])


@pytest.fixture()
def box(tmp_path):
    """Working folder; every process left in it is ended at teardown (by PID / process group)."""
    procs: list[subprocess.Popen] = []
    yield tmp_path, procs
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=30)
    kill_strays(tmp_path)


def _second_run_started(res: Path) -> bool:
    """One run finished and the other's folder exists (its process is running)."""
    recs = list(res.glob("fast/2*/*/r0/record.json"))
    dirs = [d for d in res.glob("fast/2*/*/r0") if (d / "run_config.yaml").exists()]
    return len(recs) == 1 and len(dirs) == 2


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_harness_killed_mid_run_then_resume(box, sig):
    tmp, procs = box
    m = matrix(tmp, embedded="{update_delay_s: 3.0}")  # each run takes > 6 s: the kill lands mid-run
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    h = start([str(m), "--results", "res", "--tracking-uri", uri], tmp)
    procs.append(h)
    wait_for(lambda: _second_run_started(tmp / "res"), 400, h, "the second run started")
    assert sweep_processes(tmp / "res", h.pid), "the second run should be running"
    before = records(tmp / "res")
    os.kill(h.pid, sig)  # the harness only: its runs and fork server must follow it
    rc = h.wait(timeout=60)
    assert_no_leftovers(tmp / "res", h.pid)
    finished = records(tmp / "res")
    assert len(before) == 1 and before.items() <= finished.items()  # nothing finished is lost
    assert all(r["status"] == "ok" for r in finished.values())
    if sig == signal.SIGTERM:
        err = (tmp / "h.err").read_text().strip().splitlines()
        assert rc == 143 and len(err) == 1 and err[0].startswith("terminated:"), err
        meta = json.loads(next((tmp / "res").glob("fast/2*/sweep.json")).read_text())
        assert meta["status"] == "interrupted"
    else:
        assert rc == -signal.SIGKILL
    # a run a dead harness could not take with it (say, a daemonized grandchild): the resume ends it first
    sweep = next((tmp / "res").glob("fast/2*"))
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], cwd=tmp,
                             env={**env(), "BENCH_RUN_DIR": str(sweep / "x" / "r0")}, start_new_session=True)
    procs.append(stray)
    p = bench([str(m), "--results", "res", "--tracking-uri", uri], tmp)
    assert stray.poll() is not None or not psutil.pid_exists(stray.pid)
    assert "ended 1 process(es) of an earlier harness" in p.stdout
    assert p.returncode == 0, p.stdout + p.stderr
    n = len(finished)
    assert f"executed {2 - n}, cached {n}, failed 0" in p.stdout
    assert_no_leftovers(tmp / "res")
    parents, children = runs_of(uri, "fast")
    assert len(parents) == 1 and len(children) == 2
    assert {c.data.tags["status"] for c in children} == {"ok"}


def test_run_and_fork_server_killed_and_a_run_over_its_timeout(box):
    """Four runs: the first is SIGKILLed, the fork server dies under the second, the third dies of SIGSEGV after its
    log's last line became "Creating file logger at ..." (its reason must not quote that line), the last is ok; then
    a run of another sweep times out."""
    tmp, procs = box
    m = matrix(tmp, levels="[off, on]", embedded="{update_delay_s: 2.5}", timeout=60)
    m2 = tmp / "fast.yaml"
    m2.write_text(m.read_text() + "repeats: 2\n")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    h = start([str(m2), "--results", "res", "--tracking-uri", uri], tmp)
    procs.append(h)
    res = tmp / "res"

    def running_run():
        for d in sorted(res.glob("fast/2*/*/r*")):
            if (d / "run.log").exists() and not (d / "record.json").exists():
                for p in sweep_processes(d):
                    if p.cwd() == str(d.resolve()):
                        return d, p
        return None

    # 1. SIGKILL of the run itself
    wait_for(lambda: running_run() is not None, 400, h, "a run started")
    d1, worker = running_run()
    worker.send_signal(signal.SIGKILL)
    wait_for(lambda: (d1 / "record.json").exists(), 120, h, "the killed run was recorded")
    rec1 = json.loads((d1 / "record.json").read_text())
    assert rec1["status"] == "failed" and "killed by signal 9 (SIGKILL)" in rec1["reason"]
    assert "out of memory" not in rec1["reason"] and rec1["failure_kind"] != "oom"

    # 2. SIGKILL of the fork server while the next run is in progress: the run dies with it
    wait_for(lambda: running_run() is not None and running_run()[0] != d1, 120, h, "the next run started")
    d2, worker2 = running_run()
    server = next(p for p in psutil.process_iter() if _is_server_of(p, h.pid))
    server.send_signal(signal.SIGKILL)
    wait_for(lambda: (d2 / "record.json").exists(), 120, h, "the run under the dead server was recorded")
    assert not psutil.pid_exists(worker2.pid) or worker2.status() == psutil.STATUS_ZOMBIE
    rec2 = json.loads((d2 / "record.json").read_text())
    assert rec2["status"] == "failed" and "fork server died" in rec2["reason"]

    # 3. SIGSEGV of a run whose log ends with an unrelated line: the reason is the signal (and an error line of the
    # log, if any), never that last line
    def logging_run():
        got = running_run()
        if got is None or got[0] in (d1, d2):
            return None
        log = (got[0] / "run.log").read_text(errors="replace")
        return got if "Creating file logger at" in log and "phase breakdown" not in log else None

    wait_for(lambda: logging_run() is not None, 120, h, "the third run logged its file logger line")
    d3, worker3 = logging_run()
    worker3.send_signal(signal.SIGSEGV)
    wait_for(lambda: (d3 / "record.json").exists(), 120, h, "the segfaulted run was recorded")
    rec3 = json.loads((d3 / "record.json").read_text())
    reason3 = rec3["reason"]
    assert rec3["status"] == "failed" and rec3["failure_kind"] == "crash" and rec3["returncode"] == -signal.SIGSEGV
    assert reason3.startswith("killed by signal 11 (SIGSEGV)") and "Creating file logger" not in reason3, reason3
    log3 = (d3 / "run.log").read_text(errors="replace")
    assert "Creating file logger at" in log3  # the trap was there
    if reason3 != "killed by signal 11 (SIGSEGV)":  # an error line of the log follows, quoted whole
        quoted = reason3.removeprefix("killed by signal 11 (SIGSEGV): ")
        assert ERROR_LINE.search(quoted) and quoted in log3, reason3
    rc = h.wait(timeout=600)
    assert rc == 1
    assert_no_leftovers(res, h.pid)
    recs = records(res)
    assert len(recs) == 4  # the sweep went on: every run recorded
    assert sum(r["status"] == "ok" for r in recs.values()) == 1
    # what the user sees: the run's line on the console, summary.md, and the MLflow child's tag
    line = next(ln for ln in (tmp / "h.out").read_text().splitlines() if "crash: killed by signal 11" in ln)
    assert line.endswith(f"crash: {clip_words(reason3, 100)}"), line
    assert f"crash: {reason3}" in (d3.parent.parent / "summary.csv").read_text()
    _, children = runs_of(uri, "fast")
    (child3,) = [c for c in children if c.data.tags["cell_id"] == d3.parent.name
                 and c.data.tags["repeat"] == d3.name.removeprefix("r")]
    assert child3.data.tags["failure_reason"] == reason3

    # 4. a run over its timeout: killed at the limit, recorded as timeout, nothing left running
    mt = matrix(tmp, name="slow", levels="[off]", embedded="{update_delay_s: 60.0}", timeout=8)
    t0 = time.monotonic()
    p = bench([str(mt), "--results", "res", "--tracking-uri", uri], tmp)
    assert p.returncode == 1, p.stdout + p.stderr
    (rec,) = records(res, "slow").values()
    assert rec["failure_kind"] == "timeout" and "timed out after 8 s" in rec["reason"]
    assert 8 <= rec["wall_s"] < 8 + 20  # killed at its limit (SIGTERM, then SIGKILL after 2 s at most)
    assert time.monotonic() - t0 < 600
    assert_no_leftovers(res)


def _is_server_of(p: psutil.Process, harness_pid: int) -> bool:
    try:
        return ("bench.execution.forkserver" in " ".join(p.cmdline())
                and p.environ().get("BENCH_HARNESS_PID") == str(harness_pid))
    except (psutil.Error, OSError):
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mlflow_server(tmp: Path, port: int) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                               f"sqlite:///{tmp / 'server.db'}", "--host", "127.0.0.1", "--port", str(port),
                               "--workers", "1", "--artifacts-destination", str(tmp / "artifacts")],
                              cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            import urllib.request

            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
            return server
        except OSError:
            assert server.poll() is None, "mlflow server did not start"
            time.sleep(1)
    raise AssertionError("mlflow server did not answer within 180 s")


def _stop(server: subprocess.Popen) -> None:
    try:
        os.killpg(server.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.wait(timeout=30)


def test_mlflow_server_killed_mid_sweep_costs_seconds_and_sync_fills_it_in(box):
    tmp, procs = box
    port = _free_port()
    server = _mlflow_server(tmp, port)
    procs.append(server)
    uri = f"http://127.0.0.1:{port}"
    m = matrix(tmp, levels="[off, on]")
    h = start([str(m), "--results", "res", "--tracking-uri", uri], tmp)
    procs.append(h)
    wait_for(lambda: len(list((tmp / "res").glob("fast/2*/*/r*/mlflow.json"))) == 1, 400, h, "one run logged")
    _stop(server)
    killed_at = time.time()
    rc = h.wait(timeout=600)
    ended_at = time.time()
    out = (tmp / "h.out").read_text()
    assert rc == 0, out + (tmp / "h.err").read_text()
    recs = records(tmp / "res")
    assert len(recs) == 2 and all(r["status"] == "ok" for r in recs.values())
    # extra wall time: the time after the kill not spent running the remaining runs
    in_runs = sum(
        r["finished_at"] - max(r["started_at"], killed_at) for r in recs.values() if r["finished_at"] > killed_at
    )
    extra = (ended_at - killed_at) - in_runs
    assert extra < 30, f"MLflow outage cost {extra:.1f} s"
    sweep = (tmp / "res" / "fast" / "latest").resolve()
    assert (sweep / "mlflow_queue.json").exists()
    assert len(list(sweep.glob("*/r*/mlflow.json"))) == 1
    # what the user is told of the outage: our words (what the server did), never the library's exception, never a
    # word cut; the sweep's last lines say where the uploads are queued
    told = [ln for ln in out.splitlines() if "MLflow unreachable (" in ln or "MLflow: not uploaded (" in ln]
    assert any(ln.startswith("MLflow: not uploaded (") and "; queued in" in ln for ln in told), out
    ours = re.compile(rf"(?:MLflow unreachable|not uploaded) \(the tracking server {re.escape(uri)} (?:refused the "
                      r"connection|closed the connection|did not answer within \d+ s)\)(?::|;) ")
    for ln in told:
        assert ours.search(ln), ln
        assert not re.search(r"Exception|Error|HTTPConnection|Max retries|Caused by|\.\.\.", ln), ln

    # the server comes back: sync fills MLflow in, and a second sync changes nothing
    server2 = _mlflow_server(tmp, port)
    procs.append(server2)
    p = bench(["sync", "fast", "--results", "res"], tmp)
    assert p.returncode == 0, p.stdout + p.stderr
    assert not (sweep / "mlflow_queue.json").exists()
    p2 = bench(["sync", "fast", "--results", "res"], tmp)
    assert p2.returncode == 0 and "logged 0 child run(s)" in p2.stdout, p2.stdout
    parents, children = runs_of(uri, "fast")
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert parent.info.status == "FINISHED" and "harness_overhead_share" in parent.data.metrics
    by_key = {(c.data.tags["cell_id"], int(c.data.tags["repeat"])): c for c in children}
    for key, rec in recs.items():
        cell, rep = key.split("/")
        child = by_key[(cell, int(rep[1:]))]
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.info.status == "FINISHED"
        assert child.data.metrics["step_time_s"] == pytest.approx(rec["summary"]["step_time_median_s"])
        assert child.data.params["factor.dynamic_bsz"] == str(rec["levels"]["dynamic_bsz"])
    _stop(server2)
    assert_no_leftovers(tmp / "res")


def test_two_harnesses_on_a_fresh_database(box):
    """Two matrices at once on one fresh sqlite store both finish; the same matrix twice: one is refused."""
    tmp, procs = box
    uri = f"sqlite:///{tmp / 'fresh.db'}"
    a, b = matrix(tmp, "ma", levels="[off]"), matrix(tmp, "mb", levels="[off]")
    hs = [start([str(x), "--results", "res", "--tracking-uri", uri], tmp, name=n)
          for x, n in ((a, "a"), (b, "b"), (a, "a2"))]
    procs.extend(hs)
    rcs = [h.wait(timeout=600) for h in hs]
    errs = {n: (tmp / f"{n}.err").read_text() for n in ("a", "b", "a2")}
    assert "Traceback" not in "".join(errs.values())
    assert rcs[1] == 0, errs["b"]
    assert sorted([rcs[0], rcs[2]]) == [0, 2], (rcs, errs)
    refused = errs["a"] if rcs[0] == 2 else errs["a2"]
    assert len(refused.strip().splitlines()) == 1 and "another harness is running" in refused
    for name in ("ma", "mb"):
        parents, children = runs_of(uri, name)
        assert len(parents) == 1 and len(children) == 1
    for h in hs:
        assert_no_leftovers(tmp / "res", h.pid)


@pytest.fixture()
def small_tmpfs(tmp_path):
    with mounted_tmpfs(tmp_path / "small", "24m") as mnt:
        try:
            yield mnt
        finally:
            kill_strays(mnt)  # before the unmount: nothing of the sweep may outlive it


def test_results_on_a_small_tmpfs_that_fills_up(box, small_tmpfs):
    """A profiled run writes about 19 MB: the first fits in 24 MiB, the second fills the disk."""
    tmp, procs = box
    m = matrix(tmp, levels="[off, on]", profile="[1]")  # step 2 stays timed
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    res = small_tmpfs / "res"
    p = bench([str(m), "--results", str(res), "--tracking-uri", uri], tmp)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 1, p.stdout + p.stderr
    assert len(err) == 1 and "disk full" in err[0] and "MiB needed" in err[0], err
    need = re.search(r"about ([\d.]+) MiB needed", err[0])
    assert need and float(need.group(1)) > 0, err[0]  # issue 33: it said "about 0 MiB needed"
    sweep = next(res.glob("fast/2*"))
    assert str(sweep) in err[0]
    recs = records(res)
    assert sum(r["status"] == "ok" for r in recs.values()) == 1  # the finished run is kept
    meta = json.loads((sweep / "sweep.json").read_text())
    assert meta["status"] == "failed"
    parents, _ = runs_of(uri, "fast")
    assert len(parents) == 1 and parents[0].info.status == "FAILED"
    assert_no_leftovers(res)
    # more space: the rerun resumes and runs only what is missing
    subprocess.run(["mount", "-o", "remount,size=96m", str(small_tmpfs)], check=True)
    p = bench([str(m), "--results", str(res), "--tracking-uri", uri], tmp)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "executed 1, cached 1, failed 0" in p.stdout
    parents, children = runs_of(uri, "fast")
    assert len(parents) == 1 and len(children) == 2 and parents[0].info.status == "FINISHED"
