"""``bisect`` as a user runs it, on a local repository with one planted slowdown (issue 44's acceptance).

Not a test. Builds ``<work>/repo``: a clone of this repository's HEAD plus ``--commits`` commits, each a neutral
edit of the embedded engine's step module (a comment line), except commit ``--slow-at`` which also plants a
``--slowdown`` (default 10 %) in the rollout phase of every training step (CPU work sized from the step before,
:func:`bench_gate.rollout_slowdown_patch`, the same planted slowdown as ``bench_gate.py interleaved --phase
rollout``). Then, each as ``python run_bench.py bisect --repo <work>/repo --matrix M`` (this checkout's harness):

1. try 1: ``--good`` the clone's HEAD, ``--bad`` the last commit, interrupted (SIGINT) once its first probe is
   kept, then the same command again (the resume: the first probe must be "finished earlier");
2. the range without the regression (``--good`` HEAD, ``--bad`` the commit before the slow one): it must end
   "no commit in this range is slower" with its interval;
3. tries 2 .. ``--tries``: the whole range again, each with its own results folder.

Each outcome is appended to ``<work>/tries.jsonl`` (a rerun skips the finished ones) and printed: the commit
named (and whether it is the planted one), the probes (commit, verdict, change, interval, blocks, wall s), total
wall time. ``--until HH:MM`` (UTC) starts nothing that would likely end after it.

    python benchmarks/bisect_tries.py --work /tmp/bisect-tries --tries 5 --budget 7m
    python benchmarks/bisect_tries.py --work /tmp/bisect-tries --budget 15m --alpha 0.2 --set base.steps=5  # busy
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gate import ROLLOUT_ANCHOR, STEP_ANCHOR, cpu_pressure, rollout_slowdown_patch  # noqa: E402

STEP = "bench/engines/embedded/step.py"
GIT_ENV = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost", "GIT_COMMITTER_NAME": "bench",
           "GIT_COMMITTER_EMAIL": "bench@localhost"}


def git(repo: Path, *args: str) -> str:
    """``git -C repo ARGS``'s output."""
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}).stdout.strip()


def build_repo(repo: Path, commits: int, slow_at: int, slowdown: float) -> dict[str, str]:
    """The clone and its commits; returns ``{"good", "bad", "slow", "before_slow"}`` (shas)."""
    if not repo.exists():
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(repo)], check=True)
        good = git(repo, "rev-parse", "HEAD")
        for i in range(1, commits + 1):
            step = repo / STEP
            text = step.read_text() + f"# neutral change {i}\n"
            if i == slow_at:
                work, book = rollout_slowdown_patch(slowdown, "use_dynamic_bsz")
                for anchor in (ROLLOUT_ANCHOR, STEP_ANCHOR):
                    assert text.count(anchor) == 1, "anchor of the planted slowdown not found"
                text = text.replace(ROLLOUT_ANCHOR, ROLLOUT_ANCHOR + work).replace(STEP_ANCHOR, STEP_ANCHOR + book)
            step.write_text(text)
            git(repo, "commit", "-qam", f"{'slow' if i == slow_at else 'neutral'} {i}")
        git(repo, "tag", "bisect-good", good)
    shas = git(repo, "rev-list", "--reverse", "bisect-good..HEAD").split()
    return {"good": git(repo, "rev-parse", "bisect-good"), "bad": shas[-1], "slow": shas[slow_at - 1],
            "before_slow": shas[slow_at - 2] if slow_at > 1 else git(repo, "rev-parse", "bisect-good")}


def bisect_cmd(args: argparse.Namespace, work: Path, good: str, bad: str, name: str) -> list[str]:
    """The ``run_bench.py bisect`` command line of one try."""
    return [sys.executable, str(ROOT / "run_bench.py"), "bisect", "--repo", str(work / "repo"), "--good", good,
            "--bad", bad, "--matrix", str((ROOT / args.matrix).resolve()), "--results", str(work / name),
            "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}", *(["--budget", args.budget] if args.budget else []),
            "--alpha", str(args.alpha), *[x for o in args.set for x in ("--set", o)]]


def run(cmd: list[str], interrupt_when: Path | None = None) -> tuple[int, str, float]:
    """Run ``cmd``; with ``interrupt_when`` (a glob root), send SIGINT once a ``bisect.json`` exists under it."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "GITHUB_STEP_SUMMARY")}
    env["PYTHONPATH"] = str(ROOT)
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    if interrupt_when is not None:
        while proc.poll() is None and not list(interrupt_when.glob("bisect/*/bisect.json")):
            time.sleep(1)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate()
    return proc.returncode, out, time.time() - t0


def state(work: Path, name: str) -> dict:
    """The finished bisection's state file (its probes and result)."""
    (path,) = (work / name).glob("bisect/*/bisect.json")
    return json.loads(path.read_text())


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def line(e: dict) -> str:
    """One printed line per outcome."""
    r = e.get("result") or {}
    head = (f"{e['name']}: exit {e['exit']}, {r.get('outcome')}"
            + (f" {str(r.get('first_bad'))[:12]} (planted: {e['planted_named']})" if r.get("outcome") == "found"
               else "")
            + f", {pct(r.get('change'))} [{pct(r.get('ci_low'))}, {pct(r.get('ci_high'))}], "
            f"{len(e['probes'])} probes, {e['wall_s']:.0f} s wall"
            + (f" (interrupted after {e['wall_s_interrupted']:.0f} s, then resumed)" if e.get("wall_s_interrupted")
               else "") + f", CPU pressure {e.get('pressure')}")
    probes = [f"    {p['role']:7s} {p['commit'][:10]} vs {p['base'][:10]}: {p['verdict']}, {pct(p.get('change'))} "
              f"[{pct(p.get('ci_low'))}, {pct(p.get('ci_high'))}], {p.get('blocks')} blocks, {p['wall_s']:.0f} s"
              for p in e["probes"]]
    return "\n".join([head, *probes])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, required=True, help="work folder (the repository, results, log)")
    p.add_argument("--tries", type=int, default=5)
    p.add_argument("--commits", type=int, default=8, help="commits after good (the range)")
    p.add_argument("--slow-at", type=int, default=5, help="which of them plants the slowdown (1-based)")
    p.add_argument("--slowdown", type=float, default=0.10)
    p.add_argument("--matrix", default="matrix/gate.yaml")
    p.add_argument("--budget", default="7m", help="each probe's wall budget")
    p.add_argument("--alpha", type=float, default=0.05, help="the whole bisection's alpha")
    p.add_argument("--set", action="append", default=[], metavar="base.KEY=VALUE", help="matrix override (repeatable)")
    p.add_argument("--until", default=None, metavar="HH:MM", help="UTC time after which nothing new starts")
    args = p.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    shas = build_repo(work / "repo", args.commits, args.slow_at, args.slowdown)
    log = work / "tries.jsonl"
    done = {json.loads(x)["name"]: json.loads(x) for x in log.read_text().splitlines()} if log.exists() else {}
    plan = [("try1-resumed", shas["good"], shas["bad"], True), ("no-regression", shas["good"], shas["before_slow"],
                                                                 False)]
    plan += [(f"try{i}", shas["good"], shas["bad"], False) for i in range(2, args.tries + 1)]
    until = None
    if args.until:
        hh, mm = map(int, args.until.split(":"))
        until = dt.datetime.now(dt.timezone.utc).replace(hour=hh, minute=mm, second=0, microsecond=0).timestamp()
    print(f"repo {work / 'repo'}: good {shas['good'][:10]}, {args.commits} commits, planted {args.slowdown:.0%} at "
          f"{shas['slow'][:10]} (commit {args.slow_at}); matrix {args.matrix} {' '.join(args.set)}, budget "
          f"{args.budget} per probe, alpha {args.alpha}",
          flush=True)
    for name, good, bad, interrupt in plan:
        if name in done:
            print(line(done[name]), flush=True)
            continue
        walls = [e["wall_s"] for e in done.values() if e["name"].startswith("try")]
        if until is not None and walls and time.time() + max(walls) > until:
            print(f"stopping before {name}: the longest try so far ({max(walls):.0f} s) would end after {args.until}")
            break
        cmd = bisect_cmd(args, work, good, bad, name)
        started = dt.datetime.now(dt.timezone.utc).strftime("%H:%M:%S")
        wall_int = None
        if interrupt:
            rc, out, wall_int = run(cmd, interrupt_when=work / name)
            if rc != 130:
                print(f"{name}: the interrupted invocation ended with exit {rc}:\n{out[-3000:]}")
        rc, out, wall = run(cmd)
        st = state(work, name) if list((work / name).glob("bisect/*/bisect.json")) else {}
        result = st.get("result") or {}
        probes = sorted(st.get("probes", {}).values(), key=lambda q: q.get("finished_unix", 0))  # in probe order
        probes = [{k: q.get(k) for k in ("role", "base", "commit", "verdict", "change", "ci_low", "ci_high", "blocks",
                                         "wall_s")} for q in probes]
        e = {"name": name, "started_utc": started, "exit": rc, "result": result, "probes": probes,
             "wall_s": wall + (wall_int or 0.0), "wall_s_interrupted": wall_int,
             "resumed_probe_skipped": ("(finished earlier)" in out) if interrupt else None,
             "planted_named": result.get("first_bad") == shas["slow"], "pressure": cpu_pressure(),
             "load_avg": os.getloadavg(), "tail": out[-1500:]}
        done[name] = e
        with open(log, "a") as fh:
            fh.write(json.dumps(e) + "\n")
        print(line(e), flush=True)
    tries = [e for n, e in done.items() if n.startswith("try")]
    named = sum(e["planted_named"] for e in tries)
    print(f"\nplanted commit named in {named} of {len(tries)} tries; probes per try "
          f"{[len(e['probes']) for e in tries]}; wall s per try {[round(e['wall_s']) for e in tries]}")
    if "no-regression" in done:
        r = done["no-regression"]["result"]
        print(f"no-regression range: {r.get('outcome')} {pct(r.get('change'))} [{pct(r.get('ci_low'))}, "
              f"{pct(r.get('ci_high'))}]")
    if "try1-resumed" in done:
        print(f"resume: the first probe skipped on the rerun: {done['try1-resumed']['resumed_probe_skipped']}")


if __name__ == "__main__":
    main()
