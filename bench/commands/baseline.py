"""``run_bench.py baseline save|list|show``: the arguments (:func:`add_arguments`) and the action (:func:`main`)
on the baseline files :mod:`bench.gate.baseline` manages; :func:`main` first refuses the options an action would
ignore and a baseline file that is not a file."""

from __future__ import annotations

import argparse
import json
import sys
import time

from bench.commands.base import Command, given
from bench.core.errors import BenchError, say
from bench.gate.baseline import baselines_dir, load_baseline, save
from bench.records.results import check_baseline_slot
from bench.records.snapshot import CONTENDED_PSI, cpu_pressure

#: options only ``baseline save`` reads (argparse dest -> (option, value when not given))
SAVE_ONLY = {"name": ("--name", None), "note": ("--note", ""), "force": ("--force", False), "alpha": ("--alpha", None)}


def main(args: argparse.Namespace) -> int:
    """``baseline ACTION``: refuse an option of ``save`` given to ``list`` or ``show`` (alone it would be ignored)
    and a ``baselines/<name>.json`` that is a folder, then the action.

    Raises:
        BenchError: naming the option or the file (exit 2).
    """
    if args.action != "save":
        for dest, (opt, unset) in SAVE_ONLY.items():
            if getattr(args, dest, unset) != unset:
                raise BenchError(f"baseline {args.action}: {opt} is an option of `baseline save` only "
                                 "(here it would be ignored)")
    check_baseline_slot(args.name if args.action == "save" else args.target, args.results)
    return _action(args)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``baseline``."""
    p.add_argument("action", choices=("save", "list", "show"),
                   help="save SWEEP --name NAME | list | show NAME")
    p.add_argument("target", nargs="?", type=given, default=None,
                   help="save: the sweep (folder, matrix name = its latest sweep, or <matrix>/<sweep id>); "
                        "show: the baseline name or file")
    p.add_argument("--name", default=None, help="save: the baseline's name (file <results>/baselines/NAME.json)")
    p.add_argument("--force", action="store_true", help="save: replace an existing baseline of that name")
    p.add_argument("--note", default="", help="save: free text stored with the baseline")
    p.add_argument("--alpha", type=float, default=None,
                   help="save: refuse a sweep whose cells have too few timed steps for the gate to reach p < ALPHA "
                        "(default: the gate's default, 0.01)")


def _action(args: argparse.Namespace) -> int:
    """``baseline save|list|show``; 0 on success, 2 on bad input."""
    if args.action == "save":
        if not args.target:
            raise BenchError("baseline save: give the sweep to save (folder, matrix name or <matrix>/<sweep id>)")
        if args.name is not None and not args.name.strip():
            raise BenchError(f"baseline save: --name {args.name!r}: empty (allowed: letters, digits, '_', '-', '.')")
        if not args.name:
            raise BenchError("baseline save: --name NAME is required")
        out, snap, warn = save(args.target, args.name, args.results, args.tracking_uri, force=args.force,
                               note=args.note, alpha=args.alpha)
        n = sum(len(r["samples"]["step_time"]) for c in snap["cells"] for r in c["repeats"])
        print(f"baseline {args.name}: {out} ({len(snap['cells'])} cells, {n} step-time samples, "
              f"engine {snap['engine']}, platform {snap['platform']}, sweep {snap['source']['sweep']})")
        print(f"baseline {args.name}: {snap['sweep_to_sweep']['note']}")
        if warn:
            say(f"warning: {warn}")
        else:
            print(f"MLflow: parent run {snap['source']['parent_run_id']} tagged bench.baseline={args.name}")
        psi = cpu_pressure(snap)
        if psi is not None and psi > CONTENDED_PSI:
            print(f"warning: the sweep ran on a busy machine (CPU pressure up to {psi:.0f} %): its step times are "
                  "unusually slow and scattered; a baseline from an idle machine makes a sharper gate", file=sys.stderr)
        return 0
    if args.action == "list":
        if args.target:
            raise BenchError(f"baseline list: takes no argument, got {args.target!r} (allowed: baseline show NAME)")
        d = baselines_dir(args.results)
        files = sorted(d.glob("*.json")) if d.is_dir() else []
        if not files:
            print(f"no baselines in {d}")
        bad = []
        for f in files:
            try:
                data = load_baseline(str(f), args.results)
            except BenchError as exc:  # listed last, named on stderr
                bad.append(str(exc))
                continue
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(data.get("created_at") or 0))
            print(f"{f.stem:24} {data.get('engine')}/{data.get('platform')!s:6} {len(data.get('cells') or [])} cells  "
                  f"sweep {((data.get('source') or {}).get('sweep'))}  saved {when}")
        if bad:
            raise BenchError(bad[0] + (f" (and {len(bad) - 1} more unusable baseline file(s))" if len(bad) > 1 else ""))
        return 0
    if not args.target:
        raise BenchError("baseline show: give the baseline name or file")
    data = load_baseline(args.target, args.results)
    data.pop("_path", None)
    brief = {k: v for k, v in data.items() if k != "cells"}
    brief["cells"] = [{"label": c["label"], "levels": c["key"], **c.get("summary", {})} for c in data["cells"]]
    print(json.dumps(brief, indent=2, default=str))
    return 0


class Baseline(Command, name="baseline"):
    """``baseline``: :func:`add_arguments`, :func:`main`."""

    setup_arguments, run = staticmethod(add_arguments), staticmethod(main)
