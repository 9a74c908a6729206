"""The top operators of a profiled step by self time, from a torch chrome trace (``profile_summary.json``).

Self time is what ``torch.profiler``'s key averages call ``self_cpu_time_total`` / ``self_device_time_total``:
an operator's duration minus the durations of the operators it calls. For ``cpu_op`` events the calls are
the ``cpu_op`` events nested in it on the same thread (time intervals of one thread nest); device events
(``kernel``, ``gpu_memcpy``, ``gpu_memset``) do not nest, so their self time is their duration.

Events are attributed to a ``ProfilerStep#N`` window by their start. A trace without such windows (verl's
per-step traces) is one step. Times in the trace are microseconds; the result is in milliseconds.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from typing import Any

from bench.measure.chrome_trace import event_number, hashable, iter_trace_events

DEVICE = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
#: operators listed per kind (cpu, device) and step
TOP_N = 10


def _self_times(events: list[tuple[float, float, str]]) -> list[tuple[str, float, float]]:
    """(name, start, self time) of one thread's ``cpu_op`` events: duration minus the directly nested ones."""
    out: list[tuple[str, float, float]] = []
    stack: list[list[Any]] = []  # [end, name, start, self]
    for ts, dur, name in sorted(events, key=lambda e: (e[0], -e[1])):
        while stack and ts >= stack[-1][0]:
            end, n, start, own = stack.pop()
            out.append((n, start, own))
        if stack:
            stack[-1][3] -= dur
        stack.append([ts + dur, name, ts, dur])
    out += [(n, start, own) for _, n, start, own in stack]
    return out


def top_ops(path: str | os.PathLike, step: int | None = None, n: int = TOP_N) -> dict[str, Any]:
    """Top ``n`` operators by self time per profiled step of one trace.

    Args:
        path: a torch chrome trace (``.json`` or ``.json.gz``).
        step: the step a trace without ``ProfilerStep#N`` windows belongs to (verl's per-step traces);
            ``None`` for ``0``.
        n: operators per kind.

    Returns:
        ``{step (str): {"window_ms", "cpu": [...], "device": [...]}}``; each operator
        ``{"name", "calls", "self_ms", "share"}`` (``share``: self time / step window, ``None`` without a
        window). Never raises for a bad file: an unreadable trace gives ``{}``.
    """
    cpu: dict[tuple, list[tuple[float, float, str]]] = defaultdict(list)
    device: list[tuple[float, float, str]] = []
    windows: list[tuple[int, float, float]] = []
    try:
        for ev in iter_trace_events(path):
            if type(ev) is not dict or ev.get("ph") != "X":
                continue
            cat = ev.get("cat")
            if cat != "cpu_op" and cat not in DEVICE and cat != "user_annotation":
                continue
            name, ts, dur = ev.get("name"), ev.get("ts"), ev.get("dur")
            if type(ts) is not float or type(dur) is not float:  # ints or numeric strings: the slow path
                ts, dur = event_number(ts), event_number(dur)
                if ts is None or dur is None:
                    continue
            if dur < 0 or type(name) is not str:
                continue
            if cat == "cpu_op" and not name.startswith("ProfilerStep#"):
                thread = (ev.get("pid"), ev.get("tid"))
                try:
                    cpu[thread].append((ts, dur, name))
                except TypeError:  # a pid/tid that is a list or an object
                    cpu[(hashable(thread[0]), hashable(thread[1]))].append((ts, dur, name))
            elif cat in DEVICE:
                device.append((ts, dur, name))
            elif m := _STEP.match(name):
                windows.append((int(m.group(1)), ts, dur))
    except Exception:
        return {}

    def where(ts: float) -> int | None:
        for k, start, dur in windows:
            if start <= ts <= start + dur:
                return k
        return None if windows else (step or 0)

    acc: dict[int, dict[str, dict[str, list[float]]]] = defaultdict(lambda: {"cpu": {}, "device": {}})
    for events in cpu.values():
        for name, start, own in _self_times(events):
            if (k := where(start)) is not None:
                s = acc[k]["cpu"].setdefault(name, [0, 0.0])
                s[0] += 1
                s[1] += max(own, 0.0)
    for ts, dur, name in device:
        if (k := where(ts)) is not None:
            s = acc[k]["device"].setdefault(name, [0, 0.0])
            s[0] += 1
            s[1] += dur
    span = {k: dur for k, _, dur in windows}
    out = {}
    for k in sorted(acc):
        window = span.get(k)
        out[str(k)] = {"window_ms": None if window is None else round(window / 1e3, 3), **{
            kind: [{"name": name, "calls": int(c), "self_ms": round(t / 1e3, 3),
                    "share": round(t / window, 4) if window else None}
                   for name, (c, t) in sorted(ops.items(), key=lambda kv: -kv[1][1])[:n]]
            for kind, ops in acc[k].items()}}
    return out


__all__ = ["top_ops", "TOP_N"]
