"""Run one repeat of a run spec in its own folder and write its record (:func:`execute_spec`): what a sweep,
a tune trial and the verl_cpu smoke do per run."""

from __future__ import annotations

import functools
import json
import shutil
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from bench.core.files import atomic_write_text
from bench.core.metadata import host_load
from bench.engines.base import capability
from bench.execution.executors import Executor, resolve_launch
from bench.execution.machine_probe import BracketProbe, bracket_record, matmul_peak
from bench.records.mfu import run_perf
from bench.records.record import build_record, write_record
from bench.spec.plan import RunSpec
from bench.spec.stack import STACK_ENV
from bench.tracking.records import step_phases


def execute_spec(spec: RunSpec, rdir: Path, repeat: int, executor: Executor, warmup_steps: int,
                 code: dict[str, Any] | None = None, stack: Any = None) -> dict[str, Any]:
    """Run one repeat of ``spec`` in the fresh folder ``rdir``, measure it and write its record.

    An earlier unfinished attempt in ``rdir`` is removed first. Returns the record (status ``ok`` or
    ``failed`` with ``failure_kind`` in bad_input | infeasible | oom | timeout | crash | error | no_metrics).
    ``code``: in an interleaved gate sweep, the run's code version ``{"root": checkout, "commit": sha, ...}``:
    the run executes that checkout's code (``PYTHONPATH``; the launch carries ``BENCH_CODE_VERSION`` so a
    :class:`bench.gate.versions.VersionedExecutor` sends it to that version's own process or fork server), and
    the record keeps ``code_version`` and ``code_commit``.
    ``stack``: the run's open stack (:class:`bench.execution.stacks.OpenStack`): the run uses its interpreter,
    source trees and variables (under the launch's own); the record keeps ``stack`` (its name, interpreter and
    trees). Every record keeps ``run_versions``, the versions the run's own process imported, where it wrote them.
    """
    t_enter = time.time()
    rdir = Path(rdir)
    if rdir.exists():
        shutil.rmtree(rdir)
    rdir.mkdir(parents=True)
    launch = spec.launch
    root = (code or {}).get("root")
    if stack is not None:
        launch_res = resolve_launch(launch.argv, launch.env, launch.patches, rdir, spec.timeout_s, repo_root=root,
                                    python=stack.python, paths=stack.paths,
                                    placeholders=capability(spec.engine, "stack_placeholders")(stack.python))
        launch_res.env = {**stack.env, **launch_res.env, STACK_ENV: stack.name}  # its executor by name
    else:
        launch_res = resolve_launch(launch.argv, launch.env, launch.patches, rdir, spec.timeout_s, repo_root=root)
    if spec.code_version:
        launch_res.env["BENCH_CODE_VERSION"] = spec.code_version
    if launch.config:
        cfg = json.loads(json.dumps(launch.config).replace("{run_dir}", str(rdir.resolve())))
        atomic_write_text(rdir / launch.config_file, yaml.safe_dump(cfg, sort_keys=False))
    probe = _bracket_probe(spec.engine, executor) if spec.platform == "cpu" else None
    before = probe.window() if probe else None
    started = time.time()
    load0 = host_load()
    res = executor.execute(launch_res)
    t_ran = time.time()
    after = probe.window() if probe else None
    rec = build_record(rdir, res, spec=spec.model_dump(mode="json"), repeat=repeat, warmup_steps=warmup_steps,
                       started_at=started, classify_failure=capability(spec.engine, "classify_failure"))
    rec["host_load"] = {"before": load0, "after": host_load()}  # the gate reports contention from it
    rec["label"] = spec.label
    rec["all_off"] = spec.is_all_off()
    if probe:
        rec["machine_probe"] = bracket_record(probe, before, after)
    if spec.code_version:
        rec["code_version"], rec["code_commit"] = spec.code_version, (code or {}).get("commit")
    if stack is not None:
        rec["stack"] = {"name": stack.name, "python": stack.python, "paths": stack.paths, "trees": stack.trees}
    if rec["status"] == "ok":
        here = _local(executor) or ran_here(rec.get("node"))
        add_phase_perf(rdir, rec, shared_matmul_peak() if spec.platform == "cpu" and here else None)
    rec["timing"] = run_timing(rec, harness_s=(started - t_enter) + (time.time() - t_ran))
    write_record(rdir, rec)
    return rec


def add_phase_perf(rdir: Path, rec: dict[str, Any], machine_peak: dict[str, Any] | None) -> None:
    """Put the run's MFU and tokens/s per device per phase (:func:`bench.records.mfu.run_perf`) into its summary
    (``phase_perf``, ``mfu_basis``); an estimate that fails leaves a warning, never a failed run."""
    try:
        rec["summary"]["phase_perf"], rec["summary"]["mfu_basis"] = run_perf(rdir, rec, machine_peak)
    except Exception as exc:  # noqa: BLE001 - a figure the run can do without
        rec.setdefault("warnings", []).append(f"MFU per phase not computed: {type(exc).__name__}: {exc}")


#: executors whose runs execute on the harness's own machine (its measured matmul peak is theirs)
THIS_MACHINE = ("local", "forkserver")


def _local(executor: Executor) -> bool:
    return getattr(executor, "name", "") in THIS_MACHINE


def ran_here(node: dict[str, Any] | None) -> bool:
    """Whether a Ray run's node (the record's ``node``: ``ip``) is this machine: its IP is a loopback address or
    one of this machine's interface addresses (``psutil.net_if_addrs``). ``False`` without a node."""
    ip = (node or {}).get("ip")
    if not isinstance(ip, str) or not ip:
        return False
    if ip.startswith("127.") or ip == "::1":
        return True
    return any(a.address == ip for addrs in psutil.net_if_addrs().values() for a in addrs)


@functools.cache
def shared_matmul_peak() -> dict[str, Any]:
    """This machine's measured matmul peak (:func:`bench.execution.machine_probe.matmul_peak`), measured once per
    harness process (a sweep) at its first use; ``sweep.json`` keeps it as ``machine_peak``."""
    return matmul_peak()


def _bracket_probe(engine: str, executor: Executor):
    """The harness's :class:`bench.execution.machine_probe.BracketProbe` when ``engine`` asks for one
    (``bracket_probe``) and the run executes on this machine (the local executor), else ``None``. Taken only for
    runs on the CPU (the caller): the kernel times the CPU, not a device (3 s per run an accelerator would pay for
    nothing)."""
    if not capability(engine, "bracket_probe", False) or getattr(executor, "name", "") != "local":
        return None
    return _shared_probe()


@functools.cache
def _shared_probe():
    """The harness's one BracketProbe, built at its first use (imports torch, warms the kernel)."""
    return BracketProbe()


def run_timing(rec: dict[str, Any], harness_s: float) -> dict[str, float]:
    """Where a run's time went, seconds: ``startup_s`` = its wall time outside GRPO steps (start-up of the
    process, Ray, workers, engine, and shut-down), ``steps_s`` = the sum of ``timing_s/step`` over all its steps,
    split into ``warmup_s``, ``timed_s`` and ``profiled_s`` (:func:`bench.tracking.records.step_phases` roles),
    ``harness_s`` = the harness's own time for the run (preparing the folder and launch, measuring the record)."""
    steps = rec.get("steps") or {}

    def total(which: list[int]) -> float:
        return float(sum(float((steps.get(str(s)) or {}).get("timing_s/step") or 0.0) for s in which))

    roles = step_phases(rec)
    in_steps = total([int(s) for s in steps])
    wall = float(rec.get("wall_s") or 0.0)
    return {"startup_s": max(0.0, wall - in_steps), "steps_s": in_steps, "warmup_s": total(roles["warmup"]),
            "timed_s": total(roles["timed"]), "profiled_s": total(roles["profiled"]), "harness_s": max(0.0, harness_s)}
