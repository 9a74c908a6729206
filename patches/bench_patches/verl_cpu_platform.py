"""A CPU platform for verl, registered through verl's own plugin mechanism (verl >= 0.9).

verl 0.9 resolves its device through ``verl.plugin.platform`` (``PlatformRegistry.register``, selected by
``$VERL_PLATFORM``) and imports the modules named in ``$VERL_USE_EXTERNAL_MODULES`` in every process that
imports verl (``verl/__init__.py``). The ``verl:cpu`` target of the bench sets
``VERL_USE_EXTERNAL_MODULES=bench_patches.verl_cpu_platform`` and ``VERL_PLATFORM=cpu``, so this module
is imported, and :class:`PlatformCPU` registered, in the driver and in every Ray worker of the run.

What a CPU needs from a verl platform (verl ships ``nvidia``, ``npu``, ``rocm`` only):

- device name ``cpu`` and a *device module* (what ``get_torch_device()`` returns, ``torch.cuda`` on GPUs)
  whose streams, events, synchronize and cache calls are no-ops on the host; ``current_device()`` is
  ``"cpu"`` so ``tensor.to(get_device_id())`` stays on the host;
- the collective backend ``gloo`` (verl builds ``cpu:gloo,<device>:<backend>``; the duplicate that gives
  on a CPU is removed by the ``verl_cpu`` patch, see :mod:`bench_patches.verl_cpu`);
- Ray's logical ``GPU`` slots as the placement resource (the run starts Ray with ``num_gpus`` = ranks),
  so verl's resource pools work unchanged;
- no CUDA IPC: verl's vLLM weight transfer then goes through shared memory.

Memory figures: ``max_memory_allocated`` / ``max_memory_reserved`` report the process's peak resident
set (``getrusage(RUSAGE_SELF).ru_maxrss``, bytes), ``memory_allocated`` / ``memory_reserved`` the
current one; so verl's ``perf/max_memory_allocated_gb`` is the worker's peak host memory on CPU.
"""

from __future__ import annotations

import os
import resource
import sys
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

PLATFORM_NAME = "cpu"
_WARNED: set[str] = set()


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


class _NullStream:
    """A host "stream": everything runs in program order on the CPU."""

    def synchronize(self) -> None:
        return None

    def wait_stream(self, other: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> "_NullEvent":
        return _NullEvent()

    def query(self) -> bool:
        return True

    def __enter__(self) -> "_NullStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class _NullEvent:
    """A host "event": always complete."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: Any) -> float:
        return 0.0


class CPUDeviceModule(ModuleType):
    """What ``verl.utils.device.get_torch_device()`` returns on CPU (``torch.cuda``'s role).

    Defined calls mirror ``torch.cuda``'s signatures; memory calls report host RSS (bytes). Any other
    attribute resolves to ``torch.cpu``'s if it has one, else to a no-op returning ``None`` that prints
    one line naming the attribute (so a verl code path that expects more of a device shows in run.log).
    """

    Stream = _NullStream
    Event = _NullEvent

    def __init__(self) -> None:
        super().__init__("bench_verl_cpu_device")

    # device management
    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> str:
        return "cpu"

    def set_device(self, device: Any) -> None:
        return None

    def get_device_name(self, device: Any = None) -> str:
        return "cpu"

    def synchronize(self, device: Any = None) -> None:
        return None

    def current_stream(self, device: Any = None) -> _NullStream:
        return _NullStream()

    def default_stream(self, device: Any = None) -> _NullStream:
        return _NullStream()

    @contextmanager
    def stream(self, stream: Any = None):
        yield stream

    # random numbers: the CPU generator
    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    # memory (host RSS, bytes)
    def empty_cache(self) -> None:
        return None

    def ipc_collect(self) -> None:
        return None

    def memory_allocated(self, device: Any = None) -> int:
        return _rss_bytes()

    def memory_reserved(self, device: Any = None) -> int:
        return _rss_bytes()

    def max_memory_allocated(self, device: Any = None) -> int:
        return _peak_rss_bytes()

    def max_memory_reserved(self, device: Any = None) -> int:
        return _peak_rss_bytes()

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        return None

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        """(free, total) host memory in bytes, from ``/proc/meminfo``."""
        info: dict[str, int] = {}
        try:
            with open("/proc/meminfo") as fh:
                for line in fh:
                    key, _, rest = line.partition(":")
                    info[key] = int(rest.split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            return 0, 0
        return info.get("MemAvailable", 0), info.get("MemTotal", 0)

    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name not in _WARNED:
            _WARNED.add(name)
            print(f"[verl-cpu platform] device module: {name} has no CPU meaning; treated as a no-op", file=sys.stderr)
        return lambda *args, **kwargs: None


DEVICE_MODULE = CPUDeviceModule()


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl platform ``cpu``: host tensors, gloo collectives, Ray ``GPU`` slots as the placement unit."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # never auto-detected: selected only by VERL_PLATFORM=cpu
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME

    def current_device(self) -> str:  # type: ignore[override]
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
