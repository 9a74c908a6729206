"""Browser check: what a user sees in the MLflow UI and in optuna-dashboard, in headless Chromium.

Starts, on 127.0.0.1 and free ports, an ``mlflow server`` (own temporary sqlite store and artifact root)
and ``optuna-dashboard`` (own temporary sqlite storage), each in its own process group, ended by process
group at exit (also on an error, Ctrl-C or SIGTERM). Runs a tiny real sweep against the server
(``run_bench.py matrix/smoke.yaml base.steps=5 base.profile_steps=[5]``: two cells, three timed steps
each) and a tiny real tune (``run_bench.py tune matrix/tune_dynamic_bsz.yaml --n-trials 2``, on a copy of the matrix
with ``tune.confirm_blocks: 0``: the study page needs the trials, not the confirmation's runs), then opens
the pages in headless Chromium (Debian's ``chromium`` and ``chromium-driver``; Selenium never downloads a
browser or driver: the driver path is given and ``SE_OFFLINE=true``) and checks from the rendered DOM:

1. the experiment page opens on the runs list (model training), not MLflow's GenAI view;
2. the sweep's parent run and, expanded under it, every cell run with a readable name
   (``<matrix> <YYYY-MM-DD HH:MM> <git short sha>``; ``<compact cell label> r<repeat>`` with the full label
   as tag ``bench.label``), names that differ in the part the list shows;
3. the parent run page (name, headline ``speedup.*`` metrics);
4. a child's ``step_time_s`` chart: one point per timed step of the run's record, values = the record's
   ``timing_s/step``;
5. the parent's per-cell table artifact ``cells.json`` (``log_table``): one row per cell;
6. the Optuna study page: the objective's name (contains ``step_time``), not "Objective 0".

Prints one line per check (``PASS``/``FAIL``/``NOTE`` with what was seen), writes the screenshots and
``checks.txt`` to ``--out`` (default ``results/browser_check/``, git-ignored) and exits 0 when every
check passed, 1 when one failed (or a server, the sweep or the tune failed), 2 on bad input (no
Chromium / chromedriver), 130 when interrupted.

    python tools/browser_check.py [--out DIR] [--wait S] [--keep]
    python tools/browser_check.py --reuse DIR     # a folder kept by --keep: only the browser checks again

About 2-3 minutes on 2 cores (the sweep and the tune are real embedded GRPO runs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.core.files import read_json  # noqa: E402
from bench.records.results import load_records  # noqa: E402

#: Debian's packages (``apt-get install chromium chromium-driver``)
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SWEEP_MATRIX = "matrix/smoke.yaml"
#: five steps: warm-up 1, timed 2-4, profiled 5, so the child's step-time chart is a series, not a point
SWEEP_OVERRIDES = ["base.steps=5", "base.profile_steps=[5]"]
TUNE_MATRIX = "matrix/tune_dynamic_bsz.yaml"
TUNE_TRIALS = 2
#: the tune block's confirmation is left out (its 3 blocks of 2 runs show nothing on the study page)
TUNE_CONFIRM_BLOCKS = 0
#: MLflow 3.17's UI picks the GenAI or the model-training view from this URL parameter (else from the
#: browser's local storage, default GenAI); the experiment tag ``mlflow.experimentKind`` is what older
#: 3.x UIs read
ML_VIEW = "workflowType=machine_learning"
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
RUN_NAME_COL = "[col-id='attributes.`Run Name`']"
#: screenshot files in ``--out`` and what each shows
SHOTS = {
    "experiment_plain_url": "0_experiment_plain_url.png",
    "experiment": "1_experiment_runs.png",
    "parent": "2_parent_run.png",
    "chart": "3_child_step_time.png",
    "table": "4_parent_cells_table.png",
    "study": "5_optuna_study.png",
}


class Failed(Exception):
    """A step the checks depend on failed (a server did not start, the sweep or the tune failed)."""


# -- processes ------------------------------------------------------------------------------------------

def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path


@dataclass
class Procs:
    """Processes this script started, each the leader of its own process group; :meth:`stop_all` ends
    every group (SIGTERM, then SIGKILL after ``grace`` seconds)."""

    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, argv: list[str], log: Path, *, cwd: Path, env: dict[str, str]) -> Proc:
        fh = open(log, "wb")
        try:
            p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            fh.close()
        proc = Proc(name, p, log)
        self.procs.append(proc)
        return proc

    def add_group(self, name: str, popen: subprocess.Popen) -> None:
        """Track a process started elsewhere as its own group leader (chromedriver)."""
        self.procs.append(Proc(name, popen, Path(os.devnull)))

    @staticmethod
    def stop(proc: Proc, grace: float = 10.0) -> None:
        pgid = proc.popen.pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        try:  # whatever is left of the group (the leader may have gone first)
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def stop_all(self) -> None:
        while self.procs:
            self.stop(self.procs.pop())


def tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log file (empty when unreadable)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_http(url: str, proc: Proc, timeout: float) -> None:
    """Poll ``url`` until it answers 200.

    Raises:
        Failed: the process exited, or no answer within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise Failed(f"{proc.name} exited with {proc.popen.returncode}:\n{tail(proc.log)}")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    raise Failed(f"{proc.name} did not answer {url} within {timeout:.0f} s:\n{tail(proc.log)}")


def finish(proc: Proc, timeout: float) -> None:
    """Wait for a harness command to end with exit 0.

    Raises:
        Failed: a non-zero exit or still running after ``timeout`` seconds (then its group is ended).
    """
    try:
        rc = proc.popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        Procs.stop(proc)
        raise Failed(f"{proc.name} did not finish within {timeout:.0f} s:\n{tail(proc.log)}") from None
    if rc != 0:
        raise Failed(f"{proc.name} exited with {rc}:\n{tail(proc.log)}")


# -- checks ---------------------------------------------------------------------------------------------

@dataclass
class Checks:
    """The check lines: ``PASS name: seen``, ``FAIL name: seen``, ``NOTE name: seen`` (never fails)."""

    lines: list[str] = field(default_factory=list)
    failed: int = 0

    def record(self, ok: bool | None, name: str, seen: str) -> bool:
        word = "NOTE" if ok is None else ("PASS" if ok else "FAIL")
        self.failed += ok is False
        line = f"{word} {name}: {seen}"
        self.lines.append(line)
        print(line, flush=True)
        return bool(ok)


def short(text: str, n: int = 240) -> str:
    """One line of at most ``n`` characters (page text for a check line)."""
    text = " | ".join(s.strip() for s in text.splitlines() if s.strip())
    return text if len(text) <= n else text[:n - 3] + "..."


def wait_for(driver: Any, what: Callable[[Any], Any], timeout: float) -> Any:
    """Poll ``what(driver)`` until it returns something truthy (returned) or ``timeout`` seconds pass
    (returns the last value); exceptions from the page count as not yet."""
    from selenium.common.exceptions import WebDriverException

    deadline = time.monotonic() + timeout
    value = None
    while True:
        try:
            value = what(driver)
        except WebDriverException:
            value = None
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(0.5)


def body_text(driver: Any) -> str:
    return driver.execute_script("return document.body ? document.body.innerText : ''") or ""


def screenshot(driver: Any, path: Path) -> None:
    """Save the window as PNG, after closing MLflow's assistant side panel (a third of the window) if open."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    try:
        for btn in driver.find_elements(
            By.CSS_SELECTOR, "button[data-component-id='mlflow.assistant.chat_panel.close']"
        ):
            if btn.is_displayed():
                btn.click()
                time.sleep(0.5)
    except WebDriverException:
        pass
    time.sleep(1)
    driver.save_screenshot(str(path))


#: per run row of the runs table: run id -> {name: the name's text, visible: the part the list shows, cut}.
#: The list clips a long name with an ellipsis (the name's element or a box up to the cell); the visible
#: part is the longest prefix that fits beside the ellipsis in the element's font (canvas measureText).
ROWS_JS = """
window.__browserCheckCanvas = window.__browserCheckCanvas || document.createElement("canvas");
const ctx = window.__browserCheckCanvas.getContext("2d");
const out = {};
for (const row of document.querySelectorAll("[role=row][row-id]")) {
  const cell = row.querySelector(arguments[0]);
  const name = cell && (cell.querySelector("a span") || cell.querySelector("a"));
  if (!name) continue;
  const text = name.innerText, left = name.getBoundingClientRect().left;
  let right = Infinity;
  for (let e = name; e && e !== cell.parentElement; e = e.parentElement)
    if (getComputedStyle(e).overflowX !== "visible")
        right = Math.min(right, e.getBoundingClientRect().left + e.clientWidth);
  const st = getComputedStyle(name);
  ctx.font = `${st.fontStyle} ${st.fontWeight} ${st.fontSize} ${st.fontFamily}`;
  let visible = text;
  if (ctx.measureText(text).width > right - left + 0.5) {
    let k = text.length;
    while (k > 0 && ctx.measureText(text.slice(0, k) + "\u2026").width > right - left) k--;
    visible = text.slice(0, k);
  }
  out[row.getAttribute("row-id")] = {name: text, visible: visible, cut: visible !== text};
}
return out;
"""

#: the traces of the plotly charts on the page: [{name, type, x, y}]
PLOT_JS = """
return Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(p => (p.data || []).map(t => (
  {name: t.name || null, type: t.type || null, x: Array.from(t.x || []), y: Array.from(t.y || [])})));
"""


def visible_part(row: dict) -> str:
    """The part of a run name the runs list shows (the whole name unless the column cuts it)."""
    return row.get("visible", row.get("name")) or ""


def check_experiment(ck: Checks, driver: Any, base: str, exp_id: str, parent: dict, children: list[dict],
                     out: Path, wait: float) -> None:
    """Experiment page: opens on the runs list; the sweep's and the cells' names (children expanded)."""
    driver.get(f"{base}/#/experiments/{exp_id}")
    # the SPA redirects /experiments/<id> to the view it picks (/runs, /overview/..., /traces)
    wait_for(driver, lambda d: re.search(rf"/experiments/{exp_id}/\w", d.current_url) and len(body_text(d)) > 200, wait)
    screenshot(driver, out / SHOTS["experiment_plain_url"])
    plain = driver.current_url.split("#", 1)[-1]
    genai = "workflowType=genai" in plain or "Evaluation runs" in body_text(driver)
    ck.record(None, "experiment link without ?" + ML_VIEW,
              f"#{plain[:90]} ({'GenAI view' if genai else 'model-training view'}; MLflow "
              f"{_mlflow_version()} picks the view from the URL or the browser, the experiment tag aside)")

    driver.get(f"{base}/#/experiments/{exp_id}?{ML_VIEW}")
    pid = parent["run_id"]
    rows = wait_for(driver, lambda d: (r := d.execute_script(ROWS_JS, RUN_NAME_COL)) and pid in r and r, wait) or {}
    url = driver.current_url.split("#", 1)[-1]
    text = body_text(driver)
    on_runs = f"/experiments/{exp_id}/runs" in url and "Evaluation runs" not in text and pid in rows
    ck.record(on_runs, "experiment opens on the runs list",
              f"#{url[:80]}; " + ("runs table with the sweep's row" if on_runs else f"page: {short(text, 160)}"))

    # the sweep's parent row: its name as the list shows it
    shown = rows.get(pid, {})
    pat = parent["name_pattern"]
    ok = shown.get("name") == parent["name"] and bool(re.fullmatch(pat, parent["name"]))
    cut = f"; the list shows {visible_part(shown)!r}..., the run page all" if shown.get("cut") else ""
    ck.record(ok, "sweep name in the runs list",
              f"{shown.get('name')!r} (MLflow name {parent['name']!r}; expected <matrix> <YYYY-MM-DD HH:MM> "
              f"<git short sha>{cut})")

    # expand the parent: its cell runs appear below it
    from selenium.webdriver.common.by import By

    for btn in driver.find_elements(By.CSS_SELECTOR, f"[role=row][row-id='{pid}'] {RUN_NAME_COL} button"):
        if btn.is_displayed():
            btn.click()
            break
    want = {c["run_id"] for c in children}
    rows = wait_for(driver, lambda d: (r := d.execute_script(ROWS_JS, RUN_NAME_COL)) and want <= set(r) and r,
                    wait) or rows
    screenshot(driver, out / SHOTS["experiment"])
    seen, problems = [], []
    for c in children:
        r = rows.get(c["run_id"])
        if r is None:
            problems.append(f"{c['name']!r} not in the list")
            continue
        seen.append(repr(r["name"]) + (f" (the list shows {visible_part(r)!r}...)" if r["cut"] else ""))
        if r["name"] != c["name"]:
            problems.append(f"{c['name']!r} shown as {r['name']!r}")
        if not re.fullmatch(rf".+ r{c['repeat']}", c["name"]):
            problems.append(f"{c['name']!r} is not '<cell label> r{c['repeat']}'")
        if c["label_tag"] != c["label"]:
            problems.append(f"tag bench.label of {c['name']!r} = {c['label_tag']!r}, not {c['label']!r}")
    visible = [visible_part(r) for c in children if (r := rows.get(c["run_id"]))]
    if len(set(visible)) < len(visible):
        problems.append(f"cells look alike in the list: {visible}")
    ck.record(not problems, "cell names in the runs list",
              "; ".join(problems) if problems else ", ".join(seen) + " (bench.label tags = the full labels)")


def check_parent(ck: Checks, driver: Any, base: str, exp_id: str, parent: dict, out: Path, wait: float) -> None:
    """The sweep's parent run page: its name and the headline speedups."""
    driver.get(f"{base}/#/experiments/{exp_id}/runs/{parent['run_id']}?{ML_VIEW}")
    text = (
        wait_for(driver, lambda d: (t := body_text(d)) and parent["name"] in t and "Parameters" in t and t, wait) or ""
    )
    screenshot(driver, out / SHOTS["parent"])
    speedups = sorted(set(re.findall(r"^speedup\.\S+", text, flags=re.M)))
    need = max(1, len(parent["cells"]) - 1)  # one per cell; the reference cell's (= 1) may be left out
    ok = parent["name"] in text and len(speedups) >= need
    ck.record(ok, "parent run page", f"name {parent['name']!r} {'shown' if parent['name'] in text else 'missing'}; "
              f"speedup metrics {speedups or 'none'} (cells: {len(parent['cells'])}, at least {need} wanted)")


def check_chart(ck: Checks, driver: Any, base: str, exp_id: str, child: dict, out: Path, wait: float) -> None:
    """A child's ``step_time_s`` metric page: the chart plots the run's timed steps with their step times."""
    key = "step_time_s"
    q = (f"?runs={json.dumps([child['run_id']])}&metric={json.dumps(key)}&experiments={json.dumps([exp_id])}"
         f"&plot_metric_keys={json.dumps([key])}&x_axis=step&{ML_VIEW}")
    driver.get(f"{base}/#/metric/{key}{q}")
    traces = wait_for(driver, lambda d: [t for t in d.execute_script(PLOT_JS) if t["x"]], wait) or []
    screenshot(driver, out / SHOTS["chart"])
    want_x, want_y = child["timed_steps"], child["step_times"]
    if not traces:
        ck.record(False, "child step-time chart", f"no chart on the page: {short(body_text(driver), 160)}")
        return
    t = traces[0]
    pts = [(x, y) for x, y in zip(t["x"], t["y"]) if isinstance(x, (int, float)) and isinstance(y, (int, float))]
    ok = (t["type"] != "bar" and [int(x) for x, _ in pts] == want_x
          and all(math.isclose(y, w, rel_tol=1e-6) for (_, y), w in zip(pts, want_y)))
    seen = (f"{len(pts)} points at steps {[int(x) for x, _ in pts]}" if t["type"] != "bar"
            else f"a single bar (one value, not a per-step series): x={t['x']} y={t['y']}")
    ck.record(ok, "child step-time chart",
              f"{child['name']!r}: {seen}; record: timed steps {want_x}, timing_s/step "
              f"{[round(y, 3) for y in want_y]}")


def check_table(ck: Checks, driver: Any, base: str, exp_id: str, parent: dict, out: Path, wait: float) -> None:
    """The parent's ``cells.json`` table artifact renders as a table with one row per cell."""
    driver.get(f"{base}/#/experiments/{exp_id}/runs/{parent['run_id']}/artifacts/cells.json?{ML_VIEW}")
    ids = [c["cell_id"] for c in parent["cells"]]
    text = wait_for(driver, lambda d: (t := body_text(d)) and all(i in t for i in ids) and t, wait) or body_text(driver)
    screenshot(driver, out / SHOTS["table"])
    found = [i for i in ids if i in text]
    has_table = bool(
        driver.execute_script("return document.querySelectorAll('table, [role=table], [role=grid]').length")
    )
    ok = len(found) == len(ids) and has_table and "speedup" in text
    ck.record(ok, "parent cells table (cells.json)",
              f"cell ids shown {found} of {ids}; speedup column {'yes' if 'speedup' in text else 'no'}"
              + ("" if ok else f"; page: {short(text, 160)}"))


def check_study(ck: Checks, driver: Any, dash: str, study: dict, out: Path, wait: float) -> None:
    """The Optuna study page shows the objective by its name (with ``step_time`` or ``step time``),
    not "Objective 0"."""
    driver.get(f"{dash}/dashboard/studies/{study['id']}")
    names = study["metric_names"] or []
    text = wait_for(driver, lambda d: (t := body_text(d)) and "History" in t and (not names or names[0] in t) and t,
                    wait) or body_text(driver)
    screenshot(driver, out / SHOTS["study"])
    name = names[0] if names else None
    ok = (bool(name) and re.search(r"step[_ ]time", name, flags=re.I) is not None and name in text
          and "Objective 0" not in text)
    ck.record(ok, "optuna objective name", f"study {study['name']!r}: metric name {name!r} "
              f"{'shown' if name and name in text else 'not shown'}"
              f"{'; page shows Objective 0' if 'Objective 0' in text else ''}")


# -- set-up -------------------------------------------------------------------------------------------

def _mlflow_version() -> str:
    from importlib import metadata

    return metadata.version("mlflow")


def sweep_facts(results: Path, uri: str) -> tuple[str, dict, list[dict]]:
    """From the sweep's folder (the source of truth) and MLflow: experiment id, the parent run and the
    child runs (names, tags, the records' timed steps and step times).

    Raises:
        Failed: no sweep folder, or MLflow lacks the runs it names.
    """
    from mlflow import MlflowClient

    sweep = (results / "smoke" / "latest").resolve()
    meta = read_json(sweep / "sweep.json")
    if not isinstance(meta, dict) or not meta.get("parent_run_id"):
        raise Failed(f"no sweep with an MLflow parent run in {results / 'smoke'}")
    client = MlflowClient(tracking_uri=uri)
    prun = client.get_run(meta["parent_run_id"])
    exp = client.get_experiment(prun.info.experiment_id)
    kind = exp.tags.get(EXPERIMENT_KIND[0])
    sha = str(meta.get("git_commit") or "")[:7]
    records = load_records(sweep)
    parent = {"run_id": prun.info.run_id, "name": prun.info.run_name, "kind": kind,
              "name_pattern": rf"{re.escape(meta['matrix_name'])} \d{{4}}-\d\d-\d\d \d\d:\d\d {re.escape(sha)}\S*",
              "cells": sorted({r["cell_id"]: r for r in records}.values(), key=lambda r: r["cell_id"])}
    children = []
    for rec in records:
        mark = read_json(Path(rec["_dir"]) / "mlflow.json") or {}
        if not mark.get("run_id"):
            raise Failed(f"{rec['_dir']}: the run was not logged to MLflow")
        run = client.get_run(mark["run_id"])
        summ = rec.get("summary") or {}
        timed = [int(s) for s in summ.get("timed_steps") or []]
        steps = rec.get("steps") or {}
        children.append(
            {
                "run_id": run.info.run_id,
                "name": run.info.run_name,
                "repeat": rec["repeat"],
                "label": rec["label"],
                "label_tag": run.data.tags.get("bench.label"),
                "cell_id": rec["cell_id"],
                "status": rec["status"],
                "timed_steps": timed,
                "step_times": [float(steps.get(str(s), {}).get("timing_s/step", float("nan"))) for s in timed],
            }
        )
    return exp.experiment_id, parent, children


def study_facts(dash: str, storage: str, name: str) -> dict:
    """The study's id in the dashboard and its metric names (Optuna's own record).

    Raises:
        Failed: the dashboard does not list the study.
    """
    import optuna

    with urllib.request.urlopen(f"{dash}/api/studies", timeout=30) as resp:
        summaries = json.load(resp).get("study_summaries", [])
    match = [s for s in summaries if s.get("study_name") == name]
    if not match:
        raise Failed(f"optuna-dashboard lists no study {name!r} (has {[s.get('study_name') for s in summaries]})")
    study = optuna.load_study(study_name=name, storage=storage)
    return {"id": match[0]["study_id"], "name": name, "metric_names": study.metric_names}


def open_browser(procs: Procs, chromium: str, chromedriver: str, log: Path) -> Any:
    """Headless Chromium through the given chromedriver (never a download: ``SE_OFFLINE``); chromedriver
    and its browser run in their own process group, tracked by ``procs``."""
    os.environ["SE_OFFLINE"] = "true"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1600,1000", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    # profile and Chromium's singleton/socket folders inside our temporary folder (removed with it), not in /tmp
    scratch = log.parent / "chromium"
    (scratch / "tmp").mkdir(parents=True, exist_ok=True)
    opts.add_argument(f"--user-data-dir={scratch / 'profile'}")
    service = Service(executable_path=chromedriver, log_output=str(log), popen_kw={"start_new_session": True},
                      env={**os.environ, "TMPDIR": str(scratch / "tmp")})
    try:
        driver = webdriver.Chrome(service=service, options=opts)  # starts chromedriver, then the browser
    finally:
        if getattr(service, "process", None) is not None:
            procs.add_group("chromedriver", service.process)
    driver.set_page_load_timeout(60)
    return driver


def run(args: argparse.Namespace, procs: Procs, tmp: Path) -> Checks:
    """Servers, sweep, tune, browser and the checks; returns the check lines.

    Raises:
        Failed: a server, the sweep or the tune failed.
    """
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(PYTHONUNBUFFERED="1", MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    results = tmp / "results"
    storage = f"sqlite:///{tmp / 'optuna.db'}"
    mport, dport = free_port(), free_port()
    base, dash = f"http://127.0.0.1:{mport}", f"http://127.0.0.1:{dport}"

    t0 = time.monotonic()
    tune = None
    if (
        not args.reuse
    ):  # the tune needs no server (its MLflow runs go to a store of its own): it runs while the server starts
        tune_matrix = tmp / Path(TUNE_MATRIX).name  # same file name: the study keeps the matrix's name
        spec = yaml.safe_load((ROOT / TUNE_MATRIX).read_text())
        spec["tune"]["confirm_blocks"] = TUNE_CONFIRM_BLOCKS
        tune_matrix.write_text(yaml.safe_dump(spec, sort_keys=False))
        tune = procs.start("tune", [sys.executable, "run_bench.py", "tune", str(tune_matrix), "--n-trials",
                                    str(TUNE_TRIALS), "--storage", storage, "--results", str(results),
                                    "--tracking-uri", f"sqlite:///{tmp / 'tune-mlflow.db'}"],
                           tmp / "tune.log", cwd=ROOT, env=env)
    server = procs.start("mlflow server", [sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                                           f"sqlite:///{tmp / 'mlflow.db'}", "--artifacts-destination",
                                           str(tmp / "artifacts"), "--host", "127.0.0.1", "--port", str(mport),
                                           "--workers", "1"],
                         tmp / "mlflow-server.log", cwd=tmp, env=env)
    wait_http(f"{base}/health", server, args.server_timeout)
    print(f"mlflow server up at {base} ({time.monotonic() - t0:.0f} s)", flush=True)
    if tune is not None:
        sweep = procs.start("sweep", [sys.executable, "run_bench.py", SWEEP_MATRIX, *SWEEP_OVERRIDES,
                                      "--tracking-uri", base, "--results", str(results)],
                            tmp / "sweep.log", cwd=ROOT, env=env)
        finish(sweep, args.run_timeout)
        print(f"sweep done ({time.monotonic() - t0:.0f} s)", flush=True)
        finish(tune, args.run_timeout)
        print(f"tune done ({time.monotonic() - t0:.0f} s)", flush=True)
    dashboard = procs.start("optuna-dashboard", [_dashboard_bin(), storage, "--host", "127.0.0.1",
                                                 "--port", str(dport), "--quiet"],
                            tmp / "optuna-dashboard.log", cwd=tmp, env=env)
    wait_http(f"{dash}/api/studies", dashboard, args.server_timeout)

    exp_id, parent, children = sweep_facts(results, base)
    study = study_facts(dash, storage, Path(TUNE_MATRIX).stem)
    ck = Checks()
    ck.record(parent["kind"] == EXPERIMENT_KIND[1], "experiment kind tag",
              f"{EXPERIMENT_KIND[0]} = {parent['kind']!r} (expected {EXPERIMENT_KIND[1]!r})")
    out = args.out
    driver = open_browser(procs, args.chromium, args.chromedriver, tmp / "chromedriver.log")
    try:
        check_experiment(ck, driver, base, exp_id, parent, children, out, args.wait)
        check_parent(ck, driver, base, exp_id, parent, out, args.wait)
        ok_children = [c for c in children if c["status"] == "ok" and c["timed_steps"]]
        if ok_children:
            check_chart(ck, driver, base, exp_id, ok_children[0], out, args.wait)
        else:
            ck.record(False, "child step-time chart", "no child run with timed steps")
        check_table(ck, driver, base, exp_id, parent, out, args.wait)
        check_study(ck, driver, dash, study, out, args.wait)
    finally:
        driver.quit()
    print(f"browser checks done ({time.monotonic() - t0:.0f} s)", flush=True)
    return ck


def _dashboard_bin() -> str:
    beside = Path(sys.executable).parent / "optuna-dashboard"
    found = str(beside) if beside.exists() else shutil.which("optuna-dashboard")
    if not found:
        raise Failed("optuna-dashboard is not installed (pip install optuna-dashboard)")
    return found


def _on_signal(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "browser_check",
                   help="folder for the screenshots and checks.txt (default results/browser_check/, git-ignored)")
    p.add_argument("--chromium", default=CHROMIUM, help=f"Chromium binary (default {CHROMIUM})")
    p.add_argument("--chromedriver", default=CHROMEDRIVER, help=f"chromedriver binary (default {CHROMEDRIVER})")
    p.add_argument(
        "--wait", type=float, default=60.0, metavar="S", help="seconds a page may take to render (default 60)"
    )
    p.add_argument("--server-timeout", type=float, default=180.0, metavar="S",
                   help="seconds the servers may take to start (default 180)")
    p.add_argument("--run-timeout", type=float, default=600.0, metavar="S",
                   help="seconds the sweep and the tune may take each (default 600)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (stores, logs) and print its path")
    p.add_argument("--reuse", type=Path, default=None, metavar="DIR",
                   help="a folder kept by --keep: serve its stores again and redo only the browser checks "
                        "(the URLs in its results name the old port: only the pages are checked)")
    args = p.parse_args(argv)
    for flag, path in (("--chromium", args.chromium), ("--chromedriver", args.chromedriver)):
        if not (Path(path).is_file() and os.access(path, os.X_OK)):
            print(f"error: {flag} {path}: not an executable file (Debian: apt-get install chromium chromium-driver)",
                  file=sys.stderr)
            return 2
    if args.wait <= 0 or args.server_timeout <= 0 or args.run_timeout <= 0:
        print("error: --wait, --server-timeout and --run-timeout must be > 0 seconds", file=sys.stderr)
        return 2

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in SHOTS.values():  # never leave an earlier run's screenshot looking like this run's
        (args.out / name).unlink(missing_ok=True)
    if args.reuse and not (args.reuse / "mlflow.db").is_file():
        print(f"error: --reuse {args.reuse}: no mlflow.db (a folder kept by --keep)", file=sys.stderr)
        return 2
    tmp = args.reuse or Path(tempfile.mkdtemp(prefix="browser-check-"))
    procs = Procs()
    rc = 1
    try:
        ck = run(args, procs, tmp)
        (args.out / "checks.txt").write_text("\n".join(ck.lines) + "\n")
        print(f"screenshots in {args.out}: " + ", ".join(n for n in SHOTS.values() if (args.out / n).exists()))
        print(f"{len(ck.lines) - ck.failed - sum(x.startswith('NOTE') for x in ck.lines)} passed, {ck.failed} failed")
        rc = 1 if ck.failed else 0
    except Failed as exc:
        print(f"FAIL set-up: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        rc = 130
    finally:
        procs.stop_all()
        if args.keep or args.reuse:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
