"""Execution: how the runs of a plan are started and the sweep is carried out.

- :mod:`bench.execution.sweep`: the sweep loop (resume, run order, records, MLflow mirror);
  :mod:`bench.execution.blocks`: the blocked order with early stops between blocks;
- :mod:`bench.execution.executors`: the executor interface and the fresh-process executor;
  :mod:`bench.execution.forkserver`: runs forked from a warm server;
  :mod:`bench.execution.ray_executor` (one run at a time as a Ray job) and
  :mod:`bench.execution.ray_parallel` (the runs of a block at once on distinct Ray nodes);
- :mod:`bench.execution.runner`: one run's process (launch, timing, logs);
- :mod:`bench.execution.progress`: the live progress of ``run`` and ``tune`` on the console;
- :mod:`bench.execution.smoke`: the smoke run of ``run --smoke``;
- :mod:`bench.execution.code_versions`: a sweep's code versions (fingerprint, what ``sweep.json`` keeps).
"""
