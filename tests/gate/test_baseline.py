"""``run_bench.py baseline save|list|show``: the stored format, refusals, MLflow tag."""

from __future__ import annotations

import json

import pytest
from _sweeps import EMBEDDED_CELLS, make_sweep

from bench.cli import main
from bench.core.errors import BenchError
from bench.gate.baseline import FORMAT, FORMAT_VERSION, load_baseline


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real sqlite MLflow store shared by the module, and a parent run in it."""
    from bench.tracking import Tracker

    d = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{d}/mlflow.db"
    tr = Tracker(uri, "synth")
    return uri, tr


def _parent(store) -> str:
    uri, tr = store
    return tr.start_parent("sweep", {"bench.kind": "sweep"}, {})


def test_save_writes_versioned_baseline_and_tags_parent(tmp_path, store, capsys):
    uri, tr = store
    pid = _parent(store)
    make_sweep(tmp_path, "synth", EMBEDDED_CELLS, repeats=2, parent_run_id=pid)
    rc = main(["baseline", "save", "synth", "--name", "main", "--results", str(tmp_path), "--tracking-uri", uri])
    assert rc == 0, capsys.readouterr()
    path = tmp_path / "baselines" / "main.json"
    data = json.loads(path.read_text())
    assert data["format"] == FORMAT and data["format_version"] == FORMAT_VERSION
    assert (data["engine"], data["platform"]) == ("embedded", "cpu")
    assert data["versions"] == {"torch": "2.14.1"}
    assert {"hostname", "os", "cpu", "cpu_count", "memory_gb", "python"} <= set(data["machine"])
    assert data["source"]["sweep"].startswith("synth/")  # relative to the results folder
    assert len(data["cells"]) == 4
    cell = data["cells"][0]
    assert cell["key"].startswith("rmsnorm_fused=0,task_queue=n/a,dynamic_bsz=0")
    assert [len(r["samples"]["step_time"]) for r in cell["repeats"]] == [4, 4]
    assert cell["summary"]["step_time_n"] == 8
    assert "step_time_median_s" in cell["repeats"][0]["summary"]
    assert tr.client.get_run(pid).data.tags["bench.baseline"] == "main"
    # loadable by name and by file
    assert load_baseline("main", tmp_path)["name"] == "main"
    assert load_baseline(str(path), tmp_path)["name"] == "main"
    # list / show
    assert main(["baseline", "list", "--results", str(tmp_path)]) == 0
    assert "main" in capsys.readouterr().out
    assert main(["baseline", "show", "main", "--results", str(tmp_path)]) == 0
    assert '"engine": "embedded"' in capsys.readouterr().out


def test_save_refuses_failed_cells(tmp_path, store, capsys):
    uri, _ = store
    make_sweep(tmp_path, "synth", EMBEDDED_CELLS, repeats=2, failed={(1, 1): "oom"})
    rc = main(["baseline", "save", "synth", "--name", "b", "--results", str(tmp_path), "--tracking-uri", uri])
    err = capsys.readouterr().err
    assert rc == 2
    assert "dynamic_bsz" in err and "failed" in err and "oom" in err
    assert not (tmp_path / "baselines" / "b.json").exists()


def test_save_refuses_unfinished_and_sampleless_cells(tmp_path, store, capsys):
    uri, _ = store
    make_sweep(tmp_path, "synth", EMBEDDED_CELLS, repeats=2, pending={(2, 0)})
    assert main(["baseline", "save", "synth", "--name", "b", "--results", str(tmp_path), "--tracking-uri", uri]) == 2
    assert "unfinished" in capsys.readouterr().err
    make_sweep(tmp_path, "other", EMBEDDED_CELLS, repeats=1, no_samples={(0, 0)})
    assert main(["baseline", "save", "other", "--name", "b", "--results", str(tmp_path), "--tracking-uri", uri]) == 2
    assert "without step-time samples" in capsys.readouterr().err


def test_save_name_rules(tmp_path, store, capsys):
    uri, _ = store
    make_sweep(tmp_path, "synth", EMBEDDED_CELLS, repeats=2)
    args = ["--results", str(tmp_path), "--tracking-uri", uri]
    assert main(["baseline", "save", "synth", "--name", "../x", *args]) == 2
    assert "--name" in capsys.readouterr().err
    assert main(["baseline", "save", "synth", "--name", "a", *args]) == 0
    assert main(["baseline", "save", "synth", "--name", "a", *args]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["baseline", "save", "synth", "--name", "a", "--force", *args]) == 0
    assert main(["baseline", "save", "nosuch", "--name", "c", *args]) == 2
    assert main(["baseline", "save", "synth", *args]) == 2


def test_save_without_parent_run_warns_but_saves(tmp_path, store, capsys):
    uri, _ = store
    make_sweep(tmp_path, "synth", EMBEDDED_CELLS, repeats=2, parent_run_id=None)
    assert main(["baseline", "save", "synth", "--name", "np", "--results", str(tmp_path), "--tracking-uri", uri]) == 0
    assert "no MLflow parent run" in capsys.readouterr().err
    assert (tmp_path / "baselines" / "np.json").exists()


def test_load_unknown_and_bad_versions(tmp_path):
    with pytest.raises(BenchError, match="unknown baseline.*known: none"):
        load_baseline("nope", tmp_path)
    d = tmp_path / "baselines"
    d.mkdir()
    (d / "new.json").write_text(json.dumps({"format": FORMAT, "format_version": 99, "engine": "embedded",
                                            "platform": "cpu", "cells": []}))
    with pytest.raises(BenchError, match="format_version 99"):
        load_baseline("new", tmp_path)
    (d / "junk.json").write_text("{}")
    with pytest.raises(BenchError, match="not a baseline"):
        load_baseline("junk", tmp_path)
    with pytest.raises(BenchError, match="known: junk, new"):
        load_baseline("other", tmp_path)


def test_save_refuses_a_sweep_the_gate_could_never_judge(tmp_path, store, capsys):
    uri, _ = store
    args = ["--results", str(tmp_path), "--tracking-uri", uri]
    # 1 repeat x 4 timed steps per cell: 4 + 4 samples give p >= 2/C(8,4) = 0.029, never < 0.01
    make_sweep(tmp_path, "synth", EMBEDDED_CELLS, repeats=1, steps=6)
    assert main(["baseline", "save", "synth", "--name", "few", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    assert "4 of 4 cells can never pass the gate" in err and "4 timed step(s) (1 repeat(s) x 4)" in err
    assert "smallest possible p 0.0286" in err and "needs 5 per cell" in err
    assert "raise `steps` by 1 or `repeats` to 2" in err
    assert not (tmp_path / "baselines" / "few.json").exists()
    # at the gate's alpha the user will run with (0.05) the same sweep is judgeable: saved
    assert main(["baseline", "save", "synth", "--name", "few", "--alpha", "0.05", *args]) == 0
    assert main(["baseline", "save", "synth", "--name", "x", "--alpha", "0.7", *args]) == 2
    assert "--alpha 0.7: allowed range (0.0, 0.5]" in capsys.readouterr().err
    # 2 repeats x 4: 8 + 8 samples reach p < 0.01: saved
    make_sweep(tmp_path, "enough", EMBEDDED_CELLS, repeats=2, steps=6)
    assert main(["baseline", "save", "enough", "--name", "ok", *args]) == 0
