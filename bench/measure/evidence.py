"""Evidence that each factor did what its level says, read from the finished run, for every engine alike.

Each check is an entry of the registry :data:`CHECKS` (entry-point group ``grpo_bench.evidence_checks``, like the
engines and the readers; :class:`EvidenceCheck`: the factor, the target ``"<engine>:<platform>"`` or
``"<engine>:*"``, and the function), found by :func:`evidence_check`; nothing names a check's module. The function
is ``check(level, run) -> (verdict, detail)`` with ``run`` a :class:`FinishedRun`: the run folder and what the
run's processes wrote there (the patch reports ``patches/*.json``, the run's own ``evidence.json``, the run config
the harness wrote, the config verl composed). Verdicts: ``confirmed`` (the run shows the level's effect),
``missing`` (nothing shows it: a silent no-op, flagged), ``contradicted`` (the run shows the other level), ``n/a``
(the factor does not apply).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

from bench.core.plugins import Registry
from bench.spec.optimizations import registry

#: Verdict words, in order of concern.
VERDICTS = ("contradicted", "missing", "confirmed", "n/a")
HYDRA_CONFIG = Path("hydra") / ".hydra" / "config.yaml"


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def load_reports(run_dir: str | Path) -> list[dict[str, Any]]:
    """The per-process patch reports of a run (unreadable files skipped)."""
    return [r for r in (_json(p) for p in sorted(Path(run_dir, "patches").glob("*.json"))) if isinstance(r, dict)]


def load_config(run_dir: str | Path) -> dict[str, Any] | None:
    """The config verl composed for the run (Hydra's ``.hydra/config.yaml``), or ``None``."""
    import yaml

    try:
        return yaml.safe_load(Path(run_dir, HYDRA_CONFIG).read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None


@dataclass
class FinishedRun:
    """A finished run as an evidence check sees it (each part read once, on first use).

    Attributes:
        run_dir: the run folder.
        engine / platform: where it ran.
    """

    run_dir: Path
    engine: str = ""
    platform: str = ""

    @cached_property
    def reports(self) -> list[dict[str, Any]]:
        """The patch reports ``patches/*.json`` (one per process that loaded a patch)."""
        return load_reports(self.run_dir)

    @cached_property
    def composed_config(self) -> dict[str, Any] | None:
        """The config verl composed (``hydra/.hydra/config.yaml``), or ``None``."""
        return load_config(self.run_dir)

    @cached_property
    def own_evidence(self) -> dict[str, Any]:
        """What the run wrote about itself into ``evidence.json`` (the embedded engine: each factor's
        mechanism and counts), or ``{}``."""
        got = _json(Path(self.run_dir) / "evidence.json")
        return got if isinstance(got, dict) else {}

    @cached_property
    def run_config(self) -> dict[str, Any]:
        """The run config the harness wrote (``run_config.yaml``), or ``{}``."""
        import yaml

        try:
            got = yaml.safe_load((Path(self.run_dir) / "run_config.yaml").read_text())
        except (OSError, ValueError, yaml.YAMLError):
            return {}
        return got if isinstance(got, dict) else {}


@dataclass(frozen=True)
class EvidenceCheck:
    """One evidence check, an entry of :data:`CHECKS` (module text).

    Attributes:
        factor: the optimization's key (``dynamic_bsz``).
        target: where it reads a run, ``"<engine>:<platform>"`` or ``"<engine>:*"``.
        check: ``check(level, run) -> (verdict, detail)``, ``run`` a :class:`FinishedRun`; verdicts in
            :data:`VERDICTS`.
    """

    factor: str
    target: str
    check: Callable[..., tuple[str, str]]

    @property
    def name(self) -> str:
        """The registry name, ``"<factor>@<target>"``."""
        return f"{self.factor}@{self.target}"


def _is_check(obj: Any) -> None:
    if not isinstance(obj, EvidenceCheck) or not callable(obj.check) or ":" not in obj.target:
        raise ValueError(f"not an EvidenceCheck(factor, target '<engine>:<platform>', check): {obj!r}")


#: the evidence checks, name ``"<factor>@<target>"`` -> :class:`EvidenceCheck` (group ``grpo_bench.evidence_checks``)
CHECKS: Registry[EvidenceCheck] = Registry("grpo_bench.evidence_checks", "evidence check", lambda c: c.name,
                                           instantiate=False, check=_is_check)


def evidence_check(key: str, engine: str, platform: str) -> Callable[..., tuple[str, str]] | None:
    """The evidence check of factor ``key`` on ``engine``/``platform`` (the :data:`CHECKS` entry
    ``key@engine:platform``, else ``key@engine:*``), or ``None`` when none is registered.

    Raises:
        BenchError: an entry point of the group that cannot be loaded or is not an :class:`EvidenceCheck`.
    """
    items = CHECKS.items()
    for target in (f"{engine}:{platform}", f"{engine}:*"):
        if f"{key}@{target}" in items:
            return items[f"{key}@{target}"].check
    return None


def _call(check, level: int, run: FinishedRun) -> tuple[str, str]:
    if len(inspect.signature(check).parameters) == 3:  # the older (level, patch_reports, composed_config)
        return check(level, run.reports, run.composed_config)
    return check(level, run)


def factor_evidence(run_dir: str | Path, levels: dict[str, int | None], engine: str,
                    platform: str = "*") -> dict[str, dict[str, str]]:
    """Per factor of ``levels``: ``{"verdict": confirmed|missing|contradicted|n/a, "detail": str}``, from the
    check each factor's registry entry names for ``engine``/``platform``; ``missing`` where it names none."""
    run = FinishedRun(Path(run_dir), engine, platform)
    out: dict[str, dict[str, str]] = {}
    for key, level in levels.items():
        if level is None:
            out[key] = {"verdict": "n/a", "detail": "not applicable on this target"}
            continue
        check = evidence_check(key, engine, platform) if key in registry() else None
        if check is None:
            out[key] = {"verdict": "missing", "detail": f"no evidence check for this factor on {engine} yet"}
            continue
        verdict, detail = _call(check, int(level), run)
        out[key] = {"verdict": verdict, "detail": detail}
    return out


def flagged(evidence: dict[str, dict[str, str]]) -> list[str]:
    """Factors whose evidence is ``missing`` or ``contradicted`` (what the harness warns about)."""
    return [k for k, v in evidence.items() if v.get("verdict") in ("missing", "contradicted")]


def env_seen(run: FinishedRun, name: str) -> list[str | None]:
    """The values of environment variable ``name`` that the run's processes recorded (their patch reports'
    ``env``; the run's own ``evidence.json`` for a one-process run), one per process that recorded it."""
    seen = [(r.get("env") or {}).get(name) for r in run.reports if name in (r.get("env") or {})]
    for section in run.own_evidence.values():
        if isinstance(section, dict) and name in section:
            seen.append(section[name])
    return seen


def env_check(name: str, level: int, run: FinishedRun) -> tuple[str, str]:
    """Verdict of a factor whose mechanism is environment variable ``name`` set to ``str(level)``."""
    seen = env_seen(run, name)
    if not seen:
        return "missing", f"no process of the run recorded {name}"
    other = sorted({str(v) for v in seen if v != str(level)})
    if other:
        return "contradicted", f"{name}={','.join(other)} in {len(seen) - seen.count(str(level))} process(es)"
    return "confirmed", f"{name}={level} in {len(seen)} process(es)"


def task_queue(level: int, run: FinishedRun) -> tuple[str, str]:
    """``TASK_QUEUE_ENABLE`` as every process of the run saw it."""
    return env_check("TASK_QUEUE_ENABLE", level, run)


def mc2(level: int, run: FinishedRun) -> tuple[str, str]:
    """``VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE`` as the run's processes (the vLLM workers) saw it."""
    return env_check("VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE", level, run)


def patch_check(name: str, level: int, run: FinishedRun, where: str = "") -> tuple[str, str]:
    """Verdict of a factor whose level 1 is patch ``name``: applied (on a module starting with ``where``) in at
    least one process when on; requested by no process when off."""
    requested = [r for r in run.reports if any(str(x).split(":")[0] == name for x in r.get("requested") or [])]
    applied = [r for r in requested if ((r.get("patches") or {}).get(name) or {}).get("status") == "applied"
               and any(str(a).startswith(where) for a in ((r.get("patches") or {}).get(name) or {}).get("actions")
                       or [""])]
    if not level:
        return ("contradicted", f"patch {name} requested in {len(requested)} process(es)") if requested else \
            ("confirmed", f"patch {name} not requested")
    if applied:
        return "confirmed", f"patch {name} applied in {len(applied)} of {len(requested)} process(es)"
    if not run.reports:
        return "missing", "no patch report in the run"
    return "missing", f"patch {name} applied in none of {len(requested)} process(es) that requested it"


#: the checks of this module (entry points of ``grpo_bench.evidence_checks`` in ``pyproject.toml``)
TASK_QUEUE_NPU = EvidenceCheck("task_queue", "verl:npu", task_queue)
MC2_NPU = EvidenceCheck("mc2", "verl:npu", mc2)
