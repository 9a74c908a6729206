"""Run metadata, gathered in one place: package versions, the code's git commit, the device runtime
(CANN, CUDA), this machine and its CPU load.

Everything here reads the machine without side effects and without importing torch; the results are
recorded with sweeps, runs, baselines and MLflow runs (:mod:`bench.execution.sweep`, :mod:`bench.gate.baseline`,
:mod:`bench.tracking`).
"""

from __future__ import annotations

import os
import platform as _platform
import subprocess
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

#: Packages whose versions are recorded as tags when installed.
VERSIONED = ("torch", "transformers", "verl", "torch_npu", "vllm", "vllm_ascend", "mlflow", "optuna")


def installed_version(*dists: str) -> str | None:
    """Version of the first installed distribution among ``dists`` (``None`` when none is)."""
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def cann_version() -> str | None:
    """CANN toolkit version, read from the toolkit's install info (``version=`` in
    ``<arch>-linux/ascend_toolkit_install.info``, or ``Version=`` in ``compiler/version.info``) under
    ``$ASCEND_TOOLKIT_HOME`` / ``$ASCEND_HOME_PATH`` / the default ``/usr/local/Ascend/ascend-toolkit/latest``;
    ``None`` when no toolkit is found. (Recorded with the run metadata next to torch_npu's version.)"""
    roots = [os.environ.get(k) for k in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")]
    roots.append("/usr/local/Ascend/ascend-toolkit/latest")
    for root in filter(None, roots):
        base = Path(root)
        candidates = [*sorted(base.glob("*/ascend_toolkit_install.info")), base / "ascend_toolkit_install.info",
                      base / "compiler" / "version.info"]
        for info in candidates:
            try:
                text = info.read_text()
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition("=")
                if key.strip().lower() == "version" and value.strip():
                    return value.strip()
    return None


def cuda_version() -> str | None:
    """The CUDA runtime torch was built with (``torch.version.cuda``), read only when torch is already
    imported in this process (never imports it); ``None`` otherwise or on a CPU/NPU build."""
    torch = sys.modules.get("torch")
    version = getattr(getattr(torch, "version", None), "cuda", None)
    return str(version) if version else None


def device_runtime() -> dict[str, str]:
    """The device runtimes found here: ``{"cann": version}`` and/or ``{"cuda": version}`` (absent ones omitted)."""
    out = {}
    if cann := cann_version():
        out["cann"] = cann
    if cuda := cuda_version():
        out["cuda"] = cuda
    return out


@lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    """Installed versions of :data:`VERSIONED` packages and CANN (absent ones omitted)."""
    out = {}
    if cann := cann_version():
        out["cann"] = cann
    for name in VERSIONED:
        version = installed_version(name, name.replace("_", "-"))
        if version is not None:
            out[name] = version
    return out


#: packages whose versions a run records from inside its own process (issue 43), as ``sys.modules`` names them
RUN_PACKAGES = ("verl", "vllm", "vllm_ascend", "torch", "torch_npu", "transformers")
#: the file in a run folder where the run's own process writes them (:func:`write_run_versions`)
RUN_VERSIONS_FILE = "versions.json"


def run_versions(packages: tuple[str, ...] = RUN_PACKAGES) -> dict[str, Any]:
    """The versions of ``packages`` as THIS process sees them, read at its end (call it inside the run).

    Returns ``{"python": sys.executable, "packages": {name: entry}}``; an ``entry`` is
    ``{"version", "dist", "imported", "file"}``: ``dist`` = the installed distribution's version
    (``importlib.metadata``, ``None`` when none is installed), ``imported`` = whether the process imported the
    module, ``file`` = its ``__file__`` (where it was imported from: a source tree put first on the path shows
    here), ``version`` = the module's ``__version__`` when imported (a source tree's own version, which the
    installed distribution's metadata does not know), else ``dist``. Packages neither installed nor imported are
    left out. ``cann``: ``torch_npu.version.cann`` when torch_npu was imported, else the toolkit's version file
    (:func:`cann_version`), where present. Never raises.
    """
    out: dict[str, Any] = {"python": sys.executable, "packages": {}}
    for name in packages:
        try:
            mod = sys.modules.get(name)
            dist = installed_version(name, name.replace("_", "-"))
            if mod is None and dist is None:
                continue
            entry: dict[str, Any] = {"version": dist, "dist": dist, "imported": mod is not None, "file": None}
            if mod is not None:
                entry["version"] = str(getattr(mod, "__version__", None) or dist or "") or None
                entry["file"] = getattr(mod, "__file__", None)
            out["packages"][name] = entry
        except Exception:  # noqa: BLE001 - a broken package's metadata never fails the run
            continue
    try:
        npu = sys.modules.get("torch_npu")
        cann = getattr(getattr(npu, "version", None), "cann", None) if npu is not None else None
        cann = str(cann) if cann else cann_version()
        if cann:
            out["packages"]["cann"] = {"version": cann, "dist": None, "imported": npu is not None, "file": None}
    except Exception:  # noqa: BLE001
        pass
    return out


def write_run_versions(run_dir: str | Path | None = None) -> None:
    """Write :func:`run_versions` to ``run_dir / versions.json`` (default ``$BENCH_RUN_DIR``); nothing without a
    folder; never raises (a run never fails for its metadata)."""
    import json

    folder = run_dir or os.environ.get("BENCH_RUN_DIR")
    if not folder:
        return
    try:
        path = Path(folder) / RUN_VERSIONS_FILE
        tmp = path.with_name(f".{RUN_VERSIONS_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps(run_versions(), sort_keys=True) + "\n")
        os.replace(tmp, path)
    except Exception:  # noqa: BLE001
        pass


def flat_run_versions(recorded: dict[str, Any] | None) -> dict[str, str]:
    """``{package: version}`` of a record's ``run_versions`` (:func:`run_versions`), for tables and MLflow."""
    packages = (recorded or {}).get("packages") or {}
    return {k: str(v["version"]) for k, v in packages.items() if isinstance(v, dict) and v.get("version")}


@lru_cache(maxsize=1)
def git_commit() -> str:
    """The project's git commit (``+dirty`` when the tree has changes), or ``unknown``."""
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10)
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine() -> dict[str, Any]:
    """A description of this machine: host, OS, architecture, CPU model and count, memory (GiB), Python."""
    cpu = _platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        mem_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {"hostname": _platform.node(), "os": _platform.platform(), "arch": _platform.machine(), "cpu": cpu,
            "cpu_count": os.cpu_count(), "cpus_usable": usable, "memory_gb": mem_gb,
            "python": _platform.python_version()}


def host_load() -> dict[str, float | None]:
    """CPU contention on this host: PSI ``some`` avg10/avg60 of ``/proc/pressure/cpu`` (% of time a
    task waited for a CPU; ``None`` where PSI is absent), the 1-minute load average per CPU, and from the first
    line of ``/proc/stat`` the cumulative CPU seconds of all CPUs (``cpu_total_s``) and the part the hypervisor
    gave to others while this VM's CPUs were runnable (``cpu_steal_s``, the ``steal`` column; 0 on bare metal).
    Two readings give the steal share of the interval between them (:func:`steal_share`)."""
    out: dict[str, float | None] = {"cpu_pressure_avg10": None, "cpu_pressure_avg60": None, "load1_per_cpu": None,
                                    "cpu_total_s": None, "cpu_steal_s": None}
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        hz = os.sysconf("SC_CLK_TCK")
        out["cpu_total_s"] = sum(ticks[:8]) / hz  # user nice system idle iowait irq softirq steal (guest is in user)
        out["cpu_steal_s"] = (ticks[7] if len(ticks) > 7 else 0) / hz
    except (OSError, ValueError, IndexError):
        pass
    try:
        kv = dict(x.split("=") for x in Path("/proc/pressure/cpu").read_text().splitlines()[0].split()[1:])
        out["cpu_pressure_avg10"], out["cpu_pressure_avg60"] = float(kv["avg10"]), float(kv["avg60"])
    except (OSError, ValueError, KeyError, IndexError):
        pass
    try:
        out["load1_per_cpu"] = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        pass
    return out


def steal_share(before: dict[str, Any], after: dict[str, Any]) -> float | None:
    """The share of this machine's CPU time the hypervisor gave to others between two :func:`host_load`
    readings (``d cpu_steal_s / d cpu_total_s``, 0-1); ``None`` when either lacks the figures or no time passed."""
    if None in (before.get("cpu_steal_s"), after.get("cpu_steal_s")) or after["cpu_total_s"] <= before["cpu_total_s"]:
        return None
    return (after["cpu_steal_s"] - before["cpu_steal_s"]) / (after["cpu_total_s"] - before["cpu_total_s"])
