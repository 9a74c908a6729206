"""The ``tune`` block as ``tune`` reads it (:class:`TuneSettingsBlock`: the schema of
:class:`bench.tune.space.TuneBlock` plus the tuner's own settings), validated by :func:`parse_block`."""

from __future__ import annotations

from pydantic import Field, ValidationError

from bench.core.errors import BenchError
from bench.core.inputs import read_text
from bench.spec.loading import MAX_MATRIX_BYTES, format_validation_error
from bench.spec.matrix import Matrix
from bench.tune.space import TuneBlock, parse_tune

#: blocks of the confirmation when the tune block does not say (``confirm_blocks``; 0 = no confirmation)
CONFIRM_BLOCKS = 3


class TuneSettingsBlock(TuneBlock):
    """The ``tune`` block as ``tune`` reads it: :class:`~bench.tune.space.TuneBlock` plus the settings of
    the tuner itself (strict like the others: a bad value is a one-line error, exit 2).

    ``confirm_blocks``: blocks of the confirmation after the trials (:mod:`bench.tune.confirm`: the best
    trial's limits against the rule of thumb, one run of each per block in a seeded random order), 0..50,
    default 3; 0 turns it off.
    """

    confirm_blocks: int = Field(CONFIRM_BLOCKS, ge=0, le=50, strict=True)


def parse_block(matrix: Matrix) -> TuneBlock:
    """Validate ``matrix.tune`` as ``tune`` does (:class:`TuneSettingsBlock`); the same one-line errors as
    :func:`bench.tune.space.parse_tune`, which it calls for a missing block.

    Raises:
        BenchError: no ``tune`` block, or an invalid one (one line naming file, line, key).
    """
    if not matrix.tune or not isinstance(matrix.tune, dict):
        return parse_tune(matrix)
    try:
        return TuneSettingsBlock(**matrix.tune)
    except ValidationError as exc:
        text = ""
        if matrix.source:
            try:
                text = read_text(matrix.source, MAX_MATRIX_BYTES, "matrix")
            except BenchError:
                text = ""
        raise BenchError(format_validation_error(matrix.source or "matrix", exc, text, prefix="tune",
                                                 model=TuneSettingsBlock)) from None
