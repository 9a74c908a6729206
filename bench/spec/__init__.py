"""What to run: the matrix schema (:mod:`.matrix`) and its loading (:mod:`.loading`), the registry of
optimizations (:mod:`.optimizations`), designs (:mod:`.design`), the plan of runs (:mod:`.plan`) and the
tune search space (:mod:`.tune_space`).

Nothing here runs anything; no module imports a command, and an engine only through its registry.
"""
