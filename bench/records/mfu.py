"""MFU and tokens/s per device, per phase of a GRPO step, against the device's peak: one function,
:func:`phase_perf`, for a run; :func:`cell_phase_perf` for a cell (the report, the sweep summary and MLflow read
these two, never their own arithmetic).

Per timed step ``s`` and phase ``p`` (``gen``, ``old_log_prob``, ``ref``, ``update_actor``; verl's
``timing_s/<p>``, seconds):

* ``tokens_per_s_per_device = perf/total_num_tokens / timing_s/<p> / n_devices`` (prompt + response tokens of
  the step's batch, as verl's ``perf/throughput`` counts them for the whole step);
* ``flops(p) = share(p) * F_train(s)``, ``F_train`` = one forward + backward pass over the batch by verl's
  FLOPs counter (:func:`bench.measure.flops.training_flops`: ``6 N tokens + 6 sum(len^2) d_head heads
  layers``); ``share = 1/3`` for the forward-only phases (generation, old log-prob, ref: the forward is 2 of
  the 6 FLOPs per parameter and token, Kaplan et al. 2020, and verl's attention term splits the same way) and
  ``share = ppo_epochs`` for ``update_actor``. Both as verl's own MFU: verl 0.9.1
  ``verl/workers/engine_workers.py`` (``_postprocess_output``: ``mfu /= 3.0`` when ``forward_only``, its
  ``perf/mfu/actor_infer`` of the old log-prob; the update runs its mini-batches over ``epochs`` passes), verl 0.6
  ``verl/workers/fsdp_workers.py`` (``update_actor``: ``estimated_flops * ppo_epochs``);
* ``mfu = flops(p) / timing_s/<p> / n_devices / peak`` (``peak``: FLOP/s of one device, :data:`PEAKS` or
  the CPU's measured matmul peak).

A run's value is the median over its timed steps (as every figure, :mod:`bench.measure.run_summary`); a cell's
the geometric mean over its ok runs (:func:`bench.records.figures.cell_value`). Generation is counted as one
forward over each full sequence (prefill + decode with a KV cache do that work once); its padding, the rollout
engine's own overheads and re-computed prefixes are not model FLOPs. On CPU the whole machine is one device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.measure._common import median
from bench.measure.evidence import FinishedRun, load_config
from bench.measure.flops import LEFT_OUT, flops_by_step, load_model_config
from bench.records.figures import cell_value

#: phase -> (verl timing metric, share of a training pass's FLOPs; update_actor: x ppo_epochs)
PHASE_FLOPS = {
    "gen": ("timing_s/gen", 1.0 / 3.0),
    "old_log_prob": ("timing_s/old_log_prob", 1.0 / 3.0),
    "ref": ("timing_s/ref", 1.0 / 3.0),
    "update_actor": ("timing_s/update_actor", 1.0),
}
TOKENS = "perf/total_num_tokens"
#: words for the phases, as the report prints them
PHASE_TITLES = {"gen": "rollout (generation)", "old_log_prob": "old log-prob", "ref": "ref log-prob",
                "update_actor": "update actor"}

#: Peak dense FLOP/s of one device, bf16 (no sparsity): name fragment -> (FLOP/s, dtype, source). Matched as
#: verl matches its own table: the first fragment (longest first) found in the device's name.
PEAKS: dict[str, tuple[float, str, str]] = {
    "H100 PCIe": (756e12, "bf16 dense", "NVIDIA H100 Tensor Core GPU datasheet (PCIe: 1,513 TFLOPS with sparsity)"),
    "H100": (989e12, "bf16 dense", "NVIDIA H100 Tensor Core GPU datasheet (SXM: 1,979 TFLOPS with sparsity); "
                                   "verl _DEVICE_FLOPS['H100']"),
    "H800": (989e12, "bf16 dense", "verl.utils.flops_counter._DEVICE_FLOPS['H800'] (verl 0.9.1)"),
    "H200": (989e12, "bf16 dense", "NVIDIA H200 Tensor Core GPU datasheet (1,979 TFLOPS with sparsity); "
                                   "verl _DEVICE_FLOPS['H200']"),
    "A100": (312e12, "bf16 dense", "NVIDIA A100 Tensor Core GPU datasheet (624 TFLOPS with sparsity); "
                                   "verl _DEVICE_FLOPS['A100']"),
    "A800": (312e12, "bf16 dense", "verl _DEVICE_FLOPS['A800'] (verl 0.9.1)"),
    "B200": (2.25e15, "bf16 dense", "verl _DEVICE_FLOPS['B200'] (verl 0.9.1)"),
    "L40S": (362.05e12, "bf16 dense", "NVIDIA L40S datasheet (733 TFLOPS with sparsity); verl _DEVICE_FLOPS"),
    "910B": (354e12, "bf16/fp16 dense", "Atlas 800T A2 (Ascend 910B): verl _DEVICE_FLOPS['910B'] (verl 0.9.1); "
                                        "Huawei publishes no per-variant bf16 figure checked here"),
    "Ascend910": (354e12, "bf16/fp16 dense", "verl _DEVICE_FLOPS['Ascend910'] (verl 0.9.1)"),
}
#: what a run without a known peak says
NO_PEAK = "no peak known"


def device_peak(device_name: str | None) -> dict[str, Any]:
    """The table's peak of a device by name (``torch.cuda.get_device_name()``, ``torch_npu``'s name):
    ``{"device", "peak_flops" (FLOP/s, None if unknown), "dtype", "source"}``; an unknown or missing name gives
    ``peak_flops None`` and ``source`` :data:`NO_PEAK` (never a guess)."""
    name = device_name or ""
    for key in sorted(PEAKS, key=len, reverse=True):
        if key and key in name:
            flops, dtype, source = PEAKS[key]
            return {"device": name, "peak_flops": flops, "dtype": dtype, "source": source}
    return {"device": name or None, "peak_flops": None, "dtype": None, "source": NO_PEAK}


def cpu_peak(measured: Mapping[str, Any] | None) -> dict[str, Any]:
    """The peak of a CPU machine from the harness's measured matmul peak
    (:func:`bench.execution.machine_probe.matmul_peak`): its fp32 figure (the CPU runs compute in float32);
    :data:`NO_PEAK` without a measurement."""
    if not measured or not measured.get("fp32_flops"):
        return {"device": "cpu", "peak_flops": None, "dtype": None, "source": NO_PEAK}
    return {"device": "cpu", "peak_flops": float(measured["fp32_flops"]), "dtype": "fp32",
            "source": f"measured: best of {measured.get('reps')} fp32 GEMMs {measured.get('size')}^3, "
                      f"{measured.get('threads')} threads, in the harness process"}


def phase_perf(by_step: Mapping[int, Mapping[str, Any]], steps: Sequence[int], train_flops: Mapping[int, float],
               *, n_devices: int, peak_flops: float | None, update_passes: float = 1.0) -> dict[str, dict[str, Any]]:
    """MFU and tokens/s per device of each phase of one run: the one function behind every such figure.

    Args:
        by_step: ``{step: {verl metric: value}}`` (``timing_s/<phase>`` s, ``perf/total_num_tokens`` tokens).
        steps: the timed steps (:func:`bench.measure.run_summary.timed_steps`).
        train_flops: ``{step: FLOPs of one forward + backward over the step's batch}``
            (:func:`bench.measure.flops.flops_by_step`); a step without it has tokens/s but no MFU.
        n_devices: devices the run used (its tokens and FLOPs are shared by them).
        peak_flops: peak FLOP/s of one device, or ``None`` (then ``mfu`` is ``None``).
        update_passes: passes of ``update_actor`` over the batch (verl ``ppo_epochs``).

    Returns ``{phase: {"seconds", "tokens_per_s_per_device", "flops" (per step, all devices),
    "flops_per_s_per_device", "mfu" (0..1), "steps"}}``, each the median over the steps that logged the phase
    (``None`` where not measurable); phases no step logged are left out. Formula and sources: module docstring.
    """
    if n_devices < 1:
        raise ValueError(f"n_devices {n_devices}: at least 1 expected")
    out: dict[str, dict[str, Any]] = {}
    for phase, (metric, share) in PHASE_FLOPS.items():
        secs, tps, flops, fps, mfu = [], [], [], [], []
        for s in steps:
            row = by_step.get(s) or {}
            t = row.get(metric)
            if not isinstance(t, (int, float)) or not t > 0:
                continue
            secs.append(float(t))
            tokens = row.get(TOKENS)
            if isinstance(tokens, (int, float)) and tokens > 0:
                tps.append(float(tokens) / t / n_devices)
            if s in train_flops:
                f = train_flops[s] * share * (update_passes if phase == "update_actor" else 1.0)
                flops.append(f)
                fps.append(f / t / n_devices)
                if peak_flops:
                    mfu.append(f / t / n_devices / peak_flops)
        if secs:
            out[phase] = {"seconds": median(secs), "tokens_per_s_per_device": median(tps), "flops": median(flops),
                          "flops_per_s_per_device": median(fps), "mfu": median(mfu), "steps": len(secs)}
    return out


def _n_devices(platform: str | None, composed: Mapping[str, Any] | None) -> int:
    if platform == "cpu" or not composed:
        return 1
    trainer = composed.get("trainer") or {}
    try:
        return max(1, int(trainer.get("n_gpus_per_node") or 1) * int(trainer.get("nnodes") or 1))
    except (TypeError, ValueError):
        return 1


def run_perf(run_dir: str | Path, record: Mapping[str, Any], machine_peak: Mapping[str, Any] | None = None
             ) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """A finished run's :func:`phase_perf` and the basis it stands on, from its folder and record.

    The model config comes from the run folder (:func:`bench.measure.flops.load_model_config`), the device from the
    run's ``evidence.json`` (``device_name``) or, on the ``cpu`` platform, ``machine_peak`` (the harness's
    measured matmul peak); devices and ``ppo_epochs`` from the config verl composed (1 without one). Returns
    ``(phase perf, basis)``; ``basis``: ``device``, ``peak_flops``, ``peak_dtype``, ``peak_source``,
    ``n_devices``, ``update_passes``, ``model_type``, ``flops_source``, ``left_out``. Never raises on a missing part.
    """
    composed = load_config(run_dir)
    platform = record.get("platform")
    if platform == "cpu":
        peak = cpu_peak(machine_peak)
    else:
        peak = device_peak(FinishedRun(Path(run_dir)).own_evidence.get("device_name"))
    model, source = load_model_config(run_dir, composed)
    by_step = {int(k): v for k, v in (record.get("steps") or {}).items()}
    steps = list((record.get("summary") or {}).get("timed_steps") or [])
    train = flops_by_step(model, {s: by_step[s] for s in steps if s in by_step}) if model else {}
    epochs = (((composed or {}).get("actor_rollout_ref") or {}).get("actor") or {}).get("ppo_epochs") or 1
    n_dev = _n_devices(platform, composed)
    perf = phase_perf(by_step, steps, train, n_devices=n_dev, peak_flops=peak["peak_flops"],
                      update_passes=float(epochs))
    basis = {"device": peak["device"], "peak_flops": peak["peak_flops"], "peak_dtype": peak["dtype"],
             "peak_source": peak["source"], "n_devices": n_dev, "update_passes": float(epochs),
             "model_type": (model or {}).get("model_type"),
             "flops_source": f"verl.utils.flops_counter ({source})" if train else
             (f"none: verl's counter has no estimate for {model.get('model_type')!r}" if model else f"none: {source}"),
             "left_out": list(LEFT_OUT)}
    return perf, basis


def cell_phase_perf(summaries: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """A cell's MFU and tokens/s per device per phase: per phase and figure, :func:`cell_value` (geometric mean)
    of its ok runs' :func:`phase_perf` values (``summaries``: the runs' record summaries, ``phase_perf`` key).
    Returns ``{phase: {"mfu", "tokens_per_s_per_device", "seconds"}}`` (phases no run has left out)."""
    out: dict[str, dict[str, float | None]] = {}
    for phase in PHASE_FLOPS:
        runs = [(s.get("phase_perf") or {}).get(phase) for s in summaries]
        runs = [r for r in runs if isinstance(r, Mapping)]
        if runs:
            out[phase] = {k: cell_value([r.get(k) for r in runs])
                          for k in ("mfu", "tokens_per_s_per_device", "seconds")}
    return out


def furthest_from_peak(perf: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The phase with the lowest MFU (furthest from the device's peak), or ``None`` without an MFU."""
    got = [(v["mfu"], p) for p, v in perf.items() if v.get("mfu") is not None]
    return min(got)[1] if got else None


def mlflow_metrics(perf: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """MLflow metric names of a run's or a cell's per-phase figures: ``perf/mfu/<phase>`` (0..1) and
    ``perf/tokens_per_s_per_device/<phase>``; figures that are ``None`` left out."""
    out = {}
    for phase, v in perf.items():
        if v.get("mfu") is not None:
            out[f"perf/mfu/{phase}"] = float(v["mfu"])
        if v.get("tokens_per_s_per_device") is not None:
            out[f"perf/tokens_per_s_per_device/{phase}"] = float(v["tokens_per_s_per_device"])
    return out


def markdown_lines(rows: Sequence[tuple[str, Mapping[str, Mapping[str, Any]]]], basis: Mapping[str, Any] | None
                   ) -> list[str]:
    """The "MFU per phase" section of ``report.md`` and ``summary.md``: one table row per cell (``rows``: ``(cell
    label, cell_phase_perf)``), MFU in % and tokens/s per device per phase, the phase furthest from the peak,
    and the peak's source (``basis``: a run's :func:`run_perf` basis). Empty when no cell has a figure."""
    if not any(perf for _, perf in rows):
        return []
    phases = [p for p in PHASE_FLOPS if any(p in perf for _, perf in rows)]
    head = " | ".join(f"{PHASE_TITLES[p]} MFU % | {PHASE_TITLES[p]} tokens/s/device" for p in phases)
    lines = ["", "## MFU and tokens/s per device, per phase", "",
             f"| cell | {head} | furthest from peak |", "|---" * (2 * len(phases) + 2) + "|"]
    for label, perf in rows:
        cells = []
        for p in phases:
            v = perf.get(p) or {}
            cells.append("-" if v.get("mfu") is None else f"{100 * v['mfu']:.3g}")
            cells.append("-" if v.get("tokens_per_s_per_device") is None else f"{v['tokens_per_s_per_device']:.4g}")
        far = furthest_from_peak(perf)
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {PHASE_TITLES.get(far, '-') if far else '-'} |")
    if basis:
        peak = basis.get("peak_flops")
        lines += ["", f"- device: {basis.get('device') or '-'} x {basis.get('n_devices')}; peak "
                  + (f"{peak / 1e12:.4g} TFLOP/s ({basis.get('peak_dtype')}; {basis.get('peak_source')})" if peak
                     else NO_PEAK),
                  f"- FLOPs: {basis.get('flops_source')}, model type {basis.get('model_type')}; forward-only phases "
                  "1/3 of a training pass, update_actor x ppo_epochs; left out: "
                  + ", ".join(basis.get("left_out") or []) + " (docs/mfu.md)"]
    return lines


def sweep_phase_perf(cells: Sequence[Any]) -> tuple[list[tuple[Any, dict[str, dict[str, float | None]]]],
                                                      dict[str, Any] | None]:
    """Per cell of a snapshot (:class:`bench.records.figures.CellResult`), :func:`cell_phase_perf` of its ok
    repeats; and the basis of the first ok run that has one (the sweep's device, peak and FLOPs source). Returns
    ``([(cell, perf)], basis or None)``."""
    out, basis = [], None
    for c in cells:
        summaries = [r.summary for r in c.ok_repeats()]
        out.append((c, cell_phase_perf(summaries)))
        if basis is None:
            basis = next((s["mfu_basis"] for s in summaries if isinstance(s.get("mfu_basis"), Mapping)), None)
    return out, basis
