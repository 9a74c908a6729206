"""The docs (issue 23): the MkDocs site builds with warnings as errors, its matrix reference holds every key of
the schema, README is a short front door whose test command is the one CI runs.

The site is built for real (``mkdocs build --strict``, the hook ``tools/docs_hooks.py`` generating the
reference from the pydantic models); the keys are read back from the built HTML page.
"""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "WARNING" not in p.stderr, p.stderr[-3000:]
    return out


def _hook():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "tools" / "docs_hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _schema_keys(model) -> set[str]:
    """The keys a user writes in a model's block: its JSON schema's properties, without the fields the loader
    sets (``exclude=True``: never read from the file)."""
    props = model.model_json_schema()["properties"]
    return {k for k in props if not model.model_fields[k].exclude}


def _page_tables(page: Path) -> dict[str, set[str]]:
    """Heading text -> the keys (first column) of the table under it, from the built HTML."""
    text = page.read_text()
    out = {}
    for part in re.split(r"<h3 ", text)[1:]:
        title = html.unescape(re.sub(r"<[^>]+>", "", part.split("</h3>", 1)[0].split(">", 1)[1])).strip("¶ ")
        out[title] = set(re.findall(r"<tr>\s*<td><code>([^<]+)</code></td>", part.split("<h3", 1)[0]))
    return out


def test_docs_build_strict_and_the_reference_has_every_schema_key(site):
    from bench.spec.expect import Expect
    from bench.spec.matrix import Base, Exclude, ExplicitDesign, FractionalDesign, FullDesign, Matrix, OneAtATimeDesign
    from bench.spec.optimizations import FACTOR_KEYS
    from bench.spec.stack import Stack, StackPath
    from bench.tune.space import Dimension, SamplerSpec, TuneBlock

    tables = _page_tables(site / "matrix" / "index.html")
    expected = {"Top level": Matrix, "base": Base, "design: full": FullDesign,
                "design: one_at_a_time": OneAtATimeDesign, "design: fractional": FractionalDesign,
                "design: explicit": ExplicitDesign, "exclude[]": Exclude, "expect[]": Expect, "tune": TuneBlock,
                "tune.space.<limit>": Dimension, "tune.sampler": SamplerSpec, "stacks.<name>": Stack,
                "stacks.<name>.paths[]": StackPath}
    for title, model in expected.items():
        assert tables.get(title) == _schema_keys(model), (title, tables.get(title), _schema_keys(model))
    # every model the matrix schema nests is one of them (a new block needs its table)
    nested = set(Matrix.model_json_schema()["$defs"])
    assert nested <= {m.__name__ for m in expected.values()}, nested
    assert tables["Factors"] == set(FACTOR_KEYS)
    # the generator's own list agrees (python tools/docs_hooks.py prints the same tables)
    assert {m for _, _, m in _hook().sections()} == set(expected.values())


def test_the_commands_page_lists_every_subcommand_and_option(site):
    """Every option of every subcommand (``--help`` aside) and every positional argument is in the built
    commands page, in the table under the subcommand's heading."""
    import argparse

    from bench.cli import build_parser

    text = (site / "commands" / "index.html").read_text()
    [sub] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert sub.choices
    for name, parser in sub.choices.items():
        part = text.split(f'<h3 id="{name}">', 1)[1].split("<h", 1)[0]
        listed = set(re.findall(r"<tr>\s*<td>(.*?)</td>", part))
        flags = {m for cell in listed for m in re.findall(r"<code>([^<]+)</code>", cell)}
        want = {o for a in parser._actions if not isinstance(a, argparse._HelpAction)
                for o in (a.option_strings or [a.metavar or a.dest])}
        assert flags == want, (name, sorted(flags ^ want))


def test_the_matrix_page_lists_every_shipped_matrix():
    text = (ROOT / "docs" / "matrix.md").read_text()
    listed = set(re.findall(r"^\| `([\w.-]+\.yaml)` \|", text, re.MULTILINE))
    assert listed == {p.name for p in (ROOT / "matrix").glob("*.yaml")}, listed


def test_every_page_is_in_the_nav_and_the_owned_pages_are_there(site):
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python", "#"))["nav"]

    def pages(items):
        for item in items:
            for v in item.values():
                yield from (pages(v) if isinstance(v, list) else [v])

    listed = set(pages(nav))
    assert listed == {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    for owned in ("gate.md", "planning.md", "ray-cluster.md", "traces.md", "guarantees.md", "vl.md"):
        assert owned in listed and (site / owned.removesuffix(".md") / "index.html").is_file()


#: the most lines of a how-to page (docs/*.md): it says how to use one feature; measurement series go to
#: docs/lab-notes/ and the index of figures (issue 31: "no how-to page over about 250 lines")
HOW_TO_MAX_LINES = 250


def test_how_to_pages_stay_short_and_measurements_live_in_the_lab_notes():
    sizes = {p.name: len(p.read_text().splitlines()) for p in sorted((ROOT / "docs").glob("*.md"))}
    assert len(sizes) >= 15, sizes
    assert {k: n for k, n in sizes.items() if n > HOW_TO_MAX_LINES} == {}
    notes = {p.name for p in (ROOT / "docs" / "lab-notes").glob("*.md")}
    assert {"gate.md", "planning.md", "guarantees.md"} <= notes


def _readme_commands() -> tuple[str, str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    main = next(ln for ln in lines if ln.startswith("pip install -c constraints.txt -e . "))
    test = next(ln for ln in lines if ln.startswith('pip install -c constraints.txt -e ".[test]"'))
    return main, test


def test_readme_is_a_front_door_with_the_two_commands_on_its_first_screen():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 150
    main, test = _readme_commands()
    assert main == "pip install -c constraints.txt -e . && python run_bench.py matrix/full.yaml"
    first_screen = lines[:30]
    assert main in first_screen and test in first_screen
    # every docs page README points to exists
    for target in re.findall(r"\]\((docs/[^)#]+)", "\n".join(lines)):
        assert (ROOT / target).is_file(), target


def test_ci_runs_the_test_command_of_the_readme():
    """``.ci/run`` runs README's test command: each of its parts, in order (pip's ``-q`` aside)."""
    _, test = _readme_commands()
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines() if not ln.strip().startswith("#")]
    pos = 0
    for part in (p.strip() for p in test.split("&&")):
        hits = [i for i, ln in enumerate(ci) if i >= pos and ln.replace(" -q", "") == part]
        assert hits, f".ci/run lacks README's {part!r} (after line {pos})"
        pos = hits[0] + 1


def test_the_concepts_page_explains_each_term_before_it_uses_it():
    """The first time a term appears on the concepts page (code spans aside) is its bold definition."""
    text = (ROOT / "docs" / "concepts.md").read_text().split("\n", 1)[1]
    text = re.sub(r"`[^`]*`", "", text)
    for term in ("GRPO step", "engine", "platform", "factor", "level", "matrix", "cell", "design", "run", "repeat",
                 "sweep", "block", "Free ratio", "rollout share", "speedup", "main effect"):
        first = re.search(rf"\b{term}s?\b", text, re.IGNORECASE)
        definition = re.search(rf"\*\*{term}s?\b", text, re.IGNORECASE)
        assert first and definition and first.start() == definition.start() + 2, (term, text[first.start() - 80:][:160])
