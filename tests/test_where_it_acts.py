"""Where each optimization acts (issue 32): per-run category times from the Free-ratio scan, the report's
run-level model fitted to each category, the trace diff between cells, and one set of figures in report.md,
report.json and MLflow.

Hand figures (times in microseconds in the traces, milliseconds in the results):

* ``gpu_nccl_overlap.pt.trace.json`` (see tests/test_op_categories.py): step 1 sgemm 300, elementwise 100,
  flash 200, NCCL 400, memcpy 50; step 2 sgemm 500, rms_norm 50, NCCL 200.
* ``cpu_two_steps.pt.trace.json``: step 1 matmul 600 (aten::matmul self 12 + aten::mm 588), elementwise 210;
  step 2 aten::add 200, aten::index_select 800 (copy).
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
from pathlib import Path

import pytest
from _sweeps import make_sweep

from bench.cli import main
from bench.measure.op_categories import trace_categories
from bench.measure.run_ops import OP_TIMES, ensure_op_times, run_op_times
from bench.report.where import cell_ops, factor_rows, fit_series, trace_diff, where_metrics
from bench.report.where_md import fmt_ms, fmt_pct

FIX = Path(__file__).parent / "fixtures" / "measure"
GPU = FIX / "gpu_nccl_overlap.pt.trace.json"
CPU = FIX / "cpu_two_steps.pt.trace.json"


def _nonzero(d: dict) -> dict:
    return {k: round(v, 6) for k, v in d.items() if v}


def _record(sources: list[str], steps=(1, 2)) -> dict:
    return {"free_ratio_detail": {str(s): {"sources": [{"kind": "torch", "source": p} for p in sources]}
                                  for s in steps}}


def test_category_times_from_the_scan_of_the_free_ratio(tmp_path):
    run = tmp_path / "r0"
    (run / "profile" / "rollout").mkdir(parents=True)
    (run / "trace").mkdir()
    shutil.copy(GPU, run / "profile" / "rollout" / "gpu.pt.trace.json")
    shutil.copy(CPU, run / "trace" / "steps_1-2.json")
    rec = _record(["profile/rollout/gpu.pt.trace.json", "trace/steps_1-2.json"])
    got = ensure_op_times(run, rec)
    assert got["warnings"] == []
    s1, s2 = got["steps"]["1"], got["steps"]["2"]
    assert s1["basis"] == ["cpu", "device"]
    # the GPU trace (its path names the rollout) by device kernels, the CPU one (no phase: "all") by cpu_op self time
    assert _nonzero(s1["phases"]["rollout"]) == {"matmul": 0.3, "elementwise": 0.1, "attention": 0.2,
                                                 "communication": 0.4, "memcpy": 0.05}
    assert _nonzero(s1["phases"]["all"]) == {"matmul": 0.6, "elementwise": 0.21}
    assert _nonzero(s1["category_ms"]) == {"matmul": 0.9, "elementwise": 0.31, "attention": 0.2,
                                           "communication": 0.4, "memcpy": 0.05}
    assert _nonzero(s2["category_ms"]) == {"matmul": 0.5, "normalization": 0.05, "communication": 0.2,
                                           "elementwise": 0.2, "copy": 0.8}
    assert s2["ops"]["aten::index_select"] == pytest.approx(0.8)
    # the same figures as the category reader of bench.measure.op_categories (its own parse)
    for path, phase in ((GPU, "rollout"), (CPU, "all")):
        for st in trace_categories(path)["steps"]:
            mine = got["steps"][str(st["step"])]["phases"][phase]
            assert {c: round(v, 6) for c, v in mine.items()} == {c: round(v / 1e3, 6) for c, v in
                                                                 st["category_us"].items()}
    # one parse per trace, kept in the run's cache (the one the Free ratio fills); the result sits beside the record
    assert sorted(p.name.split("-")[0] + "-" + p.name.split("-")[1] for p in (run / ".trace_cache").iterdir()) == [
        "trace-v3", "trace-v3"]
    assert json.loads((run / OP_TIMES).read_text()) == got
    (run / "trace" / "steps_1-2.json").unlink()  # read back from op_times.json, not from the traces
    assert ensure_op_times(run, rec) == got
    assert run_op_times(run, rec)["warnings"] == ["step 1: trace/steps_1-2.json: no operator table (unreadable "
                                                  "or no such step)", "step 2: trace/steps_1-2.json: no operator "
                                                  "table (unreadable or no such step)"]


def _snap(cells: list[dict], repeats: int) -> dict:
    out = []
    for i, lv in enumerate(cells):
        cid = f"c{i}"
        out.append({"key": cid, "cell_id": cid, "label": cid, "levels": lv, "status": "ok",
                    "all_off": not any(lv.values()),
                    "repeats": [{"repeat": k, "status": "ok", "samples": {"step_time": [1.0]}}
                                for k in range(repeats)]})
    return {"format": "grpo-bench-baseline", "format_version": 1, "engine": "embedded", "platform": "cpu",
            "cells": out}


def test_per_factor_fit_by_hand():
    # 2 x 2 cells x 2 blocked repeats; a = rmsnorm_fused, b = dynamic_bsz coded -1/+1, blk = -1 (repeat 0) / +1:
    # y = 10 + 1.5 a + 0.5 b + 0.2 blk + 0.1 ab + 0.05 a blk (ms). Main-effects model with the block: the ab and
    # a*blk parts are orthogonal to every column, so they are the residual: RSS = 8 (0.1^2 + 0.05^2) = 0.1,
    # df = 8 - 4 = 4, sigma^2 = 0.025; effect a = 2 x 1.5 = 3.0 ms, se = 2 sigma / sqrt(8) = 0.111803;
    # t(0.975, 4) = 2.776445: CI 3.0 -+ 0.310414; mean at a = -1: 8.5 ms, so +35.29 % [31.64 %, 38.95 %]
    cells = [{"rmsnorm_fused": x, "dynamic_bsz": y} for x, y in itertools.product((0, 1), repeat=2)]
    snap = _snap(cells, 2)
    runs = {}
    for i, lv in enumerate(cells):
        a, b = 2 * lv["rmsnorm_fused"] - 1, 2 * lv["dynamic_bsz"] - 1
        for k in range(2):
            blk = 2 * k - 1
            y = 10 + 1.5 * a + 0.5 * b + 0.2 * blk + 0.1 * a * b + 0.05 * a * blk
            runs[(f"c{i}", k)] = {"series": {"matmul": y, "copy": 2.0}, "ops": {}}
    fits = {s: fit_series(snap, runs, s, alpha=0.05, interactions=False, blocked=True, nodes_varied=False)
            for s in ("matmul", "copy")}
    rows = factor_rows(fits, {})
    a = next(r for r in rows["rmsnorm_fused"] if r["series"] == "matmul")
    half = 2.776445 * 2 * math.sqrt(0.025) / math.sqrt(8)
    assert a["change_ms"] == pytest.approx(3.0)
    assert (a["ci_low_ms"], a["ci_high_ms"]) == (pytest.approx(3.0 - half, abs=1e-5), pytest.approx(3.0 + half,
                                                                                                     abs=1e-5))
    assert a["base_ms"] == pytest.approx(8.5) and a["change_pct"] == pytest.approx(300 / 8.5)
    assert a["ci_low_pct"] == pytest.approx(100 * (3.0 - half) / 8.5, abs=1e-4) and a["moves"]
    b = next(r for r in rows["dynamic_bsz"] if r["series"] == "matmul")
    assert b["change_ms"] == pytest.approx(1.0) and b["base_ms"] == pytest.approx(9.5)
    # a category that does not move: change 0, its interval holds 0; sorted by size (matmul first)
    assert [r["series"] for r in rows["rmsnorm_fused"]] == ["matmul", "copy"]
    c = rows["rmsnorm_fused"][1]
    assert c["change_ms"] == pytest.approx(0.0, abs=1e-9) and not c["moves"]
    # a factor the stack does not read is left out
    assert "rmsnorm_fused" not in factor_rows(fits, {"rmsnorm_fused": "not read by X"})


def _edited(tmp_path: Path, name: str, edit) -> Path:
    raw = json.loads(GPU.read_text())
    raw["traceEvents"] = [e2 for e in raw["traceEvents"] if (e2 := edit(dict(e))) is not None]
    p = tmp_path / name
    p.write_text(json.dumps(raw))
    return p


def test_trace_diff_on_fixtures(tmp_path):
    # cell: the NCCL AllReduce (400 us) gone, the sgemm kernels 2x as long (step 1: 300 -> 600 us), the elementwise
    # kernel (100 us) renamed: the old name vanishes, fused_rms_norm_kernel appears
    def cell(e):
        if "AllReduce" in str(e.get("name")):
            return None
        if "sgemm" in str(e.get("name")):
            e["dur"] = 2 * e["dur"]
        if str(e.get("name", "")).startswith("void at::native::vectorized_elementwise"):
            e["name"] = "fused_rms_norm_kernel"
        return e

    base_run, cell_run = tmp_path / "base", tmp_path / "cell"
    for d, src in ((base_run, GPU), (cell_run, _edited(tmp_path, "cell.json", cell))):
        (d / "trace").mkdir(parents=True)
        shutil.copy(src, d / "trace" / "t.json")
    rec = _record(["trace/t.json"], steps=(1,))
    ops = {k: ensure_op_times(d, rec)["steps"]["1"]["ops"] for k, d in (("b", base_run), ("c", cell_run))}
    runs = {("base", 0): {"ops": ops["b"]}, ("cell", 0): {"ops": ops["c"]}}
    got = {r["op"]: r for r in trace_diff(cell_ops(runs, "base"), cell_ops(runs, "cell"), n=10)}
    allreduce = next(k for k in got if "AllReduce" in k)
    sgemm = next(k for k in got if "sgemm" in k)
    elem = next(k for k in got if k.startswith("void at::native::vectorized_elementwise"))
    assert (got[allreduce]["status"], got[allreduce]["change_ms"]) == ("vanishes", pytest.approx(-0.4))
    assert (got[sgemm]["status"], got[sgemm]["change_ms"]) == ("slower", pytest.approx(0.3))
    assert (got["fused_rms_norm_kernel"]["status"], got["fused_rms_norm_kernel"]["cell_ms"]) == (
        "appears", pytest.approx(0.1))
    assert got[elem]["status"] == "vanishes"
    assert [r["op"] for r in trace_diff(cell_ops(runs, "base"), cell_ops(runs, "cell"), n=2)] == [allreduce, sgemm]
    # the cell's value is the median over its runs, 0 in a run that lacks the operator: median(0, 1, 3) = 1
    three = {("x", 0): {"ops": {"k": 1.0}}, ("x", 1): {"ops": {}}, ("x", 2): {"ops": {"k": 3.0}}}
    assert cell_ops(three, "x") == {"k": 1.0}


def _trace(step: int, ops: list[tuple[str, float]]) -> dict:
    ev = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "ts": 0, "dur": 100000,
           "pid": 1, "tid": 1}]
    t = 10.0
    for name, dur in ops:
        ev.append({"ph": "X", "cat": "cpu_op", "name": name, "ts": t, "dur": dur, "pid": 1, "tid": 1})
        t += dur + 5
    return {"traceEvents": ev}


def test_markdown_report_json_and_mlflow_agree(tmp_path):
    from bench.tracking import Tracker, mlflow_key

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tr = Tracker(uri, "where")
    pid = tr.start_parent("sweep", {"bench.kind": "sweep"}, {})
    cells = [{"rmsnorm_fused": 0}, {"rmsnorm_fused": 1}]
    sweep = make_sweep(tmp_path, "where", cells, repeats=2, steps=4, parent_run_id=pid)
    # each run's profiled step 4: rmsnorm off: pow 300 + rsqrt 100 + mm 2000 us; on: rms_norm 150 + mm 2000;
    # + 10 us x repeat on mm (a block effect). Hand (an exact fit): the unfused norm's pow and rsqrt are elementwise
    # (0.4 -> 0 ms: -0.4 ms, -100 %), the fused one normalization (0 -> 0.15 ms: +0.15 ms, no % of a 0 base)
    for rec_path in sorted(sweep.glob("*/r*/record.json")):
        rec = json.loads(rec_path.read_text())
        k = rec["repeat"]
        on = rec["levels"]["rmsnorm_fused"] == 1
        ops = ([("aten::rms_norm", 150.0)] if on else [("aten::pow", 300.0), ("aten::rsqrt", 100.0)])
        (rec_path.parent / "trace").mkdir()
        (rec_path.parent / "trace" / "steps_4-4.json").write_text(json.dumps(
            _trace(4, [*ops, ("aten::mm", 2000.0 + 10 * k)])))
        rec["free_ratio_detail"] = {"4": {"sources": [{"kind": "torch", "source": "trace/steps_4-4.json",
                                                       "basis": "cpu"}]}}
        rec_path.write_text(json.dumps(rec))
    assert main(["report", "where", "--results", str(tmp_path), "--tracking-uri", uri]) == 0
    data = json.loads((sweep / "report" / "report.json").read_text())
    sec = data["where"]
    assert sec["runs"] == 4 and "AI-CPU" in sec["platform_note"]
    rows = {r["series"]: r for r in sec["factors"]["rmsnorm_fused"]}
    assert rows["elementwise"]["change_ms"] == pytest.approx(-0.4)
    assert rows["elementwise"]["change_pct"] == pytest.approx(-100.0)
    assert rows["elementwise"]["base_ms"] == pytest.approx(0.4)
    assert rows["normalization"]["change_ms"] == pytest.approx(0.15) and rows["normalization"]["change_pct"] is None
    assert rows["matmul"]["change_ms"] == pytest.approx(0.0, abs=1e-9)  # mm is the same in both cells
    # categories no trace holds are named (on CPU: rotary, ai_cpu, communication, ...), not silently dropped
    assert "rotary" in sec["absent"] and "ai_cpu" in sec["absent"] and not set(sec["absent"]) & set(sec["series"])
    assert "rotary" not in rows
    assert [r["series"] for r in sec["factors"]["rmsnorm_fused"]][:2] == ["elementwise", "normalization"]
    diff = {o["op"]: o for o in sec["diffs"][0]["ops"]}
    assert sec["diffs"][0]["factor"] == "rmsnorm_fused"
    assert (diff["aten::pow"]["status"], diff["aten::rms_norm"]["status"]) == ("vanishes", "appears")
    figs = where_metrics(sec)
    assert figs["where.rmsnorm_fused.elementwise.change_ms"] == pytest.approx(-0.4)
    # MLflow holds exactly these figures
    logged = {k: v for k, v in tr.client.get_run(pid).data.metrics.items() if k.startswith("report.where.")}
    assert logged == pytest.approx({mlflow_key(f"report.{k}"): v for k, v in figs.items()})
    # report.md prints them
    md = (sweep / "report" / "report.md").read_text()
    assert "## Where each optimization acts" in md
    absent = ", ".join(sec["absent"])
    assert f"No operator of these categories in any run's trace (0 ms, nothing to compare): {absent}." in md
    for k, v in figs.items():
        assert (fmt_pct(v) if k.endswith("_pct") else fmt_ms(v)) in md, k
    assert f"| elementwise | 0.400 | {fmt_ms(-0.4)} [" in md


def test_each_phase_keeps_its_own_rows_in_the_report():
    """Eight training categories that move by more than any rollout one: the report still shows the rollout's
    first rows (up to CATEGORIES_PER_FACTOR per group: the whole step, each phase), in the term's order."""
    from bench.report.where import CATEGORIES_PER_FACTOR, shown_rows

    def row(series, ms):
        return {"series": series, "change_ms": ms}

    rows = ([row(f"matmul{i}", 100.0 - i) for i in range(8)] + [row(f"training:c{i}", 90.0 - i) for i in range(8)]
            + [row("rollout:copy", 20.0), row("rollout:elementwise", -12.0)])
    rows.sort(key=lambda r: -abs(r["change_ms"]))
    shown = shown_rows({"factors": {"mrope_cache": rows}})["mrope_cache"]
    groups = [r["series"].split(":")[0] if ":" in r["series"] else "" for r in shown]
    assert groups.count("") == groups.count("training") == CATEGORIES_PER_FACTOR
    assert [r["series"] for r in shown if r["series"].startswith("rollout:")] == ["rollout:copy",
                                                                                  "rollout:elementwise"]
    assert [abs(r["change_ms"]) for r in shown] == sorted((abs(r["change_ms"]) for r in shown), reverse=True)


def test_a_category_fit_in_hundreds_of_ms_does_not_overflow():
    """The report's model fitted to milliseconds (a real verl:cpu run's categories reach a second per step): the
    log-scale relative change the fit also computes would overflow ``exp``; the fit still gives the ms effect and its
    interval (CI saw 'OverflowError: math range error' in `report`)."""
    from bench.stats.effects import fit_effects

    obs = [{"mrope_cache": lv} for _ in range(3) for lv in (0, 1)]
    y = [2100.0, 3000.0, 2080.0, 3020.0, 2110.0, 2990.0]
    fit = fit_effects(obs, y, ["mrope_cache"], alpha=0.05, interactions=False, blocks=[0, 0, 1, 1, 2, 2],
                      unit="run", replicated=True)
    (t,) = [t for t in fit.terms if t.name == "mrope_cache"]
    assert t.effect == pytest.approx((3000 + 3020 + 2990) / 3 - (2100 + 2080 + 2110) / 3)
    assert 0 < t.ci_low < t.effect < t.ci_high
