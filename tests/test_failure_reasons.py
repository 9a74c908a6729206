"""A failed run's reason and the MLflow outage line (issue 33): never an unrelated log line, never cut mid-word."""

from __future__ import annotations

from bench.core.errors import clip_words
from bench.core.process import ExecResult
from bench.records.record import _failure
from bench.tracking import Tracker


def test_a_crash_quotes_the_last_error_line_not_an_unrelated_last_line(tmp_path):
    (tmp_path / "run.log").write_text("step 3/10\nFatal Python error: Segmentation fault\n"
                                      "Creating file logger at /x/metrics.jsonl\n")
    kind, reason = _failure(tmp_path, ExecResult(returncode=-11, timed_out=False, wall_s=3.0,
                                                 reason="killed by signal 11 (SIGSEGV)"))
    assert kind == "crash"
    assert reason == "killed by signal 11 (SIGSEGV): Fatal Python error: Segmentation fault"


def test_a_crash_without_an_error_line_gives_the_executor_reason_alone(tmp_path):
    (tmp_path / "run.log").write_text("step 3/10\nCreating file logger at /x/metrics.jsonl\n")
    kind, reason = _failure(tmp_path, ExecResult(returncode=-11, timed_out=False, wall_s=3.0,
                                                 reason="killed by signal 11 (SIGSEGV)"))
    assert (kind, reason) == ("crash", "killed by signal 11 (SIGSEGV)")


def test_clip_words_cuts_between_words():
    text = "MlflowException: API request to http://127.0.0.1:5000/api failed with exception Read timed out"
    got = clip_words(text, 80)
    assert len(got) <= 80 and got.endswith("...") and text.startswith(got[:-3])
    assert text[len(got) - 3] == " "  # the cut falls on a space: no word is cut
    assert clip_words("short text", 80) == "short text"
    assert clip_words("x" * 100, 10) == "x" * 7 + "..."
    # a short head then a long path: the path is cut at the limit, the head is not left alone
    path = "r0 bad_input: /tmp/" + "d" * 200 + "/broken.parquet is not a parquet file"
    assert clip_words(path, 80) == path[:77] + "..."


def test_an_unknown_outage_reason_is_never_cut_mid_word():
    t = Tracker.__new__(Tracker)
    t.down = None
    why = t.mark_down(RuntimeError("storage quota reached " * 40))
    assert len(why) <= 300 and why.endswith("...")
    assert why[:-3].split()[-1] in ("storage", "quota", "reached")  # a whole word before the mark


#: MLflow's own texts for a stopped server (as the harness met them), and what the user is told instead
_MLFLOW = "API request to {u}/api/2.0/mlflow/runs/search failed with exception HTTPConnectionPool(host='127.0.0.1', "
_OUTAGES = [
    (_MLFLOW + "port=5000): Max retries exceeded with url: /api/2.0/mlflow/runs/search (Caused by NewConnectionError("
     "\"HTTPConnection(host='127.0.0.1', port=5000): Failed to establish a new connection: [Errno 111] Connection "
     "refused\"))", "refused the connection"),
    (_MLFLOW + "port=5000): Read timed out. (read timeout=10)", "did not answer within 10 s"),
    (_MLFLOW + "port=5000): Max retries exceeded with url: /x (Caused by ResponseError('too many 503 error "
     "responses'))", "answered HTTP 503"),
    (_MLFLOW + "port=5000): Max retries exceeded with url: /x (Caused by ProtocolError('Connection aborted.', "
     "RemoteDisconnected('Remote end closed connection without response')))", "closed the connection"),
]


def test_an_mlflow_outage_is_told_in_our_words():
    """A stopped MLflow server used to end a sweep with "not uploaded (MlflowException: ... Read tim); queued"."""
    from mlflow.exceptions import MlflowException

    uri = "http://127.0.0.1:5000"
    for text, what in _OUTAGES:
        t = Tracker.__new__(Tracker)
        t.down, t.uri = None, uri
        assert t.mark_down(MlflowException(text.format(u=uri))) == f"the tracking server {uri} {what}"
    t = Tracker.__new__(Tracker)
    t.down, t.uri = None, "http://user:secret@h:5000"
    assert t.mark_down(ConnectionRefusedError(111, "Connection refused")) == ("the tracking server http://h:5000 "
                                                                            "refused the connection")  # no password
