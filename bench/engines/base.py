"""The small interface every engine implements, and the lookup of engines by name.

An engine turns one planned cell (the matrix ``base`` block plus the merged :class:`Mechanism` of its
factor levels) into a :class:`Launch`: the argv, environment, patches and config file of one run. It
never runs anything itself; executors do (:mod:`bench.execution.executors`). Both engines write verl's
file-logger JSONL into the run folder, so measuring (:mod:`bench.measure`) is shared.

Placeholders in ``argv`` / ``env`` / ``config``: ``{run_dir}`` (the run folder, absolute) and
``{python}`` (the interpreter) are filled by the executor at launch time, so the cell id (a hash of the
launch) does not depend on where results are written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from bench.core.engine_registry import engine_class
from bench.core.engine_registry import get_engine as lookup
from bench.core.errors import BenchError, did_you_mean
from bench.spec.launch import Launch  # the launch an engine builds (engines name it from here, as the recipe does)
from bench.spec.loading import value_message
from bench.spec.matrix import Base, Matrix
from bench.spec.optimizations import Mechanism


class Engine(Protocol):
    """An engine: ``build`` a launch for one cell; ``preflight`` checks before a real sweep.

    Every question the harness has about an engine is asked of its class, never of its name;
    :class:`EngineBase` gives each capability its default, so an engine class states only what differs.

    Class attributes:
        name: the ``engine:`` value of a matrix file.
        options_key: the key under ``base`` holding this engine's own settings, or ``None``: a matrix may
            then hold a mapping ``base.<options_key>`` (any matrix, whatever its engine; empty by default),
            which this engine reads with ``base.options(options_key)`` and checks with ``check_options``
            (by default against its pydantic ``options_model``).
        shows_config: ``--dry-run`` prints the run config the launch writes (the embedded run config).
        forkserver_platforms: platforms on which runs may fork from a warm server (``--spawn`` turns it off).
        forkserver_preload: modules that server imports once before forking runs of this engine.
        supports_smoke: ``run --smoke`` can exercise this engine's launches on a CPU.
        bracket_probe: the harness times the machine-speed probe kernel right before and right after each run
            on the CPU (platform ``cpu``) of the harness's own machine (:mod:`bench.execution.machine_probe`): for
            an engine whose runs do not time the probe between their own steps.

    Methods with a default in :class:`EngineBase`: ``check_options`` (validate the engine's ``base``
    sub-block when the matrix is read), ``id_config`` (the run config as it names a cell),
    ``placeholders`` (launch placeholders this engine's launches hold, filled on the machine that runs them),
    ``startup_text`` (what a run does before its first step, for the progress line), ``classify_failure``
    (the kind and reason of a failed run read from its folder, for the record), and, for an engine that
    ``supports_smoke``, ``smoke_base``, ``smoke_cells`` and ``not_exercised`` (what ``run --smoke`` runs).
    """

    name: str
    options_key: str | None
    shows_config: bool
    forkserver_platforms: tuple[str, ...]
    forkserver_preload: tuple[str, ...]
    supports_smoke: bool
    bracket_probe: bool

    def build(
        self, base: Base, mechanism: Mechanism, platform: str, levels: dict[str, int | None], *, strict: bool
    ) -> Launch:
        """The launch of one cell.

        Args:
            base: the matrix ``base`` block.
            mechanism: the merged mechanisms of the cell's applicable factor levels.
            platform: resolved platform (``cpu``/``cuda``/``npu``).
            levels: the cell's effective factor levels (``None`` = not applicable).
            strict: ``True`` for a real run (unset ``${VAR}`` is an error), ``False`` for ``--dry-run``.

        Raises:
            BenchError: settings the engine cannot launch (message names the matrix key).
        """
        ...

    def preflight(self, matrix: Matrix, launches: list[Launch], platform: str) -> None:
        """Check the machine can run these launches (importable packages, devices, paths).

        Raises:
            BenchError: with what is missing.
        """
        ...


class EngineBase:
    """The defaults of every capability of :class:`Engine` (subclass it and override what differs)."""

    name: str = ""
    options_key: str | None = None
    shows_config: bool = False
    forkserver_platforms: tuple[str, ...] = ()
    forkserver_preload: tuple[str, ...] = ()
    supports_smoke: bool = False
    bracket_probe: bool = False

    #: the schema of the ``base.<options_key>`` block (a pydantic model, e.g. with ``extra="forbid"``), checked
    #: by the default :meth:`check_options`; ``None``: no schema (or an own :meth:`check_options`)
    options_model: type[BaseModel] | None = None

    @classmethod
    def check_options(cls, base: Base) -> None:
        """Check this engine's sub-block ``base.options(options_key)`` when a matrix of this engine is read:
        by default against :attr:`options_model` (nothing to check without one); an engine whose block needs
        more (values that must agree with ``base``) overrides this.

        Raises:
            ValueError: naming ``base.<options_key>.<key>``, what is wrong and the value given.
        """
        if cls.options_model is None or not cls.options_key:
            return
        try:
            cls.options_model.model_validate(base.options(cls.options_key))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(["base", cls.options_key, *map(str, err["loc"])])
            fields = sorted(cls.options_model.model_fields)
            msg = (f"unknown key{did_you_mean(str(err['loc'][-1]), fields)} (allowed: {', '.join(fields)})"
                   if err["type"] == "extra_forbidden" else value_message(err))
            raise ValueError(f"{where}: {msg}") from None

    def smoke_base(self, matrix: Matrix, steps: int = 2) -> tuple[Base, list[str]]:
        """The matrix's ``base`` as a smoke run of ``steps`` steps on this CPU uses it, and what it leaves out
        (``"key: why"``); only for an engine that :attr:`supports_smoke`.

        Raises:
            BenchError: this engine has no smoke run.
        """
        raise BenchError(f"engine {self.name!r}: no smoke run (supports_smoke is false)")

    def smoke_cells(self, matrix: Matrix, plan: Any, steps: int = 2) -> list[Any]:
        """The smoke cells of ``plan`` (a :class:`bench.spec.plan.Plan` of ``matrix``): objects with ``spec`` (a
        :class:`bench.spec.plan.RunSpec` launched on this CPU), ``source_label``, ``left_out`` and ``inert``.

        Raises:
            BenchError: this engine has no smoke run, or the smoke settings cannot be built.
        """
        raise BenchError(f"engine {self.name!r}: no smoke run (supports_smoke is false)")

    def not_exercised(self, plan: Any, matrix: Matrix | None = None) -> dict[str, str]:
        """The factors ``plan`` varies that a smoke run cannot exercise, with the reason (default: none)."""
        return {}

    @staticmethod
    def id_config(config: dict[str, Any]) -> dict[str, Any]:
        """The run config as it names a cell (:func:`bench.spec.plan.cell_id_of`); default: all of it."""
        return config

    @staticmethod
    def placeholders() -> dict[str, str]:
        """``{name: value}`` of the placeholders (``{name}``) this engine's launches may hold that name the
        machine (an interpreter, a cache folder); filled at launch time, so cell ids do not depend on it."""
        return {}

    @staticmethod
    def startup_text(launch: Any) -> str:
        """What a run does before its first step (the progress line while no step is logged)."""
        return "starting up before step 1"

    @staticmethod
    def stack_packages(platform: str) -> tuple[str, ...]:
        """The packages a stack (:mod:`bench.spec.stack`) must import for this engine's runs on ``platform``,
        in import order: :func:`bench.execution.stacks.open_stacks` imports them with the stack's interpreter,
        paths and variables before a sweep starts; default none (the probe then checks the interpreter runs)."""
        return ()

    @staticmethod
    def stack_probe_patches(platform: str) -> tuple[str, ...]:
        """The runtime patches (``BENCH_PATCHES`` specs, ``patches/`` first on the path) a stack's import probe
        applies, as this engine's runs on ``platform`` apply them, so the probe imports what a run can import
        (a workaround a run needs to import its packages); default none."""
        return ()

    @staticmethod
    def stack_placeholders(python: str) -> dict[str, str]:
        """The launch placeholders (besides ``{python}``) that name the interpreter of a run, filled with a
        stack's interpreter ``python`` for the runs of that stack; default none."""
        return {}

    @staticmethod
    def classify_failure(run_dir: Path, log_tail: str, *, timed_out: bool, steps_done: int, returncode: int,
                         argv: list[str]) -> tuple[str, str] | None:
        """``(failure_kind, reason)`` of a failed run read from its log, or ``None`` (the generic reason)."""
        return None


def capability(engine: str, attr: str, default: Any = None) -> Any:
    """``attr`` of the engine class registered as ``engine`` (an :class:`EngineBase` default when the class
    does not define it, else ``default``); ``default`` too for an engine no longer registered."""
    try:
        cls = engine_class(engine)
    except KeyError:
        return default
    return getattr(cls, attr, getattr(EngineBase, attr, default))


def get_engine(name: str) -> Engine:
    """The engine called ``name`` (see :mod:`bench.engines`: the registry of engines).

    Raises:
        KeyError: unknown engine name (the matrix schema already restricts it).
    """
    return lookup(name)
