"""User-supplied text is echoed, never obeyed (issue 48): ESC, BEL and other control or format characters in an
unknown key, a nested key, the matrix file name or the report's sweep argument were printed raw (they retitled and
cleared the terminal). Every message goes through one escape, :func:`bench.core.errors.printable` (the error
boundary of ``bench.cli`` and :func:`bench.core.errors.say`).
"""
# ruff: noqa: F811 - the fixtures come from _badinput; tests take them as parameters

from __future__ import annotations

import os
import unicodedata

import pytest
from _badinput import GOOD, box, check_refused, sweep_box  # noqa: F401 - fixtures
from _cli import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.core.errors import printable

FEW = settings(max_examples=int(os.environ.get("BENCH_HYPOTHESIS_CLI_EXAMPLES", "3")), deadline=None,
               derandomize=True, suppress_health_check=list(HealthCheck))
MANY = settings(max_examples=int(os.environ.get("BENCH_HYPOTHESIS_EXAMPLES", "15")), deadline=None,
                derandomize=True, suppress_health_check=list(HealthCheck))


def raw_controls(text: str) -> list[str]:
    """The control and format characters of ``text`` other than the line break (what a terminal would obey)."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Cs")]


def _quoted(name: str) -> str:
    """``name`` as a YAML double-quoted key, every character outside printable ASCII written as YAML's escape."""
    def esc(c: str) -> str:
        if c in '"\\':
            return "\\" + c
        if " " <= c <= "~":
            return c
        n = ord(c)
        return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"
    return '"' + "".join(esc(c) for c in name) + '"'


CASES = {
    "unknown key": (lambda: GOOD.replace("factors:", '"ab\\e]0;pwn\\ac": 1\nfactors:'), "m.yaml",
                    "ab\\x1b]0;pwn\\x07c"),
    "nested key": (lambda: GOOD.replace("  steps: 3\n", '  steps: 3\n  "q\\e[2J": 1\n'), "m.yaml", "q\\x1b[2J"),
    "embedded key": (lambda: GOOD.replace("  steps: 3\n", '  steps: 3\n  embedded: {"q\\e[2J": 1}\n'), "m.yaml",
                     "q\\x1b[2J"),
    "file name": (lambda: GOOD.replace("name: t", "name: t\nbogus: 1"), "m\x1b]0;x\x07.yaml", "m\\x1b]0;x\\x07.yaml"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_control_characters_in_a_matrix_are_escaped(box, case):
    text, name, shown = CASES[case]
    (box / name).write_text(text())
    line = cli(box, ["run", name, "--dry-run"], shown)
    assert not raw_controls(line), line


def test_control_characters_in_the_report_sweep_are_escaped(sweep_box):
    line = cli(sweep_box, ["report", "sw\x07\x1b[2J", "--results", "res"], ("sw\\x07\\x1b[2J", "no sweep found"))
    assert not raw_controls(line), line


#: a name holding control or format characters (the escape's class), between letters
NAMES = st.builds(lambda a, c, b: a + c + b, st.text("abcxyz_", min_size=1, max_size=4),
                  st.text(st.characters(categories=("Cc", "Cf"), exclude_characters="\n\r\x00\x85"), min_size=1,
                          max_size=4),
                  st.text("abcxyz_", max_size=4))


@st.composite
def echoed(draw):
    """(argv, file text, name) of one place a name is echoed: a top-level key, a ``base`` key, a sweep."""
    name = draw(NAMES)
    where = draw(st.sampled_from(["top", "base", "sweep"]))
    if where == "top":
        return ["run", "m.yaml", "--dry-run"], GOOD.replace("factors:", f"{_quoted(name)}: 1\nfactors:"), name
    if where == "base":
        return ["run", "m.yaml", "--dry-run"], GOOD.replace("  steps: 3\n", f"  steps: 3\n  {_quoted(name)}: 1\n"), name
    return ["report", name, "--results", "res"], GOOD, name


def test_any_echoed_name_is_escaped_in_process(box, capsys):
    """Property through :func:`bench.cli.main`: whatever control or format characters a key or a sweep holds, the one
    line holds none of them raw, and names it escaped."""
    (box / "res").mkdir()

    @MANY
    @given(echoed())
    def prop(case):
        argv, text, name = case
        (box / "m.yaml").write_text(text)
        line = check_refused(box, argv, capsys)
        assert not raw_controls(line), line
        assert printable(name).strip() in line, (line, printable(name))

    prop()


def test_any_echoed_name_is_escaped_through_the_entry_point(box):
    (box / "res").mkdir()

    @FEW
    @given(echoed())
    def prop(case):
        argv, text, name = case
        (box / "m.yaml").write_text(text)
        line = cli(box, argv)
        assert not raw_controls(line), line

    prop()


def test_printable_keeps_ordinary_text():
    """The escape changes nothing a user would want to see: letters of any script, punctuation, spaces."""
    text = "m.yaml: base.stéps: unknown key 'шаг' (allowed: steps) -> 10 %"
    assert printable(text) == text
    assert printable("a\x1bb\u202ec") == "a\\x1bb\\u202ec"
