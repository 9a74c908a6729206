"""Live progress of ``run`` and ``tune`` on the console: done/total, ETA, the current item and what it is doing.

On a terminal a rich progress line is redrawn in place. Anywhere else (a CI log, output piped to a file)
plain one-line messages are printed, without control characters: one whenever the status text changes,
and a heartbeat at least every ``heartbeat_s`` seconds while nothing changes, so a log is never silent
during a long start-up or a long run.

The ETA is :func:`eta_s`: the mean wall time of the items finished in this invocation (measured by this
console, from launch to record) times the items left, less the time the current one has already run;
``ETA ?`` until one item has finished. What the current run is doing comes from ``status_of``, a callable
polled once a second (e.g. :func:`run_status`: ``step 2/5`` from the run's ``metrics.jsonl``).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from rich.console import Console

from bench.engines.base import capability

#: what a fork server does before its first run (:class:`bench.execution.forkserver.ForkServerExecutor`)
FORKSERVER_STARTING = "starting fork server (importing torch, transformers, verl)"


def make_console(width: int = 160) -> Console:
    """A console for ``run`` / ``tune``: rich on a terminal; on anything else (pipe, file, CI log) no colours,
    no control sequences even when ``FORCE_COLOR`` is set, and ``width`` columns instead of 80."""
    if sys.stdout.isatty():
        return Console(highlight=False, soft_wrap=True)
    return Console(highlight=False, soft_wrap=True, force_terminal=False, no_color=True, color_system=None,
                   width=width)


def eta_s(walls: list[float], remaining: int, current_elapsed: float = 0.0) -> float | None:
    """Seconds left: ``mean(walls) * remaining - current_elapsed`` (never below 0), ``None`` without a wall.

    Args:
        walls: wall times (s) of the items finished so far in this invocation.
        remaining: items not finished yet, the current one included.
        current_elapsed: seconds the current item has run.
    """
    if not walls or remaining <= 0:
        return None if not walls else 0.0
    return max(0.0, sum(walls) / len(walls) * remaining - current_elapsed)


def fmt_duration(s: float | None) -> str:
    """``?`` for ``None``, else ``45s``, ``3m 05s`` or ``1h 02m``."""
    if s is None:
        return "?"
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def steps_done(run_dir: Path) -> int:
    """GRPO steps a run has logged so far: lines of its verl file-logger ``metrics.jsonl`` (0 if none)."""
    try:
        with open(Path(run_dir) / "metrics.jsonl", "rb") as fh:
            return sum(1 for line in fh if line.strip())
    except OSError:
        return 0


def startup_text(engine: str, launch: Any) -> str:
    """What a run does before its first step, as the engine says (:meth:`bench.engines.base.EngineBase.startup_text`:
    the embedded engine building or loading its tiny model; verl starting Ray, the workers and the rollout)."""
    return capability(engine, "startup_text")(launch)


def run_status(run_dir: Path, steps: int, engine: str, launch: Any, executor: Any = None) -> str:
    """What a run is doing now: the fork server still importing, its start-up, or ``step k/N`` (k running)."""
    if executor is not None and getattr(executor, "proc", None) is not None and not getattr(executor, "ready", True):
        return FORKSERVER_STARTING
    done = steps_done(run_dir)
    if done == 0:
        return startup_text(engine, launch)
    if done >= steps:
        return f"step {steps}/{steps} done, measuring and recording"
    return f"step {done + 1}/{steps}"


class LiveProgress:
    """done/total, ETA and the current item's status, redrawn (terminal) or printed as plain lines.

    Args:
        console: where to print (:func:`make_console`).
        noun: what an item is, for the plain lines (``run``, ``trial``).
        heartbeat_s: longest silence of a plain log while nothing changes.
        tick_s: how often ``status_of`` is polled.
    """

    def __init__(self, console: Console, noun: str = "run", heartbeat_s: float = 10.0, tick_s: float = 1.0):
        self.console, self.noun = console, noun
        self.heartbeat_s, self.tick_s = heartbeat_s, tick_s
        self.total: int | None = None
        self.done = 0
        self.walls: list[float] = []
        self.label = ""
        self.status = ""
        self.extra = ""  # e.g. "best 1.234 s (trial 3)"
        self.status_of: Callable[[], str] | None = None
        self.started: float | None = None
        self.t0 = time.monotonic()
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_line = ""
        self._last_print = 0.0
        self.live = console.is_terminal
        self._progress = None
        self._task = None

    # -- state -------------------------------------------------------------------------------------
    def start(self, status: str = "", total: int | None = None) -> None:
        """Show the display (idempotent); ``status`` says what happens before the first item."""
        with self.lock:
            if total is not None:
                self.total = total
            if status:
                self.status = status
            if self._thread is not None:
                self._render(force=True)
                return
            if self.live:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

                self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                          TextColumn("{task.fields[eta]}"), TimeElapsedColumn(),
                                          console=self.console, transient=True)
                self._progress.start()
                self._task = self._progress.add_task("", total=self.total, eta="ETA ?")
            self._thread = threading.Thread(target=self._tick, name="bench-progress", daemon=True)
            self._thread.start()
            self._render(force=True)

    def set_total(self, total: int | None) -> None:
        with self.lock:
            self.total = total
            if self._progress is not None:
                self._progress.update(self._task, total=total)
            self._render()

    def begin(self, label: str, status_of: Callable[[], str] | None = None, status: str = "") -> None:
        """An item starts: its label and how to ask what it is doing."""
        with self.lock:
            self.label, self.status_of, self.status = label, status_of, status
            self.started = time.monotonic()
            self._poll()
            self._render(force=True)

    def finish(self, measured: bool = True) -> None:
        """The current item ended; ``measured`` = its wall time counts toward the ETA (not for cached items)."""
        with self.lock:
            if measured and self.started is not None:
                self.walls.append(time.monotonic() - self.started)
            self.done += 1
            self.started, self.status_of, self.label, self.status = None, None, "", ""
            if self._progress is not None:
                self._progress.update(self._task, completed=self.done)

    def set_status(self, status: str) -> None:
        with self.lock:
            self.status = status
            self._render()

    def eta(self) -> float | None:
        """:func:`eta_s` of the items left (``None`` while the total is unknown or nothing finished)."""
        if self.total is None:
            return None
        cur = time.monotonic() - self.started if self.started is not None else 0.0
        return eta_s(self.walls, self.total - self.done, cur)

    def text(self) -> str:
        """The one-line status: ``run 3/12 LABEL: STATUS | 2/12 done, ETA 1m 05s``."""
        n = "?" if self.total is None else str(self.total)
        if self.label:
            head = f"{self.noun} {self.done + 1}/{n} {self.label}: {self.status}"
        else:
            head = self.status or "working"
        tail = f"{self.done}/{n} done, ETA {fmt_duration(self.eta())}"
        return f"{head} | {tail}" + (f" | {self.extra}" if self.extra else "")

    def stop(self) -> None:
        """End the display and its thread (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with self.lock:
            if self._progress is not None:
                self._progress.stop()
                self._progress = None

    # -- drawing -----------------------------------------------------------------------------------
    def _poll(self) -> None:
        if self.status_of is not None:
            try:
                self.status = self.status_of() or self.status
            except Exception:
                pass

    def _render(self, force: bool = False) -> None:
        line = self.text()
        if self._progress is not None:
            self._progress.update(
                self._task,
                description=line.split(" | ")[0] + (f" | {self.extra}" if self.extra else ""),
                eta=f"ETA {fmt_duration(self.eta())}",
                completed=self.done,
            )
            return
        now = time.monotonic()
        changed = line.split(" | ")[0] != self._last_line.split(" | ")[0]
        if force or changed or now - self._last_print >= self.heartbeat_s:
            elapsed = int(now - self.t0)
            self.console.print(f"[{elapsed:>5}s] {line}", markup=False, highlight=False, soft_wrap=True)
            self._last_line, self._last_print = line, now

    def _tick(self) -> None:
        while not self._stop.wait(self.tick_s):
            with self.lock:
                self._poll()
                self._render()

    def print(self, text: str, **kw: Any) -> None:
        """Print a line above the live display (plain: a line of its own)."""
        with self.lock:
            self.console.print(text, **kw)


__all__ = ["LiveProgress", "eta_s", "fmt_duration", "make_console", "run_status", "startup_text", "steps_done",
           "FORKSERVER_STARTING"]
