"""The profiler files of one run (one per rank and role: torch/Ascend traces, Ascend ``kernel_details.csv`` and
``step_trace_time.csv``) parsed at once over the cores, through the parsed-profile cache.

:func:`parse_files` takes ``(kind, path)`` jobs (a kind per parser, :data:`PARSERS`). When the cache folder
holds entries, every file's content hash (:func:`bench.measure.trace_cache.content_hash`, xxh3 at memory speed)
is computed here and looked up first; a hit is the answer. Every other file is parsed with its hash folded into
the same read (:class:`~bench.measure.trace_cache.HashingReader`) and the result stored under it — the hash of
the very bytes parsed, so nothing stale is ever stored. The parses run in a process pool (one process per core,
at most one per file; a worker parses one file at a time, so its memory is one parser's bound) when there are
at least two and their files hold at least :data:`POOL_MIN_BYTES`, else in this process (a pool's start-up,
about 0.3 s, is more than small files cost; where no process can be started, or a worker dies, the files left
are parsed here).

Workers are started with ``forkserver`` (``spawn`` where that does not exist): never ``fork``, which copies the
caller's threads' locks (MLflow, Ray clients).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import bench.measure.trace_cache as trace_cache
from bench.measure._common import MeasureError
from bench.measure.torch_trace import TraceFree
from bench.measure.trace_scan import resolve_engine

#: below this many bytes to read, the files are handled one after another in this process
POOL_MIN_BYTES = 64 << 20
#: kind -> "module:function(path, engine) -> (result dict, content hash)"
PARSERS = {
    "trace": "bench.measure.torch_trace:parse_trace_hashed_dict",
    "kernel_details": "bench.measure.ascend_kernels:parse_kernel_details_hashed",
    "step_trace": "bench.measure.ascend_kernels:parse_step_trace_hashed",
}


def default_workers() -> int:
    """The cores this process may run on (``os.sched_getaffinity``; ``os.cpu_count()`` elsewhere)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _unreadable(path: str, exc: OSError) -> MeasureError:
    return MeasureError(f"{path}: cannot read: {exc.strerror or exc}")


def _lookup(kind: str, path: str, cache_dir: str) -> dict | MeasureError | None:
    """The cached result of one file (its content hashed here), ``None`` on a miss, or the error that says why
    the file cannot be read."""
    try:
        return trace_cache.load(Path(cache_dir), kind, trace_cache.content_hash(path))
    except OSError as exc:
        return _unreadable(path, exc)


def _parse(kind: str, path: str, engine: str | MeasureError | None, cache_dir: str | None) -> dict | MeasureError:
    """One file parsed, its result stored in ``cache_dir`` (when given) under the hash of the bytes parsed, or the
    error that says why not; ``engine`` may be the error that a bad ``BENCH_TRACE_ENGINE`` raised: the file gets
    it."""
    if isinstance(engine, MeasureError):
        return engine
    try:
        module, func = PARSERS[kind].split(":")
        result, digest = getattr(importlib.import_module(module), func)(path, engine)
    except MeasureError as exc:
        return exc
    except OSError as exc:
        return _unreadable(path, exc)
    if cache_dir:
        trace_cache.store(Path(cache_dir), kind, digest, result)
    return result


def _context():
    """``forkserver`` with the parsers preloaded (the server imports them once, workers start with them)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(sorted({p.split(":")[0] for p in PARSERS.values()}))
    return ctx


def parse_files(
    jobs: Sequence[tuple[str, str | os.PathLike]],
    cache_dir: str | os.PathLike | None = None,
    workers: int | None = None,
    engine: str | None = None,
    stats: dict | None = None,
) -> list[dict | MeasureError]:
    """Parse many profiler files, in parallel and through the cache.

    Args:
        jobs: ``(kind, path)`` pairs; kinds are the keys of :data:`PARSERS` (``trace``: a chrome trace,
            ``.json``/``.json.gz``, torch or Ascend ``trace_view.json``; ``kernel_details`` and ``step_trace``:
            Ascend's CSVs).
        cache_dir: the cache folder (``<run folder>/.trace_cache``); ``None``: no cache. The cache is also off
            when ``BENCH_TRACE_CACHE=off``.
        workers: processes (default :func:`default_workers`; ``1``: here, one after another).
        engine: the chrome-trace event reader (see :func:`bench.measure.trace_scan.scan_trace`; the result
            does not depend on it).
        stats: a dict to count into: ``hits`` (answered by the cache) and ``parsed`` (files parsed).

    Returns one entry per job, in order: the parser's result as a dict, or the :class:`MeasureError` that says
    why the file could not be read (missing, not of its kind). Raises :class:`MeasureError` for a bad
    ``BENCH_TRACE_CACHE``.
    """
    mode = trace_cache.cache_mode() if cache_dir is not None else "off"
    cdir = str(cache_dir) if cache_dir is not None and mode != "off" else None
    lookup = trace_cache.has_entries(Path(cdir)) if cdir else False
    out: list[dict | MeasureError | None] = [None] * len(jobs)
    hits = 0
    try:
        engine = resolve_engine(engine)  # here, not in a worker: a forkserver's environment may be older
    except MeasureError as exc:
        engine = exc  # type: ignore[assignment]  # a cache hit needs no engine; a parse reports it
    todo = list(range(len(jobs)))
    if lookup:  # hashing is cheaper than starting a pool: the lookups are done here, the misses parsed below
        for i in todo:
            out[i] = _lookup(jobs[i][0], str(jobs[i][1]), cdir)  # type: ignore[arg-type]
        hits = sum(isinstance(o, dict) for o in out)
        todo = [i for i in todo if out[i] is None]
    n_workers = min(workers or default_workers(), len(todo))
    size = sum(_size(jobs[i][1]) for i in todo)
    if n_workers >= 2 and size >= POOL_MIN_BYTES:
        try:
            with ProcessPoolExecutor(max_workers=n_workers, mp_context=_context()) as pool:
                futures = {i: pool.submit(_parse, jobs[i][0], str(jobs[i][1]), engine, cdir) for i in todo}
                for i, fut in futures.items():
                    out[i] = fut.result()
        except (OSError, BrokenProcessPool):  # no processes here (a sandbox, a worker killed): one by one
            pass
    for i in todo:
        if out[i] is None:
            out[i] = _parse(jobs[i][0], str(jobs[i][1]), engine, cdir)
    if stats is not None:
        stats["hits"] = stats.get("hits", 0) + hits
        stats["parsed"] = stats.get("parsed", 0) + sum(isinstance(out[i], dict) for i in todo)
    return out  # type: ignore[return-value]


def parse_traces(
    paths: Sequence[str | os.PathLike],
    cache_dir: str | os.PathLike | None = None,
    workers: int | None = None,
    engine: str | None = None,
    stats: dict | None = None,
) -> list[TraceFree | MeasureError]:
    """Chrome traces (``.json`` / ``.json.gz``, e.g. one per rank) through :func:`parse_files`: one
    :class:`TraceFree` per path (``path`` as given), or the :class:`MeasureError` that says why not."""
    got = parse_files([("trace", p) for p in paths], cache_dir=cache_dir, workers=workers, engine=engine,
                      stats=stats)
    out: list[Any] = []
    for p, g in zip(paths, got):
        if isinstance(g, dict):
            g = TraceFree.from_dict(g)
            g.path = str(p)
        out.append(g)
    return out


def _size(path: str | os.PathLike) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
