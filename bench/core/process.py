"""How a run's process ended (:class:`ExecResult`): what every executor returns and the run's record keeps
(:func:`bench.records.record.build_record`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ExecResult:
    """How a run ended. ``returncode`` is ``None`` when it was killed at the timeout; times in seconds.
    ``node``: where it ran when the executor knows (a Ray job: ``id``, ``ip``, ``name`` of the node its driver
    ran on, as Ray reports it, and the job's ``submission_id``, ``job_start``/``job_end`` epoch seconds);
    ``None`` for a local run."""

    returncode: int | None
    timed_out: bool
    wall_s: float
    reason: str = ""
    node: dict | None = None


__all__ = ["ExecResult"]
