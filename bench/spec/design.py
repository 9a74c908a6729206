"""Experiment designs: turn a matrix's factors into cells (one combination of factor levels each).

Designs know nothing of engines or verl: a cell is a ``dict[factor key, level]`` over every factor of
the registry (factors a matrix does not list are held at their first, "off", level).

- ``full``: the full factorial (itertools.product of the levels).
- ``one_at_a_time``: a reference cell (all off, or all at their last level) plus one cell per factor and
  non-reference level.
- ``fractional``: a two-level fractional factorial from pyDOE3 (``fracfact_by_res`` or ``fracfact``
  with generators); -1 -> first level, +1 -> last level; the alias structure comes from
  ``pyDOE3.fracfact_aliasing`` (Montgomery, *Design and Analysis of Experiments*, ch. 8).
- ``explicit``: the cells listed in the file.
"""

from __future__ import annotations

import itertools
import string
from dataclasses import dataclass, field

import numpy as np

from bench.core.errors import BenchError
from bench.spec.matrix import ExplicitDesign, FractionalDesign, Matrix, OneAtATimeDesign
from bench.spec.optimizations import REGISTRY, factor_keys
from bench.spec.stack import STACK_FACTOR

Cell = dict[str, int]


@dataclass
class DesignResult:
    """Cells of a design plus, for fractional designs, what was confounded.

    Attributes:
        cells: one dict per cell over every registry factor.
        varied: the factors that take more than one level, in design column order.
        aliases: pyDOE3 alias strings with letters replaced by factor keys (fractional only).
        resolution: the design resolution (fractional only): length of the shortest defining word.
    """

    cells: list[Cell]
    varied: list[str]
    aliases: list[str] = field(default_factory=list)
    resolution: int | None = None


def check_generators(generators: str, varied: list[str], source: str) -> None:
    """Check the syntax of ``design.generators`` (pyDOE3's notation) for the varied factors: one word per
    factor, each an optional sign and letters; single letters are the base factors (each once), and every
    other word is built from base letters only.

    Raises:
        BenchError: naming ``design.generators``, the bad word and what is allowed.
    """
    import re

    words = generators.split()
    where = f"{source}: design.generators: {generators!r}"
    if len(words) != len(varied):
        raise BenchError(f"{where}: {len(words)} word(s) for {len(varied)} varied factors ({', '.join(varied)}); "
                         "give one word per factor, e.g. 'a b c ab'")
    bad = next((w for w in words if not re.fullmatch(r"[+-]?[A-Za-z]+", w)), None)
    if bad is not None:
        raise BenchError(f"{where}: word {bad!r}: allowed: letters with an optional sign (a, b, ab, -abc)")
    base = [w.lower() for w in words if len(w) == 1]
    if not base or len(set(base)) != len(base):
        raise BenchError(f"{where}: the base factors (single letters) must be distinct and at least one")
    for w in words:
        letters = w.lstrip("+-").lower()
        if len(letters) > 1 and (not set(letters) <= set(base) or len(set(letters)) != len(letters)):
            raise BenchError(f"{where}: word {w!r} uses letters other than the base factors {' '.join(base)} "
                             "(each at most once)")


def _levels(matrix: Matrix) -> dict[str, list[int]]:
    """Levels of every registry factor (the matrix's, or the first level held fixed), then the ``stack`` factor's
    positions where the matrix lists it (:mod:`bench.spec.stack`)."""
    out = {k: list(matrix.factors.get(k, [REGISTRY[k].off])) for k in factor_keys()}
    if STACK_FACTOR in matrix.factors:
        out[STACK_FACTOR] = list(matrix.factors[STACK_FACTOR])
    return out


def full(matrix: Matrix) -> DesignResult:
    """Full factorial over the matrix's factors: prod(len(levels)) cells."""
    levels = _levels(matrix)
    keys = list(levels)
    cells = [dict(zip(keys, combo)) for combo in itertools.product(*(levels[k] for k in keys))]
    return DesignResult(cells=cells, varied=[k for k in keys if len(levels[k]) > 1])


def one_at_a_time(matrix: Matrix, design: OneAtATimeDesign) -> DesignResult:
    """Reference cell plus one cell per (varied factor, other level): 1 + sum(len(levels) - 1) cells."""
    levels = _levels(matrix)
    pick = 0 if design.reference == "baseline" else -1
    ref = {k: v[pick] for k, v in levels.items()}
    cells = [dict(ref)]
    varied = [k for k in levels if len(levels[k]) > 1]
    for key in varied:
        for level in levels[key]:
            if level != ref[key]:
                cells.append({**ref, key: level})
    return DesignResult(cells=cells, varied=varied)


def _resolution(design: np.ndarray) -> int | None:
    """Length of the shortest word of the defining relation of a +-1 design (columns = factors).

    A word is a set of columns whose elementwise product is constant over all runs; ``None`` for a
    full factorial (no defining word).
    """
    n = design.shape[1]
    for size in range(2, n + 1):
        for cols in itertools.combinations(range(n), size):
            prod = np.prod(design[:, cols], axis=1)
            if np.all(prod == prod[0]):
                return size
    return None


def _by_resolution(pyDOE3, n: int, res: int) -> np.ndarray:
    """A two-level fraction of ``n`` factors of resolution ``res`` or more: pyDOE3's ``fracfact_by_res`` when it
    builds one that reaches ``res``; else the fewest base factors ``k`` whose ``n - k`` generators are words of
    ``res - 1`` or more base letters, the word of every base letter included (pyDOE3 leaves that one out, so it
    misses the half fractions, e.g. 2^(4-1) of resolution IV), checked on the design itself.

    Raises:
        ValueError: no such design found.
    """
    try:
        x = pyDOE3.fracfact_by_res(n, res)
        if (_resolution(x) or n + 1) >= res:
            return x
    except (ValueError, IndexError):
        pass
    letters = string.ascii_lowercase
    for k in range(max(res - 1, 1), n):
        words = ["".join(c) for r in range(res - 1, k + 1) for c in itertools.combinations(letters[:k], r)]
        if len(words) >= n - k:
            x = pyDOE3.fracfact(" ".join([*letters[:k], *words[:n - k]]))
            if (_resolution(x) or n + 1) >= res:
                return x
    raise ValueError("design not possible")


def fractional(matrix: Matrix, design: FractionalDesign) -> DesignResult:
    """Two-level fractional factorial via pyDOE3 over the factors with two levels.

    Raises:
        BenchError: a varied factor has more than two levels, or pyDOE3 cannot build the design.
    """
    levels = _levels(matrix)
    varied = [k for k in levels if len(levels[k]) > 1]
    many = [k for k in varied if len(levels[k]) != 2]
    if many:
        raise BenchError(
            f"{matrix.source}: design.type: fractional designs need two levels per factor; "
            f"{', '.join(f'{k} has {levels[k]}' for k in many)} (e.g. {many[0]}: [0, 1])"
        )
    if len(varied) < 3:
        raise BenchError(f"{matrix.source}: design.type: a fractional design needs at least 3 varied factors")
    if design.generators:
        check_generators(design.generators, varied, matrix.source)
    if design.resolution is not None and design.resolution > len(varied):
        n = len(varied)
        raise BenchError(f"{matrix.source}: design.resolution: {design.resolution} is above what a two-level fraction "
                         f"of {n} factors reaches: at most {n} (the half fraction 2^({n}-1), whose defining word "
                         f"holds every factor); give resolution <= {n}, or design: full")
    import pyDOE3  # deferred: after the checks above (its scipy import takes seconds on a busy machine)

    try:
        if design.generators:
            x = pyDOE3.fracfact(design.generators)
        else:
            x = _by_resolution(pyDOE3, len(varied), design.resolution)
    except Exception:  # pyDOE3 raises ValueError/IndexError for impossible designs
        if design.generators:
            raise BenchError(f"{matrix.source}: design.generators: {design.generators!r} does not define a two-level "
                             "fractional design (e.g. 'a b c ab ac' for 5 factors)") from None
        raise BenchError(f"{matrix.source}: design.resolution: no two-level fractional design of resolution "
                         f"{design.resolution} for {len(varied)} factors was found (give a lower resolution, or "
                         "design: full)") from None
    if x.shape[1] != len(varied):
        raise BenchError(
            f"{matrix.source}: design.generators: {x.shape[1]} columns for {len(varied)} varied factors "
            f"({', '.join(varied)})"
        )
    x = x.astype(int)
    fixed = {k: v[0] for k, v in levels.items()}
    cells = []
    for row in x:
        cell = dict(fixed)
        for key, sign in zip(varied, row):
            cell[key] = levels[key][0] if sign < 0 else levels[key][-1]
        cells.append(cell)
    letters = string.ascii_lowercase[: len(varied)]
    alias_strings, _ = pyDOE3.fracfact_aliasing(x)
    rename = dict(zip(letters, varied))
    aliases = [" = ".join(":".join(rename[c] for c in word) for word in line.split(" = ")) for line in alias_strings]
    return DesignResult(cells=cells, varied=varied, aliases=aliases, resolution=_resolution(x))


def explicit(matrix: Matrix, design: ExplicitDesign) -> DesignResult:
    """The listed cells; omitted factors take their first level (or the matrix's single fixed level)."""
    levels = _levels(matrix)
    base = {k: v[0] for k, v in levels.items()}
    cells = [{**base, **c} for c in design.cells]
    varied = [k for k in levels if len({c[k] for c in cells}) > 1]
    return DesignResult(cells=cells, varied=varied)


def expand(matrix: Matrix) -> DesignResult:
    """Cells of the matrix's design (before conflicts, exclusions and merging; see :mod:`bench.spec.plan`)."""
    d = matrix.design
    if isinstance(d, OneAtATimeDesign):
        return one_at_a_time(matrix, d)
    if isinstance(d, FractionalDesign):
        return fractional(matrix, d)
    if isinstance(d, ExplicitDesign):
        return explicit(matrix, d)
    return full(matrix)
