"""Analysis of finished sweeps: statistics (:mod:`.estimators`, :mod:`.stat_tests`, :mod:`.effects`,
:mod:`.power`) and the report's tables (:mod:`.tables`), markdown (:mod:`.markdown`) and plots (:mod:`.plots`).

Pure functions on numbers and snapshots: no engine, no command, no MLflow.
"""


