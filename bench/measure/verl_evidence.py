"""The evidence checks of the verl engine (``check(level, run)``, :mod:`bench.measure.evidence`).

A factor can be on in the launch and do nothing in the run (FSDP2 ignored ``forward_prefetch`` in verl
releases before PR 6317; a patch may be refused in the process that matters). The verdict of each factor
comes from what the run's own processes wrote:

- the patch reports ``<run>/patches/<role>-<host>-<pid>.json`` (``patches/bench_patches``): which patch
  was applied in which process, and the counters of ``verl_evidence`` (micro-batches per pass, FSDP2
  forward-prefetch calls, vLLM's resolved engine config);
- the config verl composed, ``<run>/hydra/.hydra/config.yaml`` (Hydra's own record of the job).

Verdicts: ``confirmed`` (the run shows the level's effect), ``missing`` (nothing in the run shows it:
a silent no-op, flagged), ``contradicted`` (the run shows the other level), ``n/a`` (the factor does
not apply here). Each comes with a one-line detail.
"""

from __future__ import annotations

from typing import Any

from bench.measure.evidence import (  # noqa: F401  (re-exported: where these lived before)
    HYDRA_CONFIG,
    VERDICTS,
    EvidenceCheck,
    FinishedRun,
    factor_evidence,
    flagged,
    load_config,
    load_reports,
)


def _select(cfg: dict[str, Any] | None, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _counter(reports: list[dict], group: str) -> dict[str, int]:
    total: dict[str, int] = {}
    for rep in reports:
        counters = ((rep.get("patches") or {}).get("verl_evidence") or {}).get("counters") or {}
        for k, v in (counters.get(group) or {}).items():
            if isinstance(v, (int, float)):
                total[k] = total.get(k, 0) + int(v)
    return total


def _applied(reports: list[dict], name: str, mode: str | None, where: str) -> int:
    """How many processes record an action of patch ``name`` (with ``mode``) on a module starting with
    ``where`` (``transformers.``: the actor/ref model; ``vllm.``: the rollout engine)."""
    n = 0
    for rep in reports:
        rec = (rep.get("patches") or {}).get(name) or {}
        if rec.get("status") != "applied" or (mode is not None and rec.get("mode") != mode):
            continue
        if any(str(a).startswith(where) for a in rec.get("actions") or []):
            n += 1
    return n


def _vllm_config(reports: list[dict]) -> dict[str, Any] | None:
    for rep in reports:
        counters = ((rep.get("patches") or {}).get("verl_evidence") or {}).get("counters") or {}
        if counters.get("vllm_config"):
            return counters["vllm_config"]
    return None


def dynamic_bsz(level: int, run: FinishedRun) -> tuple[str, str]:
    """Micro-batches per pass: token budget (``rearrange_micro_batches``) vs fixed size."""
    reports = run.reports
    dyn, fixed = _counter(reports, "dynamic_bsz"), _counter(reports, "fixed_bsz")
    want, other = (dyn, fixed) if level else (fixed, dyn)
    kind = "token-budget" if level else "fixed-size"
    if want.get("calls"):
        detail = (f"{want['calls']} passes split {want.get('sequences', 0)} sequences into "
                  f"{want.get('micro_batches', 0)} {kind} micro-batches")
        if other.get("calls"):
            return "contradicted", detail + f"; but {other['calls']} passes used the other mode"
        return "confirmed", detail
    if other.get("calls"):
        return (
            "contradicted",
            f"every pass ({other['calls']}) used {'fixed-size' if level else 'token-budget'} micro-batches",
        )
    return "missing", "no pass of verl's prepare_micro_batches was counted (verl_evidence patch not reached)"


def forward_prefetch(level: int, run: FinishedRun) -> tuple[str, str]:
    """FSDP2 ``set_modules_to_forward_prefetch`` calls (``apply_fsdp2`` honouring the setting)."""
    reports, cfg = run.reports, run.composed_config
    c = _counter(reports, "forward_prefetch")
    strategy = _select(cfg, "actor_rollout_ref.actor.strategy")
    if level:
        if c.get("calls"):
            return "confirmed", (f"FSDP2 forward prefetch set on {c['calls']} modules "
                                 f"({c.get('modules', 0)} targets), strategy {strategy}")
        if strategy == "fsdp":
            return "confirmed", "strategy fsdp: FSDP1 takes forward_prefetch as a constructor argument"
        return "missing", (f"fsdp_config.forward_prefetch=true but no FSDP2 module had forward prefetch set "
                           f"(strategy {strategy}): the factor did nothing in this run")
    if c.get("calls"):
        return "contradicted", f"forward prefetch set on {c['calls']} modules although the level is off"
    return "confirmed", "no FSDP module had forward prefetch set"


def graph_mode(level: int, run: FinishedRun) -> tuple[str, str]:
    """vLLM's resolved ``enforce_eager`` / compilation mode, else verl's composed rollout config."""
    reports, cfg = run.reports, run.composed_config
    vc = _vllm_config(reports)
    want_eager = not level
    if vc is not None and vc.get("enforce_eager") is not None:
        detail = f"vLLM engine: enforce_eager={vc['enforce_eager']}, compilation {vc.get('compilation_mode')}"
        return ("confirmed" if bool(vc["enforce_eager"]) == want_eager else "contradicted"), detail
    eager = _select(cfg, "actor_rollout_ref.rollout.enforce_eager")
    if eager is None:
        return "missing", "neither vLLM's engine config nor verl's composed config was recorded"
    verdict = "confirmed" if bool(eager) == want_eager else "contradicted"
    return verdict, f"verl config rollout.enforce_eager={eager} (vLLM's own config not recorded)"


#: the text between a RMSNorm class and its state in ``qwen3vl_npu_fused``'s state actions
#: (``transformers.models.<...>.Qwen3VLTextRMSNorm.forward: eager (after verl NPU_PATCHES['qwen3_vl'])``)
RMS_STATE_SEP = ".forward: "


def _last_rms_states(reports: list[dict], name: str) -> list[str]:
    """Per process whose patch ``name`` recorded RMSNorm states, the last one (what that process ran last):
    ``eager``, ``fused torch_npu.npu_rms_norm`` or ``other <qualname>``."""
    out = []
    for rep in reports:
        actions = [str(a) for a in ((rep.get("patches") or {}).get(name) or {}).get("actions") or []]
        states = [a.split(RMS_STATE_SEP, 1)[1].rsplit(" (", 1)[0] for a in actions
                  if a.startswith("transformers.") and "RMSNorm" + RMS_STATE_SEP in a]
        if states:
            out.append(states[-1])
    return out


def _qwen3vl_rmsnorm(level: int, reports: list[dict]) -> tuple[str, str] | None:
    """``qwen3vl_npu_fused``'s verdict from the RMSNorm state each training process ran last (``None``: the patch
    recorded no state, e.g. a report from before states were recorded)."""
    states = _last_rms_states(reports, "qwen3vl_npu_fused")
    if not states:
        return None
    want = "fused" if level else "eager"
    good = sum(st.startswith(want) for st in states)
    undone = sum(any(str(a).startswith("restored eager") and "Qwen3VLTextRMSNorm" in str(a) for a in
                     ((r.get("patches") or {}).get("qwen3vl_npu_fused") or {}).get("actions") or []) for r in reports)
    other = sorted({st for st in states if not st.startswith(want)})
    detail = (f"qwen3vl_npu_fused:{'on' if level else 'off'}: Qwen3-VL RMSNorm forward {want} at the end in {good} of "
              f"{len(states)} training (actor/ref) process(es)")
    if not level:
        detail += f"; verl's own NPU RMSNorm patch undone in {undone}"
    if other:
        return "contradicted", f"{detail}; the others ran {', '.join(other)[:200]}"
    return "confirmed", detail


def rmsnorm_fused(level: int, run: FinishedRun) -> tuple[str, str]:
    """The RMSNorm patch of the platform applied in the training processes (and vLLM's, where present); for
    ``qwen3vl_npu_fused`` (verl on an NPU), the RMSNorm forward each training process ran last, eager or fused,
    however verl patched it (:func:`_qwen3vl_rmsnorm`)."""
    reports, cfg = run.reports, run.composed_config
    mode = "on" if level else "off"
    for name in ("cpu_rmsnorm", "qwen3vl_npu_fused"):
        if not any(f"{name}:{mode}" in (r.get("requested") or []) for r in reports):
            continue
        if name == "qwen3vl_npu_fused" and (judged := _qwen3vl_rmsnorm(level, reports)) is not None:
            return judged
        training = _applied(reports, name, mode, "transformers.")
        rollout = _applied(reports, name, mode, "vllm.")
        where = f"{name}:{mode} in {training} training process(es), {rollout} vLLM process(es)"
        if training:
            return "confirmed", where
        states = [((r.get("patches") or {}).get(name) or {}) for r in reports]
        refused = [st.get("reason", "") for st in states if st.get("status") in ("refused", "error")]
        armed = sum(st.get("status") == "armed" for st in states)
        why = f"; refused: {refused[0][:160]}" if refused else (
            f"; armed in {armed} process(es) but its target module was never imported" if armed else "")
        return "missing", f"{where}: the actor/ref model was never patched{why}"
    liger = _select(cfg, "actor_rollout_ref.model.use_liger")
    if liger is not None:
        return ("confirmed" if bool(liger) == bool(level) else "contradicted"), f"verl config model.use_liger={liger}"
    return "missing", "no RMSNorm patch report and no use_liger in the composed config"


#: The MRoPE patches and the names of their counters: (per-forward computations, cache hits).
MROPE_PATCHES = {"vllm_mrope_cache": ("forwards", "hits"), "vllm_ascend_mrope_cache": ("computed", "reused")}


def mrope_cache(level: int, run: FinishedRun) -> tuple[str, str]:
    """The MRoPE patch's counters in the vLLM processes: cos/sin computations (one per forward) and the
    layers that reused them (cache hits; ``off`` counts vLLM's own per-layer computation, no hits)."""
    reports = run.reports
    for name, (computed_key, hits_key) in MROPE_PATCHES.items():
        states = [((r.get("patches") or {}).get(name) or {}) for r in reports]
        if not any(st for st in states):
            continue
        counted = [st["counters"] for st in states if (st.get("counters") or {}).get(computed_key)]
        forwards = sum(int(c.get(computed_key, 0)) for c in counted)
        hits = sum(int(c.get(hits_key, 0)) for c in counted)
        calls = sum(int(c.get("layer_calls", 0)) for c in counted) or forwards + hits
        where = (f"{name}: {forwards} forwards, {hits} of {calls} layer calls reused the forward's cos/sin, "
                 f"in {len(counted)} vLLM process(es)")
        if counted and level:
            return ("confirmed" if hits else "missing"), where + ("" if hits else ": no layer reused them")
        if counted:
            return ("contradicted" if hits else "confirmed"), where + (": vLLM's own MRoPE in every layer"
                                                                       if not hits else "")
        refused = [st.get("reason", "") for st in states if st.get("status") in ("refused", "error")]
        vc = _vllm_config(reports) or {}
        why = (f"{name} refused: {refused[0][:160]}" if refused else
               f"vLLM compiled the model ({vc.get('compilation_mode')}): the compiled graph runs vLLM's own MRoPE"
               if vc.get("enforce_eager") is False else "the model has no MRoPE or no forward ran")
        # nothing cached: what the off level asks; the on level did nothing
        return ("missing" if level else "confirmed"), f"no MRoPE forward counted by {name}: {why}"
    if not level:
        return "confirmed", "no MRoPE cache patch requested"
    return "missing", "no MRoPE cache patch report in the run"



#: the checks of this module on verl, every platform (entry points of ``grpo_bench.evidence_checks``)
DYNAMIC_BSZ = EvidenceCheck("dynamic_bsz", "verl:*", dynamic_bsz)
FORWARD_PREFETCH = EvidenceCheck("forward_prefetch", "verl:*", forward_prefetch)
GRAPH_MODE = EvidenceCheck("graph_mode", "verl:*", graph_mode)
RMSNORM_FUSED = EvidenceCheck("rmsnorm_fused", "verl:*", rmsnorm_fused)
MROPE_CACHE = EvidenceCheck("mrope_cache", "verl:*", mrope_cache)
