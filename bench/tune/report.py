"""Outputs of a tune: the best limits as verl overrides and as a matrix fragment, parameter importance,
a trials table and a plot of the objective against each limit.

Everything here reads a finished (or partly finished) Optuna study; nothing runs.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

import yaml

from bench.core.files import atomic_write_json, atomic_write_text
from bench.tune.space import PARAMS, IntDim

CONSTRAINT = "infeasible"  # name of the Optuna constraint (> 0 = infeasible)


def is_infeasible(t: Any) -> bool:
    """A finished trial recorded as infeasible (constraint > 0)."""
    return any(v > 0 for v in t.constraints.values())


def is_interrupted(t: Any) -> bool:
    """A FAIL trial the harness did not finish: stopped by Ctrl-C (``interrupted`` attribute) or left RUNNING
    by a killed harness and failed on resume (no ``failure_kind``: every judged failure sets one)."""
    import optuna

    return t.state == optuna.trial.TrialState.FAIL and bool(t.user_attrs.get("interrupted")
                                                           or "failure_kind" not in t.user_attrs)


def trial_kind(t: Any) -> str:
    """``feasible`` (complete), ``infeasible`` (constraint > 0), ``failed``, ``interrupted`` or ``running``."""
    import optuna

    if t.state == optuna.trial.TrialState.COMPLETE and not is_infeasible(t):
        return "feasible"
    if is_infeasible(t):
        return "infeasible"
    if t.state == optuna.trial.TrialState.FAIL:
        return "interrupted" if is_interrupted(t) else "failed"
    return t.state.name.lower()


def best_trial(study: Any) -> Any | None:
    """The best feasible trial, or ``None`` when no feasible trial completed."""
    try:
        best = study.best_trial
    except ValueError:
        return None
    return None if is_infeasible(best) else best


def verl_overrides(limits: dict[str, int]) -> list[str]:
    """Hydra overrides for ``verl.trainer.main_ppo`` that set dynamic bsz with these limits."""
    ppo, lp = limits["ppo_max_token_len_per_gpu"], limits["log_prob_max_token_len_per_gpu"]
    return [
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={ppo}",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=true",
        f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={lp}",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
        f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={lp}",
    ]


def matrix_fragment(limits: dict[str, int], header: str) -> str:
    """A YAML fragment to paste into a matrix (``base`` limits, dynamic bsz on)."""
    lines = [f"# {ln}" for ln in header.splitlines()]
    lines += ["base:", *[f"  {PARAMS[k]}: {int(v)}" for k, v in limits.items()], "factors:", "  dynamic_bsz: [on]"]
    text = "\n".join(lines) + "\n"
    assert yaml.safe_load(text)["base"] == {PARAMS[k]: int(v) for k, v in limits.items()}
    return text


def importance(study: Any) -> tuple[dict[str, float] | None, str]:
    """Parameter importance (fANOVA over feasible complete trials) and a note when not computable."""
    import optuna

    feasible = [t for t in study.get_trials(deepcopy=False, states=[optuna.trial.TrialState.COMPLETE])
                if not is_infeasible(t)]
    if len(feasible) < 2:
        return None, f"needs >= 2 feasible complete trials, have {len(feasible)}"
    if len({t.value for t in feasible}) < 2:
        return None, "every feasible trial has the same objective value"
    try:
        imp = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0), target=None
        )
    except (RuntimeError, ValueError, ZeroDivisionError) as exc:
        return None, f"not computable: {exc}"
    imp = {k: float(v) for k, v in imp.items() if v is not None and math.isfinite(v)}
    return (imp or None), ("" if imp else "not computable")


def trials_rows(study: Any, objective_key: str) -> list[dict[str, Any]]:
    """One row per trial: number, kind, state, limits, value (column ``objective_key``), raw value (the
    measured median, before speed normalization), whether normalized, constraint, reason, run folder."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        row = {
            "number": t.number,
            "kind": trial_kind(t),
            "state": t.state.name,
            **{k: t.params.get(k, t.user_attrs.get(k)) for k in PARAMS},
            objective_key: t.value if t.values else None,
            "raw_value": t.user_attrs.get("raw_value") if t.values else None,
            "normalized": t.user_attrs.get("normalized"),
            "constraint": t.constraints.get(CONSTRAINT) if t.constraints else None,
            "failure_kind": t.user_attrs.get("failure_kind", ""),
            "reason": t.user_attrs.get("reason")
            or ("the harness stopped during this trial" if is_interrupted(t) else ""),
            "run_dir": t.user_attrs.get("run_dir", ""),
        }
        rows.append(row)
    return rows


def write_trials_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    if not rows:
        atomic_write_text(path, "")
        return
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    atomic_write_text(path, buf.getvalue())


def plot(path: Path, rows: list[dict[str, Any]], space: dict[str, IntDim], objective: str, objective_key: str,
         unit: str, best_number: int | None, title: str, reference: dict[str, int] | None = None) -> Path:
    """PNG: the objective against each searched limit (feasible dots, best star, infeasible / failed marks)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    names = list(space) or list(PARAMS)
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4.2), squeeze=False)
    ok = [r for r in rows if r["kind"] == "feasible" and r[objective_key] is not None]
    vals = [r[objective_key] for r in ok]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    pad = (hi - lo) * 0.1 or abs(hi) * 0.05 or 1.0
    floor = lo - pad  # infeasible / failed trials have no value: drawn on a line below the data
    for ax, name in zip(axes[0], names):
        ax.scatter([r[name] for r in ok], vals, color="tab:blue", label="feasible", zorder=3)
        for kind, marker, color in (("infeasible", "x", "tab:red"), ("failed", "v", "tab:gray")):
            xs = [r[name] for r in rows if r["kind"] == kind and r[name] is not None]
            if xs:
                ax.scatter(xs, [floor] * len(xs), marker=marker, color=color, label=f"{kind} (no value)", zorder=3)
        best = [r for r in ok if r["number"] == best_number]
        if best:
            ax.scatter([best[0][name]], [best[0][objective_key]], marker="*", s=260, color="gold",
                       edgecolor="black", label="best", zorder=4)
        dim = space.get(name)
        if dim is not None and dim.log:
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        if dim is not None:
            margin = (dim.high / dim.low) ** 0.04 if dim.log else None
            ax.set_xlim(*((dim.low / margin, dim.high * margin) if margin else
                          (dim.low - 0.04 * (dim.high - dim.low) - 1, dim.high + 0.04 * (dim.high - dim.low) + 1)))
        if reference and name in reference:
            ax.axvline(reference[name], color="tab:green", ls=":", label="rule of thumb")
        ax.set_xlabel(f"{name} (tokens)")
        ax.set_ylabel(f"{objective} ({unit})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


def best_summary(study: Any, best: Any, rows: list[dict[str, Any]], objective_key: str, metric_name: str,
                 unit: str) -> dict[str, Any]:
    """The best trial in its units: ``value`` (the objective, named ``objective_name``), ``raw_value`` (its
    measured median, ``unit``), ``normalized`` and ``reference_probe_s`` (the study's reference probe time
    the value is expressed at), and a ``note`` when another feasible trial measured better on the clock
    (the normalized objective then ranks trials by the machine's speed as well: the note says by how much)."""
    out = {
        "trial": best.number,
        "value": best.value,
        "objective_name": metric_name,
        "raw_value": best.user_attrs.get("raw_value"),
        "normalized": bool(best.user_attrs.get("normalized")),
        "reference_probe_s": study.user_attrs.get("speed_probe_ref_s") if best.user_attrs.get("normalized") else None,
        "unit": unit,
        "note": "",
    }
    feas = [r for r in rows if r["kind"] == "feasible" and r.get("raw_value") is not None]
    if feas and out["raw_value"] is not None:
        sign = 1 if study.direction.name.lower() == "minimize" else -1
        raw_best = min(feas, key=lambda r: sign * r["raw_value"])
        if raw_best["number"] != best.number and sign * raw_best["raw_value"] < sign * out["raw_value"]:
            ranked = sorted(feas, key=lambda r: sign * r["raw_value"])
            place = 1 + [r["number"] for r in ranked].index(best.number)
            out["note"] = (
                f"trial {best.number} is best at the reference machine speed ({metric_name} {best.value:.4g} "
                f"{unit}) but measured {out['raw_value']:.4g} {unit}, place {place} of {len(ranked)} on the "
                f"clock; trial {raw_best['number']} measured best ({raw_best['raw_value']:.4g} {unit}) while the "
                "machine ran faster. The speed probe says the difference is the machine's, not the limits': "
                "rerun both to confirm before adopting either"
            )
    return out


def write_outputs(out_dir: Path, study: Any, *, space: dict[str, IntDim], objective: str, objective_key: str,
                  unit: str, limits_of_trial: Any, header: str, reference: dict[str, int] | None = None,
                  metric_name: str | None = None, confirmation: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write best.json, best_overrides.txt, best_fragment.yaml, importance.json, trials.csv and the plot.

    ``limits_of_trial(trial) -> {param: tokens}`` gives both limits of a trial. Returns a summary dict
    (``best``: None when no feasible trial; else :func:`best_summary` plus ``limits`` and ``run_dir``;
    ``confirmation``: the tune's confirmation, :mod:`bench.tune.confirm`, or None) with the paths written.
    """
    rows = trials_rows(study, objective_key)
    best = best_trial(study)
    imp, imp_note = importance(study)
    counts = {k: sum(r["kind"] == k for r in rows) for k in ("feasible", "infeasible", "failed", "interrupted")}
    summary: dict[str, Any] = {
        "study": study.study_name,
        "objective": objective,
        "direction": study.direction.name.lower(),
        "counts": counts,
        "importance": imp,
        "importance_note": imp_note,
        "best": None,
        "confirmation": confirmation,
        "files": {},
    }
    files: dict[str, Path] = {}
    if best is not None:
        limits = limits_of_trial(best)
        summary["best"] = {**best_summary(study, best, rows, objective_key, metric_name or objective, unit),
                           "limits": limits, "run_dir": best.user_attrs.get("run_dir")}
        b = summary["best"]
        hdr = f"{header}\nbest trial {best.number}: {b['objective_name']} = {best.value:.4g} {unit}"
        if b["raw_value"] is not None:
            hdr += f" (measured median {b['raw_value']:.4g} {unit})"
        files["overrides"] = out_dir / "best_overrides.txt"
        atomic_write_text(files["overrides"], "\n".join(verl_overrides(limits)) + "\n")
        files["fragment"] = out_dir / "best_fragment.yaml"
        atomic_write_text(files["fragment"], matrix_fragment(limits, hdr))
    files["importance"] = out_dir / "importance.json"
    atomic_write_json(files["importance"], {"importance": imp, "note": imp_note})
    files["trials"] = out_dir / "trials.csv"
    write_trials_csv(files["trials"], rows)
    files["plot"] = plot(out_dir / "objective_vs_limits.png", rows, space, objective, objective_key, unit,
                         best.number if best is not None else None, header.splitlines()[0], reference)
    summary["files"] = {k: str(v) for k, v in files.items()}
    files["best"] = out_dir / "best.json"
    atomic_write_json(files["best"], summary)
    summary["files"]["best"] = str(files["best"])
    summary["rows"] = rows
    return summary
