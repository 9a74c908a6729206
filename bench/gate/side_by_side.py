"""Side-by-side blocks of an interleaved gate sweep (``gate --interleave REV --side-by-side``): the baseline's run
and the candidate's run of a cell start **at the same time**, each pinned to a CPU of its own
(``os.sched_setaffinity``), the CPUs swapped between blocks (:func:`cpu_plan`).

Why: on a 2-core machine the spread of a block's ratio in a sequential interleaved gate is mostly the machine's
speed drifting from one run to the next (measured: the run-level SD of log step time 0.080, of which the steps'
own jitter explains 0.027; consecutive runs correlate at r = 0.55, docs/lab-notes/gate.md). Two runs at the
same moment see the same drift, so it cancels in their ratio; a block lasts one run instead of two. What the
two CPUs differ in (interrupts, the harness's own work) is a fixed offset per CPU: the CPUs swap every block
(each pair of blocks holds both assignments, in random order), so it cancels in the mean over blocks, and the
comparison removes it (:func:`bench.gate.runs.block_pairs` reads ``affinity.json``).

Each run's CPU is written to ``<run>/affinity.json`` (``{"cpus": [N], "alone": false}``; alone: its partner had
already run, a resumed block). A run forked by a fork
server inherits the server's CPU set (the server is pinned before each request:
:meth:`bench.execution.forkserver.ForkServerExecutor.pin`); a plain child inherits the calling thread's, which is
pinned too (Linux: ``sched_setaffinity(0)`` is per thread), so the harness's own work for a run (its record,
MLflow) also stays on the run's CPU.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import random
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from bench.core.errors import InputError
from bench.execution.blocks import split_blocks

AFFINITY_FILE = "affinity.json"
#: seconds a run waits for its partner to be ready (its fork server may still be importing) before starting alone
START_WAIT_S = 600.0


def two_cpus() -> tuple[int, int]:
    """The first two CPUs this process may run on.

    Raises:
        BenchError: fewer than 2 (side-by-side runs need one CPU per version).
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise InputError("side by side", f"side by side needs 2 CPUs, this process may use {len(cpus)} ({cpus}); "
                         "drop the flag")
    return cpus[0], cpus[1]


def cpu_plan(seed: int, cell: str, block: int, cpus: tuple[int, int]) -> dict[str, int]:
    """The CPU of each version for ``cell`` in ``block``: blocks ``2j`` and ``2j + 1`` hold both assignments, which
    one comes first drawn by ``random.Random(f"{seed}:{cell}:{j}")`` (a crossover design balanced in every pair of
    blocks, random within it)."""
    first = random.Random(f"{seed}:{cell}:{block // 2}").random() < 0.5
    flip = first != bool(block % 2)
    a, b = (cpus[1], cpus[0]) if flip else cpus
    return {"baseline": a, "candidate": b}


class SideBySide:
    """``run_block`` for :class:`bench.gate.versions.VersionedExecutor`: per cell of a block, both versions' runs at
    once in two threads, each pinned (module text); cells of a block one after another.

    ``run_one`` runs holding the harness lock (everything around a run: skip checks, records, MLflow, console, one
    thread at a time as in a sequential sweep); :meth:`released` lets it go while a run executes.
    """

    def __init__(self, seed: int, cpus: tuple[int, int] | None = None):
        self.seed, self.cpus = int(seed), cpus or two_cpus()
        self.lock = threading.Lock()
        self.cancel = threading.Event()
        self.local = threading.local()

    def current_cpu(self) -> int | None:
        """The CPU of the run this thread executes (None outside a side-by-side block)."""
        return getattr(self.local, "cpu", None)

    def run_block(self, items: Sequence[tuple[Any, int]], run_one: Callable[[Any, int], None],
                  on_interrupt: Callable[[], None] = lambda: None) -> None:
        """Run ``items`` (``(spec, repeat)``, a blocked order) block by block, the two versions of a cell at once.

        Raises:
            BaseException: what a run raised, or an interruption (Ctrl-C, SIGTERM) of the calling thread, after
                ``on_interrupt()`` (it stops the running children: the executors close) and both threads ended.
        """
        for block in split_blocks(items):
            cells: dict[str, list[tuple[Any, int]]] = {}
            for spec, k in block:
                cells.setdefault(str(spec.cell_id), []).append((spec, k))
            for cell, runs in cells.items():
                self._pair(cell, runs, run_one, on_interrupt)

    def _pair(self, cell: str, runs: list[tuple[Any, int]], run_one: Callable[[Any, int], None],
              on_interrupt: Callable[[], None]) -> None:
        plan = cpu_plan(self.seed, cell, runs[0][1], self.cpus)
        start = threading.Barrier(len(runs))

        def work(spec: Any, k: int) -> None:
            cpu = plan[str(spec.code_version)]
            os.sched_setaffinity(0, {cpu})  # this thread (Linux): a plain child and the harness work for the run
            self.local.cpu, self.local.start = cpu, start
            try:
                with self.lock:
                    run_one(spec, k)
            finally:
                self.local.cpu = None
                start.abort()  # a run skipped (finished before a resume) or failed to start: the partner goes alone

        with cf.ThreadPoolExecutor(max_workers=2, thread_name_prefix="bench-side") as pool:
            futures = [pool.submit(work, spec, k) for spec, k in runs]
            try:
                for fut in futures:
                    while not fut.done():  # timed: Ctrl-C / SIGTERM may be handled by another thread's wake-up
                        cf.wait([fut], timeout=0.5)
                    fut.result()
            except BaseException:
                self.cancel.set()  # no run starts any more
                on_interrupt()  # the running ones stop; leaving the block waits for both threads
                raise

    def released(self, run_dir: Path, execute: Callable[[], Any], prepare: Callable[[], None] = lambda: None) -> Any:
        """Without the harness lock: ``prepare()`` (pin the version's fork server, which may still be starting),
        then, once the partner run is ready too (both start together), write the run's CPU to
        ``<run_dir>/affinity.json`` and call ``execute()`` (one run). After an interruption no run starts, and a
        run that ends raises ``KeyboardInterrupt`` (no record: a resume reruns it)."""
        cpu = self.current_cpu()
        if cpu is None:
            return execute()
        self.lock.release()
        try:
            prepare()
            try:
                self.local.start.wait(timeout=START_WAIT_S)
                alone = False
            except threading.BrokenBarrierError:  # the partner was skipped or failed before its start
                alone = True
            if self.cancel.is_set():
                raise KeyboardInterrupt("gate interrupted")
            (Path(run_dir) / AFFINITY_FILE).write_text(json.dumps({"cpus": [cpu], "alone": alone}) + "\n")
            res = execute()
        finally:
            self.lock.acquire()
        if self.cancel.is_set():
            raise KeyboardInterrupt("gate interrupted")
        return res


def run_cpu(run_dir: Path) -> int | None:
    """The CPU a side-by-side run was pinned to (``<run_dir>/affinity.json``), else None."""
    try:
        return int(json.loads((Path(run_dir) / AFFINITY_FILE).read_text())["cpus"][0])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
