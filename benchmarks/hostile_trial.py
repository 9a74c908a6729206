"""A hostile trial of the harness's promises for bad input (docs/guarantees.md), written from the docs alone.

Every case runs the real entry point, ``python run_bench.py ...``, niced, in a subprocess in a fresh temporary
folder, and is judged as a new user would judge it:

- a case that must be refused is **clean** when it exits 2 with exactly one stderr line that starts with
  ``error:`` and names what the case broke (a file, key or option; ``must`` below), with no traceback, no raw
  control character, nothing created, changed or removed in its folder, no process left running, in < 10 s of CPU
  time (the wall time is printed too; on a shared machine it measures the other jobs as much as this one);
- a case that may also succeed (``any``) is clean as a refusal above or as an exit in ``ok_rcs`` with no traceback,
  no library wording (SQL, SQLAlchemy, pydantic) and no process left;
- anything else is not clean; its class, exit code, time and first stderr line are printed.

The read-back cases need one real sweep to edit: ``--seed-dir`` names a folder holding one (made once by
``--make-seed``: a tiny embedded sweep of 2 cells x 2 repeats and a baseline of it, under ``flock
/tmp/heavy.lock``; about 2 minutes on a busy CPU). Cases that would need a heavy run (a verl, Ray or real
tune run) are listed as ``heavy`` and skipped. Only 127.0.0.1 and temporary folders are used.

Usage::

    python benchmarks/hostile_trial.py --make-seed --seed-dir /tmp/trial-seed
    nice -n 10 python benchmarks/hostile_trial.py --seed-dir /tmp/trial-seed [--only CLASS] [--list]

Prints one row per case that is not clean, a table per class, the clean share and the slowest refusal.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

REPO = Path(__file__).resolve().parent.parent
MARK = "HOSTILE_TRIAL_CASE"
LIMIT_S = 10.0
LIB_WORDS = ("Traceback", "sqlite3.", "sqlalchemy", "SQLAlchemy", "INSERT INTO", "SELECT ", "pydantic",
             "validation error for", "Unable to extract", "OperationalError", "optuna.exceptions",
             "ValueError:", "TypeError:", "KeyError", "AttributeError")

BASE = {
    "name": "trial",
    "engine": "embedded",
    "platform": "cpu",
    "base": {"steps": 3, "warmup_steps": 1, "train_batch_size": 4, "n": 2, "ppo_mini_batch_size": 4,
             "micro_batch_size_per_gpu": 2, "max_prompt_length": 128, "max_response_length": 24,
             "timeout_s": 300},
    "factors": {"dynamic_bsz": ["off", "on"]},
    "design": "full",
    "repeats": 1,
}


@dataclass
class Case:
    """One hostile input: ``argv`` after ``run_bench.py``, a setup in the case folder, what a clean answer is."""

    cls: str
    name: str
    argv: list[str]
    setup: Callable[[Path], None] | None = None
    expect: str = "refuse"  # refuse | any
    must: tuple[str, ...] = ()  # one of these must be in the refusal line (case-insensitive)
    ok_rcs: tuple[int, ...] = (0,)
    seed: bool = False  # needs the seed sweep copied in as R/
    heavy: bool = False
    env: dict[str, str] = field(default_factory=dict)


def write_matrix(path: Path, doc=None, text: str | None = None, **top) -> None:
    """Write a matrix (BASE with ``top`` keys replaced; a value ``DEL`` removes the key) or raw text."""
    if text is None:
        d = json.loads(json.dumps(BASE)) if doc is None else doc
        for k, v in top.items():
            if v is DEL:
                d.pop(k, None)
            else:
                d[k] = v
        text = yaml.safe_dump(d, allow_unicode=True, sort_keys=False)
    path.write_text(text, encoding="utf-8", errors="surrogateescape")


DEL = object()


def with_base(**kv) -> dict:
    d = json.loads(json.dumps(BASE))
    for k, v in kv.items():
        if v is DEL:
            d["base"].pop(k, None)
        else:
            d["base"][k] = v
    return d


def m_setup(doc=None, text=None, name="m.yaml", **top):
    def setup(d: Path) -> None:
        write_matrix(d / name, doc=doc, text=text, **top)
    return setup


# ----------------------------------------------------------------------------------------------- cases


def matrix_cases() -> list[Case]:
    cs: list[Case] = []
    dry = ["run", "m.yaml", "--dry-run"]

    def add(name, must=(), expect="refuse", **kw):
        cs.append(Case("matrix", name, dry, m_setup(**kw), expect=expect, must=must))

    # unknown keys, at every level
    add("unknown top key", ("nmae",), doc=dict(BASE, nmae="x"))
    add("unknown base key", ("stpes",), doc=with_base(stpes=3))
    add("unknown embedded key", ("lrr",), doc=with_base(embedded={"lrr": 0.1}))
    add("private selected_cells", ("selected_cells",), doc=dict(BASE, selected_cells=["x"]))
    add("private source", ("source",), doc=dict(BASE, source="/etc/passwd"))
    add("unknown tune key", ("tune",), doc=dict(BASE, tune={"n_trailz": 3}))
    add("unknown expect key", ("expect",), doc=dict(BASE, expect={"bogus": 1}))
    add("unknown factor", ("dynamic_bz", "factor"), doc=dict(BASE, factors={"dynamic_bz": ["off", "on"]}))
    add("unknown level", ("dynamic_bsz", "level", "maybe"), doc=dict(BASE, factors={"dynamic_bsz": ["off", "maybe"]}))
    add("unknown design", ("design",), doc=dict(BASE, design="fulll"))
    add("unknown engine", ("engine",), doc=dict(BASE, engine="verll"))
    add("unknown platform", ("platform",), doc=dict(BASE, platform="tpu"))
    add("levles typo", ("levles",), doc=dict(BASE, factors={"dynamic_bsz": {"levles": ["off", "on"]}}))
    # nulls where a value is required
    for key in ("name", "engine", "platform", "base", "factors", "design", "repeats"):
        add(f"null {key}", (key,), doc=dict(BASE, **{key: None}))
    for key in ("steps", "train_batch_size", "n", "max_prompt_length", "max_response_length", "warmup_steps",
                "micro_batch_size_per_gpu"):
        add(f"null base.{key}", (key,), doc=with_base(**{key: None}))
    # missing required
    for key in ("name", "base", "factors"):  # base has defaults (docs/matrix.md): either answer is right
        add(f"missing {key}", (key,), expect="refuse" if key == "name" else "any",
            doc={k: v for k, v in BASE.items() if k != key})
    # types
    bad_vals = {"string number": "3", "float": 3.5, "bool": True, "list": [3], "mapping": {"a": 3},
                "negative": -1, "zero": 0, "huge": 10**30, "2^63": 2**63, "NaN": float("nan"),
                "inf": float("inf"), "-inf": float("-inf"), "text": "many"}
    for key in ("steps", "train_batch_size", "max_response_length"):
        for what, v in bad_vals.items():
            add(f"base.{key} {what}", (key,), doc=with_base(**{key: v}))
    for what, v in bad_vals.items():
        if what == "zero":
            continue
        add(f"repeats {what}", ("repeats",), doc=dict(BASE, repeats=v if what != "negative" else -3))
    for what, v in (("NaN", float("nan")), ("inf", float("inf")), ("negative", -0.1), ("too big", 5.0),
                    ("string", "0.1"), ("bool", False)):
        add(f"embedded.lr {what}", ("lr",), doc=with_base(embedded={"lr": v}))
        add(f"embedded.clip_ratio {what}", ("clip_ratio",), doc=with_base(embedded={"clip_ratio": v}))
    add("base.timeout_s NaN", ("timeout_s",), doc=with_base(timeout_s=float("nan")))
    add("base.timeout_s negative", ("timeout_s",), doc=with_base(timeout_s=-5))
    add("base.seed negative", ("seed",), doc=with_base(seed=-1))
    add("base.seed 2^40", ("seed",), doc=with_base(seed=2**40))
    # consistency
    add("warmup == steps", ("warmup",), doc=with_base(warmup_steps=3))
    add("profile step 0", ("profile_steps",), doc=with_base(profile_steps=[0]))
    add("profile step > steps", ("profile_steps",), doc=with_base(profile_steps=[9]))
    add("profile step twice", ("profile_steps",), doc=with_base(profile_steps=[3, 3]))
    add("profile every measured step", ("profile_steps",), doc=with_base(profile_steps=[2, 3]))
    add("batch does not divide", ("batch",), doc=with_base(ppo_mini_batch_size=3))
    add("base.env bad key", ("env",), doc=with_base(env={"BAD-KEY": "1"}))
    add("base.env NUL value", ("env",), doc=with_base(env={"OK": "a\x00b"}))
    add("base.overrides no equals", ("overrides",), doc=with_base(overrides=["trainer.x"]))
    add("base.overrides newline", ("overrides",), doc=with_base(overrides=["a=1\nb=2"]))
    add("exclusion unknown factor", ("exclude",), doc=dict(BASE, exclude=[{"nope": "on"}]))
    add("explicit design unknown cell", ("design", "cell", "rmsnorm"),
        doc=dict(BASE, design={"type": "explicit", "cells": [{"rmsnorm_fused": "on"}]}))
    add("design mapping no type", ("type",), doc=dict(BASE, design={"resolution": 3}))
    # one varied factor: the design itself is refused first ("needs at least 3 varied factors"), before its generators
    add("fractional bad generators (one varied factor)", ("design", "3 varied factors"),
        doc=dict(BASE, design={"type": "fractional", "generators": "a b zz"}))
    add("fractional resolution string", ("resolution",),
        doc=dict(BASE, design={"type": "fractional", "resolution": "4"}))
    # names
    add("name 300 chars", ("name",), doc=dict(BASE, name="n" * 300))
    add("name with slash", ("name",), doc=dict(BASE, name="../escape"))
    add("name is logs", ("name",), doc=dict(BASE, name="logs"))
    add("name is mlflow.db-wal", ("name",), doc=dict(BASE, name="mlflow.db-wal"))
    add("name ends -smoke", ("name",), doc=dict(BASE, name="x-smoke"))
    add("name empty", ("name",), doc=dict(BASE, name=""))
    add("name ESC", ("name",), doc=dict(BASE, name="a\x1b[2Jb"))
    add("name BEL", ("name",), doc=dict(BASE, name="a\x07b"))
    add("name unicode ok", (), expect="any", doc=dict(BASE, name="ünïcödé"))
    add("key with ESC", ("\\x1b",), doc=dict(BASE, **{"k\x1b]0;pwned\x07": 1}))
    add("base key with ESC", ("\\x1b",), doc=with_base(**{"s\x1b[31mteps": 1}))
    add("key 300 chars", ("k",), doc=dict(BASE, **{"k" * 300: 1}))
    add("factor name with BEL", ("\\x07",), doc=dict(BASE, factors={"dyn\x07": ["off", "on"]}))
    add("unset ${VAR} in name", ("H48_TRIAL_UNSET",), doc=dict(BASE, name="${H48_TRIAL_UNSET}"))
    add("unset ${VAR} in base.model dry-run", (), expect="any",
        doc=with_base(model="${H48_TRIAL_UNSET_MODEL}"))
    add("builtin model typo", ("builtin",), doc=with_base(model="builtin:qwen3vl-tiyn"))
    add("model path missing", ("model",), doc=with_base(model="./no-such-model"))
    add("data path missing", ("data",), doc=with_base(data="./no-such.parquet"))
    add("val_data on embedded", ("val_data",), doc=with_base(val_data="builtin:text"))
    # raw text
    for what, text in (("empty file", ""), ("comment only", "# nothing\n"), ("top-level list", "- 1\n- 2\n"),
                       ("scalar", "hello\n"), ("not yaml", "a: [1, 2\n"), ("tab indent", "name: x\n\tbase: 1\n"),
                       ("duplicate key", yaml.safe_dump(BASE, sort_keys=False) + "name: again\n"),
                       ("python tag", "name: !!python/name:os.system x\n"),
                       ("env tag", "name: !env HOME\n"),
                       ("binary tag", "name: !!binary aGVsbG8=\n"),
                       ("base-60 steps", yaml.safe_dump(BASE, sort_keys=False).replace("steps: 3", "steps: 1:30")),
                       ("octal steps", yaml.safe_dump(BASE, sort_keys=False).replace("steps: 3", "steps: 010")),
                       ("hex steps", yaml.safe_dump(BASE, sort_keys=False).replace("steps: 3", "steps: 0x3")),
                       ("lone surrogate", 'name: "\\udc80"\n'),
                       ("NUL byte", "name: a\x00b\n"),
                       ("latin-1 bytes", None),
                       ("deep nesting", "a: " + "[" * 200 + "]" * 200 + "\n"),
                       ("billion laughs", "a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
                        "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
                        "e: [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"),
                       ("non-string key", "1: x\nname: y\n"),
                       ("control char in value", yaml.safe_dump(BASE, sort_keys=False).replace(
                           "design: full", 'design: "fu\\x1bll"'))):
        if text is None:
            def setup(d, _w=what):
                (d / "m.yaml").write_bytes(b"name: caf\xe9\n")
            cs.append(Case("matrix", what, dry, setup))
        else:
            add(what, (), text=text)
    # stacks blocks
    def st(stacks, factors=None):
        d = json.loads(json.dumps(BASE))
        d["stacks"] = stacks
        d["factors"] = factors if factors is not None else {"stack": list(stacks)[:2]}
        return d
    add("stacks null", ("stack",), doc=st(None, {"stack": ["a", "b"]}))
    add("stacks list", ("stack",), doc=st(["a", "b"], {"stack": ["a", "b"]}))
    add("stack unknown key", ("pythn",), doc=st({"a": {}, "b": {"pythn": "/usr/bin/python3"}}))
    add("stack python missing", ("python",), doc=st({"a": {}, "b": {"python": "./no/bin/python"}}))
    add("stack paths missing", ("paths",), doc=st({"a": {}, "b": {"paths": ["./no-such-tree"]}}))
    add("stack paths not list", ("paths",), doc=st({"a": {}, "b": {"paths": 5}}))
    add("stack env bad key", ("env",), doc=st({"a": {}, "b": {"env": {"A B": "1"}}}))
    add("stack env value list", ("env",), doc=st({"a": {}, "b": {"env": {"AB": [1]}}}))
    add("stack name ESC", ("\\x1b",), doc=st({"a": {}, "b\x1b[2J": {}}))
    add("stack level undeclared", ("stack",), doc=st({"a": {}, "b": {}}, {"stack": ["a", "zz"]}))
    add("stack rev without repo", ("rev",), doc=st({"a": {}, "b": {"paths": [{"path": ".", "rev": "nope"}]}}))
    add("stack path mapping unknown key", ("pth",), doc=st({"a": {}, "b": {"paths": [{"pth": "."}]}}))
    add("stack name 300", ("stack",), doc=st({"a": {}, "s" * 300: {}}))
    add("stack null body", (), expect="any", doc=st({"a": {}, "b": None}))
    # tune block
    def tb(tune):
        good = {"fixed": {"dynamic_bsz": "on"}, "n_trials": 2,
                "space": {"ppo_max_token_len_per_gpu": {"low": 1, "high": 4, "unit": "seq", "log": True}}}
        return dict(BASE, tune={**good, **tune})
    add("tune n_trials NaN", ("tune",), doc=tb({"n_trials": float("nan")}))
    add("tune sampler unknown", ("sampler",), doc=tb({"sampler": {"type": "TPEE"}}))
    add("tune study 300", ("study",), doc=tb({"study": "s" * 300}))
    add("tune storage memory", ("storage",), doc=tb({"storage": "sqlite:///:memory:"}))
    add("tune storage dev null", ("storage",), doc=tb({"storage": "journal:/dev/null"}))
    add("tune confirm_blocks 99", ("confirm_blocks",), doc=tb({"confirm_blocks": 99}))
    # overrides on the command line
    for what, ov, must in (("unknown key", "base.stpes=3", ("stpes",)), ("bad value", "base.steps=abc", ("steps",)),
                           ("NaN", "base.steps=nan", ("steps",)), ("twice", "base.steps=3", ("steps",)),
                           ("no equals", "base.steps", ("base.steps",)), ("not base", "repeats=2", ("repeats",)),
                           ("ESC key", "base.st\x1beps=3", ("\\x1b",)), ("empty", "", ("",)),
                           ("base-60", "base.steps=1:30", ("steps",)), ("huge", "base.steps=1e400", ("steps",))):
        argv = ["run", "m.yaml", "--dry-run", ov] + (["base.steps=4"] if what == "twice" else [])
        cs.append(Case("override", what, argv, m_setup(), must=must))
    return cs


def path_cases() -> list[Case]:
    cs: list[Case] = []
    long = "x" * 300

    def add(name, argv, setup=None, must=(), expect="refuse", seed=False):
        def full(d, _s=setup):
            write_matrix(d / "m.yaml", doc=with_base(model="./decoy-missing-model"))
            if _s:
                _s(d)
        cs.append(Case("paths", name, argv, full, expect=expect, must=must, seed=seed))

    def link(src, dst):
        def s(d):
            (d / dst).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(src, d / dst)
        return s

    def mkfile(rel, content="x"):
        def s(d):
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(content)
        return s

    def ro(rel):
        def s(d):
            (d / rel).mkdir(parents=True, exist_ok=True)
            os.chmod(d / rel, 0o555)
        return s

    # the matrix file itself
    add("matrix dangling link", ["run", "dl.yaml", "--dry-run"], link("nowhere.yaml", "dl.yaml"), ("dl.yaml",))
    add("matrix link loop", ["run", "loop.yaml", "--dry-run"],
        lambda d: (os.symlink("loop2.yaml", d / "loop.yaml"), os.symlink("loop.yaml", d / "loop2.yaml")),
        ("loop",))
    add("matrix 300-char name", ["run", long + ".yaml", "--dry-run"], None, ("long", "255"))
    add("matrix is a folder", ["run", "dir.yaml", "--dry-run"], lambda d: (d / "dir.yaml").mkdir(), ("dir.yaml",))
    add("matrix missing", ["run", "nope.yaml", "--dry-run"], None, ("nope.yaml",))
    add("matrix /dev/null", ["run", "/dev/null", "--dry-run"], None, ("/dev/null",))
    add("matrix empty arg", ["run", "", "--dry-run"], None, ("matrix",))
    add("matrix under a file", ["run", "f/m.yaml", "--dry-run"], mkfile("f"), ("f/m.yaml", "f"))
    # --results for run (non dry: refused before anything; the decoy model makes a real run refuse too)
    for cmd in (["run", "m.yaml"], ["run", "m.yaml", "--dry-run"]):
        tag = " dry" if "--dry-run" in cmd else ""
        add("results is a file" + tag, cmd + ["--results", "rf"], mkfile("rf"), ("results", "rf"))
        add("results dangling link" + tag, cmd + ["--results", "rl"], link("gone", "rl"), ("rl", "results"))
        add("results under a file" + tag, cmd + ["--results", "rf/sub"], mkfile("rf"), ("rf",))
        add("results 300 chars" + tag, cmd + ["--results", long], None, ("results", "long", "255"))
        add("results empty" + tag, cmd + ["--results", ""], None, ("results",))
        add("results /proc" + tag, cmd + ["--results", "/proc/trial"], None, ("results", "/proc"))
    add("results read-only (root may write)", ["run", "m.yaml", "--results", "ro/r"], ro("ro"), ("model", "ro"),
        expect="any")
    # tracking URIs
    for what, uri, setup, must in (
            ("sqlite dangling link", "sqlite:///db.lnk", link("gone.db", "db.lnk"), ("db.lnk",)),
            ("sqlite is a folder", "sqlite:///dbdir", lambda d: (d / "dbdir").mkdir(), ("dbdir",)),
            ("sqlite not sqlite", "sqlite:///junk.db", mkfile("junk.db", "garbage" * 100), ("junk.db",)),
            ("sqlite 300 chars", f"sqlite:///{long}.db", None, ("long", "255", "tracking")),
            ("sqlite missing folder", "sqlite:///nofolder/x.db", None, ("nofolder",)),
            ("memory", "sqlite:///:memory:", None, ("memory",)),
            ("file scheme", "file:///tmp/x", None, ("file",)),
            ("bare folder", "mlruns", None, ("mlruns", "tracking")),
            ("unknown scheme", "ftp://127.0.0.1/x", None, ("ftp",)),
            ("http no server", "http://127.0.0.1:9", None, ("127.0.0.1:9",)),
            ("postgres no driver", "postgresql://u@127.0.0.1/x", None, ("postgres", "driver")),
            ("empty", "", None, ("tracking",)),
            ("ESC in uri (a legal file name)", "sqlite:///a\x1b[2J.db", None, ("\\x1b", "decoy")),
    ):
        add(f"run --tracking-uri {what}", ["run", "m.yaml", "--tracking-uri", uri], setup, must)
    add("$MLFLOW_TRACKING_URI memory", ["run", "m.yaml"], None, ("memory",))
    cs[-1].env = {"MLFLOW_TRACKING_URI": "sqlite://"}
    add("results/mlflow.db dangling", ["run", "m.yaml", "--results", "R"], link("gone.db", "R/mlflow.db"),
        ("mlflow.db",))
    add("results/mlflow.db a folder", ["run", "m.yaml", "--results", "R"],
        lambda d: (d / "R" / "mlflow.db").mkdir(parents=True), ("mlflow.db",))
    add(".lock a folder", ["run", "m.yaml", "--results", "R"],
        lambda d: (d / "R" / "trial" / ".lock").mkdir(parents=True), (".lock",), expect="any")
    # the matrix is checked first: its decoy model is named, and nothing is written
    add("latest not a link", ["run", "m.yaml", "--results", "R"],
        lambda d: (d / "R" / "trial" / "latest").mkdir(parents=True), ("latest", "decoy"))
    add("matrix folder is a file", ["run", "m.yaml", "--results", "R"], mkfile("R/trial"), ("trial", "decoy"))
    # seed-based commands with bad paths
    for cmd in (["report", "seed"], ["gate", "--baseline", "b", "--candidate", "seed"],
                ["compare", "seed", "seed"], ["history", "b"]):
        c = cmd[0]
        add(f"{c} --out is a file", cmd + ["--results", "R", "--out", "of"], mkfile("of"), ("out", "of"), seed=True)
        add(f"{c} --out 300", cmd + ["--results", "R", "--out", long], None, ("out", "long", "255"), seed=True)
        add(f"{c} --out dangling", cmd + ["--results", "R", "--out", "ol"], link("gone", "ol"), ("ol", "out"),
            seed=True)
        add(f"{c} --out empty", cmd + ["--results", "R", "--out", ""], None, ("out",), seed=True)
        add(f"{c} --results missing", cmd + ["--results", "nope"], None, ("nope", "results"), seed=True)
        add(f"{c} tracking dangling", cmd + ["--results", "R", "--tracking-uri", "sqlite:///dl.db"],
            link("gone.db", "dl.db"), ("dl.db",), seed=True, expect="any")
    add("report sweep 300", ["report", long, "--results", "R"], None, ("long", "255", "sweep"), seed=True)
    add("report sweep ESC", ["report", "se\x1b[2Jed", "--results", "R"], None, ("\\x1b",), seed=True)
    add("report sweep empty", ["report", "", "--results", "R"], None, ("sweep",), seed=True)
    add("sync sweep empty", ["sync", "", "--results", "R"], None, ("sweep",), seed=True)
    add("baseline show dangling", ["baseline", "show", "bl.json", "--results", "R"], link("gone", "bl.json"),
        ("bl.json",), seed=True)
    add("gate --baseline 300", ["gate", "--baseline", long, "--candidate", "seed", "--results", "R"], None,
        ("long", "255", "baseline"), seed=True)
    add("baseline save name 300", ["baseline", "save", "seed", "--name", long, "--results", "R"], None,
        ("name",), seed=True)
    add("baseline save name slash", ["baseline", "save", "seed", "--name", "../x", "--results", "R"], None,
        ("name",), seed=True)
    add("baselines is a file", ["baseline", "save", "seed", "--name", "n2", "--results", "R"],
        lambda d: (shutil.rmtree(d / "R" / "baselines"), (d / "R" / "baselines").write_text("x")),
        ("baselines",), seed=True)
    # tune paths (refused before any run; the decoy model stops a real run)
    def tmat(d, **tune):
        good = {"fixed": {"dynamic_bsz": "on"}, "n_trials": 2,
                "space": {"ppo_max_token_len_per_gpu": {"low": 1, "high": 4, "unit": "seq", "log": True}}}
        write_matrix(d / "t.yaml", doc=dict(with_base(model="./decoy-missing-model"), tune={**good, **tune}))
    for what, argv, setup, must in (
            ("--study 300", ["--study", long], None, ("study",)),
            ("--study empty", ["--study", ""], None, ("study",)),
            ("--study slash", ["--study", "a/../../b"], None, ("study",)),
            ("--storage dangling", ["--storage", "sqlite:///os.lnk"], link("gone.db", "os.lnk"), ("os.lnk",)),
            ("--storage memory", ["--storage", "sqlite:///:memory:"], None, ("memory",)),
            ("--storage journal dev", ["--storage", "journal:/dev/null"], None, ("/dev/null",)),
            ("--storage journal folder", ["--storage", "journal:jd"], lambda d: (d / "jd").mkdir(), ("jd",)),
            ("--storage garbage db", ["--storage", "sqlite:///g.db"], mkfile("g.db", "not sqlite" * 50), ("g.db",)),
            ("--storage empty", ["--storage", ""], None, ("storage",)),
            ("--storage 300", ["--storage", f"sqlite:///{long}.db"], None, ("long", "255", "storage")),
            ("--storage scheme", ["--storage", "redis://127.0.0.1"], None, ("redis", "storage")),
            ("optuna.db truncated", [], lambda d: _trunc_sqlite(d / "R" / "optuna.db"), ("optuna.db",)),
            ("optuna.db garbage", [], mkfile("R/optuna.db", "\x00garbage" * 300), ("optuna.db",)),
    ):
        def s(d, _setup=setup):
            tmat(d)
            if _setup:
                _setup(d)
        cs.append(Case("paths", f"tune {what}", ["tune", "t.yaml", "--results", "R", "--n-trials", "1"] + argv,
                       s, must=must))
    cs.append(Case("paths", "tune.study 300 in matrix", ["tune", "t.yaml", "--results", "R", "--n-trials", "1"],
                   lambda d: tmat(d, study=long), must=("study",)))
    cs.append(Case("paths", "tune.study 300 dry-run", ["run", "t.yaml", "--dry-run"],
                   lambda d: tmat(d, study=long), must=("study",)))
    return cs


def _trunc_sqlite(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    con.execute("create table t (a text)")
    con.executemany("insert into t values (?)", [("x" * 500,)] * 200)
    con.commit()
    con.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


# ---- read-back of hand-edited results files (needs the seed sweep)


def _latest(d: Path) -> Path:
    return (d / "R" / "seed" / "latest").resolve()


def _records(d: Path) -> list[Path]:
    return sorted(_latest(d).glob("*/r*/record.json"))


def _edit_json(path: Path, fn) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc, allow_nan=True))


def _set(doc, keys, value):
    cur = doc
    for k in keys[:-1]:
        cur = cur[k]
    if value is DEL:
        cur.pop(keys[-1], None)
    else:
        cur[keys[-1]] = value


BAD_NUMS = {"NaN": float("nan"), "inf": float("inf"), "negative": -1.0, "string": "fast", "null": None,
            "missing": DEL, "list": [1.0], "bool": True}


def readback_cases() -> list[Case]:
    cs: list[Case] = []
    readers = {"report": ["report", "seed"], "gate": ["gate", "--baseline", "seed", "--candidate", "seed"],
               "compare": ["compare", "seed", "seed"], "baseline save": ["baseline", "save", "seed", "--name", "nb"],
               "sync": ["sync", "seed"]}

    def rec(keys, value, reader, must=("record.json",), expect="refuse", idx=0):
        def setup(d, _k=keys, _v=value, _i=idx):
            _edit_json(_records(d)[_i], lambda doc: _set(doc, _k, _v))
        return setup

    # record.json summary numbers x readers
    for key in ("step_time_median_s", "step_time_mean_s", "rollout_share_median", "throughput_median",
                "free_ratio_median"):
        for what in ("NaN", "inf", "negative", "string"):
            for rname in ("report", "gate", "compare"):
                cs.append(Case("readback-record", f"{rname}: summary.{key} {what}",
                               readers[rname] + ["--results", "R"], rec(["summary", key], BAD_NUMS[what], rname),
                               must=("record.json",), seed=True))
    for what in ("NaN", "negative", "string", "null"):
        for rname in ("baseline save", "sync"):
            cs.append(Case("readback-record", f"{rname}: step_time_median_s {what}",
                           readers[rname] + ["--results", "R"],
                           rec(["summary", "step_time_median_s"], BAD_NUMS[what], rname), must=("record.json",),
                           seed=True))
    for key, value, what in ((["summary", "step_time_samples_s"], [0.1, float("nan")], "sample NaN"),
                             (["summary", "step_time_samples_s"], [-0.5], "sample negative"),
                             (["summary", "step_time_samples_s"], "x", "samples string"),
                             (["repeat"], -1, "repeat -1"), (["repeat"], True, "repeat bool"),
                             (["status"], "okay", "status okay"), (["cell_id"], "../../x", "cell_id escape"),
                             (["schema_version"], 99, "schema 99"), (["steps"], [1, 2], "steps list"),
                             (["summary"], "x", "summary string"), (["free_ratio"], {"x": 0.5}, "free_ratio key"),
                             (["free_ratio"], {"3": 1.5}, "free_ratio > 1"), (["cell_id"], DEL, "cell_id missing")):
        for rname in ("report", "gate"):
            cs.append(Case("readback-record", f"{rname}: {what}", readers[rname] + ["--results", "R"],
                           rec(key, value, rname), must=("record.json",), seed=True))
    for what, content in (("empty", ""), ("truncated", '{"cell_id": "ab'), ("list", "[1,2]"),
                          ("binary", "\x00\x01\x02"), ("NaN literal only", "NaN")):
        def setup(d, _c=content):
            _records(d)[0].write_text(_c)
        for rname in ("report", "compare", "sync"):
            cs.append(Case("readback-record", f"{rname}: record {what}", readers[rname] + ["--results", "R"], setup,
                           must=("record.json",), seed=True))
    # sweep.json
    def sw(keys, value):
        def setup(d, _k=keys, _v=value):
            _edit_json(_latest(d) / "sweep.json", lambda doc: _set(doc, _k, _v))
        return setup
    for keys, what in ((["plan", "repeats"], "plan.repeats"),):
        for v in ("NaN", "negative", "string", "null", "missing"):
            for rname in ("report", "gate", "compare", "sync", "baseline save"):
                cs.append(Case("readback-sweep", f"{rname}: {what} {v}", readers[rname] + ["--results", "R"],
                               sw(keys, BAD_NUMS[v]), must=("sweep.json",), seed=True))
    for what, keys, value in (("plan.runs string", ["plan", "runs"], "x"), ("plan missing", ["plan"], DEL),
                              ("plan.runs escape", ["plan", "runs"], [{"cell_id": "../../etc", "repeat": 0}])):
        for rname in ("report", "gate"):
            cs.append(Case("readback-sweep", f"{rname}: {what}", readers[rname] + ["--results", "R"],
                           sw(keys, value), must=("sweep.json",), seed=True))
    for what, content in (("empty", ""), ("not json", "{"), ("list", "[]")):
        def setup(d, _c=content):
            (_latest(d) / "sweep.json").write_text(_c)
        for rname in ("report", "gate", "sync"):
            cs.append(Case("readback-sweep", f"{rname}: sweep.json {what}", readers[rname] + ["--results", "R"],
                           setup, must=("sweep.json",), seed=True))
    # baselines: every number of the saved baseline
    bfile = lambda d: d / "R" / "baselines" / "b.json"  # noqa: E731

    def numeric_paths(obj, prefix=()):
        if isinstance(obj, bool):
            return
        if isinstance(obj, (int, float)):
            yield prefix
        elif isinstance(obj, dict):
            for k, v in obj.items():
                yield from numeric_paths(v, prefix + (k,))
        elif isinstance(obj, list) and obj:
            yield from numeric_paths(obj[0], prefix + (0,))
    seed_b = SEED_DIR / "R" / "baselines" / "b.json" if SEED_DIR else None
    paths = []
    if seed_b and seed_b.is_file():
        paths = list(numeric_paths(json.loads(seed_b.read_text())))
    signed = ("log", "seed", "alpha", "other")  # docs/guarantees.md: a history's log values, a phase's other time
    step = max(1, len(paths) // 30)
    for j, p in enumerate(paths[::step][:30]):
        for what in ("NaN", "negative", "string") if j % 3 == 0 else ("NaN", "negative"):
            if what == "negative" and (p[0] in ("base", "design", "expect")  # the matrix as it ran: signed (docs)
                                       or any(s in str(k) for k in p for s in signed)):
                continue
            def setup(d, _p=list(p), _v=BAD_NUMS[what]):
                _edit_json(bfile(d), lambda doc: _set(doc, _p, _v))
            cs.append(Case("readback-baseline", f"gate: {'.'.join(map(str, p))} {what}",
                           ["gate", "--baseline", "b", "--candidate", "seed", "--results", "R"], setup,
                           must=("b.json",), seed=True))
    for what, content in (("empty", ""), ("not json", "{"), ("list", "[]"), ("null", "null")):
        def setup(d, _c=content):
            bfile(d).write_text(_c)
        for argv in (["gate", "--baseline", "b", "--candidate", "seed"], ["baseline", "show", "b"],
                     ["history", "b"]):
            cs.append(Case("readback-baseline", f"{argv[0]}: baseline {what}", argv + ["--results", "R"], setup,
                           must=("b.json",), seed=True))
    cs.append(Case("readback-baseline", "baseline list with a bad file", ["baseline", "list", "--results", "R"],
                   lambda d: (d / "R" / "baselines" / "bad.json").write_text("{"), must=("bad.json",), seed=True))
    cs.append(Case("readback-baseline", "history of the seed baseline (success)", ["history", "b", "--results", "R"],
                   None, expect="any", ok_rcs=(0,), seed=True))
    # tune results need a real tune run: heavy, listed and skipped
    for what in ("NaN", "negative", "string"):
        cs.append(Case("readback-tune", f"tune: confirmation.json change {what}", ["tune", "t.yaml"], None,
                       heavy=True))
    return cs


def store_cases() -> list[Case]:
    cs: list[Case] = []

    def db(kind):
        def setup(d, _k=kind):
            p = d / "R" / "mlflow.db"
            if _k == "garbage":
                p.write_bytes(b"\x00\x13garbage" * 500)
            elif _k == "truncated":
                data = p.read_bytes()
                p.write_bytes(data[: len(data) // 4])
            elif _k == "empty":
                p.write_bytes(b"")
            elif _k == "text":
                p.write_text("SQLite format 3\x00" + "junk" * 1000)
        return setup
    for kind in ("garbage", "truncated", "empty", "text"):
        for argv in (["report", "seed"], ["sync", "seed"], ["baseline", "save", "seed", "--name", "nb2"],
                     ["gate", "--baseline", "b", "--candidate", "seed"]):
            cs.append(Case("stores", f"{argv[0]}: mlflow.db {kind}", argv + ["--results", "R"], db(kind),
                           must=("mlflow.db",), expect="any", ok_rcs=(0, 3), seed=True))
        # an empty file is an empty SQLite database, a store not created yet (as a missing one): the decoy is named
        cs.append(Case("stores", f"run: mlflow.db {kind}", ["run", "m.yaml", "--results", "R"],
                       lambda d, _f=db(kind): (write_matrix(d / "m.yaml", doc=with_base(model="./decoy")), _f(d)),
                       must=("decoy",) if kind == "empty" else ("mlflow.db",), seed=True))
    return cs


def option_cases() -> list[Case]:
    cs: list[Case] = []
    nums = {"NaN": "nan", "-1": "-1", "2^64": str(2**64), "text": "abc", "empty": ""}
    flags = {
        "run": (["run", "m.yaml", "--dry-run"], ["--order-seed", "--smoke-steps", "--threshold", "--alpha",
                                                  "--precision", "--parallel"]),
        "tune": (["tune", "m.yaml", "--results", "R"], ["--n-trials", "--timeout"]),
        "gate": (["gate", "--baseline", "b", "--candidate", "seed", "--results", "R"],
                 ["--threshold", "--alpha", "--bootstrap", "--seed", "--max-mde"]),
        "compare": (["compare", "seed", "seed", "--results", "R"], ["--threshold", "--alpha", "--bootstrap"]),
        "report": (["report", "seed", "--results", "R"], ["--alpha", "--bootstrap", "--seed"]),
        "history": (["history", "b", "--results", "R"], ["--alpha", "--fail-on-new"]),
        "baseline": (["baseline", "save", "seed", "--name", "nb3", "--results", "R"], ["--alpha"]),
    }
    partners = {"--smoke-steps": ["--smoke"], "--threshold": ["--sequential"], "--alpha": ["--sequential"],
                "--parallel": ["--ray-address", "http://127.0.0.1:9"], "--order-seed": []}
    for cmd, (base, fl) in flags.items():
        for f in fl:
            for what, v in nums.items():
                if what in ("0",) and f in ("--seed", "--order-seed"):
                    continue
                if what in ("-1",) and f in ("--fail-on-new",):
                    pass
                extra = partners.get(f, []) if cmd == "run" else []
                needs_seed = cmd not in ("run",)
                setup = m_setup(doc=with_base(model="./decoy"))
                cs.append(Case("options", f"{cmd} {f} {what}", base + extra + [f, v], setup, must=(f,),
                               seed=needs_seed))
    # choices, unknown options, missing values, empties, partners
    for argv, must in (
            (["run", "m.yaml", "--order", "random", "--dry-run"], ("--order",)),
            (["run", "m.yaml", "--bogus", "--dry-run"], ("--bogus",)),
            (["run", "m.yaml", "--dry-run", "--results"], ("--results",)),
            (["run", "m.yaml", "--budget", "0s", "--dry-run"], ("--budget",)),
            (["run", "m.yaml", "--budget", "31d", "--dry-run"], ("--budget",)),
            (["run", "m.yaml", "--budget", "soon", "--dry-run"], ("--budget",)),
            (["run", "m.yaml", "--budget", "", "--dry-run"], ("--budget",)),
            (["run", "m.yaml", "--ray-address", "not a url", "--dry-run"], ("--ray-address",)),
            (["run", "m.yaml", "--ray-address", "", "--dry-run"], ("--ray-address",)),
            (["run", "m.yaml", "--ray-address", "ray://127.0.0.1", "--dry-run"], ("--ray-address",)),
            (["run", "m.yaml", "--ray-address", "http://127.0.0.1:99999", "--dry-run"], ("--ray-address",)),
            (["run", "m.yaml", "--json"], ("--json",)),
            (["run", "m.yaml", "--verbose"], ("--verbose",)),
            (["run", "m.yaml", "--smoke-steps", "2", "--dry-run"], ("--smoke-steps",)),
            (["run", "m.yaml", "--threshold", "0.1", "--dry-run"], ("--threshold",)),
            (["run", "m.yaml", "--parallel", "2", "--dry-run"], ("--parallel",)),
            (["run", "m.yaml", "--order", "sequential", "--order-seed", "3", "--dry-run"], ("--order-seed",)),
            (["run", "m.yaml", "--cells", "", "--dry-run"], ("--cells",)),
            (["run", "m.yaml", "--cells", "nomatch*", "--dry-run"], ("nomatch",)),
            (["run", "m.yaml", "--cells", "\x1b[2J", "--dry-run"], ("\\x1b",)),
            (["run", "m.yaml", "--precision", "0.02", "--budget", "1h", "--dry-run"], ("--precision", "--budget")),
            (["bogus-command"], ("bogus",)),
            (["--results", "R", "m.yaml", "--dry-run"], ()),
            (["gate"], ("--baseline", "--candidate", "--interleave", "--stacks")),
            (["gate", "--stacks", "a", "a", "--matrix", "m.yaml"], ("--stacks", "a")),
            (["gate", "--stacks", "a", "zz", "--matrix", "sm.yaml"], ("zz",)),
            (["gate", "--stacks", "a", "b"], ("--matrix",)),
            (["gate", "--stacks", "a", "b", "--matrix", "sm.yaml", "--interleave", "HEAD"], ("--stacks",)),
            (["gate", "--stacks", "a", "b", "--matrix", "sm.yaml", "--side-by-side"], ("--stacks", "--side-by-side")),
            (["gate", "--stacks", "a"], ("--stacks",)),
            (["gate", "--stacks", "", "b", "--matrix", "sm.yaml"], ("--stacks",)),
            (["gate", "--stacks", "a\x1b[2J", "b", "--matrix", "sm.yaml"], ("\\x1b",)),
            (["gate", "--stacks", "a", "b", "--matrix", "m.yaml"], ("stacks",)),
            (["gate", "--interleave", "", "--matrix", "m.yaml"], ("--interleave",)),
            (["gate", "--interleave", "no-such-rev-zz", "--matrix", "m.yaml"], ("no-such-rev-zz",)),
            (["gate", "--interleave", "HEAD"], ("--matrix",)),
            (["gate", "--blocks", "3", "--baseline", "b", "--candidate", "seed"], ("--blocks",)),
            (["gate", "--set", "base.steps=3", "--baseline", "b", "--candidate", "seed"], ("--set",)),
            (["gate", "--metric", "step_tme", "--baseline", "b", "--candidate", "seed", "--results", "R"],
             ("step_tme",)),
            (["gate", "--metric", "", "--baseline", "b", "--candidate", "seed", "--results", "R"], ("--metric",)),
            (["gate", "--metric", ",", "--baseline", "b", "--candidate", "seed", "--results", "R"], ("--metric",)),
            (["gate", "--test", "nope", "--baseline", "b", "--candidate", "seed", "--results", "R"], ("nope",)),
            (["gate", "--pairing", "on", "--baseline", "b", "--candidate", "seed"], ("--pairing",)),
            (["gate", "--normalize", "yes", "--baseline", "b", "--candidate", "seed"], ("--normalize",)),
            (["gate", "--baseline", "nob", "--candidate", "seed", "--results", "R"], ("nob",)),
            (["gate", "--baseline", "b", "--candidate", "nosweep", "--results", "R"], ("nosweep",)),
            (["gate", "--baseline", "b\x07", "--candidate", "seed", "--results", "R"], ("\\x07",)),
            (["compare", "seed"], ("SWEEP_B", "sweep")),
            (["compare", "seed", "nosuch", "--results", "R"], ("nosuch",)),
            (["compare", "seed", "seed", "--metric", "cpu_tim", "--results", "R"], ("cpu_tim",)),
            (["report", "--results", "R"], ("sweep",)),
            (["report", "seed", "--no-interactions", "--normalize", "maybe", "--results", "R"], ("--normalize",)),
            (["report", "sede", "--results", "R"], ("sede",)),
            (["baseline", "save", "--results", "R"], ("save", "sweep", "target")),
            (["baseline", "save", "seed", "--results", "R"], ("--name",)),
            (["baseline", "save", "seed", "--name", "", "--results", "R"], ("--name",)),
            (["baseline", "save", "seed", "--name", "b", "--results", "R"], ("b",)),
            (["baseline", "list", "extra", "--results", "R"], ("list",)),
            (["baseline", "show", "--results", "R"], ("show",)),
            (["baseline", "show", "nob", "--results", "R"], ("nob",)),
            (["baseline", "drop", "b", "--results", "R"], ("drop",)),
            (["baseline", "save", "seed", "--name", "a\x1b[2J", "--results", "R"], ("\\x1b", "--name")),
            (["history", "--results", "R"], ("NAME", "name")),
            (["history", "nob", "--results", "R"], ("nob",)),
            (["history", "b", "--metric", "speed", "--results", "R"], ("--metric",)),
            (["history", "b", "--cell", "nocell", "--results", "R"], ("nocell",)),
            (["history", "b", "--cell", "", "--results", "R"], ("--cell",)),
            (["history", "b", "--machine", "", "--results", "R"], ("--machine",)),
            (["history", "b", "--stack", "", "--results", "R"], ("--stack",)),
            (["history", "b", "--cell", "c\x1b[2J", "--results", "R"], ("\\x1b",)),
            (["history", "b", "--machine", "nomachine", "--results", "R"], ("nomachine",)),
            (["sync", "nosuch", "--results", "R"], ("nosuch",)),
            (["sync", "a", "b", "--results", "R"], ("b",)),
            (["tune", "m.yaml", "--results", "R"], ("tune",)),
            (["tune", "m.yaml", "--ray-address", "x y"], ("--ray-address",)),
            (["run"], ("matrix",)),
    ):
        def setup(d):
            write_matrix(d / "m.yaml", doc=with_base(model="./decoy"))
            sm = json.loads(json.dumps(BASE))
            sm["stacks"] = {"a": {}, "b": {}}
            sm["base"]["model"] = "./decoy"
            write_matrix(d / "sm.yaml", doc=sm)
        expect = "any" if argv[:2] == ["--results", "R"] else "refuse"
        cs.append(Case("options", " ".join(a.encode("unicode_escape").decode() for a in argv)[:70], argv, setup,
                       must=must, seed=True, expect=expect))
    return cs


#: cases run per class by default (every k-th of the class's cases, so each kind of input stays represented): about
#: 330 CLI starts, < 30 min at 5 s a start on a loaded 2-core machine; ``--all`` runs every case
PER_CLASS = {"matrix": 85, "override": 10, "paths": 60, "readback-record": 40, "readback-sweep": 20,
             "readback-baseline": 35, "stores": 20, "options": 70}


def all_cases(everything: bool = False) -> list[Case]:
    """Every case (``everything``), else a deterministic spread of :data:`PER_CLASS` cases per class."""
    cases = matrix_cases() + path_cases() + readback_cases() + store_cases() + option_cases()
    if everything:
        return cases
    out = []
    for cls in dict.fromkeys(c.cls for c in cases):
        mine = [c for c in cases if c.cls == cls]
        keep = PER_CLASS.get(cls, len(mine))
        out += [mine[int(i * len(mine) / keep)] for i in range(min(keep, len(mine)))] if keep < len(mine) else mine
    return out


# ------------------------------------------------------------------------------------------------- runner


def snapshot(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            out[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns)
    return out


def leftover(case_id: str) -> list[int]:
    needle = f"{MARK}={case_id}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            continue
    return found


@dataclass
class Result:
    case: Case
    rc: int
    wall: float
    cpu: float
    lines: list[str]
    changed: list[str]
    procs: list[int]
    verdict: str
    why: str


def judge(c: Case, rc: int, wall: float, cpu: float, out: str, err: str, changed: list[str],
          procs: list[int]) -> tuple[str, str]:
    """The verdict (``clean`` / ``unclean``) and why. Time is judged on the CPU seconds of the process tree (the
    machine this runs on is shared: a wall-clock second there is a tenth of a CPU second at a load of 20 on two
    cores); a wall time of 60 s or more (the cap) is never clean."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    text = out + err
    raw_ctrl = any(ch in text for ch in ("\x1b", "\x07"))
    libs = [w for w in LIB_WORDS if w in text]
    if procs:
        return "unclean", f"process left: {procs}"
    if "Traceback" in text:
        return "unclean", "traceback"
    if raw_ctrl:
        return "unclean", "raw control character printed"
    refusal_ok = (rc == 2 and len(lines) == 1 and lines[0].startswith("error:") and not changed and not libs
                  and (not c.must or any(m.lower() in lines[0].lower() for m in c.must)))
    if c.expect == "refuse" or (c.expect == "any" and rc == 2):
        if refusal_ok and cpu < LIMIT_S and wall < 60:
            return "clean", ""
        if rc != 2:
            return "unclean", f"exit {rc}, expected 2"
        if len(lines) != 1:
            return "unclean", f"{len(lines)} stderr lines"
        if changed:
            return "unclean", f"wrote {changed[:3]}"
        if libs:
            return "unclean", f"library words {libs}"
        if not lines[0].startswith("error:"):
            return "unclean", "line does not start with error:"
        if cpu >= LIMIT_S or wall >= 60:
            return "unclean", f"slow refusal {cpu:.1f} s CPU, {wall:.1f} s wall"
        return "unclean", f"line names none of {c.must}"
    if rc in c.ok_rcs and not libs:
        return "clean", ""
    return "unclean", f"exit {rc}" + (f", library words {libs}" if libs else "")


def run_case(i: int, c: Case, seed_dir: Path | None, tmp_root: Path) -> Result:
    case_id = f"{os.getpid()}-{i}"
    d = Path(tempfile.mkdtemp(prefix=f"c{i}-", dir=tmp_root))
    try:
        if c.seed:
            shutil.copytree(seed_dir / "R", d / "R", symlinks=True)
        if c.setup:
            c.setup(d)
        before = snapshot(d)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env.update({"PYTHONPATH": str(REPO), MARK: case_id, "NO_COLOR": "1"}, **c.env)
        env.pop("H48_TRIAL_UNSET", None)
        t0 = time.monotonic()
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            p = subprocess.run(["nice", "-n", "10", sys.executable, str(REPO / "run_bench.py"), *c.argv], cwd=d,
                               env=env, capture_output=True, timeout=60, start_new_session=True)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = 124, e.stdout or b"", (e.stderr or b"") + b"\n(timed out after 60 s)"
        wall = time.monotonic() - t0
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        time.sleep(0.2)
        procs = leftover(case_id)
        for pid in procs:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        after = snapshot(d)
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        out_s = out.decode("utf-8", "replace")
        err_s = err.decode("utf-8", "replace")
        verdict, why = judge(c, rc, wall, cpu, out_s, err_s, changed, procs)
        lines = [ln for ln in err_s.splitlines() if ln.strip()]
        return Result(c, rc, wall, cpu, lines, changed, procs, verdict, why)
    finally:
        for dirpath, dirnames, _ in os.walk(d):
            for n in dirnames:
                try:
                    os.chmod(os.path.join(dirpath, n), 0o755)
                except OSError:
                    pass
        shutil.rmtree(d, ignore_errors=True)


def make_seed(seed_dir: Path) -> None:
    """One tiny real embedded sweep (2 cells x 2 repeats) and a baseline ``b`` of it, under the heavy lock."""
    seed_dir.mkdir(parents=True, exist_ok=True)
    doc = json.loads(json.dumps(BASE))
    doc["name"] = "seed"
    doc["base"].update(steps=5, warmup_steps=1, profile_steps=[5])
    doc["repeats"] = 2
    write_matrix(seed_dir / "seed.yaml", doc=doc)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("MLFLOW_TRACKING_URI", None)
    py = [sys.executable, str(REPO / "run_bench.py")]
    subprocess.run(["flock", "/tmp/heavy.lock", "nice", "-n", "10", *py, "run", "seed.yaml", "--results", "R"],
                   cwd=seed_dir, env=env, check=True)
    subprocess.run(["nice", "-n", "10", *py, "baseline", "save", "seed", "--name", "b", "--results", "R"],
                   cwd=seed_dir, env=env, check=True)


SEED_DIR: Path | None = None


def main() -> int:
    global SEED_DIR
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed-dir", type=Path, required=True)
    ap.add_argument("--make-seed", action="store_true")
    ap.add_argument("--only", help="run only the cases whose class or name contains this")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--json", type=Path, help="write every result here")
    ap.add_argument("--all", action="store_true", help="every case (about 700), not the default spread of ~330")
    a = ap.parse_args()
    if a.make_seed:
        make_seed(a.seed_dir)
        return 0
    SEED_DIR = a.seed_dir.resolve()
    if not (SEED_DIR / "R" / "baselines" / "b.json").is_file():
        print(f"no seed under {SEED_DIR}: run with --make-seed first", file=sys.stderr)
        return 2
    cases = all_cases(a.all)
    if a.only:
        cases = [c for c in cases if a.only in c.cls or a.only in c.name]
    heavy = [c for c in cases if c.heavy]
    cases = [c for c in cases if not c.heavy]
    if a.list:
        for c in cases:
            print(f"{c.cls:18} {c.name}")
        print(f"{len(cases)} cases, {len(heavy)} heavy (skipped)")
        return 0
    tmp_root = Path(tempfile.mkdtemp(prefix="hostile-trial-"))
    results = []
    t_all = time.monotonic()
    try:
        for i, c in enumerate(cases):
            r = run_case(i, c, SEED_DIR, tmp_root)
            results.append(r)
            if i % 25 == 24:
                print(f"... {i + 1}/{len(cases)} cases, {time.monotonic() - t_all:.0f} s", flush=True)
            if r.verdict != "clean":
                first = (r.lines[-1] if r.lines else "")[:160].encode("unicode_escape").decode()
                print(f"NOT CLEAN [{c.cls}] {c.name}: {r.why} (exit {r.rc}, {r.wall:.1f} s wall, {r.cpu:.1f} s CPU) "
                      f"| {first}", flush=True)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
    by_cls: dict[str, list[Result]] = {}
    for r in results:
        by_cls.setdefault(r.case.cls, []).append(r)
    print(f"\n{'class':20} {'cases':>6} {'clean':>6}")
    for k, rs in by_cls.items():
        print(f"{k:20} {len(rs):6d} {sum(r.verdict == 'clean' for r in rs):6d}")
    n, ok = len(results), sum(r.verdict == "clean" for r in results)
    refusals = [r for r in results if r.rc == 2]
    slow = max(refusals, key=lambda r: r.wall) if refusals else None
    print(f"\n{n} cases, {ok} clean ({100 * ok / max(n, 1):.1f} %); {len(heavy)} heavy cases skipped; "
          f"total {time.monotonic() - t_all:.0f} s")
    if slow:
        hog = max(refusals, key=lambda r: r.cpu)
        print(f"slowest refusal: {slow.wall:.1f} s wall ({slow.case.cls}: {slow.case.name}); most CPU in a refusal: "
              f"{hog.cpu:.1f} s ({hog.case.cls}: {hog.case.name}); load average {os.getloadavg()[0]:.1f}")
    if a.json:
        a.json.write_text(json.dumps([{"cls": r.case.cls, "name": r.case.name, "rc": r.rc, "wall_s": round(r.wall, 2),
                                       "cpu_s": round(r.cpu, 2),
                                       "verdict": r.verdict, "why": r.why, "stderr": r.lines[-3:]}
                                      for r in results], indent=1))
    return 0 if ok == n else 1


if __name__ == "__main__":
    sys.exit(main())
