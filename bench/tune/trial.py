"""One trial = one run spec: the fixed cell, the trial's matrix and spec (built like a sweep's cell), and the
constraint value of an infeasible run."""

from __future__ import annotations

import re
from typing import Any

from bench.core.errors import BenchError
from bench.spec.matrix import ExplicitDesign, Matrix
from bench.spec.optimizations import REGISTRY, factor_keys
from bench.spec.plan import RunSpec, make_plan
from bench.tune.space import PARAMS, TuneBlock

INFEASIBLE_KINDS = ("infeasible", "oom")
LOG_TAIL_CHARS = 4000


class TrialFailed(Exception):
    """A trial whose run failed for a reason other than infeasibility (recorded FAIL, the tune goes on)."""


def fixed_cell(matrix: Matrix, block: TuneBlock) -> dict[str, int]:
    """The factor levels of every trial: ``tune.fixed``, else the matrix's first level (dynamic bsz on)."""
    cell = {k: matrix.factors.get(k, [REGISTRY[k].off])[0] for k in factor_keys()}
    cell.update(block.fixed)
    cell["dynamic_bsz"] = 1
    return cell


def trial_matrix(matrix: Matrix, cell: dict[str, int], limits: dict[str, int]) -> Matrix:
    """A copy of ``matrix`` whose ``base`` carries ``limits`` and whose design is the single ``cell``."""
    base = matrix.base.model_copy(update={PARAMS[k]: v for k, v in limits.items()})
    return matrix.model_copy(update={"base": base, "design": ExplicitDesign(type="explicit", cells=[dict(cell)]),
                                     "repeats": 1})


def trial_spec(matrix: Matrix, cell: dict[str, int], limits: dict[str, int], platform: str) -> RunSpec:
    """The :class:`RunSpec` of one trial, built by :func:`bench.spec.plan.make_plan` like a sweep's cell.

    Raises:
        BenchError: the fixed cell is invalid or excluded, or the engine refuses the settings.
    """
    plan = make_plan(trial_matrix(matrix, cell, limits), platform, strict=True)
    spec = plan.runs[0]
    if spec.levels.get("dynamic_bsz") != 1:
        why = spec.not_applicable.get("dynamic_bsz", "not applicable")
        raise BenchError(f"{matrix.source}: tune: dynamic_bsz is not applicable here ({why}): nothing to tune")
    return spec


#: study user attributes: the reference probe time (s) and kernel that trial objectives are normalized to
PROBE_REF, PROBE_SPEC = "speed_probe_ref_s", "speed_probe_spec"

#: the longest sequence in a failure message: verl's assert (``max_seq_len=N``) or the embedded engine's
_MAX_SEQ = re.compile(r"(?:max_seq_len\s*[=:]\s*(?:tensor\()?|longest sequence (?:of |\()?)(\d+)")


def constraint_of(rec: dict[str, Any], limits: dict[str, int], seq: int) -> float:
    """Constraint value (> 0 = infeasible) of a failed record of kind infeasible / oom.

    Too-small limit: ``1 + shortfall / (P+R)``, the shortfall measured against the longest sequence the
    engine reported (verl's ``max_seq_len=N`` or the embedded engine's "longest sequence of N"
    tokens in the reason or log), else against P+R, so TPE ranks a
    deeper violation worse. Out of memory: ``1`` (the threshold is unknown).
    """
    if rec.get("failure_kind") != "infeasible":
        return 1.0
    found = _MAX_SEQ.findall(f"{rec.get('reason', '')}\n{rec.get('log_tail', '')}")
    longest = int(found[-1]) if found else seq
    shortfall = max(0, longest - min(limits.values()))
    return 1.0 + shortfall / seq
