"""A bad flag is named before the matrix's own errors (issue 48's trial): ``run --budget 31d``, ``--budget ''``,
``--precision -1``, ``--cells ''``, ``--ray-address ray://127.0.0.1`` and ``--precision 0.02 --budget 1h`` on a
matrix whose model path does not exist named the model, not the flag. The flags' forms are now checked first
(:func:`bench.commands.run_planning.check_planning_flags`, :func:`bench.commands.run.cell_patterns`,
:func:`bench.execution.ray_executor.ray_address_parts`), before the matrix is read.
"""
# ruff: noqa: F811 - the fixtures come from _badinput; tests take them as parameters

from __future__ import annotations

import os

import pytest
from _badinput import GOOD, box, check_refused  # noqa: F401 - fixtures
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MANY = settings(max_examples=int(os.environ.get("BENCH_HYPOTHESIS_EXAMPLES", "20")), deadline=None,
                derandomize=True, suppress_health_check=list(HealthCheck))

#: GOOD with a model path that does not exist: the matrix's own error, which must not win over a bad flag
DECOY = GOOD.replace("base:\n", "base:\n  model: ./no-such-model-folder\n")

#: the trial's six cases: extra argv -> what the one line must name
CASES = {
    "budget 31d": (["--budget", "31d"], "--budget"),
    "budget empty": (["--budget", ""], "--budget"),
    "precision -1": (["--precision", "-1"], "--precision"),
    "cells empty": (["--cells", ""], "--cells"),
    "ray address without port": (["--ray-address", "ray://127.0.0.1"], "--ray-address"),
    "precision and budget": (["--precision", "0.02", "--budget", "1h"], "--precision and --budget"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_flag_is_named_before_the_matrix_error(box, capsys, case):
    extra, names = CASES[case]
    (box / "m.yaml").write_text(DECOY)
    for dry in ([], ["--dry-run"]):
        line = check_refused(box, ["run", "m.yaml", *dry, *extra], capsys, names)
        assert "no-such-model-folder" not in line, line


def test_without_a_bad_flag_the_decoy_model_is_what_is_named(box, capsys):
    (box / "m.yaml").write_text(DECOY)
    check_refused(box, ["run", "m.yaml"], capsys, "no-such-model-folder")


@MANY
@given(junk=st.text(st.characters(codec="ascii", categories=("L", "N", "P")), min_size=1, max_size=12)
       .filter(lambda t: not any(c.isdigit() for c in t)))
def test_any_budget_without_a_number_is_named_before_the_matrix(tmp_path_factory, junk):
    """Property: every ``--budget`` text without a digit is refused by the flag, whatever the matrix holds."""
    import contextlib
    import io

    from bench.cli import main

    box = tmp_path_factory.mktemp("b")
    (box / "m.yaml").write_text(DECOY)
    err = io.StringIO()
    cwd = os.getcwd()
    os.chdir(box)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(["run", "m.yaml", "--budget", junk])
    finally:
        os.chdir(cwd)
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "--budget" in lines[0], err.getvalue()
    assert sorted(p.name for p in box.iterdir()) == ["m.yaml"]
