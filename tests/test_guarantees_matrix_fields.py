"""A matrix file sets only what a user may set (issue 48): the harness's own fields (``source``, the file it was
loaded from, and ``selected_cells``, a ``run --cells`` subset) were taken from a top-level key, and
``selected_cells`` changed the sweep's fingerprint, so the sweep neither resumed nor was resumed; ``factors: null``
ran one cell while ``repeats``, ``base`` and ``steps: null`` were refused.
"""
# ruff: noqa: F811 - the fixtures come from _badinput; tests take them as parameters

from __future__ import annotations

import os

import pytest
from _badinput import GOOD, box, check_refused  # noqa: F401 - fixtures
from _cli import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.spec.matrix import Matrix

MANY = settings(max_examples=int(os.environ.get("BENCH_HYPOTHESIS_EXAMPLES", "20")), deadline=None,
                derandomize=True, suppress_health_check=list(HealthCheck))
INTERNAL = ("source", "selected_cells")


@pytest.mark.parametrize("key, value", [("selected_cells", "[abc123]"), ("source", "other.yaml")])
def test_an_internal_field_is_an_unknown_key(box, key, value):
    (box / "m.yaml").write_text(GOOD + f"{key}: {value}\n")
    line = cli(box, ["run", "m.yaml", "--dry-run"], (f"m.yaml:15: {key}: unknown key", "allowed: base"))
    assert not any(f"{k}," in line or f"{k})" in line for k in INTERNAL), line  # not offered as allowed


def test_factors_null_is_refused(box):
    (box / "m.yaml").write_text(GOOD.replace("factors:\n  dynamic_bsz: [off, on]\n", "factors:\n"))
    cli(box, ["run", "m.yaml", "--dry-run"], ("m.yaml:13: factors: empty", "leave the key out"))


#: keys of the file whose value is required once the key is written (null is not "the default")
REQUIRED = ("name", "factors", "repeats", "design", "exclude", "expect", "description", "base", "base.steps",
            "base.env", "base.overrides", "base.embedded", "base.n", "base.warmup_steps", "base.temperature")


def _with(key: str, text: str) -> str:
    """GOOD with ``key`` set to the YAML text ``text`` (a top-level key or a ``base`` key)."""
    lines = [ln for ln in GOOD.splitlines() if not (ln.split(":")[0] == key or (key.startswith("base.") and
                                                     ln.startswith("  ") and ln.strip().split(":")[0] == key[5:]))]
    if key == "factors":
        lines = [ln for ln in lines if not ln.startswith("  dynamic_bsz")]
    if key == "base":
        lines = [ln for ln in lines if not ln.startswith("  ")]
    if key.startswith("base."):
        at = lines.index("base:") + 1
        lines.insert(at, f"  {key[5:]}: {text}")
    else:
        lines.append(f"{key}: {text}")
    return "\n".join(lines) + "\n"


@st.composite
def not_settable(draw):
    """A file that sets what it may not: an internal field (any value) or a required key as null."""
    if draw(st.booleans()):
        key = draw(st.sampled_from(INTERNAL))
        value = draw(st.sampled_from(["[a, b]", "x.yaml", "''", "[]", "1", "{a: 1}"]))
        return key, _with(key, value)
    key = draw(st.sampled_from(REQUIRED))
    return key, _with(key, draw(st.sampled_from(["null", "~", ""])))


def test_any_internal_field_or_required_null_is_refused(box, capsys):
    """Property through :func:`bench.cli.main` (``run --dry-run``): exit 2, one line naming the key."""

    @MANY
    @given(not_settable())
    def prop(case):
        key, text = case
        (box / "m.yaml").write_text(text)
        check_refused(box, ["run", "m.yaml", "--dry-run"], capsys, (key.split(".")[-1],))

    prop()


def test_the_harness_still_sets_its_own_fields():
    """``source`` and ``selected_cells`` stay settable by the harness, and a subset is part of the fingerprint."""
    m = Matrix(name="t", factors={"dynamic_bsz": [0, 1]})
    whole = m.fingerprint()
    m.source, m.selected_cells = "m.yaml", ["abc"]
    copy = m.model_copy()
    assert (copy.source, copy.selected_cells) == ("m.yaml", ["abc"])
    assert m.fingerprint() != whole and "source" not in m.model_dump()
