"""verl's real Hydra configuration, for any verl release: compose overrides against it, or check them.

A verl launch is ``python -m verl.trainer.main_ppo key=value ...``; verl's ``ppo_trainer.yaml`` (a Hydra
config in struct mode) decides which keys exist. This module composes a list of overrides against that
config exactly as ``main_ppo`` would, without importing verl and without a GPU, so an override verl would
refuse is caught before a sweep starts (or in the tests, for every cell of every matrix).

Where the config files come from:

- ``version=None`` (or the installed version): the installed ``verl`` package's ``verl/trainer/config``.
- any other version: the released wheel from PyPI (``pip download verl==X --no-deps``), of which only
  ``verl/trainer/config/**`` and a few source files used as evidence are unpacked into
  ``<repo>/.cache/verl/<version>/`` (git-ignored; downloaded once, then reused; a file lock makes
  concurrent test processes wait for one download).

:func:`compose` runs Hydra's full ``compose`` (slow: ~0.5 s). :func:`check_overrides` composes the
defaults once per version and applies each list of overrides with Hydra's own override parser and
applier (the same code ``compose`` runs after the defaults list), so hundreds of cells check in seconds;
overrides that select config groups fall back to the full compose.
"""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from bench.core.errors import BenchError

#: Repository root; the download cache lives in ``<repo>/.cache/verl`` (git-ignored).
REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_CACHE = REPO_ROOT / ".cache" / "verl"
#: Files of a verl wheel unpacked into the cache besides ``verl/trainer/config/**``.
EVIDENCE_FILES = (
    "verl/version/version",
    "verl/utils/fsdp_utils.py",
    "verl/models/transformers/npu_patch.py",
    "verl/workers/fsdp_workers.py",
)
CONFIG_NAME = "ppo_trainer"
_VERSION_RE = re.compile(r"^[0-9][0-9A-Za-z.+!-]*$")
# Values Hydra's override grammar accepts unquoted (kept conservative: anything else is quoted).
_HYDRA_SAFE = re.compile(r"^[A-Za-z0-9_\-+./:~@%*]+$")


class VerlConfigError(BenchError):
    """An override verl's config refuses, or verl's config files cannot be found or fetched."""


def installed_verl_version() -> str | None:
    """Version of the installed ``verl`` distribution, or ``None`` when verl is not installed."""
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_verl_dir() -> Path | None:
    """Folder of the installed ``verl`` package (found without importing it), or ``None``."""
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _version_tuple(version: str) -> tuple[int, ...]:
    out = []
    for part in re.split(r"[.+-]", version):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
    return tuple(out)


def version_at_least(version: str | None, minimum: str) -> bool:
    """``version >= minimum`` on the numeric release parts (``0.10.0rc1`` counts as ``0.10.0``)."""
    return version is not None and _version_tuple(version) >= _version_tuple(minimum)


def verl_package_dir(version: str | None = None, *, cache_dir: Path | None = None) -> Path:
    """The ``verl`` package folder holding ``trainer/config`` for ``version``.

    Args:
        version: a verl release (``"0.6.1"``); ``None`` = the installed verl.
        cache_dir: download cache (default ``<repo>/.cache/verl``).

    Raises:
        VerlConfigError: verl is not installed (``version=None``), or the release cannot be fetched.
    """
    installed = installed_verl_version()
    if version is None or version == installed:
        pkg = installed_verl_dir()
        if pkg is None or not (pkg / "trainer" / "config" / f"{CONFIG_NAME}.yaml").is_file():
            raise VerlConfigError(
                "verl is not installed in this Python (pip install verl): its Hydra config is needed to check overrides"
            )
        return pkg
    return _cached_release(version, Path(cache_dir) if cache_dir else DEFAULT_CACHE)


def config_dir(version: str | None = None, *, cache_dir: Path | None = None) -> Path:
    """``verl/trainer/config`` of ``version`` (``None`` = installed), fetched and cached when needed."""
    return verl_package_dir(version, cache_dir=cache_dir) / "trainer" / "config"


def _cached_release(version: str, cache_dir: Path) -> Path:
    """Unpack the config files of the verl ``version`` wheel into ``cache_dir/<version>`` once."""
    if not _VERSION_RE.match(version):
        raise VerlConfigError(f"not a verl version: {version!r}")
    target = cache_dir / version
    pkg = target / "verl"
    if (pkg / "trainer" / "config" / f"{CONFIG_NAME}.yaml").is_file():
        return pkg
    from filelock import FileLock

    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache_dir / f".{version}.lock"), timeout=600):
        if (pkg / "trainer" / "config" / f"{CONFIG_NAME}.yaml").is_file():
            return pkg
        with tempfile.TemporaryDirectory(dir=cache_dir, prefix=f".dl-{version}-") as tmp:
            wheel = _download_wheel(version, Path(tmp))
            staging = Path(tmp) / "unpacked"
            _unpack(wheel, staging)
            if not (staging / "verl" / "trainer" / "config" / f"{CONFIG_NAME}.yaml").is_file():
                raise VerlConfigError(f"verl {version}: the wheel has no verl/trainer/config/{CONFIG_NAME}.yaml")
            (staging / "SOURCE").write_text(f"{wheel.name} from PyPI (pip download verl=={version} --no-deps)\n")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
    return pkg


def _download_wheel(version: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", f"verl=={version}", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VerlConfigError(f"cannot download verl {version} from PyPI: {exc}") from None
    wheels = sorted(dest.glob("verl-*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel downloaded"]
        raise VerlConfigError(f"cannot download verl {version} from PyPI (pip download verl=={version}): {tail[0]}")
    return wheels[0]


def _unpack(wheel: Path, staging: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.endswith("/") or ".." in Path(name).parts:
                continue
            if name.startswith("verl/trainer/config/") or name in EVIDENCE_FILES:
                out = staging / name
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(zf.read(name))


def hydra_value(value: Any) -> str:
    """``value`` written for a Hydra command-line override (quoted when the grammar needs it).

    Booleans become ``true``/``false``, lists ``[a,b]``; strings with characters Hydra's override
    grammar treats specially (spaces, commas, brackets, quotes, ``$``, ``=`` ...) are single-quoted.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    if _HYDRA_SAFE.match(text):
        return text
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("${", "\\${")
    return f"'{escaped}'"


# ----------------------------------------------------------------------------------------------- compose


def _compose_raw(cfg_dir: Path, overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(cfg_dir), version_base=None):
            return hydra_compose(config_name=CONFIG_NAME, overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()


def _explain(exc: Exception) -> str:
    msg = " ".join(str(exc).split())
    cause = exc.__cause__
    if cause is not None and str(cause) and str(cause) not in msg:
        msg += f" ({' '.join(str(cause).split()).splitlines()[0][:200]})"
    return msg


def _label(version: str | None) -> str:
    return f"verl {version or installed_verl_version() or '(installed)'}"


def compose(overrides: Iterable[str], version: str | None = None, *, cache_dir: Path | None = None):
    """Hydra's full ``compose`` of verl's ``ppo_trainer`` config with ``overrides``.

    Returns:
        The composed :class:`omegaconf.DictConfig` (struct mode, interpolations unresolved).

    Raises:
        VerlConfigError: an override names a key verl does not have (or is malformed); the message names
            the verl version and the override.
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(overrides)
    cfg_dir = config_dir(version, cache_dir=cache_dir)
    try:
        return _compose_raw(cfg_dir, overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise VerlConfigError(f"{_label(version)} refuses the overrides: {_explain(exc)}") from None


@lru_cache(maxsize=8)
def _defaults(cfg_dir: str):
    """The composed config with no overrides, and the names of the config groups (folders)."""
    cfg = _compose_raw(Path(cfg_dir), [])
    groups = frozenset(p.name for p in Path(cfg_dir).iterdir() if p.is_dir() and not p.name.startswith("_"))
    return cfg, groups


#: Per config folder, a working copy that only plain ``key=value`` overrides ever touch: such overrides
#: change values, never the set of keys, so checking one cell after another on it is sound (a failure is
#: re-checked on a fresh copy before it is reported).
_SCRATCH: dict[str, Any] = {}
#: Per config folder, plain overrides already accepted (see :func:`check_overrides`).
_GOOD: dict[str, set[str]] = {}


@lru_cache(maxsize=4096)
def _parse_one(override: str):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides([override])[0]


def _type_problem(old: Any, new: Any) -> str | None:
    """Why ``new`` cannot replace ``old`` (verl's dataclasses would reject it), or ``None``."""
    if old is None or new is None:
        return None
    if isinstance(new, str) and "${" in new:
        return None
    if isinstance(old, bool):
        return None if isinstance(new, bool) else "expects true/false"
    if isinstance(old, int):
        return None if isinstance(new, int) and not isinstance(new, bool) else "expects an integer"
    if isinstance(old, float):
        return None if isinstance(new, (int, float)) and not isinstance(new, bool) else "expects a number"
    return None


def check_overrides(overrides: Iterable[str], version: str | None = None, *, cache_dir: Path | None = None) -> None:
    """Check that verl ``version`` (``None`` = installed) accepts every override; fast after the first call.

    Each override must name an existing key (``+key=`` to add one), parse in Hydra's grammar, and give a
    boolean / integer / number where verl's default is one.

    Raises:
        VerlConfigError: naming the verl version and the first refused override.
    """
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(overrides)
    cfg_dir = config_dir(version, cache_dir=cache_dir)
    base, groups = _defaults(str(cfg_dir))
    try:
        parsed = [_parse_one(o) for o in overrides]
    except HydraException as exc:
        raise VerlConfigError(f"{_label(version)}: malformed override: {_explain(exc)}") from None
    needs_full = any(
        o.package is not None or o.is_hydra_override() or ("." not in o.key_or_group and o.key_or_group in groups)
        or "/" in o.key_or_group
        for o in parsed
    )
    if needs_full:
        compose(overrides, version, cache_dir=cache_dir)
        return
    plain = not any(o.is_delete() or o.is_add() or o.is_force_add() for o in parsed)
    # Plain overrides with a non-null, non-mapping value never change which keys exist, and each one's
    # verdict does not depend on the others: such an override accepted once is accepted again.
    memo = plain and all(_value_kind(o) == "plain" for o in parsed)
    good = _GOOD.setdefault(str(cfg_dir), set())
    todo = [o for o in parsed if not (memo and o.input_line in good)]
    if plain:
        scratch = _SCRATCH.get(str(cfg_dir))
        if scratch is None:
            scratch = _SCRATCH[str(cfg_dir)] = copy.deepcopy(base)
        refused = _apply_all(scratch, todo)
    else:
        refused = "not tried"
    if refused:  # a fresh copy decides (the working copy may hold another cell's value, e.g. a null node)
        _SCRATCH.pop(str(cfg_dir), None)
        refused = _apply_all(copy.deepcopy(base), parsed)
        if refused:
            raise VerlConfigError(f"{_label(version)} refuses the override {refused}")
    for override in todo:
        if override.is_delete() or override.is_add() or override.is_force_add():
            continue
        try:
            old = OmegaConf.select(base, override.key_or_group, throw_on_missing=False)
        except OmegaConfBaseException:
            old = None
        problem = _type_problem(old, override.value())
        if problem:
            raise VerlConfigError(
                f"{_label(version)} refuses the override {override.input_line!r}: "
                f"{override.key_or_group} {problem} (default {old!r})"
            )
    if memo:
        good.update(o.input_line for o in todo)


def _value_kind(override) -> str:
    try:
        value = override.value()
    except Exception:
        return "other"
    if value is None or isinstance(value, dict):
        return "other"
    return "plain"


def _apply_all(cfg, parsed) -> str | None:
    """Apply parsed overrides to ``cfg`` with Hydra's applier; ``None``, or what the first refusal says."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    for override in parsed:
        try:
            ConfigLoaderImpl._apply_overrides_to_config([override], cfg)
        except (HydraException, OmegaConfBaseException) as exc:
            return f"{override.input_line!r}: {_explain(exc)}"
    return None


def fast_compose(overrides: Iterable[str], version: str | None = None, *, cache_dir: Path | None = None):
    """The config :func:`check_overrides` validates against: verl's defaults with ``overrides`` applied by
    Hydra's applier (no defaults-list changes); equal to :func:`compose` for plain value overrides.

    Raises:
        VerlConfigError: as :func:`check_overrides`.
    """
    overrides = list(overrides)
    check_overrides(overrides, version, cache_dir=cache_dir)
    base, _ = _defaults(str(config_dir(version, cache_dir=cache_dir)))
    cfg = copy.deepcopy(base)
    _apply_all(cfg, [_parse_one(o) for o in overrides])
    return cfg


def read_release_file(relpath: str, version: str | None = None, *, cache_dir: Path | None = None) -> str | None:
    """Text of ``verl/<relpath>`` in ``version`` (installed or cached release), or ``None`` if absent."""
    path = verl_package_dir(version, cache_dir=cache_dir) / relpath
    try:
        return path.read_text()
    except OSError:
        return None
