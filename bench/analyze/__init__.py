"""Analysis of finished sweeps: statistics (:mod:`.estimators`, :mod:`.stat_tests`, :mod:`.effects`,
:mod:`.power`) and the report's tables (:mod:`.tables`) and plots (:mod:`.plots`); the report's markdown, which
also shows the planning's verdicts, is :mod:`bench.commands.report_markdown`.

Pure functions on numbers and snapshots: no engine, no command, no MLflow.
"""


