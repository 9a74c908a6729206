"""Plan: design cells -> runs, applying the registry (applicability, conflicts) and the engine.

For each design cell, in order:

1. a registry conflict (e.g. graph mode with ``TASK_QUEUE_ENABLE=2``) drops it as *invalid*;
2. a matrix ``exclude`` rule drops it as *excluded*;
3. factors not applicable on this engine/platform/settings are set to ``None`` (reason kept);
4. cells whose applicable levels are equal are *merged* into one run, reported for each cell.

Each run becomes a :class:`RunSpec`; its ``cell_id`` is a stable hash of the resolved launch (engine,
platform, argv, env, patches, config), so the same configuration always maps to the same folder. Launches and
ids stay stable under additions: a factor registered after :data:`ID_BASIS_FACTORS` enters a launch (and so the
hash) only where the matrix lists it or sets it off its off level (:func:`launch_levels`), and an engine reduces
its run config to what names a cell (:attr:`bench.engines.base.Engine.id_config`: the embedded engine leaves out a
new field at its default).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bench.core.engine_registry import engine_class, get_engine
from bench.core.errors import BenchError, InputError
from bench.spec.design import Cell, DesignResult, expand
from bench.spec.launch import Launch
from bench.spec.matrix import Matrix
from bench.spec.optimizations import REGISTRY, Mechanism, applicability, conflicts_of, factor_keys, resolve
from bench.spec.stack import STACK_ENV, STACK_FACTOR


class RunSpec(BaseModel):
    """Everything needed to launch one run (one merged cell; repeats share it).

    Attributes:
        cell_id: 12 hex digits, stable hash of the resolved launch.
        engine / platform: where it runs.
        levels: effective factor levels; ``None`` = not applicable here.
        cells: the design cells this run stands for (several when merged).
        not_applicable: factor -> reason, for the factors set to ``None``.
        launch: argv, env, patches and config of the run.
        timeout_s: wall-clock limit of one run, seconds.
        code_version: which code runs it in an interleaved gate sweep (``baseline`` / ``candidate``), a run
            attribute like the repeat: not part of ``cell_id``; ``None`` in a plain sweep (the harness's code).
        stack: the name of the run's stack (:mod:`bench.spec.stack`) where the matrix lists the ``stack`` factor
            (the launch then carries ``BENCH_STACK``, so it names the cell); ``None`` otherwise.
    """

    model_config = ConfigDict(extra="forbid")
    cell_id: str
    engine: str
    platform: str
    levels: dict[str, int | None]
    cells: list[dict[str, int]]
    not_applicable: dict[str, str] = Field(default_factory=dict)
    launch: Launch
    timeout_s: float
    code_version: str | None = None
    stack: str | None = None

    @property
    def label(self) -> str:
        """Short human label: the applicable factors that are on, then the stack's name at every level of the
        ``stack`` factor (the reference stack too: a position is never shown), or ``all-off``."""
        on = [f"{k}={v}" if REGISTRY[k].levels != (0, 1) else k for k, v in self.levels.items()
              if v and k != STACK_FACTOR]
        on += [self.stack] if self.stack else []
        return "+".join(on) if on else "all-off"

    def is_all_off(self) -> bool:
        """True when every applicable factor is at its off level, the stack at the factor's first (the reference
        for speedups)."""
        return all(v is None or v == (REGISTRY[k].off if k in REGISTRY else 0) for k, v in self.levels.items())


class Dropped(BaseModel):
    """A design cell that will not run, with the reason."""

    cell: dict[str, int]
    kind: str  # invalid | excluded
    reason: str


class Plan(BaseModel):
    """The outcome of planning a matrix."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    matrix_name: str
    engine: str
    platform: str
    runs: list[RunSpec]
    dropped: list[Dropped]
    design_cells: int
    varied: list[str]
    aliases: list[str] = Field(default_factory=list)
    resolution: int | None = None
    repeats: int = 1


def detect_platform() -> str:
    """``npu`` when torch_npu sees a device, else ``cuda`` when torch does, else ``cpu``."""
    import importlib.util

    if importlib.util.find_spec("torch_npu") is not None:
        try:
            import torch
            import torch_npu  # noqa: F401

            if torch.npu.is_available():
                return "npu"
        except Exception:
            pass
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            return "cuda"
    return "cpu"


def merge_mechanisms(mechs: list[Mechanism]) -> Mechanism:
    """Union of several mechanisms (env and config: later wins; overrides and patches: concatenated)."""
    env: dict[str, str] = {}
    config: dict[str, Any] = {}
    overrides: list[str] = []
    patches: list[str] = []
    for m in mechs:
        env.update(m.env)
        config.update(m.config)
        overrides.extend(m.overrides)
        patches.extend(m.patches)
    return Mechanism(env=env, config=config, overrides=tuple(overrides), patches=tuple(patches))


#: the factors whose off level has entered every launch (and named every cell) since cell ids began; a factor
#: registered later enters a cell's launch and id only where the matrix lists it or the cell sets it off its off
#: level (so adding an optimization keeps the launch and id of every existing cell: old sweeps resume, baselines
#: match, the launch pins hold)
ID_BASIS_FACTORS = frozenset({"rmsnorm_fused", "task_queue", "dynamic_bsz", "forward_prefetch", "mc2", "mrope_cache",
                              "graph_mode"})


def cell_id_of(engine: str, platform: str, launch: Launch) -> str:
    """Stable 12-hex-digit SHA-256 of the resolved launch (independent of results folder and machine); the run
    config as the engine's ``id_config`` reduces it (default: all of it)."""
    reduce = getattr(engine_class(engine), "id_config", None)
    data = launch.model_dump(exclude={"notes"})
    if reduce is not None:
        data["config"] = reduce(data["config"])
    blob = json.dumps({"engine": engine, "platform": platform, **data}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def launch_levels(levels: dict[str, int | None], listed: set[str] | frozenset[str]) -> dict[str, int | None]:
    """The factor levels whose mechanisms enter a cell's launch (and so its id): every level of a factor of
    :data:`ID_BASIS_FACTORS`, of a factor the matrix lists (``listed``: its ``factors`` keys), or off its registry
    off level, and every ``None`` (not applicable: no mechanism). An optimization a matrix does not list sits at
    its off level in every cell and contributes nothing, so adding one leaves every shipped launch unchanged.

    Args:
        levels: a cell's effective levels (``{factor: level or None}``).
        listed: the factors the matrix lists.
    """
    reg = REGISTRY
    return {k: v for k, v in levels.items()
            if v is None or k in ID_BASIS_FACTORS or k in listed or (k in reg and v != reg[k].off)}


def _matches(cell: Cell, when: dict[str, int]) -> bool:
    return all(cell.get(k) == v for k, v in when.items())


def _optimization_levels(levels: dict[str, int | None]) -> dict[str, int | None]:
    """``levels`` without the ``stack`` factor: what an engine's ``build`` reads (every key an optimization of
    the registry; a stack is no optimization, its interpreter, paths and variables apply at launch)."""
    return {k: v for k, v in levels.items() if k != STACK_FACTOR}


def make_plan(matrix: Matrix, platform: str | None = None, *, strict: bool = True) -> Plan:
    """Expand the matrix's design and turn the runnable cells into :class:`RunSpec` s.

    Args:
        matrix: a validated matrix.
        platform: resolved platform; ``None`` resolves ``matrix.platform`` (``auto`` = detect).
        strict: ``False`` for ``--dry-run`` (engines leave unset ``${VAR}`` visible instead of failing).

    Raises:
        BenchError: the design cannot be built, an engine refuses the settings, or no cell is runnable.
    """
    if platform is None:
        platform = detect_platform() if matrix.platform == "auto" else matrix.platform
    design: DesignResult = expand(matrix)
    engine = get_engine(matrix.engine)
    ctx = matrix.base.context()
    na = {k: applicability(k, matrix.engine, platform, ctx) for k in factor_keys()}
    extra = [STACK_FACTOR] if STACK_FACTOR in matrix.factors else []  # a stack applies everywhere

    dropped: list[Dropped] = []
    groups: dict[tuple, list[Cell]] = {}
    for cell in design.cells:
        reasons = conflicts_of(cell, matrix.engine, platform)  # a conflict the installed stack lifts is not one
        if reasons:
            dropped.append(Dropped(cell=cell, kind="invalid", reason="; ".join(reasons)))
            continue
        rule = next((r for r in matrix.exclude if _matches(cell, r.when)), None)
        if rule is not None:
            dropped.append(Dropped(cell=cell, kind="excluded", reason=rule.reason))
            continue
        effective = tuple((k, None if na.get(k) else cell[k]) for k in [*factor_keys(), *extra])
        groups.setdefault(effective, []).append(cell)

    runs: list[RunSpec] = []
    for effective, cells in groups.items():
        levels = dict(effective)
        used = launch_levels(levels, set(matrix.factors))
        mech = merge_mechanisms([resolve(k, v, matrix.engine, platform) for k, v in used.items()
                                 if v is not None and k in REGISTRY])
        try:  # an engine builds from the optimizations' levels; the stack applies at launch (below, and the runner)
            launch = engine.build(matrix.base, mech, platform, _optimization_levels(used), strict=strict)
        except BenchError as exc:
            raise BenchError(f"{matrix.source}: {exc}") from None
        stack = matrix.stack_of(levels.get(STACK_FACTOR))
        if stack is not None:  # the stack's name names the cell; its interpreter, paths and env apply at launch
            launch = launch.model_copy(update={"env": {**launch.env, STACK_ENV: stack[0]}})
        runs.append(
            RunSpec(
                cell_id=cell_id_of(matrix.engine, platform, launch),
                engine=matrix.engine,
                platform=platform,
                levels=levels,
                cells=cells,
                not_applicable={k: r for k, r in na.items() if r and k in matrix.factors},
                launch=launch,
                timeout_s=matrix.base.timeout_s,
                stack=stack[0] if stack is not None else None,
            )
        )
    if not runs:
        why = "; ".join(sorted({d.reason for d in dropped})) or "the design produced no cell"
        raise BenchError(f"{matrix.source}: no runnable cell: all {len(design.cells)} cells were dropped ({why})")
    return Plan(
        matrix_name=matrix.name,
        engine=matrix.engine,
        platform=platform,
        runs=runs,
        dropped=dropped,
        design_cells=len(design.cells),
        varied=design.varied,
        aliases=design.aliases,
        resolution=design.resolution,
        repeats=matrix.repeats,
    )


# -- run order ----------------------------------------------------------------------------------

#: run orders of a sweep: ``blocked`` (default) and ``sequential`` (every repeat of cell 1, then cell 2 ...)
ORDERS = ("blocked", "sequential")
#: what the library calls the run order in its messages (:class:`bench.core.errors.InputError`; ``--order`` in
#: the commands)
RUN_ORDER = "run order"


class RunOrder(BaseModel):
    """The planned execution order of a sweep's runs, recorded in ``sweep.json`` (key ``order``).

    Attributes:
        kind: ``blocked`` or ``sequential``.
        seed: the shuffle seed (``None`` for ``sequential``).
        runs: ``[cell_id, repeat]`` in execution order; in a blocked order, block ``k`` = the runs of repeat ``k``.
            An interleaved gate order (:func:`interleaved_order`) holds ``[cell_id, repeat, code_version]``.
        versions: the code versions of an interleaved order (empty in a plain sweep).
    """

    model_config = ConfigDict(extra="forbid")
    kind: str
    seed: int | None = None
    runs: list[tuple[str, int] | tuple[str, int, str]]
    versions: list[str] = Field(default_factory=list)

    def todo(self, specs: dict[str, RunSpec]) -> list[tuple[RunSpec, int]]:
        """``(spec, repeat)`` in execution order from the plan's specs by cell id; a run of an interleaved order
        gets its ``code_version`` (a copy of the spec: same cell id)."""
        return [(specs[r[0]].model_copy(update={"code_version": r[2]}) if r[2:] else specs[r[0]], r[1])
                for r in self.runs]

    def blocked(self) -> bool:
        """Whether repeat ``k`` of every run spec ran in time block ``k`` (the report's block factor)."""
        return self.kind == "blocked"


def new_order_seed() -> int:
    """A fresh random seed for the blocked order (31 bits, from the OS entropy pool)."""
    import secrets

    return secrets.randbits(31)


def run_order(cell_ids: list[str], repeats: int, kind: str = "blocked", seed: int | None = None) -> RunOrder:
    """The execution order of ``repeats`` repeats of each run spec.

    * ``blocked``: block ``k`` (``k = 0 .. repeats-1``) holds repeat ``k`` of every run spec, in an order
      shuffled by ``numpy.random.default_rng([seed, k]).permutation``; blocks run one after another.
      This is a randomized complete block design with time as the block (Montgomery, *Design and
      Analysis of Experiments*, 9th ed., sec. 4.1; asv ``--interleave-rounds`` does the same for
      benchmarks): a drift of the machine over the sweep moves whole blocks, which the report's block
      factor absorbs, and the shuffle keeps what drift remains inside a block from lining up with a factor.
    * ``sequential``: every repeat of the first spec, then of the second ... (for debugging; confounds
      drift with the factors).

    Args:
        cell_ids: the plan's run specs, plan order.
        repeats: repeats per spec (>= 1).
        kind: one of :data:`ORDERS`.
        seed: shuffle seed (required for ``blocked``; ignored for ``sequential``).

    Raises:
        BenchError: unknown ``kind`` or a blocked order without a seed.
    """
    import numpy as np

    if kind not in ORDERS:
        raise InputError(RUN_ORDER, f"{RUN_ORDER} {kind}: unknown run order (allowed: {', '.join(ORDERS)})")
    if kind == "sequential":
        return RunOrder(kind=kind, seed=None, runs=[(c, k) for c in cell_ids for k in range(repeats)])
    if seed is None:
        raise BenchError("a blocked run order needs a seed")
    runs: list[tuple[str, int]] = []
    for k in range(repeats):
        perm = np.random.default_rng([int(seed), k]).permutation(len(cell_ids))
        runs += [(cell_ids[int(i)], k) for i in perm]
    return RunOrder(kind=kind, seed=int(seed), runs=runs)


def planned_order(meta: dict[str, Any]) -> RunOrder:
    """The run order recorded in a sweep's ``sweep.json`` (key ``order``); a sweep written before run
    orders existed ran sequentially (plan order, every repeat of a spec in turn)."""
    if meta.get("order"):
        return RunOrder.model_validate(meta["order"])
    plan = meta.get("plan") or {}
    return run_order([c["cell_id"] for c in plan.get("runs", [])], int(plan.get("repeats") or 1), "sequential")

def interleaved_order(cell_ids: list[str], versions: list[str], blocks: int, seed: int) -> RunOrder:
    """A blocked order in which block ``k`` holds repeat ``k`` of every run spec under every code version.

    The ``len(cell_ids) * len(versions)`` runs of a block are shuffled by
    ``numpy.random.default_rng([seed, k]).permutation`` (as :func:`run_order`), so drift within a block hits
    both versions alike and the comparison can pair them by block (asv ``continuous --interleave-rounds``).

    Raises:
        BenchError: fewer than two versions or no block.
    """
    import numpy as np

    if len(versions) < 2 or blocks < 1:
        raise BenchError(f"an interleaved order needs two code versions and a block (got {versions}, {blocks})")
    units = [(c, v) for c in cell_ids for v in versions]
    runs: list[tuple[str, int, str]] = []
    for k in range(blocks):
        perm = np.random.default_rng([int(seed), k]).permutation(len(units))
        runs += [(units[int(i)][0], k, units[int(i)][1]) for i in perm]
    return RunOrder(kind="blocked", seed=int(seed), runs=runs, versions=list(versions))
