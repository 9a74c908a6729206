"""``run_bench.py gate``: what the gate does (:func:`run_gate`): read the candidate sweep and the baseline
(:func:`load_reference`), compare them and check the matrix's ``expect`` claims (:mod:`bench.gate.verdicts`, where
the method, the verdicts and the exit codes are described), write ``gate.md`` and ``gate.json``
(:mod:`bench.gate.markdown`; also to ``$GITHUB_STEP_SUMMARY``) and log the MLflow gate run. Argument
parsing and printing: :mod:`bench.commands.gate`."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Literal

from bench.core.errors import BenchError, InputError, did_you_mean
from bench.core.files import atomic_write_json, atomic_write_text
from bench.core.metadata import machine
from bench.gate.baseline import HISTORY, load_baseline, sweep_to_sweep
from bench.gate.markdown import (
    PER_STEP_METHOD,
    RUN_STATUS,
    STORED_METHOD,
    append_step_summary,
    gate_table,
    render_markdown,
)
from bench.gate.verdicts import (
    check_expectations,
    compare_snapshots,
    validate_expect,
)
from bench.records.results import find_sweep
from bench.records.snapshot import check_complete, snapshot
from bench.records.speed import normalize_snapshot
from bench.report.tables import claims_on_runs
from bench.spec.metrics import METRICS
from bench.stats.decide import gate_outcome
from bench.stats.estimators import N_BOOT
from bench.stats.stat_tests import TESTS, describe_tests
from bench.tracking import Tracker, mlflow_key, store_failure


def _log_mlflow(result: dict[str, Any], tracking_uri: str, files: list[Path]) -> str | None:
    """Create the gate run, nested under the candidate sweep's parent run (same experiment) when it has one,
    named ``gate <candidate> vs <baseline>: <verdict>``, status by :data:`RUN_STATUS`, the per-cell results
    as table ``gate_cells.json`` and the counts as metrics; tag the candidate's parent run. Returns a
    warning instead of raising."""
    try:
        cand = result["candidate"]
        tr = Tracker(tracking_uri, cand.get("matrix") or "default")
        bname = result["baseline"].get("name") or "none"
        parent = (
            cand.get("parent_run_id") if cand.get("parent_run_id") and tr.parent_alive(cand["parent_run_id"]) else None
        )
        tags = {
            "bench.kind": "gate",
            "bench.verdict": result["verdict"],
            "bench.baseline": bname,
            "bench.candidate_sweep": cand.get("sweep_id") or "",
            "engine": cand["engine"],
            "platform": cand["platform"],
            "bench.candidate_parent_run": cand.get("parent_run_id") or "",
            "bench.regressions": ", ".join(
                sorted({r["cell"] for r in result.get("rows", []) if r["verdict"] in ("regression", "failed")})
            )
            or "none",
        }
        if parent:
            tags["mlflow.parentRunId"] = parent
        md = next((Path(f) for f in files if Path(f).suffix == ".md" and Path(f).is_file()), None)
        rid = tr.start_parent(f"gate {cand.get('sweep_id')} vs {bname}: {result['verdict']}", tags,
                              {k: v for k, v in result["settings"].items()},
                              description=md.read_text() if md else None)  # gate.md on the run's page
        if result.get("rows"):
            tr.log_table(rid, gate_table(result), "gate_cells.json")
        tr.finish_parent(rid, metrics={f"count.{k.replace(' ', '_')}": v for k, v in result.get("counts", {}).items()},
                         artifacts=[Path(f) for f in files], status=RUN_STATUS.get(result["verdict"], "FAILED"))
        result["mlflow_run_id"] = rid
        if cand.get("parent_run_id"):
            try:
                tr.set_tag(cand["parent_run_id"], mlflow_key(f"bench.gate.{bname}"), result["verdict"])
            except Exception:
                pass
    except Exception as exc:
        return f"MLflow gate run not logged ({tracking_uri}): {store_failure(exc, tracking_uri)}"
    return None


def load_reference(ref: str, results: Path, *, prefer: Literal["baseline", "sweep"] = "baseline",
                   what: str = "--baseline") -> dict[str, Any]:
    """The reference side of a comparison: a saved baseline (name or file) or a sweep (folder, matrix name =
    its latest sweep, or ``<matrix>/<sweep id>``), read like ``baseline save`` reads it but not stored.

    ``prefer`` decides a name that is both a baseline and a matrix (``gate``: the baseline; ``compare``: the
    sweep). A sweep's snapshot is named after the sweep (``<matrix>/<sweep id>``).

    Raises:
        BenchError: neither a baseline nor a sweep (listing the known baselines); an unreadable baseline; a
            reference sweep with failed, unfinished or sample-less cells.
    """
    def as_baseline() -> dict[str, Any]:
        return load_baseline(ref, results)

    def as_sweep() -> dict[str, Any]:
        sweep = find_sweep(ref, results)
        snap = snapshot(sweep, results)
        check_complete(snap, f"{what} {sweep}")
        snap.update(name=snap["source"].get("sweep") or sweep.name, _path=str(sweep), _kind="sweep")
        return snap

    first, second = (as_baseline, as_sweep) if prefer == "baseline" else (as_sweep, as_baseline)
    try:
        return first()
    except BenchError as exc:
        if os.path.isfile(ref) or ("unknown baseline" not in str(exc) and "no sweep found" not in str(exc)):
            raise  # a file that is there but bad, or a bad sweep: say what is wrong with it
        err1 = str(exc)
    try:
        return second()
    except BenchError as exc:
        if "unknown baseline" not in str(exc) and "no sweep found" not in str(exc):
            raise
        b, sw = (err1, str(exc)) if prefer == "baseline" else (str(exc), err1)
    raise BenchError(f"{what} {ref}: neither a baseline nor a sweep: {b.split(': ', 1)[-1]}; "
                     f"{sw.split(': ', 1)[-1]}")


def judge_claims(snap: dict[str, Any], expects: list[Any], *, alpha: float, seed: int = 0,
                 normalize: bool = True) -> list[dict[str, Any]]:
    """The matrix ``expect`` claims judged on the runs, exactly as ``report`` judges them: the snapshot
    speed-normalized to the sweep's median probe where every run carries it
    (:func:`bench.records.speed.normalize_snapshot`, the report's rule, fixed by what the runs recorded, not by their
    values), the claims' cells found by
    :func:`bench.gate.verdicts.check_expectations`, then :func:`bench.report.tables.claims_on_runs` (a t interval
    on the log run values at ``1 - alpha``; "not met" only when it excludes the claim, "cannot judge" when it
    includes a bound). ``alpha``: the gate's per-test level (its family's ``alpha / m``). ``snap`` is not changed."""
    import copy

    snap = copy.deepcopy(snap)
    snap.pop("machine", None)
    if normalize:
        normalize_snapshot(snap)
    found = check_expectations(snap, expects, alpha=alpha, n_boot=0, seed=seed, normalize=False)
    return claims_on_runs(snap, found, alpha)


def run_gate(*, baseline_ref: str | None, candidate_ref: str, results: Path, tracking_uri: str | None,
             metrics: list[str], threshold: float, alpha: float, out: Path | None = None, n_boot: int = N_BOOT,
             seed: int = 0, check_expect: bool = True, pairing: bool = False,
             max_mde: float | None = None, normalize: bool = True,
             prefer: Literal["baseline", "sweep"] = "baseline", test: str | None = None) -> dict[str, Any]:
    """Everything ``gate`` does; returns the result dict (``exit_code``, ``verdict``, ``files`` ...).

    ``baseline_ref``: a baseline or a sweep (:func:`load_reference`; ``prefer`` decides a name that is
    both). Thresholds are fractions (0.05 = 5 %).

    Raises:
        BenchError: unknown baseline or sweep, different engine/platform, no matching cells, bad expect block,
            nothing to check.
    """
    bad = [m for m in metrics if m not in METRICS]
    if bad or not metrics:
        word = bad[0] if bad else ""
        raise InputError("metric", f"metric {word!r}: unknown metric{did_you_mean(word, METRICS)} "
                         f"(allowed: {', '.join(METRICS)})")
    if not 0 <= threshold < 1:
        raise InputError("threshold", f"threshold {threshold}: must be a fraction in [0, 1) (0.05 = 5 %)")
    if not 0 < alpha < 0.5:
        raise InputError("alpha", f"alpha {alpha}: must be in (0, 0.5)")
    if test is not None and test not in TESTS:
        raise InputError("test", f"test {test}: unknown test{did_you_mean(test, TESTS)} (allowed: {', '.join(TESTS)})")
    sweep = find_sweep(candidate_ref, results)
    cand = snapshot(sweep, results)
    expects = validate_expect(cand.get("expect"), cand["source"].get("matrix_file") or sweep) if check_expect else []
    if baseline_ref is None and not expects:
        raise BenchError(
            "gate: nothing to check: give --baseline NAME_OR_FILE (and/or an `expect` block in the matrix)"
        )
    base = (
        load_reference(
            baseline_ref,
            results,
            prefer=prefer,  # compare names its reference SWEEP_A
            what="--baseline" if prefer == "baseline" else "SWEEP_A",
        )
        if baseline_ref is not None
        else None
    )
    result: dict[str, Any] = {
        "format": "grpo-bench-gate", "format_version": 1, "created_at": time.time(),
        "settings": {"threshold": threshold, "alpha": alpha, "metrics": ",".join(metrics), "n_boot": n_boot,
                     "seed": seed, "pairing": "auto" if pairing else "off",
                     "normalize": "auto" if normalize else "off",
                     "max_mde": 2 * threshold if max_mde is None else max_mde,
                     "test": describe_tests(pairing, test),
                     **(STORED_METHOD if not pairing and test is None else PER_STEP_METHOD)},
        "candidate": {"sweep": cand["source"]["sweep"], "sweep_id": cand["source"]["sweep_id"],
                      "matrix": cand["source"]["matrix"], "engine": cand["engine"], "platform": cand["platform"],
                      "parent_run_id": cand["source"].get("parent_run_id"), "git_commit": cand.get("git_commit")},
        "baseline": {}, "rows": [], "notes": [], "counts": {}, "verdict": "pass", "exit_code": 0,
    }
    found = check_expectations(cand, expects, alpha=alpha, n_boot=0, seed=seed, normalize=False) if expects else []
    n_claims = sum(e["result"] != "n/a" for e in found)  # claims that can make the verdict (applicability only)
    family = {"m": n_claims, "alpha_each": alpha / max(1, n_claims)}
    if base is not None:
        result["baseline"] = {"name": base.get("name"), "file": Path(base["_path"]).name,
                              "kind": base.get("_kind", "baseline"),
                              "sweep": base["source"].get("sweep"), "engine": base["engine"],
                              "platform": base["platform"], "git_commit": base.get("git_commit"),
                              "created_at": base.get("created_at")}
        cand["machine"] = machine()
        s2s = None
        if base.get("_kind", "baseline") == "baseline":  # what a stored baseline carries from sweep to sweep
            # recomputed from the saved history where there is one, so that a file saved by an older harness (its
            # offset's df counted once per cell) is judged with saves - 1 df like a new one
            s2s = (sweep_to_sweep(base["history"][-HISTORY:]) if base.get("history") else
                   base.get("sweep_to_sweep") or sweep_to_sweep([]))
            result["baseline"]["sweep_to_sweep"] = s2s
        result.update(compare_snapshots(base, cand, metrics=metrics, threshold=threshold, alpha=alpha,
                                        n_boot=n_boot, seed=seed, pairing=pairing, max_mde=max_mde,
                                        normalize=normalize, test=test, s2s=s2s, also_judged=n_claims))
        family = result.pop("family")
        result["settings"]["normalization"] = result.pop("normalization")
        if s2s is not None:
            result["notes"].append(s2s["note"] + ("; the interval of each step_time row includes it" if
                                                  s2s.get("sd_log") is not None and not pairing and test is None else
                                                  "; not in the intervals"))
    result["settings"]["family"] = {
        **family, "alpha": alpha,
        "method": f"Bonferroni: each of the m = {family['m']} verdict-making tests (rows = matched cells x metrics, "
                  f"plus the applicable `expect` claims) at alpha / m = {family['alpha_each']:.3g}, so that the chance "
                  f"of any false regression or 'not met' in this gate is at most alpha = {alpha}"}
    if expects:
        exp = judge_claims(cand, expects, alpha=family["alpha_each"], seed=seed, normalize=normalize)
        result["expectations"] = exp
        outcome = gate_outcome([r["verdict"] for r in result["rows"]], [e["result"] for e in exp])
        result["verdict"], result["exit_code"] = outcome.verdict, outcome.exit_code
        if any(e["result"] == "not met" for e in exp):
            result["notes"].append("claim(s) of the matrix `expect` block not met: " +
                                   "; ".join(e["claim"] for e in exp if e["result"] == "not met"))
    out = Path(out) if out is not None else sweep / "gate"
    md = render_markdown(result)
    md_path, json_path = out / "gate.md", out / "gate.json"
    atomic_write_text(md_path, md)
    atomic_write_json(json_path, result)
    result["files"] = [str(md_path), str(json_path)]
    err = append_step_summary(md + "\n")
    if err is not None:
        result.setdefault("warnings", []).append(f"$GITHUB_STEP_SUMMARY not written: {err}")
    if tracking_uri:
        warn = _log_mlflow(result, tracking_uri, [md_path, json_path])
        if warn:
            result.setdefault("warnings", []).append(warn)
        else:
            atomic_write_json(json_path, result)
    return result
