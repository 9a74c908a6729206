"""Operator categories: time per category of each profiled step, from every format the harness reads.

:func:`categorize` names the category of one operator or kernel from its name, its type (Ascend ``Type`` /
``OP Type``; a chrome trace event's ``cat``) and its core (Ascend ``Accelerator Core`` / ``Core Type``). The
rules are data (:data:`BUILTIN_RULES`): ordered, the first match wins, regular expressions searched
case-insensitively in one field (``name``, ``type``, ``core``, or ``any``: name, then type). More rules are
added with :func:`register_category_rule` (before the built-ins with ``first=True``, else after them) or by an
installed package's entry points of group ``grpo_bench.op_categories`` (each a :class:`CategoryRules`, tried
before the built-ins); all are entries of the shared registry :data:`RULES`, whose ``builtin`` entry is
:data:`BUILTIN_RULES`; :func:`category_rules` is the lookup, read on every call. No rule matching: ``"other"``.

Categories (:data:`CATEGORIES`): ``matmul`` (GEMM, batched / grouped matmul, convolution), ``attention``,
``normalization``, ``rotary`` (RoPE, MRoPE), ``elementwise`` (arithmetic, activations, casts, fills,
reductions, softmax, optimizer foreach ops), ``copy`` (copy / view / transpose: Ascend ``ViewCopy``,
``TransData``, ``Transpose``; ``aten::copy_``, ``contiguous``, reshapes), ``ai_cpu`` (an Ascend task on the
AI_CPU core, whatever its name), ``communication`` (NCCL / HCCL / gloo collectives: allreduce, allgather,
reduce_scatter, broadcast, all-to-all, send/recv, ``hcom_*``; a fused matmul+collective such as MC2's
``MatmulAllReduce`` counts here), ``memcpy`` (memory copies and sets: ``gpu_memcpy`` / ``gpu_memset`` events,
``MEMCPY_ASYNC`` tasks), ``other``.

Time per category (all in microseconds):

* ``kernel_details.csv`` (:func:`kernel_details_categories`): per ``Step Id``, the summed ``Duration(us)`` of
  the rows of each category (``Name``, ``Type``, ``Accelerator Core``).
* ``op_statistic.csv`` (:func:`op_statistic_categories`): the whole profile (the file has no step column):
  summed ``Total Time(us)`` per category of ``OP Type`` / ``Core Type``.
* chrome traces, torch/Kineto or Ascend ``trace_view.json`` (:func:`trace_categories`): per ``ProfilerStep#N``
  window, the device events' durations (``kernel``, ``gpu_memcpy``, ``gpu_memset``) by category; a trace with
  no device event (CPU only) gives the ``cpu_op`` self times instead. An event counts in the window holding its
  start (as the top operators, :mod:`bench.measure.trace_ops`).

Phase: :func:`phase_of` maps a verl role folder or trace file name to ``rollout`` or ``training``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ijson
import numpy as np

from bench.core.plugins import Registry
from bench.measure._common import MeasureError, read_csv_rows
from bench.measure.ascend_step_trace import int_or_none
from bench.measure.chrome_trace import DEVICE_CATEGORIES, STEP_RE, event_number, hashable, iter_trace_events
from bench.measure.trace_ops import self_times

CATEGORIES = ("matmul", "attention", "normalization", "rotary", "elementwise", "copy", "ai_cpu",
              "communication", "memcpy", "other")
FIELDS = ("name", "type", "core", "any")
ENTRY_POINT_GROUP = "grpo_bench.op_categories"


@dataclass(frozen=True)
class CategoryRule:
    """One rule: ``pattern`` (a regular expression, searched case-insensitively) in ``field`` of an operator
    (``name``, ``type``, ``core``, ``any`` = name or type) gives ``category``."""

    category: str
    pattern: str
    field: str = "any"
    regex: re.Pattern = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.field not in FIELDS:
            raise ValueError(f"CategoryRule.field must be one of {FIELDS}, not {self.field!r}")
        object.__setattr__(self, "regex", re.compile(self.pattern, re.IGNORECASE))

    def matches(self, name: str, op_type: str, core: str) -> bool:
        """Whether the rule's pattern is found in its field."""
        if self.field == "name":
            return bool(self.regex.search(name))
        if self.field == "type":
            return bool(self.regex.search(op_type))
        if self.field == "core":
            return bool(self.regex.search(core))
        return bool(self.regex.search(name) or self.regex.search(op_type))


_R = CategoryRule
#: the built-in rules, in order (first match wins)
BUILTIN_RULES: tuple[CategoryRule, ...] = (
    _R("communication", r"^(nccl|hccl|hcom_|lccl|gloo|c10d::|record_param_comms)|nccl:|gloo:"
                        r"|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all"
                        r"|^(hcom_)?broadcast_?$|(^|_|::)(i?send|i?recv|sendrecv|batch_isend_irecv)(_|$)"),
    _R("communication", r"^(hccl|communication)$", "core"),
    _R("ai_cpu", r"^ai_cpu$", "core"),
    _R("memcpy", r"^gpu_mem(cpy|set)$", "type"),
    _R("memcpy", r"memcpy|memset|^mem_?copy"),
    _R("attention", r"attention|attn|flash_?(fwd|bwd)|fmha|scaled_dot_product|sdpa"),
    _R("rotary", r"rotary|mrope|(^|[^a-z])rope|rope([^a-z]|$|with)|interleaverope"),
    _R("normalization", r"rms_?norm|layer_?norm|group_?norm|batch_?norm|instance_?norm"),
    _R("matmul", r"matmul|gemm|gemv|cublas|cutlass|xmma|cijk_|(^|::|_)(mm|bmm|addmm|addmv|baddbmm|linear|einsum)(_|$)"
                 r"|(^|[^a-z])conv"),
    _R("copy", r"viewcopy|transdata|transpose|permute|contiguous|copy|as_?strided|(^|::)(view|reshape|t|expand"
               r"|unsqueeze|squeeze|slice|narrow|index_select|cat|stack|split|chunk|flatten|unflatten|clone"
               r"|broadcast_tensors)(_|$)|broadcastto|stridedslice|concat|reshape|identity"),
    _R("elementwise", r"elementwise|vectorized|(^|::|_)(add|adds|sub|mul|muls|div|realdiv|neg|abs|exp|log|pow|sqrt"
                      r"|rsqrt|reciprocal|silu|swish|swiglu|gelu|relu|sigmoid|tanh|cast|fill|zero|zeros|ones"
                      r"|where|select|maximum|minimum|clamp|less|greater|equal|logical|softmax|log_softmax"
                      r"|sum|mean|max|min|reduce|cumsum|argmax|dropout|masked_fill|lerp|addcmul|addcdiv)"
                      r"|^(add|sub|mul|div|cast|fill|reduce|softmax|silu|swiglu|gelu)|foreach|reduce_kernel"
                      r"|reducesum|reducemean|reducemax|softmaxv2|zeroslike|oneslike|adam|swiglu|silu|gelu"),
)
del _R

#: where a set of rules is tried, in this order (first match wins)
PLACES = ("first", "plugin", "builtin", "last")


@dataclass(frozen=True)
class CategoryRules:
    """A named, ordered set of :class:`CategoryRule`, an entry of :data:`RULES`.

    Attributes:
        name: the registry name (a plugin's entry-point name, ``builtin`` for :data:`BUILTIN_RULES`).
        rules: the rules, in the order they are tried.
        place: where the set is tried (:data:`PLACES`): ``first`` (registered to override everything),
            ``plugin`` (an installed package's entry point: before the built-ins), ``builtin``, ``last`` (only what
            the others leave).
    """

    name: str
    rules: tuple[CategoryRule, ...]
    place: str = "plugin"


def _is_rules(obj: Any) -> None:
    if not isinstance(obj, CategoryRules) or obj.place not in PLACES:
        raise ValueError(f"not a CategoryRules(name, rules, place in {PLACES}): {obj!r}")
    for rule in obj.rules:
        if not isinstance(rule, CategoryRule) or rule.category not in CATEGORIES:
            raise ValueError(f"unknown category {getattr(rule, 'category', rule)!r}; one of {CATEGORIES}")


#: the built-in rules as the registry's ``builtin`` entry (entry point of ``grpo_bench.op_categories``)
BUILTIN = CategoryRules("builtin", BUILTIN_RULES, "builtin")
#: the category rule sets, name -> :class:`CategoryRules` (entry-point group ``grpo_bench.op_categories``, then
#: :func:`register_category_rule`): the shared :class:`bench.core.plugins.Registry`, like engines and readers
RULES: Registry[CategoryRules] = Registry(ENTRY_POINT_GROUP, "category rules", lambda r: r.name, instantiate=False,
                                          check=_is_rules)


def register_category_rule(rule: CategoryRule, *, first: bool = False) -> CategoryRule:
    """Add ``rule`` to :data:`RULES`: before every other rule with ``first=True`` (to override them), else
    after them (for names no other rule matches). Returns ``rule``.

    Raises:
        ValueError: ``rule.category`` is not one of :data:`CATEGORIES`.
    """
    RULES.register(CategoryRules(f"registered-{id(rule)}", (rule,), "first" if first else "last"))
    return rule


def unregister_category_rule(rule: CategoryRule) -> None:
    """Remove a rule added by :func:`register_category_rule` (no error when absent)."""
    for name, entry in list(RULES.items().items()):
        if len(entry.rules) == 1 and entry.rules[0] is rule and name.startswith("registered-"):
            RULES.unregister(name)


def category_rules() -> list[CategoryRule]:
    """The rules in the order they are tried: the sets of :data:`RULES` by :data:`PLACES` (registered ``first``
    ones, the entry points of installed packages, :data:`BUILTIN_RULES`, then the other registered ones), each
    place in registry order."""
    sets = list(RULES.items().values())
    return [rule for place in PLACES for entry in sets if entry.place == place for rule in entry.rules]


def categorize(name: str, *, op_type: str | None = None, core: str | None = None,
               rules: list[CategoryRule] | None = None) -> str:
    """The category (one of :data:`CATEGORIES`) of an operator or kernel: the first rule of ``rules``
    (default :func:`category_rules`) that matches ``name``, ``op_type`` (Ascend ``Type`` / ``OP Type``, a
    trace event's ``cat``) or ``core`` (Ascend ``Accelerator Core`` / ``Core Type``); ``"other"`` when none."""
    n, t, c = (name or "").strip(), (op_type or "").strip(), (core or "").strip()
    for rule in category_rules() if rules is None else rules:
        if rule.matches(n, t, c):
            return rule.category
    return "other"


def categorizer():
    """A memoized ``(name, op_type) -> category`` over the rules of this moment (:func:`category_rules` read
    once): for the many events of one file."""
    rules, memo = category_rules(), {}

    def cat_of(name: str, op_type: str | None = None) -> str:
        key = (name, op_type)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = categorize(name, op_type=op_type, rules=rules)
        return hit

    return cat_of


def phase_of(label: str) -> str | None:
    """``"training"`` or ``"rollout"`` for a verl role folder or trace file name (``actor_update``,
    ``ref_compute_log_prob``, ``actor-rollout_train_step2_...`` -> training; ``rollout``, ``generate_sequences``
    -> rollout); ``None`` when the label names neither."""
    low = label.lower()
    if re.search(r"update|train|log_prob|(^|[^a-z])ref([^a-z]|$)|critic", low):
        return "training"
    if re.search(r"rollout|generat|(^|[^a-z])gen([^a-z]|$)", low):
        return "rollout"
    return None


def _empty() -> dict[str, float]:
    return {c: 0.0 for c in CATEGORIES}


def _shares(times: dict[str, float]) -> dict[str, float | None]:
    total = sum(times.values())
    return {c: (v / total if total > 0 else None) for c, v in times.items()}


def _cell(rec: list[str], i: int | None) -> str:
    return rec[i].strip() if i is not None and i < len(rec) else ""


def _float(text: str) -> float | None:
    try:
        f = float(text)
    except ValueError:
        return None
    return f if np.isfinite(f) and f >= 0 else None


def kernel_details_categories(path: str | os.PathLike) -> dict[str, Any]:
    """Time per category of each step of one ``kernel_details.csv`` (columns ``Step Id`` (optional), ``Name``,
    ``Type``, ``Accelerator Core``, ``Duration(us)``).

    Returns ``{"path", "rows", "bad_rows", "steps": [{"step": int | None, "total_us", "category_us":
    {category: us}, "share": {category: time / total}}]}``, steps in order (``None``: no step, last). Rows
    without a name or a finite duration >= 0 count in ``bad_rows``. Raises :class:`MeasureError` when the file
    cannot be read or lacks ``Name`` / ``Duration(us)``.
    """
    p = Path(path)
    header, rows = read_csv_rows(p, ("Name", "Duration(us)"), "kernel_details.csv")
    col = {h: i for i, h in enumerate(header)}
    i_step, i_type, i_core = col.get("Step Id"), col.get("Type"), col.get("Accelerator Core")
    acc: dict[int | None, dict[str, float]] = {}
    memo: dict[tuple[str, str, str], str] = {}
    rules = category_rules()
    bad = 0
    for rec in rows:
        name, dur = _cell(rec, col["Name"]), _float(_cell(rec, col["Duration(us)"]))
        if not name or dur is None:
            bad += 1
            continue
        key = (name, _cell(rec, i_type), _cell(rec, i_core))
        cat = memo.get(key) or memo.setdefault(key, categorize(key[0], op_type=key[1], core=key[2], rules=rules))
        slot = acc.setdefault(int_or_none(_cell(rec, i_step)) if i_step is not None else None, _empty())
        slot[cat] += dur
    keys = sorted(k for k in acc if k is not None) + ([None] if None in acc else [])
    steps = [{"step": k, "total_us": sum(acc[k].values()), "category_us": acc[k], "share": _shares(acc[k])}
             for k in keys]
    return {"path": str(p), "rows": len(rows), "bad_rows": bad, "steps": steps}


def op_statistic_categories(path: str | os.PathLike) -> dict[str, Any]:
    """Time per category of one ``op_statistic.csv`` (``Device_id, OP Type, Core Type, Count, Total Time(us),
    Min Time(us), Avg Time(us), Max Time(us), Ratio(%)``; the whole profile, no steps).

    Returns ``{"path", "rows", "bad_rows", "total_us", "category_us", "share", "count": {category: calls}}``.
    Raises :class:`MeasureError` when the file cannot be read or lacks ``OP Type`` / ``Total Time(us)``.
    """
    p = Path(path)
    header, rows = read_csv_rows(p, ("OP Type", "Total Time(us)"), "op_statistic.csv")
    col = {h: i for i, h in enumerate(header)}
    times, counts = _empty(), {c: 0 for c in CATEGORIES}
    rules = category_rules()
    bad = 0
    for rec in rows:
        op, total = _cell(rec, col["OP Type"]), _float(_cell(rec, col["Total Time(us)"]))
        if not op or total is None:
            bad += 1
            continue
        cat = categorize(op, op_type=op, core=_cell(rec, col.get("Core Type")), rules=rules)
        times[cat] += total
        counts[cat] += int_or_none(_cell(rec, col.get("Count"))) or 0
    return {"path": str(p), "rows": len(rows), "bad_rows": bad, "total_us": sum(times.values()),
            "category_us": times, "share": _shares(times), "count": counts}


def read_trace_events(path: str | os.PathLike) -> dict[str, Any]:
    """The events of one chrome trace the categories and the overlap need, streamed once
    (:func:`bench.measure.chrome_trace.iter_trace_events`): ``windows`` ``[(step, start us, end us)]`` of the
    ``ProfilerStep#N`` events (category ``user_annotation`` or ``cpu_op``), ``device`` ``[(start us, dur us,
    name, cat, stream)]``, ``cpu`` ``{(pid, tid): [(start us, dur us, name)]}`` of the ``cpu_op`` events, and
    ``warnings`` (a file cut short: the events before the cut count, as in the Free ratio's parser). Memory: these
    lists, O(events). Raises :class:`MeasureError` when the file cannot be read as a trace."""
    windows: list[tuple[int, float, float]] = []
    device: list[tuple[float, float, str, str, Any]] = []
    cpu: dict[tuple, list[tuple[float, float, str]]] = {}
    warnings: list[str] = []
    try:
        for ev in iter_trace_events(path):
            if not isinstance(ev, dict) or ev.get("ph") != "X":
                continue
            ts, dur, name, cat = event_number(ev.get("ts")), event_number(ev.get("dur")), ev.get("name"), ev.get("cat")
            if ts is None or dur is None or dur < 0 or not isinstance(name, str):
                continue
            m = STEP_RE.match(name)
            if m and cat in ("user_annotation", "cpu_op"):
                windows.append((int(m.group(1)), ts, ts + dur))
            elif cat in DEVICE_CATEGORIES:
                args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
                device.append((ts, dur, name, cat, hashable(args.get("stream", ev.get("tid")))))
            elif cat == "cpu_op":
                cpu.setdefault((hashable(ev.get("pid")), hashable(ev.get("tid"))), []).append((ts, dur, name))
    except (ijson.JSONError, EOFError) as exc:  # cut short (a killed run): what was read counts
        if not (windows or device or cpu):
            raise MeasureError(f"{path}: not a readable trace: {exc}") from exc
        warnings.append(f"trace cut short; read what was there ({type(exc).__name__})")
    except (OSError, ValueError) as exc:
        raise MeasureError(f"{path}: cannot read trace: {exc}") from exc
    return {"windows": sorted(windows), "device": device, "cpu": cpu, "warnings": warnings}


def _window_index(ts: float, windows: list[tuple[int, float, float]]) -> int | None:
    for i, (_, lo, hi) in enumerate(windows):
        if lo <= ts < hi:
            return i
    return None


def trace_categories(path: str | os.PathLike, events: dict[str, Any] | None = None) -> dict[str, Any]:
    """Time per category of each ``ProfilerStep#N`` window of one chrome trace (torch/Kineto, Ascend
    ``trace_view.json``): device events' durations when the trace has any (``basis`` ``"device"``), else the
    ``cpu_op`` self times (``"cpu"``). ``events``: :func:`read_trace_events` of the file, when read already.

    Returns ``{"path", "basis", "steps": [{"step", "window_us", "total_us", "category_us", "share"}], "warnings"}`` (one
    entry with ``step`` and ``window_us`` ``None`` when the trace has no windows; events outside every window
    are left out).
    """
    ev = read_trace_events(path) if events is None else events
    windows = ev["windows"] or [(None, -np.inf, np.inf)]
    acc = [_empty() for _ in windows]
    basis = "device" if ev["device"] else "cpu"
    items: list[tuple[float, float, str, str]] = []
    if ev["device"]:
        items = [(ts, dur, name, cat) for ts, dur, name, cat, _ in ev["device"]]
    else:
        for ops in ev["cpu"].values():
            ts = np.array([o[0] for o in ops], dtype=np.float64)
            dur = np.array([o[1] for o in ops], dtype=np.float64)
            order, own = self_times(ts, dur)
            idx = range(len(ops)) if order is None else order.tolist()
            items.extend((ops[i][0], max(0.0, float(t)), ops[i][2], "cpu_op") for i, t in zip(idx, own.tolist()))
    cat_of = categorizer()
    for ts, dur, name, cat in items:
        w = _window_index(ts, windows)
        if w is not None:
            acc[w][cat_of(name, cat)] += dur
    steps = [{"step": s, "window_us": None if s is None else hi - lo, "total_us": sum(a.values()),
              "category_us": a, "share": _shares(a)} for (s, lo, hi), a in zip(windows, acc)]
    return {"path": str(path), "basis": basis, "steps": steps, "warnings": list(ev.get("warnings") or [])}
