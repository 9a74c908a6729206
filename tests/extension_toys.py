"""Toy implementations of the four extension seams (CONTRIBUTING.md), used by test_extension_recipes.py.

Each toy is what a contributor would write in its own file, plus its one registration line (in
:func:`register_all` here, so the test can undo them with :func:`unregister_all`):

* engine ``toy``: a launch that runs a short Python script writing verl's file-logger JSONL, a patch
  report and a trace of the toy format (no torch, about 0.1 s per run);
* profiler format ``toytrace``: ``toy_free.txt`` with ``<step> <free ratio>`` lines;
* optimization ``toy_opt``: an env var on engine ``toy``, its evidence check and an article figure;
* statistical test ``toy welch``: Welch's t test on the log samples (unpaired).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from scipy import stats as sps

from bench.analyze.stat_tests import StatTest, register_test, unregister_test
from bench.engines import register, unregister
from bench.engines.base import Launch
from bench.measure.formats import Measurements, Reader, ReadOptions, register_reader, unregister_reader
from bench.spec.optimizations import Mechanism, Optimization, register_optimization, unregister_optimization

#: the child process of a toy run: steps of a fixed busy loop, slower with TOY_OPT=0
TOY_RUN = r"""
import json, os, sys, time
from pathlib import Path
out = Path(sys.argv[1]); cfg = json.loads(sys.argv[2])
on = os.environ.get("TOY_OPT") == "1"
with open(out / "metrics.jsonl", "w") as fh:
    for step in range(1, cfg["steps"] + 1):
        t0 = time.perf_counter()
        x = 0
        for i in range(20000 if on else 30000):
            x += i * i
        gen = time.perf_counter() - t0
        time.sleep(0.002)
        st = time.perf_counter() - t0
        fh.write(json.dumps({"step": step, "data": {"timing_s/step": st, "timing_s/gen": gen,
                                                    "perf/throughput": 100.0 / st}}) + "\n")
(out / "toy_free.txt").write_text(f"{cfg['steps']} {0.25 if on else 0.4}\n")
(out / "patches").mkdir(exist_ok=True)
report = {"role": "toy", "patches": {"toy_opt": {"status": "applied", "mode": "on" if on else "off"}}}
(out / "patches" / "toy-host-1.json").write_text(json.dumps(report))
"""


class ToyEngine:
    """Engine ``toy``: one Python process per run, no model."""

    name = "toy"
    options_key = None
    shows_config = True
    forkserver_platforms = ()
    supports_smoke = False
    has_speed_probe = False

    def build(self, base, mechanism, platform, levels, *, strict):
        import json

        config = {"steps": base.steps}
        return Launch(argv=["{python}", "-c", TOY_RUN, "{run_dir}", json.dumps(config)],
                      env=dict(mechanism.env), config=config)

    def preflight(self, matrix, launches, platform):
        return None


class ToyTraceReader(Reader):
    """``toy_free.txt``: one ``<step> <free ratio>`` line per profiled step."""

    name = "toytrace"

    def detect(self, run_dir: Path) -> bool:
        return (run_dir / "toy_free.txt").is_file()

    def read(self, run_dir: Path, options: ReadOptions) -> Measurements:
        out = Measurements()
        for line in (run_dir / "toy_free.txt").read_text().splitlines():
            step, free = line.split()
            out.free.append((int(step), {"kind": "toy", "source": "toy_free.txt", "free_ratio": float(free),
                                         "basis": "toy"}))
        return out


def toy_check(level: int, reports: list[dict], cfg: dict | None) -> tuple[str, str]:
    """Evidence of ``toy_opt``: the mode its patch report names."""
    modes = [((r.get("patches") or {}).get("toy_opt") or {}).get("mode") for r in reports]
    if not modes:
        return "missing", "no toy_opt report"
    want = "on" if level else "off"
    return ("confirmed" if modes[0] == want else "contradicted"), f"toy_opt mode {modes[0]}"


TOY_OPT = Optimization(
    key="toy_opt", title="Toy optimization", section="9.9", acts="host", article_gain=0.5, article_level=1,
    mechanisms={"toy:*": {0: Mechanism(env={"TOY_OPT": "0"}), 1: Mechanism(env={"TOY_OPT": "1"})}},
    not_applicable={"embedded:*": "toy only", "verl:*": "toy only"},
    evidence="TOY_OPT in the run's patch report", evidence_checks={"toy:*": "extension_toys:toy_check"},
)


class ToyWelchTest(StatTest):
    """Welch's t test on the log samples; change = ratio of geometric means - 1."""

    name = "toy welch"
    label = "toy welch t"

    def estimate(self, bg, cg, scale, med_b):
        return math.expm1(float(np.mean(np.log(np.concatenate(cg))) - np.mean(np.log(np.concatenate(bg)))))

    def p(self, bg, cg, scale, med_b):
        return float(sps.ttest_ind(np.log(np.concatenate(cg)), np.log(np.concatenate(bg)), equal_var=False).pvalue)

    def min_p(self, bg, cg):
        return 0.0


def register_all() -> None:
    """The four registration lines (import this module before the harness's other modules: the
    optimization's key joins FACTOR_KEYS, which modules bind at import)."""
    register(ToyEngine)
    register_reader(ToyTraceReader())
    register_optimization(TOY_OPT)
    register_test(ToyWelchTest())


def unregister_all() -> None:
    """Undo :func:`register_all`."""
    unregister("toy")
    unregister_reader("toytrace")
    unregister_optimization("toy_opt")
    unregister_test("toy welch")
