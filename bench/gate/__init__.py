"""The regression gate: a candidate against a baseline, decided with family-wise error control.

Modules (each one concept; import them directly, this package re-exports nothing):

* :mod:`bench.gate.stored` -- the gate against a saved baseline or an earlier sweep (``gate --baseline``);
* :mod:`bench.gate.stored_runs` -- its run-level comparison (declared normalization, sweep-to-sweep offset);
* :mod:`bench.gate.verdicts` -- snapshots compared cell by cell and metric by metric, the verdict rows;
* :mod:`bench.gate.interleaved` -- baseline and candidate interleaved block by block (``gate --interleave``);
* :mod:`bench.gate.runs` -- the paired, run-level analysis of interleaved blocks (probe covariate, stop rule);
* :mod:`bench.gate.versions` -- the code versions under test (git checkouts, the executor of each version);
* :mod:`bench.gate.side_by_side` -- both versions at once on disjoint CPUs (Duet-style);
* :mod:`bench.gate.baseline` -- saved baselines (``baseline save/list/show``);
* :mod:`bench.gate.history` -- a baseline's saves as series per cell, machine and stack, their change points
  (``history``);
* :mod:`bench.gate.markdown` -- the gate's markdown and the CI step summary.
"""
