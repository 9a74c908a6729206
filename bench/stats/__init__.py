"""Statistics on numbers, no files: the two-sample tests of the gate and their estimators (:mod:`.stat_tests`,
:mod:`.estimators`), the run-level effects model (:mod:`.effects`), noise and minimal detectable effects
(:mod:`.power`) and change points of a series (:mod:`.changepoints`).

Pure functions on arrays and per-run values: no engine, no record, no command, no MLflow. The report
(:mod:`bench.report`), the planning (:mod:`bench.planning`) and the gate (:mod:`bench.gate`) call them.
"""
