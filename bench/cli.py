"""Command line: ``python run_bench.py [run] MATRIX.yaml`` and the other subcommands of :mod:`bench.commands`
(``tune``, ``gate``, ``report``, ``compare``, ``baseline``, ``bisect``, ``history``, ``sync``).

Exit codes: 0 success; 1 a sweep with failed cells, a gate regression, a full disk or an unexpected
error; 2 bad input (one line on stderr naming file, key and allowed values; nothing written); 3 the gate
(or ``bisect``) cannot judge (too noisy, too few samples: :data:`bench.gate.verdicts.EXIT_CANNOT_JUDGE`); 130
interrupted (Ctrl-C); 143 terminated (SIGTERM).

Error boundary (every subcommand): a :class:`~bench.core.errors.BenchError` is printed as one line; any other
exception as one line naming the step in progress (:class:`bench.core.errors.doing`) and the path of a log
holding the full traceback (``<results>/logs/error-*.log``). No Python traceback reaches the terminal.
Each subcommand is a :class:`bench.commands.base.Command` subclass in its own module of :mod:`bench.commands`
(``setup_arguments(parser)``, ``run(args) -> int``), listed in :data:`bench.commands.COMMANDS`; a start imports
only the module of the subcommand it runs (``--help`` none), so no command pays for another's libraries.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable
from pathlib import Path

from bench import __version__
from bench.commands import COMMANDS, command_class
from bench.commands.base import cli_message
from bench.core.errors import BenchError, Terminated, current_step, is_no_space, printable
from bench.core.paths import check_folder, check_names, resolve_path
from bench.tracking.store import check_tracking_uri, in_memory, sqlite_path


def subcommands() -> dict[str, str]:
    """``{name: one-line help}`` of every subcommand (:data:`bench.commands.COMMANDS`; imports no command module)."""
    return COMMANDS



#: Allowed ranges of numeric command-line flags (argparse dest -> (low, high, low inclusive)); checked for
#: every subcommand that has the flag. Non-finite values are always refused.
FLAG_RANGES: dict[str, tuple[float, float, bool]] = {
    "threshold": (0.0, 10.0, False),
    "alpha": (0.0, 0.5, False),
    "bootstrap": (100, 1_000_000, True),
    "seed": (0, 2**32 - 1, True),
    "max_mde": (0.0, 10.0, False),
    "n_trials": (1, 100_000, True),
    "timeout": (0.0, 30 * 86400.0, False),
    "order_seed": (0, 2**32 - 1, True),
    "smoke_steps": (1, 10, True),
    "fail_on_new": (1, 1_000_000, True),
}
_PLANNED = ("--sequential", "--precision", "--budget")
#: options that only act together with another one (subcommand -> option -> any of these must be given too):
#: given alone they would be ignored without a word
NEEDS: dict[str, dict[str, tuple[str, ...]]] = {
    "run": {"--smoke-steps": ("--smoke",), "--threshold": _PLANNED, "--alpha": _PLANNED,
            "--json": ("--dry-run",), "--verbose": ("--dry-run",)},
    "gate": {opt: ("--interleave", "--stacks") for opt in ("--set", "--blocks", "--budget", "--force", "--spawn",
                                                             "--order-seed", "--side-by-side")},
}
#: subcommands that write to the MLflow store (its URI is checked before anything else happens)
WRITES_MLFLOW = ("run", "tune", "sync")
#: options of every subcommand that take a value (to find the subcommand when options come first)
_VALUED = ("--results", "--tracking-uri")


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr (exit code 2), no usage block."""

    def error(self, message: str):  # type: ignore[override]
        """Print ``error: PROG: MESSAGE`` and exit with code 2."""
        sys.stderr.write(f"error: {self.prog}: {_one_line(message)} (see --help)\n")
        sys.exit(2)


def version_string() -> str:
    """``run_bench.py <package version> (git <short sha>[+dirty])``; without the git part when the code is
    not in a git checkout (an installed package) or git is missing."""
    from bench.tracking import git_commit  # deferred: read at call time (tests patch bench.tracking.git_commit)

    sha = git_commit()
    if sha == "unknown":
        return f"run_bench.py {__version__}"
    short, _, dirty = sha.partition("+")
    return f"run_bench.py {__version__} (git {short[:7]}{'+' + dirty if dirty else ''})"


class _VersionAction(argparse.Action):
    """``--version``: print :func:`version_string` (computed only when asked) and exit 0."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_string())
        parser.exit(0)


def check_flag_ranges(args: argparse.Namespace) -> None:
    """Refuse numeric flags outside :data:`FLAG_RANGES` (and NaN/inf anywhere).

    Raises:
        BenchError: naming the flag, the value and the allowed range.
    """
    for dest, value in sorted(vars(args).items()):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        flag = "--" + dest.replace("_", "-")
        if isinstance(value, int) and abs(value) > 2**63:
            raise BenchError(f"{flag} {value}: too large (allowed: see --help)")
        if not math.isfinite(value):
            raise BenchError(f"{flag} {value}: must be a finite number")
        if dest in FLAG_RANGES:
            low, high, inclusive = FLAG_RANGES[dest]
            if not ((low <= value) if inclusive else (low < value)) or value > high:
                bracket = "[" if inclusive else "("
                raise BenchError(f"{flag} {value}: allowed range {bracket}{low}, {high}]")


def check_flag_combinations(command: str, argv: list[str], args: argparse.Namespace) -> None:
    """Refuse an option that would be ignored: one of :data:`NEEDS` given without what it acts with, and a
    ``run --order-seed`` with ``--order sequential`` (which has no shuffle).

    Raises:
        BenchError: naming the option and what it needs.
    """
    def given(opt: str) -> bool:
        return any(a == opt or a.startswith(opt + "=") for a in argv)

    for opt, partners in NEEDS.get(command, {}).items():
        if given(opt) and not any(given(p) for p in partners):
            raise BenchError(f"{opt}: only with {' or '.join(partners)} (alone it would be ignored)")
    if command == "run" and getattr(args, "parallel", None) is not None and not getattr(args, "ray_address", None):
        raise BenchError(f"--parallel {args.parallel}: needs --ray-address (the Ray cluster whose nodes run the runs)")
    if command == "run" and given("--order-seed") and getattr(args, "order", "blocked") != "blocked":
        raise BenchError("--order-seed: only with --order blocked (a sequential order has no shuffle)")


def check_paths_and_uri(args: argparse.Namespace) -> None:
    """Paths and the tracking URI, checked before any subcommand writes anything: ``--results`` and ``--out``
    (:func:`bench.core.paths.check_folder`), and the tracking URI of a subcommand that writes to MLflow (reachability
    probed only when the command will really use it: not for ``--dry-run``).

    Raises:
        BenchError: naming the option, the value and what is wrong.
    """
    command = getattr(args, "command", None) or "run"
    check_names("--results", args.results)
    dry = bool(getattr(args, "dry_run", False))
    interleaved = command == "bisect" or command == "gate" and (getattr(args, "interleave", None) is not None
                                                                or getattr(args, "stacks", None) is not None)  # sweeps
    writes = command in ("run", "tune") or (command == "baseline" and getattr(args, "action", None) == "save") or \
        interleaved
    if writes:
        check_folder("--results", args.results)
    elif Path(args.results).exists() and not Path(args.results).is_dir():
        raise BenchError(f"--results {args.results}: not a folder (allowed: a results folder)")
    for flag in ("ray_address", "interleave", "storage", "study"):  # given, but empty: never "not given"
        value = getattr(args, flag, None)
        if isinstance(value, str) and not value.strip():
            raise BenchError(f"--{flag.replace('_', '-')} {value!r}: empty (leave the option out for the default)")

    if getattr(args, "out", None) is not None:
        check_folder("--out", args.out)
    db = sqlite_path(args.tracking_uri) if args.tracking_uri else None
    if db is not None and not in_memory(args.tracking_uri):  # every subcommand may open the store (report, gate...)
        flag = "--tracking-uri" if args.tracking_uri_given else "MLflow store"
        resolve_path(flag, db, args.tracking_uri)
        if not os.path.exists(db.parent) and os.path.abspath(db.parent) != os.path.abspath(args.results):
            # sqlite would make the folders and a new, empty store: a typo in the path started a new history (a file
            # in the folder's place is check_tracking_uri's 'not writable')
            raise BenchError(f"{flag} {args.tracking_uri}: folder {db.parent} does not exist (create it, or give a "
                             "sqlite file in an existing folder or in --results)")
    if (command in WRITES_MLFLOW or interleaved) and (command != "sync" or args.tracking_uri_given):
        check_tracking_uri(args.tracking_uri, probe=not dry)
    elif in_memory(args.tracking_uri) or (command != "sync" and args.tracking_uri != "" and (
            args.tracking_uri_given or os.environ.get("MLFLOW_TRACKING_URI"))):
        # gate/report/compare/baseline log to MLflow too: a URI the user chose is checked as `run` checks it
        # (its form; no probe: their MLflow step is a warning when the store is down); --tracking-uri '' is
        # theirs for "log nothing to MLflow"
        check_tracking_uri(args.tracking_uri, probe=False)


def order_argv(argv: list[str]) -> list[str]:
    """``argv`` with the subcommand first: ``run`` inserted before a matrix file, and a subcommand given after
    the shared options (``--results DIR gate ...``) moved to the front, so an option placed before the
    matrix or subcommand is never read as the subcommand."""
    argv = list(argv)
    names = subcommands()
    if not argv or argv[0] in names or argv[0] in ("-h", "--help", "--version"):
        return argv
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 1 if "=" in argv[i] or argv[i] not in _VALUED else 2
    if i < len(argv) and argv[i] in names:
        return [argv[i], *argv[:i], *argv[i + 1:]]
    return ["run", *argv]


def default_results() -> Path:
    """``results/`` in the current folder."""
    return Path("results")


def default_tracking_uri(results: Path) -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<results>/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(results).as_posix()}/mlflow.db"


def folder_arg(text: str) -> Path:
    """``--results DIR`` as a path; an empty text (``--results ''``, which would be the current folder) is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is empty (allowed: a folder; leave the option out for results/)")
    return Path(text)


def add_common(p: argparse.ArgumentParser) -> None:
    """``--results`` and ``--tracking-uri``, shared by every subcommand."""
    p.add_argument("--results", type=folder_arg, default=default_results(), metavar="DIR",
                   help="results folder (default: results/)")
    p.add_argument("--tracking-uri", default=None, metavar="URI",
                   help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///<results>/mlflow.db)")


def build_parser(only: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per subcommand.

    ``only``: the subcommands whose arguments are set up (their modules imported); default every one. The others
    are listed in ``--help`` with their one line and parse nothing: :func:`main` sets up only the one it runs.
    """
    parser = OneLineParser(
        prog="run_bench.py",
        description="Ablation benchmark harness for GRPO post-training performance (verl; embedded engine "
        "on machines without an accelerator). `run_bench.py MATRIX.yaml` = `run_bench.py run MATRIX.yaml`.",
    )
    parser.add_argument("--version", action=_VersionAction,
                        help="print the package version and the git short sha of the code, then exit")
    names = subcommands()
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(names) + "}")
    for name, help_line in names.items():
        p = sub.add_parser(name, help=help_line, description=help_line)
        add_common(p)
        if only is None or name in only:
            cls = command_class(name)
            cls.setup_arguments(p)
            p.set_defaults(_command=cls)
    return parser


#: signals that end the harness like Ctrl-C (runs and the fork server stopped, the sweep closed as interrupted),
#: each with its exit code (128 + the signal's number) and word: a closed terminal or SSH session sends SIGHUP
STOP_SIGNALS = {signal.SIGTERM: (143, "terminated"),
                **({signal.SIGHUP: (129, "hangup")} if hasattr(signal, "SIGHUP") else {})}


def _terminate(signum, frame) -> None:
    """SIGTERM/SIGHUP handler: unwind like Ctrl-C, so runs and the fork server are stopped and the sweep closed."""
    exc = Terminated()
    exc.signum = signum
    raise exc


def crash_log(results: Path | None, argv: list[str]) -> Path:
    """Write the current exception's traceback to ``<results>/logs/error-<time>-<pid>.log`` (or the
    temporary folder when the results folder cannot be written); returns the log's path."""
    text = f"run_bench.py {' '.join(argv)}\nstep: {current_step()}\n\n{traceback.format_exc()}"
    name = f"error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    for folder in ([Path(results) / "logs"] if results is not None else []) + [Path(tempfile.gettempdir())]:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
            return folder / name
        except OSError:
            continue
    return Path(os.devnull)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the subcommand; returns the exit code (never raises, never prints a traceback)."""
    argv = order_argv(list(sys.argv[1:] if argv is None else argv))
    args = None
    previous: dict | None = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}  # an ignored SIGHUP (nohup) stays
    previous = {sig: h for sig, h in previous.items()
                if h is not None and (h is not signal.SIG_IGN or sig == signal.SIGTERM)}
    try:
        for sig in previous:
            signal.signal(sig, _terminate)
    except ValueError:  # not the main thread (tests calling main() from a thread)
        previous = None
    try:
        parser = build_parser(only=argv[:1])  # argv[0]: the subcommand (order_argv), or --help / --version
        if not argv:
            parser.print_help()
            return 2
        args, extra = parser.parse_known_args(argv)
        if extra:  # `run M.yaml --dry-run base.steps=4`: overrides after options land here
            if isinstance(getattr(args, "overrides", None), list) and not any(x.startswith("-") for x in extra):
                args.overrides += extra
            else:
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
        check_flag_ranges(args)
        check_flag_combinations(args.command or "run", argv, args)
        args.tracking_uri_given = args.tracking_uri is not None
        if args.tracking_uri is None:
            args.tracking_uri = default_tracking_uri(args.results)
        check_paths_and_uri(args)
        return int(args._command.run(args) or 0)
    except BenchError as exc:
        print(f"error: {_one_line(cli_message(exc))}", file=sys.stderr)
        return exc.exit_code
    except Terminated as exc:
        code, word = STOP_SIGNALS.get(getattr(exc, "signum", signal.SIGTERM), STOP_SIGNALS[signal.SIGTERM])
        print(f"{word}: finished runs are kept; rerun the same command to resume", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print("interrupted: finished runs are kept; rerun the same command to resume", file=sys.stderr)
        return 130
    except SystemExit as exc:  # argparse (--help, usage errors) and libraries calling sys.exit
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # noqa: BLE001 - the error boundary
        step = getattr(exc, "bench_step", None) or current_step() or f"running `{argv[0] if argv else ''}`"
        if is_no_space(exc):  # no crash log: there is no room for one, and the cause is known
            where = getattr(exc, "filename", None) or getattr(args, "results", None) or "the output folder"
            print(f"error: disk full while {step} ({where}): free some space and rerun the same command "
                  "(finished runs are kept)", file=sys.stderr)
            return 1
        log = crash_log(getattr(args, "results", None), argv)
        msg = _one_line(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        print(f"error: unexpected {msg} while {step}; full traceback in {log}", file=sys.stderr)
        return 1
    finally:
        for sig, handler in (previous or {}).items():
            signal.signal(sig, handler)


def _one_line(text: str) -> str:
    """``text`` folded onto one line (a message is one line, whatever a library put into it), its control
    characters escaped (:func:`bench.core.errors.printable`: a name the user gave is echoed, never obeyed)."""
    lines = [ln.strip() for ln in str(text).replace("\r\n", "\n").split("\n") if ln.strip()]  # other breaks escaped
    return printable(" | ".join(lines)[:2000]) if lines else ""
