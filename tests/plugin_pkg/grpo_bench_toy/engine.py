"""Engine ``toy``: one short Python process per run that writes verl's file-logger JSONL, a patch report and
a trace of the toy format (its Free ratio and its operators; no torch, about 0.1 s per run); slower steps with
``TOY_OPT=0``."""

from __future__ import annotations

import json

from bench.engines.base import EngineBase, Launch

TOY_RUN = r"""
import json, os, sys, time
from pathlib import Path
out = Path(sys.argv[1]); cfg = json.loads(sys.argv[2])
on = os.environ.get("TOY_OPT") == "1"
ops = []
with open(out / "metrics.jsonl", "w") as fh:
    for step in range(1, cfg["steps"] + 1):
        t0 = time.perf_counter()
        x = 0
        for i in range((20000 if on else 30000) * cfg["work"]):
            x += i * i
        gen = time.perf_counter() - t0
        time.sleep(0.002)
        st = time.perf_counter() - t0
        fh.write(json.dumps({"step": step, "data": {"timing_s/step": st, "timing_s/gen": gen,
                                                    "perf/throughput": 100.0 / st}}) + "\n")
        # the toy format's operators: "<step> <name> <calls> <self us>", the loop and the sleep as measured
        ops += [f"{step} toy_matmul 1 {gen * 1e6:.1f}", f"{step} toy_copy 1 {(st - gen) * 1e6:.1f}"]
(out / "toy_free.txt").write_text(f"{cfg['steps']} {0.25 if on else 0.4}\n")
(out / "toy_ops.txt").write_text("\n".join(ops) + "\n")
(out / "patches").mkdir(exist_ok=True)
report = {"role": "toy", "patches": {"toy_opt": {"status": "applied", "mode": "on" if on else "off"}}}
(out / "patches" / "toy-host-1.json").write_text(json.dumps(report))
"""


class ToyEngine(EngineBase):
    """Engine ``toy``: one Python process per run, no model."""

    name = "toy"
    shows_config = True
    options_key = "toy"  # a matrix may hold ``base.toy: {work: N}``

    @classmethod
    def check_options(cls, base):
        for key, value in base.options(cls.options_key).items():
            if key != "work":
                raise ValueError(f"base.toy: unknown key {key!r} (allowed: work)")
            if type(value) is not int or value < 1:
                raise ValueError(f"base.toy.work: a whole number >= 1, got {value!r}")

    def build(self, base, mechanism, platform, levels, *, strict):
        config = {"steps": base.steps, "work": base.options(self.options_key).get("work", 1)}
        return Launch(argv=["{python}", "-c", TOY_RUN, "{run_dir}", json.dumps(config)],
                      env=dict(mechanism.env), config=config)

    def preflight(self, matrix, launches, platform):
        return None

    @staticmethod
    def startup_text(launch):
        return "counting to 30000"
