"""A run's figures from its per-step metrics, computed once: the per-step samples of every figure
(:func:`step_samples`) and the run's statistics (:func:`summarize`), both over the same steps.

Which steps: the *measured* steps are the training steps after the warm-up; the *timed* steps are the
measured steps that ran without the profiler (all measured steps when every one was profiled: the
summary's ``timed_steps`` says which). Every time-like figure (step time, phases, rollout share,
throughput, response lengths) is over the timed steps, because the profiler perturbs timing; the Free
ratio is over the profiled measured steps (it exists only there). A run's value of a figure is the median
of its samples (:func:`bench.records.figures.run_value` is the same :func:`~bench.measure._common.median`), so the
record's summary, the snapshot, the report, the gate, MLflow and the tune see one number per run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.measure._common import finite, iqr, mean, median
from bench.measure.jsonl import MetricsLog, StepMetrics

#: phase key -> verl metric (seconds); ``other`` = ``timing_s/step`` minus the phases present
PHASES = {
    "gen": "timing_s/gen",
    "reward": "timing_s/reward",
    "old_log_prob": "timing_s/old_log_prob",
    "ref": "timing_s/ref",
    "adv": "timing_s/adv",
    "update_actor": "timing_s/update_actor",
}
STEP_TIME = "timing_s/step"
#: process CPU seconds (user + sys, all threads) of a step, logged beside ``timing_s/step`` by CPU engines that can
#: time their step in-process (the embedded engine: ``time.process_time`` around the step)
STEP_CPU = "timing_s/step_cpu"
THROUGHPUT = "perf/throughput"


def _num(v: Any) -> float | None:
    """``v`` as a finite float, else ``None``."""
    if isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def timed_steps(measured: Sequence[int], profiled: Iterable[int]) -> list[int]:
    """The measured steps that ran without the profiler; all of ``measured`` when every one was profiled."""
    prof = set(profiled)
    return [s for s in measured if s not in prof] or list(measured)


def step_samples(by_step: Mapping[int, Mapping[str, Any]], steps: Sequence[int]) -> dict[str, list[float]]:
    """Per-step samples of a run's time figures at ``steps`` (in that order; a step without the value adds
    none): ``step_time`` (``timing_s/step``, s), ``cpu_time`` (``timing_s/step_cpu``, process CPU s: user + sys of
    every thread; engines that do not log it give none), ``throughput`` (``perf/throughput``, tokens/s per device),
    ``rollout_share`` (``timing_s/gen / timing_s/step``), ``phase_share/<phase>`` (each phase's share of the
    step; ``other`` = the rest, at least 0) and ``phase_s/<phase>`` (seconds; ``other`` = step minus the
    phases present). ``by_step``: ``{step: {verl metric: value}}`` (step keys int)."""
    out: dict[str, list[float]] = {"step_time": [], "cpu_time": [], "throughput": [], "rollout_share": []}
    for p in (*PHASES, "other"):
        out[f"phase_share/{p}"] = []
        out[f"phase_s/{p}"] = []
    for s in steps:
        row = by_step.get(s) or {}
        st, tp = _num(row.get(STEP_TIME)), _num(row.get(THROUGHPUT))
        if tp is not None:
            out["throughput"].append(tp)
        if (cpu := _num(row.get(STEP_CPU))) is not None:
            out["cpu_time"].append(cpu)
        for p, m in PHASES.items():
            if (v := _num(row.get(m))) is not None:
                out[f"phase_s/{p}"].append(v)
        if st is None:
            continue
        out["step_time"].append(st)
        parts = {p: _num(row.get(m)) for p, m in PHASES.items()}
        out["phase_s/other"].append(st - sum(v for v in parts.values() if v is not None))
        if st > 0:
            if parts["gen"] is not None:
                out["rollout_share"].append(parts["gen"] / st)
            for p, v in parts.items():
                out[f"phase_share/{p}"].append((v or 0.0) / st)
            out["phase_share/other"].append(max(0.0, 1.0 - sum(v or 0.0 for v in parts.values()) / st))
    return out


def _as_step_dict(steps) -> dict[int, Mapping[str, float]]:
    if isinstance(steps, MetricsLog):
        return steps.by_step()
    if isinstance(steps, Mapping):
        return {int(k): v for k, v in steps.items()}
    result = {}
    for item in steps:
        if isinstance(item, StepMetrics):
            result[item.step] = item.metrics
        else:
            raise TypeError(f"summarize: cannot read a step from {type(item).__name__}")
    return result


def _with_prefixes(rows: Sequence[Mapping[str, Any]], key: str) -> list[Any]:
    """Values of ``key`` and of ``<role>/key`` (e.g. ``actor/perf/max_memory_allocated_gb``) over the
    given step rows, in row order (all roles of a row, unprefixed first)."""
    suffix = "/" + key
    return [v for r in rows for k, v in r.items() if k == key or k.endswith(suffix)]


def peak_memory(rows: Sequence[Mapping[str, Any]]) -> tuple[float | None, str | None]:
    """``(GiB, source metric)``: max of ``perf/max_memory_allocated_gb`` when any value is > 0, else max of
    ``perf/cpu_memory_used_gb``; each key also under a role prefix (verl >= 0.7 logs the actor's as
    ``actor/perf/max_memory_allocated_gb``: ``verl/workers/engine_workers.py`` + the trainer's ``actor/``
    prefix; verl 0.6.1 unprefixed). ``(None, None)`` when no step logged memory (missing, never 0)."""
    dev_mem = finite(_with_prefixes(rows, "perf/max_memory_allocated_gb"))
    cpu_mem = finite(_with_prefixes(rows, "perf/cpu_memory_used_gb"))
    if dev_mem and max(dev_mem) > 0:
        return max(dev_mem), "perf/max_memory_allocated_gb"
    if cpu_mem:
        return max(cpu_mem), "perf/cpu_memory_used_gb"
    if dev_mem:
        return max(dev_mem), "perf/max_memory_allocated_gb"
    return None, None


def summarize(
    steps,
    warmup_steps: int,
    free_ratio: Mapping[int, float] | None = None,
    profiled_steps: Iterable[int] | None = None,
) -> dict:
    """A run's statistics: time figures over its timed steps, the Free ratio over its profiled measured steps.

    Args:
        steps: the per-step metrics: ``{step: {metric: value}}``, a :class:`MetricsLog`, a list of
            :class:`StepMetrics`, or the whole :func:`bench.measure.collect` result (then ``free_ratio`` and
            ``profiled_steps`` default to its own).
        warmup_steps: how many leading training steps (in step order, whatever the first step
            number) are warm-up and excluded. Training steps are the steps that logged
            ``timing_s/step`` (verl's step-0 validation record is not one); all steps if none did.
        free_ratio: ``{step: free ratio}`` (e.g. ``collect(...)["free_ratio"]``).
        profiled_steps: steps run under the profiler (default: the keys of ``free_ratio``).

    Returns a dict (``None`` for a statistic without data; seconds, GiB, tokens as in verl):

    * ``n_steps`` (training steps), ``warmup_steps``; ``measured_steps`` (after the warm-up);
      ``profiled_steps``; ``profiled_measured_steps`` (measured steps the profiler perturbed);
      ``timed_steps`` (:func:`timed_steps`: the steps of every time figure below).
    * ``step_time_samples_s`` (``timing_s/step`` of each timed step), ``step_time_median_s``,
      ``step_time_iqr_s`` (q75 - q25, numpy linear), ``step_time_mean_s``.
    * ``cpu_time_samples_s`` (``timing_s/step_cpu`` of each timed step: process CPU seconds, user + sys, all
      threads; empty where the engine does not log it) and ``cpu_time_median_s``.
    * ``phase_median_s``: ``{gen, reward, old_log_prob, ref, adv, update_actor, other}``, each the
      median over the timed steps of ``timing_s/<phase>``; ``other`` = median of
      ``timing_s/step - sum(phases logged in that step)``.
    * ``rollout_share_median``: median of ``timing_s/gen / timing_s/step``.
    * ``throughput_median``: median of ``perf/throughput`` (tokens/s per device).
    * ``peak_memory_gb`` and ``peak_memory_source`` (:func:`peak_memory`, over every measured step).
    * ``response_length_mean``, ``response_length_max``, ``response_length_min``,
      ``response_clip_ratio``: means over the timed steps of ``response_length/{mean,max,min,clip_ratio}``.
    * ``long_tail_waste_median``: median of ``1 - response_length/mean / response_length/max`` (the share of
      the longest response's decode time the average sample does not use).
    * ``free_ratio_median``: median of ``free_ratio`` over the profiled measured steps.
    """
    if isinstance(steps, Mapping) and "metrics" in steps and "free_ratio" in steps:
        if free_ratio is None:
            free_ratio = steps["free_ratio"]
        if profiled_steps is None:
            profiled_steps = steps.get("profiled_steps")
        steps = steps["metrics"]
    by_step = _as_step_dict(steps)
    # training steps are those that logged timing_s/step (verl logs the validation before training
    # as a step-0 record without it); if none did, every step counts
    order = sorted(s for s, m in by_step.items() if STEP_TIME in m) or sorted(by_step)
    warm = max(0, int(warmup_steps))
    measured = order[warm:]
    free_ratio = {int(k): v for k, v in (free_ratio or {}).items()}
    profiled = sorted(int(s) for s in (profiled_steps if profiled_steps is not None else free_ratio))
    profiled_measured = [s for s in measured if s in set(profiled)]
    timed = timed_steps(measured, profiled)
    rows = [by_step[s] for s in timed]
    samples = step_samples(by_step, timed)

    def col(name: str) -> list[float | None]:
        return [r.get(name) for r in rows]

    waste = []
    for r in rows:
        mx, mn = _num(r.get("response_length/max")), _num(r.get("response_length/mean"))
        if mx is not None and mn is not None and mx > 0:
            waste.append(1.0 - mn / mx)
    peak, peak_src = peak_memory([by_step[s] for s in measured])
    return {
        "n_steps": len(order),
        "warmup_steps": warm,
        "measured_steps": measured,
        "profiled_steps": profiled,
        "profiled_measured_steps": profiled_measured,
        "timed_steps": timed,
        "step_time_samples_s": samples["step_time"],
        "step_time_median_s": median(samples["step_time"]),
        "step_time_iqr_s": iqr(samples["step_time"]),
        "step_time_mean_s": mean(samples["step_time"]),
        "cpu_time_samples_s": samples["cpu_time"],
        "cpu_time_median_s": median(samples["cpu_time"]),
        "phase_median_s": {p: median(samples[f"phase_s/{p}"]) for p in (*PHASES, "other")},
        "rollout_share_median": median(samples["rollout_share"]),
        "throughput_median": median(samples["throughput"]),
        "peak_memory_gb": peak,
        "peak_memory_source": peak_src,
        "response_length_mean": mean(col("response_length/mean")),
        "response_length_max": mean(col("response_length/max")),
        "response_length_min": mean(col("response_length/min")),
        "response_clip_ratio": mean(col("response_length/clip_ratio")),
        "long_tail_waste_median": median(waste),
        "free_ratio_median": median(free_ratio.get(s) for s in profiled_measured),
    }
