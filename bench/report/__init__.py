"""The report's content from a sweep's snapshot (:mod:`bench.records.snapshot`): the numbers (:mod:`.tables`),
where each optimization acts (:mod:`.where`, :mod:`.where_md`), the plots (:mod:`.plots`) and the markdown pieces
shared with the gate (:mod:`.md`); the report's markdown, which also shows the planning's verdicts, is
:mod:`bench.commands.report_markdown`.

Pure: no engine, no command, no MLflow; statistics come from :mod:`bench.stats`.
"""
