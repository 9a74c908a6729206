"""Top operators by self time per profiled step (issue 23), from a real ``torch.profiler`` chrome trace,
checked against torch's own key averages (``self_cpu_time_total``) of the same profile; and their place in
``profile_summary.json``."""

from __future__ import annotations

import torch

from bench.measure.top_ops import top_ops
from bench.tracking.records import profile_summary


def _profile(tmp_path, steps: int = 2):
    """A real trace of ``steps`` profiler steps of matmuls and a softmax; returns (trace path, key averages)."""
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    sched = torch.profiler.schedule(wait=0, warmup=0, active=steps, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched) as prof:
        for _ in range(steps):
            for _ in range(20):
                c = torch.mm(a, b)
            torch.softmax(c, dim=-1)
            prof.step()
    path = tmp_path / "trace" / "t.json"
    path.parent.mkdir()
    prof.export_chrome_trace(str(path))
    return path, prof.key_averages()


def test_self_times_match_torch_key_averages(tmp_path):
    path, averages = _profile(tmp_path)
    out = top_ops(path)
    assert len(out) == 2  # one entry per ProfilerStep window
    steps = sorted(out, key=int)
    for k in steps:
        step = out[k]
        assert step["window_ms"] > 0 and step["device"] == []
        names = [o["name"] for o in step["cpu"]]
        assert names[0] in ("aten::mm", "aten::addmm") and ("aten::softmax" in names or "aten::_softmax" in names)
        mm = step["cpu"][0]
        assert mm["calls"] == 20 and 0 < mm["share"] <= 1
        assert all(x["self_ms"] >= y["self_ms"] for x, y in zip(step["cpu"], step["cpu"][1:]))  # sorted
    # summed over the steps, the self time of each operator is torch's self_cpu_time_total (us -> ms)
    torch_self = {e.key: e.self_cpu_time_total / 1e3 for e in averages}
    ours: dict[str, float] = {}
    for k in steps:
        for o in out[k]["cpu"]:
            ours[o["name"]] = ours.get(o["name"], 0.0) + o["self_ms"]
    for name in ("aten::mm", "aten::softmax"):
        assert abs(ours[name] - torch_self[name]) <= 0.05 * torch_self[name] + 0.01, (name, ours[name], torch_self)


def test_profile_summary_lists_top_ops_per_profiled_step(tmp_path):
    path, _ = _profile(tmp_path, steps=1)
    step = next(iter(top_ops(path)))
    rec = {"free_ratio": {step: 0.2}, "summary": {"profiled_steps": [int(step)]},
           "free_ratio_detail": {step: {"free_ratio": 0.2, "sources": [
               {"kind": "torch", "source": "trace/t.json", "basis": "cpu"}]}}}
    trace, prof = profile_summary(rec, tmp_path, 0.2)
    assert trace == path
    ops = prof["steps"][step]["top_ops"]
    assert ops["source"] == "trace/t.json" and ops["cpu"][0]["name"] in ("aten::mm", "aten::addmm")
    assert "top_ops_are" in prof
    # a step whose source is not a torch trace (Ascend's CSV) has none
    rec["free_ratio_detail"][step]["sources"] = [{"kind": "ascend", "source": "step_trace_time.csv"}]
    assert profile_summary(rec, tmp_path, 0.2)[1]["steps"][step]["top_ops"] is None
