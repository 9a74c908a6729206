"""Run each launch as a job on an existing Ray cluster, through Ray's Job Submission API.

:class:`RayJobExecutor` implements :class:`bench.execution.executors.Executor`: one job per run, one after
another (benchmark runs must not share devices). For each run it

- submits the argv (joined with :func:`shlex.join`, run from the run folder: ``cd RUN_DIR && exec ...``)
  with the run's variables (``BENCH_*``, ``PYTHONPATH`` with ``patches/``, the factors' variables,
  ``VERL_FILE_LOGGER_PATH`` ...) as ``runtime_env.env_vars``, so the job's driver and every Ray worker
  it starts see them;
- waits for the job, appending its logs to ``run_dir/run.log`` as they grow (the same file a local run
  writes), and at the end records the job's status, exit code and submission id;
- stops the job at the timeout (``stop_job``) and reports ``timed_out``.

The cluster must see the same paths as the harness (one machine, or a shared filesystem): the run
folder receives the metrics JSONL, profiler output and patch reports, and ``PYTHONPATH`` names this
checkout. ``RAY_OVERRIDE_JOB_RUNTIME_ENV=1`` is set so that verl's own ``ray.init(runtime_env=...)``
inside the job merges with the job's environment instead of failing on a shared variable.

Where the job ran: the result names the node its driver ran on (``driver_node_id`` of the job's info) and
Ray's start/end times of the job. :meth:`RayJobExecutor.pinned` gives an executor whose jobs run on one
given node (``entrypoint_label_selector`` on the node's ``ray.io/node-id`` label; Ray 2.60 has it), which
:mod:`bench.execution.ray_parallel` uses to run the runs of a block at once on distinct nodes; ``cancel`` (a
:class:`threading.Event`) stops a job that a thread is waiting for when the sweep is interrupted.

Token authentication (Ray >= 2.52; on by default for new local clusters in Ray 2.60): the job client
sends the token of :func:`resolve_auth_token` (``$RAY_AUTH_TOKEN``, ``$RAY_AUTH_TOKEN_PATH`` or
``~/.ray/auth_token``); a cluster that refuses gets a one-line error saying how to give one.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import signal
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.core.errors import BenchError
from bench.core.process import ExecResult
from bench.execution.executors import ResolvedLaunch

_TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
#: What a head answers while its job agent is not up yet (retried for ``submit_retry_s`` seconds).
_TRANSIENT_SUBMIT = "No available agent to submit job"
#: the label every Ray node carries with its own node id (``ray._raylet.RAY_NODE_ID_KEY``)
NODE_ID_LABEL = "ray.io/node-id"


def _status_name(status: Any) -> str:
    return str(getattr(status, "value", status)).upper()


def resolve_auth_token(environ: dict[str, str] | None = None) -> tuple[str | None, str]:
    """The Ray authentication token for the job client, and where it came from (for messages only).

    Ray >= 2.52 clusters may require token authentication (Ray 2.60 turns it on by default for a new
    local cluster). Looked up as Ray's own clients do: ``$RAY_AUTH_TOKEN``, else the file
    ``$RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``. The token is sent as an ``authorization: Bearer``
    header by the harness's job client only; it is never put into a run's environment, results or MLflow
    (the job's own processes authenticate with the cluster's settings). ``(None, "")`` when there is none.
    """
    env = os.environ if environ is None else environ
    token = (env.get("RAY_AUTH_TOKEN") or "").strip()
    if token:
        return token, "RAY_AUTH_TOKEN"
    for source, path in (("RAY_AUTH_TOKEN_PATH", env.get("RAY_AUTH_TOKEN_PATH")),
                         ("~/.ray/auth_token", str(Path(env.get("HOME") or Path.home()) / ".ray" / "auth_token"))):
        if not path:
            continue
        try:
            token = Path(path).expanduser().read_text().strip()
        except OSError:
            continue
        if token:
            return token, source
    return None, ""


def submission_id_for(run_dir: Path) -> str:
    """A unique, readable Ray submission id for a run folder (``bench-<cell>-<repeat>-<8 hex>``)."""
    parts = [p for p in (Path(run_dir).parent.name, Path(run_dir).name) if p]
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", "-".join(parts))[:60].strip("-") or "run"
    return f"bench-{stem}-{uuid.uuid4().hex[:8]}"


#: schemes of a ``--ray-address`` (``tcp``: a bare ``HOST:PORT``)
RAY_SCHEMES = ("http", "https", "ray", "tcp")


def ray_address_parts(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``--ray-address`` (``port`` 0 for an ``http(s)://host`` without one, a job server behind
    a proxy); ``None`` for ``auto`` or an empty text. Checks the form only (no connection): run it before anything
    else is read, so that a bad address is named before the matrix's own errors.

    Raises:
        BenchError: not of a Ray address's form (one line in our words, before Ray parses it).
    """
    text = address.strip()
    if text.lower() == "auto" or not text:
        return None
    parts = urlsplit(text if "://" in text else f"tcp://{text}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    portless = port is None and parts.scheme in ("http", "https")  # a job server behind a proxy on 80 / 443
    if parts.scheme not in RAY_SCHEMES or not host or (port is None and not portless) or \
            any(c.isspace() for c in text) or parts.path not in ("", "/"):  # Ray's own words reached the user
        raise BenchError(f"--ray-address {address}: not a Ray address (allowed: http://HOST:PORT, https://HOST:PORT, "
                         "ray://HOST:PORT, HOST:PORT, or auto)")
    return host, port or 0


def refuse_closed_port(address: str, timeout_s: float = 2.0) -> None:
    """Raise :class:`BenchError` at once when ``address`` is not of a Ray address's form (one line in our words,
    before Ray parses it) or nothing listens at its host and port.

    ``address`` is what ``--ray-address`` takes: ``http://host:port`` (the job server), ``ray://host:port`` or a
    bare ``host:port`` (a GCS address, which Ray rewrites to the node's own IP and retries for tens of seconds
    before it gives up). A refused TCP connection is certain to fail whatever Ray tries next; a timeout or any
    other socket error is left to Ray (a firewall may drop the probe but let Ray's protocol through).
    """
    hp = ray_address_parts(address)
    if hp is None or not hp[1]:
        return
    host, port = hp
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except ConnectionRefusedError:
        raise BenchError(f"--ray-address {address}: cannot reach the Ray job server: nothing listens at "
                         f"{host}:{port} (connection refused); start the cluster or fix the address") from None
    except OSError:
        return


class RayJobExecutor:
    """Runs launches as Ray jobs on the cluster at ``address`` (its dashboard, e.g. ``http://HEAD:8265``).

    Args:
        address: Ray dashboard / job server address (``--ray-address``).
        poll_s: seconds between status polls.
        log_every_s: seconds between log fetches while the job runs.
        stop_grace_s: how long to wait for a stopped job to end before giving up on it.
        submit_retry_s: how long to retry a submission the head refuses because its job agent is not up.
        entrypoint_resources: optional ``entrypoint_num_cpus`` / ``entrypoint_num_gpus`` /
            ``entrypoint_resources`` for :meth:`JobSubmissionClient.submit_job`.
        client: a ready client (tests); by default one is created (and the cluster contacted) here.
        cancel: an event that, once set, makes :meth:`execute` stop its job and raise ``KeyboardInterrupt``
            (a sweep interrupted while other threads wait for their jobs).

    Raises:
        BenchError: the job server at ``address`` cannot be reached.
    """

    name = "ray"

    def __init__(self, address: str, *, poll_s: float = 1.0, log_every_s: float = 5.0, stop_grace_s: float = 60.0,
                 entrypoint_resources: dict[str, Any] | None = None, client: Any = None,
                 submit_retry_s: float = 180.0, cancel: threading.Event | None = None) -> None:
        self.address = address
        self.cancel = cancel or threading.Event()
        self.label_selector: dict[str, str] = {}
        self.node: dict[str, str] | None = None
        self.submit_retry_s = submit_retry_s
        self.poll_s = poll_s
        self.log_every_s = log_every_s
        self.stop_grace_s = stop_grace_s
        self.entrypoint_resources = dict(entrypoint_resources or {})
        if client is None:
            refuse_closed_port(address)
            token, source = resolve_auth_token()
            headers = {"authorization": f"Bearer {token}"} if token else None
            try:
                from ray.job_submission import JobSubmissionClient

                client = JobSubmissionClient(address, headers=headers)
            except Exception as exc:  # ConnectionError, RuntimeError, ValueError ...
                msg = " ".join(str(exc).split())[:300]
                if "token" in msg.lower() or "401" in msg or "unauthorized" in msg.lower():
                    hint = (f"the token from {source} was refused" if token else
                            "no token found (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)")
                    raise BenchError(f"--ray-address {address}: the cluster requires Ray token authentication and "
                                     f"{hint}: set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH") from None
                raise BenchError(f"--ray-address {address}: cannot reach the Ray job server: {msg}") from None
        self.client = client
        self.last_submission_id: str | None = None

    def pinned(self, node: dict[str, str], resources: dict[str, float] | None = None) -> "RayJobExecutor":
        """An executor (same client, same ``cancel``) whose jobs run on ``node`` only.

        ``node``: ``{"id": Ray node id (hex), "ip": ..., "name": ...}``; the entrypoint gets the label
        selector ``ray.io/node-id = id`` and, when given, ``resources`` (e.g. ``{"bench_node": 1}``: a custom
        resource every node has one of, so that Ray itself never starts two such jobs on one node).
        """
        other = copy.copy(self)
        other.label_selector = {NODE_ID_LABEL: node["id"]}
        other.node = dict(node)
        other.entrypoint_resources = {**self.entrypoint_resources}
        if resources:
            other.entrypoint_resources["entrypoint_resources"] = {
                **(self.entrypoint_resources.get("entrypoint_resources") or {}), **resources}
        other.last_submission_id = None
        return other

    # ------------------------------------------------------------------------------------- helpers

    @staticmethod
    def entrypoint(launch: ResolvedLaunch) -> str:
        """The job's shell entrypoint: ``cd RUN_DIR && exec ARGV`` (each argument quoted)."""
        return f"cd {shlex.quote(str(launch.run_dir))} && exec {shlex.join(launch.argv)}"

    @staticmethod
    def runtime_env(launch: ResolvedLaunch) -> dict[str, Any]:
        """``{"env_vars": ...}``: the run's variables, plus the flag that lets verl's ray.init merge them."""
        env = {k: str(v) for k, v in launch.env.items()}
        env.setdefault("RAY_OVERRIDE_JOB_RUNTIME_ENV", "1")
        return {"env_vars": env}

    def _append_logs(self, sid: str, log_path: Path, written: int) -> int:
        """Append what the job logged since ``written`` characters; returns the new count."""
        try:
            logs = self.client.get_job_logs(sid) or ""
        except Exception:
            return written
        if len(logs) > written:
            with open(log_path, "a", encoding="utf-8", errors="replace") as fh:
                fh.write(logs[written:])
            written = len(logs)
        return written

    def _info(self, sid: str) -> Any:
        try:
            return self.client.get_job_info(sid)
        except Exception:
            return None

    # ------------------------------------------------------------------------------------- execute

    def execute(self, launch: ResolvedLaunch) -> ExecResult:
        """Submit, wait (stopping the job at the timeout), keep the logs in ``run.log``; never raises for a
        failed job (only for an interrupted harness, after stopping the job)."""
        if self.cancel.is_set():
            raise KeyboardInterrupt("sweep interrupted: no new Ray job")
        log_path = launch.run_dir / "run.log"
        sid = submission_id_for(launch.run_dir)
        self.last_submission_id = sid
        start = time.perf_counter()
        while True:
            try:
                self.client.submit_job(
                    entrypoint=self.entrypoint(launch),
                    submission_id=sid,
                    runtime_env=self.runtime_env(launch),
                    metadata={"bench_run_dir": str(launch.run_dir)},
                    **self.entrypoint_resources,
                    **({"entrypoint_label_selector": self.label_selector} if self.label_selector else {}),
                )
                break
            except Exception as exc:
                msg = " ".join(str(exc).split())[:300]
                # a head that is still starting its job agent answers 500 "No available agent": retry a while
                if _TRANSIENT_SUBMIT in msg and time.perf_counter() - start < self.submit_retry_s:
                    time.sleep(2.0)
                    continue
                with open(log_path, "a") as fh:
                    fh.write(f"[bench] Ray job submission to {self.address} failed: {msg}\n")
                return ExecResult(None, False, time.perf_counter() - start, f"Ray job submission failed: {msg}")

        written = 0
        last_log = time.perf_counter()
        status = "PENDING"
        try:
            while True:
                try:
                    status = _status_name(self.client.get_job_status(sid))
                except Exception:
                    status = "UNKNOWN"
                if status in _TERMINAL:
                    break
                if self.cancel.is_set():
                    raise KeyboardInterrupt(f"sweep interrupted: stopping Ray job {sid}")
                now = time.perf_counter()
                if now - start > launch.timeout_s:
                    self._stop(sid)
                    written = self._append_logs(sid, log_path, written)
                    with open(log_path, "a") as fh:
                        fh.write(f"\n[bench] timed out after {launch.timeout_s:g} s: stopped Ray job {sid}\n")
                    return ExecResult(None, True, time.perf_counter() - start,
                                      f"timed out after {launch.timeout_s:g} s (Ray job {sid} stopped)")
                if now - last_log >= self.log_every_s:
                    written = self._append_logs(sid, log_path, written)
                    last_log = now
                time.sleep(self.poll_s)
        except BaseException:
            self._stop(sid)  # the harness itself was interrupted: leave no job running
            raise
        wall = time.perf_counter() - start
        self._append_logs(sid, log_path, written)
        info = self._info(sid)
        node = self._where(sid, info)
        rc = getattr(info, "driver_exit_code", None)
        message = " ".join(str(getattr(info, "message", "") or "").split())[:300]
        with open(log_path, "a") as fh:
            fh.write(f"\n[bench] Ray job {sid}: {status}" + (f" (exit code {rc})" if rc is not None else "") + "\n")
        if status == "SUCCEEDED":
            return ExecResult(0 if rc is None else rc, False, wall, "", node=node)
        if rc is None:
            rc = 1
        if rc < 0:
            try:
                why = f"killed by {signal.Signals(-rc).name}"
            except ValueError:
                why = f"exit code {rc}"
            if rc == -signal.SIGKILL:
                why = "killed by SIGKILL (out of memory?)"
        elif rc == 137:
            why = "killed by SIGKILL (out of memory?)"
        else:
            why = f"exit code {rc}"
        detail = f"Ray job {sid} {status.lower()}: {why}" + (f"; {message}" if message else "")
        return ExecResult(rc, False, wall, detail, node=node)

    def _where(self, sid: str, info: Any) -> dict[str, Any] | None:
        """The node the job's driver ran on, as Ray reports it (``None`` when Ray names none), with the
        job's submission id and Ray's start/end times of the job (epoch seconds)."""
        node_id = getattr(info, "driver_node_id", None)
        if not node_id:
            return None
        out: dict[str, Any] = {"id": str(node_id), "name": str(node_id)[:8], "submission_id": sid}
        if self.node and self.node.get("id") == node_id:
            out.update({k: v for k, v in self.node.items() if k in ("ip", "name")})
        else:
            host = re.match(r"^\w+://\[?([^\]/]+?)\]?:\d+", str(getattr(info, "driver_agent_http_address", "") or ""))
            if host:
                out["ip"] = host.group(1)
        for key in ("start_time", "end_time"):
            t = getattr(info, key, None)
            if isinstance(t, (int, float)) and t > 0:
                out["job_" + key.split("_")[0]] = t / 1000.0  # Ray reports milliseconds
        return out

    def _stop(self, sid: str) -> None:
        """Stop the job and wait (up to ``stop_grace_s``) until Ray reports it ended."""
        try:
            self.client.stop_job(sid)
        except Exception:
            return
        deadline = time.perf_counter() + self.stop_grace_s
        while time.perf_counter() < deadline:
            try:
                if _status_name(self.client.get_job_status(sid)) in _TERMINAL:
                    return
            except Exception:
                return
            time.sleep(min(self.poll_s, 1.0))
