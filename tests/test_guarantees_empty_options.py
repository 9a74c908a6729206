"""A value given but empty is refused by the argument's name (issue 48): ``report --out ''`` and ``gate --out ''``
wrote into the current folder (``Path('')`` is ``.``); ``run ''``, ``report ''`` and ``sync ''`` named "." or an empty
name. One argparse type, :func:`bench.commands.base.given`, holds every such argument.
"""
# ruff: noqa: F811 - the fixtures come from _badinput; tests take them as parameters

from __future__ import annotations

import os

import pytest
from _badinput import box, check_refused, sweep_box  # noqa: F401 - fixtures
from _cli import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MANY = settings(max_examples=int(os.environ.get("BENCH_HYPOTHESIS_EXAMPLES", "20")), deadline=None,
                derandomize=True, suppress_health_check=list(HealthCheck))

#: argv with ``{e}`` where the empty value goes -> the argument the line names
CASES = {
    "report --out": (["report", "synth", "--results", "res", "--out", "{e}"], "argument --out"),
    "gate --out": (["gate", "--candidate", "synth", "--baseline", "synth", "--results", "res", "--out", "{e}"],
                   "argument --out"),
    "compare --out": (["compare", "synth", "synth", "--results", "res", "--out", "{e}"], "argument --out"),
    "run": (["run", "{e}", "--results", "res"], "argument matrix"),
    "tune": (["tune", "{e}", "--results", "res"], "argument matrix"),
    "report": (["report", "{e}", "--results", "res"], "argument sweep"),
    "sync": (["sync", "{e}", "--results", "res"], "argument sweep"),
    "compare": (["compare", "synth", "{e}", "--results", "res"], "argument SWEEP_B"),
    "baseline show": (["baseline", "show", "{e}", "--results", "res"], "argument target"),
    "gate --candidate": (["gate", "--candidate", "{e}", "--baseline", "synth", "--results", "res"],
                         "argument --candidate"),
    "gate --baseline": (["gate", "--candidate", "synth", "--baseline", "{e}", "--results", "res"],
                        "argument --baseline"),
    "history --out": (["history", "b", "--results", "res", "--out", "{e}"], "argument --out"),  # the trial
    "history": (["history", "{e}", "--results", "res"], "argument NAME"),
}


@pytest.mark.parametrize("case", ["report --out", "gate --out", "run", "report", "sync", "history --out"])
def test_an_empty_value_is_refused_by_name(sweep_box, case):
    argv, name = CASES[case]
    cli(sweep_box, [a.replace("{e}", "") for a in argv], (name, "'' is empty"))


def test_any_empty_or_blank_value_is_refused(sweep_box, capsys):
    """Property through :func:`bench.cli.main`: every named value, given as an empty or blank text, exit 2, one line
    naming the argument, nothing written (the report folder included)."""

    @MANY
    @given(st.sampled_from(sorted(CASES)), st.sampled_from(["", " ", "\t", "  \n"]))
    def prop(case, empty):
        argv, name = CASES[case]
        check_refused(sweep_box, [a.replace("{e}", empty) for a in argv], capsys, (name, "is empty"))

    prop()
