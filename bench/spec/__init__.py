"""What to run: the matrix schema (:mod:`.matrix`) and its loading (:mod:`.loading`), the registry of
optimizations (:mod:`.optimizations`), designs (:mod:`.design`), the plan of runs (:mod:`.plan`), the launch of
one run and its machine placeholders (:mod:`.launch`), the metrics a sweep is judged on (:mod:`.metrics`) and the
tune search space (:mod:`.tune_space`).

Nothing here runs anything; no module imports a command or anything of :mod:`bench.engines`: an engine is found
through its registry (:mod:`bench.core.engine_registry`).
"""
