"""The start-up probe of an http tracking server is bounded (issue 33): a server on 127.0.0.1 that answers
``/health`` but never the MLflow API is refused within the documented limit, in one line."""

from __future__ import annotations

import contextlib
import http.server
import threading
import time

import pytest

from bench.core.errors import BenchError
from bench.tracking.store import PROBE_TIMEOUT_S, check_tracking_uri


@contextlib.contextmanager
def _serving(handler: type[http.server.BaseHTTPRequestHandler]):
    """A threaded HTTP server on 127.0.0.1 with ``handler``; yields its URL, stopped on exit."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(10)


@pytest.fixture
def half_server():
    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path == "/health":
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"OK")
                return
            release.wait(60)  # the API never answers while the test runs

        def log_message(self, *a):
            pass

    with _serving(Handler) as url:
        try:
            yield url
        finally:
            release.set()  # before the server stops: its handler threads wait on it


def test_a_server_that_answers_health_but_not_the_api_is_refused_in_bounded_time(half_server):
    t0 = time.monotonic()
    with pytest.raises(BenchError) as exc:
        check_tracking_uri(half_server)
    took = time.monotonic() - t0
    assert "answers /health but not the MLflow API within 5 s" in str(exc.value)
    assert "\n" not in str(exc.value)
    assert took < 3 * PROBE_TIMEOUT_S, took  # bounded by the probe's own deadline (was 41 s); slack for a busy machine


def test_a_closed_port_is_unreachable(half_server):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BenchError, match="tracking server unreachable within 5 s"):
        check_tracking_uri(f"http://127.0.0.1:{port}")


@pytest.mark.parametrize("uri, needle", [
    ("sqlite:////proc/mlflow.db", "inside /proc, a kernel file system"),
    ("sqlite+pysqlite:////sys/kernel/mlflow.db", "inside /sys, a kernel file system"),
    ("sqlite:///res/", "names a folder (allowed: sqlite:///PATH to a database file"),
])
def test_a_sqlite_store_where_nothing_can_be_kept_is_refused_at_once(tmp_path, monkeypatch, capsys, uri, needle):
    """A sqlite store on a kernel file system or given as a folder (issue 33: run failed after 127 s, sync still
    running at 60 s) is refused by the real entry point before anything is written: exit 2, one line."""
    from bench.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.yaml").write_text("name: m\nengine: embedded\nbase: {steps: 2}\n")
    for argv in (["run", "m.yaml"], ["sync"]):
        t0 = time.monotonic()
        assert main([*argv, "--results", str(tmp_path / "res"), "--tracking-uri", uri]) == 2
        assert time.monotonic() - t0 < 30
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "res").exists()


@pytest.fixture
def health_only_server():
    """A server on 127.0.0.1 that answers ``/health`` with 200 and every other path with a plain 404."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            ok = self.path == "/health"
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(b"OK" if ok else b"nope")

        def log_message(self, *a):
            pass

    with _serving(Handler) as url:
        yield url


def test_a_server_that_is_not_mlflow_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys,
                                                                           health_only_server):
    """Its 404 at the API path was taken for MLflow's "no such experiment": ``run`` made ``results/<name>/.lock``,
    then failed in MLflow's words (the fresh trial of issue 33)."""
    from _badinput import GOOD

    from bench.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.yaml").write_text(GOOD)
    assert main(["run", "m.yaml", "--results", "res", "--tracking-uri", health_only_server]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "answers /health but not the MLflow API (HTTP 404" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.yaml"]
