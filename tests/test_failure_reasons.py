"""A failed run's reason and the MLflow outage line (issue 33): never an unrelated log line, never cut mid-word."""

from __future__ import annotations

from bench.core.errors import clip_words
from bench.execution.executors import ExecResult
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


def test_the_outage_reason_is_never_cut_mid_word():
    t = Tracker.__new__(Tracker)
    t.down = None
    why = t.mark_down(RuntimeError("Read timed out " * 40))
    assert len(why) <= 300 and why.endswith("...")
    assert why[:-3].split()[-1] in ("Read", "timed", "out")  # a whole word before the mark
