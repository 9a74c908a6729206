"""What the patches did in a finished run, read from ``patches/sitecustomize.py``'s per-process reports
(``<run>/patches/*.json``): :func:`patch_evidence`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def patch_evidence(run_dir: str | Path) -> dict[str, str]:
    """One line per patch summarising the per-process reports in ``run_dir/patches/*.json``
    (written by ``patches/sitecustomize.py``), small enough for an MLflow tag, e.g.
    ``{"qwen3vl_npu_fused:on": "applied in 8 (ray-worker 8); armed in 3; refused in 0"}``; a refusal or
    error adds its first reason."""
    out: dict[str, str] = {}
    stats: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(run_dir, "patches").glob("*.json")):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for name, rec in (report.get("patches") or {}).items():
            key = f"{name}:{rec.get('mode')}" if rec.get("mode") else name
            st = stats.setdefault(key, {"applied": {}, "armed": 0, "refused": 0, "error": 0, "reason": ""})
            status = rec.get("status", "?")
            if status == "applied":
                role = report.get("role", "?")
                st["applied"][role] = st["applied"].get(role, 0) + 1
            elif status in ("armed", "refused", "error"):
                st[status] += 1
            if status in ("refused", "error") and not st["reason"]:
                st["reason"] = str(rec.get("reason", ""))[:300]
    for key, st in sorted(stats.items()):
        n_applied = sum(st["applied"].values())
        roles = ", ".join(f"{r} {n}" for r, n in sorted(st["applied"].items()))
        line = f"applied in {n_applied}" + (f" ({roles})" if roles else "") + f"; armed in {st['armed']}"
        line += f"; refused in {st['refused']}" + (f"; error in {st['error']}" if st["error"] else "")
        if st["reason"]:
            line += f": {st['reason']}"
        out[key] = line
    return out
