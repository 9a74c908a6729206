"""The code versions of a sweep as it keeps them (an interleaved gate sweep runs a baseline's and a candidate's
code: :mod:`bench.gate.versions`): the fingerprint a rerun resumes by (:func:`gate_fingerprint`) and what
``sweep.json`` keeps of each version (:func:`version_meta`)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def gate_fingerprint(fp: str, code_versions: dict[str, dict[str, Any]]) -> str:
    """Fingerprint of an interleaved gate sweep (the one a rerun resumes): the matrix's ``fp`` plus each
    version's name and commit, so it never resumes a plain sweep or one against another baseline; ``fp`` itself
    for a plain sweep (no versions)."""
    if not code_versions:
        return fp
    blob = json.dumps([fp, sorted((k, v.get("commit")) for k, v in code_versions.items())])
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def version_meta(code_versions: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What ``sweep.json`` keeps of each code version (``commit``, ``ref``, ``dirty``): no machine path."""
    return {k: {x: v.get(x) for x in ("commit", "ref", "dirty") if x in v} for k, v in code_versions.items()}


__all__ = ["gate_fingerprint", "version_meta"]
