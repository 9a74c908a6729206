"""The sweep's block loop: execute a run order block by block and, after each complete block, ask a stop rule.

A blocked :class:`~bench.spec.plan.RunOrder` holds repeat ``k`` of every run spec in block ``k``
(0-based); look ``k + 1`` follows it. Without a stop rule every run of the order is executed in turn
(exactly the sweep of a fixed design). With one (:class:`bench.planning.sequential.StopRule`), after
each block the rule sees the run records of that block and the earlier ones; its
:class:`~bench.planning.sequential.Look` is written to ``sweep.json`` (key ``sequential``: method, planned
looks, every look, the block after which the sweep stopped), sent to the console as a ``look`` event, and ends
the sweep when it says stop. A resumed sweep walks the same blocks: finished runs are skipped and each look is
recomputed from the same records (not from runs of a later block the interruption left on disk), so a resume
stops where an uninterrupted sweep would have. A sequential sweep stays sequential when resumed without
``--sequential``: the sweep rebuilds its recorded rule (:func:`resume_rule`), and refuses another
``--threshold``/``--alpha``.

Runs of one block are executed by ``run_block`` (default: one after another); the Ray executor of
``--parallel`` replaces it to run a block's runs at once.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Sequence

from bench.core.errors import BenchError
from bench.core.files import atomic_write_json
from bench.records.results import SWEEP, load_records
from bench.tracking.naming import mlflow_key

RunOne = Callable[[Any, int], None]


def split_blocks(todo: Sequence[tuple[Any, int]]) -> list[list[tuple[Any, int]]]:
    """Consecutive runs with the same repeat (= block of a blocked order) grouped, in order."""
    out: list[list[tuple[Any, int]]] = []
    for spec, k in todo:
        if out and out[-1][-1][1] == k:
            out[-1].append((spec, k))
        else:
            out.append([(spec, k)])
    return out


def run_sequentially(block: Sequence[tuple[Any, int]], run_one: RunOne) -> None:
    """Execute the runs of one block one after another (the default ``run_block``)."""
    for spec, k in block:
        run_one(spec, k)


def run_blocks(todo: Sequence[tuple[Any, int]], run_one: RunOne, *, stop_rule: Any = None,
               sweep_dir: Path | None = None, meta: dict[str, Any] | None = None,
               on_event: Callable[[str, dict[str, Any]], None] | None = None,
               run_block: Callable[[Sequence[tuple[Any, int]], RunOne], None] = run_sequentially) -> int | None:
    """Execute ``todo`` (``(spec, repeat)`` in order) with ``run_one(spec, repeat)``; returns the block
    (1-based) after which the stop rule stopped the sweep, or ``None`` when every run of ``todo`` ran.

    With a ``stop_rule``, ``sweep_dir`` and ``meta`` (the sweep's ``sweep.json`` content, updated and
    rewritten after every look) are required.
    """
    if stop_rule is None:  # a fixed design (a sequential sweep resumes with its own rule: resume_rule)
        run_block(list(todo), run_one)
        return None
    assert sweep_dir is not None and meta is not None
    from bench.planning.sequential import METHOD  # deferred: bench.planning.sequential loads scipy

    state = meta.setdefault("sequential", {})
    state.update({"method": METHOD, "max_looks": stop_rule.max_looks, "looks": [], "stopped_after": None,
                  "threshold": getattr(stop_rule, "threshold", None), "alpha": getattr(stop_rule, "alpha", None)})
    records: dict[Path, Any] = {}  # the records read at earlier looks: only new or rewritten ones are read again
    for i, block in enumerate(split_blocks(todo), start=1):
        run_block(block, run_one)
        last = block[0][1]  # this block's repeat: a resumed sweep may hold runs of the next, interrupted one
        seen = [r for r in load_records(sweep_dir, cache=records) if int(r.get("repeat", 0)) <= last]
        look = stop_rule.after_block(seen, i)
        state["looks"].append(look.to_dict())
        if look.stop:
            state["stopped_after"] = i
        atomic_write_json(Path(sweep_dir) / SWEEP, meta)
        if on_event is not None:
            on_event("look", look.to_dict())
        if look.stop:
            return i
    return None


def resume_rule(meta: dict[str, Any], stop_rule: Any, claims: Sequence[dict[str, Any]] = (),
                source: Any = SWEEP) -> Any:
    """The stop rule a resumed sweep continues with (``meta``: its ``sweep.json`` content; ``stop_rule``: the one of
    this invocation's options, ``None`` without ``--sequential``; ``claims``: the matrix's ``expect``, the same as the
    sweep's since its fingerprint holds them; ``source``: its ``sweep.json``, named in the error). A sweep that
    recorded ``sequential`` stays sequential: without a rule of the command line the same
    :class:`bench.planning.sequential.EffectsStopRule` is rebuilt from the record (``max_looks``, ``threshold``,
    ``alpha``), so its looks are recomputed and it stops where it would have. A fixed design, or an interleaved gate
    sweep (its own rule), keeps ``stop_rule``.

    Raises:
        BenchError: ``--sequential`` (or ``--precision``/``--budget``) with a ``--threshold`` or ``--alpha`` other than
            the sweep recorded (one line naming the recorded values).
    """
    from bench.planning.sequential import EffectsStopRule  # deferred: bench.planning.sequential loads scipy

    seq = meta.get("sequential") or {}
    if not seq or meta.get("code_versions") or not (stop_rule is None or isinstance(stop_rule, EffectsStopRule)):
        return stop_rule
    recorded = {"threshold": seq.get("threshold") or 0.05, "alpha": seq.get("alpha") or 0.05}
    if stop_rule is None:
        return EffectsStopRule(int(seq["max_looks"]), claims=claims, **recorded)
    now = {"threshold": stop_rule.threshold, "alpha": stop_rule.alpha}
    if any(not math.isclose(float(now[k]), float(recorded[k])) for k in now):
        raise BenchError(f"{source}: sequential.threshold {recorded['threshold']}, sequential.alpha "
                         f"{recorded['alpha']}: the sweep being resumed decides with these; --threshold "
                         f"{now['threshold']} --alpha {now['alpha']} would change its error control mid-way (allowed: "
                         f"--threshold {recorded['threshold']} --alpha {recorded['alpha']}, no --sequential to go on "
                         "with them, or --force for a new sweep)")
    return stop_rule


def blocks_run(meta: dict[str, Any], planned: int) -> int:
    """Repeats a cell of the sweep should have: the block a sequential sweep stopped after, else ``planned``."""
    stopped = (meta.get("sequential") or {}).get("stopped_after")
    return int(stopped) if stopped else int(planned)


def sequential_header(meta: dict[str, Any]) -> dict[str, str]:
    """The summary header line of a sequential sweep (empty for a fixed design)."""
    seq = meta.get("sequential") or {}
    if not seq.get("looks"):
        return {}
    last = seq["looks"][-1]
    return {"sequential stopping": f"{len(seq['looks'])} of {seq['max_looks']} planned block(s); {last['reason']}; "
                                   f"{last['line']}"}


def plan_params(planning: dict[str, Any] | None) -> dict[str, Any]:
    """MLflow parent parameters of a planned sweep (``plan.*``; empty without ``--precision``/``--budget``)."""
    if not planning:
        return {}
    keys = ("goal", "timed_steps", "repeats", "predicted_wall_s", "predicted_half_width", "threshold", "model_from")
    return {f"plan.{k}": planning.get(k) for k in keys if planning.get(k) is not None}


def sequential_tags(meta: dict[str, Any]) -> dict[str, str]:
    """MLflow parent tags of a sequential sweep: blocks run of the planned maximum, the last look's line and per
    comparison ``bench.sequential.verdict.<name>`` (its verdict and repeated interval,
    :func:`bench.planning.view.view`: the figures of the report and ``summary.md``)."""
    from bench.planning.view import view  # deferred: bench.planning.view loads scipy

    seq = meta.get("sequential") or {}
    if not seq.get("looks"):
        return {}
    last = seq["looks"][-1]
    v = view(meta)
    return {"bench.sequential.blocks": f"{len(seq['looks'])}/{seq['max_looks']}",
            "bench.sequential.last_look": f"{last['reason']}: {last['line']}"[:4900],
            **{mlflow_key(f"bench.sequential.verdict.{d.name}"):
               f"{d.verdict_text()} ({d.change:+.1%} {d.interval_text()}, look {v.look}/{v.max_looks})"
               for d in (v.decisions if v else [])}}


def sequential_metrics(meta: dict[str, Any]) -> dict[str, float]:
    """MLflow parent metrics of a sequential sweep's verdicts: per comparison ``sequential.change.<name>`` and its
    repeated interval ``sequential.change_low.<name>`` / ``sequential.change_high.<name>`` (relative step-time
    changes; no interval: left out), from :func:`bench.planning.view.view` (empty for a fixed design)."""
    from bench.planning.view import view  # deferred: bench.planning.view loads scipy

    v = view(meta)
    out: dict[str, float] = {}
    for d in v.decisions if v else []:
        for k, x in (("change", d.change), ("change_low", d.change_lo), ("change_high", d.change_hi)):
            if x is not None and math.isfinite(x):
                out[mlflow_key(f"sequential.{k}.{d.name}")] = float(x)
    return out


def sequential_summary(meta: dict[str, Any]) -> list[str]:
    """The ``summary.md`` section of a sequential sweep's verdicts (:func:`bench.planning.view.summary_lines`;
    empty for a fixed design)."""
    from bench.planning.view import summary_lines, view  # deferred: bench.planning.view loads scipy

    v = view(meta)
    return summary_lines(v) if v else []
