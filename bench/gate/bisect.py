"""``run_bench.py bisect --good REV --bad REV --matrix M``: the first commit that made the matrix slower
(:func:`run_bisect`), by interleaved comparisons (:func:`bench.gate.interleaved.run_interleaved_gate`).

**Range** (:func:`resolve_range`): the first-parent commits ``c_1 .. c_n`` of ``good..bad`` (``c_n`` = bad,
``c_0`` = good), in a git repository holding the harness (this checkout's by default, ``--repo`` another one).
Each commit is judged against good: "slower" (a regression of the interleaved gate: the repeated interval at the
probe's alpha above 0, the estimate beyond the threshold ...), "not slower" (every cell unchanged or faster: the
gate could see ``max_mde`` and the interval's upper end is below it) or "cannot judge".

**Probes**, in order: (1) bad against good; not slower ends the bisection ("no commit in this range is slower",
with the interval); (2) binary search: with ``c_lo`` known not slower and ``c_hi`` known slower, ``c_mid``
(``mid = (lo + hi) // 2``) against good, until ``hi = lo + 1``; (3) re-confirmation of the final pair: ``c_hi``
against its parent ``c_hi-1`` (skipped when the parent is good: that pair was probed directly). Each probe is one
interleaved gate sweep of two temporary worktrees (:func:`bench.execution.stacks.git_worktree`: the base's and
the commit's checkout, removed when the probe ends, however it ends), both run by this harness's sweep loop, each
run importing its own version's code.

**Error control** (fixed before the first probe, :func:`probe_alpha`): at most ``k = ceil(log2 n) + 2`` probes
(one for the range, ``ceil(log2 n)`` for the search, one for the final pair), each at ``alpha / k`` with the gate's
own sequential rule (O'Brien-Fleming repeated intervals over its blocks, Bonferroni over its cells). The
bisection names a wrong commit only if some probe's verdict is wrong: a "slower" where the commit is not slower
than its base (at most ``alpha / k`` each) or a "not slower" where it is slower by ``max_mde`` or more (at most
``alpha / (2k)`` each), so by the union bound (Bonferroni) **the probability that the bisection names a wrong
commit is at most alpha**, for a range whose commits are each either not slower than good or slower by at least
``max_mde`` (a step; a change inside the gate's indifference zone ``(0, max_mde)`` may be called either way). A
probe that cannot judge within its budget (``--budget``, ``--blocks``) stops the bisection: it says so and names
the range still holding the first slower commit; it never guesses.

**A stack's tree** (``stack``, ``--stack NAME``): the commits are those of the git repository of a source tree
that the matrix's stack ``NAME`` puts first on the path (a user's verl fork), not the harness's. Each probe is then
a gate between two stacks, ``NAME@<base>`` and ``NAME@<commit>`` (:func:`bench.gate.stacks.pin_stack_sides`: the
stack with that tree checked out at each revision, named ``NAME-<sha 10>``); both sides run this checkout of the
harness, each in the stack's interpreter with its variables.

**Resume** (:class:`BisectState`): ``<results>/bisect/<matrix>-<good>-<bad>/bisect.json`` keeps every finished
probe under its commit pair and the fixed analysis settings (:func:`settings_key`); rerunning the same command
skips them, and a probe interrupted mid-sweep resumes its gate sweep (its own results folder under ``probes/``).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bench.core.errors import BenchError, InputError
from bench.core.files import atomic_write_json, read_json
from bench.execution.stacks import git, git_worktree
from bench.gate.interleaved import DEFAULT_BLOCKS, run_interleaved_gate
from bench.gate.stacks import REV_SEP, STACK, stack_tree
from bench.gate.verdicts import CANNOT_JUDGE, EXIT_CANNOT_JUDGE, EXIT_PASS
from bench.spec.launch import REPO_ROOT
from bench.spec.loading import load_matrix
from bench.spec.stack import MAX_STACK_NAME
from bench.tune.storage import check_tune_block

#: the state file of a bisection, in its folder
STATE_FILE = "bisect.json"
#: a probe's verdicts
SLOWER, NOT_SLOWER = "slower", "not slower"
#: the file a probe's base/commit must hold to be a checkout of the harness
HARNESS_MARK = "bench/__init__.py"


#: the inputs named in bad-input messages (a command prints its flag in their place: bench.commands.base.FLAGS)
GOOD, BAD = "good revision", "bad revision"



@dataclass(frozen=True)
class BisectRange:
    """The commits a bisection searches.

    Attributes:
        repo: the git repository's top folder.
        good, bad: full shas (``good`` not slower by assumption, ``bad`` judged by the first probe).
        commits: first-parent commits of ``good..bad``, oldest first, ``bad`` last (``c_1 .. c_n``).
        subjects: each commit's subject line, by sha (``good`` too).
    """

    repo: Path
    good: str
    bad: str
    commits: tuple[str, ...]
    subjects: dict[str, str]

    def at(self, i: int) -> str:
        """``c_i`` (``c_0`` = good)."""
        return self.good if i == 0 else self.commits[i - 1]


def resolve_range(repo: Path | None, good: str, bad: str, *, flag: str = "repository",
                  mark: str | None = HARNESS_MARK) -> BisectRange:
    """The commits between ``good`` and ``bad`` in ``repo`` (default: this harness's checkout), checked.
    ``mark``: a file both ends must hold (default :data:`HARNESS_MARK`: a checkout of the harness; ``None`` for
    a stack's tree).

    Raises:
        BenchError: ``repo`` is not a folder or not inside a git repository; ``good``/``bad`` is not a revision
            of it; both name one commit; good is not an ancestor of bad, or not on bad's first-parent line; a
            commit at either end holds no harness (``bench/__init__.py``). One line each.
    """
    folder = Path(repo).expanduser() if repo is not None else REPO_ROOT
    if not folder.is_dir():
        raise InputError(flag, f"{flag} {repo}: not a folder (allowed: a git repository holding the harness)")
    top = git(folder, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        raise InputError(flag, f"{flag} {folder}: not a git repository (allowed: a git checkout of the harness)")
    root = Path(top.stdout.strip())
    shas = {}
    for name, rev in ((GOOD, good), (BAD, bad)):
        res = git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
        if res.returncode != 0 or not res.stdout.strip():
            raise InputError(name, f"{name} {rev}: unknown revision in {root} (allowed: a commit, branch or tag there)")
        shas[name] = res.stdout.strip()
    g, b = shas[GOOD], shas[BAD]
    if g == b:
        raise InputError(GOOD, f"{GOOD} {good} and {BAD} {bad}: the same commit {g[:12]} "
                         "(allowed: good an ancestor of bad)")
    if git(root, "merge-base", "--is-ancestor", g, b).returncode != 0:
        raise InputError(GOOD, f"{GOOD} {good}: not an ancestor of {BAD} {bad} in {root} "
                         "(allowed: an older commit of bad's history)")
    res = git(root, "rev-list", "--first-parent", "--reverse", f"{g}..{b}")
    commits = tuple(res.stdout.split())
    if res.returncode != 0 or not commits or git(root, "rev-parse", f"{commits[0]}^1").stdout.strip() != g:
        raise InputError(GOOD, f"{GOOD} {good}: not on the first-parent line of {BAD} {bad} (merged in from a side "
                         "branch; allowed: a commit on that line, e.g. the merge base)")
    for name, sha in ((GOOD, g), (BAD, b)) if mark else ():
        if git(root, "cat-file", "-e", f"{sha}:{mark}").returncode != 0:
            raise InputError(name, f"{name} {sha[:12]}: holds no harness ({mark}) in {root} "
                             "(allowed: commits of a checkout of this harness)")
    log = git(root, "log", "--no-walk", "--format=%H %s", g, *commits).stdout
    subjects = dict(line.split(" ", 1) if " " in line else (line, "") for line in log.splitlines())
    return BisectRange(repo=root, good=g, bad=b, commits=commits, subjects=subjects)


def probe_alpha(n: int, alpha: float) -> tuple[int, float]:
    """``(k, alpha / k)``: the most probes a bisection of ``n`` commits runs, ``k = ceil(log2 n) + 2`` (the range,
    the binary search, the final pair), and each probe's level (Bonferroni over the ``k``; module text).

    Raises:
        ValueError: ``n < 1`` or ``alpha`` outside ``(0, 1)``.
    """
    if n < 1 or not 0 < alpha < 1:
        raise ValueError(f"probe_alpha: n={n}, alpha={alpha} (allowed: n >= 1, 0 < alpha < 1)")
    k = math.ceil(math.log2(n)) + 2
    return k, alpha / k


def settings_key(settings: dict[str, Any]) -> str:
    """A 12-hex-digit hash of the fixed analysis settings (a finished probe counts only under the same ones)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]


class BisectState:
    """The finished probes of a bisection, in ``<folder>/bisect.json`` (written whole, atomically, after each
    probe): ``{"format": "grpo-bench-bisect", "probes": {"<base>..<commit>@<settings key>": probe}, "settings":
    {key: settings}, "result": the last result}``; a probe's ``finished_unix`` (seconds since the epoch) orders
    them, the keys are sorted. Nothing is written until the first probe ends."""

    def __init__(self, folder: Path):
        self.folder, self.path = Path(folder), Path(folder) / STATE_FILE
        data = read_json(self.path) if self.path.exists() else None
        if self.path.exists() and (not isinstance(data, dict) or data.get("format") != "grpo-bench-bisect"
                                   or not isinstance(data.get("probes"), dict)):
            raise BenchError(f"{self.path}: not a bisect state file (move it away to start afresh)")
        self.data: dict[str, Any] = data or {"format": "grpo-bench-bisect", "probes": {}, "settings": {}}
        self.data.setdefault("settings", {})

    @staticmethod
    def key(base: str, commit: str, skey: str) -> str:
        """The key of the probe of ``commit`` against ``base`` under the settings ``skey``."""
        return f"{base}..{commit}@{skey}"

    def get(self, base: str, commit: str, skey: str) -> dict[str, Any] | None:
        """The finished probe, or ``None``."""
        return self.data["probes"].get(self.key(base, commit, skey))

    def put(self, probe: dict[str, Any], skey: str, settings: dict[str, Any]) -> None:
        """Keep a finished probe (and its settings) and write the file."""
        self.data["probes"][self.key(probe["base"], probe["commit"], skey)] = probe
        self.data["settings"][skey] = settings
        atomic_write_json(self.path, self.data)

    def finish(self, result: dict[str, Any]) -> None:
        """Keep the bisection's result beside its probes."""
        self.data["result"] = {k: v for k, v in result.items() if k != "probes"}
        atomic_write_json(self.path, self.data)


def probe_summary(gate: dict[str, Any]) -> dict[str, Any]:
    """A probe's verdict from its interleaved gate result: ``verdict`` (:data:`SLOWER` when a cell regressed,
    :data:`NOT_SLOWER` when every cell is unchanged or faster, else ``"cannot judge"``), ``change``, ``ci_low``,
    ``ci_high`` (fractions; of the cell with the largest change), ``blocks``, ``reason`` and ``cells`` (per cell:
    ``cell``, ``verdict`` of the gate, ``change``, ``ci_low``, ``ci_high``, ``blocks``, ``reason``)."""
    cells = [{k: r.get(k) for k in ("cell", "verdict", "change", "ci_low", "ci_high", "blocks", "reason")}
             for r in gate.get("rows", [])]
    verdicts = [c["verdict"] for c in cells]
    if "regression" in verdicts:
        verdict = SLOWER
    elif cells and all(v in ("unchanged", "improvement") for v in verdicts):
        verdict = NOT_SLOWER
    else:
        verdict = CANNOT_JUDGE
    judged = [c for c in cells if c["change"] is not None]
    head = max(judged, key=lambda c: c["change"]) if judged else {}
    reasons = [f"{c['cell']}: {c['verdict']}" + (f" ({c['reason']})" if c.get("reason") else "")
               for c in cells if c["verdict"] not in ("regression", "unchanged", "improvement")]
    return {"verdict": verdict, "change": head.get("change"), "ci_low": head.get("ci_low"),
            "ci_high": head.get("ci_high"), "blocks": gate.get("blocks_run"), "reason": "; ".join(reasons),
            "cells": cells}


def run_bisect(*, matrix_path: Path, good: str, bad: str, results: Path, tracking_uri: str, repo: Path | None = None,
               overrides: list[str] | None = None, blocks: int | None = None, threshold: float, alpha: float,
               max_mde: float | None = None, normalize: bool = True, budget_s: float | None = None,
               spawn: bool = False, order_seed: int | None = None, stack: str | None = None,
               on_probe: Callable[[str, dict[str, Any]], None] | None = None,
               on_event: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Find the first commit of ``good..bad`` (first parents) that makes ``matrix_path`` slower (module text).

    Args:
        matrix_path, overrides: the matrix every probe runs (a matrix without the stack factor).
        good, bad: revisions of ``repo`` (default: this harness's checkout; with ``stack``, the repository of that
            stack's source tree, :func:`stack_tree`).
        stack: bisect the commits of this stack's source tree instead of the harness's (module text).
        results: results folder; the state is ``<results>/bisect/<matrix>-<good>-<bad>/``.
        blocks, budget_s: each probe's most blocks (default: the matrix's repeats, at least 8) and wall seconds.
        threshold, max_mde: the gate's (fractions); ``alpha``: the whole bisection's (each probe ``alpha / k``).
        on_probe: ``on_probe(stage, probe)``, ``stage`` ``"start"`` (``commit``, ``base``, ``role``, ``index``),
            ``"done"`` or ``"skip"`` (a probe finished before, taken from the state file).
        on_event: the gate sweep's events (:class:`bench.execution.sweep.Sweep`).

    Returns:
        ``{"outcome": "found" | "none" | "cannot judge", "exit_code", "first_bad", "range", "probes",
        "settings", "wall_s", "wall_s_total", "state", ...}``: ``found`` names ``first_bad`` with ``change``,
        ``ci_low``/``ci_high`` (the final pair's), ``none`` gives the range probe's interval, ``cannot judge``
        names ``remaining`` (``(last not slower, first known slower)`` shas: the first slower commit lies after the
        first and at or before the second).

    Raises:
        BenchError: bad input (:func:`resolve_range`, a bad matrix or flag), before anything is written.
        KeyboardInterrupt: Ctrl-C / SIGTERM; finished probes are kept, the probe's worktrees removed.
    """
    t0 = time.time()
    if not 0 <= threshold < 1:
        raise InputError("threshold", f"threshold {threshold}: must be a fraction in [0, 1) (0.05 = 5 %)")
    if not 0 < alpha < 0.5:
        raise InputError("alpha", f"alpha {alpha}: must be in (0, 0.5)")
    if budget_s is not None and budget_s <= 0:
        raise InputError("budget", f"budget {budget_s}: must be a positive duration (e.g. 90s, 10m)")
    matrix = load_matrix(matrix_path, overrides)
    if matrix.tune is not None:
        check_tune_block(matrix)
    if matrix.stack_levels:
        raise BenchError(f"{matrix_path}: factors.stack: bisect compares commits of the harness (allowed: a matrix "
                         "without the stack factor)")
    n_blocks = blocks if blocks is not None else max(matrix.repeats, DEFAULT_BLOCKS)
    if n_blocks < 2:
        raise InputError("blocks", f"blocks {n_blocks}: a paired comparison needs 2 or more blocks")
    tree = stack_tree(matrix, stack, repo, label=STACK) if stack is not None else None
    rng = resolve_range(tree[1] if tree else repo, good, bad, mark=None if tree else HARNESS_MARK)
    n = len(rng.commits)
    k, a_probe = probe_alpha(n, alpha)
    settings = {"matrix": matrix.name, "matrix_fingerprint": matrix.fingerprint(), "threshold": threshold,
                "alpha": alpha, "probes_max": k, "alpha_per_probe": a_probe,
                "max_mde": 2 * threshold if max_mde is None else max_mde, "normalize": bool(normalize),
                "blocks": n_blocks, "budget_s": budget_s, "spawn": bool(spawn)}
    if stack is not None:
        settings["stack"] = stack
    skey = settings_key(settings)
    folder = Path(results) / "bisect" / (f"{matrix.name}-{rng.good[:10]}-{rng.bad[:10]}"
                                         + (f"-{stack[:MAX_STACK_NAME]}" if stack is not None else ""))
    state = BisectState(folder)
    probes: list[dict[str, Any]] = []
    emit = on_probe or (lambda stage, probe: None)

    def probe(i_base: int, i: int, role: str) -> dict[str, Any]:
        base, commit = rng.at(i_base), rng.at(i)
        done = state.get(base, commit, skey)
        head = {"index": len(probes) + 1, "role": role, "base": base, "commit": commit,
                "subject": rng.subjects.get(commit, ""), "position": i}
        if done is not None:
            p = {**done, **head, "resumed": True}
            probes.append(p)
            emit("skip", p)
            return p
        emit("start", head)
        t1 = time.time()
        common = dict(results=folder / "probes" / f"{base[:10]}-{commit[:10]}", tracking_uri=tracking_uri,
                      overrides=overrides, blocks=n_blocks, threshold=threshold, alpha=a_probe, max_mde=max_mde,
                      normalize=normalize, spawn=spawn, order_seed=order_seed, budget_s=budget_s, on_event=on_event)
        if tree is not None:  # the stack twice, its tree at base and at commit, both run by this checkout
            gate = run_interleaved_gate(matrix_path=matrix_path, baseline_ref=None, stack_repo=tree[2],
                                        stacks=(f"{stack}{REV_SEP}{base}", f"{stack}{REV_SEP}{commit}"), **common)
        else:
            with git_worktree(rng.repo, base, prefix="bench-bisect-base-") as base_tree, \
                    git_worktree(rng.repo, commit, prefix="bench-bisect-commit-") as commit_tree:
                gate = run_interleaved_gate(matrix_path=matrix_path, baseline_ref=str(base_tree),
                                            candidate_root=commit_tree, **common)
        p = {**head, **probe_summary(gate), "wall_s": time.time() - t1, "alpha": a_probe,
             "gate": gate.get("files", [None])[-1], "resumed": False, "finished_unix": time.time()}
        state.put({k: v for k, v in p.items() if k not in ("index", "resumed")}, skey, settings)
        probes.append(p)
        emit("done", p)
        return p

    def finish(outcome: str, code: int, **extra: Any) -> dict[str, Any]:
        wall = time.time() - t0
        res = {"outcome": outcome, "exit_code": code, "repo": str(rng.repo), "stack": stack, "good": rng.good,
               "bad": rng.bad,
               "commits": n, "settings": settings, "probes": probes, "wall_s": wall,
               "wall_s_total": sum(p["wall_s"] for p in probes if p.get("resumed")) + wall,
               "state": str(state.path), **extra}
        state.finish(res)
        return res

    found = search(n, lambda i_base, i, role: probe(i_base, i, role)["verdict"])
    lo, hi = found["lo"], found["hi"]
    last = probes[-1] if found["last"] is None else next(
        p for p in probes if p["base"] == rng.at(found["last"][0]) and p["commit"] == rng.at(found["last"][1]))
    if found["outcome"] == "none":
        return finish("none", EXIT_PASS, change=last["change"], ci_low=last["ci_low"], ci_high=last["ci_high"])
    if found["outcome"] == "found":
        return finish("found", EXIT_PASS, first_bad=rng.at(hi), subject=rng.subjects.get(rng.at(hi), ""),
                      parent=rng.at(hi - 1), change=last["change"], ci_low=last["ci_low"], ci_high=last["ci_high"])
    reason = last["reason"] if last["verdict"] == CANNOT_JUDGE else (
        f"{rng.at(hi)[:12]} is slower than good but not than its parent {rng.at(hi - 1)[:12]}: no single commit "
        "is confirmed (the slowdown may build up over several commits)")
    return finish(CANNOT_JUDGE, EXIT_CANNOT_JUDGE, remaining=(rng.at(lo), rng.at(hi)), reason=reason)


def search(n: int, judge: Callable[[int, int, str], str]) -> dict[str, Any]:
    """The bisection's decisions over ``c_0`` (good) .. ``c_n`` (bad), given ``judge(i_base, i, role) -> verdict``
    (:data:`SLOWER`, :data:`NOT_SLOWER` or ``"cannot judge"``: the probe of ``c_i`` against ``c_i_base``, ``role``
    ``"range"``, ``"search"`` or ``"confirm"``), called at most ``k`` times (:func:`probe_alpha`; module text).

    Returns:
        ``{"outcome": "found" | "none" | "cannot judge", "lo", "hi", "last"}``: ``c_lo`` is the last commit judged
        not slower, ``c_hi`` the first judged slower (``found``: the first slower commit, confirmed against its
        parent); ``last``: ``(i_base, i)`` of the probe the outcome rests on when that is not the last call (the
        final pair already probed directly), else ``None``.
    """
    verdict = judge(0, n, "range")
    if verdict != SLOWER:
        return {"outcome": "none" if verdict == NOT_SLOWER else CANNOT_JUDGE, "lo": 0, "hi": n, "last": None}
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        verdict = judge(0, mid, "search")
        if verdict == SLOWER:
            hi = mid
        elif verdict == NOT_SLOWER:
            lo = mid
        else:
            return {"outcome": CANNOT_JUDGE, "lo": lo, "hi": hi, "last": None}
    if lo == 0:  # the parent is good: the final pair (good, c_hi) was probed directly, slower
        return {"outcome": "found", "lo": lo, "hi": hi, "last": (0, hi)}
    verdict = judge(hi - 1, hi, "confirm")
    return {"outcome": "found" if verdict == SLOWER else CANNOT_JUDGE, "lo": lo, "hi": hi, "last": None}


__all__ = ["BisectRange", "BisectState", "NOT_SLOWER", "SLOWER", "probe_alpha", "probe_summary", "resolve_range",
           "run_bisect", "search", "settings_key"]
