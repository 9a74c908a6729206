"""Which versions of the stack read a factor's switch: the data (:class:`Bound`, :class:`SwitchRange`,
:class:`Lift`) and the judgement (:func:`range_verdict`), plus how the harness learns the installed stack of
a platform (:func:`stack_versions`).

A factor's switch exists only in a range of releases of one package (``VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE``:
vllm-ascend v0.10.0rc1 up to the release before vllm-ascend PR 12119). Every bound names its source (a
release tag or a PR); a bound that could not be checked against the sources has no version and a source
starting with ``unconfirmed`` and is never used to judge. Versions compare as PEP 440 versions
(``0.25.1rc1 < 0.25.1``); a local part (``+cpu``) is ignored.

The installed stack comes from this process's packages (:func:`bench.core.metadata.versions`) or, for a report,
from the sweep's recorded ``versions``; on ``npu`` it counts only where the NPU stack itself is there
(``torch_npu`` or ``vllm_ascend``: a CPU machine's verl says nothing about the NPU machine's). The
environment variable :data:`STACK_ENV` (``vllm_ascend=0.25.1rc1,verl=0.9.1``) sets versions over both, so
a test or a person planning for another machine can name the stack.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bench.core.errors import BenchError
from bench.core.metadata import versions

#: ``name=version,...``: versions of the stack that replace the installed ones (tests fake versions with it)
STACK_ENV = "BENCH_STACK_VERSIONS"
#: the verl Python package (its distribution name, as :func:`bench.core.metadata.versions` keys it; not the engine)
VERL = "verl"
#: the packages a switch range may name, as :func:`bench.core.metadata.versions` keys them
PACKAGES = (VERL, "vllm", "vllm_ascend", "torch_npu", "torch", "transformers")
#: per platform, the packages whose presence makes the installed stack that platform's stack
_PLATFORM_MARKERS = {"npu": ("torch_npu", "vllm_ascend")}
#: how a package is named in messages
LABELS = {"vllm_ascend": "vllm-ascend", "torch_npu": "torch_npu", VERL: VERL, "vllm": "vLLM",
          "torch": "torch", "transformers": "transformers"}


class Bound(BaseModel):
    """One end of a version range: ``version`` (``None``: not confirmed) and where it comes from.

    Attributes:
        version: the first release the bound refers to (a PEP 440 version without the ``v``), or ``None``.
        source: the evidence: a release tag or a PR (``vllm-ascend PR 12119, first in tag v0.25.1rc1``);
            ``unconfirmed: ...`` when the sources could not confirm it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    version: str | None = None
    source: str = Field(min_length=1)


class Revision(BaseModel):
    """A change inside a switch's range that does not decide whether the switch is read (a new default, a
    rename kept as a fallback, a new code path the switch still governs): ``package`` from ``at`` on, ``what``.

    Attributes:
        package: the package that changed, as :data:`PACKAGES` names it (not necessarily the range's package).
        at: the first release with the change, with its source (like any :class:`Bound`).
        what: what changed, and what it means for the factor's levels.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    package: str
    at: Bound
    what: str = Field(min_length=1)


class SwitchRange(BaseModel):
    """Where a factor's switch exists: package, the switch's name there, and the releases that read it.

    ``since`` is the first release that reads it, ``until`` the first release that no longer does (``None``:
    no removal known). ``revisions`` are the changes inside the range, each with its own bound and source
    (:class:`Revision`); ``note`` is prose. Only ``since`` and ``until`` judge (:func:`range_verdict`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    package: str
    switch: str
    since: Bound | None = None
    until: Bound | None = None
    revisions: tuple[Revision, ...] = ()
    note: str = ""

    def bounds(self) -> list[Bound]:
        """Every bound the range names: ``since``, ``until`` (absent ones left out), then each revision's."""
        return [b for b in (self.since, self.until) if b is not None] + [r.at for r in self.revisions]


class Lift(BaseModel):
    """A conflict that a release lifts: from ``package`` ``since`` on, on ``targets``, the cell runs with
    ``env`` added (instead of being dropped); ``reason`` is said in the launch notes."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    package: str
    since: Bound
    targets: tuple[str, ...]
    env: dict[str, str] = Field(default_factory=dict)
    reason: str


def _parse(version: str) -> Any:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version.split("+", 1)[0])
    except InvalidVersion:
        return None


def at_least(version: str | None, bound: Bound | None) -> bool | None:
    """``version >= bound.version``; ``None`` when either is unknown, unconfirmed or unparsable."""
    if version is None or bound is None or bound.version is None:
        return None
    v, b = _parse(version), _parse(bound.version)
    return None if v is None or b is None else v >= b


def range_verdict(rng: SwitchRange, versions: dict[str, str]) -> str | None:
    """Why the installed ``versions`` do not read ``rng``'s switch, or ``None`` (read, or cannot tell)."""
    v = versions.get(rng.package)
    label = LABELS.get(rng.package, rng.package)
    if at_least(v, rng.since) is False:
        return f"not read by {label} {v} ({rng.switch} added in {rng.since.source})"  # type: ignore[union-attr]
    if at_least(v, rng.until) is True:
        return f"not read by {label} {v} ({rng.switch} removed in {rng.until.source})"  # type: ignore[union-attr]
    return None


def parse_stack(text: str) -> dict[str, str]:
    """``name=version,...`` (:data:`STACK_ENV`) as a dict; ``-`` for a package's ``_``.

    Raises:
        BenchError: an item is not ``name=version`` or names a package outside :data:`PACKAGES`.
    """
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, sep, version = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not version.strip() or name not in PACKAGES:
            raise BenchError(f"{STACK_ENV}: {item!r}: want name=version with name in {', '.join(PACKAGES)}")
        out[name] = version.strip()
    return out


def stack_versions(platform: str, recorded: dict[str, str] | None = None, *, env: bool = True) -> dict[str, str]:
    """The versions of the stack that runs on ``platform``: ``recorded`` (a sweep's ``versions``) or this
    process's packages, kept on ``npu`` only where the NPU stack is among them, then (``env``)
    :data:`STACK_ENV` over it.

    Raises:
        BenchError: :data:`STACK_ENV` is malformed.
    """
    if recorded is None:
        recorded = versions()
    base = {k: v for k, v in recorded.items() if k in PACKAGES}
    markers = _PLATFORM_MARKERS.get(platform)
    if markers and not any(m in base for m in markers):
        base = {}
    return {**base, **(parse_stack(os.environ.get(STACK_ENV, "")) if env else {})}
