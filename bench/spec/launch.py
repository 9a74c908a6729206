"""A launch: what an executor needs to start one run (:class:`Launch`, built by an engine for each planned cell),
and the machine placeholders it may hold (:func:`machine_placeholders`, :func:`fill_placeholders`).

Placeholders in ``argv`` / ``env`` / ``config``: ``{run_dir}`` (the run folder, absolute), ``{python}`` (the
interpreter), ``{repo}`` (the checkout) and those the engines name (:meth:`bench.engines.base.EngineBase.placeholders`)
are filled by the executor at launch time, so the cell id (a hash of the launch) does not depend on where results
are written or on the machine.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bench.core.engine_registry import engine_classes

#: Repository root (put on ``PYTHONPATH`` so ``python -m bench...`` works from any cwd; the ``{repo}`` placeholder).
REPO_ROOT = Path(__file__).resolve().parents[2]


class Launch(BaseModel):
    """What an executor needs to start one run.

    Attributes:
        argv: the command as a list (never a shell string); may contain ``{python}``/``{run_dir}``.
        env: environment variables set on top of the harness's environment.
        patches: runtime patch specs loaded in every process of the run (``patches/``).
        config: the engine's resolved run configuration (written to ``config_file`` in the run folder).
        config_file: file name of that configuration inside the run folder.
        notes: anything the user should see in ``--dry-run`` (warnings, unset variables ...).
    """

    model_config = ConfigDict(extra="forbid")
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    patches: list[str] = Field(default_factory=list)
    config: dict[str, Any] = Field(default_factory=dict)
    config_file: str = "run_config.yaml"
    notes: list[str] = Field(default_factory=list)


def machine_placeholders(python: str = sys.executable) -> dict[str, str]:
    """The placeholders a launch may hold that name this machine, filled at launch time so that a cell id
    (a hash of the launch) is the same everywhere: ``{python}`` (the harness's interpreter), ``{repo}`` (this
    checkout) and those of every registered engine (:meth:`bench.engines.base.EngineBase.placeholders`, e.g.
    ``{verl_python}``, ``{bench_cache}``)."""
    out: dict[str, str] = {}
    for cls in engine_classes():
        out.update(getattr(cls, "placeholders", dict)())
    return {"python": python, **out, "repo": str(REPO_ROOT)}


def fill_placeholders(text: str, python: str = sys.executable) -> str:
    """``text`` with the :func:`machine_placeholders` replaced (``{run_dir}`` is left as it is)."""
    for key, value in machine_placeholders(python).items():
        text = text.replace("{" + key + "}", value)
    return text


__all__ = ["REPO_ROOT", "Launch", "fill_placeholders", "machine_placeholders"]
