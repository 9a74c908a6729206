"""Numbers read back from results files are validated (issue 48): a hand-edited baseline, ``sweep.json`` or
``record.json`` with a NaN, an infinity or a negative number where none can be is refused with the file and key
named, exit 2, one line, nothing written. Was: ``sweep_to_sweep.sd_log: NaN`` read as no sweep offset (the gate's
smallest visible change fell from 1127 % to 159 %: a verdict changed silently), ``sd_log: -1`` printed a change of
171994780209.4 %, a negative ``step_time_median`` and a NaN history accepted.

One subprocess case per reader through ``run_bench.py``; the property tests generate the class (any numeric field
replaced) through the entry point with few examples, and through the one loader in-process with more.
"""
# ruff: noqa: F811 - the fixtures come from _badinput; tests take them as parameters

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest
from _badinput import box, sweep_box  # noqa: F401 - fixtures
from _cli import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.cli import main
from bench.core.errors import BenchError
from bench.gate.baseline import SIGNED, check_baseline_shape
from bench.records.run_record import read_record

#: replacements of a number no results file may hold where a non-negative figure is expected
BAD = (float("nan"), float("inf"), float("-inf"), -1.0, -3)
#: every example of an entry-point property starts Python (about 3 s): few; the in-process ones take many
FEW = settings(max_examples=int(os.environ.get("BENCH_HYPOTHESIS_CLI_EXAMPLES", "3")), deadline=None,
               derandomize=True, suppress_health_check=list(HealthCheck))
MANY = settings(max_examples=int(os.environ.get("BENCH_HYPOTHESIS_EXAMPLES", "60")), deadline=None,
                derandomize=True, suppress_health_check=list(HealthCheck))


def numeric_paths(data, parts=()):
    """Every numeric leaf of a JSON document (booleans excluded) as a tuple of keys and indices."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from numeric_paths(v, (*parts, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from numeric_paths(v, (*parts, i))
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        yield parts


def set_at(data, parts, value):
    for p in parts[:-1]:
        data = data[p]
    data[parts[-1]] = value


def jpath(parts) -> str:
    """``cells[0].summary.x`` as the message names a key."""
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in parts).replace(".[", "[")


def pattern(parts) -> str:
    return ".".join("[]" if isinstance(p, int) else str(p) for p in parts).replace(".[]", "[]")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A results folder with the synthetic sweep ``synth`` saved twice as baseline ``b`` (so it has a history of two
    and a measured ``sweep_to_sweep``); returns (folder, the baseline's text)."""
    from _sweeps import EMBEDDED_CELLS, make_sweep

    folder = tmp_path_factory.mktemp("numbers")
    make_sweep(folder / "res", "synth", EMBEDDED_CELLS[:2], repeats=2, seed=1)
    cwd = Path.cwd()
    os.chdir(folder)
    try:
        for extra in ([], ["--force"]):
            assert main(["baseline", "save", "synth", "--name", "b", "--results", "res", *extra]) == 0
    finally:
        os.chdir(cwd)
    return folder, (folder / "res" / "baselines" / "b.json").read_text()


def _edited(folder: Path, text: str, parts, value) -> None:
    data = json.loads(text)
    set_at(data, parts, value)
    (folder / "res" / "baselines" / "b.json").write_text(json.dumps(data))


CASES = {  # the trial's cases: key path -> value
    "sd_log NaN": (("sweep_to_sweep", "sd_log"), float("nan")),
    "sd_log -1": (("sweep_to_sweep", "sd_log"), -1.0),
    "step_time_median negative": (("cells", 0, "summary", "step_time_median"), -2.0),
    "history NaN": (("history", 0, "log_step_time"), None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hand_edited_baseline_number_is_refused_by_the_gate(saved, case):
    folder, text = saved
    parts, value = CASES[case]
    if value is None:  # every cell's log value of the first saved sweep
        data = json.loads(text)
        value = {k: float("nan") for k in data["history"][0]["log_step_time"]}
    _edited(folder, text, parts, value)
    try:
        cli(folder, ["gate", "--candidate", "synth", "--baseline", "b", "--results", "res", "--no-expect",
                     "--out", "gate-out"], ("res/baselines/b.json", "not a valid baseline", jpath(parts)))
    finally:
        (folder / "res" / "baselines" / "b.json").write_text(text)


def test_an_absurd_sweep_offset_is_out_of_range(saved):
    """A finite but absurd ``sd_log`` (a factor of e^1e6 between sweeps) is refused by the model's range."""
    folder, text = saved
    data = json.loads(text)
    data["sweep_to_sweep"]["sd_log"] = 1e6
    with pytest.raises(BenchError, match=r"b\.json: not a valid baseline: sweep_to_sweep\.sd_log: .*10"):
        check_baseline_shape(data, folder / "res" / "baselines" / "b.json")


def _unsigned_paths(text: str) -> list[tuple]:
    import fnmatch

    return [p for p in numeric_paths(json.loads(text))
            if not any(fnmatch.fnmatchcase(pattern(p), pat) for pat in SIGNED)]


@st.composite
def bad_baseline_number(draw, text: str):
    paths = _unsigned_paths(text)
    return draw(st.sampled_from(paths)), draw(st.sampled_from(BAD))


def test_any_baseline_number_replaced_is_refused_in_process(saved):
    """Property, through the loader every reader uses: any numeric field of a baseline (outside the signed log values
    and the matrix) replaced by NaN, an infinity or a negative number is refused, naming the key."""
    folder, text = saved
    path = folder / "res" / "baselines" / "b.json"

    @MANY
    @given(bad_baseline_number(text))
    def prop(case):
        parts, value = case
        data = json.loads(text)
        set_at(data, parts, value)
        with pytest.raises(BenchError) as err:
            check_baseline_shape(data, path)
        assert str(err.value).startswith(f"{path}: not a valid baseline: "), err.value
        assert "\n" not in str(err.value)

    prop()


def test_any_baseline_number_replaced_is_refused_by_baseline_show(saved):
    """Property through ``run_bench.py baseline show``: exit 2, one line naming the file, nothing written."""
    folder, text = saved

    @FEW
    @given(bad_baseline_number(text))
    def prop(case):
        _edited(folder, text, *case)
        try:
            cli(folder, ["baseline", "show", "b", "--results", "res"], ("res/baselines/b.json", "not a valid baseline"))
        finally:
            (folder / "res" / "baselines" / "b.json").write_text(text)

    prop()


@pytest.mark.parametrize("part", ["samples", "summary", "cell summary"])
def test_a_text_where_a_baseline_holds_figures_is_refused(saved, part):
    """The hostile trial of issue 48: a text in place of a number of a repeat's figures (``"fast"``) passed the
    number check, and the gate read the file as written (exit 3 on a string step count). Every such text, at any
    depth of the repeat's measured parts, is refused (property in process; one case through the entry point)."""
    folder, text = saved
    data = json.loads(text)
    where = ("cells", 0) if part == "cell summary" else ("cells", 0, "repeats", 0, part)
    block = data["cells"][0]["summary"] if part == "cell summary" else data["cells"][0]["repeats"][0].get(part)
    paths = [p for p in numeric_paths(block) if p]
    assert paths, part
    leaf = (*where, *(("summary",) if part == "cell summary" else ()), *paths[len(paths) // 2])
    _edited(folder, text, leaf, "fast")
    try:
        cli(folder, ["baseline", "show", "b", "--results", "res"],
            ("res/baselines/b.json", ".".join(map(str, leaf[:-1])), "text 'fast'"))
    finally:
        (folder / "res" / "baselines" / "b.json").write_text(text)


def _sweep_dir(folder: Path) -> Path:
    return next((folder / "res" / "synth").glob("2*"))


def test_a_negative_number_in_sweep_json_is_refused(saved):
    folder, _ = saved
    meta = _sweep_dir(folder) / "sweep.json"
    text = meta.read_text()
    data = json.loads(text)
    data["created_at"] = -5.0
    meta.write_text(json.dumps(data))
    try:
        cli(folder, ["report", "synth", "--results", "res", "--out", "rep"], ("sweep.json", "created_at", "negative"))
    finally:
        meta.write_text(text)


@pytest.mark.parametrize("command", [["report", "synth"], ["baseline", "save", "synth", "--name", "nb"]])
def test_a_sweep_json_without_planned_repeats_is_refused(saved, command):
    """The hostile trial of issue 48: without ``plan.repeats`` a sweep was read as planned for 1 repeat (a missing
    repeat of a 2-repeat sweep was then not reported pending), exit 0."""
    folder, _ = saved
    meta = _sweep_dir(folder) / "sweep.json"
    text = meta.read_text()
    data = json.loads(text)
    del data["plan"]["repeats"]
    meta.write_text(json.dumps(data))
    try:
        cli(folder, [*command, "--results", "res"], ("sweep.json", "plan.repeats missing"))
    finally:
        meta.write_text(text)


def _record_paths(text: str) -> list[tuple]:
    """The numeric fields of a record whose value must be finite and not negative (the per-step metrics other than
    times, throughput and lengths are stored as logged; ``returncode`` may be a negative signal number;
    ``phase_median_s.other`` is the step less its parts)."""
    out = []
    for p in numeric_paths(json.loads(text)):
        key = pattern(p)
        if key.startswith("steps.") and not re.match(r"steps\.\w+\.(timing_s|perf|response_length|prompt_length)/",
                                                     key):
            continue
        if key in ("returncode", "summary.phase_median_s.other") or key.startswith(("cells", "schema_version")):
            continue
        out.append(p)
    return out


def test_any_record_number_replaced_is_refused_in_process(saved):
    """Property, through the one record loader: any numeric field of a ``record.json`` that must hold a time, a
    count, a share or a size replaced by NaN, an infinity or a negative number is refused, naming the file."""
    folder, _ = saved
    rec = next(_sweep_dir(folder).glob("*/r0/record.json"))
    text = rec.read_text()
    paths = _record_paths(text)
    assert len(paths) > 50  # summary, per-step times and sizes, Free ratios, repeat, levels, wall time

    @MANY
    @given(st.sampled_from(paths), st.sampled_from(BAD))
    def prop(parts, value):
        data = json.loads(text)
        set_at(data, parts, value)
        rec.write_text(json.dumps(data))
        try:
            with pytest.raises(BenchError) as err:
                read_record(rec)
        finally:
            rec.write_text(text)
        assert str(rec) in str(err.value) and "\n" not in str(err.value), err.value

    prop()


def test_any_record_number_replaced_is_refused_by_report(saved):
    """Property through ``run_bench.py report``: exit 2, one line naming the record, nothing written."""
    folder, _ = saved
    rec = next(_sweep_dir(folder).glob("*/r0/record.json"))
    text = rec.read_text()

    @FEW
    @given(st.sampled_from(_record_paths(text)), st.sampled_from(BAD))
    def prop(parts, value):
        data = json.loads(text)
        set_at(data, parts, value)
        rec.write_text(json.dumps(data))
        try:
            cli(folder, ["report", "synth", "--results", "res", "--out", "rep"], ("record.json",))
        finally:
            rec.write_text(text)

    prop()


def test_the_saved_baseline_and_sweep_pass_the_check(saved):
    """The check refuses what no harness writes, not what it writes: the baseline saved twice (history, measured
    offset) is read by ``baseline show``."""
    folder, text = saved
    assert main(["baseline", "show", str(folder / "res" / "baselines" / "b.json")]) == 0
    assert math.isfinite(json.loads(text)["sweep_to_sweep"]["sd_log"])
    shutil.rmtree(folder / "gate-out", ignore_errors=True)


def test_a_text_where_the_baselines_matrix_held_a_number_is_refused(saved):
    """The fresh trial of issue 48: ``base.steps: "x"`` in a baseline was kept as written (the matrix as it ran is
    metadata). Every numeric key of the matrix's ``base`` (:func:`bench.gate.baseline.numeric_base_keys`) that the
    baseline holds, given a text, is refused naming it (in process for each key; one key through the entry point)."""
    from bench.gate.baseline import numeric_base_keys

    folder, text = saved
    data = json.loads(text)
    keys = sorted(numeric_base_keys() & set(data["base"]))
    assert {"steps", "train_batch_size", "n"} <= set(keys), keys
    path = folder / "res" / "baselines" / "b.json"
    for key in keys:
        edited = json.loads(text)
        edited["base"][key] = "x"
        with pytest.raises(BenchError, match=rf"b\.json: not a valid baseline: base\.{key}: 'x' \(allowed: a number"):
            check_baseline_shape(edited, path)
    _edited(folder, text, ("base", "steps"), "x")
    try:
        cli(folder, ["gate", "--candidate", "synth", "--baseline", "b", "--results", "res", "--no-expect",
                     "--out", "gate-out"], ("res/baselines/b.json", "base.steps", "'x'"))
    finally:
        path.write_text(text)
