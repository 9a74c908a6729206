"""Speed normalization: per-step samples corrected for the machine's speed at the time of the step.

The embedded engine times a fixed reference kernel around every unprofiled step (the speed probe,
:mod:`bench.engines.builtins.speed_probe`, logged as ``bench/speed_probe_s``). On a shared VM the
CPU's speed drifts by several percent between minutes, which moves every step of a sweep alike and
no per-step test can tell from a change of the code. Dividing each step time by the probe time of its
step removes that drift (measured on the CI VM: SD of 20-s block means 4.6 % raw, 1.4 % normalized).

Normalized value of a sample ``x`` whose step saw probe time ``p``, against the reference probe time
``ref`` (the baseline side's median probe, so values stay in seconds at the baseline's speed):

* time-like metrics (lower is better: ``step_time``): ``x * ref / p``;
* rate-like metrics (``throughput``): ``x * p / ref``;
* ratios (``rollout_share``, ``free_ratio``) are not normalized: the drift cancels inside them.

Both sides must carry a probe of the same kernel (:func:`probe_spec`) at every sample; otherwise
:func:`normalizable` says why not and the caller compares raw samples.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from bench.records.figures import run_value

#: the metric an engine with a speed probe logs per step: seconds of the reference kernel around the step
PROBE_METRIC = "bench/speed_probe_s"

#: gate metrics that scale with the machine's speed: +1 time-like (x * ref / p), -1 rate-like (x * p / ref)
SPEED_SCALED = {"step_time": +1, "throughput": -1}


def probe_spec(rec: dict[str, Any]) -> str | None:
    """The probe kernel's identity in a run record's evidence, or None when the run had no probe."""
    sp = (rec.get("evidence") or {}).get("speed_probe") or {}
    return sp.get("spec") if sp.get("enabled") else None


def probe_from_patches(reports: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``speed_probe`` evidence of a run whose probe a patch timed (verl:cpu: ``verl_speed_probe``, timed by
    verl's driver between steps), from the run's patch reports (``patches/*.json``, :mod:`bench_patches`):
    ``{"enabled": True, "spec", "metric", "placement"}`` of the first process whose patch applied and named its
    kernel, or None (no such patch, or it never applied: the run's steps carry no probe)."""
    for rep in reports:
        for pr in ((rep or {}).get("patches") or {}).values():
            probe = pr.get("probe") if isinstance(pr, dict) else None
            if isinstance(probe, dict) and pr.get("status") == "applied" and probe.get("metric") == PROBE_METRIC:
                return {"enabled": True, "spec": probe.get("spec"), "metric": PROBE_METRIC,
                        "placement": probe.get("placement")}
    return None


def _reps(cell: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in cell["repeats"] if r.get("status") == "ok"]


def normalizable(base_cell: dict[str, Any], cand_cell: dict[str, Any], metric: str) -> str | None:
    """None when ``metric`` of the two cells can be speed-normalized, else the reason it cannot.

    Cells are snapshot cells (:func:`bench.records.snapshot.snapshot`): each ok repeat carries ``samples``
    (with ``speed_probe`` aligned to ``step_time``/``throughput``) and ``probe_spec``.
    """
    if metric not in SPEED_SCALED:
        return (f"{metric} is CPU time (not scaled by the wall-clock probe)" if metric == "cpu_time" else
                f"{metric} is a ratio (not speed-scaled)")
    specs = set()
    for side, cell in (("baseline", base_cell), ("candidate", cand_cell)):
        reps = _reps(cell)
        if not reps:
            return f"no finished repeats in the {side}"
        for r in reps:
            pr, xs = r["samples"].get("speed_probe") or [], r["samples"].get(metric) or []
            if not pr or len(pr) != len(xs) or min(pr) <= 0:
                return f"the {side} has no speed probe at every {metric} sample (run r{r.get('repeat')})"
            specs.add(r.get("probe_spec"))
    if len(specs) != 1 or None in specs:
        return f"the two sides used different probe kernels ({', '.join(sorted(map(str, specs)))})"
    return None


def probe_groups(cell: dict[str, Any]) -> list[list[float]]:
    """Per ok repeat, the probe seconds of the timed steps."""
    return [list(r["samples"].get("speed_probe") or []) for r in _reps(cell)]


def normalize(groups: Sequence[Sequence[float]], probes: Sequence[Sequence[float]], ref: float,
              metric: str) -> list[list[float]]:
    """Speed-normalized copy of ``groups`` (per repeat, per step), see the module text for the formula.

    Raises:
        ValueError: a repeat whose probe list does not match its samples, or ``metric`` not speed-scaled.
    """
    sign = SPEED_SCALED[metric]
    out = []
    for xs, ps in zip(groups, probes, strict=True):
        if len(xs) != len(ps):
            raise ValueError(f"{len(xs)} {metric} samples but {len(ps)} probe times")
        x, p = np.asarray(xs, float), np.asarray(ps, float)
        out.append((x * (ref / p) ** sign).tolist())
    return out


def normalized_pair(base_cell: dict[str, Any], cand_cell: dict[str, Any], metric: str,
                    base_groups: list[list[float]], cand_groups: list[list[float]]
                    ) -> tuple[list[list[float]], list[list[float]], float]:
    """Both sides' groups normalized to the baseline's median probe.

    Returns ``(base, cand, speed change)``; the speed change is the candidate's median probe time vs
    the baseline's, minus 1 (+0.04 = the machine ran 4 % slower during the candidate).
    """
    pb, pc = probe_groups(base_cell), probe_groups(cand_cell)
    ref = float(np.median(np.concatenate(pb)))
    return (normalize(base_groups, pb, ref, metric), normalize(cand_groups, pc, ref, metric),
            float(np.median(np.concatenate(pc))) / ref - 1.0)


def normalized_median(xs: Sequence[float], probes: Sequence[float], ref: float, metric: str) -> float | None:
    """One run's value (:func:`bench.records.figures.run_value`, the median of its timed-step samples) after speed
    normalization to ``ref``; None when the probes do not cover every sample."""
    if not probes or len(probes) != len(xs):
        return None
    return run_value(normalize([xs], [probes], ref, metric)[0])


def normalize_snapshot(snap: dict[str, Any]) -> float | None:
    """Speed-normalize a whole sweep snapshot in place, for reports comparing its cells with each other.

    When every ok repeat of every cell carries a probe at each timed step, all of one kernel, each
    repeat's ``step_time`` and ``throughput`` samples are normalized to ``ref`` = the median probe time
    over the sweep (the raw samples move to ``step_time_raw`` / ``throughput_raw``; ``speed_probe`` is
    emptied so that no later comparison normalizes twice). Returns ``ref`` (seconds), or None (and
    nothing changed) when some repeat lacks the probe.
    """
    reps = [r for c in snap.get("cells", []) for r in c.get("repeats", []) if r.get("status") == "ok"]
    if not reps or len({r.get("probe_spec") for r in reps}) != 1 or reps[0].get("probe_spec") is None:
        return None
    for r in reps:
        pr = r["samples"].get("speed_probe") or []
        if not pr or any(len(r["samples"].get(m) or []) not in (0, len(pr)) for m in SPEED_SCALED):
            return None
    ref = float(np.median(np.concatenate([np.asarray(r["samples"]["speed_probe"], float) for r in reps])))
    for r in reps:
        smp = r["samples"]
        for m in SPEED_SCALED:
            if smp.get(m):
                smp[f"{m}_raw"] = list(smp[m])
                smp[m] = normalize([smp[m]], [smp["speed_probe"]], ref, m)[0]
        smp["speed_probe"] = []
    return ref
