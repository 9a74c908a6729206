"""The metrics a sweep is judged on (:data:`METRICS`): the ones a matrix's ``expect`` claims name, the gate and the
report compare, with their units and which way is better."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Metric(BaseModel):
    """A metric the gate and the report compare: where its per-step samples come from and which way is better.

    ``scale``: ``log`` (strictly positive; changes are ratios) or ``linear`` (may be 0; changes are
    differences divided by the reference value).
    """

    model_config = ConfigDict(frozen=True)
    key: str
    title: str
    unit: str
    higher_is_better: bool
    scale: str
    source: str


METRICS: dict[str, Metric] = {m.key: m for m in (
    Metric(key="step_time", title="step time", unit="s", higher_is_better=False, scale="log",
           source="timing_s/step of the timed steps"),
    Metric(key="throughput", title="throughput", unit="tokens/s", higher_is_better=True, scale="log",
           source="perf/throughput of the timed steps"),
    Metric(key="rollout_share", title="rollout share", unit="", higher_is_better=False, scale="linear",
           source="timing_s/gen / timing_s/step of the timed steps"),
    Metric(key="free_ratio", title="Free ratio", unit="", higher_is_better=False, scale="linear",
           source="per-step Free ratio of the profiled measured steps"),
    Metric(key="cpu_time", title="CPU time per step", unit="s", higher_is_better=False, scale="log",
           source="timing_s/step_cpu of the timed steps (process CPU seconds, user + sys, all threads; CPU engines)"),
)}


__all__ = ["METRICS", "Metric"]
