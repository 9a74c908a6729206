"""The registry of optimizations, read through functions: :func:`registry` and :func:`factor_keys`.

The built-in optimizations are one module each in this package (like optuna's samplers); each is registered
by one line of the group ``grpo_bench.optimizations`` in ``pyproject.toml``, and a plugin package registers
its own the same way (:mod:`bench.core.plugins`). The entry points are loaded on the first lookup, so the order
of imports never matters: :func:`register_optimization` after any import is seen by every later lookup.

Nothing outside this package knows what an optimization does: the planner asks :func:`resolve` for the
:class:`Mechanism` of one factor level on one engine/platform target and merges what it gets back.
:data:`REGISTRY` and :data:`FACTOR_KEYS` are live read-only views of the registry (never copies), kept for
``from bench.spec.optimizations import REGISTRY``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.core.plugins import Registry
from bench.spec.optimizations.base import Conflict, Mechanism, Optimization
from bench.spec.optimizations.versions import VERL, Bound, Lift, at_least, range_verdict, stack_versions

GROUP = "grpo_bench.optimizations"

CONFLICTS: tuple[Conflict, ...] = (
    Conflict(
        when={"graph_mode": 1, "task_queue": 2},
        reason="graph mode (enforce_eager=false) cannot run with TASK_QUEUE_ENABLE=2; use level 1 "
        "(verl Ascend performance-tuning guide)",
        lifted=(Lift(
            package=VERL, targets=("verl:npu",), env={"VLLM_ASCEND_TASK_QUEUE_ENABLE": "1"},
            since=Bound(version="0.9.0", source="verl PR 6562, first in tag v0.9.0"),
            reason="graph_mode=1 with task_queue=2: verl {version} gives the rollout servers "
            "VLLM_ASCEND_TASK_QUEUE_ENABLE=1 as their TASK_QUEUE_ENABLE (verl PR 6562), training keeps 2: in this "
            "cell task_queue=2 is level 2 for training only",
        ),),
    ),
)


def _check(opt: object) -> None:
    if not isinstance(opt, Optimization):
        raise ValueError(f"not an Optimization ({type(opt).__name__})")


#: the optimizations by key, on :class:`bench.core.plugins.Registry`
OPTIMIZATIONS: Registry[Optimization] = Registry(GROUP, "optimization", lambda o: o.key, instantiate=False,
                                                 check=_check)


def registry() -> dict[str, Optimization]:
    """Every registered optimization by key, in order: entry points (built-ins first), then
    :func:`register_optimization` calls. The dict is the registry itself: read it, do not change it."""
    return OPTIMIZATIONS.items()


def factor_keys() -> tuple[str, ...]:
    """The factor keys, in registry order (the column order of summaries and the order of a cell's levels)."""
    return tuple(OPTIMIZATIONS.items())


def register_optimization(opt: Optimization) -> Optimization:
    """Add ``opt`` to the registry (returns it); seen by every later lookup whenever it is called. A plugin
    package registers with an entry point instead (``CONTRIBUTING.md``). Registering an equal optimization
    again changes nothing.

    Raises:
        ValueError: not an :class:`Optimization`, or another optimization holds the key.
    """
    return OPTIMIZATIONS.register(opt)


def unregister_optimization(key: str) -> None:
    """Remove the optimization ``key`` (tests undo a toy with it)."""
    OPTIMIZATIONS.unregister(key)


class _KeysView(Sequence[str]):
    """:data:`FACTOR_KEYS`: a live read-only sequence over :func:`factor_keys` (compares equal to the tuple)."""

    def __getitem__(self, i):  # type: ignore[override]
        return factor_keys()[i]

    def __len__(self) -> int:
        return len(OPTIMIZATIONS.items())

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, (tuple, list, _KeysView)) else other)

    def __hash__(self) -> int:
        return hash(factor_keys())

    def __repr__(self) -> str:
        return repr(factor_keys())


REGISTRY: Mapping[str, Optimization] = OPTIMIZATIONS.view("REGISTRY")
FACTOR_KEYS: Sequence[str] = _KeysView()


def compact_label(levels: dict[str, int | None], stack: str | None = None) -> str:
    """A cell's compact label from its factor levels: the short codes (:attr:`Optimization.short`) of the
    factors not at their off level, joined by ``+`` in registry order, with ``=<level>`` for factors of more
    than two levels (``rms+tq=1+dbsz``); ``all-off`` when none. Not-applicable (``None``) factors and
    factors not in :data:`REGISTRY` (unknown keys are shown by key) are handled; used for MLflow run names,
    where labels must differ early (``summary.md`` keeps the full labels). ``stack``: the run's stack name where
    the matrix lists the ``stack`` factor (shown last, at every level, in place of its position)."""
    parts = []
    for k in [k for k in REGISTRY if k in levels] + [k for k in levels if k not in REGISTRY]:
        if stack and k == "stack":  # the stack factor (bench.spec.stack.STACK_FACTOR): its name, below
            continue
        v, opt = levels[k], REGISTRY.get(k)
        if v is None or (opt is not None and v == opt.off) or (opt is None and not v):
            continue
        code = opt.short if opt is not None else k
        parts.append(code if opt is not None and opt.levels == (0, 1) else f"{code}={v}")
    parts += [stack] if stack else []
    return "+".join(parts) if parts else "all-off"


def applicability(key: str, engine: str, platform: str, context: dict[str, Any]) -> str | None:
    """Why factor ``key`` is not applicable on ``engine``/``platform`` with these settings, or ``None``.

    Args:
        key: a factor key of :data:`REGISTRY`.
        engine: ``embedded`` or ``verl``.
        platform: ``cpu``, ``cuda`` or ``npu``.
        context: planner context; requirement settings (e.g. ``rollout_tp``) are read from it.

    Raises:
        KeyError: unknown factor key.
    """
    opt = REGISTRY[key]
    for target in (f"{engine}:{platform}", f"{engine}:*"):
        if target in opt.not_applicable:
            return opt.not_applicable[target]
        if target in opt.mechanisms:
            break
    else:
        return f"{opt.title} has no mechanism on the {engine} engine on {platform}"
    for req in (r for r in opt.requires if not r.targets or f"{engine}:{platform}" in r.targets):
        value = context.get(req.setting)
        if value is None or float(value) < req.minimum:
            return f"{req.reason} (here {req.setting}={value})"
    return None


def resolve(key: str, level: int, engine: str, platform: str) -> Mechanism:
    """The :class:`Mechanism` for ``key`` at ``level`` on ``engine``/``platform``.

    Raises:
        KeyError: unknown key, or no mechanism for that target/level (call :func:`applicability` first).
    """
    opt = REGISTRY[key]
    for target in (f"{engine}:{platform}", f"{engine}:*"):
        if target in opt.mechanisms:
            return opt.mechanisms[target][level]
    raise KeyError(f"{key} has no mechanism on {engine}:{platform}")


def article_factors() -> list[tuple[str, int]]:
    """``(factor, level)`` of the optimizations with an article figure (:attr:`Optimization.article_level`),
    largest article gain first: the rows of the report's comparison with the article."""
    opts = [o for o in REGISTRY.values() if o.article_level is not None]
    opts.sort(key=lambda o: -(o.article_gain or 0.0))
    return [(o.key, o.article_level) for o in opts]


def _lift(c: Conflict, engine: str | None, platform: str | None, versions: dict[str, str] | None) -> Lift | None:
    if engine is None or platform is None:
        return None
    if versions is None:
        versions = stack_versions(platform)
    return next((lift for lift in c.lifted if f"{engine}:{platform}" in lift.targets
                 and at_least(versions.get(lift.package), lift.since)), None)


def conflicts_of(levels: dict[str, int | None], engine: str | None = None, platform: str | None = None,
                 versions: dict[str, str] | None = None) -> list[str]:
    """Reasons why this combination of factor levels is invalid (empty list when valid). With ``engine``
    and ``platform``, a conflict that the stack's ``versions`` (default: :func:`stack_versions`) lift there
    (:attr:`Conflict.lifted`) is not one."""
    return [c.reason for c in CONFLICTS if all(levels.get(k) == v for k, v in c.when.items())
            and _lift(c, engine, platform, versions) is None]


def conflict_lifts(levels: dict[str, int | None], engine: str, platform: str,
                   versions: dict[str, str] | None = None) -> list[tuple[dict[str, str], str]]:
    """``(env, note)`` of each conflict these levels meet that the stack lifts on ``engine``/``platform``:
    what the engine adds to the cell's launch so that it runs instead of being dropped."""
    if versions is None:
        versions = stack_versions(platform)
    out = []
    for c in CONFLICTS:
        lift = _lift(c, engine, platform, versions) if all(levels.get(k) == v for k, v in c.when.items()) else None
        if lift is not None:
            out.append((dict(lift.env), lift.reason.format(version=versions.get(lift.package))))
    return out


def switch_ranges(key: str, engine: str, platform: str) -> tuple:
    """The :class:`~bench.spec.optimizations.versions.SwitchRange` s of factor ``key`` on ``engine``/``platform``
    (the exact target first, then ``<engine>:*``; empty when the registry names none).

    Raises:
        KeyError: unknown factor key.
    """
    opt = REGISTRY[key]
    for target in (f"{engine}:{platform}", f"{engine}:*"):
        if target in opt.switches:
            return opt.switches[target]
    return ()


def not_read(key: str, engine: str, platform: str, versions: dict[str, str] | None = None) -> str | None:
    """``"<key>: not read by <package> <version> (<switch> removed in <source>)"`` when the stack's ``versions``
    (default: :func:`stack_versions` of ``platform``) lie outside a range of the factor's switch there, else
    ``None`` (read, or a version or bound unknown). Such a factor's effect is not measured.

    Raises:
        KeyError: unknown factor key.
    """
    if versions is None:
        versions = stack_versions(platform)
    for rng in switch_ranges(key, engine, platform):
        why = range_verdict(rng, versions)
        if why:
            return f"{key}: {why}"
    return None
