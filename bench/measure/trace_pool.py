"""The traces of one run (one file per rank and role) parsed at once over the cores, through the cache.

:func:`parse_traces` looks every file up in :mod:`bench.measure.trace_cache` first; the misses are parsed
by :func:`bench.measure.torch_trace.parse_trace_free`, in a process pool (one process per core, at most one
per file; each worker parses one file at a time, so its memory is the parser's bound, about 100 MB) when
there are at least two misses and they hold at least :data:`POOL_MIN_BYTES`, else in this process (a pool's
start-up, about 0.3 s, is more than small traces cost; and where no process can be started, or a worker
dies, the files left are parsed here). The results come back in the order of the paths and are stored in
the cache.

Workers are started with ``forkserver`` (``spawn`` where that does not exist): never ``fork``, which copies
the caller's threads' locks (MLflow, Ray clients).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import bench.measure.trace_cache as trace_cache
from bench.measure._common import MeasureError
from bench.measure.torch_trace import TraceFree, parse_trace_free
from bench.measure.trace_scan import resolve_engine

#: below this many bytes to parse, the files are parsed one after another in this process
POOL_MIN_BYTES = 64 << 20


def default_workers() -> int:
    """The cores this process may run on (``os.sched_getaffinity``; ``os.cpu_count()`` elsewhere)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _parse(path: str, engine: str | None) -> TraceFree | MeasureError:
    try:
        return parse_trace_free(path, engine=engine)
    except MeasureError as exc:
        return exc


def _context():
    """``forkserver`` with the parser preloaded (the server imports it once, workers start with it)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["bench.measure.torch_trace"])
    return ctx


def parse_traces(
    paths: Sequence[str | os.PathLike],
    cache_dir: str | os.PathLike | None = None,
    workers: int | None = None,
    engine: str | None = None,
) -> list[TraceFree | MeasureError]:
    """Parse many traces, in parallel and through the cache.

    Args:
        paths: trace files (``.json`` / ``.json.gz``), e.g. one per rank.
        cache_dir: the cache folder (``<run folder>/.trace_cache``); ``None``: no cache. The cache is also
            off when ``BENCH_TRACE_CACHE=off``.
        workers: processes (default :func:`default_workers`; ``1``: parse here, one after another).
        engine: the event reader (see :func:`bench.measure.trace_scan.scan_trace`; the result does not
            depend on it).

    Returns one entry per path, in order: its :class:`TraceFree` (``path`` as given), or the
    :class:`MeasureError` that says why it could not be read (a missing file, not a trace).
    """
    mode = trace_cache.cache_mode() if cache_dir is not None else "off"
    try:
        engine = resolve_engine(engine)  # here, not in a worker: a forkserver's environment may be older
    except MeasureError as exc:
        engine_error = exc
    else:
        engine_error = None
    cdir = Path(cache_dir) if cache_dir is not None else None
    out: list[TraceFree | MeasureError | None] = [None] * len(paths)
    keys: list[str | None] = [None] * len(paths)
    todo: list[int] = []
    for i, p in enumerate(paths):
        if mode != "off" and cdir is not None:
            try:
                keys[i] = trace_cache.cache_key(p, full=mode == "content")
            except OSError:
                keys[i] = None  # unreadable: the parser reports it
            hit = trace_cache.load(cdir, keys[i]) if keys[i] else None
            if hit is not None:
                tf = TraceFree.from_dict(hit)
                tf.path = str(p)
                out[i] = tf
                continue
        todo.append(i)

    if engine_error is not None:
        for i in todo:
            out[i] = engine_error
        todo = []
    n_workers = min(workers or default_workers(), len(todo))
    size = sum(_size(paths[i]) for i in todo)
    if n_workers >= 2 and size >= POOL_MIN_BYTES:
        try:
            with ProcessPoolExecutor(max_workers=n_workers, mp_context=_context()) as pool:
                futures = {i: pool.submit(_parse, str(paths[i]), engine) for i in todo}
                for i, fut in futures.items():
                    out[i] = fut.result()
        except (OSError, BrokenProcessPool):  # no processes here (a sandbox, a worker killed): one by one
            for i in todo:
                if out[i] is None:
                    out[i] = _parse(str(paths[i]), engine)
    else:
        for i in todo:
            out[i] = _parse(str(paths[i]), engine)

    for i in todo:
        got = out[i]
        if isinstance(got, TraceFree):
            got.path = str(paths[i])
            if keys[i] and cdir is not None and _same_key(paths[i], keys[i], mode):
                trace_cache.store(cdir, keys[i], got.to_dict())
    return out  # type: ignore[return-value]


def _size(path: str | os.PathLike) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _same_key(path: str | os.PathLike, key: str, mode: str) -> bool:
    """The file still has ``key`` (it did not change while it was parsed: nothing stale is stored)."""
    try:
        return trace_cache.cache_key(path, full=mode == "content") == key
    except OSError:
        return False
