"""What a tune is asked to do (:class:`TuneSettings`, resolved from the matrix's ``tune`` block and the command
line before anything is written: :func:`resolve_settings`), its sampler and what an invocation did."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.core.errors import BenchError
from bench.core.paths import resolve_path
from bench.spec.matrix import Matrix
from bench.spec.plan import detect_platform
from bench.tune.block import CONFIRM_BLOCKS, parse_block
from bench.tune.space import (
    MAX_STUDY_NAME,
    OBJECTIVES,
    STUDY_NAME,
    IntDim,
    TuneBlock,
    limits_of,
    resolve_space,
    seq_len,
)
from bench.tune.storage import check_storage, default_storage
from bench.tune.trial import fixed_cell, trial_spec


@dataclass
class TuneSettings:
    """Everything resolved from the matrix and the command line before anything is written."""

    matrix: Matrix
    block: TuneBlock
    platform: str
    space: dict[str, IntDim]
    notes: list[str]
    cell: dict[str, int]
    study_name: str
    storage_url: str
    storage_from: str
    n_trials: int | None
    timeout_s: float | None
    results: Path
    tracking_uri: str

    @property
    def objective_key(self) -> str:
        return OBJECTIVES[self.block.objective][0]

    @property
    def direction(self) -> str:
        return OBJECTIVES[self.block.objective][1]

    @property
    def unit(self) -> str:
        return OBJECTIVES[self.block.objective][2]

    @property
    def value_key(self) -> str:
        """The objective's key with its unit: ``step_time_s`` / ``throughput_tokens_per_s`` (prefix of the
        trial user attributes ``<key>_raw`` and ``<key>_normalized``)."""
        return {"step_time": "step_time_s", "throughput": "throughput_tokens_per_s"}[self.block.objective]

    @property
    def metric_name(self) -> str:
        """The objective's name in Optuna (``study.set_metric_names``, what optuna-dashboard shows), MLflow and
        the outputs, with its unit and whether it is speed-normalized: ``step_time_s (s, median, speed-normalized)``
        or ``step_time_s (s, median, raw)`` (throughput: ``tokens/s``). A trial without a probe keeps its raw
        value even when the block normalizes; its ``normalized`` attribute says which."""
        kind = "speed-normalized" if self.block.normalize else "raw"
        return f"{self.value_key} ({self.unit}, median, {kind})"

    @property
    def confirm_blocks(self) -> int:
        """Blocks of the confirmation (0 = none); a plain :class:`TuneBlock` gets the default."""
        return int(getattr(self.block, "confirm_blocks", CONFIRM_BLOCKS))

    @property
    def seq(self) -> int:
        return seq_len(self.matrix.base)

    @property
    def study_dir(self) -> Path:
        return Path(self.results) / self.matrix.name / "tune" / self.study_name

    def identity(self) -> dict[str, Any]:
        """What a study's values depend on (a resumed study must match)."""
        base = self.matrix.base.model_dump(mode="json", exclude={"ppo_max_token_len", "log_prob_max_token_len",
                                                                 "timeout_s"})
        return {"engine": self.matrix.engine, "platform": self.platform, "base": base, "cell": self.cell,
                "space": {k: vars(v) for k, v in self.space.items()}, "objective": self.block.objective,
                "normalize": self.block.normalize}


def resolve_settings(matrix: Matrix, *, results: Path, tracking_uri: str, study: str | None = None,
                     storage: str | None = None, n_trials: int | None = None, timeout_s: float | None = None,
                     platform: str | None = None) -> TuneSettings:
    """Validate the tune block and the command line; build one trial spec as a check. Writes nothing.

    Raises:
        BenchError: any bad input (one line).
    """
    block = parse_block(matrix)
    src = matrix.source or "matrix"
    if platform is None:
        platform = detect_platform() if matrix.platform == "auto" else matrix.platform
    space, notes = resolve_space(block, matrix.base, src)
    cell = fixed_cell(matrix, block)
    name = study or block.study or matrix.name
    if not STUDY_NAME.match(name) or len(name) > MAX_STUDY_NAME:
        raise BenchError(f"--study {name[:60]!r}: a study name is at most {MAX_STUDY_NAME} letters, digits, '_', '.', "
                         "'-' (not starting with one)")
    resolve_path("--study", Path(results) / matrix.name / "tune" / name)  # its folder: names within limits, no link
    n = n_trials if n_trials is not None else block.n_trials
    t = timeout_s if timeout_s is not None else block.timeout_s
    if n is not None and n < 1:
        raise BenchError(f"--n-trials {n}: must be >= 1")
    if t is not None and t <= 0:
        raise BenchError(f"--timeout {t:g}: must be > 0 seconds")
    if n is None and t is None and block.sampler.type != "grid":
        raise BenchError(f"{src}: tune: give n_trials and/or timeout_s (or --n-trials / --timeout)")
    if storage:
        url, url_from = storage, "--storage"
    elif block.storage:
        url, url_from = block.storage, f"{src}: tune.storage:"
    else:
        url, url_from = default_storage(results), "storage"
    check_storage(url, url_from, results)  # before anything is written (the results folder is made later)
    settings = TuneSettings(matrix, block, platform, space, notes, cell, name, url, url_from, n, t,
                            Path(results), tracking_uri)
    # one real spec as a check: conflicts, exclusions, engine refusals surface now, before anything is written
    trial_spec(matrix, cell, limits_of({k: d.low for k, d in space.items()}, matrix.base), platform)
    return settings


@dataclass
class TuneOutcome:
    """What a tune invocation did."""

    study_name: str
    study_dir: Path
    parent_run_id: str | None
    ran: int
    summary: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def make_sampler(block: TuneBlock, space: dict[str, IntDim]) -> Any:
    """The Optuna sampler of the tune block: ``grid`` (every point of ``space``), ``random`` or ``tpe`` (seeded;
    TPE with the block's start-up trials and multivariate setting)."""
    import optuna

    s = block.sampler
    if s.type == "grid":
        return optuna.samplers.GridSampler({k: d.grid() for k, d in space.items()}, seed=s.seed)
    if s.type == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    return optuna.samplers.TPESampler(seed=s.seed, n_startup_trials=s.n_startup_trials,
                                      multivariate=s.multivariate)
