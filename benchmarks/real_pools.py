"""Pools of real recorded runs, resampled with their dependence kept (issue 45): the data of the validity benchmarks
``benchmarks/bench_gate.py oc`` and ``benchmarks/sweep_validity.py`` (``bench_verdict.py resampled``).

Not a test. The older resampling made the data independent: every gate sweep was centred on its own mean and its
blocks drawn one by one (so a per-gate version offset, the false +9.3 % "regression" of the lab notes, could not
appear), and every cell's runs were drawn one by one after centring each sweep (no block, drift or serial
correlation left). Here:

* **Gate pools** (:func:`record_gate_pool`, ``benchmarks/pools/gate_*.json``): real interleaved gate sweeps of
  unchanged code (``gate --interleave HEAD``), block by block in the order they ran, both versions' runs of each
  block with their status (failed runs kept), timed step times and speed probes. :func:`gate_records` builds one
  simulated gate from ONE recorded gate sweep drawn at random (its version offset, its machine state and its
  failures stay whole) and, per cell, a moving-block bootstrap of that sweep's blocks (consecutive runs of
  :data:`CHUNK` recorded blocks, Kuensch 1989, "The jackknife and the bootstrap for general stationary
  observations", Ann. Statist. 17: drift and serial correlation within a chunk stay as recorded). The cells of a
  simulated gate share the drawn sweep (and so its offset). Nothing is centred: the code was the same on both sides,
  so the truth is 0 exactly and every offset the pool shows is noise the gate must survive.
* **Sweep pools** (``benchmarks/data/recorded_runs_*.json`` or ``benchmarks/pools/sweep_*.json``, written by
  :func:`benchmarks.sweep_validity.extract_runs`): :func:`sweep_blocks` keeps whole recorded blocks (every cell's run
  of the block, failed ones included, in the recorded order) grouped by recorded sweep, each cell scaled by ONE factor
  over the whole pool (its pooled mean moved to the grand mean: the real effects go, each sweep's offsets and
  sweep x cell departures stay); :func:`whole_sweep_blocks` draws one recorded sweep and a moving-block bootstrap
  of its blocks.

:func:`plant_offsets` adds a per-gate (per-sweep) offset to a pool, the failure the independent resampling cannot
see: ``tests/gate/test_validity_benchmark.py`` checks that this benchmark sees it.
"""

from __future__ import annotations

import json
import math
import os
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import numpy as np

FORMAT_VERSION = 1
#: recorded blocks per chunk of the moving-block bootstrap
CHUNK = 3
#: the nominal speed probe (seconds) of the synthetic probe of :func:`gate_records` (``rho``)
PROBE_S = 0.03
POOLS = Path(__file__).resolve().parent / "pools"
STEP = "timing_s/step"


def _probe_metric() -> str:
    from bench.records.speed import PROBE_METRIC

    return PROBE_METRIC


def _machine() -> str:
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), platform.machine())
    except OSError:
        cpu = platform.machine()
    return f"{os.cpu_count()} cores, {cpu}"


def record_gate_pool(gate_dirs: Sequence[Path], target: str) -> dict[str, Any]:
    """The gate pool of ``gate_dirs`` (interleaved gate sweep folders of unchanged code): a header (target, machine,
    per sweep its id, UTC start and commit) and ``gates``: per sweep its complete ``blocks`` (both versions ran,
    ok or failed; a block the sweep never finished is left out) in block order,
    each ``{"block", "runs": [{"version", "status", "failure_kind", "order", "wall_s", "timed_steps",
    "step_time_s", "speed_probe_s"}]}`` (``order``: the run's place in the sweep; probes empty where a step has
    none). No path of this machine. Times in seconds."""
    from bench.core.files import read_json
    from bench.records.results import SWEEP, load_records

    probe = _probe_metric()
    gates, header_sweeps, loads = [], [], []
    for d in gate_dirs:
        meta = read_json(Path(d) / SWEEP) or {}
        recs = sorted((r for r in load_records(Path(d)) if r.get("code_version") in ("baseline", "candidate")),
                      key=lambda r: r.get("started_at") or 0)
        if not recs:
            continue
        t0 = min(float(r["started_at"]) for r in recs if r.get("started_at"))
        blocks: dict[int, list[dict[str, Any]]] = {}
        for i, r in enumerate(recs):
            s = r.get("summary") or {}
            timed = [int(t) for t in s.get("timed_steps") or []]
            steps = r.get("steps") or {}
            pr = [(steps.get(str(t)) or {}).get(probe) for t in timed]
            hl = r.get("host_load") or {}
            loads += [v * (os.cpu_count() or 1) for v in ((hl.get(w) or {}).get("load1_per_cpu")
                                                          for w in ("before", "after")) if isinstance(v, (int, float))]
            blocks.setdefault(int(r["repeat"]), []).append({
                "version": r["code_version"], "status": r.get("status"), "failure_kind": r.get("failure_kind"),
                "order": i, "wall_s": round(float(r.get("wall_s") or 0.0), 3), "timed_steps": timed,
                "step_time_s": [round(float(v), 6) for v in s.get("step_time_samples_s") or []],
                "speed_probe_s": [round(float(v), 7) for v in pr] if pr and all(v for v in pr) else []})
        gates.append({"gate": len(gates), "blocks": [{"block": k, "runs": v} for k, v in sorted(blocks.items())
                                                     if {r["version"] for r in v} == {"baseline", "candidate"}]})
        header_sweeps.append({"gate": len(gates) - 1, "matrix": meta.get("matrix_name"),
                              "sweep_id": meta.get("sweep_id"), "commit": meta.get("git_commit"),
                              "started_utc": datetime.fromtimestamp(t0, timezone.utc).strftime("%Y-%m-%d %H:%M")})
    header = {"format_version": FORMAT_VERSION, "kind": "gate", "target": target, "machine": _machine(),
              "load_average_mean": round(float(np.mean(loads)), 2) if loads else None, "sweeps": header_sweeps,
              "blocks": sum(len(g["blocks"]) for g in gates),
              "failed_runs": sum(r["status"] != "ok" for g in gates for b in g["blocks"] for r in b["runs"]),
              "what": "interleaved gate sweeps of unchanged code (gate --interleave HEAD, or gate --stacks a b with "
              "one stack declared twice), every complete block as recorded"}
    return {"header": header, "gates": gates}


def load_pool(path: Path, kind: str = "gate") -> dict[str, Any]:
    """A pool file of ``kind`` written by :func:`record_gate_pool`.

    Raises:
        SystemExit: (exit 2) missing, not JSON, another ``format_version`` or kind, or no gates.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{path}: cannot read the pool ({exc})") from None
    h = data.get("header") or {}
    if h.get("format_version") != FORMAT_VERSION or h.get("kind") != kind or not data.get("gates"):
        raise SystemExit(f"{path}: header.format_version must be {FORMAT_VERSION} and header.kind {kind!r}, "
                         "with gates")
    return data


def _median(xs: Sequence[float]) -> float:
    return float(np.median(xs))


def block_ratio(block: dict[str, Any]) -> float | None:
    """The block's log ratio ``log(run value cand / run value base)`` (run value = median timed step, as
    :func:`bench.gate.runs.block_pairs`), ``None`` when a version's run failed or is missing."""
    got = {r["version"]: r for r in block["runs"] if r["status"] == "ok" and r["step_time_s"]}
    if len(got) < 2:
        return None
    return math.log(_median(got["candidate"]["step_time_s"]) / _median(got["baseline"]["step_time_s"]))


def plant_offsets(pool: dict[str, Any], offsets: Sequence[float]) -> dict[str, Any]:
    """A copy of ``pool`` whose gate ``g`` has its candidate's step times multiplied by ``exp(offsets[g %
    len(offsets)])``: a per-gate version offset (log), the failure a per-gate centring erases."""
    out = json.loads(json.dumps(pool))
    for g in out["gates"]:
        f = math.exp(offsets[g["gate"] % len(offsets)])
        for b in g["blocks"]:
            for r in b["runs"]:
                if r["version"] == "candidate":
                    r["step_time_s"] = [v * f for v in r["step_time_s"]]
    return out


def moving_blocks(rng: np.random.Generator, n: int, k: int, chunk: int = CHUNK) -> list[int]:
    """``k`` indices into ``n`` recorded blocks, in chunks of ``chunk`` consecutive indices (circular): while ``k <=
    n``, the recorded blocks rotated by a random start and cut into chunks whose order is shuffled, so no block comes
    twice (a repeated block ties with itself: the interval narrows and the signed-rank test falls back to its slow
    permutation form); beyond ``n``, chunks with random starts, drawn with replacement (the moving-block bootstrap,
    Kuensch 1989)."""
    start = int(rng.integers(0, n))
    rot = [(start + j) % n for j in range(n)]
    chunks = [rot[i: i + chunk] for i in range(0, n, chunk)]
    out = [i for c in (chunks[j] for j in rng.permutation(len(chunks))) for i in c]
    while len(out) < k:
        s = int(rng.integers(0, n))
        out += [(s + j) % n for j in range(min(chunk, n))]
    return out[:k]


def _synthetic_probe(pool: dict[str, Any], rho: float, seed: int = 45, offset_blind: bool = False
                     ) -> dict[tuple[int, int], float]:
    """Per (gate, block index) a probe log ratio ``p = rho * x + sqrt(1 - rho^2) * s * e`` with ``x`` the block's log
    ratio ``d`` (the truth is 0: the code is the same on both sides), ``s`` the pooled SD of ``x`` and ``e`` standard
    normal, fixed per block (seeded): a probe that tracks the real block noise with correlation ``rho``.
    ``offset_blind``: ``x = d - m_g`` (``m_g`` its gate's mean), a probe that sees none of a gate's own offset (each
    recorded gate's mean taken as a version offset no probe sees: a stress case, since with 4-10 blocks a gate's mean
    is mostly noise)."""
    rng = np.random.default_rng(seed)
    dev: dict[tuple[int, int], float] = {}
    for gi, g in enumerate(pool["gates"]):
        ds = {i: block_ratio(b) for i, b in enumerate(g["blocks"])}
        ok = [v for v in ds.values() if v is not None]
        m = float(np.mean(ok)) if ok and offset_blind else 0.0
        dev.update({(gi, i): v - m for i, v in ds.items() if v is not None})
    s = float(np.std(list(dev.values()), ddof=1)) if len(dev) > 1 else 0.0
    return {k: rho * v + math.sqrt(max(0.0, 1 - rho * rho)) * s * float(rng.normal()) for k, v in sorted(dev.items())}


_PROBES: dict[tuple[int, float, bool], dict[tuple[int, int], float]] = {}


def gate_records(rng: np.random.Generator, pool: dict[str, Any], *, blocks: int, cells: int = 1,
                 change: float = 0.0, rho: float | None = None, independent: bool = False,
                 offset_blind: bool = False) -> list[dict[str, Any]]:
    """Run records of one simulated interleaved gate of ``cells`` cells and ``blocks`` blocks (module text): one
    recorded gate sweep drawn at random among those of at least ``blocks`` blocks (all, where none is that long), per
    cell ``blocks`` of its blocks without repeats (:func:`moving_blocks`: a subsample, so a gate's mean varies about
    its recorded offset as a real gate's would; a recorded gate shorter than the simulated one repeats blocks, and its
    resamples then keep its sample mean as an offset with half the noise: the error rates come out too high),
    each block's two runs as recorded (a failed run stays failed: the real comparison leaves its block out), the
    candidate's timed steps ``1 + change`` times as long. The speed probe is the recorded one, or with ``rho`` the
    synthetic one of :func:`_synthetic_probe` (both versions' probe ``PROBE_S``, the candidate's times ``exp(p)``;
    ``offset_blind`` passed on).
    ``_src`` = (recorded gate index, block index).

    ``independent``: the old resampling, for comparison only: every gate centred on its own mean block ratio and
    each block drawn independently from all gates."""
    probe = _probe_metric()
    probes = None
    if rho is not None:
        key = (id(pool), rho, offset_blind)
        probes = _PROBES.get(key)
        if probes is None:
            probes = _PROBES[key] = _synthetic_probe(pool, rho, offset_blind=offset_blind)
    gates = pool["gates"]
    if independent:
        flat = [(gi, i) for gi, g in enumerate(gates) for i in range(len(g["blocks"]))]
    long = [j for j, g in enumerate(gates) if len(g["blocks"]) >= blocks] or list(range(len(gates)))
    gi = long[int(rng.integers(0, len(long)))]
    out = []
    for c in range(cells):
        if independent:
            picks = [flat[int(j)] for j in rng.integers(0, len(flat), blocks)]
        else:
            picks = [(gi, i) for i in moving_blocks(rng, len(gates[gi]["blocks"]), blocks)]
        for k, (g, i) in enumerate(picks):
            blk = gates[g]["blocks"][i]
            centre = _gate_mean(pool, g) if independent else 0.0
            for r in sorted(blk["runs"], key=lambda r: r["order"]):
                cand = r["version"] == "candidate"
                scale = (1.0 + change) * math.exp(-centre) if cand else 1.0
                st = [v * scale for v in r["step_time_s"]]
                rec: dict[str, Any] = {
                    "cell_id": f"c{c}", "label": f"cell {c}", "repeat": k, "code_version": r["version"], "_src": (g, i),
                    "status": r["status"], "failure_kind": r.get("failure_kind"), "wall_s": r["wall_s"],
                    "summary": {"timed_steps": r["timed_steps"], "step_time_samples_s": st},
                    "steps": {str(t): {STEP: v} for t, v in zip(r["timed_steps"], st)}}
                if probes is not None:
                    p = PROBE_S * (math.exp(probes.get((g, i), 0.0)) if cand else 1.0)
                    pr = [p] * len(st)
                else:
                    pr = r["speed_probe_s"]
                if pr and len(pr) == len(st):
                    for t, v in zip(r["timed_steps"], pr):
                        rec["steps"][str(t)][probe] = v
                    rec["evidence"] = {"speed_probe": {"enabled": True, "spec": "recorded"}}
                out.append(rec)
    return out


_MEANS: dict[tuple[int, int], float] = {}


def _gate_mean(pool: dict[str, Any], g: int) -> float:
    key = (id(pool), g)
    if key not in _MEANS:
        ok = [v for v in (block_ratio(b) for b in pool["gates"][g]["blocks"]) if v is not None]
        _MEANS[key] = float(np.mean(ok)) if ok else 0.0
    return _MEANS[key]


def gate_family(pool: dict[str, Any], *, reps: int, cells: int, looks: int, alpha: float, threshold: float,
                change: float = 0.0, rho: float | None = None, seed: int = 0, stop: bool = True,
                independent: bool = False, offset_blind: bool = False) -> dict[str, Any]:
    """Error rates of the interleaved gate at a true ``change`` over ``reps`` simulated gates (:func:`gate_records`),
    each run look by look through the real stop rule (:class:`bench.gate.interleaved.GateStopRule` with the declared
    analysis of :func:`bench.gate.runs.declare_analysis`: covariate, Bonferroni over the cells, repeated intervals),
    until it stops (``stop``) or over all ``looks``. Returns counts and shares with Wilson 95 % intervals:
    ``interval`` = gates where some look's interval of some cell misses the truth; ``false`` = gates where some
    look gives a cell a wrong verdict (at a true 0: regression or improvement; above 0: improvement, or pass at a
    true change >= the max MDE); ``regression`` / ``pass`` = the final verdicts; mean ``blocks`` used;
    ``cell_looks`` (a cell at a look of at least :data:`bench.gate.runs.COVARIATE_MIN_BLOCKS` complete blocks, each
    with a probe), ``unfitted`` (of those, where the covariate was not fitted) and ``probe_t`` (of those, where a
    paired t test of the probe's block log ratios gives p < 0.01: where the pre-issue-45 rule switched the covariate
    off)."""
    from scipy import stats as sps

    from bench.gate.interleaved import GateStopRule
    from bench.gate.runs import COVARIATE_MIN_BLOCKS, block_pairs, declare_analysis

    class _Rule(GateStopRule):  # the real rule; keeps the comparison its stop decision was made on
        def compare(self, records: list[dict[str, Any]], look: int, final: bool = False) -> dict[str, Any]:
            self.last = super().compare(records, look, final)
            return self.last

    rng = np.random.default_rng(seed)
    ivl = false = reg = pss = cell_looks = unfitted = probe_t = 0
    used = []
    for _ in range(reps):
        recs = gate_records(rng, pool, blocks=looks, cells=cells, change=change, rho=rho, independent=independent,
                            offset_blind=offset_blind)
        an = declare_analysis(cells=[f"c{c}" for c in range(cells)], threshold=threshold, alpha=alpha, max_mde=None,
                              normalize=True, max_looks=looks)
        rule = _Rule(threshold=threshold, alpha=alpha, max_mde=None, normalize=True, max_blocks=looks, analysis=an)
        miss = wrong = False
        final = None
        for look in range(1, looks + 1):
            part = [r for r in recs if r["repeat"] < look]
            got = rule.after_block(part, look)
            pairs = {cid: c["pairs"] for cid, c in block_pairs(part).items()}
            for row in rule.last["rows"]:
                dp = [x[2] for x in pairs.get(row["cell_id"], [])]
                if len(dp) >= COVARIATE_MIN_BLOCKS and None not in dp:
                    cell_looks += 1
                    unfitted += not row["normalized"]
                    probe_t += bool(np.std(dp) > 0 and sps.ttest_1samp(dp, 0.0).pvalue < 0.01)
                if row.get("ci_low") is not None and not row["ci_low"] <= change <= row["ci_high"]:
                    miss = True
                v = row["verdict"]
                wrong |= (v == "improvement" if change > 0 else v in ("regression", "improvement")
                          ) or (change >= an["max_mde"] and v == "unchanged")
            if final is None and got.stop:
                final = (rule.last["verdict"], look)
                if stop:
                    break
        final = final or (rule.last["verdict"], looks)
        ivl += miss
        false += wrong
        reg += final[0] == "regression"
        pss += final[0] == "pass"
        used.append(final[1])
    return {"n": reps, "cells": cells, "rho": rho, "looks": looks, "alpha": alpha, "change": change,
            "interval_k": ivl, "interval": ivl / reps, "interval_ci": wilson(ivl, reps),
            "false_k": false, "false": false / reps, "false_ci": wilson(false, reps),
            "regression": reg / reps, "pass": pss / reps, "blocks": float(np.mean(used)),
            "cell_looks": cell_looks, "unfitted": unfitted, "probe_t": probe_t}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial share ``k / n`` (Wilson 1927), 95 % by default."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def mc_se(p: float, n: int) -> float:
    """Monte Carlo standard error of a share ``p`` over ``n`` replications (binomial)."""
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else float("nan")
