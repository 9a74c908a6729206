"""``run_bench.py sync [SWEEP]``: upload to MLflow what a tracking-store outage left queued (the queue and its
upload: :mod:`bench.tracking.upload_queue`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.commands.base import Command, cli_message, given
from bench.core.errors import BenchError, InputError, say
from bench.records.results import SWEEP, check_sweep_meta, find_sweep
from bench.tracking import Tracker, check_tracking_uri
from bench.tracking.upload_queue import QUEUE, check_sweep_files, pending, sync_sweep


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``sync``."""
    p.add_argument("sweep", nargs="?", type=given, default=None,
                   help="the sweep: a sweep folder, a matrix name (its latest sweep) or <matrix>/<sweep id>; "
                        "default: every sweep under --results with uploads pending")


def main(args: argparse.Namespace) -> int:
    """Sync one sweep (or every pending sweep); 0 when MLflow holds everything, 1 when the store is still
    unreachable (the queue stays), 2 on bad input."""
    if args.sweep is not None:
        sweeps = [find_sweep(args.sweep, args.results)]
    else:
        root = Path(args.results)
        sweeps = (
            sorted(p.parent for p in root.glob(f"*/*/{QUEUE}") if not p.parent.is_symlink()) if root.is_dir() else []
        )
        if not sweeps:
            print(f"nothing to sync under {root}")
            return 0
    done = {"children": 0, "parents": 0, "closed": 0}
    left = 0
    errors: list[BenchError] = []
    for sweep in sweeps:
        uri = args.tracking_uri
        try:
            meta = check_sweep_meta(sweep / SWEEP)
            uri = args.tracking_uri if getattr(args, "tracking_uri_given", False) else (
                meta.get("tracking_uri") or args.tracking_uri)
            check_tracking_uri(uri)
            # before the store is opened: with no usable run, refused with nothing written
            checked = check_sweep_files(sweep, meta)  # sweep.json read once, above
            tracker = Tracker(uri, meta.get("matrix_name") or sweep.parent.name)
            warn = lambda kind, d: say(f"warning: {d['message']}")  # noqa: E731
            for k, v in sync_sweep(sweep, tracker, warn, checked=checked).items():  # its files read once
                done[k] += v
        except BenchError as exc:  # named below; the other sweeps are still synced
            errors.append(exc)
            if not pending(sweep):
                continue
        still = pending(sweep)
        left += still
        print(f"{sweep}: {uri}: " + ("still pending" if still else "in sync"))
    print(f"logged {done['children']} child run(s), created {done['parents']} parent run(s), "
          f"closed {done['closed']} parent run(s); {left} sweep(s) still pending")
    if errors:  # one line: the first unusable file (the queue of its sweep stays)
        more = f" (and {len(errors) - 1} more sweep(s) with unusable files)" if len(errors) > 1 else ""
        first = errors[0]
        raise (BenchError if isinstance(first, InputError) else type(first))(f"{cli_message(first)}{more}")
    return 1 if left else 0


class Sync(Command, name="sync"):
    """``sync``: :func:`add_arguments`, :func:`main`."""

    setup_arguments, run = staticmethod(add_arguments), staticmethod(main)
